//! The home folder, `$SHINYCTL_HOME` (default `~/.shinyctl`), and every path
//! under it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The home's folder below a user's home when `$SHINYCTL_HOME` is unset.
pub const DEFAULT_DIR: &str = ".shinyctl";

/// The home folder and the paths under it.
#[derive(Debug, Clone)]
pub struct Home {
    /// `$SHINYCTL_HOME`, or `~/.shinyctl`.
    pub root: PathBuf,
}

impl Home {
    /// The home named by `$SHINYCTL_HOME`, else `~/.shinyctl`.
    pub fn from_env() -> Home {
        let root = match std::env::var_os("SHINYCTL_HOME") {
            Some(p) if !p.is_empty() => PathBuf::from(p),
            _ => {
                let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"));
                home.join(DEFAULT_DIR)
            }
        };
        Home { root }
    }

    /// Creates the home, `logs/`, `proxy/`, `scratch/` and `releases/`, mode 0700.
    pub fn ensure(&self) -> io::Result<()> {
        for dir in [self.root.clone(), self.logs_dir(), self.proxy_dir(), self.scratch_root(), self.releases_root()] {
            fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        }
        fs::set_permissions(&self.root, fs::Permissions::from_mode(0o700))?;
        Ok(())
    }

    /// The socket the command talks to.
    pub fn api_sock(&self) -> PathBuf {
        self.root.join("api.sock")
    }
    /// The log of the daemon and of the load balancer.
    pub fn api_log(&self) -> PathBuf {
        self.root.join("api.log")
    }
    /// Every app the daemon manages.
    pub fn registry(&self) -> PathBuf {
        self.root.join("registry.json")
    }
    /// Held by the running daemon, so only one runs per home.
    pub fn serve_lock(&self) -> PathBuf {
        self.root.join("serve.lock")
    }
    /// The copies' logs.
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    /// Copy 1's log is `logs/<group>-<name>.log`; copy N's `…@N.log`.
    pub fn copy_log(&self, group: &str, name: &str, copy: u32) -> PathBuf {
        if copy == 1 {
            self.logs_dir().join(format!("{group}-{name}.log"))
        } else {
            self.logs_dir().join(format!("{group}-{name}@{copy}.log"))
        }
    }
    /// The load balancer's folder.
    pub fn proxy_dir(&self) -> PathBuf {
        self.root.join("proxy")
    }
    /// The load balancer's socket, where the daemon pushes the table.
    pub fn proxy_sock(&self) -> PathBuf {
        self.proxy_dir().join("proxy.sock")
    }
    /// Held by the running load balancer.
    pub fn proxy_lock(&self) -> PathBuf {
        self.proxy_dir().join("lock")
    }
    /// 32 random bytes, mode 0600: the sticky cookie's HMAC key.
    pub fn cookie_key(&self) -> PathBuf {
        self.proxy_dir().join("cookie.key")
    }
    /// The last copies table pushed, for people to read.
    pub fn proxy_table(&self) -> PathBuf {
        self.proxy_dir().join("table.json")
    }
    /// The load balancer's settings (timeouts, limits), for people to read.
    pub fn proxy_settings(&self) -> PathBuf {
        self.proxy_dir().join("settings.json")
    }
    /// The copies' own disks.
    pub fn scratch_root(&self) -> PathBuf {
        self.root.join("scratch")
    }
    /// An app's copies' own disks, one folder per copy.
    pub fn app_scratch(&self, group: &str, name: &str) -> PathBuf {
        self.scratch_root().join(format!("{group}-{name}"))
    }
    /// Copy N's own disk (`SHINYCTL_SCRATCH`).
    pub fn scratch_dir(&self, group: &str, name: &str, copy: u32) -> PathBuf {
        self.app_scratch(group, name).join(copy.to_string())
    }
    /// Every app's releases.
    pub fn releases_root(&self) -> PathBuf {
        self.root.join("releases")
    }
    /// An app's releases, `releases/<app-group>/<app-name>/`.
    pub fn app_releases(&self, group: &str, name: &str) -> PathBuf {
        self.releases_root().join(group).join(name)
    }
    /// One release's folder.
    pub fn release_dir(&self, group: &str, name: &str, id: &str) -> PathBuf {
        self.app_releases(group, name).join(id)
    }
}

