//! The copy's system-call filter (seccomp, built with `seccompiler`): an
//! allow list (`allowed.rs`: Docker's default profile minus what the fence
//! refuses) and, on top, what the fence refuses ([`REFUSED`]). A refused
//! call gets EPERM, so the app sees an ordinary error and goes on; nothing
//! is ever killed. A call newer than the list ([`NEWEST`]) and `clone3`
//! answer ENOSYS instead: libc then falls back to an older call (glibc
//! starts threads with `clone`, whose flags a filter can read). `clone`
//! with any namespace flag is refused like `unshare`.
//!
//! Four filters are installed, because a `seccompiler` filter has one
//! action for all its rules: the allow list, the EPERM list, the ENOSYS
//! one for `clone3`, and a small one for newer calls. The first three are
//! patched so that a call of another architecture (i386 through `int
//! 0x80`, x32 numbers on x86_64) is refused with EPERM rather than killing
//! the process or slipping past the numbers of this one.

use std::collections::BTreeMap;

use super::allowed;
use seccompiler::{BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch};

/// Calls refused outright (EPERM), on every architecture.
pub(super) const REFUSED: &[libc::c_long] = &[
    // Mounts, old and new API, and changing the root.
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_mount_setattr,
    libc::SYS_fspick,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    // Opening files by handle walks around every path check.
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    // Reading or steering other processes.
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    // The kernel's own machinery.
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    // New namespaces would undo the copy's own.
    libc::SYS_unshare,
    libc::SYS_setns,
    // io_uring performs calls the filter never sees.
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    // The machine's clock, accounting, quotas and logs.
    libc::SYS_acct,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_userfaultfd,
    libc::SYS_quotactl,
    libc::SYS_quotactl_fd,
    libc::SYS_lookup_dcookie,
    libc::SYS_vhangup,
    libc::SYS_syslog,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// The newest call the list knows: a call numbered above it is newer than
/// the list and gets ENOSYS.
pub(super) const NEWEST: libc::c_long = 467;

/// Socket families Docker refuses: AF_ALG (the kernel's crypto) and
/// AF_VSOCK (the host's hypervisor).
const REFUSED_FAMILIES: [u64; 2] = [38, 40];

/// The CLONE_NEW* flags that `clone` may not carry. (CLONE_NEWTIME is
/// left out: in `clone`'s flags that bit is part of the exit signal, and
/// only `clone3` and `unshare`, both refused, can ask for it.)
const NAMESPACE_FLAGS: [libc::c_int; 7] = [
    libc::CLONE_NEWNS,
    libc::CLONE_NEWCGROUP,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
];

/// `personality` values a normal program uses: the query (0xffffffff),
/// PER_LINUX, PER_LINUX32 and those with UNAME26. Others (turning off
/// address randomisation above all) are refused.
const PERSONALITIES: [u64; 5] = [0, 0x0008, 0x0002_0000, 0x0002_0008, 0xffff_ffff];

/// x32 system calls on x86_64 carry this bit in their number.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The compiled filters, in the order they are installed. The kernel runs
/// them all and takes the strictest answer; among refusals, the last
/// installed filter's errno: so `clone3` and calls newer than the list get
/// ENOSYS although the allow list refuses them with EPERM.
pub struct Filters {
    /// The allow list: every call not on it refused with EPERM.
    pub allowed: BpfProgram,
    /// What the fence refuses, with EPERM (also off the allow list, or
    /// allowed only with some arguments: `clone`, `personality`).
    pub refused: BpfProgram,
    /// `clone3`, answered with ENOSYS.
    pub no_clone3: BpfProgram,
    /// Calls newer than the list, answered with ENOSYS.
    pub newer: BpfProgram,
}

/// Compiles the filters for the architecture this binary is built for.
pub fn build() -> Result<Filters, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("no filter for this architecture ({e})"))?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = REFUSED.iter().map(|&nr| (nr, Vec::new())).collect();
    refused.insert(libc::SYS_clone, clone_rules()?);
    refused.insert(libc::SYS_personality, vec![personality_rule()?]);
    let no_clone3 = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let mut allowed: BTreeMap<i64, Vec<SeccompRule>> =
        allowed::ALLOWED.iter().chain(allowed::ALLOWED_HERE).chain(allowed::ALLOWED_BY_NUMBER).map(|&nr| (nr, Vec::new())).collect();
    for nr in [libc::SYS_clone, libc::SYS_personality] {
        allowed.insert(nr, Vec::new());
    }
    allowed.insert(libc::SYS_socket, vec![socket_rule()?]);
    let allowed = SeccompFilter::new(allowed, SeccompAction::Errno(libc::EPERM as u32), SeccompAction::Allow, arch).map_err(err)?;
    Ok(Filters {
        allowed: foreign_calls_refused(allowed.try_into().map_err(err)?),
        refused: compile(refused, libc::EPERM, arch)?,
        no_clone3: compile(no_clone3, libc::ENOSYS, arch)?,
        newer: newer_than_the_list(),
    })
}

