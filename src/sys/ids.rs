//! Each app's identity on the machine (README, "Identities"): under a root
//! daemon, a uid (and a gid of the same number) that no person and no other
//! app has, which its copies run as (without `run-as`), kept through sleep
//! and across redeploys.
//!
//! The ids come from a range shinyctl reserves, [`FIRST`]..=[`LAST`],
//! handed out from one machine-wide file under a lock (two root daemons of
//! different homes never hand out the same id), never one that
//! `/etc/passwd`, `/etc/group`, `/etc/subuid` or `/etc/subgid` names, and
//! never again once handed out (files of an app may remain anywhere).

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The first id of the range: 0x7F000000, above systemd's range for
/// containers (524288–1879048191) and useradd's subordinate ids (from
/// 100000, 65536 a user: 600100000 for 9155 users), below 2^31 (tools that
/// read ids as signed numbers), far from DynamicUser's 61184–65519.
pub const FIRST: u32 = 0x7F00_0000;
/// The last id of the range: 65536 apps per machine.
pub const LAST: u32 = FIRST + 0xFFFF;

/// Where the apps' own ids come from, for this daemon (worked out once: a
/// change to `/etc/subuid` takes a restart of the daemon, as it does for
/// podman).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheme {
    /// Root of the machine: the range shinyctl reserves, [`FIRST`]..=[`LAST`].
    Reserved,
    /// A daemon that is not root, with subordinate ids (`/etc/subuid` and
    /// `/etc/subgid`) and `newuidmap`/`newgidmap` to map them: the ids
    /// both files give its user, `first..=last`.
    Subordinate {
        /// The first id of the range (uid and gid alike).
        first: u32,
        /// The last id of the range.
        last: u32,
    },
    /// None: the copies run as the daemon's own user; why, with the fix.
    Own(String),
}

impl Scheme {
    /// This daemon's scheme (read once).
    pub fn current() -> &'static Scheme {
        static SCHEME: std::sync::OnceLock<Scheme> = std::sync::OnceLock::new();
        SCHEME.get_or_init(|| {
            let read = |f: &str| std::fs::read_to_string(f).unwrap_or_default();
            let me = nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten();
            Scheme::of(
                host_root(),
                nix::unistd::geteuid().as_raw(),
                me.as_ref().map(|u| u.name.as_str()),
                &read("/etc/subuid"),
                &read("/etc/subgid"),
                map_tools_found(),
            )
        })
    }

    /// The scheme of a daemon of `uid` (named `name`) with these
    /// `/etc/subuid` and `/etc/subgid` texts; `tools`: newuidmap and
    /// newgidmap are installed. Pure, for the tests.
    pub fn of(root: bool, uid: u32, name: Option<&str>, subuid: &str, subgid: &str, tools: bool) -> Scheme {
        if root {
            return Scheme::Reserved;
        }
        let who = name.map_or_else(|| uid.to_string(), str::to_string);
        let fix = format!(
            "`sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {who}` (a range no other user has; `sudo touch /etc/subuid /etc/subgid` first where they do not exist) and `sudo apt install uidmap`, then restart shinyctl serve"
        );
        let own = |u: &(String, u32, u32)| u.0 == uid.to_string() || Some(u.0.as_str()) == name;
        let ranges =
            |text: &str| -> Vec<(u32, u32)> { subordinate_entries(text).into_iter().filter(own).map(|(_, lo, hi)| (lo, hi)).collect() };
        let (uids, gids) = (ranges(subuid), ranges(subgid));
        // The first range of uids that has the same ids as gids: an app's gid
        // is its uid's number.
        let both = uids.iter().find_map(|&(ulo, uhi)| {
            gids.iter().find_map(|&(glo, ghi)| {
                let (lo, hi) = (ulo.max(glo), uhi.min(ghi));
                (lo <= hi).then_some((lo, hi))
            })
        });
        match (both, tools) {
            (None, _) if uids.is_empty() || gids.is_empty() => {
                Scheme::Own(format!("{who} has no subordinate ids in /etc/subuid and /etc/subgid: {fix}"))
            }
            (None, _) => Scheme::Own(format!("{who}'s subordinate uids and gids have no ids in common: {fix}")),
            (Some(_), false) => {
                Scheme::Own("newuidmap and newgidmap are not installed: `sudo apt install uidmap`, then restart shinyctl serve".to_string())
            }
            (Some((first, last)), true) => Scheme::Subordinate { first, last },
        }
    }

    /// The ids an app's uid is taken from, when there are any.
    pub fn range(&self) -> Option<(u32, u32)> {
        match self {
            Scheme::Reserved => Some((FIRST, LAST)),
            Scheme::Subordinate { first, last } => Some((*first, *last)),
            Scheme::Own(_) => None,
        }
    }
}

