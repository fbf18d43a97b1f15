//! What becomes of a request its copy lost (sent, and the connection broke
//! before any byte of an answer), and the requests refused for a while
//! because copies died with them in flight. Pure and synchronous, like
//! `balance.rs`: the caller hands in the method, what it knows of the
//! deaths and the time, and gets a decision back.
//!
//! A request never written to a copy is not here: it goes to another copy
//! at once (the stand-in, `requests/forward.rs`).

use std::collections::HashMap;

use hyper::Method;

/// How long a request that was in flight at two copy deaths is answered
/// 502 at once, and how close together the two deaths must be.
pub const DEATH_WINDOW_MS: u64 = 60_000;
/// The most requests remembered at once: a flood of distinct ones that
/// each lost a copy must not grow the load balancer without bound.
const MAX_REMEMBERED: usize = 1024;

/// What to do with a lost request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Send it again, once, to another copy.
    Retry,
    /// Answer 502: it may have done its work already, or it had its retry.
    Fail,
}

/// True for the methods a lost request may be sent again for.
pub fn is_safe(method: &Method) -> bool {
    *method == Method::GET || *method == Method::HEAD || *method == Method::OPTIONS
}

/// A lost request is sent again only when sending it twice cannot do harm
/// (GET, HEAD, OPTIONS), it has not been sent again already, and it has no
/// body (a body was consumed by the first send).
pub fn after_lost(method: &Method, retried: bool, bodyless: bool) -> Lost {
    if is_safe(method) && !retried && bodyless {
        Lost::Retry
    } else {
        Lost::Fail
    }
}

/// The request as deaths remember it: method, path and query.
pub fn key(method: &Method, path_and_query: &str) -> String {
    format!("{method} {path_and_query}")
}

/// One request's deaths.
#[derive(Debug, Default, Clone)]
struct Entry {
    /// The copy deaths it was in flight at (an id per copy process) and when.
    deaths: Vec<(u64, u64)>,
    /// Answered 502 at once until this unix ms (0: not refused).
    refused_until: u64,
}

/// The requests of one app that were in flight when a copy died.
#[derive(Debug, Default)]
pub struct Deaths {
    /// By [`key`].
    seen: HashMap<String, Entry>,
}

impl Deaths {
    /// Request `key` was in flight when the copy process `death` died at
    /// `now` (ms on a monotonic clock). True when this is its second death within
    /// [`DEATH_WINDOW_MS`]: from now on, for that long, it is refused.
    pub fn lost(&mut self, key: &str, death: u64, now: u64) -> bool {
        self.forget_old(now);
        if !self.seen.contains_key(key) && self.seen.len() >= MAX_REMEMBERED {
            return false;
        }
        let entry = self.seen.entry(key.to_string()).or_default();
        if !entry.deaths.iter().any(|&(d, _)| d == death) {
            entry.deaths.push((death, now));
        }
        let distinct = entry.deaths.iter().filter(|&&(_, at)| now.saturating_sub(at) < DEATH_WINDOW_MS).count();
        if distinct >= 2 {
            entry.refused_until = now + DEATH_WINDOW_MS;
            return true;
        }
        false
    }

    /// One request (a GET, HEAD or OPTIONS, sent again once after its copy
    /// died) was in flight at a second death: it is refused from `now` for
    /// [`DEATH_WINDOW_MS`]. A safe request is judged by its own two deaths,
    /// not by others with the same line, so a busy page whose copies die
    /// of something else is never refused.
    pub fn second_death(&mut self, key: &str, now: u64) {
        self.forget_old(now);
        if !self.seen.contains_key(key) && self.seen.len() >= MAX_REMEMBERED {
            return;
        }
        let entry = self.seen.entry(key.to_string()).or_default();
        entry.refused_until = now + DEATH_WINDOW_MS;
    }

