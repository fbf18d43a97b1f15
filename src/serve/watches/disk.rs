//! The disk watch (`sandbox.disk` where the kernel does not keep it: a
//! daemon that is not root, or a root daemon that could not give a copy a
//! filesystem of its own; README, "The fence"): every [`WATCH_EVERY`] the
//! watched copies' scratch, /tmp and /dev/shm folders are summed off the
//! lock, on a blocking thread, with the files its processes deleted and
//! hold open, and a copy past its size is stopped. Its exit
//! carries the stop, so status and the copy's log say why.

use std::path::PathBuf;
use std::time::Duration;

use crate::sys::disk::usage;
use crate::wire::DiskStop;

use crate::serve::Daemon;
use crate::serve::Shared;

/// How often the watched disks are summed: a walk of every file, so less
/// often than memory; a copy can write past its size by what it writes in
/// this long.
pub const WATCH_EVERY: Duration = Duration::from_secs(2);

/// One copy the watch looks at.
struct Watched {
    app: String,
    copy: u32,
    pid: u32,
    pid_start: u64,
    limit: u64,
    /// When the copy's process started (Unix ms): what was written before
    /// is not the process's doing.
    started_ms: u64,
    /// Its scratch folder, /tmp and /dev/shm on the host.
    folders: [PathBuf; 3],
}

impl Daemon {
    /// The running copies with a disk size that no filesystem of their own
    /// keeps, that the watch has not stopped and nothing else is stopping.
    fn disk_watched(&self) -> Vec<Watched> {
        self.fenced_running()
            .filter(|c| c.process.disk_stop.is_none())
            .filter_map(|c| {
                let scratch = self.home.scratch_dir(&c.spec.group, &c.spec.name, c.rec.copy);
                Some(Watched {
                    app: c.app.to_string(),
                    copy: c.rec.copy,
                    pid: c.pid,
                    pid_start: c.pid_start,
                    limit: c.sandbox.disk.bytes()?,
                    started_ms: c.rec.started_ms.unwrap_or(0),
                    folders: crate::sys::disk::folders(&scratch),
                })
            })
            .collect()
    }

    /// Takes one measure of a watched copy (`before`: the bytes of files
    /// written before its process started). Its copy's allowance beyond its
    /// size is fixed at the copy's first measure (see
    /// `CopyRecord::disk_allowance`); a copy past its size and allowance is
    /// stopped.
    fn measured(&mut self, w: &Watched, stop: DiskStop, before: u64) {
        let Some(app) = self.apps.get_mut(&w.app) else { return };
        let Some(rec) = app.recorded.state.copies.iter_mut().find(|r| r.copy == w.copy && r.pid == Some(w.pid)) else { return };
        let allowance = match rec.disk_allowance {
            Some(a) => a,
            None => {
                let a = before.saturating_sub(stop.limit);
                rec.disk_allowance = Some(a);
                if a > 0 {
                    tracing::warn!(
                        app = w.app,
                        copy = w.copy,
                        "copy {}'s disk already holds more than sandbox.disk at its first start ({}); it may hold that much but no more, and its next deploy starts on an empty disk held to its size",
                        w.copy,
                        stop.describe()
                    );
                }
                a
            }
        };
        if stop.used > stop.limit.saturating_add(allowance) {
            self.stop_for_disk(w, stop);
        }
    }

    /// Stops a copy past its disk size: SIGKILL to its process group (what
    /// it writes meanwhile lands on the host's disk), kept for its exit,
    /// which counts as a crash.
    fn stop_for_disk(&mut self, w: &Watched, stop: DiskStop) {
        if let Some(process) = self.stop_past_limit(&w.app, w.copy, w.pid, w.pid_start, &stop.describe()) {
            process.disk_stop = Some(stop);
        }
    }
}

/// The disk watch: see the module's documentation.
pub fn spawn_watch(shared: Shared) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(WATCH_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let watched = shared.lock().disk_watched();
            if watched.is_empty() {
                continue;
            }
            // A copy of a subordinate id writes folders its daemon's user
            // cannot walk: they are counted where its ids are mapped.
            let subordinate = match crate::sys::ids::Scheme::current() {
                crate::sys::ids::Scheme::Subordinate { first, last } => Some((*first, *last)),
                _ => None,
            };
            let over = tokio::task::spawn_blocking(move || {
                // Files the copy deleted while it holds them open take disk
                // that no walk of its folders finds. One scan of every
                // process for the round, and only if a copy is walked (a
                // copy with a disk of its own is the kernel's to hold).
                let processes = std::cell::OnceCell::new();
                watched
                    .into_iter()
                    .filter(|w| !crate::sys::disk::is_mount_point(&w.folders[0]))
                    .map(|w| {
                        let u = subordinate
                            .and_then(|r| crate::wire::reclaim::measure(&w.folders, w.started_ms, r).ok())
                            .unwrap_or_else(|| usage(&w.folders, w.started_ms));
                        let hidden = processes.get_or_init(crate::sys::procfs::Processes::read).tree_held(w.pid).deleted_bytes;
                        (DiskStop { used: u.used + hidden, limit: w.limit }, u.before, w)
                    })
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            let mut d = shared.lock();
            for (stop, before, w) in &over {
                d.measured(w, *stop, *before);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_use_below_a_folder_counts_its_files_and_sub_folders() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().to_path_buf();
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        let used_below = |d: &std::path::Path| usage(&[d.to_path_buf()], 0).used;
        let empty = used_below(&dir);
        std::fs::write(dir.join("a/b/data"), vec![7u8; 1 << 20]).unwrap();
        std::fs::write(dir.join("top"), vec![7u8; 1 << 20]).unwrap();
        let used = used_below(&dir);
        assert!(used >= empty + (2 << 20), "{used} after {empty}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(used_below(&dir), 0, "gone: nothing");
    }
}
