//! The cgroups a copy starts in (`crate::sys::cgroup` makes them): which
//! its fence asks for, and what `mode: strict` does when one cannot be had.

use std::path::PathBuf;

use crate::manifest::{AppSpec, SandboxMode};
use crate::sys::cgroup::{self, Cgroups};

/// `sandbox.mode: strict` refuses the copy: a cgroup it needs cannot be
/// had. Not a crash: the copy is left down, not retried.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// Makes the cgroups a copy starts in (`spec` is the one it starts with)
/// and returns the folders its launcher joins. None with `mode: off`; a
/// cgroup that cannot be made is logged and left out (the watch keeps the
/// memory limit), unless `mode: strict` asks for the whole fence.
pub fn cgroups_for(cgroups: &Cgroups, spec: &AppSpec, copy: u32) -> anyhow::Result<Vec<PathBuf>> {
    let sb = &spec.start.sandbox;
    if sb.mode == SandboxMode::Off {
        return Ok(Vec::new());
    }
    let lacking = match (sb.memory.is_some() && !cgroups.has_memory(), !cgroups.has_pids()) {
        (true, _) => Some("a memory cgroup"),
        (_, true) => Some("a pids cgroup (for sandbox.tasks)"),
        _ => None,
    };
    if let (SandboxMode::Strict, Some(what)) = (sb.mode, lacking) {
        let why = cgroups.missing.as_deref().unwrap_or("unknown");
        return Err(Refused(format!("sandbox mode strict and fences are missing: {what} ({why})")).into());
    }
    match cgroups.prepare(&cgroup::leaf(&spec.name, copy), sb.memory, sb.tasks) {
        Ok(dirs) => Ok(dirs),
        Err(e) if sb.mode == SandboxMode::Strict => Err(Refused(format!("sandbox mode strict and fences are missing: {e}")).into()),
        Err(e) => {
            tracing::warn!(app = spec.name, copy, "{e}; the copy starts without its cgroup");
            Ok(Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::cgroup::hierarchy::Kind;

    fn spec(extra: &str) -> AppSpec {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("app.R"), "").unwrap();
        crate::manifest::parse(&dir.path().join("app.yaml"), &format!("app-name: hello\nport: 8080\n{extra}")).unwrap()
    }

    #[test]
    fn strict_refuses_a_copy_without_its_cgroups_and_off_asks_for_none() {
        let none = Cgroups { kind: Kind::None, missing: Some("no cgroup".into()) };
        let e = cgroups_for(&none, &spec("sandbox:\n  mode: strict\n"), 1).unwrap_err().to_string();
        assert!(e.contains("sandbox mode strict and fences are missing") && e.contains("pids cgroup"), "{e}");
        assert_eq!(cgroups_for(&none, &spec(""), 1).unwrap(), Vec::<PathBuf>::new(), "on: starts without");
        let root = std::env::temp_dir().join(format!("shinyctl-limits-off-{}", std::process::id()));
        let v1 = Cgroups { kind: Kind::V1 { memory: Some(root.join("m")), pids: Some(root.join("p")) }, missing: None };
        assert_eq!(cgroups_for(&v1, &spec("sandbox:\n  mode: off\n  memory: 1G\n"), 1).unwrap(), Vec::<PathBuf>::new());
        assert!(!root.exists(), "nothing made for mode: off");
    }
}
