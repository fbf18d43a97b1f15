//! What the load balancer learns itself about one copy's process (its
//! open connections and sessions, when it refused or went silent), shared
//! by every table that names the same process on the same port.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::proxy::copies::idle_connections::Pool;
use crate::proxy::workers::{worker_index, WORKERS};

/// A copy marked down is tried again after this long even if the table
/// did not change, so a copy that refused once by mistake comes back by
/// itself (the cost of a wrong guess is one refused connect).
pub const DOWN_FOR_MS: u64 = 10_000;

/// A copy that has had a request waiting this long without answering
/// anything is stalled: it keeps its visitors but gets no new ones.
pub const STALL_AFTER_MS: u64 = 5_000;

/// What the load balancer knows about one copy's process, shared by every
/// table that names the same process on the same port.
#[derive(Default)]
pub struct CopyState {
    /// Requests in flight plus open WebSockets.
    pub connections: AtomicU64,
    /// Open WebSockets.
    pub sessions: AtomicU64,
    /// Unix ms when the copy last refused a connection (0: never). It gets
    /// no visitor until a table names another process or port for it, or
    /// [`DOWN_FOR_MS`] passes.
    pub down_at_ms: AtomicU64,
    /// Idle keep-alive connections to the copy.
    pub pool: Pool,
    /// Requests sent and not yet answered (not counting those abandoned).
    pub pending: AtomicU64,
    /// [`crate::sys::clock::mono_ms`] since when a request has been waiting for the copy's answer
    /// (0: none waits). A request abandoned unanswered leaves it set, until
    /// the copy answers something (another request, or the probe).
    pub waiting_since_ms: AtomicU64,
    /// [`crate::sys::clock::mono_ms`] of the copy's last answer (its first
    /// byte), 0 if none.
    pub last_answer_ms: AtomicU64,
    /// A probe is asking the stalled copy whether it answers again.
    pub probing: AtomicBool,
    /// Warm-up requests were sent to it as a spare (`warm.rs`), or are
    /// under way.
    pub warmed: AtomicBool,
    /// Its process has exited or begun to (`liveness.rs`): down for good,
    /// so no visitor is sent to whatever listens on its port next, even
    /// while the daemon is away and no new table comes. Set by
    /// [`CopyState::mark_gone`].
    pub gone: AtomicBool,
    /// Wakes the requests waiting for the copy's answer once it is gone
    /// ([`CopyState::gone_now`]): one per worker, as a request waits on
    /// its own worker's, so the lock every request takes to wait is never
    /// one the other worker takes too.
    gone_now: [tokio::sync::Notify; WORKERS],
    /// A watcher of its process runs.
    pub watched: AtomicBool,
    /// Told when it first answers ([`CopyState::heard`]): the watcher of
    /// its process looks for threads then (`liveness.rs`).
    pub first_answer: tokio::sync::Notify,
    /// When visitors were placed on it ([`crate::sys::clock::mono_ms`]), oldest
    /// first, whose WebSocket has not opened yet, with the address each came
    /// from (none: through a trusted proxy): each counts toward
    /// `max-sessions` until then, or for [`PLACED_FOR_MS`].
    placements: std::sync::Mutex<std::collections::VecDeque<(u64, Option<std::net::IpAddr>)>>,
    /// How many `placements` holds, so a copy with none (every copy of an
    /// app without `max-sessions`) is looked at without the lock.
    placed_len: AtomicU64,
}

/// A visitor placed on a copy counts toward its `max-sessions` this long at
/// most, if its WebSocket never opens (a page that is not Shiny's, a visitor
/// who left).
pub const PLACED_FOR_MS: u64 = 30_000;

/// The placements one address may hold on a copy at once: more page loads
/// from it, with no WebSocket opened, are served but not counted, so one
/// client sending cookieless requests cannot fill every copy's
/// `max-sessions` and hold every other visitor out. Visitors through a
/// trusted proxy share its address and are not so limited.
pub const PLACED_PER_ADDRESS: usize = 2;

