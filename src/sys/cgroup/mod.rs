//! A copy's limits that the daemon keeps (issue #9, the fence): `memory`
//! and `tasks` from the manifest's `sandbox:` section.
//!
//! - Where a cgroup can be had (`hierarchy.rs`): a cgroup of the copy's own,
//!   which its launcher joins before anything else (`shinyctl launch
//!   --cgroup DIR`), with the kernel's memory limit and pids limit in it.
//!   cgroup v2 in a delegated subtree (the daemon moves itself into the
//!   leaf `<its cgroup>/daemon` and makes `<its cgroup>/copies/<app>-<copy>`),
//!   else cgroup v1's memory and pids controllers (a root daemon), as
//!   `<its cgroup>/shinyctl-<home>/<app>-<copy>` in each.
//! - Otherwise the daemon's own watch (`serve::watches::memory::WATCH_EVERY`):
//!   the resident memory of the copy's process tree, from /proc. `tasks` has
//!   no stand-in there (RLIMIT_NPROC counts per user, not per copy).
//!
//! Either way a copy over its memory limit is stopped (the kernel's OOM
//! killer in the cgroup, then the daemon kills the rest; or the daemon's
//! watch), and the exit carries a `wire::MemoryStop`, which
//! `reconcile::decide` counts as a crash. The watch's decision, pure, is the
//! daemon's (`serve::watches::memory::watch_verdict`).

pub mod hierarchy;

pub use hierarchy::Cgroups;

/// What a copy's memory cgroup says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupSample {
    /// OOM kills in the cgroup since it was made.
    pub oom_kills: u64,
    /// The most memory it has held.
    pub peak: u64,
}

/// The tag of a home folder in cgroup names (`shinyctl-<tag>`): daemons
/// side by side never share a cgroup, and a restarted daemon finds its own.
pub fn home_tag(root: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(root.as_os_str().as_encoded_bytes())[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// The name of a copy's cgroup: `<app>-<copy>` (app names are unique, and
/// the copy number is what follows the last `-`).
pub fn leaf(app: &str, copy: u32) -> String {
    format!("{app}-{copy}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copys_cgroup_is_named_by_its_app_and_number() {
        assert_eq!(leaf("sales-2", 3), "sales-2-3");
    }
}
