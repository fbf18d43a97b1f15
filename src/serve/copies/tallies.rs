//! What the daemon counts for metrics as it happens (the rest of the
//! metrics are read from its state at each scrape): restarts by reason,
//! wakes and how long they took. Kept in memory; a new daemon starts at
//! zero, as Prometheus counters may.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::wire::AppState;

/// Why a copy was started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartReason {
    /// Its process exited when it was not told to.
    Crash,
    /// It was stopped for going over its memory limit.
    MemoryLimit,
    /// A deploy (apply that changes how it starts, restart, rollback)
    /// replaced it.
    Redeploy,
    /// More replicas were asked for.
    Scaling,
}

impl RestartReason {
    /// Every reason, in the order the series are written.
    pub const ALL: [RestartReason; 4] = [RestartReason::Crash, RestartReason::MemoryLimit, RestartReason::Redeploy, RestartReason::Scaling];

    /// The `reason` label's value.
    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::Crash => "crash",
            RestartReason::MemoryLimit => "memory-limit",
            RestartReason::Redeploy => "redeploy",
            RestartReason::Scaling => "scaling",
        }
    }
}

/// The upper bounds, in seconds, of the wake-duration histogram's buckets.
pub const WAKE_BOUNDS: [f64; 8] = [0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0];

/// One app's wakes.
#[derive(Debug, Clone, Default)]
pub struct WakeTally {
    /// Wakes begun.
    pub count: u64,
    /// Wakes that ended with a copy active, per bucket of [`WAKE_BOUNDS`]
    /// alone, then those above the last bound.
    pub buckets: [u64; WAKE_BOUNDS.len() + 1],
    /// The sum of their durations, in seconds.
    pub sum_secs: f64,
    /// Wakes that failed: every copy of the wake exited (or the app was
    /// deleted), and the requests held for it got a 503.
    pub failed: u64,
}

/// The daemon's counts, by app name.
#[derive(Debug, Clone, Default)]
pub struct Tallies {
    /// Restarts per app, by [`RestartReason::ALL`]'s order.
    pub restarts: BTreeMap<String, [u64; 4]>,
    /// Wakes per app.
    pub wakes: BTreeMap<String, WakeTally>,
    /// Times the load balancer exited and the daemon started it again.
    pub load_balancer_restarts: u64,
    /// Copies stopped for their memory whose exit is still to come back as
    /// a crash: that start is not counted again.
    memory_stops: BTreeSet<(String, u32)>,
}

impl Tallies {
    /// Counts one restart of a copy of `app` for `reason`. The cycle counts
    /// crashes, redeploys and scaling through [`Tallies::started`]; whatever
    /// stops a copy for its memory calls [`Tallies::stopped_for_memory`].
    pub fn restarted(&mut self, app: &str, reason: RestartReason) {
        let i = RestartReason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.restarts.entry(app.to_string()).or_default()[i] += 1;
    }

    /// Counts a copy of `app` stopped for going over its memory limit (a
    /// restart for [`RestartReason::MemoryLimit`]), so that the start after
    /// its exit, which the cycle sees as one after a crash, is not counted
    /// as a crash too.
    pub fn stopped_for_memory(&mut self, app: &str, copy: u32) {
        self.restarted(app, RestartReason::MemoryLimit);
        self.memory_stops.insert((app.to_string(), copy));
    }

    /// Counts the cycle's start of `copy` for `reason` (see
    /// [`restart_reason`]), unless it follows a stop for memory already
    /// counted.
    pub fn started(&mut self, app: &str, copy: u32, reason: RestartReason) {
        if reason == RestartReason::Crash && self.memory_stops.remove(&(app.to_string(), copy)) {
            return;
        }
        self.restarted(app, reason);
    }

    /// Counts a wake of `app` begun.
    pub fn wake_began(&mut self, app: &str) {
        self.wakes.entry(app.to_string()).or_default().count += 1;
    }

    /// A wake of `app` failed.
    pub fn wake_failed(&mut self, app: &str) {
        self.wakes.entry(app.to_string()).or_default().failed += 1;
    }

