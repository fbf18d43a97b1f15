//! The pool (README, "Sleep and wake"), with real R: a sleeping app woken
//! through the pool answers and status says its copy was claimed; a
//! process that ran an app is never claimed again and the zygote never runs
//! an app; an app that sets what R reads only at start starts cold, and so
//! does every copy when the daemon's environment switches the pool off.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::*;

/// An idle-timeout well above an R start on a loaded machine (see sleep.rs).
const IDLE: &str = "idle-timeout: 20s\nwarm-replicas: 0\n";

/// An app whose page says what R's start gave it: the manifest's variable,
/// the zygote's (none), its working directory and its tempdir() (made
/// anew in the copy's own /tmp, and writable).
const ENV_R: &str = r#"
library(shiny)
t <- file.path(tempdir(), "ok")
writeLines("x", t)
ui <- function(req) tags$pre(paste0("greeting=", Sys.getenv("GREETING"), ";\nzygote=", Sys.getenv("SHINYCTL_ZYGOTE_ENV"),
  Sys.getenv("R_ENVIRON_USER"), ";\nwd=", getwd(), ";\ntmp=", if (file.exists(t)) t else "missing", ";"))
shinyApp(ui, function(input, output) {})
"#;

/// Waits until the daemon's zygote has loaded shiny and takes claims;
/// returns its PID.
pub fn wait_pool_ready(env: &Env) -> u32 {
    wait_until(slow(Duration::from_secs(60)), "the pool's zygote to be ready", || {
        let v = env.status();
        let z = &v["pool"]["zygotes"][0];
        (z["ready"] == true).then(|| z["pid"].as_u64().unwrap() as u32)
    })
}

/// How copy `copy` of `app` started, as status says it.
pub fn start_of(env: &Env, app: &str, copy: u32) -> String {
    let v = env.status();
    let apps = v["apps"].as_array().cloned().unwrap_or_default();
    let a = apps.iter().find(|a| a["name"] == app).unwrap_or_else(|| panic!("{app} in status: {v}"));
    let c = a["copies"].as_array().unwrap().iter().find(|c| c["copy"] == copy).unwrap_or_else(|| panic!("copy {copy}: {v}"));
    c["isolation"]["start"].as_str().unwrap_or_default().to_string()
}

/// The app's copy 1 once it runs and is ready: (R's PID, launcher's PID).
fn running(env: &Env, app: &str) -> (u32, u32) {
    env.wait_roles(app, "1:active", slow(Duration::from_secs(60)));
    let v = env.status();
    let c = &v["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).unwrap()["copies"][0];
    (c["pid"].as_u64().unwrap() as u32, c["launcher_pid"].as_u64().unwrap() as u32)
}

/// Starts the daemon as `shinyctl apply` would, pool on; its PID.
fn serve(env: &Env) -> u32 {
    let mut cmd = Command::new(bin());
    cmd.arg("serve");
    env.start_daemon(cmd)
}

/// The variable `name` of the environment process `pid` started with.
fn environ_var(pid: u32, name: &str) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(format!("{name}=").as_bytes()).map(|v| String::from_utf8_lossy(v).into_owned()))
}

/// The process `pid`'s start time (field 22 of its stat).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(19)?.parse().ok()
}

/// The process `pid`'s parent.
fn parent(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ").and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
}

/// README, "Status": a claimed copy's MEM is its processes' proportional
/// share of their memory, not their resident memory, most of which (R and
/// shiny) is the zygote's pages, shared. `tree`: the copy's processes.
fn claimed_memory_is_its_share(env: &Env, app: &str, tree: &[u32]) {
    let rss_kib = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    };
    let resident: u64 = tree.iter().map(|&p| rss_kib(p) * 1024).sum();
    let mem = || {
        let v = env.status();
        let apps = v["apps"].as_array().cloned().unwrap_or_default();
        apps.iter().find(|a| a["name"] == app).and_then(|a| a["copies"][0]["mem_bytes"].as_u64()).unwrap_or(0)
    };
    // The daemon reads it every 5 s; until then status has the resident memory.
    let shown = wait_until(slow(Duration::from_secs(15)), "status's MEM to be the copy's share", || {
        let m = mem();
        (m > 0 && m < resident * 6 / 10).then_some(m)
    });
    assert!(shown > 20 << 20, "an R with shiny holds more than 20 MiB of its own: {shown} (resident {resident})");
}

