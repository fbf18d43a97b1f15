//! Users the fence tests run as: made with `useradd`, removed on drop.

use super::*;

/// A user of the machine for one test (the suite runs as root), removed
/// with `userdel -f` when dropped (a process of theirs that has not quite
/// ended must not leave the user behind). The suite's one test-user type.
pub struct TestUser {
    /// Its name, unique to this test process and call.
    pub name: String,
}

impl TestUser {
    /// Makes one with `useradd` (no home folder made); `home`: the home
    /// folder it is given, if any.
    pub fn create(home: Option<&Path>) -> TestUser {
        // One per call: two tests of this binary may make one at once.
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("shy{}x{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst));
        let mut cmd = Command::new("useradd");
        cmd.arg("--no-create-home").args(["--shell", "/bin/sh"]);
        if let Some(home) = home {
            cmd.arg("--home-dir").arg(home);
        }
        let out = cmd.arg(&name).output().expect("useradd (the suite runs as root)");
        assert!(out.status.success(), "useradd: {}", String::from_utf8_lossy(&out.stderr));
        TestUser { name }
    }

    /// Its uid (`-u`) or gid (`-g`).
    pub fn id(&self, flag: &str) -> u32 {
        let out = Command::new("id").args([flag, &self.name]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }

    /// Its subordinate uid ranges (`/etc/subuid`, the same in `/etc/subgid`):
    /// those useradd gave it, or, where it gave none, one added with
    /// usermod, far from others'.
    pub fn subordinate_ids(&self) -> Vec<(u32, u32)> {
        let ranges = || -> Vec<(u32, u32)> {
            let text = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
            text.lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(':').collect();
                    let (first, count): (u32, u32) = (f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?);
                    (f[0] == self.name).then(|| (first, first + count - 1))
                })
                .collect()
        };
        if ranges().is_empty() {
            // usermod refuses the flags when the files are missing (a
            // container image may lack what Debian's login package makes).
            for file in ["/etc/subuid", "/etc/subgid"] {
                if !Path::new(file).exists() {
                    std::fs::write(file, "").unwrap();
                }
            }
            let first = 1_500_000_000 + (std::process::id() % 1000) * 70_000;
            let range = format!("{first}-{}", first + 65_535);
            let out = Command::new("usermod").args(["--add-subuids", &range, "--add-subgids", &range, &self.name]).output().unwrap();
            assert!(out.status.success(), "usermod: {}", String::from_utf8_lossy(&out.stderr));
        }
        ranges()
    }

    /// Takes away the subordinate ids useradd gave it, so its daemon's
    /// copies run as itself (README, "Identities").
    pub fn without_subordinate_ids(&self) {
        for (file, flag) in [("/etc/subuid", "--del-subuids"), ("/etc/subgid", "--del-subgids")] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            for l in text.lines().filter(|l| l.split(':').next() == Some(self.name.as_str())) {
                let f: Vec<u64> = l.split(':').skip(1).filter_map(|n| n.parse().ok()).collect();
                let range = format!("{}-{}", f[0], f[0] + f[1] - 1);
                let out = Command::new("usermod").args([flag, &range, &self.name]).output().unwrap();
                assert!(out.status.success(), "usermod: {}", String::from_utf8_lossy(&out.stderr));
            }
        }
    }

    /// Runs the binary under test as this user, with `home` as SHINYCTL_HOME.
    pub fn run(&self, home: &Path, args: &[&str]) -> Output {
        Command::new("setpriv")
            .args(["--reuid", &self.name, "--regid", &self.name, "--clear-groups", "--"])
            .arg(bin())
            .args(args)
            .env("SHINYCTL_HOME", home)
            .output()
            .expect("setpriv")
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // Its daemons' pool folders: its homes are the test's own, so
        // they are found by their owner.
        use std::os::unix::fs::MetadataExt;
        let uid = self.id("-u");
        remove_pool_folders(|e| e.metadata().is_ok_and(|m| m.uid() == uid));
        let _ = Command::new("userdel").args(["-f", &self.name]).output();
    }
}