    /// True while request `key` is refused at unix ms `now`.
    pub fn refused(&self, key: &str, now: u64) -> bool {
        self.seen.get(key).is_some_and(|e| now < e.refused_until)
    }

    /// True when nothing is remembered (most of the time: the caller then
    /// need not build a key).
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// The requests refused at `now`, each with the ms it stays refused.
    pub fn refusing(&self, now: u64) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> =
            self.seen.iter().filter(|(_, e)| now < e.refused_until).map(|(k, e)| (k.clone(), e.refused_until - now)).collect();
        out.sort();
        out
    }

    /// Drops deaths older than the window, and requests with nothing left.
    fn forget_old(&mut self, now: u64) {
        self.seen.retain(|_, e| {
            e.deaths.retain(|&(_, at)| now.saturating_sub(at) < DEATH_WINDOW_MS);
            !e.deaths.is_empty() || now < e.refused_until
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_safe_bodyless_requests_are_retried_and_only_once() {
        for m in [Method::GET, Method::HEAD, Method::OPTIONS] {
            assert_eq!(after_lost(&m, false, true), Lost::Retry, "{m}");
            assert_eq!(after_lost(&m, true, true), Lost::Fail, "{m} a second time");
        }
        for m in [Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
            assert_eq!(after_lost(&m, false, true), Lost::Fail, "{m} is never replayed");
        }
        assert_eq!(after_lost(&Method::GET, false, false), Lost::Fail, "a body cannot be sent twice");
    }

    #[test]
    fn two_deaths_within_a_minute_refuse_the_request_for_a_minute() {
        let mut d = Deaths::default();
        let k = key(&Method::GET, "/crash?x=1");
        assert!(!d.lost(&k, 1, 1_000));
        assert!(!d.refused(&k, 1_001));
        assert!(!d.lost(&k, 1, 2_000), "the same death seen by two requests counts once");
        assert!(d.lost(&k, 2, 30_000), "a second copy died with it in flight");
        assert!(d.refused(&k, 30_001));
        assert!(!d.refused(&key(&Method::GET, "/crash?x=2"), 30_001), "another query is another request");
        assert!(!d.refused(&key(&Method::HEAD, "/crash?x=1"), 30_001), "another method too");
        assert_eq!(d.refusing(40_000), vec![(k.clone(), 50_000)]);
        assert!(d.refused(&k, 30_000 + DEATH_WINDOW_MS - 1));
        assert!(!d.refused(&k, 30_000 + DEATH_WINDOW_MS), "a minute later it is tried again");
        assert!(d.refusing(30_000 + DEATH_WINDOW_MS).is_empty());
    }

    #[test]
    fn a_safe_request_is_refused_after_its_own_second_death_only() {
        let mut d = Deaths::default();
        let k = key(&Method::GET, "/");
        assert!(!d.refused(&k, 1_000));
        d.second_death(&k, 1_000);
        assert!(d.refused(&k, 1_001));
        assert!(!d.refused(&k, 1_000 + DEATH_WINDOW_MS), "a minute later it is tried again");
        assert!(d.is_empty() || d.refusing(1_000 + DEATH_WINDOW_MS).is_empty());
    }

    #[test]
    fn deaths_further_apart_than_a_minute_do_not_add_up() {
        let mut d = Deaths::default();
        let k = key(&Method::GET, "/");
        assert!(!d.lost(&k, 1, 1_000));
        assert!(!d.lost(&k, 2, 1_000 + DEATH_WINDOW_MS));
        assert!(!d.refused(&k, 1_000 + DEATH_WINDOW_MS + 1));
        d.lost("GET /other", 3, 10 * DEATH_WINDOW_MS);
        assert_eq!(d.seen.len(), 1, "old deaths are forgotten");
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let mut d = Deaths::default();
        for i in 0..(MAX_REMEMBERED + 10) {
            d.lost(&format!("GET /{i}"), 1, 5);
        }
        assert_eq!(d.seen.len(), MAX_REMEMBERED);
    }
}
