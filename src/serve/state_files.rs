//! The record step and the daemon's other files: state.json (atomic:
//! temporary file, fsync, rename), registry.json, the daemon's lock, and log
//! rotation.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::home::{write_atomic, write_replacing, Durability, Home};
use crate::wire::state::synced_path;
use crate::wire::{AppState, Registry};

use crate::serve::app::{Recorded, Tracked};
use crate::serve::AppRt;
use crate::serve::Daemon;
use crate::serve::LOG_ROTATE_BYTES;

/// Takes an exclusive, non-blocking flock on `path`; held until the
/// returned lock drops.
pub fn lock_exclusive(path: &Path) -> io::Result<Flock<fs::File>> {
    let f = fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)?;
    Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| io::Error::from(errno))
}

/// Reads registry.json (empty when there is none yet).
pub fn load_registry(home: &Home) -> anyhow::Result<Registry> {
    match fs::read(home.registry()) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}; move it aside to start afresh", home.registry().display()))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Registry::default()),
        Err(e) => Err(anyhow::anyhow!("{}: {e}", home.registry().display())),
    }
}

/// Writes registry.json atomically.
pub fn save_registry(home: &Home, registry: &Registry) -> anyhow::Result<()> {
    let bytes = serde_json::to_vec_pretty(registry)?;
    write_atomic(&home.registry(), &bytes, 0o600)?;
    Ok(())
}

/// Reads an app's state.json, if there is a readable one; when it is there
/// but does not parse (a power cut after a save that did not wait for the
/// disk), the version last written with fsync.
pub fn load_state(path: &Path) -> Option<AppState> {
    let bytes = fs::read(path).ok()?;
    let e = match serde_json::from_slice(&bytes) {
        Ok(s) => return Some(s),
        Err(e) => e,
    };
    let synced = synced_path(path);
    match read_synced(path) {
        Ok(s) => {
            tracing::warn!(file = %path.display(), "unreadable state ({e}); read {} in its place, the version last known to be on the disk", synced.display());
            Some(s)
        }
        Err(e2) => {
            tracing::warn!(file = %path.display(), "unreadable state, starting afresh: {e} (and {}: {e2})", synced.display());
            None
        }
    }
}

/// The version of an app's state file last written with fsync, read from
/// its second name ([`synced_path`]).
fn read_synced(path: &Path) -> anyhow::Result<AppState> {
    Ok(serde_json::from_slice(&fs::read(synced_path(path))?)?)
}

/// Writes an app's state.json atomically, with fsync when `durable` (and
/// its second name, [`synced_path`], then names it). A failure is logged
/// and returned; the previous file stays whole.
pub fn save_state(path: &Path, state: &AppState, durable: bool) -> io::Result<()> {
    let synced = synced_path(path);
    let durability = if durable { Durability::Synced(Some(&synced)) } else { Durability::Renamed };
    let result = serde_json::to_vec_pretty(state).map_err(io::Error::other).and_then(|b| write_replacing(path, &b, 0o600, durability));
    if let Err(e) = &result {
        tracing::error!(file = %path.display(), "cannot record state: {e}");
    }
    result
}

/// Removes an app's state file and its second name (that one first: a
/// second name without its state file would be read as the app's state).
pub fn remove_state(path: &Path) {
    let _ = fs::remove_file(synced_path(path));
    let _ = fs::remove_file(path);
}

/// The end of a delete, once the app's copies are gone (its cycle) or
/// stopped (`shutdown --all`): its state file and releases go. The caller
/// removes the app from the daemon's apps.
pub(in crate::serve) fn forget_deleted(home: &Home, name: &str, recorded: &Recorded) {
    remove_state(&recorded.spec.state_file);
    crate::release::forget(home, &recorded.spec, &recorded.state);
    tracing::info!(app = name, "deleted");
}

