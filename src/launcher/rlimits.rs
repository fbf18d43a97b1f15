//! The copy's resource limits that the kernel keeps per process: open
//! files (`open-files`), no core dumps, and RLIMIT_DATA a little above
//! `memory`, a backstop so that R says "cannot allocate vector" rather than
//! the machine swapping when no cgroup holds the copy. Soft and hard limits
//! are set alike, so the app cannot raise them again.

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use serde::{Deserialize, Serialize};

/// The least RLIMIT_DATA adds to `memory`: R's own heap, thread stacks and
/// the reserved parts of malloc's arenas count as data before the app
/// allocates anything.
const DATA_HEADROOM_MIN: u64 = 256 << 20;

/// What the rlimits of a copy are.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RlimitsApplied {
    /// RLIMIT_NOFILE as set (lower than `open-files` when the launcher may
    /// not raise its hard limit that far).
    pub open_files: Option<u64>,
    /// Core dumps are off (RLIMIT_CORE = 0).
    pub core_off: bool,
    /// RLIMIT_DATA as set (none without `memory`).
    pub data: Option<u64>,
    /// What could not be set, and why.
    pub missing: Option<String>,
}

/// RLIMIT_DATA for a copy whose `memory` is `memory` bytes: a quarter
/// more, and at least [`DATA_HEADROOM_MIN`] more.
pub fn data_limit(memory: u64) -> u64 {
    memory.saturating_add((memory / 4).max(DATA_HEADROOM_MIN))
}

/// Sets the limits on this process (inherited by what it execs and forks).
pub fn apply(open_files: u64, memory: Option<u64>) -> RlimitsApplied {
    let mut missing = Vec::new();
    let open_files = match set_nofile(open_files) {
        Ok(n) if n < open_files => {
            missing.push(format!("open-files is {n}, not {open_files}: the launcher's hard limit is lower"));
            Some(n)
        }
        Ok(n) => Some(n),
        Err(e) => {
            missing.push(format!("open-files cannot be set ({e})"));
            None
        }
    };
    let core_off = match setrlimit(Resource::RLIMIT_CORE, 0, 0) {
        Ok(()) => true,
        Err(e) => {
            missing.push(format!("core dumps cannot be turned off ({e})"));
            false
        }
    };
    let data = memory.map(data_limit).and_then(|d| match setrlimit(Resource::RLIMIT_DATA, d, d) {
        Ok(()) => Some(d),
        Err(e) => {
            missing.push(format!("RLIMIT_DATA cannot be set ({e})"));
            None
        }
    });
    let missing = (!missing.is_empty()).then(|| missing.join("; "));
    RlimitsApplied { open_files, core_off, data, missing }
}

/// Sets RLIMIT_NOFILE to `want`, or to the hard limit when this process may
/// not raise it (not privileged); returns the limit set.
fn set_nofile(want: u64) -> nix::Result<u64> {
    match setrlimit(Resource::RLIMIT_NOFILE, want, want) {
        Ok(()) => Ok(want),
        Err(nix::errno::Errno::EPERM) => {
            let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
            let n = want.min(hard);
            setrlimit(Resource::RLIMIT_NOFILE, n, n).map(|()| n)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_a_little_above_memory() {
        assert_eq!(data_limit(300 << 20), 556 << 20, "small limits get the fixed headroom");
        assert_eq!(data_limit(4 << 30), 5 << 30, "large ones a quarter more");
        assert_eq!(data_limit(u64::MAX), u64::MAX);
    }
}