/// Removes a file or a folder without holding up the caller: renamed at
/// once to a hidden, unique name beside it (so nothing takes it for what it
/// was, and what is made at its path afterwards is not touched), then
/// removed on a thread of its own, whose handle is returned (for tests to
/// wait on). One that cannot be renamed is removed at once, where it is.
pub fn remove_later(path: &Path) -> Option<std::thread::JoinHandle<()>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name()?.to_string_lossy().into_owned();
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let aside = path.with_file_name(format!(".{name}.deleting-{}-{n}", std::process::id()));
    match fs::rename(path, &aside) {
        Ok(()) => Some(std::thread::spawn(move || remove_now(&aside))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(_) => {
            remove_now(path);
            None
        }
    }
}

/// Removes a file or a folder with what it holds; says why it cannot.
/// What a copy wrote as one of a daemon's subordinate ids, the daemon's
/// user may not remove itself: [`crate::reclaim`] does.
fn remove_now(path: &Path) {
    let gone = if path.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
    let range = crate::sys::ids::Scheme::current().range().filter(|_| !nix::unistd::geteuid().is_root());
    let gone = match (gone, range) {
        (Err(e), Some(range)) if e.kind() == io::ErrorKind::PermissionDenied => crate::wire::reclaim::remove(path, range),
        (gone, _) => gone,
    };
    if let Err(e) = gone.or_else(|e| if e.kind() == io::ErrorKind::NotFound { Ok(()) } else { Err(e) }) {
        tracing::warn!(path = %path.display(), "cannot delete {}: {e}", path.display());
    }
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, fsync,
/// rename, then fsync of the folder.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_replacing(path, bytes, mode, Durability::Synced(None))
}

/// Writes `bytes` to `path` atomically but not durably: a temporary file
/// renamed into place, no fsync. For a file kept only for people to read
/// (`proxy/table.json`): a reader never sees half of it, and no process
/// needs it after the machine restarts, so the cycle does not wait for the
/// disk (two fsyncs, 2–16 ms each on a loaded machine).
pub fn write_replace(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_replacing(path, bytes, mode, Durability::Renamed)
}

/// How far [`write_replacing`] waits for the disk.
#[derive(Clone, Copy)]
pub enum Durability<'a> {
    /// Renamed into place only: atomic for every process, but after a power
    /// cut the file may hold an earlier version, or, on a filesystem that
    /// does not flush a file renamed over another (XFS), nothing.
    Renamed,
    /// On the disk before the call returns (fsync of the file and its
    /// folder). With a second path, that path is made another name (a hard
    /// link) of the same file: later `Renamed` writes give `path` new files,
    /// and the second name keeps this one, whole on the disk, for a reader
    /// that finds `path` empty after a power cut.
    Synced(Option<&'a Path>),
}

/// Writes `bytes` to `path` atomically, as durably as `durability` says.
pub fn write_replacing(path: &Path, bytes: &[u8], mode: u32, durability: Durability) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp_beside = |of: &Path| {
        let name = of.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        dir.join(format!(".{name}.tmp.{}.{}", std::process::id(), TMP_NONCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)))
    };
    let tmp = tmp_beside(path);
    // Created exclusively: a file or symlink someone put at the temporary
    // name is never written through, only refused.
    let write = || -> io::Result<()> {
        let mut f = fs::OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(libc::O_NOFOLLOW).open(&tmp)?;
        f.write_all(bytes)?;
        if let Durability::Synced(second) = durability {
            f.sync_all()?;
            if let Some(second) = second {
                // Linked under a temporary name and renamed, so the second
                // name always names a whole file, old or new.
                let link = tmp_beside(second);
                fs::hard_link(&tmp, &link)?;
                fs::rename(&link, second).inspect_err(|_| drop(fs::remove_file(&link)))?;
            }
        }
        fs::rename(&tmp, path)
    };
    if let Err(e) = write() {
        if e.kind() != io::ErrorKind::AlreadyExists {
            let _ = fs::remove_file(&tmp);
        }
        return Err(e);
    }
    if let Durability::Synced(_) = durability {
        if let Ok(d) = fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Tells apart the temporary files of writes in one process.
static TMP_NONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[cfg(test)]
mod tests {
    use super::write_atomic;

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary_file() {
        let tmp_dir = tempfile::tempdir().unwrap();
        let dir = tmp_dir.path().to_path_buf();
        let path = dir.join("state.json");
        write_atomic(&path, b"one", 0o644).unwrap();
        write_atomic(&path, b"two", 0o644).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[test]
    fn write_atomic_into_a_missing_folder_fails_and_leaves_nothing() {
        let path = std::path::Path::new("/nonexistent-shinyctl-dir/state.json");
        assert!(write_atomic(path, b"x", 0o644).is_err());
    }
}
