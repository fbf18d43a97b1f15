//! A copy's disk of its own with a size (`sandbox.disk`), tried from inside
//! a real R app: each page runs one shell line the query names (`dd` into
//! scratch, /tmp or /dev/shm, `df` of the three) and shows its output and
//! status. Under a root daemon the kernel keeps the size (ENOSPC, a
//! filesystem of the copy's own); under a daemon that is not root the
//! daemon stops the copy past it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::helpers::*;

/// The app: `/?run=WHAT` runs one of a few fixed shell lines and shows
/// `status=N;` and the output.
const DISK_R: &str = r#"
library(shiny)
scratch <- Sys.getenv("SHINYCTL_SCRATCH")
lines <- c(
  df = "df -B1 --output=size,target \"$SHINYCTL_SCRATCH\" /tmp /dev/shm | tail -n 3",
  scratch40 = "dd if=/dev/zero of=\"$SHINYCTL_SCRATCH/big\" bs=1M count=40 conv=fsync 2>&1",
  hidden40 = "mkdir -m 0700 \"$SHINYCTL_SCRATCH/hidden\" && dd if=/dev/zero of=\"$SHINYCTL_SCRATCH/hidden/big\" bs=1M count=40 conv=fsync 2>&1",
  tmp40 = "dd if=/dev/zero of=/tmp/big bs=1M count=40 conv=fsync 2>&1",
  shm40 = "rm -f /tmp/big; dd if=/dev/zero of=/dev/shm/big bs=1M count=40 conv=fsync 2>&1",
  ls = "ls -A \"$SHINYCTL_SCRATCH\" /tmp /dev/shm",
  # Written, deleted and held open by a process left running: no path reaches it.
  unlinked40 = "(exec 3>/tmp/gone; dd if=/dev/zero bs=1M count=40 conv=fsync >&3 2>/dev/null; rm -f /tmp/gone; exec sleep 600) >/dev/null 2>&1 &",
  # 300 MB in a memfd, written 10 MB at a time, never mapped: in no resident set.
  memfd300 = "/usr/bin/python3 -c 'import os, time\nf = os.memfd_create(\"m\")\nfor _ in range(30): os.write(f, bytes(10 << 20))\ntime.sleep(600)' >/dev/null 2>&1 &"
)
ui <- function(req) {
  what <- parseQueryString(req$QUERY_STRING)$run
  if (is.null(what) || !(what %in% names(lines))) return(tags$pre("status=none;"))
  out <- suppressWarnings(system2("sh", c("-c", shQuote(lines[[what]])), stdout = TRUE, stderr = TRUE))
  status <- attr(out, "status")
  tags$pre(paste0("status=", if (is.null(status)) 0 else status, ";\n", paste(out, collapse = "\n")))
}
shinyApp(ui, function(input, output) {})
"#;

/// The page of `/?run=what`: (status, output).
fn run(port: u16, what: &str) -> (i32, String) {
    let page = wait_until(Duration::from_secs(30), "a page from the copy", || {
        get(port, &format!("/?run={what}"), &[]).ok().filter(|r| r.status == 200)
    })
    .body;
    let body = between(&page, "<pre>", "</pre>").unwrap_or_else(|| panic!("the page: {page}")).to_string();
    let (first, rest) = body.split_once(";").unwrap_or((&body, ""));
    let status = first.trim().strip_prefix("status=").and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("a status in {body}"));
    (status, rest.trim().to_string())
}

/// Mount points at or below `dir` in this process's mount namespace.
fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    shinyctl::sys::disk::mounts_below(dir)
}

/// Loop devices whose backing file is below `dir`.
fn loops_below(dir: &Path) -> Vec<String> {
    let Ok(list) = std::fs::read_dir("/sys/block") else { return Vec::new() };
    list.filter_map(|e| e.ok())
        .filter(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).is_ok_and(|b| Path::new(b.trim()).starts_with(dir)))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Copy `copy` of `app` in `status --json`.
fn copy_json(env: &Env, app: &str, copy: u32) -> serde_json::Value {
    let v = env.status();
    let a = v["apps"].as_array().unwrap().iter().find(|a| a["name"] == app).cloned().expect("the app in status");
    a["copies"].as_array().unwrap().iter().find(|c| c["copy"] == copy).cloned().expect("the copy")
}

