//! The daemon's decisions on the apps' own ids (README, "Identities"):
//! which apps take one, and what status says when they cannot. The ids
//! themselves, the machine's scheme and the record of those handed out,
//! are `sys::ids`.

use std::path::PathBuf;

use crate::sys::ids::Scheme;

/// For status: why the fenced copies of `specs` run as the daemon's own
/// user (a daemon that is not root, without subordinate ids), with the
/// fix; none when no such app is there.
pub fn own_user_note<'a>(mut specs: impl Iterator<Item = &'a crate::manifest::AppSpec>) -> Option<String> {
    let Scheme::Own(why) = Scheme::current() else { return None };
    specs
        .any(|s| s.start.run_as.is_none() && s.start.sandbox.mode != crate::manifest::SandboxMode::Off)
        .then(|| format!("The apps' copies run as the daemon's own user and can read that user's files, not as a uid of their own: {why}"))
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
