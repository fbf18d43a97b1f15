//! The copy launcher: `shinyctl launch …` (hidden), through which every copy
//! starts. The daemon spawns it (in the copy's own process group, env set, output
//! to the copy's log); it prepares the copy's world and then execs R, so the
//! PID the daemon records is R's.
//!
//! The world, best first:
//! - `mount-namespace`: the fence (`host.rs`, `init.rs`): the launcher
//!   stays on the host side and clones shinyctl's own init into new user,
//!   mount, PID, IPC and UTS namespaces; the init builds the copy's root (a
//!   new tmpfs holding the host's top-level folders read-only, /sys too, a
//!   /dev of its own, a private /tmp and /dev/shm, a /proc of its own with
//!   what reaches the host read-only, SHINYCTL_HOME and the secrets hidden,
//!   the app folder
//!   read-only at [`APP_DIR`], the scratch disk at [`SCRATCH_DIR`]; see
//!   `mount.rs`) and forks R. The daemon records the launcher; the report
//!   names R's PID.
//! - `landlock`: no namespace could be made (user namespaces switched off);
//!   Landlock lets the copy write only to its scratch disk, /tmp and the
//!   devices R needs (`landlock.rs`); the launcher execs R.
//! - `none`: neither, or `sandbox.mode: off`; the copy runs as a plain
//!   process (the launcher execs R).
//!
//! What the copy got is written to a small report file beside its scratch
//! disk ([`report_path`]), which the daemon reads for `status --json`.

mod allowed;
mod claim;
mod confine;
mod fds;
mod host;
mod init;
mod landlock;
mod log_pump;
mod mount;
mod plan;
mod ports;
mod r;
mod rlimits;
mod seccomp;
mod signals;
mod sources;
mod syscall_tree;
pub mod zygote;

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::manifest::SandboxMode;
use crate::sys::disk;
use crate::sys::users::{self, Identity};
use crate::wire::launch::fences::{self, Fences};
use crate::wire::launch::report::{self, report_path};
use crate::wire::launch::{r_string, Launch, EXIT_LAUNCH_FAILED, EXIT_NO_R, EXIT_REFUSED, LAUNCH_FAILED_LINE};
pub use crate::wire::{Isolation, IsolationKind};
pub use confine::{confine, Applied, ConfineError, Confinement, SeccompApplied};
pub use landlock::LandlockApplied;
use r::exec_r;
pub use r::{run_app_expr, R_ARGS};
pub use rlimits::RlimitsApplied;

/// Where the app folder is inside the copy's mount namespace (its working
/// directory there).
pub const APP_DIR: &str = "/shinyctl/app";
/// Where the copy's scratch disk (`SHINYCTL_SCRATCH`) is inside its mount
/// namespace.
pub const SCRATCH_DIR: &str = "/shinyctl/scratch";

/// The folders a copy sees once its world is made: inside the namespace,
/// the fixed paths; otherwise the host's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFolders {
    /// The app folder (the working directory).
    pub app_dir: PathBuf,
    /// The scratch disk (`SHINYCTL_SCRATCH`).
    pub scratch: PathBuf,
    /// R's TMPDIR, when the copy has no /tmp of its own (no mount
    /// namespace) and the manifest sets none: `<scratch>.tmp`.
    pub tmpdir: Option<PathBuf>,
    /// R_LIBS_USER, when the daemon user's own R libraries are bound into
    /// the copy (see `mount::Plan::libraries`).
    pub r_libs_user: Option<String>,
}

/// `shinyctl launch ARGS`: runs the launcher ([`launch`]), then lets the
/// copy's last output reach its log (`log_pump`) before the launcher's
/// exit status is returned.
pub fn main(args: &[OsString]) -> i32 {
    // Before anything is opened: what the daemon's starter leaked stays
    // out of the init and R (see `fds`).
    fds::close_inherited();
    log_pump::install();
    let code = launch(args);
    log_pump::finish(log_pump::FINISH_WAIT);
    code
}

