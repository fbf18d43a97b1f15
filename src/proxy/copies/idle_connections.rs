//! The idle keep-alive connections to each copy ([`Pool`]), as pingora
//! keeps its connection pool apart from picking a copy and from the
//! proxying itself.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::proxy::copies::copy_conn::CopyConn;
use crate::proxy::workers::{worker_index, WORKERS};

/// Idle connections kept per copy.
const POOL_MAX: usize = 256;
/// An idle connection to a copy unused this long is closed: it holds a
/// descriptor on both sides, and a copy may have forgotten it.
pub const POOL_IDLE: Duration = Duration::from_secs(30);

/// Idle keep-alive connections to one copy, one list per worker: a
/// connection's socket is registered with the runtime of the worker that
/// opened it, whose thread hears its events, so a request reuses only its
/// own worker's (the lock is then never contended).
#[derive(Default)]
pub struct Pool {
    /// Per worker, most recently used last, each with when it was put back.
    idle: [Mutex<Vec<(CopyConn, Instant)>>; WORKERS],
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Vec<(CopyConn, Instant)>> {
        self.idle[worker_index() % WORKERS].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recently used connection still open.
    pub fn take(&self) -> Option<CopyConn> {
        let mut idle = self.lock();
        while let Some((c, since)) = idle.pop() {
            if c.still_open() && since.elapsed() < POOL_IDLE {
                return Some(c);
            }
        }
        None
    }

    /// Keeps a connection whose last answer was read to the end.
    pub fn put(&self, c: CopyConn) {
        let mut idle = self.lock();
        if idle.len() < POOL_MAX {
            idle.push((c, Instant::now()));
        }
    }

    /// Closes the connections idle for [`POOL_IDLE`] or more, and those the
    /// copy closed; returns how many are left.
    pub fn expire(&self) -> usize {
        let mut left = 0;
        for idle in &self.idle {
            let mut idle = idle.lock().unwrap_or_else(|e| e.into_inner());
            // Oldest first: the expired ones are a prefix, but a closed one
            // may be anywhere.
            idle.retain(|(c, since)| c.still_open() && since.elapsed() < POOL_IDLE);
            left += idle.len();
        }
        left
    }

    /// Drops every idle connection (the copy just failed one: the others
    /// are likely dead too).
    pub fn clear(&self) {
        for idle in &self.idle {
            let dropped = std::mem::take(&mut *idle.lock().unwrap_or_else(|e| e.into_inner()));
            drop(dropped);
        }
    }
}
