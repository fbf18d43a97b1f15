//! A copy's limits that the daemon keeps (issue #9, the fence): `memory`
//! and `tasks` from the manifest's `sandbox:` section.
//!
//! - Where a cgroup can be had (`cgroup.rs`): a cgroup of the copy's own,
//!   which its launcher joins before anything else (`shinyctl launch
//!   --cgroup DIR`), with the kernel's memory limit and pids limit in it.
//!   cgroup v2 in a delegated subtree (the daemon moves itself into the
//!   leaf `<its cgroup>/daemon` and makes `<its cgroup>/copies/<app>-<copy>`),
//!   else cgroup v1's memory and pids controllers (a root daemon), as
//!   `<its cgroup>/shinyctl-<home>/<app>-<copy>` in each.
//! - Otherwise the daemon's own watch ([`WATCH_EVERY`]): the resident
//!   memory of the copy's process tree, from /proc. `tasks` has no stand-in
//!   there (RLIMIT_NPROC counts per user, not per copy).
//!
//! Either way a copy over its memory limit is stopped (the kernel's OOM
//! killer in the cgroup, then the daemon kills the rest; or the daemon's
//! watch), and the exit carries a [`MemoryStop`], which `reconcile::decide`
//! counts as a crash. [`watch_verdict`] is the watch's decision, pure.

pub mod hierarchy;

use std::time::Duration;

pub use crate::wire::MemoryStop;
pub use hierarchy::Cgroups;

/// How often the daemon looks at the memory of limited copies (and at the
/// OOM counters of their cgroups).
pub const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What the watch saw of one limited copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// `sandbox.memory`.
    pub limit: u64,
    /// The copy's memory cgroup, when it is in one: the kernel keeps the
    /// limit, and its count of OOM kills says when it did.
    pub cgroup: Option<CgroupSample>,
    /// The resident memory of the copy's process tree (none once it is
    /// gone).
    pub rss: Option<u64>,
}

/// What a copy's memory cgroup says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupSample {
    /// OOM kills in the cgroup since it was made.
    pub oom_kills: u64,
    /// The most memory it has held.
    pub peak: u64,
}

/// The watch's decision for one copy: stop it (with what it used) or not.
/// In a memory cgroup the kernel holds the limit, and an OOM kill there
/// means the copy went over it (the rest of the copy is then stopped too);
/// outside one, resident memory past the limit does.
pub fn watch_verdict(s: &Sample) -> Option<MemoryStop> {
    match s.cgroup {
        // The peak cannot pass the limit in a cgroup; it reached it.
        Some(cg) if cg.oom_kills > 0 => Some(MemoryStop { used: cg.peak.max(s.limit), limit: s.limit }),
        Some(_) => None,
        None => s.rss.filter(|&rss| rss > s.limit).map(|used| MemoryStop { used, limit: s.limit }),
    }
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

    const M: u64 = 1 << 20;

    #[test]
    fn outside_a_cgroup_resident_memory_past_the_limit_stops_the_copy() {
        let s = |rss| Sample { limit: 200 * M, cgroup: None, rss };
        assert_eq!(watch_verdict(&s(Some(199 * M))), None);
        assert_eq!(watch_verdict(&s(Some(200 * M))), None, "at the limit is not over it");
        assert_eq!(watch_verdict(&s(Some(210 * M))), Some(MemoryStop { used: 210 * M, limit: 200 * M }));
        assert_eq!(watch_verdict(&s(None)), None, "a copy already gone is left to its exit");
    }

    #[test]
    fn in_a_cgroup_an_oom_kill_stops_the_copy_and_resident_memory_is_the_kernels_business() {
        let s = |oom_kills, peak, rss| Sample { limit: 200 * M, cgroup: Some(CgroupSample { oom_kills, peak }), rss: Some(rss) };
        assert_eq!(watch_verdict(&s(0, 150 * M, 150 * M)), None);
        assert_eq!(watch_verdict(&s(0, 200 * M, 300 * M)), None, "shared pages counted twice by RSS are no reason");
        assert_eq!(watch_verdict(&s(1, 199 * M, 10 * M)), Some(MemoryStop { used: 200 * M, limit: 200 * M }));
        assert_eq!(watch_verdict(&s(2, 201 * M, 10 * M)), Some(MemoryStop { used: 201 * M, limit: 200 * M }));
    }

    #[test]
    fn the_shown_line() {
        let m = MemoryStop { used: (2.1 * (1u64 << 30) as f64) as u64, limit: 2 << 30 };
        assert_eq!(m.describe(), "2.1G, over its memory limit of 2G");
        assert_eq!(leaf("sales-2", 3), "sales-2-3");
    }
}