/// Prepares the copy's world and starts R, through the pool, else cold
/// (the module's comment); returns only on failure, with the exit status
/// to use (a fenced copy's launcher ends the way R ended).
fn launch(args: &[OsString]) -> i32 {
    let launch = match Launch::parse(args) {
        Ok(l) => l,
        Err(e) => return fail(&format!("bad arguments: {e}")),
    };
    // Opened before the namespace hides the host's paths. Without it the
    // copy still runs; only status lacks the field.
    let report = report::Writer::open(&report_path(&launch.scratch))
        .map_err(|e| log(&format!("--- shinyctl: no isolation report beside {}: {e} ---", launch.scratch.display())))
        .ok();
    let mut fences = Fences::wanted(launch.start.sandbox.mode);
    // The copy's cgroups (memory, tasks), joined before anything is started,
    // so the init, R and everything R starts are in them.
    if launch.start.sandbox.mode != SandboxMode::Off {
        match join_cgroups(&launch.cgroups) {
            Ok(()) => fences.in_force(fences::CGROUP),
            Err(why) => {
                fences.missing(fences::CGROUP, &why, Some("run shinyctl serve from its systemd unit (`install.sh --service`; Delegate=yes, DelegateSubgroup=daemon: systemd 254+) on cgroup v2, or as root"))
            }
        }
    }
    let who = match run_as(&launch) {
        Ok(w) => w,
        Err(e) => return fail(&e),
    };
    let mut report = report;
    if launch.start.sandbox.mode == SandboxMode::Off {
        started_cold(&mut report, launch.cold.as_deref());
        return direct(&launch, report, fences, who.as_ref());
    }
    own_disk(&launch, who.as_ref());
    let plan = match plan::resolve(&launch, who.as_ref()) {
        Ok(p) => p,
        Err(e) => return fail(&format!("{e:#}")),
    };
    let mut cold = launch.cold.clone();
    // A claimed R is found through the report: without room for it, cold.
    let no_report = !report.as_ref().is_some_and(report::Writer::reserved);
    if let (Some(_), true) = (&launch.pool, no_report) {
        let why = "its report beside the scratch disk cannot be written (a full disk?), and a claimed copy is found through it".to_string();
        log(&format!("--- shinyctl: not claimed from the pool, R starts cold: {why} ---"));
        cold = Some(why);
    }
    if let Some(socket) = launch.pool.as_ref().filter(|_| !no_report) {
        signals::block_signals();
        match claim::claim(&launch, &plan, who.as_ref(), &fences, socket) {
            Ok(claimed) => claimed.wait(&launch, report, who.as_ref()),
            Err(why) => {
                log(&format!("--- shinyctl: not claimed from the pool, R starts cold: {why} ---"));
                cold = Some(why);
            }
        }
    }
    started_cold(&mut report, cold.as_deref());
    host::run(&launch, report, plan, who, fences)
}

/// A root launcher makes the copy's scratch, /tmp and /dev/shm one
/// filesystem of `sandbox.disk` bytes (`disk.rs`), given to the copy's
/// user. Where it cannot (no loop devices, no mkfs.ext4, files from before),
/// the copy starts all the same and the log says why; the daemon then
/// watches the disk's use, as it does for a daemon that is not root.
fn own_disk(launch: &Launch, who: Option<&Identity>) {
    let Some(size) = launch.start.sandbox.disk.bytes() else { return };
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let (tmp, shm) = (disk::tmp_path(&launch.scratch), disk::shm_path(&launch.scratch));
    let owner = who.map(|w| (w.uid, w.gid));
    let shown = crate::sys::fmt::size(size, crate::sys::fmt::SizeStyle::Manifest);
    match disk::attach(&launch.scratch, &tmp, &shm, size, owner) {
        Ok(disk::Attached::Mounted(device)) => {
            log(&format!("--- shinyctl: the copy's disk (scratch, /tmp, /dev/shm) is a filesystem of its own of {shown} on {device} ---"))
        }
        Ok(disk::Attached::Already) => {}
        Err(e) => log(&format!(
            "--- shinyctl: the copy's disk has no filesystem of its own ({e:#}); its size of {shown} is watched by the daemon ---"
        )),
    }
}

/// Notes in the report that R starts cold, and why (none: the daemon gave
/// no reason, a launcher of a daemon without the pool).
fn started_cold(report: &mut Option<report::Writer>, why: Option<&str>) {
    if let (Some(r), Some(why)) = (report.as_mut(), why) {
        r.started(format!("cold: {why}"));
    }
}

