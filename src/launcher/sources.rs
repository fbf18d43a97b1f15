//! The folders a copy's root binds from the host (its release, scratch
//! disk, /tmp and /dev/shm folders, writable and needed paths), opened by
//! the init before it takes the run-as user, and bound later through
//! `/proc/self/fd/N`.
//!
//! Why: a root daemon's copies run as their run-as user, and the init takes
//! that user before it builds the root (so what it makes in the new root
//! is theirs, and root stays unmapped in the copy's user namespace). That
//! user cannot walk a path such as `/root/.shinyctl/...` or a home of mode
//! 0700; the init, still host root (the owner of those folders, or holding
//! capabilities over the run-as user's own files), can. An fd opened in
//! the copy's mount namespace names the folder without walking its path
//! again, and the kernel follows `/proc/self/fd/N` to it for its own
//! process whatever the path's modes; a bind from it is a bind within the
//! namespace, as mount requires.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::plan::RootPlan;

/// Open folders and files of the host, by the path the plan names them.
#[derive(Debug, Default)]
pub struct Sources {
    /// Each bind source the plan names, opened with O_PATH (and O_CLOEXEC:
    /// R never holds them).
    opened: Vec<(PathBuf, OwnedFd)>,
}

impl Sources {
    /// Opens every bind source of `plan`. The required ones (the release,
    /// the scratch disk, /tmp and /dev/shm) must open; a writable or needed
    /// path that cannot is left to the mounts, which leave it out with a
    /// line in the log.
    pub fn open(plan: &RootPlan) -> anyhow::Result<Sources> {
        let mut opened = Vec::new();
        for p in [&plan.app_dir, &plan.scratch, &plan.tmp, &plan.shm] {
            let fd = open_path(p).with_context(|| format!("cannot open {} for the copy's root", p.display()))?;
            opened.push((p.clone(), fd));
        }
        for p in plan.writable.iter().chain(&plan.needed).chain(&plan.libraries) {
            if let Ok(fd) = open_path(p) {
                opened.push((p.clone(), fd));
            }
        }
        Ok(Sources { opened })
    }

    /// The sources and their fds, to hand to another process (a claimed
    /// copy's init, `claim`).
    pub fn into_parts(self) -> Vec<(PathBuf, OwnedFd)> {
        self.opened
    }

    /// Sources another process opened (in this mount namespace).
    pub fn from_parts(opened: Vec<(PathBuf, OwnedFd)>) -> Sources {
        Sources { opened }
    }

    /// Where the bind of host path `p` comes from once the host's root is
    /// at `old_root`: its fd, else its path below `old_root`.
    pub fn from(&self, old_root: &str, p: &Path) -> PathBuf {
        match self.opened.iter().find(|(q, _)| q == p) {
            Some((_, fd)) => PathBuf::from(format!("{old_root}/proc/self/fd/{}", fd.as_raw_fd())),
            None => super::plan::under(old_root, p),
        }
    }
}

/// Opens `p` with O_PATH (std adds O_CLOEXEC): no read permission
/// needed, only the walk.
fn open_path(p: &Path) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(p).map(OwnedFd::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_opened_is_named_by_its_fd_and_another_by_its_path() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let plan = RootPlan { app_dir: dir.clone(), scratch: dir.clone(), tmp: dir.clone(), shm: dir.clone(), ..RootPlan::default() };
        let s = Sources::open(&plan).unwrap();
        let via = s.from("", &dir);
        assert!(via.to_string_lossy().starts_with("/proc/self/fd/"), "{via:?}");
        assert_eq!(std::fs::canonicalize(&via).unwrap(), dir, "the fd names the folder");
        assert_eq!(s.from("/oldroot", Path::new("/usr/lib")), PathBuf::from("/oldroot/usr/lib"));
        let missing = RootPlan { app_dir: dir.join("gone"), ..plan };
        assert!(Sources::open(&missing).unwrap_err().to_string().contains("gone"));
    }
}
