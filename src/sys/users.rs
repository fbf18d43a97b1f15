//! Who a copy runs as (`run-as`, for a root daemon) and the clean
//! environment it gets: only what an R app needs from the daemon's.

use std::ffi::{CString, OsString};
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, User};

/// The setuid helper (Debian's `uidmap`) that maps a daemon's subordinate
/// uids into a copy's user namespace.
pub const NEWUIDMAP: &str = "/usr/bin/newuidmap";
/// Its twin for gids.
pub const NEWGIDMAP: &str = "/usr/bin/newgidmap";

/// A user a copy runs as.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Identity {
    /// The user's name.
    pub name: String,
    /// The uid.
    pub uid: u32,
    /// The primary gid.
    pub gid: u32,
    /// Every group it is in (the primary one too).
    pub groups: Vec<u32>,
    /// Its home folder.
    pub home: PathBuf,
}

/// Why [`Identity::named`] found no user (a `run-as` the launcher cannot
/// take).
#[derive(Debug, thiserror::Error)]
pub enum NoUser {
    /// The password database could not be read.
    #[error("run-as: cannot look up the user {0}: {1}")]
    Lookup(String, nix::Error),
    /// No user has the name.
    #[error("run-as: there is no user {0} on this machine")]
    Missing(String),
}

impl Identity {
    /// The user named `name` from the password database.
    pub fn named(name: &str) -> Result<Identity, NoUser> {
        let user = User::from_name(name).map_err(|e| NoUser::Lookup(name.to_string(), e))?;
        let user = user.ok_or_else(|| NoUser::Missing(name.to_string()))?;
        Ok(Identity::of(user))
    }

    fn of(user: User) -> Identity {
        let c = CString::new(user.name.as_bytes()).unwrap_or_default();
        let mut groups: Vec<u32> =
            nix::unistd::getgrouplist(&c, user.gid).map(|g| g.into_iter().map(Gid::as_raw).collect()).unwrap_or_default();
        groups.push(user.gid.as_raw());
        groups.sort_unstable();
        groups.dedup();
        Identity { name: user.name, uid: user.uid.as_raw(), gid: user.gid.as_raw(), groups, home: user.dir }
    }
}

/// The user this process runs as (its effective uid), from the password
/// database: its name and home. Its groups are not looked up: that loads
/// the system's group modules (`libnss_systemd` on Debian), 0.3 ms of
/// every copy's start here, for nothing a caller of this needs.
pub fn current_user() -> Option<User> {
    User::from_uid(Uid::effective()).ok().flatten()
}

/// Takes `who`'s groups, gid and uid (in a copy's user namespace, the host
/// side mapped them).
pub fn set_user(who: &Identity) -> nix::Result<()> {
    let groups: Vec<Gid> = who.groups.iter().map(|&g| Gid::from_raw(g)).collect();
    nix::unistd::setgroups(&groups)?;
    nix::unistd::setgid(Gid::from_raw(who.gid))?;
    nix::unistd::setuid(Uid::from_raw(who.uid))
}

/// True for a variable of the daemon's environment that a copy keeps:
/// PATH, HOME, USER, LOGNAME, LANG, LC_*, TZ and R_*.
pub fn kept(name: &str) -> bool {
    matches!(name, "PATH" | "HOME" | "USER" | "LOGNAME" | "LANG" | "TZ") || name.starts_with("LC_") || name.starts_with("R_")
}

/// The variables of `vars` (the daemon's environment) a copy keeps.
pub fn kept_env(vars: impl Iterator<Item = (OsString, OsString)>) -> Vec<(OsString, OsString)> {
    vars.filter(|(k, _)| k.to_str().is_some_and(kept)).collect()
}

/// Hands a copy's file or folder to the run-as user of a root daemon, so
/// the copy can write its scratch disk and the log is theirs. Nothing to
/// do without run-as or when not root.
pub fn give_to(path: &Path, run_as: Option<&str>, app_uid: Option<u32>) -> std::io::Result<()> {
    if !Uid::effective().is_root() {
        return Ok(());
    }
    let (uid, gid) = match (run_as, app_uid) {
        (Some(name), _) => {
            let who = Identity::named(name).map_err(std::io::Error::other)?;
            (who.uid, who.gid)
        }
        (None, Some(uid)) => (uid, uid),
        (None, None) => return Ok(()),
    };
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}

/// The app's own identity (README, "Identities"): its uid, a gid of the
/// same number, no other group, no home (`/nonexistent`, as Debian's
/// system users have).
pub fn of_app(uid: u32) -> Identity {
    Identity { name: format!("app-{uid}"), uid, gid: uid, groups: vec![uid], home: PathBuf::from("/nonexistent") }
}

/// Gives a folder and everything below it to `who` (a disk from before the
/// app had its own uid, on its first start under it). Symlinks are changed
/// themselves, never followed.
pub fn give_all_to(dir: &Path, who: &Identity) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir)?;
    if meta.uid() == who.uid && meta.gid() == who.gid {
        return Ok(());
    }
    // What is below first, the folder itself last: a walk cut short is
    // walked again at the next start, not taken as done.
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            give_all_to(&entry?.path(), who)?;
        }
    }
    std::os::unix::fs::lchown(dir, Some(who.uid), Some(who.gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_documented_variables_are_kept() {
        let vars = ["PATH", "HOME", "LC_ALL", "R_LIBS_USER", "TZ", "SSH_AUTH_SOCK", "SHINYCTL_HOME", "AWS_SECRET_ACCESS_KEY", "LANGUAGE"];
        let kept: Vec<String> = kept_env(vars.iter().map(|v| (OsString::from(v), OsString::from("x"))))
            .into_iter()
            .map(|(k, _)| k.into_string().unwrap())
            .collect();
        assert_eq!(kept, ["PATH", "HOME", "LC_ALL", "R_LIBS_USER", "TZ"]);
    }

    #[test]
    fn root_is_found_with_its_groups_and_home() {
        let root = Identity::named("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert!(Identity::named("no-such-user-here").unwrap_err().to_string().contains("no user no-such-user-here"));
    }
}
