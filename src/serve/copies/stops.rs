//! When a copy the cycle told to stop is signalled: once the load balancer
//! has a table without it, and then once no answer to it is under way, so
//! a drain, a redeploy, a scale-down or sleep never cuts a response that
//! has begun (a spare that stood in for a dead copy may be answering a
//! request the cycle's figures, read before the push, did not see).

use crate::reconcile::NOW_GRACE_MS;
use crate::wire::ProxyStats;

/// How long a stop waits for a load balancer that cannot be reached: drain,
/// sleep and delete must still end.
pub const STOP_WAITS_FOR_PUSH_MS: u64 = 3_000;

/// How long a stop waits, after the push, for the answers under way to the
/// copy; a `--now` stop waits only for the rest of its grace
/// ([`NOW_GRACE_MS`] from the start of its drain).
pub const STOP_WAITS_FOR_ANSWERS_MS: u64 = 30_000;

/// How often a stop waiting for answers asks the load balancer again.
pub const ANSWERS_POLL_MS: u64 = 100;

/// A copy to stop once the load balancer no longer sends it requests and
/// has none in flight to it.
#[derive(Debug, Clone)]
pub struct PendingStop {
    /// Its app.
    pub app: String,
    /// The copy number.
    pub copy: u32,
    /// Its process.
    pub pid: u32,
    /// Its process's start time, so a reused PID is never signalled.
    pub pid_start: Option<u64>,
    /// Unix ms when the cycle decided it.
    pub since_ms: u64,
    /// Unix ms after which it is stopped even with answers under way.
    pub answers_until_ms: u64,
    /// The load balancer said answers to it are under way (logged once).
    pub waiting: bool,
}

impl PendingStop {
    /// A stop decided at `now`; `hurried_since`: the start of its drain,
    /// for a copy stopped with `--now`.
    pub fn new(app: &str, copy: u32, pid: u32, pid_start: Option<u64>, now: u64, hurried_since: Option<u64>) -> PendingStop {
        let answers_until_ms = match hurried_since {
            Some(since) => since + NOW_GRACE_MS,
            None => now + STOP_WAITS_FOR_ANSWERS_MS,
        };
        PendingStop { app: app.to_string(), copy, pid, pid_start, since_ms: now, answers_until_ms, waiting: false }
    }

    /// Whether it is due at `now`: `pushed` when the load balancer has the
    /// table without the copy; `requests`: the answers to it under way, as
    /// the load balancer reported them after that push (`None`: it did not
    /// say).
    pub fn due(&self, pushed: bool, requests: Option<u64>, now: u64) -> bool {
        if !pushed {
            return now >= self.since_ms + STOP_WAITS_FOR_PUSH_MS;
        }
        requests.unwrap_or(0) == 0 || now >= self.answers_until_ms
    }

    /// When to look at it again, Unix ms.
    pub fn next_look_ms(&self, now: u64) -> u64 {
        if self.waiting {
            (now + ANSWERS_POLL_MS).min(self.answers_until_ms)
        } else {
            self.since_ms + STOP_WAITS_FOR_PUSH_MS
        }
    }
}

/// The requests in flight to a process of `app` the load balancer took out
/// of its table, from its figures.
pub fn leaving_requests(stats: &ProxyStats, app: &str, pid: u32) -> u64 {
    stats.apps.iter().filter(|a| a.name == app).flat_map(|a| &a.leaving).filter(|l| l.pid == pid).map(|l| l.requests).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AppTraffic, LeavingCopy};

    fn stats(requests: u64) -> ProxyStats {
        let leaving = vec![LeavingCopy { copy: 3, pid: 300, requests }];
        ProxyStats { apps: vec![AppTraffic { name: "hello".into(), leaving, ..AppTraffic::default() }], ..ProxyStats::default() }
    }

    /// A spare that stood in is told to stop at 10 000 (a redeploy); its
    /// answer streams until 10 700: the stop waits for it.
    #[test]
    fn a_stop_waits_for_the_answer_under_way_after_the_push() {
        let s = PendingStop::new("hello", 3, 300, None, 10_000, None);
        assert!(!s.due(false, None, 10_050), "no table without it yet");
        let busy = leaving_requests(&stats(1), "hello", 300);
        assert_eq!(busy, 1);
        assert_eq!(leaving_requests(&stats(1), "hello", 301), 0, "another process of the copy is not this one");
        assert!(!s.due(true, Some(busy), 10_100), "pushed, but an answer is under way");
        assert!(!s.due(true, Some(busy), 10_600));
        assert!(s.due(true, Some(0), 10_700), "answered: it stops");
        assert!(s.due(true, Some(busy), 10_000 + STOP_WAITS_FOR_ANSWERS_MS), "an answer that never ends does not hold it forever");
        assert!(s.due(true, None, 10_100), "a load balancer that does not say is not waited for");
        assert!(s.due(false, None, 10_000 + STOP_WAITS_FOR_PUSH_MS), "an unreachable load balancer holds it 3 s");
    }

    #[test]
    fn a_stop_with_now_waits_only_for_the_rest_of_its_grace() {
        let s = PendingStop::new("hello", 3, 300, None, 10_500, Some(10_000));
        assert!(!s.due(true, Some(1), 10_900));
        assert!(s.due(true, Some(1), 10_000 + NOW_GRACE_MS), "a second after its drain began, as --now promises");
    }

    #[test]
    fn a_waiting_stop_is_looked_at_again_soon() {
        let mut s = PendingStop::new("hello", 3, 300, None, 10_000, None);
        assert_eq!(s.next_look_ms(10_000), 10_000 + STOP_WAITS_FOR_PUSH_MS);
        s.waiting = true;
        assert_eq!(s.next_look_ms(10_200), 10_200 + ANSWERS_POLL_MS);
        assert_eq!(s.next_look_ms(10_000 + STOP_WAITS_FOR_ANSWERS_MS - 10), 10_000 + STOP_WAITS_FOR_ANSWERS_MS);
    }
}