#[test]
fn a_sleeping_app_woken_through_the_pool_answers_from_a_claimed_copy_never_reused() {
    let began = std::time::SystemTime::now();
    let env = Env::new("poolwake");
    let app = &unique("poolwake");
    let port = free_port();
    let manifest = env.app_running(ENV_R, app, port, &format!("{IDLE}env:\n  GREETING: from-the-manifest\n"));
    // The zygote gets ready before the app is deployed, so that even the
    // first start is a claim.
    let daemon = serve(&env);
    let v = env.status();
    assert_eq!(v["pool"]["on"], true, "the pool is on by default: {v}");
    let zygote = wait_pool_ready(&env);
    let zygote_start = start_ticks(zygote);
    env.apply(&manifest);
    let mut seen: Vec<u32> = Vec::new();
    for wake in 0..2 {
        let (r, launcher) = running(&env, app);
        let start = start_of(&env, app, 1);
        assert!(start.starts_with("claimed from the pool"), "wake {wake}: the copy was claimed: {start}");
        // R runs under the copy's init, whose parent is the zygote's fork.
        let fork = parent(parent(r));
        assert_eq!(parent(fork), zygote, "wake {wake}: the copy comes from the zygote");
        assert_ne!(r, zygote, "the zygote is never claimed itself");
        assert!(is_copy_r(r), "a claimed R shows a cold one's command line: {}", cmdline(r));
        assert!(cmdline(zygote).contains("shinyctl_zygote") && !cmdline(zygote).contains("runApp"), "{}", cmdline(zygote));
        assert!(launcher != fork && !seen.contains(&r) && !seen.contains(&fork), "wake {wake}: a new process: {r}/{fork} after {seen:?}");
        seen.extend([r, fork]);
        // In the copy's cgroups, as a cold copy is: the fork joined them
        // itself (by `tasks`), its init and R with it.
        let cgroups = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        let copy_cgroups = cgroups(launcher);
        assert!(
            copy_cgroups.lines().any(|l| l.ends_with(&format!("/{app}-1"))),
            "wake {wake}: the launcher is in the copy's cgroups: {copy_cgroups}"
        );
        for (what, pid) in [("the fork", fork), ("the init", parent(r)), ("R", r)] {
            assert_eq!(cgroups(pid), copy_cgroups, "wake {wake}: {what} is in the copy's cgroups");
        }
        let page = wait_http_ok(port, slow(Duration::from_secs(10))).body;
        // The copy's own environment, not the zygote's.
        assert_eq!(between(&page, "greeting=", ";"), Some("from-the-manifest"), "wake {wake}: {page}");
        assert_eq!(between(&page, "zygote=", ";"), Some(""), "wake {wake}: nothing of the zygote's environment: {page}");
        assert_eq!(between(&page, "wd=", ";"), Some("/shinyctl/app"), "wake {wake}: {page}");
        assert!(between(&page, "tmp=", ";").is_some_and(|t| t.starts_with("/tmp/Rtmp") && t.ends_with("/ok")), "wake {wake}: {page}");
        if wake == 0 {
            claimed_memory_is_its_share(&env, app, &[launcher, fork, parent(r), r]);
        }
        env.wait_asleep(app, slow(Duration::from_secs(90)));
        wait_until(slow(Duration::from_secs(30)), "the claimed processes to be gone", || (!pid_alive(r) && !pid_alive(fork)).then_some(()));
        // The request that wakes it is answered by a copy claimed anew.
        let r = get(port, "/", &[]).unwrap();
        assert_eq!(r.status, 200, "the wake through the pool answers: {r:?}");
    }
    let (r, _) = running(&env, app);
    assert!(!seen.contains(&r), "the last wake's copy is new too");
    // The zygote is the same process, never replaced by a claim, and it
    // never ran the app: it stays in /, listens on no TCP port, and its
    // only children are the claims' forks.
    assert_eq!(start_ticks(zygote), zygote_start, "the same zygote throughout");
    assert_eq!(
        std::fs::read_link(format!("/proc/{zygote}/cwd")).unwrap(),
        std::path::Path::new("/"),
        "the zygote never entered an app folder"
    );
    let fds: Vec<String> = std::fs::read_dir(format!("/proc/{zygote}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let inodes: Vec<&str> = tcp.lines().skip(1).filter_map(|l| l.split_whitespace().nth(9)).collect();
    assert!(!fds.iter().any(|f| inodes.iter().any(|i| *f == format!("socket:[{i}]"))), "the zygote holds no TCP socket: {fds:?}");
    let v = env.status();
    assert!(v["pool"]["zygotes"][0]["rss_bytes"].as_u64().is_some_and(|b| b > 0), "its memory is shown: {v}");
    // The zygote's R keeps its tempdir in a folder of the pool's own, not
    // in the shared /tmp, where R, ended by a signal as a zygote always is,
    // left one folder behind for every zygote started; that folder goes
    // with the daemon.
    let tmp = environ_var(zygote, "TMPDIR").unwrap_or_default();
    let system = std::env::temp_dir();
    assert!(
        std::path::Path::new(&tmp).parent() == Some(system.as_path())
            && tmp.contains("/shinyctl-pool-")
            && std::path::Path::new(&tmp).is_dir(),
        "the zygote's TMPDIR is a folder of its own: {tmp:?}"
    );
    use std::os::unix::fs::MetadataExt;
    let zygote_uid = std::fs::metadata(format!("/proc/{zygote}")).unwrap().uid();
    let litter: Vec<_> = std::fs::read_dir(&system)
        .unwrap()
        .flatten()
        // Made since this test began: the uid may have been another home's pool's before.
        .filter(|e| {
            e.file_name().to_string_lossy().starts_with("Rtmp")
                && e.metadata().is_ok_and(|m| m.uid() == zygote_uid && m.modified().is_ok_and(|t| t >= began))
        })
        .map(|e| e.path())
        .collect();
    assert!(litter.is_empty(), "no R temporary folder of the zygote's in {}: {litter:?}", system.display());
    signal(daemon, 15);
    wait_until(slow(Duration::from_secs(20)), "the daemon and its zygote to end", || {
        (!pid_alive(daemon) && !pid_alive(zygote)).then_some(())
    });
    assert!(!std::path::Path::new(&tmp).exists(), "the zygote's temporary folder went with the daemon: {tmp}");
}

#[test]
fn an_app_that_sets_tz_starts_cold_and_status_says_why() {
    let env = Env::new("pooltz");
    serve(&env);
    wait_pool_ready(&env);
    let app = &unique("pooltz");
    let port = free_port();
    env.apply(&env.app(app, port, "warm-replicas: 0\nenv:\n  TZ: Europe/Paris\n"));
    running(&env, app);
    assert_eq!(start_of(&env, app, 1), "cold: its env sets TZ, which R reads only when it starts");
    wait_http_ok(port, slow(Duration::from_secs(10)));

    // The same set in the app folder's .Renviron: R would not take its
    // library path from a claim's reading of the file.
    let lib = std::path::PathBuf::from(format!("/var/tmp/{}", unique("poollib")));
    std::fs::create_dir_all(&lib).unwrap();
    let _gone = Removed(lib.clone());
    let app = &unique("poolrenviron");
    let port = free_port();
    let manifest = env.app_running(
        "library(shiny)\nshinyApp(fluidPage(tags$p(paste0('libs=', paste(.libPaths(), collapse = ','), ';'))), function(input, output) {})\n",
        app,
        port,
        "warm-replicas: 0\n",
    );
    std::fs::write(manifest.with_file_name(".Renviron"), format!("# the app's own library\nR_LIBS_USER={}\n", lib.display())).unwrap();
    env.apply(&manifest);
    running(&env, app);
    assert_eq!(start_of(&env, app, 1), "cold: its .Renviron sets R_LIBS_USER, which R reads only when it starts");
    let page = wait_http_ok(port, slow(Duration::from_secs(10))).body;
    let libs = between(&page, "libs=", ";").unwrap_or_default();
    assert!(libs.split(',').any(|l| l == lib.to_str().unwrap()), "R took the library path: {page}");
}

/// Removes a folder on drop.
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_daemons_environment_switches_the_pool_off() {
    let env = Env::new("pooloff");
    let mut cmd = Command::new(bin());
    cmd.arg("serve").env("SHINYCTL_POOL", "off");
    env.start_daemon(cmd);
    let v: Value = env.status();
    assert_eq!(v["pool"]["on"], false, "{v}");
    assert_eq!(v["pool"]["off"], "the pool is off (SHINYCTL_POOL=off)", "{v}");
    assert_eq!(v["pool"]["zygotes"].as_array().map(Vec::len), Some(0), "no zygote runs: {v}");
    let app = &unique("pooloff");
    let port = free_port();
    env.apply(&env.app(app, port, "warm-replicas: 0\n"));
    running(&env, app);
    assert_eq!(start_of(&env, app, 1), "cold: the pool is off (SHINYCTL_POOL=off)");
    wait_http_ok(port, slow(Duration::from_secs(10)));
}

#[test]
fn a_copy_whose_launcher_is_killed_outright_leaves_no_process_claimed_or_cold() {
    // The daemon's memory and disk watch SIGKILL a copy's launcher and its
    // group; so may an operator. The copy's init and R must go with it,
    // though the init took the app's own (subordinate) uid, which clears a
    // parent-death signal: a daemon that is not root.
    let user = TestUser::create(None);
    let env = Env::new("poolkill");
    let claimed = env.app("claimedkill", free_port(), "warm-replicas: 0\nidle-timeout: 0\n");
    let cold = env.app("coldkill", free_port(), "warm-replicas: 0\nidle-timeout: 0\npool: false\n");
    env.start_daemon_as(&user);
    wait_pool_ready(&env);
    env.apply(&claimed);
    env.apply(&cold);
    for (app, how) in [("claimedkill", "claimed from the pool"), ("coldkill", "cold")] {
        let (r, launcher) = running(&env, app);
        assert!(start_of(&env, app, 1).starts_with(how), "{app}: {}", start_of(&env, app, 1));
        let init = parent(r);
        assert!(init != launcher && init > 1, "{app}: R's parent is the copy's init, not its launcher");
        signal_group(launcher, libc::SIGKILL);
        for (pid, what) in [(launcher, "the launcher"), (init, "the copy's init"), (r, "R")] {
            wait_gone(pid, Duration::from_secs(15), &format!("{app}: {what} to go"));
        }
    }
}

#[test]
fn a_claimed_copy_still_starting_outlives_a_restart_of_the_daemon() {
    // An upgrade (`shinyctl shutdown`, then `shinyctl serve`) while a copy
    // claimed from the pool is still starting: once R listens, the copy's
    // init tells the daemon that was, whose end of the pipe is closed. The
    // init, a fork of the zygote's R, must not take the SIGPIPE as R
    // would ("ignoring SIGPIPE signal"), which ended the copy.
    let env = Env::new("poolupgrade");
    let app = unique("slowclaim");
    let manifest = env.app_running(
        "Sys.sleep(4)\nlibrary(shiny)\nshinyApp(fluidPage('slow'), function(input, output) {})\n",
        &app,
        free_port(),
        "warm-replicas: 0\nidle-timeout: 0\n",
    );
    let daemon = serve(&env);
    wait_pool_ready(&env);
    env.apply(&manifest);
    let r = wait_until(slow(Duration::from_secs(30)), "the claimed copy's R", || env.copies(&app).first().and_then(|c| c.pid));
    assert!(start_of(&env, &app, 1).starts_with("claimed from the pool"), "{}", start_of(&env, &app, 1));
    env.ok(&["shutdown"]);
    wait_gone(daemon, Duration::from_secs(15), "the daemon to stop");
    // R's Sys.sleep ends and it listens while no daemon runs.
    wait_until(slow(Duration::from_secs(30)), "R to listen with no daemon running", || {
        std::fs::read_to_string(env.home().join(format!("logs/default-{app}.log"))).ok()?.contains("Listening on").then_some(())
    });
    serve(&env);
    env.wait_roles(&app, "1:active", slow(Duration::from_secs(30)));
    assert_eq!(env.pid_of(&app, 1), r, "the same R, adopted");
    let log = std::fs::read_to_string(env.home().join(format!("logs/default-{app}.log"))).unwrap();
    assert!(!log.contains("SIGPIPE") && !log.contains("ended at"), "{log}");
}

/// The children of `pid`, of any of its threads (the zygote is R, with
/// threads of its own).
fn children(pid: u32) -> Vec<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    tasks
        .iter()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// The real uid of process `pid`.
fn uid_of(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

/// The launcher of a copy of `app`: the child of the `daemon` whose
/// command line names it (a cold copy's init, a child of the launcher, has
/// the same command line).
fn launcher_of(daemon: u32, app: &str) -> Option<u32> {
    let app_arg = format!("\"app\":\"{app}\"");
    children(daemon).into_iter().find(|&p| {
        let c = cmdline(p);
        c.contains(" launch ") && c.contains(&app_arg)
    })
}

/// A copy's init caught while it makes the copy's world: a child of one of
/// `parents()` (the zygote's forks; a cold copy's launcher) that has taken
/// the app's own uid (which clears its parent-death signal) and has not
/// forked R yet. It is held there ([`hold`]), and returned with its
/// parent; `Err(init)` when R was forked before it could be (the init goes
/// on).
fn init_stopped_in_world(parents: &dyn Fn() -> Vec<u32>, daemon_uid: u32) -> Result<(u32, u32), u32> {
    let deadline = std::time::Instant::now() + slow(Duration::from_secs(60));
    while std::time::Instant::now() < deadline {
        for parent in parents() {
            for init in children(parent) {
                if uid_of(init).is_none_or(|u| u == daemon_uid) {
                    continue;
                }
                if !children(init).is_empty() {
                    return Err(init);
                }
                let held = hold(init);
                if held && children(init).is_empty() {
                    return Ok((parent, init));
                }
                if held {
                    release(init);
                }
                return Err(init);
            }
        }
    }
    panic!("no copy's init was seen making its world");
}

/// Holds process `pid` where it is: ptrace's interrupt, not SIGSTOP, whose
/// stop would have the kernel send SIGHUP to the process once its group is
/// orphaned (its leader, the launcher or the fork, killed), which would end
/// R by accident. Called from the test's own thread, as [`release`] is.
fn hold(pid: u32) -> bool {
    let pid = pid as libc::pid_t;
    let mut status = 0;
    // SAFETY: ptrace and waitpid on a process of this test's; the results are checked.
    unsafe {
        libc::ptrace(libc::PTRACE_SEIZE, pid, 0, 0) == 0
            && libc::ptrace(libc::PTRACE_INTERRUPT, pid, 0, 0) == 0
            && libc::waitpid(pid, &mut status, libc::__WALL) == pid
    }
}

/// Lets a process [`hold`] held go on (and reaps its end, when it ended
/// held: the test, its tracer, is told first).
fn release(pid: u32) {
    let pid = pid as libc::pid_t;
    let mut status = 0;
    // SAFETY: ptrace and waitpid on a process this thread traces.
    unsafe {
        libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
        libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG);
    }
}

/// Duplicates into the test the launcher's descriptors of the pipe its
/// copy writes its log into (the init's standard error), so the pipe
/// outlives the launcher: without a reader R would end at its first line
/// (SIGPIPE), by accident, where another R (one that writes nothing, or
/// whose output is held by a process of its own) runs on.
fn hold_log_pipe(launcher: u32, init: u32) -> Vec<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let pipe = std::fs::read_link(format!("/proc/{init}/fd/2")).expect("the init's standard error");
    // SAFETY: pidfd_open of a live process of this test's; the result is checked.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, launcher as libc::c_long, 0 as libc::c_long) } as i32;
    assert!(pidfd >= 0, "pidfd_open of the launcher: {}", std::io::Error::last_os_error());
    // SAFETY: a descriptor pidfd_open just gave us.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
    let fds: Vec<i32> = std::fs::read_dir(format!("/proc/{launcher}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == pipe))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let held: Vec<_> = fds
        .iter()
        .filter_map(|&fd| {
            use std::os::fd::AsRawFd;
            // SAFETY: pidfd_getfd with a pidfd we hold; the result is checked.
            let got =
                unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd() as libc::c_long, fd as libc::c_long, 0 as libc::c_long) }
                    as i32;
            // SAFETY: a descriptor pidfd_getfd just gave us.
            (got >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(got) })
        })
        .collect();
    assert!(held.len() >= 2, "the launcher holds both ends of its copy's log pipe {pipe:?}: {fds:?}");
    held
}

