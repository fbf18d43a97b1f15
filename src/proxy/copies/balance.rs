//! Which copy a request goes to. Pure: the caller hands in what it knows
//! (each copy's role, whether it is known to be down, its open connections,
//! a round-robin counter and a random number) and gets an index back. No
//! clock, no socket, no lock.

use crate::wire::{LbPolicy, Role};

/// One copy as the balancer sees it, in table order (oldest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// How the daemon wants the copy treated.
    pub role: Role,
    /// It refused a connection since the table last named its process.
    pub down: bool,
    /// Requests in flight plus open WebSockets.
    pub connections: u64,
    /// Open Shiny sessions (WebSockets) plus visitors placed on it whose
    /// WebSocket has not opened yet: what counts toward `max-sessions`.
    pub sessions: u64,
    /// A request has waited too long for it with no answer since: it gets
    /// no new visitor while another copy can take one.
    pub stalled: bool,
    /// Unix ms of its last answer (0: none): when every copy is stalled, a
    /// new visitor goes to the one that answered most recently.
    pub last_answer_ms: u64,
}

/// Why a copy is being picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// A visitor without a copy: an active copy, else (none up) a warm one.
    NewVisitor,
    /// The visitor's copy is down: a warm copy stands in, else another
    /// active one.
    StandIn,
}

/// Picks the copy for a request among `copies` (table order), or `None`
/// when no copy may take it. Draining copies and copies known to be down
/// are never picked; stalled ones only when every other is stalled too,
/// and then the one that answered most recently. `rr` is the app's round-robin counter (the caller
/// advances it) and `random` any random number. The load balancer itself
/// calls [`pick_by`]; this form is for the tests.
#[cfg(test)]
pub fn pick(policy: LbPolicy, copies: &[Candidate], need: Need, rr: usize, random: u64) -> Option<usize> {
    pick_by(policy, copies.len(), |i| copies[i], need, rr, random)
}

/// [`pick`] over `len` copies described by `copy(i)`, so the caller need
/// not gather them into a slice first (no allocation per request).
pub fn pick_by(policy: LbPolicy, len: usize, copy: impl Fn(usize) -> Candidate, need: Need, rr: usize, random: u64) -> Option<usize> {
    let (first, second) = match need {
        Need::NewVisitor => (Role::Active, Role::Warm),
        Need::StandIn => (Role::Warm, Role::Active),
    };
    pick_role(policy, len, &copy, first, rr, random)
        .or_else(|| pick_role(policy, len, &copy, second, rr, random))
        .or_else(|| most_recent(len, &copy, first, second))
}

/// How an app with `max-sessions` grows, as the balancer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// The sessions that make a copy full.
    pub max_sessions: u64,
    /// The app has fewer active copies than `max-replicas`: it can grow.
    pub may_grow: bool,
}

/// Where a new visitor of an app with `max-sessions` goes (README,
/// "Capacity").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// To this copy: an active one with room (by the policy), or, every
    /// active one being full and no spare ready, the least full active one.
    Copy(usize),
    /// Every active copy is full: to this spare at once, and the daemon is
    /// told, so that it makes the spare active and starts another.
    Spare(usize),
    /// Every active copy is full and the app is at `max-replicas`: the
    /// visitor waits for a session to end.
    Hold,
}

/// Places a new visitor of an app with a `max-sessions` (`cap`): an active
/// copy with room, by the policy; else the spare with room; else, while the
/// app can grow, the least full active copy (over `max-sessions`: never held
/// while it can grow); else hold. `None` when no active copy is up at all:
/// then [`pick_by`] decides, as for any app (a spare stands in).
pub fn place(policy: LbPolicy, len: usize, copy: impl Fn(usize) -> Candidate, cap: Capacity, rr: usize, random: u64) -> Option<Placement> {
    let up = |c: &Candidate| !c.down && !c.stalled;
    if !(0..len).map(&copy).any(|c| c.role == Role::Active && up(&c)) {
        return None;
    }
    // A full copy is left out as if it were down.
    let with_room = |i: usize| {
        let mut c = copy(i);
        c.down |= c.sessions >= cap.max_sessions;
        c
    };
    if let Some(i) = pick_role(policy, len, &with_room, Role::Active, rr, random) {
        return Some(Placement::Copy(i));
    }
    if !cap.may_grow {
        return Some(Placement::Hold);
    }
    if let Some(i) = pick_role(LbPolicy::LeastConn, len, &with_room, Role::Warm, rr, random) {
        return Some(Placement::Spare(i));
    }
    let mut least: Option<(usize, u64)> = None;
    for (i, c) in (0..len).map(|i| (i, copy(i))) {
        if c.role == Role::Active && up(&c) && least.is_none_or(|(_, n)| c.sessions < n) {
            least = Some((i, c.sessions));
        }
    }
    least.map(|(i, _)| Placement::Copy(i))
}

