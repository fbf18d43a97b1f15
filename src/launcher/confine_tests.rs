//! The filters on a real process: a forked child confines itself and
//! checks, with raw system calls, what it may still do. It reports the
//! first check that failed through its exit status (0: all held).

use super::*;
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;

/// Folders of one test: the child's scratch disk, its /tmp, and a place
/// outside both.
struct Places {
    /// The test's own folder.
    root: PathBuf,
    /// The folder again, removed when dropped.
    _held: tempfile::TempDir,
}

impl Places {
    fn new(name: &str) -> Places {
        use std::os::unix::fs::PermissionsExt;
        // 0755, as a folder made with the usual umask: a confined copy may
        // run as another user, and must reach its scratch folder.
        let held = tempfile::Builder::new()
            .prefix(&format!("confine-{name}-"))
            .permissions(std::fs::Permissions::from_mode(0o755))
            .tempdir()
            .unwrap();
        let root = held.path().to_path_buf();
        for d in ["scratch", "tmp", "outside"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        Places { root, _held: held }
    }

    fn confinement(&self, sandbox: &Sandbox, port: u16) -> Confinement {
        Confinement::new(&self.root.join("scratch"), &self.root.join("tmp"), port, sandbox)
    }
}

/// A port free right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `Ok` when the last call failed with `want`.
fn errno_is(ret: libc::c_long, want: i32) -> bool {
    ret == -1 && std::io::Error::last_os_error().raw_os_error() == Some(want)
}

/// Opens `path` for writing (creating it); the errno on failure.
fn open_write(path: &Path) -> Result<(), i32> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; the fd is closed at once.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: fd was just opened.
    unsafe { libc::close(fd) };
    Ok(())
}

/// Binds 127.0.0.1:`port`; the errno on failure.
fn bind(port: u16) -> Result<(), i32> {
    TcpListener::bind(("127.0.0.1", port)).map(drop).map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Forks; the child runs `checks`, writes their names to a pipe and exits
/// with the number of the first that failed (0 when all held, 100 on a
/// panic). Returns that number and the names.
fn in_child(checks: impl FnOnce() -> Vec<(&'static str, bool)>) -> (i32, Vec<&'static str>) {
    let (read, write) = nix::unistd::pipe().unwrap();
    // SAFETY: the child only runs the checks and exits with _exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            drop(read);
            let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let results = checks();
                let names: Vec<&str> = results.iter().map(|(n, _)| *n).collect();
                let _ = nix::unistd::write(&write, names.join("\n").as_bytes());
                results.iter().position(|(_, ok)| !ok).map(|i| i as i32 + 1).unwrap_or(0)
            }))
            .unwrap_or(100);
            // SAFETY: leaves the forked child without running the harness.
            unsafe { libc::_exit(code) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(write);
            // The checks take moments; a child that hangs is killed and the
            // test fails, instead of holding the suite.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let status = loop {
                match nix::sys::wait::waitpid(child, Some(nix::sys::wait::WaitPidFlag::WNOHANG)).unwrap() {
                    nix::sys::wait::WaitStatus::StillAlive if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(10))
                    }
                    nix::sys::wait::WaitStatus::StillAlive => {
                        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                        let _ = nix::sys::wait::waitpid(child, None);
                        panic!("the child running the checks did not end within 60 s");
                    }
                    ended => break ended,
                }
            };
            // The names are a few lines: the pipe held them while the child ran.
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::fs::File::from(read), &mut text).unwrap();
            let code = match status {
                nix::sys::wait::WaitStatus::Exited(_, c) => c,
                other => panic!("the child ended with {other:?}"),
            };
            (code, text.lines().map(|l| Box::leak(l.to_string().into_boxed_str()) as &'static str).collect())
        }
    }
}

