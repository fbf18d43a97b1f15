//! The worker threads that serve visitors' connections, and which worker
//! the running code is on (each keeps its own idle connections to copies).

use std::io;
use std::sync::atomic::AtomicUsize;

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

impl Worker {
    /// The running tokio runtime as the one worker: an in-process load
    /// balancer serves its visitors there.
    pub fn current() -> Worker {
        Worker { handle: tokio::runtime::Handle::current(), open: AtomicUsize::new(0) }
    }
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