/// For an app being deleted, whose copies all drain: the draining copy
/// (by the policy, among those up) for a request that reached it anyway,
/// one accepted as its port closed or on a connection kept open. Better
/// answered by a copy on its way out than held for one that will never come.
pub fn pick_leaving(policy: LbPolicy, len: usize, copy: impl Fn(usize) -> Candidate, rr: usize, random: u64) -> Option<usize> {
    let up = |i: usize| {
        let mut c = copy(i);
        // Stalled or not: there is no other copy to prefer.
        c.stalled = false;
        c
    };
    pick_role(policy, len, &up, Role::Draining, rr, random)
}

/// Among the stalled copies of either role that are up, the one that
/// answered most recently (ties: the older copy).
fn most_recent(len: usize, copy: &impl Fn(usize) -> Candidate, first: Role, second: Role) -> Option<usize> {
    let mut best: Option<(usize, u64)> = None;
    for i in 0..len {
        let c = copy(i);
        if c.down || (c.role != first && c.role != second) {
            continue;
        }
        if best.is_none_or(|(_, at)| c.last_answer_ms > at) {
            best = Some((i, c.last_answer_ms));
        }
    }
    best.map(|(i, _)| i)
}

/// Applies the policy to the copies of one role that are up.
fn pick_role(policy: LbPolicy, len: usize, copy: &impl Fn(usize) -> Candidate, role: Role, rr: usize, random: u64) -> Option<usize> {
    let usable = || (0..len).map(|i| (i, copy(i))).filter(|(_, c)| c.role == role && !c.down && !c.stalled);
    match policy {
        LbPolicy::First => usable().next().map(|(i, _)| i),
        LbPolicy::LeastConn => {
            let mut best: Option<(usize, u64)> = None;
            for (i, c) in usable() {
                // Strictly fewer: ties go to the older copy (earlier in the table).
                if best.is_none_or(|(_, n)| c.connections < n) {
                    best = Some((i, c.connections));
                }
            }
            best.map(|(i, _)| i)
        }
        LbPolicy::RoundRobin | LbPolicy::Random => {
            // Counting, then walking to the nth, keeps this free of allocation.
            let count = usable().count();
            if count == 0 {
                return None;
            }
            let n = match policy {
                LbPolicy::RoundRobin => rr % count,
                _ => (random % count as u64) as usize,
            };
            usable().nth(n).map(|(i, _)| i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_app_being_deleted_sends_what_reaches_it_to_a_draining_copy_that_is_up() {
        let copies = [c(Role::Draining, true, 0), c(Role::Draining, false, 3), c(Role::Draining, false, 1)];
        assert_eq!(pick(LbPolicy::LeastConn, &copies, Need::NewVisitor, 0, 0), None, "never to a new visitor otherwise");
        let leaving = |policy| pick_leaving(policy, copies.len(), |i| copies[i], 0, 0);
        assert_eq!(leaving(LbPolicy::LeastConn), Some(2));
        assert_eq!(leaving(LbPolicy::First), Some(1), "never the one that is down");
        assert_eq!(pick_leaving(LbPolicy::First, 1, |_| copies[0], 0, 0), None);
    }

    fn c(role: Role, down: bool, connections: u64) -> Candidate {
        Candidate { role, down, connections, sessions: connections, stalled: false, last_answer_ms: 0 }
    }

    fn stalled(role: Role, last_answer_ms: u64) -> Candidate {
        Candidate { role, down: false, connections: 0, sessions: 0, stalled: true, last_answer_ms }
    }

    /// Copies of `max` sessions each, growing or not.
    fn placed(copies: &[Candidate], max: u64, may_grow: bool, policy: LbPolicy) -> Option<Placement> {
        place(policy, copies.len(), |i| copies[i], Capacity { max_sessions: max, may_grow }, 0, 0)
    }

    #[test]
    fn a_new_visitor_goes_to_an_active_copy_with_room_by_the_policy() {
        let copies = [c(A, false, 10), c(A, false, 4), c(A, false, 7), c(W, false, 0)];
        assert_eq!(placed(&copies, 10, true, LbPolicy::LeastConn), Some(Placement::Copy(1)));
        assert_eq!(placed(&copies, 10, true, LbPolicy::First), Some(Placement::Copy(1)), "the first with room, not the first");
        let rr: Vec<_> =
            (0..4).map(|n| place(LbPolicy::RoundRobin, 4, |i| copies[i], Capacity { max_sessions: 10, may_grow: true }, n, 0)).collect();
        assert_eq!(rr, vec![Some(Placement::Copy(1)), Some(Placement::Copy(2)), Some(Placement::Copy(1)), Some(Placement::Copy(2))]);
    }

    #[test]
    fn when_every_active_copy_is_full_the_spare_takes_the_visitor_at_once() {
        let copies = [c(A, false, 10), c(A, false, 12), c(W, false, 0)];
        assert_eq!(placed(&copies, 10, true, LbPolicy::LeastConn), Some(Placement::Spare(2)));
        assert_eq!(placed(&copies, 10, true, LbPolicy::First), Some(Placement::Spare(2)));
    }

    #[test]
    fn with_no_spare_ready_the_least_full_active_copy_goes_over_max_sessions() {
        let copies = [c(A, false, 12), c(A, false, 10), c(W, true, 0), c(D, false, 0)];
        assert_eq!(placed(&copies, 10, true, LbPolicy::First), Some(Placement::Copy(1)), "never held while it can grow");
        let spare_full = [c(A, false, 11), c(A, false, 10), c(W, false, 10)];
        assert_eq!(placed(&spare_full, 10, true, LbPolicy::LeastConn), Some(Placement::Copy(1)));
    }

    #[test]
    fn at_max_replicas_with_every_active_copy_full_the_visitor_is_held() {
        let copies = [c(A, false, 10), c(A, false, 10), c(W, false, 0)];
        assert_eq!(placed(&copies, 10, false, LbPolicy::LeastConn), Some(Placement::Hold), "the spare stays a spare");
        let one_left = [c(A, false, 10), c(A, false, 9)];
        assert_eq!(placed(&one_left, 10, false, LbPolicy::LeastConn), Some(Placement::Copy(1)));
    }

    #[test]
    fn with_no_active_copy_up_placing_leaves_it_to_the_stand_in() {
        let copies = [c(A, true, 0), Candidate { stalled: true, ..c(A, false, 0) }, c(W, false, 0)];
        assert_eq!(placed(&copies, 10, false, LbPolicy::LeastConn), None);
    }

    #[test]
    fn a_stalled_copy_gets_no_new_visitor_while_another_answers() {
        let copies = [stalled(A, 900), c(A, false, 50), c(W, false, 0)];
        for policy in [LbPolicy::LeastConn, LbPolicy::RoundRobin, LbPolicy::Random, LbPolicy::First] {
            for n in 0..4 {
                assert_eq!(pick(policy, &copies, Need::NewVisitor, n, n as u64), Some(1), "{policy:?}");
            }
        }
        let only_warm = [stalled(A, 900), stalled(A, 800), c(W, false, 0)];
        assert_eq!(pick(LbPolicy::LeastConn, &only_warm, Need::NewVisitor, 0, 0), Some(2), "the warm copy before a stalled active one");
    }

    #[test]
    fn when_every_copy_is_stalled_the_one_that_answered_last_gets_the_visitor() {
        let copies = [stalled(A, 900), stalled(A, 1200), stalled(W, 1100), c(D, false, 0)];
        assert_eq!(pick(LbPolicy::LeastConn, &copies, Need::NewVisitor, 0, 0), Some(1));
        assert_eq!(pick(LbPolicy::First, &copies, Need::StandIn, 0, 0), Some(1));
        let with_down = [Candidate { down: true, ..stalled(A, 5000) }, stalled(W, 10)];
        assert_eq!(pick(LbPolicy::LeastConn, &with_down, Need::NewVisitor, 0, 0), Some(1), "a copy down is never picked");
        let draining = [stalled(D, 5000)];
        assert_eq!(pick(LbPolicy::LeastConn, &draining, Need::NewVisitor, 0, 0), None, "nor a draining one");
    }

    const A: Role = Role::Active;
    const W: Role = Role::Warm;
    const D: Role = Role::Draining;

    #[test]
    fn least_conn_takes_the_fewest_and_ties_go_to_the_oldest() {
        let copies = [c(A, false, 3), c(A, false, 1), c(A, false, 1), c(W, false, 0)];
        assert_eq!(pick(LbPolicy::LeastConn, &copies, Need::NewVisitor, 0, 0), Some(1));
        let tied = [c(A, false, 2), c(A, false, 2)];
        assert_eq!(pick(LbPolicy::LeastConn, &tied, Need::NewVisitor, 7, 9), Some(0));
    }

    #[test]
    fn round_robin_walks_the_active_copies_in_turn() {
        let copies = [c(A, false, 0), c(W, false, 0), c(A, false, 5), c(D, false, 0), c(A, false, 0)];
        let picked: Vec<_> = (0..6).map(|rr| pick(LbPolicy::RoundRobin, &copies, Need::NewVisitor, rr, 0).unwrap()).collect();
        assert_eq!(picked, vec![0, 2, 4, 0, 2, 4]);
    }

    #[test]
    fn random_stays_among_active_copies() {
        let copies = [c(W, false, 0), c(A, false, 0), c(D, false, 0), c(A, false, 0)];
        for r in 0..20u64 {
            let i = pick(LbPolicy::Random, &copies, Need::NewVisitor, 0, r).unwrap();
            assert!(i == 1 || i == 3, "picked {i}");
        }
        assert_eq!(pick(LbPolicy::Random, &copies, Need::NewVisitor, 0, 0), Some(1));
        assert_eq!(pick(LbPolicy::Random, &copies, Need::NewVisitor, 0, 1), Some(3));
    }

    #[test]
    fn first_is_always_the_oldest_active_copy() {
        let copies = [c(D, false, 0), c(W, false, 0), c(A, false, 9), c(A, false, 0)];
        for rr in 0..4 {
            assert_eq!(pick(LbPolicy::First, &copies, Need::NewVisitor, rr, rr as u64), Some(2));
        }
    }

    #[test]
    fn down_copies_are_skipped() {
        let copies = [c(A, true, 0), c(A, false, 4)];
        for policy in [LbPolicy::LeastConn, LbPolicy::RoundRobin, LbPolicy::Random, LbPolicy::First] {
            for n in 0..4 {
                assert_eq!(pick(policy, &copies, Need::NewVisitor, n, n as u64), Some(1), "{policy:?}");
            }
        }
    }

    #[test]
    fn a_warm_copy_takes_new_visitors_only_when_no_active_copy_is_up() {
        let copies = [c(A, true, 0), c(W, false, 0), c(D, false, 0)];
        for policy in [LbPolicy::LeastConn, LbPolicy::RoundRobin, LbPolicy::Random, LbPolicy::First] {
            assert_eq!(pick(policy, &copies, Need::NewVisitor, 3, 5), Some(1), "{policy:?}");
        }
        let up = [c(A, false, 100), c(W, false, 0)];
        assert_eq!(pick(LbPolicy::LeastConn, &up, Need::NewVisitor, 0, 0), Some(0));
    }

    #[test]
    fn the_stand_in_is_a_warm_copy_first_then_another_active() {
        let copies = [c(A, true, 0), c(A, false, 0), c(W, false, 7)];
        assert_eq!(pick(LbPolicy::LeastConn, &copies, Need::StandIn, 0, 0), Some(2));
        let warm_down = [c(A, true, 0), c(A, false, 0), c(W, true, 0)];
        assert_eq!(pick(LbPolicy::LeastConn, &warm_down, Need::StandIn, 0, 0), Some(1));
        let two_warm = [c(A, true, 0), c(W, false, 2), c(W, false, 1)];
        assert_eq!(pick(LbPolicy::LeastConn, &two_warm, Need::StandIn, 0, 0), Some(2));
        assert_eq!(pick(LbPolicy::First, &two_warm, Need::StandIn, 0, 0), Some(1));
    }

    #[test]
    fn draining_copies_never_get_new_visitors() {
        let copies = [c(D, false, 0), c(D, false, 0)];
        for policy in [LbPolicy::LeastConn, LbPolicy::RoundRobin, LbPolicy::Random, LbPolicy::First] {
            assert_eq!(pick(policy, &copies, Need::NewVisitor, 0, 0), None);
            assert_eq!(pick(policy, &copies, Need::StandIn, 0, 0), None);
        }
        assert_eq!(pick(LbPolicy::LeastConn, &[], Need::NewVisitor, 0, 0), None);
    }
}
