//! What a fenced copy's root will hold, worked out on the host before any
//! namespace is entered: every path canonical (no symlink to follow inside
//! the new root) and checked to exist, the copy's /tmp and /dev/shm folders
//! made beside its scratch disk.

use std::path::{Path, PathBuf};

use super::Launch;
use crate::sys::users::Identity;

/// What the copy's root holds; every path is the host's, canonical, and
/// exists (the launcher checked before entering the namespace).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct RootPlan {
    /// The folder the copy runs (its release): read-only at [`APP_DIR`] and
    /// at its own path.
    pub app_dir: PathBuf,
    /// The copy's scratch disk: writable at [`SCRATCH_DIR`] and at its own
    /// path.
    pub scratch: PathBuf,
    /// The folder that is the copy's /tmp.
    pub tmp: PathBuf,
    /// The folder that is the copy's /dev/shm.
    pub shm: PathBuf,
    /// Paths covered by an empty read-only tmpfs (folders) or an empty
    /// file (files): SHINYCTL_HOME, ~/.ssh, ~/.gnupg, ~/.aws, hidden-paths.
    pub hidden: Vec<PathBuf>,
    /// Paths bound writable (writable-paths).
    pub writable: Vec<PathBuf>,
    /// Paths bound read-only at their own place because the copy needs them
    /// and they would be hidden (an r-path below /tmp or a hidden path).
    pub needed: Vec<PathBuf>,
    /// The daemon's user's own R libraries, for a copy that runs as the
    /// app's own uid: bound read-only at [`R_LIBS_DIR`]`/N` (that uid
    /// cannot walk a home of mode 0700 to them), and named in R_LIBS_USER.
    pub libraries: Vec<PathBuf>,
}

/// Where a copy running as the app's own uid finds its daemon user's own R
/// libraries (see [`RootPlan::libraries`]).
pub const R_LIBS_DIR: &str = "/shinyctl/rlib";

/// R_LIBS_USER for the copy: the libraries at their places inside.
pub fn r_libs_user(plan: &RootPlan) -> Option<String> {
    let inside: Vec<String> = (0..plan.libraries.len()).map(|i| format!("{R_LIBS_DIR}/{i}")).collect();
    (!inside.is_empty()).then(|| inside.join(":"))
}

/// `p` (a host path) under `base`.
pub(super) fn under(base: &str, p: &Path) -> PathBuf {
    Path::new(base).join(p.strip_prefix("/").unwrap_or(p))
}

/// The folders below a user's home that a copy never sees.
pub const SECRETS: [&str; 3] = [".ssh", ".gnupg", ".aws"];

/// Every user's runtime folders, covered too: a user's session bus
/// (`/run/user/UID/bus`) starts any program as that user outside the fence
/// (`systemd-run --user`), and a `run-as` copy, or one that runs as the
/// daemon's user, is that user; its agents' sockets live there as well.
pub const SESSIONS: [&str; 1] = ["/run/user"];