/// Moves the launcher (and so R and all it starts) into the copy's cgroups.
/// One it cannot join is said in the log; the daemon then watches the
/// copy's memory itself (it checks where the copy is). None given: the
/// daemon has no cgroup to give.
fn join_cgroups(dirs: &[PathBuf]) -> Result<(), String> {
    if dirs.is_empty() {
        return Err("the daemon has no cgroup it may manage (memory is watched by the daemon instead)".into());
    }
    if join_by_tasks(dirs) {
        return Ok(());
    }
    let pid = std::process::id().to_string();
    let mut failed = None;
    for dir in dirs {
        if let Err(e) = std::fs::write(dir.join("cgroup.procs"), &pid) {
            log(&format!("--- shinyctl: cannot join the cgroup {}: {e}; its limit is not kept by the kernel ---", dir.display()));
            failed = Some(format!("cannot join {}: {e}", dir.display()));
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Moves the calling process, when it has one thread, into every cgroup
/// v1 folder in `dirs` through its `tasks` file; false when it could not
/// join them all so (more threads, a cgroup v2 hierarchy, an error), and
/// the caller has the process moved by `cgroup.procs`. A process moved by
/// `cgroup.procs` waits for the kernel's lock on every fork in the system,
/// a whole RCU grace period (17 ms of each cold start on the 2-core test
/// machine, README "Benchmark"); "0" written to `tasks` moves the calling
/// thread alone, which needs no such lock: the same move for a process of
/// one thread (checked, or other threads would be left behind). The
/// launcher joins so ([`join_cgroups`]), and a claimed copy's fork before
/// it leaves the host's view.
pub(super) fn join_by_tasks(dirs: &[PathBuf]) -> bool {
    !dirs.is_empty() && one_thread() && dirs.iter().all(|d| d.join("tasks").exists() && std::fs::write(d.join("tasks"), "0").is_ok())
}

/// True when the calling process has one thread.
fn one_thread() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|d| d.count() == 1)
}

/// Who the copy runs as: the run-as user, for a root launcher (one that is
/// not root runs the copy as itself, and says so), or the app's own uid.
/// A root launcher hands the app's folders to that uid here; one that is
/// not root cannot, and its init does, inside the copy's user namespace
/// where the uid is mapped ([`hand_over`]).
fn run_as(launch: &Launch) -> Result<Option<Identity>, String> {
    let root = nix::unistd::geteuid().is_root();
    match (&launch.start.run_as, launch.uid) {
        (Some(name), _) if !root => {
            log(&format!("--- shinyctl: run-as {name} is for a daemon running as root; the copy runs as the daemon's user ---"));
            Ok(None)
        }
        (Some(name), _) => Identity::named(name).map(Some).map_err(|e| e.to_string()),
        (None, Some(uid)) => {
            let who = users::of_app(uid);
            if root {
                hand_over(launch, &who)?;
            }
            Ok(Some(who))
        }
        (None, _) => Ok(None),
    }
}

/// Gives the app's own uid its disk, /tmp and /dev/shm, also those from
/// before it had a uid of its own (its daemon's user's then), and its
/// release, which it reads whatever the files' modes were in working-dir
/// (read-only to it all the same: mounted so, or under Landlock). Only a
/// release: a copy from before releases runs working-dir, which stays its
/// owner's.
pub fn hand_over(launch: &Launch, who: &Identity) -> Result<(), String> {
    let release = Some(launch.app_dir.clone()).filter(|d| d.starts_with(launch.home.join("releases")));
    for dir in [launch.scratch.clone(), disk::tmp_path(&launch.scratch), disk::shm_path(&launch.scratch)].into_iter().chain(release) {
        if dir.exists() {
            users::give_all_to(&dir, who).map_err(|e| format!("cannot give {} to the app's uid {}: {e}", dir.display(), who.uid))?;
        }
    }
    Ok(())
}

/// Starts R without namespaces (none could be made, or `sandbox.mode:
/// off`): Landlock where it can be had, then exec, in a child. The
/// launcher stays R's parent and a subreaper, so whatever R starts, even
/// with `setsid` and a double fork, keeps the launcher among its ancestors
/// (the mark by which the control sockets know a copy, `crate::sys::peer`), and
/// is ended with R. The fences say why there are no namespaces.
fn direct(launch: &Launch, report: Option<report::Writer>, mut fences: Fences, who: Option<&Identity>) -> i32 {
    // Without a user namespace a launcher that is not root has no way to
    // take on the app's own (subordinate) uid.
    let who = match who {
        Some(w) if !nix::unistd::geteuid().is_root() => {
            log(&format!(
                "--- shinyctl: the app's own uid {} needs a user namespace, which this copy has none of: it runs as the daemon's user ---",
                w.uid
            ));
            None
        }
        w => w,
    };
    use nix::unistd::{fork, ForkResult};
    let canonical =
        |p: &Path, what: &str| std::fs::canonicalize(p).map_err(|e| format!("the {what} {} cannot be opened: {e}", p.display()));
    let (app_dir, scratch) = match (canonical(&launch.app_dir, "app folder"), canonical(&launch.scratch, "scratch disk")) {
        (Ok(a), Ok(s)) => (a, s),
        (Err(e), _) | (_, Err(e)) => return fail(&e),
    };
    let tmpdir = own_tmpdir(&scratch, who);
    signals::block_signals();
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        return fail(&format!("cannot stay the parent of what the copy starts (PR_SET_CHILD_SUBREAPER): {e}"));
    }
    let (fences_in, fences_out) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return fail(&format!("no pipe for the copy's fences: {e}")),
    };
    // The way the listener of R's bind and listen comes back (`ports`): the
    // launcher answers them, as a fenced copy's init does.
    let (sup, sup_child) = match init::supervision_pair() {
        Ok(p) => p,
        Err(e) => return fail(&format!("no socket pair for the copy's launcher: {e}")),
    };
    // SAFETY: the launcher is single-threaded, so the child may run
    // anything; it execs R or exits.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            log_pump::forget();
            drop(fences_in);
            signals::unblock_signals();
            if let Some(who) = who {
                if let Err(e) = users::set_user(who) {
                    std::process::exit(fail(&format!("cannot become {}: {e}", who.name)));
                }
            }
            // After the user is set (a change of user clears it): R does not
            // outlive its launcher.
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            let mut seen = CopyFolders { app_dir, scratch, tmpdir, r_libs_user: None };
            drop(sup);
            if launch.start.sandbox.mode != SandboxMode::Off {
                init::hand_over_ports(&sup_child, &mut fences);
            }
            drop(sup_child);
            let code = finish_and_exec(launch, &mut seen, &mut fences, who, |f, refused| {
                let handoff = init::Handoff { fences: f.clone(), refused: refused.map(str::to_string) };
                let _ = std::fs::File::from(fences_out).write_all(&serde_json::to_vec(&handoff).unwrap_or_default());
            });
            std::process::exit(code)
        }
        Ok(ForkResult::Parent { child }) => {
            log_pump::start();
            drop((fences_out, sup_child));
            let listener = ports::receive(&sup);
            drop(sup);
            let mut bytes = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::fs::File::from(fences_in), &mut bytes);
            if let (Some(report), Ok(told)) = (report, serde_json::from_slice::<init::Handoff>(&bytes)) {
                let isolation = isolation_of(&told.fences, launch.start.sandbox.mode, host::user_name(who));
                report.write(&isolation, u32::try_from(child.as_raw()).ok(), told.refused.as_deref());
            }
            let told = init::wait_for(child, listener, launch.port, None);
            host::end_orphans();
            host::mirror(&told, nix::sys::wait::WaitStatus::Exited(child, EXIT_LAUNCH_FAILED))
        }
        Err(e) => fail(&format!("cannot start R's process: {e}")),
    }
}

