//! What a copy's processes hold open that no path reaches: files deleted
//! while open, and memfds (README, "Limits: memory, tasks and disk"). A
//! copy that writes a file and unlinks it, or writes into a memfd, takes
//! disk or memory that no walk of its folders and no process's resident
//! memory shows; where the kernel keeps no limit (no filesystem of the
//! copy's own, no cgroup), the daemon's watches add these.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;

use super::{descendants_in, Processes};

/// Bytes held open by a process tree that no path reaches.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Files deleted while open: the disk they still take.
    pub deleted_bytes: u64,
    /// memfds: memory (shared memory, in no process's resident set until
    /// mapped).
    pub memfd_bytes: u64,
}

impl Processes {
    /// [`Held`] by `pid` and its descendants as this snapshot saw them, each
    /// file once however many descriptors name it. A process whose
    /// descriptors cannot be read (gone, or another user's) adds nothing.
    pub fn tree_held(&self, pid: u32) -> Held {
        let mut seen = HashSet::new();
        let mut held = Held::default();
        for p in descendants_in(pid, &self.0) {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{p}/fd")) else { continue };
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else { continue };
                let target = target.to_string_lossy();
                let memfd = target.starts_with("/memfd:");
                if !(memfd || target.starts_with('/') && target.ends_with(" (deleted)")) {
                    continue;
                }
                // The descriptor's own file, which its link still reaches.
                let Ok(meta) = std::fs::metadata(fd.path()) else { continue };
                if !meta.is_file() || !seen.insert((meta.dev(), meta.ino())) {
                    continue;
                }
                let bytes = meta.blocks() * 512;
                if memfd {
                    held.memfd_bytes += bytes;
                } else {
                    held.deleted_bytes += bytes;
                }
            }
        }
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_deleted_file_and_a_memfd_held_open_are_counted_once_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hidden.bin");
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; 3 << 20]).unwrap();
        file.sync_all().unwrap();
        let again = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        // SAFETY: memfd_create with a constant name; the descriptor is owned here.
        let mut memfd = unsafe {
            let fd = libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC);
            assert!(fd >= 0);
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
        };
        memfd.write_all(&vec![1u8; 2 << 20]).unwrap();
        let held = Processes::read().tree_held(std::process::id());
        // This test process may hold other such files; these are at least there.
        assert!(held.deleted_bytes >= 3 << 20 && held.deleted_bytes < (3 << 20) * 2, "counted once: {held:?}");
        assert!(held.memfd_bytes >= 2 << 20, "{held:?}");
        drop((file, again, memfd));
    }
}