/// The daemon's metrics scrape.
fn metrics(env: &Env) -> String {
    let api = env.home().join("api.sock");
    let (_, body) = shinyctl::wire::uds::request_blocking(&api, hyper::Method::GET, "/v1/metrics", None, Duration::from_secs(10))
        .expect("api.sock answers");
    String::from_utf8_lossy(&body).into_owned()
}

/// The app's copy 1's scratch folder on the host.
fn scratch(env: &Env, app: &str, copy: u32) -> PathBuf {
    env.home().join("scratch").join(format!("default-{app}")).join(copy.to_string())
}

#[test]
fn a_root_daemon_gives_a_copy_a_disk_of_its_size_emptied_by_a_redeploy_and_gone_with_delete() {
    if !needs_root("loop devices and mounts") {
        return;
    }
    let env = Env::new("diskroot");
    let app = unique("diskroot");
    let port = free_port();
    let extra = "warm-replicas: 0\nidle-timeout: 0\nsandbox:\n  disk: 64M\n";
    let manifest = env.app_running(DISK_R, &app, port, extra);
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    // The copy sees a filesystem of 64M at its scratch, /tmp and /dev/shm,
    // not the host's.
    let (status, df) = run(port, "df");
    assert_eq!(status, 0, "{df}");
    let host = nix::sys::statvfs::statvfs(&env.home()).unwrap();
    let host_size = host.blocks() * host.fragment_size();
    let sizes: Vec<u64> = df.lines().filter_map(|l| l.split_whitespace().next()?.parse().ok()).collect();
    assert_eq!(sizes.len(), 3, "{df}");
    for s in &sizes {
        assert!(*s <= 64 << 20 && *s > 32 << 20 && *s != host_size, "a disk of 64M, not the host's {host_size}: {df}");
    }
    // Its size shows in status --json and the metrics.
    let c = copy_json(&env, &app, 1);
    assert_eq!((c["disk_bytes"].as_u64(), c["disk_own_filesystem"].as_bool()), (Some(64 << 20), Some(true)), "{c}");
    let series = format!("shinyctl_copy_disk_size_bytes{{app=\"{app}\",copy=\"1\"}} 67108864");
    assert!(metrics(&env).contains(&series), "{series}");
    // Writing past the size gets ENOSPC, scratch, /tmp and /dev/shm together.
    let (status, out) = run(port, "scratch40");
    assert_eq!(status, 0, "40M fit in scratch: {out}");
    let (status, out) = run(port, "tmp40");
    assert_ne!(status, 0, "40M more in /tmp must not fit: {out}");
    assert!(out.contains("No space left on device"), "{out}");
    let (status, out) = run(port, "shm40");
    assert!(status != 0 && out.contains("No space left on device"), "nor in /dev/shm: {out}");
    // The host reads the copy's scratch folder where it always was.
    let disk = scratch(&env, &app, 1);
    assert_eq!(std::fs::metadata(disk.join("big")).unwrap().len(), 40 << 20);
    assert!(shinyctl::sys::disk::is_mount_point(&disk));
    assert_eq!(loops_below(&env.home()).len(), 1, "one loop device");
    // A redeploy leaves the new copy's disk empty.
    std::fs::write(&manifest, format!("app-name: {app}\nport: {port}\n{extra}env:\n  REDEPLOYED: \"1\"\n")).unwrap();
    let before = env.pid_of(&app, 1);
    env.apply(&manifest);
    wait_until(Duration::from_secs(60), "a new copy", || {
        env.copies(&app).iter().any(|c| c.role == "active" && c.pid.is_some_and(|p| p != before)).then_some(())
    });
    let (status, listed) = run(port, "ls");
    assert_eq!(status, 0, "{listed}");
    assert!(!listed.contains("big"), "a redeployed copy's disk is empty: {listed}");
    wait_until(Duration::from_secs(20), "the old disk's loop device to go", || (loops_below(&env.home()).len() == 1).then_some(()));
    // Delete leaves no mount and no loop device.
    env.ok(&["delete", &app, "--now"]);
    wait_until(Duration::from_secs(30), "no mount and no loop device left", || {
        (mounts_below(&env.home()).is_empty() && loops_below(&env.home()).is_empty()).then_some(())
    });
}

