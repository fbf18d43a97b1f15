//! The [`Lease`] a copy's answer holds: counted against the copy until the
//! body is read to the end, when its connection goes back to the pool.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::proxy::copies::copy_state::CopyState;
use crate::proxy::copies::idle_connections::Sender;

/// A request counted against a copy until its answer is read to the end;
/// then its connection goes back to the pool.
pub struct Lease {
    /// The copy's counters and pool.
    state: Arc<CopyState>,
    /// The connection, when it may be reused.
    pub sender: Option<Sender>,
}

impl Lease {
    /// Counts a request against the copy `state` belongs to.
    pub fn new(state: Arc<CopyState>) -> Lease {
        state.connections.fetch_add(1, Ordering::Relaxed);
        Lease { state, sender: None }
    }

    /// The answer was read to the end: the connection may serve another.
    pub fn finish(mut self) {
        if let Some(s) = self.sender.take() {
            self.state.pool.put(s);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.state.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
