//! Releases: what runs is what was deployed. Each deploy (the first apply,
//! an apply that changes how the app starts, every restart) takes a
//! snapshot of working-dir ([`snapshot::take`]) under
//! `$SHINYCTL_HOME/releases/<app-group>/<app-name>/<id>/`, and its copies run
//! from it; crash restarts, scale-ups and wakes run the release their copy
//! records. `rollback` redeploys the release before the current one with the
//! settings it was deployed with.
//!
//! Everything here but the folder work in [`snapshot`] and [`crate::home::remove_later`]
//! is plain bookkeeping on [`AppState`], tested without a daemon.

pub mod snapshot;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::home::Home;
use crate::manifest::AppSpec;
use crate::wire::{AppState, CopyRecord, Release};

/// The largest working-dir a release may hold (each deploy copies it).
pub const LIMIT_BYTES: u64 = 2 << 30;

/// A new release id: the UTC time to the second and 4 random hex digits,
/// `20261130T181502-3fa9`, so ids sort by when they were taken (to the
/// second: within one, `AppState::releases`' order says which came last).
pub fn new_id(now_ms: u64) -> String {
    let stamp: String = crate::sys::fmt::rfc3339_at_offset(now_ms, 0)[..19].chars().filter(|c| *c != '-' && *c != ':').collect();
    format!("{stamp}-{:04x}", random_u16())
}

fn random_u16() -> u16 {
    use std::io::Read;
    let mut b = [0u8; 2];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)) {
        Ok(()) => u16::from_le_bytes(b),
        // Uniqueness within a second is all the suffix is for.
        Err(_) => (std::process::id() as u16) ^ (crate::sys::clock::now_ms() as u16),
    }
}

/// What a release of this app is taken from, and what it leaves out
/// besides the names in [`snapshot::LEFT_OUT_NAMES`]: the state-file and its
/// second name (the daemon writes them all the time), those of the other
/// apps (`state_files`: each holds its app's env, secrets included), and
/// the home folder, when they lie inside working-dir.
pub fn source(spec: &AppSpec, home: &Home, state_files: &[std::path::PathBuf]) -> snapshot::Source {
    let states = std::iter::once(&spec.state_file).chain(state_files);
    let mut leave_out: Vec<std::path::PathBuf> = states.flat_map(|s| [s.clone(), crate::wire::state::synced_path(s)]).collect();
    leave_out.push(home.root.clone());
    snapshot::Source { dir: spec.start.working_dir.clone(), leave_out }
}

/// Makes `release` the current one; the current one becomes the one before
/// it. Clears a rollback: what runs is the manifest again.
pub fn record(state: &mut AppState, release: Release) {
    let made_current = next_made_current(state);
    state.previous_release = state.release.take();
    state.release = Some(release.id.clone());
    state.releases.retain(|r| r.id != release.id);
    state.releases.push(Release { made_current, ..release });
    state.rolled_back = false;
}

/// The count the next release made current gets.
fn next_made_current(state: &AppState) -> u64 {
    state.releases.iter().map(|r| r.made_current).max().unwrap_or(0) + 1
}

/// The kept releases other than the current one, the last made current
/// first: deploy order, which a rollback changes (the list itself is in the
/// order taken; a release from before `made_current` was kept counts by
/// that order).
fn before_current(state: &AppState) -> Vec<&Release> {
    let mut others: Vec<(usize, &Release)> =
        state.releases.iter().enumerate().filter(|(_, r)| Some(&r.id) != state.release.as_ref()).collect();
    others.sort_by_key(|(i, r)| std::cmp::Reverse((r.made_current, *i)));
    others.into_iter().map(|(_, r)| r).collect()
}

/// True when a rollback without `--to` may go to `rel`: it served and no
/// rollback left it since it was last made current.
fn rollback_target(rel: &Release) -> bool {
    served(rel) && !rel.rolled_away
}

/// A kept release by id.
pub fn find<'a>(state: &'a AppState, id: &str) -> Option<&'a Release> {
    state.releases.iter().find(|r| r.id == id)
}

/// True when a release may be rolled back to: it served (or was recorded
/// before that was kept).
pub fn served(rel: &Release) -> bool {
    rel.served != Some(false)
}

