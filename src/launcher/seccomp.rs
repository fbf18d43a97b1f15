//! The copy's system-call filter (seccomp, built with `seccompiler`): what
//! an R app never needs is refused with EPERM, so the app sees an ordinary
//! error and goes on; nothing is ever killed. `clone3` answers ENOSYS
//! instead: glibc then falls back to `clone`, whose flags a filter can
//! read, and threads still start. `clone` with any namespace flag is
//! refused like `unshare`.
//!
//! Two filters are installed, because a `seccompiler` filter has one
//! action for all its rules: the EPERM list and the ENOSYS one. Both are
//! patched so that a call of another architecture (i386 through `int
//! 0x80`, x32 numbers on x86_64) is refused with EPERM rather than killing
//! the process or slipping past the numbers of this one.

use std::collections::BTreeMap;

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

/// The two compiled filters, in the order they are installed.
pub struct Filters {
    /// Everything refused with EPERM.
    pub refused: BpfProgram,
    /// `clone3`, answered with ENOSYS.
    pub no_clone3: BpfProgram,
}

/// Compiles the filters for the architecture this binary is built for.
pub fn build() -> Result<Filters, String> {
    let arch = TargetArch::try_from(std::env::consts::ARCH).map_err(|e| format!("no filter for this architecture ({e})"))?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = REFUSED.iter().map(|&nr| (nr, Vec::new())).collect();
    refused.insert(libc::SYS_clone, clone_rules()?);
    refused.insert(libc::SYS_personality, vec![personality_rule()?]);
    let no_clone3 = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    Ok(Filters { refused: compile(refused, libc::EPERM, arch)?, no_clone3: compile(no_clone3, libc::ENOSYS, arch)? })
}

/// Installs both filters on this thread (and so on what it execs). Sets
/// no_new_privs first, as the kernel requires of an unprivileged caller.
pub fn install(filters: &Filters) -> Result<(), String> {
    seccompiler::apply_filter(&filters.refused).map_err(|e| format!("the filter cannot be installed ({e})"))?;
    seccompiler::apply_filter(&filters.no_clone3).map_err(|e| format!("the clone3 filter cannot be installed ({e})"))
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
#[cfg(target_arch = "x86_64")]
const LD_W_ABS: u16 = 0x20;
/// BPF_JMP | BPF_JGE | BPF_K.
#[cfg(target_arch = "x86_64")]
const JGE_K: u16 = 0x35;

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
        for program in [&f.refused, &f.no_clone3] {
            assert!(program.len() > 6, "a real program");
            assert!(program.iter().all(|i| !(i.code == RET_K && i.k == libc::SECCOMP_RET_KILL_PROCESS)), "no kill action left");
            assert_eq!(program[2].code, RET_K, "the architecture check's refusal");
            assert_eq!(program[2].k, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32);
        }
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