/// Starts app `name` (DISK_R, one copy, a 64M disk, `idle` as its
/// idle-timeout) and fills 40M of its disk: its name, port and manifest.
fn started_with_40m_written(env: &Env, name: &str, idle: &str) -> (String, u16, PathBuf) {
    let app = unique(name);
    let port = free_port();
    let manifest = env.app_running(DISK_R, &app, port, &format!("warm-replicas: 0\nidle-timeout: {idle}\nsandbox:\n  disk: 64M\n"));
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    assert_eq!(run(port, "scratch40").0, 0);
    (app, port, manifest)
}

#[test]
fn a_root_daemon_keeps_a_copy_s_disk_through_a_sleep() {
    if !needs_root("loop devices and mounts") {
        return;
    }
    let env = Env::new("disksleep");
    let (app, port, _) = started_with_40m_written(&env, "disksleep", "20s");
    let before = env.pid_of(&app, 1);
    env.wait_asleep(&app, Duration::from_secs(60));
    wait_gone(before, Duration::from_secs(20), "the copy to be stopped");
    let (status, listed) = run(port, "ls");
    assert_eq!(status, 0, "{listed}");
    assert!(listed.contains("big"), "woken with its own disk: {listed}");
    // Still 64M: the file kept counts.
    assert_ne!(run(port, "tmp40").0, 0, "the size still holds");
}

#[test]
fn a_daemon_that_is_not_root_stops_a_copy_past_its_disk_size_and_says_why() {
    // Made first, so it goes last: after the test's processes have ended.
    let user = TestUser::create(None);
    let env = Env::new("diskuser");
    let app = unique("diskuser");
    let port = free_port();
    let manifest = env.app_running(DISK_R, &app, port, "warm-replicas: 0\nidle-timeout: 0\nsandbox:\n  disk: 20M\n");
    env.start_daemon_as(&user);
    env.apply(&manifest);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    let first = env.pid_of(&app, 1);
    // Under its size it keeps running; no filesystem of its own.
    assert!(!shinyctl::sys::disk::is_mount_point(&scratch(&env, &app, 1)));
    let c = copy_json(&env, &app, 1);
    assert_eq!((c["disk_bytes"].as_u64(), c["disk_own_filesystem"].as_bool()), (Some(20 << 20), Some(false)), "{c}");
    holds_for(Duration::from_secs(5), "the copy to keep running under its size", || pid_alive(first));
    // Past it: stopped, with the line under status and in its log. Written
    // in a folder of mode 0700, which the copy's own (subordinate) uid makes
    // and its daemon's user cannot walk: the watch counts it all the same.
    let _ = get(port, "/?run=hidden40", &[]);
    wait_gone(first, Duration::from_secs(30), "the copy past its disk size to be stopped");
    let text = wait_until(Duration::from_secs(30), "the status line about the disk", || {
        let text = env.ok(&["status", &app]);
        text.contains(&format!("{app}: copy 1 was stopped: its disk (scratch, /tmp, /dev/shm) held ")).then_some(text)
    });
    assert!(text.contains("of its 20M (sandbox.disk)"), "{text}");
    let state = env.record(&app, 1).unwrap();
    assert_eq!(state["last_exit"]["disk"]["limit"], 20u64 << 20, "state.json records why: {state}");
    let log = std::fs::read_to_string(env.home().join("logs").join(format!("default-{app}.log"))).unwrap_or_default();
    assert!(log.contains("(over its disk size)"), "the copy's log says why: {log}");
    // It starts again on the same disk, still past its size: held to it all
    // the same (stopped again), not let off for what it wrote before.
    let second = wait_until(Duration::from_secs(60), "the copy to start again", || {
        env.copies(&app).iter().find(|c| c.copy == 1).and_then(|c| c.pid).filter(|&p| p != first)
    });
    wait_gone(second, Duration::from_secs(30), "the copy started on its full disk to be stopped again");
    // Its end is folded in at the daemon's next cycle, moments after.
    wait_until(Duration::from_secs(15), "the second stop counted as a crash", || {
        (env.record(&app, 1)?["crashes"].as_u64().unwrap_or(0) >= 2).then_some(())
    });
}