/// Why there is no release to roll back to.
#[derive(Debug, thiserror::Error)]
pub enum RollbackError {
    /// `--to` names a release the app does not keep.
    #[error("{name} keeps no release {id}; it keeps {kept} (`shinyctl releases {name}` lists them)")]
    NotKept {
        /// The app.
        name: String,
        /// The release asked for.
        id: String,
        /// The releases it keeps, listed.
        kept: String,
    },
    /// The releases before the current one never got ready.
    #[error("{name} has no release that served before the current one: the ones before it never got ready")]
    NeverServed {
        /// The app.
        name: String,
    },
    /// The current release is the first.
    #[error("{name} has no release before the current one to roll back to: it has been deployed once{}", if *.untracked { " (or not since releases came)" } else { "" })]
    NoneBefore {
        /// The app.
        name: String,
        /// The state names no current release (deployed before releases).
        untracked: bool,
    },
    /// The release asked for runs already.
    #[error("{name} runs release {id} already")]
    Current {
        /// The app.
        name: String,
        /// The release.
        id: String,
    },
    /// The release's folder is gone.
    #[error("{name}: release {id} is gone from {}; nothing to roll back to", .dir.display())]
    Gone {
        /// The app.
        name: String,
        /// The release.
        id: String,
        /// Where it was kept.
        dir: std::path::PathBuf,
    },
}

/// Makes a kept release current again (`to`), or, without `to`, the last
/// release that served deployed (made current) before the current one and
/// not rolled away from, marking the current one rolled away from (so
/// `rollback` again goes further back); the current one
/// becomes the one before it. Returns the release now current, or why there
/// is none to go back to.
pub fn roll_back(state: &mut AppState, name: &str, to: Option<&str>) -> Result<Release, RollbackError> {
    let current = state.release.clone();
    let name = name.to_string();
    let rel = match to {
        Some(id) => find(state, id).cloned().ok_or_else(|| {
            let kept: Vec<&str> = state.releases.iter().map(|r| r.id.as_str()).collect();
            RollbackError::NotKept { name: name.clone(), id: id.to_string(), kept: kept.join(", ") }
        })?,
        None => {
            let before = before_current(state);
            let Some(rel) = before.iter().find(|r| rollback_target(r)).map(|r| (*r).clone()) else {
                // Left only releases that never served (rolled-away ones
                // are no candidates at all).
                let never = before.iter().any(|r| !r.rolled_away);
                return Err(if never {
                    RollbackError::NeverServed { name }
                } else {
                    RollbackError::NoneBefore { name, untracked: state.release.is_none() }
                });
            };
            rel
        }
    };
    if Some(&rel.id) == current.as_ref() {
        return Err(RollbackError::Current { name, id: rel.id });
    }
    if !rel.dir.is_dir() {
        return Err(RollbackError::Gone { name, id: rel.id, dir: rel.dir });
    }
    state.previous_release = current;
    // Back on the newest release, what runs is what the last deploy took.
    // Newest by deploy order (`record` puts it last), not by id: two ids of
    // the same second sort by their random part.
    state.rolled_back = state.releases.last().map(|r| &r.id) != Some(&rel.id);
    state.release = Some(rel.id.clone());
    let made_current = next_made_current(state);
    for r in state.releases.iter_mut() {
        if r.id == rel.id {
            (r.made_current, r.rolled_away) = (made_current, false);
        } else if to.is_none() && state.previous_release.as_ref() == Some(&r.id) {
            r.rolled_away = true;
        }
    }
    Ok(rel)
}

/// The kept releases as `releases APP` lists them.
pub fn rows(state: &AppState) -> Vec<crate::wire::ReleaseRow> {
    state
        .releases
        .iter()
        .map(|r| crate::wire::ReleaseRow {
            id: r.id.clone(),
            taken_ms: r.taken_ms,
            bytes: r.bytes,
            served: r.served,
            current: state.release.as_ref() == Some(&r.id),
            failed: r.served == Some(false) && {
                let mut of_it = state.copies.iter().filter(|c| c.release.as_ref() == Some(&r.id)).peekable();
                of_it.peek().is_some() && of_it.all(|c| c.left_down.is_some() || (c.crashes > 0 && !c.ever_ready))
            },
            running: state.copies.iter().filter(|c| c.pid.is_some() && c.release.as_ref() == Some(&r.id)).map(|c| c.copy).collect(),
        })
        .collect()
}