/// In the process about to exec R (the init's child, or the launcher
/// itself without namespaces): the last fences, the strict check, the
/// report of the fences and of a refusal (`send`), the log lines, and
/// exec. Returns only on failure, with the exit status.
fn finish_and_exec(
    launch: &Launch,
    seen: &mut CopyFolders,
    fences: &mut Fences,
    who: Option<&Identity>,
    send: impl FnOnce(&Fences, Option<&str>),
) -> i32 {
    match finish(launch, seen, fences, send) {
        Ok(()) => exec_r(launch, seen, who),
        Err(code) => code,
    }
}

/// In the process that becomes R (exec'd, or a claimed copy returning to
/// its R, `claim`): the last fences, the strict check, the report of the
/// fences and of a refusal (`send`) and the log lines. `Err` is the exit
/// status of a copy that must not start.
fn finish(launch: &Launch, seen: &mut CopyFolders, fences: &mut Fences, send: impl FnOnce(&Fences, Option<&str>)) -> Result<(), i32> {
    // The filters, in the process that execs R next, after its user is set
    // and every mount is made (the filter refuses mount and unshare).
    if launch.start.sandbox.mode != SandboxMode::Off {
        // Without a mount namespace, Landlock also keeps the app folder
        // read-only and gives R a /tmp of its own.
        if !fences.has(fences::MOUNT_NS) {
            let _ = landlock::restrict(&seen.scratch, seen.tmpdir.as_deref(), &seen.app_dir);
        }
        // Only a /tmp of the copy's own: never the host's.
        if fences.has(fences::MOUNT_NS) {
            remove_stale_r_tmp(Path::new("/tmp"));
        }
        let tmp = seen.tmpdir.clone().unwrap_or_else(|| PathBuf::from("/tmp"));
        match confine(&Confinement::new(&seen.scratch, &tmp, launch.port, &launch.start.sandbox)) {
            Ok(applied) => {
                note_filters(fences, &applied, launch.start.sandbox.syscalls);
                log(&applied.log_line());
            }
            Err(e @ ConfineError::Strict(_)) => {
                let why = e.to_string();
                send(fences, Some(&why));
                return Err(refuse(&why));
            }
            Err(e) => {
                send(fences, None);
                return Err(fail(&e.to_string()));
            }
        }
    }
    if let Some(tmp) = &seen.tmpdir {
        remove_stale_r_tmp(tmp);
    }
    if launch.start.sandbox.mode == SandboxMode::Strict {
        if let Some(why) = fences.strict_refusal() {
            send(fences, Some(&why));
            return Err(refuse(&why));
        }
    }
    send(fences, None);
    log(&isolation_line(&isolation_of(fences, launch.start.sandbox.mode, String::new()), seen));
    if launch.start.sandbox.mode != SandboxMode::Off {
        log(&format!("--- shinyctl: {} ---", fences.summary()));
    }
    Ok(())
}