#[test]
fn a_daemon_that_is_not_root_counts_what_a_copy_deleted_but_holds_and_its_memfds() {
    // Without a filesystem or a cgroup of the copy's own the watches keep
    // the limits; a file deleted while held open, and a memfd, are in no
    // folder's walk and no process's resident memory. A daemon without
    // subordinate ids (nobody): its copies run as its own user, whose
    // descriptors it may read. (With subordinate ids it may not: README,
    // "Limits".)
    let env = Env::new("diskheld");
    let (disk_app, mem_app) = (unique("diskheld"), unique("memfdheld"));
    let (disk_port, mem_port) = (free_port(), free_port());
    let disk = env.app_running(DISK_R, &disk_app, disk_port, "warm-replicas: 0\nidle-timeout: 0\nsandbox:\n  disk: 20M\n");
    let mem = env.app_running(DISK_R, &mem_app, mem_port, "warm-replicas: 0\nidle-timeout: 0\nsandbox:\n  memory: 400M\n");
    assert!(Command::new("chown").args(["-R", "65534:65534"]).arg(&env.dir).status().unwrap().success());
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", bin(), "serve"]);
    env.start_daemon(cmd);
    env.apply(&disk);
    env.apply(&mem);
    for (app, port, what, why) in
        [(&disk_app, disk_port, "unlinked40", "(over its disk size)"), (&mem_app, mem_port, "memfd300", "(over its memory limit)")]
    {
        env.wait_roles(app, "1:active", Duration::from_secs(60));
        let first = env.pid_of(app, 1);
        let (status, out) = run(port, what);
        assert_eq!(status, 0, "{what}: {out}");
        wait_gone(first, Duration::from_secs(30), &format!("{app}: the copy past its limit through {what} to be stopped"));
        let log = wait_until(Duration::from_secs(10), "the copy's log to say why", || {
            let log = std::fs::read_to_string(env.home().join("logs").join(format!("default-{app}.log"))).ok()?;
            log.contains(why).then_some(log)
        });
        assert!(log.contains(why), "{log}");
    }
}

/// The cgroup folders of shinyctl's that a process is in (v1: one a
/// controller hierarchy; v2: one).
fn shinyctl_cgroups(pid: u32) -> Vec<PathBuf> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    own.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            path.contains("/shinyctl-").then(|| {
                let root = Path::new("/sys/fs/cgroup");
                let root = if controllers.is_empty() { root.to_path_buf() } else { root.join(controllers) };
                root.join(path.trim_start_matches('/'))
            })
        })
        .collect()
}

#[test]
fn after_shutdown_all_nothing_is_left_mounted_and_the_next_daemon_mounts_the_same_disk() {
    if !needs_root("loop devices and mounts") {
        return;
    }
    let env = Env::new("diskdown");
    let (app, port, _) = started_with_40m_written(&env, "diskdown", "0");
    let r = env.pid_of(&app, 1);
    let cgroups = shinyctl_cgroups(r);
    env.ok(&["shutdown", "--all"]);
    wait_gone(r, Duration::from_secs(20), "the copy to be stopped");
    // No mount, loop device or cgroup of the copy's is left in the kernel
    // (the home can be removed); its disk stays in its image.
    wait_until(Duration::from_secs(30), "no mount, loop device or cgroup left", || {
        (mounts_below(&env.home()).is_empty() && loops_below(&env.home()).is_empty() && cgroups.iter().all(|d| !d.exists())).then_some(())
    });
    let disk = scratch(&env, &app, 1);
    assert!(shinyctl::sys::disk::image_path(&disk).is_file(), "the disk's image is kept");
    // The next daemon starts the copy on the same disk, mounted again.
    env.ok(&["serve", "-d"]);
    env.wait_roles(&app, "1:active", Duration::from_secs(60));
    let (status, listed) = run(port, "ls");
    assert_eq!(status, 0, "{listed}");
    assert!(listed.contains("big"), "the file written before the shutdown is on the disk: {listed}");
    assert!(shinyctl::sys::disk::is_mount_point(&disk));
    assert_ne!(run(port, "tmp40").0, 0, "its size still holds");
}