/// `socket` is allowed for every family but [`REFUSED_FAMILIES`].
fn socket_rule() -> Result<SeccompRule, String> {
    let conditions = REFUSED_FAMILIES
        .iter()
        .map(|&f| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, f).map_err(err))
        .collect::<Result<Vec<_>, _>>()?;
    SeccompRule::new(conditions).map_err(err)
}

/// ENOSYS for a call of this architecture numbered above [`NEWEST`] (x32
/// numbers and other architectures are left to the other filters, which
/// refuse them).
fn newer_than_the_list() -> BpfProgram {
    const JGT_K: u16 = 0x25;
    let op = |code: u16, jt: u8, jf: u8, k: u32| seccompiler::sock_filter { code, jt, jf, k };
    let enosys = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;
    vec![
        /* 0 */ op(LD_W_ABS, 0, 0, 4),
        /* 1 */ op(JEQ_K, 1, 0, super::ports::AUDIT_ARCH),
        /* 2 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
        /* 3 */ op(LD_W_ABS, 0, 0, 0),
        /* 4 */ op(JGE_K, 2, 0, 0x4000_0000),
        /* 5 */ op(JGT_K, 0, 1, NEWEST as u32),
        /* 6 */ op(RET_K, 0, 0, enosys),
        /* 7 */ op(RET_K, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

/// Installs both filters on this thread (and so on what it execs). Sets
/// no_new_privs first, as the kernel requires of an unprivileged caller.
pub fn install(filters: &Filters) -> Result<(), String> {
    seccompiler::apply_filter(&filters.allowed).map_err(|e| format!("the allow list cannot be installed ({e})"))?;
    seccompiler::apply_filter(&filters.refused).map_err(|e| format!("the filter cannot be installed ({e})"))?;
    seccompiler::apply_filter(&filters.no_clone3).map_err(|e| format!("the clone3 filter cannot be installed ({e})"))?;
    seccompiler::apply_filter(&filters.newer).map_err(|e| format!("the filter of newer calls cannot be installed ({e})"))
}

/// `clone` is refused when its flags (the first argument on x86_64 and
/// aarch64 alike) hold any namespace flag: one rule per flag, any of which
/// matches.
fn clone_rules() -> Result<Vec<SeccompRule>, String> {
    NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag = flag as u32 as u64;
            let has = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(flag), flag).map_err(err)?;
            SeccompRule::new(vec![has]).map_err(err)
        })
        .collect()
}

/// `personality` is refused when its argument is none of [`PERSONALITIES`].
fn personality_rule() -> Result<SeccompRule, String> {
    let conditions = PERSONALITIES
        .iter()
        .map(|&p| SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, p).map_err(err))
        .collect::<Result<Vec<_>, _>>()?;
    SeccompRule::new(conditions).map_err(err)
}

/// One filter: the rules' calls get `errno`, everything else is allowed.
fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32, arch: TargetArch) -> Result<BpfProgram, String> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch).map_err(err)?;
    let program: BpfProgram = filter.try_into().map_err(err)?;
    Ok(foreign_calls_refused(program))
}

