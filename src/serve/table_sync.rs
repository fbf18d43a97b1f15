//! What the daemon says agrees with what the load balancer routes by.
//!
//! A cycle records a copy's new role under the daemon's lock; the table
//! that routes visitors by it reaches the load balancer a moment later,
//! after the lock is released (the launchers run and the sockets are synced
//! first). `status`, and the rollout a deploy's `--wait` follows, read the
//! recorded state: without this, `apply --wait` could return "serves" and
//! the next request still reach the version before, and a test that waits
//! for `1:active` could send its first request while the load balancer
//! still named copy 2. So those answers wait, briefly, until the table of
//! the state they read has been pushed.

use std::time::Duration;

use tokio::sync::watch;

use super::{Daemon, Shared};
use crate::wire::ProxyTable;

/// How long an answer waits for the push of the table of what it reads:
/// one loop turn's launches and push, with room for a loaded machine. An
/// answer past it is given as it is (a load balancer that cannot be reached
/// is reported on its own).
const PUSH_WAIT: Duration = Duration::from_secs(3);

/// The copies table's generations: a new one each time a cycle's table
/// differs from the one before, and the newest one pushed.
pub struct TableGenerations {
    /// A digest of the last table a cycle made (SHA-256 of its JSON): enough
    /// to tell a new table from the same one again, without keeping a second
    /// copy of the table beside the one `ProxyCtl` pushed.
    last: Option<[u8; 32]>,
    /// Its generation.
    made: u64,
    /// The newest generation the loop has pushed (or tried to: a failed
    /// push does not hold answers back).
    pushed: watch::Sender<u64>,
}

impl Default for TableGenerations {
    fn default() -> Self {
        TableGenerations { last: None, made: 0, pushed: watch::Sender::new(0) }
    }
}

impl TableGenerations {
    /// Notes the table a cycle made; returns its generation, to be passed
    /// to [`TableGenerations::pushed`] once the push is done.
    pub fn made(&mut self, table: &ProxyTable) -> u64 {
        let digest = digest(table);
        if digest.is_none() || self.last != digest {
            self.made += 1;
            self.last = digest;
        }
        self.made
    }

    /// The loop pushed the table of generation `generation`.
    pub fn pushed(&self, generation: u64) {
        self.pushed.send_if_modified(|g| {
            let newer = generation > *g;
            *g = (*g).max(generation);
            newer
        });
    }

    /// True when the daemon's `table` now differs from the last one a
    /// cycle made: the next cycle makes a new generation.
    fn would_change(&self, table: &ProxyTable) -> bool {
        let digest = digest(table);
        digest.is_none() || self.last != digest
    }

    /// True when the newest table made has been pushed.
    fn settled(&self) -> bool {
        *self.pushed.borrow() >= self.made
    }
}

/// SHA-256 of the table as it is pushed (JSON); none for a table that
/// cannot be written as JSON (none can: it is plain data), which then
/// counts as new each time.
fn digest(table: &ProxyTable) -> Option<[u8; 32]> {
    use sha2::Digest;
    serde_json::to_vec(table).ok().map(|bytes| sha2::Sha256::digest(&bytes).into())
}

impl Shared {
    /// `read` of the daemon, taken once the load balancer has the table of
    /// the state it read (or after [`PUSH_WAIT`]). The lock is not held
    /// while waiting.
    pub async fn read_as_pushed<T>(&self, mut read: impl FnMut(&mut Daemon) -> T) -> T {
        let deadline = tokio::time::Instant::now() + PUSH_WAIT;
        loop {
            let (value, want, mut pushed) = {
                let mut d = self.lock();
                let value = read(&mut d);
                if d.table_generations.settled() {
                    return value;
                }
                (value, d.table_generations.made, d.table_generations.pushed.subscribe())
            };
            let waited = tokio::time::timeout_at(deadline, pushed.wait_for(|g| *g >= want)).await;
            if !matches!(waited, Ok(Ok(_))) {
                return value;
            }
            // Pushed: read again, since a cycle may have run meanwhile.
        }
    }

    /// Runs `change` under the lock (an operator's command: `stop`, `start`,
    /// `delete`) and answers once the load balancer has a table made after
    /// it, or after [`PUSH_WAIT`]: `shinyctl stop hello && curl …` gets the
    /// stopped page, not the app. A change that leaves the table as it was
    /// (an app already stopped, an error) answers at once. The lock is not
    /// held while waiting.
    pub async fn change_then_push<T>(&self, change: impl FnOnce(&mut Daemon) -> T) -> T {
        let (value, wait) = {
            let mut d = self.lock();
            let made = d.table_generations.made;
            let value = change(&mut d);
            let table = d.table();
            let wait = d.table_generations.would_change(&table).then(|| (made, d.table_generations.pushed.subscribe()));
            (value, wait)
        };
        if let Some((made, mut pushed)) = wait {
            let _ = tokio::time::timeout(PUSH_WAIT, pushed.wait_for(|g| *g > made)).await;
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{LbPolicy, ProxyApp};

    fn table(app: &str) -> ProxyTable {
        ProxyTable { apps: vec![ProxyApp::for_tests(app, LbPolicy::default(), Vec::new())] }
    }

    #[test]
    fn a_new_table_waits_for_its_push_and_the_same_one_again_does_not() {
        let mut g = TableGenerations::default();
        assert!(g.settled());
        assert_eq!(g.made(&table("a")), 1);
        assert!(!g.settled(), "made, not yet pushed");
        assert_eq!(g.made(&table("a")), 1, "the same table again");
        g.pushed(1);
        assert!(g.settled());
        assert_eq!(g.made(&table("a")), 1);
        assert!(g.settled(), "nothing new to wait for");
        assert_eq!(g.made(&table("b")), 2);
        assert!(!g.settled());
    }

    #[test]
    fn an_older_push_does_not_undo_a_newer_one() {
        let mut g = TableGenerations::default();
        g.made(&table("a"));
        g.made(&table("b"));
        g.pushed(2);
        g.pushed(1);
        assert!(g.settled());
    }
}
