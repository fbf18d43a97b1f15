//! What every connection of the load balancer shares: the table, the
//! settings visitors' connections are served with, the stop signal, and the
//! worker threads that serve them.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::sync::watch;

use super::daemon::DaemonLink;
use super::{cookie, table};

/// Which side of the load balancer an error came from, for the logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// A copy (connect, send, its answer).
    Upstream,
    /// A visitor (its connection, its request).
    Downstream,
}

impl std::fmt::Display for ErrorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ErrorSource::Upstream => "upstream",
            ErrorSource::Downstream => "downstream",
        })
    }
}

/// What every connection of the load balancer shares.
pub struct Shared {
    /// Where stand-ins are reported and wakes asked for.
    pub daemon: DaemonLink,
    /// The sticky cookie's HMAC key.
    pub key: [u8; cookie::KEY_LEN],
    /// The live copies table.
    pub table: table::LiveTable,
    /// How visitors' connections are served (timeouts, limits).
    pub http: hyper::server::conn::http1::Builder,
    /// Turns true once the load balancer stops.
    pub shutdown: watch::Sender<bool>,
    /// The same, read on every answer (cheaper than the channel): answers
    /// then carry `Connection: close`.
    pub stopping: AtomicBool,
    /// The threads that serve visitors' connections.
    pub workers: Vec<Worker>,
}

impl Shared {
    /// Visitors' connections being served, on all workers.
    pub fn open(&self) -> usize {
        self.workers.iter().map(|w| w.open.load(Ordering::Relaxed)).sum()
    }
}

/// Threads serving visitors. Each runs a single-threaded runtime, and a
/// connection lives on one worker with everything it causes (its
/// requests, the connections to copies, their answers), so no request
/// wakes another thread: in `bench/proxy.sh` this took about a fifth less
/// CPU per request than a work-stealing runtime.
pub const WORKERS: usize = 2;

/// One worker thread.
pub struct Worker {
    /// Where its connections are spawned.
    pub handle: tokio::runtime::Handle,
    /// Visitors' connections it serves; a new one goes to the worker with
    /// the fewest.
    pub open: AtomicUsize,
}

thread_local! {
    /// The index of the worker this thread is (0 on other threads).
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The index of the worker running the caller, so each worker keeps its
/// own idle connections to copies.
pub fn worker_index() -> usize {
    WORKER.with(|w| w.get())
}

/// Starts worker `index` on a thread of its own.
pub fn start_worker(index: usize) -> io::Result<Worker> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let handle = rt.handle().clone();
    std::thread::Builder::new().name(format!("proxy-{index}")).spawn(move || {
        WORKER.with(|w| w.set(index));
        // Serves whatever is spawned on it until the process exits.
        rt.block_on(std::future::pending::<()>());
    })?;
    Ok(Worker { handle, open: AtomicUsize::new(0) })
}