impl CopyState {
    /// A new visitor was placed on the copy at `now` (mono ms), from
    /// address `from` (none: through a trusted proxy).
    pub fn place(&self, now: u64, from: Option<std::net::IpAddr>) {
        let mut p = self.placements.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut p, now);
        if from.is_some() && p.iter().filter(|(_, f)| *f == from).count() >= PLACED_PER_ADDRESS {
            return;
        }
        p.push_back((now, from));
        self.placed_len.store(p.len() as u64, Ordering::Relaxed);
    }

    /// The visitors placed on the copy that still count at `now`.
    pub fn placed(&self, now: u64) -> u64 {
        if self.placed_len.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let mut p = self.placements.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut p, now);
        self.placed_len.store(p.len() as u64, Ordering::Relaxed);
        p.len() as u64
    }

    /// A WebSocket opened on the copy: the oldest placement is now a
    /// session, counted as one.
    pub fn session_opened(&self) {
        let mut p = self.placements.lock().unwrap_or_else(|e| e.into_inner());
        p.pop_front();
        self.placed_len.store(p.len() as u64, Ordering::Relaxed);
    }
}

/// Drops the placements older than [`PLACED_FOR_MS`] at `now`.
fn expire(p: &mut std::collections::VecDeque<(u64, Option<std::net::IpAddr>)>, now: u64) {
    while p.front().is_some_and(|&(t, _)| now.saturating_sub(t) >= PLACED_FOR_MS) {
        p.pop_front();
    }
}

impl CopyState {
    /// The copy's process has exited or begun to: no visitor is sent to it
    /// again, and the requests waiting for its answer are woken to go to
    /// another copy. A process on its way out answers nothing more, yet its
    /// sockets close only once the kernel has freed its memory (R with
    /// shiny: 13-30 ms), or never while a child it forked holds them.
    pub fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
        for n in &self.gone_now {
            n.notify_waiters();
        }
    }

    /// Returns once the copy is gone ([`CopyState::mark_gone`]), at once if
    /// it is.
    pub async fn gone_now(&self) {
        let notified = self.gone_now[worker_index() % WORKERS].notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the flag is read, so a mark between the two
        // still wakes it.
        notified.as_mut().enable();
        if self.gone.load(Ordering::SeqCst) {
            return;
        }
        notified.await;
    }

    /// True while the copy is marked down at unix ms `now`, or its process
    /// is gone.
    pub fn is_down(&self, now: u64) -> bool {
        self.gone.load(Ordering::Relaxed) || is_down(self.down_at_ms.load(Ordering::Relaxed), now)
    }

    /// Marks the copy down at `now`; true when it was not down already (so
    /// the caller is the one to report it).
    pub fn mark_down(&self, now: u64) -> bool {
        !is_down(self.down_at_ms.swap(now, Ordering::Relaxed), now)
    }
}

