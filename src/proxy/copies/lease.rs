//! The [`Lease`] a copy's answer holds: counted against the copy until the
//! body is read to the end, when its connection goes back to the pool.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::proxy::copies::copy_conn::CopyConn;
use crate::proxy::copies::copy_state::CopyState;

/// A request counted against a copy until its answer is read to the end;
/// then its connection goes back to the pool.
pub struct Lease {
    /// The copy's counters and pool.
    state: Arc<CopyState>,
}

impl Lease {
    /// Counts a request against the copy `state` belongs to.
    pub fn new(state: Arc<CopyState>) -> Lease {
        state.connections.fetch_add(1, Ordering::Relaxed);
        Lease { state }
    }

    /// The answer was read to the end: its connection, when the copy keeps
    /// it open, may serve another.
    pub fn finish(self, conn: Option<CopyConn>) {
        if let Some(c) = conn {
            self.state.pool.put(c);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.state.connections.fetch_sub(1, Ordering::Relaxed);
    }
}
