//! The memory bound on growth (README, "Capacity"): an app grows only while
//! one more copy fits under `SHINYCTL_MAX_MEMORY` (in the daemon's
//! environment; when unset, [`DEFAULT_SHARE`] of the machine's memory),
//! counting every copy the daemon runs, every app's, spares included.

use std::sync::OnceLock;

use crate::reconcile::MemoryRoom;
use crate::serve::Daemon;

/// The environment variable that sets the bound: a size such as `8G`.
pub const MAX_MEMORY_ENV: &str = "SHINYCTL_MAX_MEMORY";
/// The bound when the variable is not set: this share of the machine's
/// memory (`MemTotal`), leaving the rest to the system and everything else.
pub const DEFAULT_SHARE: f64 = 0.8;

/// The bound in bytes, read once; none when neither the variable nor the
/// machine's memory can be read (then growth is not bounded).
pub fn bound() -> Option<u64> {
    static BOUND: OnceLock<Option<u64>> = OnceLock::new();
    *BOUND.get_or_init(|| {
        if let Ok(v) = std::env::var(MAX_MEMORY_ENV) {
            match crate::manifest::parse_size(&v) {
                Some(n) if n > 0 => return Some(n),
                _ => tracing::warn!(
                    "{MAX_MEMORY_ENV}={v:?} is not a size such as 8G or 512M; growth is bounded by {}% of the machine's memory",
                    DEFAULT_SHARE * 100.0
                ),
            }
        }
        let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|t| mem_total(&t))?;
        Some((total as f64 * DEFAULT_SHARE) as u64)
    })
}

/// `MemTotal` of a /proc/meminfo text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl Daemon {
    /// What app `name` may grow into; none for an app that cannot grow (no
    /// `max-sessions`, or `max-replicas` not over `replicas`: /proc is not
    /// read for it), or with no copy running to size one by.
    pub(in crate::serve) fn memory_room(&self, name: &str) -> Option<MemoryRoom> {
        let spec = &self.apps.get(name)?.recorded.spec;
        if spec.scale.max_sessions.is_none() || spec.scale.max_active() <= spec.scale.replicas {
            return None;
        }
        let bound = bound()?;
        // Read by the sampler off the lock (`cpu.rs`), not here under it:
        // none yet for a copy started since its last round.
        let size = |pid: u32| self.copy_mem.get(&pid).copied();
        let running = |a: &crate::serve::app::AppRt| a.recorded.state.copies.iter().filter_map(|r| r.pid).map(size).collect::<Vec<_>>();
        let all: Vec<Option<u64>> = self.apps.values().flat_map(running).collect();
        room(&running(self.apps.get(name)?), &all, self.pool_mem, bound)
    }
}

/// The room from the copies' sizes (`app`: this app's running copies;
/// `all`: every app's, this one's among them; none: not sampled yet), the
/// pool's zygote's memory (it holds R and shiny for the next wake) and the
/// bound. A copy not sampled yet counts as big as the app's largest (else
/// any app's largest, else the zygote), so the copies a grow just started
/// are not taken for free before the sampler's next round; none when no
/// size at all is known.
pub fn room(app: &[Option<u64>], all: &[Option<u64>], pool_mem: u64, bound: u64) -> Option<MemoryRoom> {
    let largest = |sizes: &[Option<u64>]| sizes.iter().flatten().copied().max().filter(|&n| n > 0);
    let per_copy = largest(app).or_else(|| largest(all)).or(Some(pool_mem).filter(|&n| n > 0))?;
    let used = all.iter().map(|s| s.unwrap_or(per_copy)).sum::<u64>() + pool_mem;
    Some(MemoryRoom { used, bound, per_copy })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_not_sampled_yet_counts_as_big_as_the_largest() {
        let mb = |n: u64| n << 20;
        // Two copies sampled, one just started: counted at 100M, not 0.
        let r = room(&[Some(mb(100)), None], &[Some(mb(100)), None, Some(mb(80))], mb(20), mb(300)).unwrap();
        assert_eq!((r.used, r.per_copy), (mb(300), mb(100)), "{r:?}");
        // No copy of the app sampled yet: another app's largest, else the zygote.
        assert_eq!(room(&[None], &[None, Some(mb(90))], mb(20), mb(300)).unwrap().per_copy, mb(90));
        assert_eq!(room(&[None], &[None], mb(20), mb(300)).unwrap().used, mb(40));
        assert!(room(&[None], &[None], 0, mb(300)).is_none(), "nothing known at all");
    }

    #[test]
    fn the_machines_memory_is_read_from_meminfo() {
        assert_eq!(mem_total("MemTotal:       16318480 kB\nMemFree:  1 kB\n"), Some(16_318_480 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
        assert!(bound().is_some_and(|b| b > 0), "this machine has a bound");
    }
}
