//! The allow list of the copy's system-call filter (`seccomp.rs`): the
//! calls Docker's default profile allows every container (moby's
//! `profiles/seccomp/default.json`, its first, unconditional group), minus
//! what the fence refuses (`adjtimex`, `clock_adjtime`,
//! `name_to_handle_at`). The filter adds `clone` and `personality` (their
//! arguments limited by the fence's refusals) and `socket` (but AF_ALG and
//! AF_VSOCK, as Docker); `clone3` answers ENOSYS. A call not listed gets
//! EPERM; one newer than the list (`seccomp::NEWEST`) ENOSYS.

#[allow(clippy::wildcard_imports)]
use libc::*;

/// The calls a copy may make, on both architectures.
#[rustfmt::skip]
pub const ALLOWED: &[c_long] = &[
    SYS_accept, SYS_accept4, SYS_bind, SYS_brk, SYS_capget, SYS_capset, SYS_chdir, SYS_clock_getres, SYS_clock_gettime,
    SYS_clock_nanosleep, SYS_close, SYS_close_range, SYS_connect, SYS_copy_file_range, SYS_dup, SYS_dup3,
    SYS_epoll_create1, SYS_epoll_ctl, SYS_epoll_pwait, SYS_epoll_pwait2, SYS_eventfd2, SYS_execve, SYS_execveat,
    SYS_exit, SYS_exit_group, SYS_faccessat, SYS_faccessat2, SYS_fadvise64, SYS_fallocate, SYS_fanotify_mark,
    SYS_fchdir, SYS_fchmod, SYS_fchmodat, SYS_fchown, SYS_fchownat, SYS_fcntl, SYS_fdatasync, SYS_fgetxattr,
    SYS_flistxattr, SYS_flock, SYS_fremovexattr, SYS_fsetxattr, SYS_fstat, SYS_fstatfs, SYS_fsync, SYS_ftruncate,
    SYS_futex, SYS_futex_waitv, SYS_get_robust_list, SYS_getcpu, SYS_getcwd, SYS_getdents64, SYS_getegid, SYS_geteuid,
    SYS_getgid, SYS_getgroups, SYS_getitimer, SYS_getpeername, SYS_getpgid, SYS_getpid, SYS_getppid, SYS_getpriority,
    SYS_getrandom, SYS_getresgid, SYS_getresuid, SYS_getrusage, SYS_getsid, SYS_getsockname, SYS_getsockopt,
    SYS_gettid, SYS_gettimeofday, SYS_getuid, SYS_getxattr, SYS_inotify_add_watch, SYS_inotify_init1,
    SYS_inotify_rm_watch, SYS_io_cancel, SYS_io_destroy, SYS_io_getevents, SYS_io_setup, SYS_io_submit, SYS_ioctl,
    SYS_ioprio_get, SYS_ioprio_set, SYS_kill, SYS_landlock_add_rule, SYS_landlock_create_ruleset,
    SYS_landlock_restrict_self, SYS_lgetxattr, SYS_linkat, SYS_listen, SYS_listxattr, SYS_llistxattr, SYS_lremovexattr,
    SYS_lseek, SYS_lsetxattr, SYS_madvise, SYS_membarrier, SYS_memfd_create, SYS_memfd_secret, SYS_mincore,
    SYS_mkdirat, SYS_mknodat, SYS_mlock, SYS_mlock2, SYS_mlockall, SYS_mmap, SYS_mprotect, SYS_mq_getsetattr,
    SYS_mq_notify, SYS_mq_open, SYS_mq_timedreceive, SYS_mq_timedsend, SYS_mq_unlink, SYS_mremap, SYS_mseal,
    SYS_msgctl, SYS_msgget, SYS_msgrcv, SYS_msgsnd, SYS_msync, SYS_munlock, SYS_munlockall, SYS_munmap, SYS_nanosleep,
    SYS_newfstatat, SYS_openat, SYS_openat2, SYS_pidfd_open, SYS_pidfd_send_signal, SYS_pipe2, SYS_pkey_alloc,
    SYS_pkey_free, SYS_pkey_mprotect, SYS_ppoll, SYS_prctl, SYS_pread64, SYS_preadv, SYS_preadv2, SYS_prlimit64,
    SYS_process_mrelease, SYS_pselect6, SYS_pwrite64, SYS_pwritev, SYS_pwritev2, SYS_read, SYS_readahead,
    SYS_readlinkat, SYS_readv, SYS_recvfrom, SYS_recvmmsg, SYS_recvmsg, SYS_remap_file_pages, SYS_removexattr,
    SYS_renameat2, SYS_restart_syscall, SYS_rseq, SYS_rt_sigaction, SYS_rt_sigpending, SYS_rt_sigprocmask,
    SYS_rt_sigqueueinfo, SYS_rt_sigreturn, SYS_rt_sigsuspend, SYS_rt_sigtimedwait, SYS_rt_tgsigqueueinfo,
    SYS_sched_get_priority_max, SYS_sched_get_priority_min, SYS_sched_getaffinity, SYS_sched_getattr,
    SYS_sched_getparam, SYS_sched_getscheduler, SYS_sched_rr_get_interval, SYS_sched_setaffinity, SYS_sched_setattr,
    SYS_sched_setparam, SYS_sched_setscheduler, SYS_sched_yield, SYS_seccomp, SYS_semctl, SYS_semget, SYS_semop,
    SYS_semtimedop, SYS_sendfile, SYS_sendmmsg, SYS_sendmsg, SYS_sendto, SYS_set_robust_list, SYS_set_tid_address,
    SYS_setfsgid, SYS_setfsuid, SYS_setgid, SYS_setgroups, SYS_setitimer, SYS_setpgid, SYS_setpriority, SYS_setregid,
    SYS_setresgid, SYS_setresuid, SYS_setreuid, SYS_setsid, SYS_setsockopt, SYS_setuid, SYS_setxattr, SYS_shmat,
    SYS_shmctl, SYS_shmdt, SYS_shmget, SYS_shutdown, SYS_sigaltstack, SYS_signalfd4, SYS_socketpair, SYS_splice,
    SYS_statfs, SYS_statx, SYS_symlinkat, SYS_sync, SYS_syncfs, SYS_sysinfo, SYS_tee, SYS_tgkill, SYS_timer_create,
    SYS_timer_delete, SYS_timer_getoverrun, SYS_timer_gettime, SYS_timer_settime, SYS_timerfd_create,
    SYS_timerfd_gettime, SYS_timerfd_settime, SYS_times, SYS_tkill, SYS_truncate, SYS_umask, SYS_uname, SYS_unlinkat,
    SYS_utimensat, SYS_vmsplice, SYS_wait4, SYS_waitid, SYS_write, SYS_writev,
];