/// Kills `app`'s launcher (`kill`) while its init, a child of one of
/// `parents()`, makes the copy's world, and checks the init ends rather
/// than start R. The init is held ([`hold`]) in that window, between the
/// change of uid that clears its parent-death signal and the signal set
/// again, so the kill lands there every time; a start whose init is not
/// caught in time is killed (outside the window, which the parent-death
/// signal covers) and starts again.
fn launcher_killed_while_the_world_is_made(
    env: &Env,
    app: &str,
    (daemon, daemon_uid): (u32, u32),
    parents: &dyn Fn() -> Vec<u32>,
    kill: fn(u32),
) {
    let (parent, init, launcher) = (0..5)
        .find_map(|_| {
            let caught = init_stopped_in_world(parents, daemon_uid);
            let launcher = wait_until(slow(Duration::from_secs(10)), "the copy's launcher", || launcher_of(daemon, app));
            match caught {
                Ok((parent, init)) => Some((parent, init, launcher)),
                Err(init) => {
                    signal_group(launcher, libc::SIGKILL);
                    wait_gone(launcher, Duration::from_secs(15), &format!("{app}: the launcher of a start not caught to go"));
                    wait_gone(init, Duration::from_secs(15), &format!("{app}: the init of a start not caught to go"));
                    None
                }
            }
        })
        .unwrap_or_else(|| panic!("{app}: no init caught making its world in 5 starts"));
    // Ended with the test, whatever happens.
    env.track(init);
    let _log = hold_log_pipe(launcher, init);
    kill(launcher);
    wait_gone(launcher, Duration::from_secs(15), &format!("{app}: the launcher to go"));
    // A claimed copy's fork goes once its launcher has.
    wait_gone(parent, Duration::from_secs(15), &format!("{app}: the init's parent to go"));
    release(init);
    wait_gone(init, Duration::from_secs(15), &format!("{app}: the copy's init to end, its launcher gone, rather than start R"));
}