/// The copy's root for `launch`, run by `who` (a root daemon's run-as).
pub fn resolve(launch: &Launch, who: Option<&Identity>) -> anyhow::Result<RootPlan> {
    let app_dir = std::fs::canonicalize(&launch.app_dir)
        .map_err(|e| anyhow::anyhow!("the app folder {} cannot be opened: {e}", launch.app_dir.display()))?;
    let scratch = std::fs::canonicalize(&launch.scratch)
        .map_err(|e| anyhow::anyhow!("the scratch disk {} cannot be opened: {e}", launch.scratch.display()))?;
    let tmp = own_folder(&crate::sys::disk::tmp_path(&scratch), who)?;
    let shm = own_folder(&crate::sys::disk::shm_path(&scratch), who)?;
    let mut homes: Vec<PathBuf> = std::env::var_os("HOME").map(PathBuf::from).into_iter().collect();
    homes.extend(crate::sys::users::current_user().map(|u| u.dir));
    homes.extend(who.map(|w| w.home.clone()));
    // The users' own shinyctl homes (the default `~/.shinyctl`) go with
    // the secrets: a run-as user's daemon is no business of their copies.
    let secrets = homes.iter().flat_map(|h| SECRETS.iter().chain([&crate::home::DEFAULT_DIR]).map(move |s| h.join(s)));
    let mut hidden: Vec<PathBuf> = std::iter::once(launch.home.clone())
        .chain(secrets)
        .chain(SESSIONS.iter().map(PathBuf::from))
        .chain(launch.start.sandbox.hidden_paths.iter().cloned())
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    hidden.sort();
    hidden.dedup();
    let mut writable = Vec::new();
    for w in &launch.start.sandbox.writable_paths {
        match std::fs::canonicalize(w) {
            // Bound after the covers, it would show what they hide (the
            // apply refuses one in SHINYCTL_HOME; the secrets and
            // hidden-paths are caught here).
            Ok(p) => match hidden.iter().find(|h| p.starts_with(h) || h.starts_with(&p)) {
                Some(h) => super::log(&format!(
                    "--- shinyctl: the writable path {} is left out: it is in or holds {}, which the copy has hidden ---",
                    w.display(),
                    h.display()
                )),
                None => writable.push(p),
            },
            Err(e) => super::log(&format!("--- shinyctl: the writable path {} is left out: {e} ---", w.display())),
        }
    }
    // An r-path given as a path (not a name on PATH) is needed inside.
    let needed =
        Some(Path::new(&launch.start.r_path)).filter(|p| p.is_absolute()).and_then(|p| std::fs::canonicalize(p).ok()).into_iter().collect();
    // A copy that runs as the app's own uid reads its daemon user's R
    // libraries where that uid can walk to them.
    let libraries = match (launch.uid, &launch.start.run_as) {
        (Some(_), None) => user_libraries(std::env::var("R_LIBS_USER").ok().as_deref(), std::env::var_os("HOME").map(PathBuf::from)),
        _ => Vec::new(),
    };
    Ok(RootPlan { app_dir, scratch, tmp, shm, hidden, writable, needed, libraries })
}

/// The R libraries of the daemon's user that exist: `R_LIBS_USER`'s
/// folders (a leading `~/` is the home), or, unset, R's default
/// `~/R/<platform>-library/<version>` (every one found: the copy's R picks
/// its own by version in its packages' builds).
pub fn user_libraries(r_libs_user: Option<&str>, home: Option<PathBuf>) -> Vec<PathBuf> {
    let expand = |p: &str| match (p.strip_prefix("~/"), &home) {
        (Some(rest), Some(h)) => Some(h.join(rest)),
        (None, _) if p.starts_with('/') && !p.contains('%') => Some(PathBuf::from(p)),
        _ => None,
    };
    let listed: Vec<PathBuf> = match r_libs_user.filter(|v| !v.trim().is_empty()) {
        Some(v) => v.split(':').filter_map(expand).collect(),
        None => {
            let mut found = Vec::new();
            let platforms = home.iter().flat_map(|h| std::fs::read_dir(h.join("R")).into_iter().flatten().flatten());
            for platform in platforms.filter(|e| e.file_name().to_string_lossy().ends_with("-library")) {
                let mut versions: Vec<PathBuf> =
                    std::fs::read_dir(platform.path()).into_iter().flatten().flatten().map(|e| e.path()).collect();
                versions.sort();
                found.extend(versions);
            }
            found
        }
    };
    listed.into_iter().filter_map(|p| std::fs::canonicalize(p).ok()).filter(|p| p.is_dir()).collect()
}

/// Makes a folder of the copy's own (mode 0700, the run-as user's).
pub(super) fn own_folder(dir: &Path, who: Option<&Identity>) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| anyhow::anyhow!("cannot make the copy's folder {}: {e}", dir.display()))?;
    // A launcher that is not root cannot give it away here: the init does,
    // inside the copy's user namespace (`super::hand_over`).
    if let Some(w) = who.filter(|_| nix::unistd::geteuid().is_root()) {
        std::os::unix::fs::chown(dir, Some(w.uid), Some(w.gid))
            .map_err(|e| anyhow::anyhow!("cannot give {} to {}: {e}", dir.display(), w.name))?;
    }
    Ok(std::fs::canonicalize(dir)?)
}