/// Panics naming the check that failed.
fn assert_held((code, names): (i32, Vec<&'static str>)) {
    assert_ne!(code, 100, "the child panicked");
    if code != 0 {
        let name = names.get(code as usize - 1).copied().unwrap_or("(unnamed)");
        panic!("check {code} failed in the confined child: {name}");
    }
}

/// Calls `nr` with all-zero arguments (or -1 where 0 is a real fd).
fn refused_with_eperm(nr: libc::c_long) -> bool {
    let first: libc::c_long = if nr == libc::SYS_finit_module || nr == libc::SYS_setns { -1 } else { 0 };
    // SAFETY: zero (null) arguments; the calls are refused by the filter
    // before the kernel reads anything.
    let ret = unsafe { libc::syscall(nr, first, 0, 0, 0, 0, 0) };
    errno_is(ret, libc::EPERM)
}

/// Calls in the REFUSED list that are not safe to make unfiltered with
/// zero arguments as root (they act on the machine), checked otherwise or
/// left to the filter's own test.
const NOT_BY_ZERO_ARGS: [libc::c_long; 4] = [libc::SYS_ptrace, libc::SYS_vhangup, libc::SYS_kexec_load, libc::SYS_kexec_file_load];

#[test]
fn a_confined_process_is_refused_what_the_fence_refuses_and_keeps_the_rest() {
    let places = Places::new("default");
    let (own, other) = (free_port(), free_port());
    let sandbox = Sandbox { memory: Some(300 << 20), open_files: 1000, ..Sandbox::default() };
    let c = places.confinement(&sandbox, own);
    let outside = places.root.join("outside").join("f");
    let (scratch, tmp) = (places.root.join("scratch").join("f"), places.root.join("tmp").join("f"));
    assert_held(in_child(move || {
        let applied = confine(&c);
        let whole = matches!(&applied, Ok(a) if a.seccomp.filter && a.landlock.whole() && a.rlimits.missing.is_none());
        let ppid = nix::unistd::getppid().as_raw() as libc::c_long;
        // SAFETY (all below): raw calls with scalar or null arguments, each
        // expected to be refused; the one that would fork exits at once.
        let mut checks = vec![
            ("confine applied everything (Landlock present)", whole),
            (
                "mount -> EPERM",
                errno_is(
                    unsafe { libc::syscall(libc::SYS_mount, c"none".as_ptr(), c"/nonexistent-shinyctl".as_ptr(), c"tmpfs".as_ptr(), 0, 0) },
                    libc::EPERM,
                ),
            ),
            (
                "ptrace(PEEKUSER, parent) -> EPERM",
                errno_is(unsafe { libc::syscall(libc::SYS_ptrace, libc::PTRACE_PEEKUSER, ppid, 0, 0) }, libc::EPERM),
            ),
            ("unshare(CLONE_NEWUSER) -> EPERM", errno_is(unsafe { libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER) }, libc::EPERM)),
            ("clone3 -> ENOSYS", errno_is(unsafe { libc::syscall(libc::SYS_clone3, 0, 0) }, libc::ENOSYS)),
            ("clone(CLONE_NEWNS) -> EPERM", errno_is(clone_flags(libc::CLONE_NEWNS), libc::EPERM)),
            ("clone(CLONE_NEWUSER) -> EPERM", errno_is(clone_flags(libc::CLONE_NEWUSER), libc::EPERM)),
            ("plain clone (fork) works", clone_flags(0) > 0),
            ("a thread starts", std::thread::spawn(|| 7).join().ok() == Some(7)),
            ("personality(ADDR_NO_RANDOMIZE) -> EPERM", errno_is(unsafe { libc::syscall(libc::SYS_personality, 0x0040000) }, libc::EPERM)),
            ("personality query works", unsafe { libc::syscall(libc::SYS_personality, 0xffff_ffffu32) } >= 0),
            (
                "socket(AF_ALG) -> EPERM",
                errno_is(unsafe { libc::syscall(libc::SYS_socket, libc::AF_ALG, libc::SOCK_SEQPACKET, 0) }, libc::EPERM),
            ),
            (
                "socket(AF_VSOCK) -> EPERM",
                errno_is(unsafe { libc::syscall(libc::SYS_socket, libc::AF_VSOCK, libc::SOCK_STREAM, 0) }, libc::EPERM),
            ),
            ("socket(AF_UNIX) works", socket_works(libc::AF_UNIX)),
            ("a call newer than the list -> ENOSYS", errno_is(unsafe { libc::syscall(seccomp::NEWEST + 1) }, libc::ENOSYS)),
            (
                "a call off the list (pidfd_getfd) -> EPERM",
                errno_is(unsafe { libc::syscall(libc::SYS_pidfd_getfd, -1, -1, 0) }, libc::EPERM),
            ),
            ("write outside -> EACCES", open_write(&outside) == Err(libc::EACCES)),
            ("write to scratch works", open_write(&scratch).is_ok()),
            ("write to tmp works", open_write(&tmp).is_ok()),
            ("write to /dev/null works", open_write(Path::new("/dev/null")).is_ok()),
            ("bind another port -> EACCES", bind(other) == Err(libc::EACCES)),
            ("bind its own port works", bind(own).is_ok()),
            ("signal the parent -> EPERM", errno_is(unsafe { libc::syscall(libc::SYS_kill, ppid, 0) }, libc::EPERM)),
            ("RLIMIT_NOFILE is open-files", nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) == Ok((1000, 1000))),
            ("RLIMIT_CORE is 0", nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_CORE) == Ok((0, 0))),
            (
                "RLIMIT_DATA is above memory",
                nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_DATA).map(|l| l.0) == Ok(556 << 20),
            ),
            ("no_new_privs is set", unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1),
        ];
        #[cfg(target_arch = "x86_64")]
        checks.push(("an x32 call -> EPERM", errno_is(unsafe { libc::syscall(0x4000_0000 | libc::SYS_getpid) }, libc::EPERM)));
        for &nr in seccomp::REFUSED.iter().filter(|nr| !NOT_BY_ZERO_ARGS.contains(nr)) {
            checks.push(("a listed call with zero arguments -> EPERM", refused_with_eperm(nr)));
        }
        checks
    }));
}