/// The calls of Docker's list that only x86_64 has (the old forms aarch64
/// never had), and its two x86-only ones (`arch_prctl`, `modify_ldt`).
#[cfg(target_arch = "x86_64")]
#[rustfmt::skip]
pub const ALLOWED_HERE: &[c_long] = &[
    SYS_access, SYS_alarm, SYS_arch_prctl, SYS_chmod, SYS_chown, SYS_creat, SYS_dup2, SYS_epoll_create,
    SYS_epoll_ctl_old, SYS_epoll_wait, SYS_epoll_wait_old, SYS_eventfd, SYS_fchmodat2, SYS_fork, SYS_futimesat,
    SYS_get_thread_area, SYS_getdents, SYS_getpgrp, SYS_getrlimit, SYS_inotify_init, SYS_lchown, SYS_link, SYS_lstat,
    SYS_mkdir, SYS_mknod, SYS_modify_ldt, SYS_open, SYS_pause, SYS_pipe, SYS_poll, SYS_readlink, SYS_rename,
    SYS_renameat, SYS_rmdir, SYS_select, SYS_set_thread_area, SYS_setrlimit, SYS_signalfd, SYS_stat, SYS_symlink,
    SYS_sync_file_range, SYS_time, SYS_unlink, SYS_utime, SYS_utimes, SYS_vfork,
];
/// None beyond the common list.
#[cfg(not(target_arch = "x86_64"))]
pub const ALLOWED_HERE: &[c_long] = &[];

/// Calls of Docker's list that the libc crate does not name yet, by number
/// (the same on x86_64 and aarch64 from 424 on): `cachestat`,
/// `map_shadow_stack`, `futex_wake`, `futex_wait`, `futex_requeue`,
/// `statmount`, `listmount`, `setxattrat`, `getxattrat`, `listxattrat`,
/// `removexattrat`; and `io_pgetevents` (and x86_64's `uretprobe`).
#[cfg(target_arch = "x86_64")]
pub const ALLOWED_BY_NUMBER: &[c_long] = &[451, 453, 454, 455, 456, 457, 458, 463, 464, 465, 466, 333, 335];
/// As above, with aarch64's number of `io_pgetevents`.
#[cfg(not(target_arch = "x86_64"))]
pub const ALLOWED_BY_NUMBER: &[c_long] = &[451, 453, 454, 455, 456, 457, 458, 463, 464, 465, 466, 292];