/// The record step: writes the app's state to its state file, waiting for
/// the disk only when its lasting part changed since the disk last had it
/// (a deploy, a new copy, a crash, a stop). A save that changes only
/// processes (a wake's starts, a copy seen ready) is atomic without the
/// disk: a daemon that dies still finds it, and after a power cut, when
/// nothing runs, the version on the disk holds the same lasting part.
pub fn record(recorded: &Recorded, tracked: &mut Tracked) {
    let path = &recorded.spec.state_file;
    let lasting = recorded.state.lasting();
    let durable = tracked.on_disk.last.as_ref().is_none_or(|(p, l)| p != path || *l != lasting);
    match save_state(path, &recorded.state, durable) {
        Ok(()) => {
            if durable {
                tracked.on_disk.last = Some((path.clone(), lasting));
            }
            tracked.state_error = None;
        }
        Err(e) => tracked.state_error = Some(e.to_string()),
    }
}

/// Checks, before an apply changes anything, that `path` can be the app's
/// state file: an existing file there must be a shinyctl state file (so no
/// file of the user's is overwritten), and its folder must take a new file
/// (a read-only or full disk is refused now rather than found later).
pub fn check_state_file(path: &Path) -> Result<(), StateFileRefused> {
    match fs::read(path) {
        Ok(bytes) => {
            // Torn by a power cut, it is still ours when its second name is.
            if serde_json::from_slice::<AppState>(&bytes).is_err() && read_synced(path).is_err() {
                return Err(StateFileRefused::NotOurs(path.to_path_buf()));
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(StateFileRefused::Unreadable(path.to_path_buf(), e)),
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let probe = dir.join(format!(".shinyctl-probe.{}", std::process::id()));
    let made = fs::OpenOptions::new().write(true).create_new(true).open(&probe).and_then(|mut f| {
        use std::io::Write;
        f.write_all(b"{}")?;
        f.sync_all()
    });
    let _ = fs::remove_file(&probe);
    made.map_err(|e| StateFileRefused::Unwritable(dir.to_path_buf(), e))
}

/// Why [`check_state_file`] refuses a path; the text (after the manifest's
/// file, line and key) names what to do.
#[derive(Debug, thiserror::Error)]
pub enum StateFileRefused {
    /// A file is there that is not a shinyctl state file.
    #[error(
        "{} exists and is not a shinyctl state file; shinyctl would overwrite it. Set state-file to another path, or move the file aside",
        .0.display()
    )]
    NotOurs(PathBuf),
    /// The file is there and cannot be read.
    #[error("cannot read {}: {}", .0.display(), .1)]
    Unreadable(PathBuf, io::Error),
    /// Its folder takes no new file.
    #[error(
        "cannot write the state file in {}: {}; make the folder writable or set state-file to a path in a writable folder",
        .0.display(),
        .1
    )]
    Unwritable(PathBuf, io::Error),
}