impl CopyState {
    /// A request is about to be sent at `now` ([`crate::sys::clock::mono_ms`],
    /// as for every time below).
    /// True when it started the waiting clock (nothing was waiting).
    pub fn sent(&self, now: u64) -> bool {
        self.pending.fetch_add(1, Ordering::Relaxed);
        // Looked at before the swap: both workers write these lines on every
        // request, and a read does not take the line from the other core.
        self.waiting_since_ms.load(Ordering::Relaxed) == 0
            && self.waiting_since_ms.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// A request counted by [`CopyState::sent`] was never written after all
    /// (its connection had closed): uncounted, and the clock it `started`
    /// is stopped when nothing else waits, so the copy is not thought silent.
    pub fn unsent(&self, started: bool) {
        let left = self.pending.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        if started && left == 0 {
            self.waiting_since_ms.store(0, Ordering::Relaxed);
        }
    }

    /// A request sent is done with: `answered` (its first byte came at
    /// `now`) or not (it failed or was abandoned).
    pub fn done(&self, answered: bool, now: u64) {
        let left = self.pending.fetch_sub(1, Ordering::Relaxed).saturating_sub(1);
        if answered {
            self.heard(now, left);
        }
    }

    /// The copy answered at `now` with `left` requests still
    /// waiting: they count from now. Its first answer is told to the
    /// watcher of its process.
    pub fn heard(&self, now: u64, left: u64) {
        // Written only when they change (at most once a millisecond), as in
        // `sent`.
        if self.last_answer_ms.load(Ordering::Relaxed) < now && self.last_answer_ms.fetch_max(now, Ordering::Relaxed) == 0 {
            self.first_answer.notify_one();
        }
        let since = if left == 0 { 0 } else { now };
        if self.waiting_since_ms.load(Ordering::Relaxed) != since {
            self.waiting_since_ms.store(since, Ordering::Relaxed);
        }
    }

    /// How long, at `now`, a request has waited for the copy with
    /// no answer from it since (0: nothing waits).
    pub fn silent_ms(&self, now: u64) -> u64 {
        match self.waiting_since_ms.load(Ordering::Relaxed) {
            0 => 0,
            since => now.saturating_sub(since.max(self.last_answer_ms.load(Ordering::Relaxed))),
        }
    }
}

/// True while a copy marked down at `down_at` (0: never) stays down.
fn is_down(down_at: u64, now: u64) -> bool {
    down_at != 0 && now.saturating_sub(down_at) < DOWN_FOR_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_two_placements_a_trusted_proxy_any() {
        let c = CopyState::default();
        let (a, b): (std::net::IpAddr, std::net::IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for _ in 0..5 {
            c.place(1_000, Some(a));
        }
        assert_eq!(c.placed(1_000), 2, "five cookieless loads from one address count as two");
        c.place(1_000, Some(b));
        assert_eq!(c.placed(1_000), 3, "another address counts");
        for _ in 0..3 {
            c.place(1_000, None);
        }
        assert_eq!(c.placed(1_000), 6, "visitors through a trusted proxy all count");
        assert_eq!(c.placed(1_000 + PLACED_FOR_MS), 0, "and each for 30 s at most");
        c.place(1_000 + PLACED_FOR_MS, Some(a));
        assert_eq!(c.placed(1_000 + PLACED_FOR_MS), 1, "the address may be placed again once its placements went");
    }

    #[test]
    fn a_copy_is_silent_while_a_request_waits_unanswered() {
        let c = CopyState::default();
        assert_eq!(c.silent_ms(1_000), 0, "nothing sent");
        assert!(c.sent(1_000));
        assert!(!c.sent(2_000), "the clock runs from the first");
        assert_eq!(c.silent_ms(7_000), 6_000);
        c.done(true, 7_000);
        assert_eq!(c.silent_ms(9_000), 2_000, "the other one waits, counted from the last answer");
        c.done(true, 9_500);
        assert_eq!(c.silent_ms(20_000), 0, "all answered");
        let started = c.sent(30_000);
        c.unsent(started);
        assert_eq!(c.silent_ms(40_000), 0, "a request never written leaves no silence");
        c.sent(50_000);
        c.done(false, 51_000);
        assert_eq!(c.silent_ms(56_000), 6_000, "one abandoned unanswered keeps it suspect until it answers");
        c.heard(57_000, 0);
        assert_eq!(c.silent_ms(60_000), 0, "the probe's answer clears it");
    }

    #[tokio::test]
    async fn a_request_waiting_on_a_copy_is_woken_when_it_is_gone() {
        let c = std::sync::Arc::new(CopyState::default());
        let waiting = tokio::spawn({
            let c = c.clone();
            async move { c.gone_now().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "nothing is gone yet");
        c.mark_gone();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await.expect("woken").unwrap();
        assert!(c.is_down(0));
        // One that starts waiting after the mark returns at once.
        tokio::time::timeout(std::time::Duration::from_secs(5), c.gone_now()).await.expect("at once");
    }

    #[test]
    fn a_mark_down_expires() {
        assert!(!is_down(0, 5));
        assert!(is_down(1000, 1000 + DOWN_FOR_MS - 1));
        assert!(!is_down(1000, 1000 + DOWN_FOR_MS));
        assert!(is_down(1000, 999));
    }
}
