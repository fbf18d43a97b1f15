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

/// True when the app's copies run as its own uid: under a root daemon,
/// fenced, without `run-as`.
pub fn wanted(spec: &crate::manifest::AppSpec) -> bool {
    spec.start.run_as.is_none() && spec.start.sandbox.mode != crate::manifest::SandboxMode::Off && host_root()
}

/// True for root of the machine: uid 0 in the first user namespace, whose
/// map is the whole range (a "root" inside a user namespace of its own
/// has no ids of the machine to hand out).
fn host_root() -> bool {
    nix::unistd::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// The lines under status for each `writable-paths` entry the app's uid
/// cannot write, with the line that fixes it (mode bits; an ACL that grants
/// it is not read).
pub fn writable_notes(name: &str, paths: &[PathBuf], uid: u32) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .filter(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                let mode = m.mode();
                !((m.uid() == uid && mode & 0o200 != 0) || (m.gid() == uid && mode & 0o020 != 0) || mode & 0o002 != 0)
            })
        })
        .map(|p| {
            format!(
                "{name}: its copies run as the app's own uid {uid} and cannot write to {0}: `chown -R {uid}:{uid} {0}` or `setfacl -R -m u:{uid}:rwX {0}` lets them",
                p.display()
            )
        })
        .collect()
}

/// The machine-wide record of the ids handed out.
pub fn ids_file() -> PathBuf {
    std::env::var_os("SHINYCTL_IDS").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/lib/shinyctl/ids.json"))
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
/// a new one. Blocking (a lock and a file): call it off the runtime or where
/// a file write is fine.
pub fn of_app(file: &Path, home: &Path, group: &str, name: &str) -> std::io::Result<u32> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(file)?;
    // Held until this returns (the guard unlocks on drop).
    let _lock = nix::fcntl::Flock::lock(f.try_clone()?, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| std::io::Error::from(e))?;
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    let mut ids: Ids = if text.trim().is_empty() {
        Ids::default()
    } else {
        serde_json::from_str(&text).map_err(|e| std::io::Error::other(format!("{}: {e}", file.display())))?
    };
    let key = format!("{}:{group}/{name}", home.display());
    if let Some(&id) = ids.apps.get(&key) {
        return Ok(id);
    }
    let taken = taken_ids();
    let mut id = ids.next.max(FIRST);
    // Past each taken range at once, never beyond the reserved one.
    while let Some(&(_, hi)) = taken.iter().find(|(lo, hi)| (*lo..=*hi).contains(&id)) {
        id = hi.saturating_add(1);
        if id > LAST {
            break;
        }
    }
    if id > LAST {
        return Err(std::io::Error::other(format!("every id of {FIRST}-{LAST} is handed out ({})", file.display())));
    }
    ids.apps.insert(key, id);
    ids.next = id + 1;
    let bytes = serde_json::to_vec_pretty(&ids).map_err(std::io::Error::other)?;
    f.set_len(0)?;
    f.rewind()?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    Ok(id)
}

/// The ids and ranges of ids the machine's own files name.
fn taken_ids() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for file in ["/etc/passwd", "/etc/group"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        out.extend(text.lines().filter_map(|l| l.split(':').nth(2)?.parse::<u32>().ok()).map(|id| (id, id)));
    }
    for file in ["/etc/subuid", "/etc/subgid"] {
        out.extend(subordinate_ranges(&std::fs::read_to_string(file).unwrap_or_default()));
    }
    out
}

/// The ranges of `/etc/subuid`-style lines (`user:first:count`).
pub fn subordinate_ranges(text: &str) -> Vec<(u32, u32)> {
    text.lines()
        .filter_map(|l| {
            let mut p = l.split(':').skip(1);
            let first: u32 = p.next()?.trim().parse().ok()?;
            let count: u32 = p.next()?.trim().parse().ok()?;
            Some((first, first.saturating_add(count.saturating_sub(1))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_keeps_its_id_and_no_two_apps_share_one() {
        let dir = std::env::temp_dir().join(format!("shinyctl-ids-{}", std::process::id()));
        let file = dir.join("ids.json");
        let a = of_app(&file, Path::new("/home/u/.shinyctl"), "default", "hello").unwrap();
        let b = of_app(&file, Path::new("/root/.shinyctl"), "default", "hello").unwrap();
        assert!(a >= FIRST && b >= FIRST && a != b, "another home's app of the same name: {a} {b}");
        assert_eq!(of_app(&file, Path::new("/home/u/.shinyctl"), "default", "hello").unwrap(), a, "kept");
        // Two daemons at once (threads here): every id handed out once.
        let got: Vec<u32> = (0..8)
            .map(|i| {
                let file = file.clone();
                std::thread::spawn(move || of_app(&file, Path::new("/h"), "g", &format!("app{i}")).unwrap())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let mut unique = got.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), got.len(), "{got:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn subordinate_ranges_are_read_as_ranges() {
        assert_eq!(subordinate_ranges("alice:100000:65536\nbob:165536:65536\n# x\n"), [(100000, 165535), (165536, 231071)]);
    }
}