/// Marks the releases of the copies that are ready (`ready`) as served.
/// Returns true when one is marked now.
pub fn mark_served(state: &mut AppState, ready: &[u32]) -> bool {
    let ids: Vec<String> = state.copies.iter().filter(|r| ready.contains(&r.copy)).filter_map(|r| r.release.clone()).collect();
    let mut marked = false;
    for rel in state.releases.iter_mut().filter(|r| r.served == Some(false) && ids.contains(&r.id)) {
        rel.served = Some(true);
        marked = true;
    }
    marked
}

/// Notes in each release which copies run it, so their logs can go with it.
pub fn note_copies(state: &mut AppState) {
    for rec in &state.copies {
        let Some(id) = &rec.release else { continue };
        if let Some(rel) = state.releases.iter_mut().find(|r| &r.id == id) {
            if !rel.copies.contains(&rec.copy) {
                rel.copies.push(rec.copy);
            }
        }
    }
}

/// The ids that must stay: the current release, every release a recorded
/// copy runs, the newest `keep` by deploy order (last made current) (`keep-releases`, the
/// current one among them; a failed one too, so `releases` shows it), and
/// always the newest that served before the current one, so a rollback
/// target survives a run of failed deploys.
pub fn kept_ids(state: &AppState, keep: u32) -> HashSet<String> {
    let mut ids: HashSet<String> = state.release.iter().chain(state.copies.iter().filter_map(|r| r.release.as_ref())).cloned().collect();
    let others = (keep as usize).saturating_sub(1);
    let before = before_current(state);
    ids.extend(before.iter().take(others).map(|r| r.id.clone()));
    ids.extend(before.iter().find(|r| rollback_target(r)).map(|r| r.id.clone()));
    ids
}

/// Takes the releases no longer needed out of the state and returns them,
/// each with the copies whose logs go with it (those no longer recorded).
pub fn unneeded(state: &mut AppState, keep: u32) -> Vec<(Release, Vec<u32>)> {
    let keep = kept_ids(state, keep);
    let (gone, kept): (Vec<Release>, Vec<Release>) = std::mem::take(&mut state.releases).into_iter().partition(|r| !keep.contains(&r.id));
    state.releases = kept;
    gone.into_iter()
        .map(|r| {
            let logs = r.copies.iter().copied().filter(|c| !state.copies.iter().any(|rec| rec.copy == *c)).collect();
            (r, logs)
        })
        .collect()
}

/// Why a copy cannot start from its recorded release ([`run_dir`]); the
/// text names the fix.
#[derive(Debug, thiserror::Error)]
pub enum ReleaseMissing {
    /// The copy's release is not in the app's state.
    #[error("its release {id} is not recorded; `shinyctl restart {app}` takes a new one")]
    NotRecorded {
        /// The release's id.
        id: String,
        /// The app's name.
        app: String,
    },
    /// The release is recorded but its folder is gone.
    #[error("its release {id} is gone from {}; `shinyctl restart {app}` takes a new one", dir.display())]
    Gone {
        /// The release's id.
        id: String,
        /// Where its folder was.
        dir: PathBuf,
        /// The app's name.
        app: String,
    },
}

/// The folder a copy runs from and the spec it starts with: its release,
/// with the settings that release was deployed with; working-dir and the
/// spec for a copy from before releases. A release gone from disk is an
/// error: running working-dir instead would run code nobody deployed.
pub fn run_dir(spec: &AppSpec, state: &AppState, rec: &CopyRecord) -> Result<(PathBuf, AppSpec), ReleaseMissing> {
    let Some(id) = &rec.release else { return Ok((spec.start.working_dir.clone(), spec.clone())) };
    let Some(rel) = find(state, id) else {
        return Err(ReleaseMissing::NotRecorded { id: id.clone(), app: spec.name.clone() });
    };
    if !rel.dir.is_dir() {
        return Err(ReleaseMissing::Gone { id: id.clone(), dir: rel.dir.clone(), app: spec.name.clone() });
    }
    Ok((rel.dir.clone(), spec.with_start(&rel.deployed)))
}

