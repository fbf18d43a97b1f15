//! The copy's system-call filter (seccomp, built with `seccompiler`): an
//! allow list (`allowed.rs`: Docker's default profile minus what the fence
//! refuses) and, on top, what the fence refuses ([`REFUSED`]). A refused
//! call gets EPERM, so the app sees an ordinary error and goes on; nothing
//! is ever killed. A call newer than the list ([`NEWEST`]) and `clone3`
//! answer ENOSYS instead: libc then falls back to an older call (glibc
//! starts threads with `clone`, whose flags a filter can read). `clone`
//! with any namespace flag is refused like `unshare`.
//!
//! Two filters are installed. The first answers by the call's number
//! alone, a binary search over ranges of numbers (`syscall_tree.rs`, far
//! quicker for the kernel to install than `seccompiler`'s one comparison
//! per listed call): allowed, EPERM, or ENOSYS (`clone3` and calls newer
//! than the list); the [`REFUSED`] calls get EPERM there, before the
//! allow list is looked at. The second, built with `seccompiler`, looks at the
//! arguments of the three calls allowed only with some: `clone`,
//! `personality` and `socket`. Both refuse a call of another architecture
//! (i386 through `int 0x80`, x32 numbers on x86_64) with EPERM rather than
//! killing the process or letting it slip past the numbers of this one.

use std::collections::{BTreeMap, BTreeSet};

use super::allowed;
use super::syscall_tree::{self, RET_K};
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

/// The compiled filters, in the order they are installed. The kernel runs
/// both and takes the strictest answer.
pub struct Filters {
    /// Every call by its number: allowed, EPERM (off the list, refused), or
    /// ENOSYS (`clone3`, newer than the list).
    pub numbers: BpfProgram,
    /// `clone`, `personality` and `socket` with refused arguments: EPERM.
    pub arguments: BpfProgram,
}

/// Compiles the filters for the architecture this binary is built for.
pub fn build() -> Result<Filters, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("no filter for this architecture ({e})"))?;
    let allowed: BTreeSet<libc::c_long> = allowed::ALLOWED
        .iter()
        .chain(allowed::ALLOWED_HERE)
        .chain(allowed::ALLOWED_BY_NUMBER)
        .chain(&[libc::SYS_clone, libc::SYS_personality, libc::SYS_socket])
        .copied()
        .collect();
    let (eperm, enosys) = (libc::SECCOMP_RET_ERRNO | libc::EPERM as u32, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
    // A refused call is refused even were it on the allow list.
    let answer = |nr: u32| match libc::c_long::from(nr) {
        nr if REFUSED.contains(&nr) => eperm,
        nr if allowed.contains(&nr) => libc::SECCOMP_RET_ALLOW,
        libc::SYS_clone3 => enosys,
        _ => eperm,
    };
    let ranges = syscall_tree::ranges(answer, NEWEST as u32, enosys);
    let numbers = syscall_tree::program(&ranges, super::ports::AUDIT_ARCH, eperm, cfg!(target_arch = "x86_64"));
    let arguments = BTreeMap::from([
        (libc::SYS_clone, clone_rules()?),
        (libc::SYS_personality, vec![personality_rule()?]),
        (libc::SYS_socket, socket_rules()?),
    ]);
    Ok(Filters { numbers, arguments: compile(arguments, libc::EPERM, arch)? })
}

/// `socket` is refused for the families in [`REFUSED_FAMILIES`]: one rule
/// per family, any of which matches.
fn socket_rules() -> Result<Vec<SeccompRule>, String> {
    REFUSED_FAMILIES
        .iter()
        .map(|&f| SeccompRule::new(vec![SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, f).map_err(err)?]).map_err(err))
        .collect()
}

/// Installs both filters on this thread (and so on what it execs). The
/// caller has set no_new_privs, as the kernel requires of an unprivileged
/// caller.
pub fn install(filters: &Filters) -> Result<(), String> {
    seccompiler::apply_filter(&filters.numbers).map_err(|e| format!("the allow list cannot be installed ({e})"))?;
    seccompiler::apply_filter(&filters.arguments).map_err(|e| format!("the filter of arguments cannot be installed ({e})"))
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
        program.splice(3..3, syscall_tree::number_loaded(eperm, true));
    }
    program
}

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
        for program in [&f.numbers, &f.arguments] {
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
        assert!(f.numbers.len() < 400, "a search, not a list: {}", f.numbers.len());
    }

    #[test]
    fn the_refused_list_names_no_call_twice_nor_clone_or_clone3() {
        let mut seen = std::collections::HashSet::new();
        for nr in REFUSED {
            assert!(seen.insert(nr), "syscall {nr} listed twice");
        }
        assert!(!REFUSED.contains(&libc::SYS_clone3) && !REFUSED.contains(&libc::SYS_clone));
    }

    #[test]
    fn every_call_number_gets_the_answer_of_the_lists() {
        let f = build().expect("filters for this architecture");
        let arch = crate::launcher::ports::AUDIT_ARCH;
        let listed: Vec<libc::c_long> =
            allowed::ALLOWED.iter().chain(allowed::ALLOWED_HERE).chain(allowed::ALLOWED_BY_NUMBER).copied().collect();
        let (eperm, enosys) = (libc::SECCOMP_RET_ERRNO | libc::EPERM as u32, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32);
        for nr in 0..=(NEWEST + 100) {
            let want = if REFUSED.contains(&nr) {
                eperm
            } else if listed.contains(&nr) || [libc::SYS_clone, libc::SYS_personality, libc::SYS_socket].contains(&nr) {
                libc::SECCOMP_RET_ALLOW
            } else if nr == libc::SYS_clone3 || nr > NEWEST {
                enosys
            } else {
                eperm
            };
            let (got, compared) = syscall_tree::tests::run(&f.numbers, arch, nr as u32);
            assert_eq!(got, want, "call {nr}");
            assert!(compared <= 12, "call {nr}: {compared} comparisons");
        }
        assert_eq!(syscall_tree::tests::run(&f.numbers, arch ^ 1, libc::SYS_getpid as u32).0, eperm, "another architecture");
    }
}
