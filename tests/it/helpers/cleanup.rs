//! What an `Env` ends when it drops: its processes by PID, then what a
//! daemon of its home left (pool folders, R's temporary folders, cgroups);
//! and the watchdog that ends a test running past `TEST_LIMIT`.

use super::*;

/// Starts the thread that ends a test running past `TEST_LIMIT`: it kills
/// the processes of the test's home and aborts the test binary with the
/// test's name (a hung test would otherwise hold the suite forever).
pub(super) fn watchdog(home: PathBuf) -> std::sync::mpsc::Sender<()> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(slow(TEST_LIMIT)) {
            // Straight to stderr: eprintln! would be captured with the test's output and lost in the abort.
            let _ = writeln!(std::io::stderr(), "\n{test} ran past its limit of {TEST_LIMIT:?}: ending its processes and the test run");
            // The daemon first, so it starts nothing while the rest end.
            let mut pids = pids_with_home(&home);
            pids.sort_by_key(|&p| !cmdline(p).ends_with(" serve"));
            for pid in pids {
                signal_group(pid, 9);
                signal(pid, 9);
            }
            if let Some(dir) = home.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
            std::process::abort();
        }
    });
    tx
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = self.status_quiet();
        self.note_pids();
        // The daemons first, and wait for them: a daemon still running
        // would start a new load balancer when it sees the old one end.
        let daemons: Vec<u32> = self.still_ours().into_iter().filter(|p| self.daemons.borrow().contains(p)).collect();
        for &pid in &daemons {
            signal(pid, 15);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && daemons.iter().any(|&p| pid_alive(p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Copies lead their own process group: end the group.
        for pid in self.still_ours() {
            signal(pid, 15);
            signal_group(pid, 15);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !self.still_ours().is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
        for pid in self.still_ours() {
            signal(pid, 9);
            signal_group(pid, 9);
        }
        // Anything else this test's home started (a load balancer started
        // in the instant its daemon was ended): found by its environment.
        for pid in pids_with_home(&self.home()) {
            signal_group(pid, 9);
            signal(pid, 9);
        }
        // SHINYCTL_KEEP_FAILED=DIR keeps a failed test's logs there.
        if let (true, Some(keep)) = (std::thread::panicking(), std::env::var_os("SHINYCTL_KEEP_FAILED")) {
            let to = Path::new(&keep).join(self.dir.file_name().unwrap_or_default());
            let _ = std::fs::create_dir_all(&to);
            let _ = Command::new("cp").arg("-r").arg(self.home().join("logs")).arg(self.home().join("api.log")).arg(&to).status();
        }
        remove_cgroups(&self.home());
        remove_pool_tmp(&self.home());
        // A root daemon's copies' disks of their own outlive the daemon (as
        // they do a restart): unmounted here, which frees their loop devices.
        shinyctl::sys::disk::detach_below(&self.dir).into_iter().for_each(|t| drop(t.join()));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The tags a daemon of `home` names its cgroups and its pool's folder by
/// (`shinyctl::sys::cgroup::home_tag`): of the home as it sees it, which
/// for a home reached through a symbolic link (the quick start's
/// `~/.shinyctl`) is where the link leads, and of the home as given.
pub(super) fn home_tags(home: &Path) -> Vec<String> {
    let tag = shinyctl::sys::cgroup::home_tag;
    [Some(tag(home)), std::fs::canonicalize(home).ok().map(|h| tag(&h))].into_iter().flatten().collect()
}

/// Removes the pool's zygote's temporary folders (`shinyctl-pool-<tag>-…`
/// in the system's temporary folder) that `ours` picks. A daemon ended by
/// SIGKILL leaves its own (one ended by SIGTERM removes it; a later daemon
/// of the same home would too).
pub(super) fn remove_pool_folders(ours: impl Fn(&std::fs::DirEntry) -> bool) {
    for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("shinyctl-pool-") && ours(&e) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Removes this home's pool's folder ([`remove_pool_folders`]), found by
/// the home's tags.
pub(super) fn remove_pool_tmp(home: &Path) {
    let prefixes: Vec<String> = home_tags(home).iter().map(|t| format!("shinyctl-pool-{t}-")).collect();
    remove_pool_folders(|e| prefixes.iter().any(|p| e.file_name().to_string_lossy().starts_with(p.as_str())));
    remove_old_zygote_r_tmp(home);
}

/// Removes the `Rtmp…` folders in /tmp of this home's zygote's uid (under
/// a root daemon, from the ids file): a zygote of a build from before the
/// pool had a temporary folder of its own (the upgrade tests' previous
/// build) kept R's tempdir() in /tmp, and R ended by a signal leaves it.
pub(super) fn remove_old_zygote_r_tmp(home: &Path) {
    use std::os::unix::fs::MetadataExt;
    let ids: Value = std::fs::read(shinyctl::sys::ids::ids_file()).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    let Some(uid) = ids["apps"][format!("{}:.pool/zygote", home.display())].as_u64() else { return };
    for e in std::fs::read_dir(std::env::temp_dir()).into_iter().flatten().flatten() {
        let r_tmp = e.file_name().to_string_lossy().starts_with("Rtmp");
        if r_tmp && e.metadata().is_ok_and(|m| m.is_dir() && u64::from(m.uid()) == uid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Removes the cgroups a daemon of this home made for its copies
/// (`shinyctl-<tag>` folders, up to five levels below /sys/fs/cgroup, by
/// [`home_tags`]), once the copies are ended: the daemon, ended first,
/// could not. A cgroup is removable once the kernel has let go of its last
/// process, which may take a moment after a SIGKILL: tried for up to 5 s.
pub(super) fn remove_cgroups(home: &Path) {
    let names: Vec<String> = home_tags(home).iter().map(|t| format!("shinyctl-{t}")).collect();
    let mut found = Vec::new();
    let mut level = vec![PathBuf::from("/sys/fs/cgroup")];
    for _ in 0..5 {
        let mut next = Vec::new();
        for dir in &level {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                if names.iter().any(|n| e.file_name().to_string_lossy() == n.as_str()) {
                    found.push(e.path());
                } else {
                    next.push(e.path());
                }
            }
        }
        level = next;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !found.is_empty() && Instant::now() < deadline {
        for dir in &found {
            // A cgroup's files go with it; its children first.
            for child in std::fs::read_dir(dir).into_iter().flatten().flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())) {
                let _ = std::fs::remove_dir(child.path());
            }
            let _ = std::fs::remove_dir(dir);
        }
        found.retain(|d| d.exists());
        if !found.is_empty() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