    /// A wake of `app` ended with a copy active, `took` after it was asked for.
    pub fn wake_ended(&mut self, app: &str, took: Duration) {
        let tally = self.wakes.entry(app.to_string()).or_default();
        let secs = took.as_secs_f64();
        tally.buckets[WAKE_BOUNDS.iter().position(|b| secs <= *b).unwrap_or(WAKE_BOUNDS.len())] += 1;
        tally.sum_secs += secs;
    }
}

/// Why the cycle starts `copy` (a plan's `Start`), as a restart; `None`
/// when it is no restart: an app's first copies, or a wake. `before` is the
/// state the cycle began with, `after` the plan's.
pub fn restart_reason(before: &AppState, after: &AppState, copy: u32, waking: bool) -> Option<RestartReason> {
    let new = after.copies.iter().find(|r| r.copy == copy)?;
    if before.copies.iter().any(|r| r.copy == copy) {
        // The same copy again: after a crash (or a start that failed, counted
        // as one); a copy put to sleep comes back with none.
        return (new.crashes > 0 && !waking).then_some(RestartReason::Crash);
    }
    if before.copies.iter().any(|r| r.revision != new.revision || r.settings != new.settings) {
        return Some(RestartReason::Redeploy);
    }
    // More copies beside ones that serve on; copies that were all draining
    // or stopping (`stop`, then `start`) are no scaling.
    before.copies.iter().any(|r| r.drain_started_ms.is_none() && r.stop_started_ms.is_none()).then_some(RestartReason::Scaling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::CopyRecord;

    fn rec(copy: u32, revision: u64, crashes: u32) -> CopyRecord {
        CopyRecord { copy, revision, crashes, settings: "s".into(), ..Default::default() }
    }

    fn state(copies: Vec<CopyRecord>) -> AppState {
        AppState { copies, ..Default::default() }
    }

    #[test]
    fn a_start_is_told_apart_by_what_came_before() {
        let first = state(vec![rec(1, 1, 0)]);
        assert_eq!(restart_reason(&state(vec![]), &first, 1, false), None, "an app's first copy is no restart");
        let crashed = state(vec![rec(1, 1, 1)]);
        assert_eq!(restart_reason(&first, &crashed, 1, false), Some(RestartReason::Crash));
        assert_eq!(restart_reason(&first, &first, 1, true), None, "a wake is no restart");
        let redeployed = state(vec![rec(1, 1, 0), rec(2, 2, 0)]);
        assert_eq!(restart_reason(&first, &redeployed, 2, false), Some(RestartReason::Redeploy));
        let scaled = state(vec![rec(1, 1, 0), rec(2, 1, 0)]);
        assert_eq!(restart_reason(&first, &scaled, 2, false), Some(RestartReason::Scaling));
        let stopping = state(vec![CopyRecord { stop_started_ms: Some(1), ..rec(1, 1, 0) }]);
        assert_eq!(restart_reason(&stopping, &scaled, 2, false), None, "a start after a stop is no scaling");
    }

    #[test]
    fn restarts_and_wakes_are_counted_per_app() {
        let mut t = Tallies::default();
        t.restarted("a", RestartReason::Crash);
        t.restarted("a", RestartReason::Crash);
        t.restarted("a", RestartReason::MemoryLimit);
        assert_eq!(t.restarts["a"], [2, 1, 0, 0]);
        t.stopped_for_memory("a", 3);
        t.started("a", 3, RestartReason::Crash);
        assert_eq!(t.restarts["a"], [2, 2, 0, 0], "a stop for memory is counted once, not again as a crash");
        t.started("a", 3, RestartReason::Crash);
        assert_eq!(t.restarts["a"], [3, 2, 0, 0], "the next crash is one");
        t.wake_began("a");
        t.wake_ended("a", Duration::from_millis(1500));
        t.wake_ended("a", Duration::from_secs(90));
        let w = &t.wakes["a"];
        assert_eq!((w.count, w.buckets[2], w.buckets[WAKE_BOUNDS.len()]), (1, 1, 1));
        assert!((w.sum_secs - 91.5).abs() < 1e-9);
        t.wake_failed("a");
        assert_eq!(t.wakes["a"].failed, 1);
    }
}