/// The app's own uid, as status --json gives it.
fn uid_of_app(env: &Env, app: &str) -> Option<u64> {
    let v = env.status();
    v["apps"].as_array()?.iter().find(|a| a["name"] == app)?["uid"].as_u64()
}

#[test]
fn a_renamed_app_takes_its_disks_logs_and_id_and_a_new_app_of_the_old_name_starts_empty() {
    if !needs_root("loop devices and mounts") {
        return;
    }
    let env = Env::new("diskrename");
    let (old, port, manifest) = started_with_40m_written(&env, "rena", "0");
    let new = unique("renb");
    let extra = "warm-replicas: 0\nidle-timeout: 0\nsandbox:\n  disk: 64M\n";
    let uid = uid_of_app(&env, &old).expect("a root daemon gives the app a uid of its own");
    let first = env.pid_of(&old, 1);

    // The same manifest file with another app-name: the app is renamed.
    std::fs::write(&manifest, format!("app-name: {new}\nport: {port}\n{extra}")).unwrap();
    let out = env.ok(&["apply", "-f", manifest.to_str().unwrap(), "--now"]);
    assert!(out.contains(&format!("renamed from default/{old}")), "{out}");
    env.wait_roles(&new, "2:active", Duration::from_secs(60));
    wait_gone(first, Duration::from_secs(30), "the copy of the old name to stop");
    assert_eq!(uid_of_app(&env, &new), Some(uid), "the renamed app keeps its uid");
    let (old_scratch, new_scratch) = (env.home().join(format!("scratch/default-{old}")), env.home().join(format!("scratch/default-{new}")));
    wait_until(Duration::from_secs(30), "nothing left under the old name's disks", || {
        (!old_scratch.exists() && mounts_below(&old_scratch).is_empty()).then_some(())
    });
    // The old copy's disk, moved with the app, goes once the copy is forgotten.
    wait_until(Duration::from_secs(30), "the new copy's disk alone", || (mounts_below(&new_scratch).len() == 3).then_some(()));
    assert!(!new_scratch.join("1").exists(), "{:?}", mounts_below(&env.home()));
    let logs = env.home().join("logs");
    assert!(!logs.join(format!("default-{old}.log")).exists(), "copy 1's log went with the app");
    assert!(!env.home().join(format!("releases/default/{old}")).exists(), "so did its releases");
    let moved = std::fs::read_to_string(logs.join(format!("default-{new}.log"))).unwrap_or_default();
    assert!(moved.contains(&format!("copy 1 of {old} (revision 1) starting")), "{moved}");

    // A new app of the old name: a uid of its own and an empty disk.
    let again = free_port();
    let other = env.dir.join("again");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("app.R"), DISK_R).unwrap();
    std::fs::write(other.join("app.yaml"), format!("app-name: {old}\nport: {again}\n{extra}")).unwrap();
    env.apply(&other.join("app.yaml"));
    env.wait_roles(&old, "1:active", Duration::from_secs(60));
    let (status, listed) = run(again, "ls");
    assert_eq!(status, 0, "{listed}");
    assert!(!listed.contains("big"), "the new app's disk is its own: {listed}");
    let new_uid = uid_of_app(&env, &old).expect("a uid");
    assert_ne!(new_uid, uid, "two apps never share a uid");
    // The renamed app's releases are its own still: the one from before the
    // rename is there to roll back to.
    let releases = env.ok(&["releases", &new]);
    assert_eq!(releases.lines().count(), 3, "a header and two releases: {releases}");
    let out = env.ok(&["rollback", &new, "--wait=60s"]);
    assert!(out.contains("serves"), "{out}");

    env.ok(&["delete", &old, "--now"]);
    env.ok(&["delete", &new, "--now"]);
    wait_until(Duration::from_secs(30), "no mount and no loop device left", || {
        (mounts_below(&env.home()).is_empty() && loops_below(&env.home()).is_empty()).then_some(())
    });
}