/// Whether a stream socket of `family` can be made (and closes it).
fn socket_works(family: libc::c_int) -> bool {
    // SAFETY: socket with scalar arguments; the descriptor is closed.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM, 0) };
    if fd >= 0 {
        // SAFETY: our own descriptor.
        unsafe { libc::close(fd) };
    }
    fd >= 0
}

/// `clone` with `flags` and SIGCHLD, like fork: the new process (if any)
/// exits at once and is reaped. Returns clone's result.
fn clone_flags(flags: libc::c_int) -> libc::c_long {
    // SAFETY: a fork-like clone (no new stack); the child only calls _exit.
    let pid = unsafe { libc::syscall(libc::SYS_clone, (flags | libc::SIGCHLD) as libc::c_ulong, 0, 0, 0, 0) };
    if pid == 0 {
        // SAFETY: the new process leaves at once.
        unsafe { libc::_exit(0) }
    }
    if pid > 0 {
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
    }
    pid
}

#[test]
fn syscalls_unconfined_skips_only_the_filter() {
    let places = Places::new("unconfined");
    let sandbox = Sandbox { syscalls: Syscalls::Unconfined, mode: SandboxMode::Strict, ..Sandbox::default() };
    let c = places.confinement(&sandbox, free_port());
    let outside = places.root.join("outside").join("f");
    assert_held(in_child(move || {
        let applied = confine(&c);
        vec![
            ("strict accepts unconfined syscalls as a choice", applied.is_ok()),
            (
                "no filter, and it says why",
                matches!(&applied, Ok(a) if !a.seccomp.filter && a.seccomp.missing.as_deref() == Some("syscalls: unconfined")),
            ),
            // SAFETY: clone3 with a null, zero-sized argument only fails.
            ("clone3 reaches the kernel (EINVAL, not ENOSYS)", errno_is(unsafe { libc::syscall(libc::SYS_clone3, 0, 0) }, libc::EINVAL)),
            ("Landlock still limits writes", open_write(&outside) == Err(libc::EACCES)),
            // SAFETY: prctl with integer arguments.
            ("no_new_privs is set", unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) } == 1),
        ]
    }));
}

#[test]
fn strict_names_what_is_missing() {
    let mut applied = Applied { no_new_privs: true, ..Applied::default() };
    applied.landlock.missing = Some("this kernel has no Landlock".into());
    let e = ConfineError::Strict(Box::new(applied.clone()));
    assert_eq!(e.to_string(), "sandbox mode strict, and the fence is not whole: Landlock: this kernel has no Landlock");
    let line = applied.log_line();
    assert!(line.contains("no_new_privs") && line.contains("missing: Landlock: this kernel has no Landlock"), "{line}");
    let json = serde_json::to_string(&applied).unwrap();
    assert_eq!(serde_json::from_str::<Applied>(&json).unwrap(), applied, "the report can carry it");
}