/// The lines under the table about releases: a rolled-back app, and which
/// copies run the previous release while two versions run. `alive` says
/// whether a recorded copy has a process.
pub fn notes(name: &str, state: &AppState, alive: &dyn Fn(&CopyRecord) -> bool) -> Vec<String> {
    let mut out = Vec::new();
    if state.rolled_back {
        if let Some(id) = &state.release {
            let from = state.previous_release.as_deref().map(|p| format!(", rolled back from {p}")).unwrap_or_default();
            out.push(format!(
                "{name}: runs the rolled-back release {id}{from}; its manifest differs. `shinyctl restart {name}` deploys the manifest again."
            ));
        }
    }
    let running: Vec<&CopyRecord> = state.copies.iter().filter(|r| alive(r)).collect();
    let old: Vec<u32> = running.iter().filter(|r| r.release != state.release).map(|r| r.copy).collect();
    if !old.is_empty() && running.iter().any(|r| r.release == state.release) {
        let which = old.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        let (copies, run) = if old.len() == 1 { ("copy", "runs") } else { ("copies", "run") };
        let version =
            |id: &Option<String>| id.as_deref().map_or("working-dir (from before releases)".to_string(), |i| format!("release {i}"));
        let olds: std::collections::BTreeSet<String> =
            running.iter().filter(|r| r.release != state.release).map(|r| version(&r.release)).collect();
        let olds: Vec<String> = olds.into_iter().collect();
        out.push(format!(
            "{name}: {copies} {which} {run} the previous version ({}); new copies run {}.",
            olds.join(", "),
            version(&state.release)
        ));
    }
    out
}

/// After a cycle: notes which copies run which release, deletes the
/// releases no longer needed (neither current, nor the one before, nor run
/// by a copy) and the logs of their copies that no longer exist.
pub fn prune(home: &Home, spec: &AppSpec, state: &mut AppState) {
    note_copies(state);
    for (rel, logs) in unneeded(state, spec.keep_releases) {
        tracing::info!(app = spec.name, release = rel.id, "deleting a release no copy runs");
        crate::home::remove_later(&rel.dir);
        for copy in logs {
            let log = home.copy_log(&spec.group, &spec.name, copy);
            let mut rotated = log.clone().into_os_string();
            rotated.push(".1");
            let _ = std::fs::remove_file(&log);
            let _ = std::fs::remove_file(rotated);
        }
    }
}

/// A deleted app is forgotten: its releases (also those taken under an
/// earlier name or group) and its copies' own disks go.
pub fn forget(home: &Home, spec: &AppSpec, state: &AppState) {
    let app_dir = home.app_releases(&spec.group, &spec.name);
    for rel in state.releases.iter().filter(|r| !r.dir.starts_with(&app_dir)) {
        crate::home::remove_later(&rel.dir);
    }
    crate::home::remove_later(&app_dir);
    crate::wire::launch::remove_app_scratch(&home.app_scratch(&spec.group, &spec.name));
}

/// Release folders in an app's releases folder that no state names (left
/// by an earlier life of the app, or a daemon that died between taking and
/// recording one). Hidden entries (partial copies being taken) are not
/// listed.
pub fn orphans(app_dir: &Path, state: &AppState) -> Vec<PathBuf> {
    let Ok(read) = std::fs::read_dir(app_dir) else { return Vec::new() };
    read.filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            !name.starts_with('.') && !state.releases.iter().any(|r| r.id == name)
        })
        .map(|e| e.path())
        .collect()
}

/// Removes what a daemon that died left in the releases folder: partial
/// copies and folders half deleted. Run at the daemon's start, when no
/// release is being taken.
pub fn clean_leftovers(root: &Path) {
    let dirs = |p: &Path| std::fs::read_dir(p).into_iter().flatten().filter_map(|e| e.ok()).map(|e| e.path()).collect::<Vec<_>>();
    let hidden = |p: &Path| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
    for entry in dirs(root).iter().flat_map(|group| dirs(group)).flat_map(|app| if hidden(&app) { vec![app] } else { dirs(&app) }) {
        if hidden(&entry) {
            let _ = std::fs::remove_dir_all(&entry);
        }
    }
}

#[cfg(test)]
mod tests;