/// Where rotation keeps the older part of a log: `<file>.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// When the file is larger than `limit`, copies it to [`rotated`] and
/// truncates it in place. The writer keeps its O_APPEND descriptor, so it
/// goes on writing at the new end and nothing it writes is lost.
pub fn rotate_if_larger(path: &Path, limit: u64) -> io::Result<bool> {
    let len = match fs::metadata(path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if len <= limit {
        return Ok(false);
    }
    let old = rotated(path);
    // A disk too full for the copy loses the old lines, not the copy: the
    // log is emptied all the same, so the copy's writes find room again.
    let copied = fs::copy(path, &old);
    if copied.is_err() {
        let _ = fs::remove_file(&old);
    }
    fs::OpenOptions::new().write(true).open(path)?.set_len(0)?;
    copied.map(|_| true)
}

/// Log rotation, off the async runtime and outside every lock: copying a
/// 1 GiB log takes seconds, and neither the cycle nor the API waits for it.
#[derive(Default)]
pub struct Rotation {
    /// The rotation running, if one is.
    running: Option<tokio::task::JoinHandle<()>>,
}

impl Rotation {
    /// Rotates copy logs and api.log past 1 GiB by copy-and-truncate, so a
    /// copy that writes while the daemon is down loses nothing; unless the
    /// last rotation is still running.
    pub fn start(&mut self, logs: Vec<PathBuf>) {
        if self.running.as_ref().is_some_and(|r| !r.is_finished()) {
            return;
        }
        self.running = Some(tokio::task::spawn_blocking(move || {
            for path in logs {
                if let Err(e) = rotate_if_larger(&path, LOG_ROTATE_BYTES) {
                    tracing::warn!(log = %path.display(), "cannot rotate: {e}");
                }
            }
        }));
    }
}

impl Daemon {
    /// Loads registry.json and each app's state.json. The processes they
    /// name that still run (same PID and start time) are adopted by the
    /// first cycle's observe, which runs at once.
    pub(in crate::serve) fn load(&mut self) -> anyhow::Result<()> {
        // Nothing is being taken yet: partial copies are a dead daemon's.
        crate::release::clean_leftovers(&self.home.releases_root());
        let registry = load_registry(&self.home)?;
        let deleting = registry.deleting.into_iter().map(|app| (app, true));
        for ((name, spec), deleting) in registry.apps.into_iter().map(|app| (app, false)).chain(deleting) {
            let state = load_state(&spec.state_file).unwrap_or_default();
            let mut app = AppRt::new(spec, state);
            // A delete a shutdown cut short goes on where it was: the cycle
            // stops its copies (drained, or at once as it was asked) and
            // then forgets it.
            app.recorded.deleting = deleting;
            self.apps.insert(name, app);
        }
        Ok(())
    }

    /// The logs that rotate: every copy's and api.log.
    pub(in crate::serve) fn log_paths(&self) -> Vec<PathBuf> {
        let copies = self.apps.values().flat_map(|a| {
            a.recorded.state.copies.iter().map(|r| self.home.copy_log(&a.recorded.spec.group, &a.recorded.spec.name, r.copy))
        });
        copies.chain([self.home.api_log()]).collect()
    }

    /// Saves registry.json from the apps held, those being deleted apart.
    pub(in crate::serve) fn save_registry(&self) -> anyhow::Result<()> {
        let specs = |deleting: bool| {
            self.apps.iter().filter(|(_, a)| a.recorded.deleting == deleting).map(|(n, a)| (n.clone(), a.recorded.spec.clone())).collect()
        };
        save_registry(&self.home, &Registry { apps: specs(false), deleting: specs(true) })
    }

    /// Saves registry.json once a delete has ended. Where it cannot be
    /// written the app stays listed as being deleted, and the next daemon
    /// finds nothing left of it to remove: a warning is enough.
    pub(in crate::serve) fn save_registry_or_warn(&self) {
        if let Err(e) = self.save_registry() {
            tracing::warn!("cannot write registry.json after a delete: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_file_is_its_owners_alone_for_the_env_it_holds() {
        use std::os::unix::fs::PermissionsExt;
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("state.json");
        fs::write(&path, "{}").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        save_state(&path, &AppState::default(), true).unwrap();
        for p in [path.clone(), synced_path(&path)] {
            assert_eq!(fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600, "{}", p.display());
        }
    }

    #[test]
    fn rotation_copies_and_truncates_and_the_writer_goes_on() {
        use std::io::Write;
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let log = dir.join("a.log");
        let mut writer = fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        writer.write_all(&[b'x'; 100]).unwrap();
        assert!(!rotate_if_larger(&log, 100).unwrap(), "not past the limit");
        writer.write_all(b"y").unwrap();
        assert!(rotate_if_larger(&log, 100).unwrap());
        assert_eq!(fs::metadata(dir.join("a.log.1")).unwrap().len(), 101);
        writer.write_all(b"after").unwrap();
        assert_eq!(fs::read(&log).unwrap(), b"after", "the writer appends at the new end");
    }

    #[test]
    fn the_daemon_rotates_logs_at_one_gib() {
        // README, "Files": "Logs rotate at 1 GiB." The daemon's rotation
        // is rotate_if_larger with this limit (tested above with a small one).
        assert_eq!(crate::serve::LOG_ROTATE_BYTES, 1024 * 1024 * 1024);
    }

    /// An app's records as the daemon holds them, its state file in `dir`.
    fn app(dir: &Path) -> (Recorded, Tracked) {
        std::fs::write(dir.join("app.R"), "").unwrap();
        let spec = crate::manifest::parse(&dir.join("app.yaml"), "app-name: hello\nport: 8080\n").unwrap();
        let copy = crate::wire::CopyRecord { copy: 1, port: 40001, ..Default::default() };
        let state = AppState { app: "hello".into(), next_copy: 2, asleep_since_ms: Some(5), copies: vec![copy], ..Default::default() };
        (Recorded { spec, state, deleting: false }, Tracked::default())
    }

    fn inode(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn a_save_that_changes_only_processes_does_not_wait_for_the_disk() {
        let temp = tempfile::tempdir().unwrap();
        let (mut recorded, mut tracked) = app(temp.path());
        let path = recorded.spec.state_file.clone();
        let synced = synced_path(&path);
        record(&recorded, &mut tracked);
        assert_eq!(inode(&path), inode(&synced), "the first save waits for the disk and names the file twice");
        let asleep = fs::read(&synced).unwrap();

        // A wake: the app is awake, its copy has a process, then is ready.
        recorded.state.asleep_since_ms = None;
        recorded.state.awake_since_ms = Some(9);
        let copy = &mut recorded.state.copies[0];
        (copy.pid, copy.pid_start, copy.started_ms) = (Some(std::process::id()), Some(7), Some(9));
        record(&recorded, &mut tracked);
        recorded.state.copies[0].ever_ready = true;
        record(&recorded, &mut tracked);
        assert_ne!(inode(&path), inode(&synced));
        assert_eq!(load_state(&path).unwrap(), recorded.state, "the state file has every save");
        assert_eq!(fs::read(&synced).unwrap(), asleep, "no save of the wake waited for the disk");

        // A crash is lasting: that save waits for the disk.
        recorded.state.copies[0].crashes = 1;
        record(&recorded, &mut tracked);
        assert_eq!(inode(&path), inode(&synced));
        assert_eq!(tracked.state_error, None);
    }

    #[test]
    fn a_state_file_torn_by_a_power_cut_is_read_from_its_second_name() {
        let temp = tempfile::tempdir().unwrap();
        let (mut recorded, mut tracked) = app(temp.path());
        let path = recorded.spec.state_file.clone();
        record(&recorded, &mut tracked);
        let lasting = recorded.state.clone();
        recorded.state.asleep_since_ms = None;
        record(&recorded, &mut tracked);
        // What XFS may leave of a file renamed over another without fsync.
        fs::write(&path, b"").unwrap();
        assert_eq!(load_state(&path), Some(lasting), "the version last on the disk");
        assert!(check_state_file(&path).is_ok(), "an apply still takes the file as the app's");
        fs::write(synced_path(&path), b"{").unwrap();
        assert_eq!(load_state(&path), None, "neither parses: the app starts afresh");
        assert!(matches!(check_state_file(&path), Err(StateFileRefused::NotOurs(_))));
        remove_state(&path);
        assert!(!path.exists() && !synced_path(&path).exists());
    }

    #[test]
    fn what_lasts_leaves_out_only_processes_and_moments() {
        let (temp, mut s) = (tempfile::tempdir().unwrap(), AppState::default());
        let (recorded, _) = app(temp.path());
        s.copies = recorded.state.copies.clone();
        let before = s.lasting();
        s.awake_since_ms = Some(1);
        s.low_since_ms = Some(2);
        s.held_by_memory = Some("memory".into());
        s.copies[0].pid = Some(3);
        s.copies[0].pid_start = Some(4);
        s.copies[0].started_ms = Some(5);
        s.copies[0].ever_ready = true;
        assert_eq!(s.lasting(), before);
        for change in [
            |s: &mut AppState| s.next_copy += 1,
            |s: &mut AppState| s.revision += 1,
            |s: &mut AppState| s.stopped_since_ms = Some(1),
            |s: &mut AppState| s.copies[0].port += 1,
            |s: &mut AppState| s.copies[0].last_exit = Some(crate::wire::Exit::default()),
            |s: &mut AppState| s.releases.push(Default::default()),
        ] {
            let mut t = s.clone();
            change(&mut t);
            assert_ne!(t.lasting(), before);
        }
    }

    #[test]
    fn a_second_lock_is_refused() {
        let temp = tempfile::tempdir().unwrap();
        let path = temp.path().join("lock");
        let held = lock_exclusive(&path).unwrap();
        assert!(lock_exclusive(&path).is_err());
        drop(held);
        assert!(lock_exclusive(&path).is_ok());
    }
}