/// True when `newuidmap` and `newgidmap` are where the launcher runs them.
fn map_tools_found() -> bool {
    [crate::sys::users::NEWUIDMAP, crate::sys::users::NEWGIDMAP].iter().all(|t| Path::new(t).exists())
}

/// True for root of the machine: uid 0 in the first user namespace, whose
/// map is the whole range (a "root" inside a user namespace of its own
/// has no ids of the machine to hand out).
fn host_root() -> bool {
    nix::unistd::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// The record of the ids handed out: machine-wide for a root daemon, the
/// user's own for one with subordinate ids (two daemons of one user, of
/// different homes, share it); `SHINYCTL_IDS` names another.
pub fn ids_file() -> PathBuf {
    if let Some(f) = std::env::var_os("SHINYCTL_IDS") {
        return PathBuf::from(f);
    }
    match Scheme::current() {
        Scheme::Reserved => PathBuf::from("/var/lib/shinyctl/ids.json"),
        _ => {
            let state = std::env::var_os("XDG_STATE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
                .unwrap_or_else(|| PathBuf::from("/nonexistent"));
            state.join("shinyctl/ids.json")
        }
    }
}

/// The ids handed out, by app (`<home>:<group>/<name>`), and the next.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Ids {
    /// The next id to try.
    next: u32,
    /// Every app's id.
    apps: BTreeMap<String, u32>,
}

/// The id of the app `group`/`name` of the home `home`: the one it has, or
/// a new one of `range` (see [`Scheme::range`]). Blocking (a lock and a
/// file): call it off the runtime or where a file write is fine.
pub fn of_app(file: &Path, range: (u32, u32), home: &Path, group: &str, name: &str) -> std::io::Result<u32> {
    let (first, last) = range;
    let key = app_key(home, group, name);
    with_ids(file, |ids| {
        if let Some(&id) = ids.apps.get(&key) {
            return Ok((id, false));
        }
        // Subordinate ids are the user's own: only ids of people and groups
        // are stepped over there.
        let taken = taken_ids(range == (FIRST, LAST));
        let mut id = ids.next.max(first);
        // Past each taken range at once, never beyond the reserved one.
        while let Some(&(_, hi)) = taken.iter().find(|(lo, hi)| (*lo..=*hi).contains(&id)) {
            id = hi.saturating_add(1);
            if id > last {
                break;
            }
        }
        if id > last {
            return Err(std::io::Error::other(format!("every id of {first}-{last} is handed out ({})", file.display())));
        }
        ids.apps.insert(key.clone(), id);
        ids.next = id + 1;
        Ok((id, true))
    })
}

/// An app renamed (its `app-group` or `app-name` changed): the id it has
/// goes with it to its new name, so an app that later takes the old name
/// gets an id of its own, never the renamed app's. An id the new name had
/// (an app of that name deleted earlier) is given up. Nothing is written
/// when the old name has no id.
pub fn rename_app(file: &Path, home: &Path, from: (&str, &str), to: (&str, &str)) -> std::io::Result<()> {
    if !file.exists() {
        return Ok(());
    }
    let (old, new) = (app_key(home, from.0, from.1), app_key(home, to.0, to.1));
    with_ids(file, |ids| match ids.apps.remove(&old) {
        Some(id) => {
            ids.apps.insert(new.clone(), id);
            Ok(((), true))
        }
        None => Ok(((), false)),
    })
}

/// The key of an app in the ids file: `<home>:<group>/<name>`.
fn app_key(home: &Path, group: &str, name: &str) -> String {
    format!("{}:{group}/{name}", home.display())
}

/// Runs `change` on the ids file's contents under its lock (held until
/// this returns), and writes them back (with fsync) when it says they
/// changed.
fn with_ids<T>(file: &Path, change: impl FnOnce(&mut Ids) -> std::io::Result<(T, bool)>) -> std::io::Result<T> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(file)?;
    let _lock = nix::fcntl::Flock::lock(f.try_clone()?, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    let mut ids: Ids = if text.trim().is_empty() {
        Ids::default()
    } else {
        serde_json::from_str(&text).map_err(|e| std::io::Error::other(format!("{}: {e}", file.display())))?
    };
    let (out, changed) = change(&mut ids)?;
    if changed {
        let bytes = serde_json::to_vec_pretty(&ids).map_err(std::io::Error::other)?;
        f.set_len(0)?;
        f.rewind()?;
        f.write_all(&bytes)?;
        f.sync_all()?;
    }
    Ok(out)
}

/// The ids and ranges of ids the machine's own files name (`subordinate`:
/// with the subordinate ranges).
fn taken_ids(subordinate: bool) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for file in ["/etc/passwd", "/etc/group"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        out.extend(text.lines().filter_map(|l| l.split(':').nth(2)?.parse::<u32>().ok()).map(|id| (id, id)));
    }
    if subordinate {
        for file in ["/etc/subuid", "/etc/subgid"] {
            out.extend(subordinate_ranges(&std::fs::read_to_string(file).unwrap_or_default()));
        }
    }
    out
}