/// `seccompiler` kills the process on a call of another architecture; a
/// copy must never be killed by its filter, so that becomes EPERM. On
/// x86_64, x32 numbers (same architecture, numbers with bit 30) are refused
/// right after the architecture check, before any number is compared.
fn foreign_calls_refused(mut program: BpfProgram) -> BpfProgram {
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    for insn in program.iter_mut() {
        if insn.code == RET_K && insn.k == libc::SECCOMP_RET_KILL_PROCESS {
            insn.k = eperm;
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        // The architecture check is 3 instructions: load, jump over the
        // next one when it matches, return. Jumps are relative and none
        // crosses this point, so inserting here moves nothing else.
        const NR_OFFSET: u32 = 0;
        let x32 = [
            seccompiler::sock_filter { code: LD_W_ABS, jt: 0, jf: 0, k: NR_OFFSET },
            seccompiler::sock_filter { code: JGE_K, jt: 0, jf: 1, k: X32_SYSCALL_BIT },
            seccompiler::sock_filter { code: RET_K, jt: 0, jf: 0, k: eperm },
        ];
        program.splice(3..3, x32);
    }
    program
}

/// BPF_RET | BPF_K.
const RET_K: u16 = 0x06;
/// BPF_LD | BPF_W | BPF_ABS.
const LD_W_ABS: u16 = 0x20;
/// BPF_JMP | BPF_JGE | BPF_K.
const JGE_K: u16 = 0x35;
/// BPF_JMP | BPF_JEQ | BPF_K.
const JEQ_K: u16 = 0x15;

/// A `seccompiler` error as text.
fn err(e: seccompiler::BackendError) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_and_nothing_in_them_kills() {
        let f = build().expect("filters for this architecture");
        for program in [&f.allowed, &f.refused, &f.no_clone3] {
            assert!(program.len() > 6, "a real program");
            assert!(program.iter().all(|i| !(i.code == RET_K && i.k == libc::SECCOMP_RET_KILL_PROCESS)), "no kill action left");
            assert_eq!(program[2].code, RET_K, "the architecture check's refusal");
            assert_eq!(program[2].k, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
        }
    }

    #[test]
    fn the_allow_list_names_nothing_the_fence_refuses_and_nothing_newer_than_its_newest() {
        let listed: Vec<libc::c_long> =
            allowed::ALLOWED.iter().chain(allowed::ALLOWED_HERE).chain(allowed::ALLOWED_BY_NUMBER).copied().collect();
        let mut seen = std::collections::HashSet::new();
        for nr in &listed {
            assert!(seen.insert(nr), "syscall {nr} listed twice");
            assert!(!REFUSED.contains(nr), "syscall {nr} is refused by the fence");
            assert!(*nr <= NEWEST, "syscall {nr} is newer than NEWEST");
        }
        for nr in [libc::SYS_clone, libc::SYS_clone3, libc::SYS_personality, libc::SYS_socket, libc::SYS_ptrace, libc::SYS_mount] {
            assert!(!listed.contains(&nr), "syscall {nr} is not allowed outright");
        }
        // What R, the launcher's exec and the ports fence need.
        for nr in [libc::SYS_execve, libc::SYS_close_range, libc::SYS_rseq, libc::SYS_seccomp, libc::SYS_bind, libc::SYS_listen] {
            assert!(listed.contains(&nr), "syscall {nr} is allowed");
        }
        let f = build().expect("filters for this architecture");
        assert!(f.allowed.len() < 4096, "within the kernel's limit: {}", f.allowed.len());
    }

    #[test]
    fn the_lists_name_no_call_twice_and_leave_clone3_to_its_own_filter() {
        let mut seen = std::collections::HashSet::new();
        for nr in REFUSED {
            assert!(seen.insert(nr), "syscall {nr} listed twice");
        }
        assert!(!REFUSED.contains(&libc::SYS_clone3) && !REFUSED.contains(&libc::SYS_clone));
    }
}
