//! An app renamed in its manifest (its `app-name` or `app-group` changed,
//! the same manifest file): what the daemon keeps under the app's name
//! moves with it. Its copies' disks and logs and its own id stay its own,
//! so the copies of the old name drain as any redeploy's do and are removed
//! under the new one, and an app that later takes the old name starts from
//! nothing of the renamed app's (README, "The manifest").

use crate::home::Home;
use crate::wire::AppState;

/// What follows the app's part in the name of one of its logs
/// (`<group>-<name>`): `.log`, `@3.log`, either with rotation's `.1`; none
/// for another app's (`g-ab.log` is not `g-a`'s).
fn log_of<'a>(file: &'a str, (group, name): (&str, &str)) -> Option<&'a str> {
    let rest = file.strip_prefix(group)?.strip_prefix('-')?.strip_prefix(name)?;
    let copy = rest.strip_prefix('@').map(|r| r.trim_start_matches(|c: char| c.is_ascii_digit()));
    let tail = match copy {
        Some(t) if t.len() + 1 < rest.len() => t,
        Some(_) => return None,
        None => rest,
    };
    matches!(tail, ".log" | ".log.1").then_some(rest)
}

/// Moves what the app `from` (group, name) has under its name to `to`:
/// the folder of its copies' disks whole (a mounted disk moves with its
/// folder), its releases (the paths `state` records with them: a fenced
/// copy sees its release through its own mount, whatever the host's
/// path), every copy's log (ended copies' too) and the part rotation kept
/// of it, and its
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
    // Every copy's log, the ended copies' too (kept for a look, README
    // "Logs"), and the part rotation kept of each.
    let logs = home.logs_dir();
    let names: Vec<String> =
        std::fs::read_dir(&logs).map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect()).unwrap_or_default();
    for name in names {
        let Some(rest) = log_of(&name, from) else { continue };
        let (old, new) = (logs.join(&name), logs.join(format!("{}-{}{rest}", to.0, to.1)));
        if let Err(e) = std::fs::rename(&old, &new) {
            tracing::warn!(app = to.1, "the copy's log stays in {}: {e}", old.display());
        }
    }
    if state.uid.is_some() {
        if let Err(e) = crate::sys::ids::rename_app(&crate::sys::ids::ids_file(), &home.root, from, to) {
            tracing::warn!(app = to.1, "the app's id stays recorded under {}/{}: {e}", from.0, from.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::log_of;

    #[test]
    fn an_apps_logs_are_told_from_another_apps() {
        let app = ("default", "uis");
        for (file, rest) in [
            ("default-uis.log", ".log"),
            ("default-uis@5.log", "@5.log"),
            ("default-uis@12.log.1", "@12.log.1"),
            ("default-uis.log.1", ".log.1"),
        ] {
            assert_eq!(log_of(file, app), Some(rest), "{file}");
        }
        for file in ["default-uisx.log", "default-uis@.log", "default-uis@5.txt", "other-uis.log", "default-ui.log", "api.log"] {
            assert_eq!(log_of(file, app), None, "{file}");
        }
    }
}
