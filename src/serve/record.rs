//! The record step and the daemon's other files: state.json (atomic:
//! temporary file, fsync, rename), registry.json, the daemon's lock, and log
//! rotation.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::home::{write_atomic, Home};
use crate::manifest::AppSpec;
use crate::model::AppState;

use super::{AppRt, Daemon, LOG_ROTATE_BYTES};

/// `registry.json`: every app the daemon manages. Only the daemon reads and
/// writes it, so it lives here beside the code that does.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Registry {
    /// The applied spec of each app, by app name.
    pub apps: BTreeMap<String, AppSpec>,
}

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

/// Reads an app's state.json, if there is a readable one.
pub fn load_state(path: &Path) -> Option<AppState> {
    let bytes = fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(file = %path.display(), "unreadable state, starting afresh: {e}");
            None
        }
    }
}

/// Writes an app's state.json atomically; a failure is logged, and the
/// next cycle tries again.
pub fn save_state(path: &Path, state: &AppState) {
    let result = serde_json::to_vec_pretty(state).map_err(io::Error::other).and_then(|b| write_atomic(path, &b, 0o644));
    if let Err(e) = result {
        tracing::error!(file = %path.display(), "cannot record state: {e}");
    }
}

/// When the file is larger than `limit`, copies it to `<file>.1` and
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
    let mut old = path.as_os_str().to_owned();
    old.push(".1");
    fs::copy(path, &old)?;
    fs::OpenOptions::new().write(true).open(path)?.set_len(0)?;
    Ok(true)
}

impl Daemon {
    /// Loads registry.json and each app's state.json. The processes they
    /// name that still run (same PID and start time) are adopted by the
    /// first cycle's observe, which runs at once.
    pub(super) fn load(&mut self) -> anyhow::Result<()> {
        // Nothing is being taken yet: partial copies are a dead daemon's.
        crate::release::clean_leftovers(&self.home.releases_root());
        let registry = load_registry(&self.home)?;
        for (name, spec) in registry.apps {
            let state = load_state(&spec.state_file).unwrap_or_default();
            self.apps.insert(name, AppRt::new(spec, state));
        }
        Ok(())
    }

    /// Rotates copy logs and api.log past 1 GiB by copy-and-truncate, so a
    /// copy that writes while the daemon is down loses nothing.
    pub(super) fn rotate_logs(&self) {
        let copies = self.apps.values().flat_map(|a| {
            a.recorded.state.copies.iter().map(|r| self.home.copy_log(&a.recorded.spec.group, &a.recorded.spec.name, r.copy))
        });
        for path in copies.chain([self.home.api_log()]) {
            if let Err(e) = rotate_if_larger(&path, LOG_ROTATE_BYTES) {
                tracing::warn!(log = %path.display(), "cannot rotate: {e}");
            }
        }
    }

    /// Saves registry.json from the apps held (those not being deleted).
    pub(super) fn save_registry(&self) -> anyhow::Result<()> {
        let apps = self.apps.iter().filter(|(_, a)| !a.recorded.deleting).map(|(n, a)| (n.clone(), a.recorded.spec.clone())).collect();
        save_registry(&self.home, &Registry { apps })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_copies_and_truncates_and_the_writer_goes_on() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("shinyctl-rotate-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("a.log");
        let mut writer = fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        writer.write_all(&[b'x'; 100]).unwrap();
        assert!(!rotate_if_larger(&log, 100).unwrap(), "not past the limit");
        writer.write_all(b"y").unwrap();
        assert!(rotate_if_larger(&log, 100).unwrap());
        assert_eq!(fs::metadata(dir.join("a.log.1")).unwrap().len(), 101);
        writer.write_all(b"after").unwrap();
        assert_eq!(fs::read(&log).unwrap(), b"after", "the writer appends at the new end");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_daemon_rotates_logs_at_one_gib() {
        // how-it-works.txt: "Logs rotate at 1 GiB." The daemon's rotation
        // is rotate_if_larger with this limit (tested above with a small one).
        assert_eq!(crate::serve::LOG_ROTATE_BYTES, 1024 * 1024 * 1024);
    }

    #[test]
    fn a_second_lock_is_refused() {
        let path = std::env::temp_dir().join(format!("shinyctl-lock-{}", std::process::id()));
        let held = lock_exclusive(&path).unwrap();
        assert!(lock_exclusive(&path).is_err());
        drop(held);
        assert!(lock_exclusive(&path).is_ok());
        let _ = fs::remove_file(&path);
    }
}
