//! The filter half of the fence, applied in the process that is about to
//! exec R, after its namespaces are made: rlimits, no_new_privs, Landlock
//! and the seccomp filter, in that order (the filter last, so nothing the
//! launcher still has to do is refused). Each is best effort; what was
//! applied, and why the rest was not, is returned as [`Applied`] for the
//! copy's log and the launcher's report. `strict` turns anything missing
//! into an error: the copy must not start then.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::landlock::{self, LandlockApplied};
use super::rlimits::{self, RlimitsApplied};
use super::seccomp;
use crate::manifest::{Sandbox, SandboxMode, Syscalls};

/// What the fence's filters need to know about one copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// The copy's scratch disk, as the copy sees it.
    pub scratch: PathBuf,
    /// The copy's /tmp folder, as the copy sees it.
    pub tmp: PathBuf,
    /// `writable-paths`: further places the copy may write.
    pub writable_paths: Vec<PathBuf>,
    /// The copy's port: the only one it may bind.
    pub port: u16,
    /// `open-files`: RLIMIT_NOFILE.
    pub open_files: u64,
    /// `memory` in bytes, for the RLIMIT_DATA backstop.
    pub memory: Option<u64>,
    /// `syscalls`: `unconfined` skips the seccomp filter.
    pub syscalls: Syscalls,
    /// `mode: strict`: the copy starts only with every filter in force.
    pub strict: bool,
}

impl Confinement {
    /// The confinement of a copy with this sandbox, scratch disk, /tmp and
    /// port (paths as the copy sees them).
    pub fn new(scratch: &Path, tmp: &Path, port: u16, sandbox: &Sandbox) -> Confinement {
        Confinement {
            scratch: scratch.to_path_buf(),
            tmp: tmp.to_path_buf(),
            writable_paths: sandbox.writable_paths.clone(),
            port,
            open_files: sandbox.open_files,
            memory: sandbox.memory,
            syscalls: sandbox.syscalls,
            strict: sandbox.mode == SandboxMode::Strict,
        }
    }

    /// Every place the copy may write below.
    fn writable(&self) -> Vec<PathBuf> {
        let mut places = vec![self.scratch.clone(), self.tmp.clone()];
        places.extend(self.writable_paths.iter().cloned());
        places
    }
}

/// What the seccomp filter is.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SeccompApplied {
    /// The filter is installed.
    pub filter: bool,
    /// Why it is not (`syscalls: unconfined`, or the kernel's refusal).
    pub missing: Option<String>,
}

/// What the filter half of the fence applied to a copy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Applied {
    /// PR_SET_NO_NEW_PRIVS is set: no setuid binary gives the copy more.
    pub no_new_privs: bool,
    /// The system-call filter.
    pub seccomp: SeccompApplied,
    /// Landlock's rules.
    pub landlock: LandlockApplied,
    /// The resource limits.
    pub rlimits: RlimitsApplied,
}

impl Applied {
    /// The reasons for whatever is missing, each named by its fence.
    pub fn missing(&self) -> Vec<String> {
        let parts = [("seccomp", &self.seccomp.missing), ("Landlock", &self.landlock.missing), ("rlimits", &self.rlimits.missing)];
        parts.into_iter().filter_map(|(name, why)| why.as_ref().map(|w| format!("{name}: {w}"))).collect()
    }

    /// The line for the copy's log.
    pub fn log_line(&self) -> String {
        let mut got = Vec::new();
        if self.seccomp.filter {
            got.push("seccomp filter".to_string());
        }
        if self.landlock.abi > 0 {
            let ll = &self.landlock;
            let parts: Vec<&str> = [(ll.writes, "writes"), (ll.bind, "bind"), (ll.scopes, "scopes")]
                .into_iter()
                .filter_map(|(on, name)| on.then_some(name))
                .collect();
            got.push(format!("Landlock ABI {} ({})", ll.abi, parts.join(", ")));
        }
        if let Some(n) = self.rlimits.open_files {
            got.push(format!("open-files {n}"));
        }
        if let Some(d) = self.rlimits.data {
            got.push(format!("RLIMIT_DATA {}M", d >> 20));
        }
        if self.no_new_privs {
            got.push("no_new_privs".to_string());
        }
        let missing = self.missing();
        let missing = match missing.is_empty() {
            true => String::new(),
            false => format!("; missing: {}", missing.join("; ")),
        };
        format!("--- shinyctl: fence: {}{missing} ---", got.join(", "))
    }
}

/// Why a copy must not start.
#[derive(Debug)]
pub enum ConfineError {
    /// no_new_privs could not be set (the filters rely on it).
    NoNewPrivs(std::io::Error),
    /// `mode: strict` and something is missing: what was applied, with
    /// the reasons.
    Strict(Box<Applied>),
}

impl std::fmt::Display for ConfineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfineError::NoNewPrivs(e) => write!(f, "no_new_privs cannot be set ({e})"),
            ConfineError::Strict(a) => write!(f, "sandbox mode strict, and the fence is not whole: {}", a.missing().join("; ")),
        }
    }
}

impl std::error::Error for ConfineError {}

/// Applies the filter half of the fence to this process (and what it
/// execs): rlimits, no_new_privs, Landlock, then the seccomp filter.
pub fn confine(c: &Confinement) -> Result<Applied, ConfineError> {
    let rlimits = rlimits::apply(c.open_files, c.memory);
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(ConfineError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    let landlock = landlock::fence(&c.writable(), c.port);
    let seccomp = match c.syscalls {
        Syscalls::Unconfined => SeccompApplied { filter: false, missing: Some("syscalls: unconfined".into()) },
        Syscalls::Default => match seccomp::build().and_then(|f| seccomp::install(&f)) {
            Ok(()) => SeccompApplied { filter: true, missing: None },
            Err(why) => SeccompApplied { filter: false, missing: Some(why) },
        },
    };
    let applied = Applied { no_new_privs: true, seccomp, landlock, rlimits };
    // The manifest's own `syscalls: unconfined` is a choice, not a lack.
    let lacking =
        !applied.landlock.whole() || applied.rlimits.missing.is_some() || (c.syscalls == Syscalls::Default && !applied.seccomp.filter);
    if c.strict && lacking {
        return Err(ConfineError::Strict(Box::new(applied)));
    }
    Ok(applied)
}

#[cfg(test)]
#[path = "confine_tests.rs"]
mod tests;
