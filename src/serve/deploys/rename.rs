//! An app renamed in its manifest (its `app-name` or `app-group` changed,
//! the same manifest file): what the daemon keeps under the app's name
//! moves with it. Its copies' disks and logs and its own id stay its own,
//! so the copies of the old name drain as any redeploy's do and are removed
//! under the new one, and an app that later takes the old name starts from
//! nothing of the renamed app's (README, "The manifest").

use crate::home::Home;
use crate::serve::state_files::rotated;
use crate::wire::AppState;

/// Moves what the app `from` (group, name) has under its name to `to`:
/// the folder of its copies' disks whole (a mounted disk moves with its
/// folder), its releases (the paths `state` records with them: a fenced
/// copy sees its release through its own mount, whatever the host's
/// path), each copy's log and the part rotation kept of it, and its
/// id in the ids file. Blocking but short: renames, and the ids file's
/// lock. What cannot be moved is logged and left where it was.
pub(super) fn move_app(home: &Home, from: (&str, &str), to: (&str, &str), state: &mut AppState) {
    let (old, new) = (home.app_scratch(from.0, from.1), home.app_scratch(to.0, to.1));
    crate::wire::launch::remove_app_scratch(&new);
    if old.exists() {
        if let Err(e) = std::fs::rename(&old, &new) {
            tracing::warn!(app = to.1, "the copies' disks stay in {}: {e}", old.display());
        }
    }
    // Release by release: the new name's folder may hold the release this
    // deploy just took.
    let (old, new) = (home.app_releases(from.0, from.1), home.app_releases(to.0, to.1));
    for rel in state.releases.iter_mut().filter(|r| r.dir.starts_with(&old)) {
        let Some(id) = rel.dir.file_name() else { continue };
        let to_dir = new.join(id);
        match std::fs::create_dir_all(&new).and_then(|()| std::fs::rename(&rel.dir, &to_dir)) {
            Ok(()) => rel.dir = to_dir,
            Err(e) => tracing::warn!(app = to.1, "release {} stays in {}: {e}", rel.id, old.display()),
        }
    }
    // Empty now, unless a release could not be moved (kept then).
    let _ = std::fs::remove_dir(&old);
    for rec in &state.copies {
        let (old, new) = (home.copy_log(from.0, from.1, rec.copy), home.copy_log(to.0, to.1, rec.copy));
        for (old, new) in [(rotated(&old), rotated(&new)), (old, new)] {
            match std::fs::rename(&old, &new) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(app = to.1, copy = rec.copy, "the copy's log stays in {}: {e}", old.display());
                }
                _ => {}
            }
        }
    }
    if state.uid.is_some() {
        if let Err(e) = crate::sys::ids::rename_app(&crate::sys::ids::ids_file(), &home.root, from, to) {
            tracing::warn!(app = to.1, "the app's id stays recorded under {}/{}: {e}", from.0, from.1);
        }
    }
}