#[test]
fn a_copy_whose_launcher_is_killed_while_its_init_makes_the_world_leaves_no_process() {
    // The disk watch of a daemon that is not root stops a copy past its
    // disk size at its first look, 0 to 2 s after its start (the files are
    // still there when it starts again): SIGKILL to the launcher's group,
    // which may come while a claimed copy's init makes its world, after
    // the app's own uid has cleared its parent-death signal and before it
    // is set again. The fork then goes, and no signal reaches the init.
    // A cold copy's init is in its launcher's group, but not when the
    // launcher alone is killed.
    let user = TestUser::create(None);
    assert!(!user.subordinate_ids().is_empty(), "the daemon's user has subordinate ids");
    let env = Env::new("poolwindow");
    let claimed = env.app("claimedwindow", free_port(), "warm-replicas: 0\nidle-timeout: 0\n");
    let cold = env.app("coldwindow", free_port(), "warm-replicas: 0\nidle-timeout: 0\npool: false\n");
    let daemon = (env.start_daemon_as(&user), user.id("-u"));
    let zygote = wait_pool_ready(&env);
    env.apply(&claimed);
    let forks = move || children(zygote);
    launcher_killed_while_the_world_is_made(&env, "claimedwindow", daemon, &forks, |l| signal_group(l, libc::SIGKILL));
    env.ok(&["stop", "claimedwindow"]);
    env.apply(&cold);
    let launchers = move || launcher_of(daemon.0, "coldwindow").into_iter().collect();
    launcher_killed_while_the_world_is_made(&env, "coldwindow", daemon, &launchers, |l| signal(l, libc::SIGKILL));
}