/// R's TMPDIR for a copy without a mount namespace (the Landlock fallback,
/// `sandbox.mode: off`): `<scratch>.tmp`, a folder of the copy's own (made
/// here, given to `who`), where its R keeps `tempdir()` rather than in the
/// host's /tmp, so the folder a killed R leaves goes at its next start and
/// with the copy (README, "Where a copy runs"). None when the launcher's
/// environment has a TMPDIR (the manifest's `env`, which travels there, or
/// with the fence off the daemon's own: a choice kept), or the folder
/// cannot be made (said in the log; R then uses /tmp).
fn own_tmpdir(scratch: &Path, who: Option<&Identity>) -> Option<PathBuf> {
    if std::env::var_os("TMPDIR").is_some() {
        return None;
    }
    plan::own_folder(&disk::tmp_path(scratch), who).map_err(|e| log(&format!("--- shinyctl: R's tempdir() is in /tmp: {e:#} ---"))).ok()
}

/// Removes R's temporary folders (`Rtmp…`) that an earlier R of this copy
/// left in the copy's own /tmp (README, "The fence"): R removes its own
/// only when it quits, and a copy's R ends by a signal (a sleep, a
/// restart, a crash), so every start left one behind, with what it held
/// (shiny keeps uploads there), on a disk that is kept through sleep and
/// restarts. None is in use: a copy runs one R, and everything R started
/// ends with it (its PID namespace, or its launcher, a subreaper).
pub(crate) fn remove_stale_r_tmp(tmp: &Path) {
    let Ok(entries) = std::fs::read_dir(tmp) else { return };
    for e in entries.flatten() {
        let r_tmp = e.file_name().to_str().is_some_and(|n| n.starts_with("Rtmp"));
        // A folder, not a link to one: what a link points at is not R's.
        if r_tmp && e.file_type().is_ok_and(|t| t.is_dir()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Fills the Landlock and seccomp slots of the report from what the
/// filters applied.
fn note_filters(fences: &mut Fences, applied: &Applied, syscalls: crate::manifest::Syscalls) {
    match &applied.landlock.missing {
        None => fences.in_force(fences::LANDLOCK),
        Some(why) if applied.landlock.abi > 0 => fences.missing(fences::LANDLOCK, &format!("partly: {why}"), Some("a newer kernel")),
        Some(why) => fences.missing(fences::LANDLOCK, why, Some("a kernel with Landlock (5.13 or later, lsm=landlock)")),
    }
    match (&applied.seccomp.missing, syscalls) {
        (None, _) => fences.in_force(fences::SECCOMP),
        (Some(why), crate::manifest::Syscalls::Unconfined) => fences.off(fences::SECCOMP, why),
        (Some(why), _) => fences.missing(fences::SECCOMP, why, None),
    }
}

/// What a copy got, from its fences, as status shows it.
fn isolation_of(fences: &Fences, mode: SandboxMode, user: String) -> Isolation {
    let reason_of = |name: &str| fences.list.iter().find(|f| f.name == name).and_then(|f| f.reason.clone()).unwrap_or_default();
    let (kind, reason) = if mode == SandboxMode::Off {
        (IsolationKind::None, Some("sandbox mode off".to_string()))
    } else if fences.has(fences::MOUNT_NS) {
        (IsolationKind::MountNamespace, None)
    } else if fences.has(fences::LANDLOCK) {
        (IsolationKind::Landlock, Some(format!("no mount namespace: {}", reason_of(fences::MOUNT_NS))))
    } else {
        let why = format!("no mount namespace: {}; no Landlock: {}", reason_of(fences::MOUNT_NS), reason_of(fences::LANDLOCK));
        (IsolationKind::None, Some(why))
    };
    Isolation { kind, reason, fences: fences.list.clone(), user: (!user.is_empty()).then_some(user), start: None }
}

/// The line the copy's log gets before R starts: what isolation it got and
/// where the app may write.
fn isolation_line(isolation: &Isolation, seen: &CopyFolders) -> String {
    let how = match isolation.kind {
        IsolationKind::MountNamespace => "mount namespace".to_string(),
        IsolationKind::Landlock => format!("Landlock ({})", isolation.reason.as_deref().unwrap_or("")),
        IsolationKind::None => format!("none ({})", isolation.reason.as_deref().unwrap_or("")),
    };
    let folder = match isolation.kind {
        IsolationKind::None => "should be treated as read-only",
        _ => "is read-only",
    };
    format!(
        "--- shinyctl: isolation: {how}. The app's folder {} {folder}: write to SHINYCTL_SCRATCH ({}) or to a path outside set in env ---",
        seen.app_dir.display(),
        seen.scratch.display()
    )
}

/// Writes one line to the copy's log (the launcher's stderr).
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Logs why the copy could not be launched; returns the exit status.
fn fail(why: &str) -> i32 {
    log(&format!("{LAUNCH_FAILED_LINE} {why} ---"));
    EXIT_LAUNCH_FAILED
}

/// Logs why `mode: strict` refuses the copy; returns [`EXIT_REFUSED`].
fn refuse(why: &str) -> i32 {
    log(&format!("{LAUNCH_FAILED_LINE} {why} ---"));
    EXIT_REFUSED
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_line_says_where_to_write() {
        let seen = CopyFolders { app_dir: APP_DIR.into(), scratch: SCRATCH_DIR.into(), tmpdir: None, r_libs_user: None };
        let line = isolation_line(
            &Isolation { kind: IsolationKind::MountNamespace, reason: None, fences: vec![], user: None, start: None },
            &seen,
        );
        assert!(line.contains("/shinyctl/app is read-only"), "{line}");
        assert!(line.contains("SHINYCTL_SCRATCH (/shinyctl/scratch)"), "{line}");
        assert!(!line.starts_with("--- shinyctl: copy"), "not taken for a start line");
    }

    #[test]
    fn a_process_with_a_second_thread_is_not_moved_one_thread_at_a_time() {
        let (stop, parked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let _ = parked.recv();
        });
        assert!(!one_thread(), "the test harness and the thread above");
        drop(stop);
        other.join().unwrap();
    }

    #[test]
    fn only_r_s_own_temporary_folders_are_removed_from_a_copy_s_tmp() {
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.join("RtmpAbC123/upload")).unwrap();
        std::fs::write(t.join("RtmpAbC123/upload/0.csv"), "x").unwrap();
        std::fs::create_dir(t.join("app-cache")).unwrap();
        std::fs::write(t.join("RtmpNotAFolder"), "x").unwrap();
        std::fs::write(elsewhere.path().join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), t.join("RtmpLink")).unwrap();
        remove_stale_r_tmp(t);
        assert!(!t.join("RtmpAbC123").exists(), "an ended R's folder goes, with what it held");
        assert!(t.join("app-cache").is_dir() && t.join("RtmpNotAFolder").is_file(), "nothing else of the copy's /tmp");
        assert!(t.join("RtmpLink").is_symlink() && elsewhere.path().join("keep").exists(), "a link is not followed");
    }
}