/// The ranges of `/etc/subuid`-style lines (`user:first:count`).
pub fn subordinate_ranges(text: &str) -> Vec<(u32, u32)> {
    subordinate_entries(text).into_iter().map(|(_, lo, hi)| (lo, hi)).collect()
}

/// The lines of an `/etc/subuid`-style text: who (a name or a uid), and
/// the first and last id of the range.
fn subordinate_entries(text: &str) -> Vec<(String, u32, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut p = l.split(':');
            let who = p.next()?.trim().to_string();
            let first: u32 = p.next()?.trim().parse().ok()?;
            let count: u32 = p.next()?.trim().parse().ok()?;
            (count > 0).then(|| (who, first, first.saturating_add(count - 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_keeps_its_id_and_no_two_apps_share_one() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let file = dir.join("ids.json");
        let r = (FIRST, LAST);
        let a = of_app(&file, r, Path::new("/home/u/.shinyctl"), "default", "hello").unwrap();
        let b = of_app(&file, r, Path::new("/root/.shinyctl"), "default", "hello").unwrap();
        assert!(a >= FIRST && b >= FIRST && a != b, "another home's app of the same name: {a} {b}");
        assert_eq!(of_app(&file, r, Path::new("/home/u/.shinyctl"), "default", "hello").unwrap(), a, "kept");
        // Two daemons at once (threads here): every id handed out once.
        let got: Vec<u32> = (0..8)
            .map(|i| {
                let file = file.clone();
                std::thread::spawn(move || of_app(&file, r, Path::new("/h"), "g", &format!("app{i}")).unwrap())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let mut unique = got.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), got.len(), "{got:?}");
    }

    #[test]
    fn a_renamed_app_keeps_its_id_and_a_new_app_of_the_old_name_gets_another() {
        let temp = tempfile::tempdir().unwrap();
        let file = temp.path().join("ids.json");
        let (r, home) = ((FIRST, LAST), Path::new("/h"));
        // No file yet: nothing to move, and none made.
        rename_app(&file, home, ("default", "a"), ("default", "b")).unwrap();
        assert!(!file.exists());
        let a = of_app(&file, r, home, "default", "a").unwrap();
        let deleted_b = of_app(&file, r, home, "default", "b").unwrap();
        rename_app(&file, home, ("default", "a"), ("team", "b")).unwrap();
        assert_eq!(of_app(&file, r, home, "team", "b").unwrap(), a, "the id goes with the new name");
        let new_a = of_app(&file, r, home, "default", "a").unwrap();
        assert!(new_a != a && new_a != deleted_b, "a new app of the old name gets an id of its own: {new_a} {a} {deleted_b}");
    }

    #[test]
    fn a_daemon_that_is_not_root_takes_its_users_subordinate_ids_or_says_why_not() {
        let subuid = "alice:100000:65536\nbob:165536:65536\n";
        let subgid = "alice:100000:65536\n1001:165536:1000\n";
        assert_eq!(Scheme::of(true, 0, Some("root"), "", "", false), Scheme::Reserved);
        let alice = Scheme::of(false, 1000, Some("alice"), subuid, subgid, true);
        assert_eq!(alice, Scheme::Subordinate { first: 100000, last: 165535 });
        // bob's gids are named by uid (1001): what both files give.
        assert_eq!(Scheme::of(false, 1001, Some("bob"), subuid, subgid, true), Scheme::Subordinate { first: 165536, last: 166535 });
        let Scheme::Own(why) = Scheme::of(false, 1002, Some("carol"), subuid, subgid, true) else { panic!("carol has none") };
        assert!(why.contains("carol has no subordinate ids") && why.contains("usermod --add-subuids"), "{why}");
        let Scheme::Own(why) = Scheme::of(false, 1000, Some("alice"), subuid, subgid, false) else { panic!("no tools") };
        assert!(why.contains("apt install uidmap"), "{why}");
        assert_eq!(alice.range(), Some((100000, 165535)));
    }

    #[test]
    fn an_app_takes_an_id_of_its_users_range_and_no_other() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let file = dir.join("ids.json");
        let r = (100000, 100001);
        let a = of_app(&file, r, Path::new("/h"), "g", "a").unwrap();
        let b = of_app(&file, r, Path::new("/h"), "g", "b").unwrap();
        assert_eq!((a, b), (100000, 100001));
        let e = of_app(&file, r, Path::new("/h"), "g", "c").unwrap_err();
        assert!(e.to_string().contains("every id of 100000-100001 is handed out"), "{e}");
    }

    #[test]
    fn subordinate_ranges_are_read_as_ranges() {
        assert_eq!(subordinate_ranges("alice:100000:65536\nbob:165536:65536\n# x\n"), [(100000, 165535), (165536, 231071)]);
    }
}
