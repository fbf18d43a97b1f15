//! The record step and the daemon's other files: state.json (atomic:
//! temporary file, fsync, rename), registry.json, the daemon's lock, and log
//! rotation.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::home::{write_atomic, Home};
use crate::manifest::AppSpec;
use crate::model::AppState;

/// `registry.json`: every app the daemon manages. Only the daemon reads and
/// writes it, so it lives here beside the code that does.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Registry {
    /// The applied spec of each app, by app name.
    pub apps: BTreeMap<String, AppSpec>,
}

/// Takes an exclusive, non-blocking flock on `path`; held while the file
/// stays open.
pub fn lock_exclusive(path: &Path) -> io::Result<fs::File> {
    let f = fs::OpenOptions::new().create(true).truncate(false).read(true).write(true).open(path)?;
    // SAFETY: flock on an fd we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
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
    fn a_second_lock_is_refused() {
        let path = std::env::temp_dir().join(format!("shinyctl-lock-{}", std::process::id()));
        let held = lock_exclusive(&path).unwrap();
        assert!(lock_exclusive(&path).is_err());
        drop(held);
        assert!(lock_exclusive(&path).is_ok());
        let _ = fs::remove_file(&path);
    }
}
