//! The daemon, `shinyctl serve` (shinyctl-api). For each app, every 5 s and
//! at once on any event, it runs the cycle: observe, decide, record, push,
//! act. Only the daemon writes state (`state.json`, `registry.json`,
//! `proxy/table.json`).
//!
//! - `event_loop`: `run`, and the loop that decides which apps are due.
//! - `cycle`: one app's cycle, the table push, answering wakes.
//! - `app`: an app in three parts: `Recorded`, `Tracked`, `Wake`.
//! - `act`: starting, stopping and watching processes.
//! - `record`: the files (state.json, registry.json, the lock, log rotation).
//! - `api`: the routes on `api.sock`, the one place outcomes become HTTP
//!   replies; `status`: what `status` shows (`status_view` and the views).
//! - `deploy`: apply, restart and rollback, which take and record releases.
//! - `operate`: the operator's commands, as `Daemon`'s intent methods.
//! - `error`: `Done` and `ServeError`, what the commands answer.
//!
//! The state is one [`Daemon`] behind [`Shared`], a `std::sync::Mutex`:
//! its guard is not `Send`, so no task holds it across an `.await`.
//! - `proxy_ctl`: the load balancer, from the daemon's side.
//! - `sockets`: the apps' listening sockets, which the daemon holds.
//! - `detach`: `serve -d`.
//! - `table_sync`: status and a deploy's progress wait for the push of
//!   the table of the state they read.

mod api;
mod app;
mod copies;
mod deploys;
mod detach;
mod error;
mod event_loop;
mod notify;
mod proxy_ctl;
mod reply;
mod state_files;
mod table_sync;
#[cfg(test)]
mod upgrade_tests;
mod views;
mod watches;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::home::Home;
use crate::manifest::AppSpec;
use crate::wire::{CopyTraffic, Exit, Refusing};
pub use copies::stops::{PendingStop, STOP_WAITS_FOR_ANSWERS_MS, STOP_WAITS_FOR_PUSH_MS};

pub use app::{AppRt, Recorded, Tracked, Wake};
pub use copies::act::now_ms;
pub use copies::tallies::{RestartReason, Tallies};
pub use detach::detach;
pub use event_loop::run;

/// How often the cycle runs when nothing happens.
pub const TICK: Duration = Duration::from_secs(5);
pub use crate::wire::launch::LOG_ROTATE_BYTES;

/// Something happened: the cycle runs at once for the app it names.
#[derive(Debug)]
pub enum Event {
    /// A command changed the app (apply, restart, delete).
    Changed {
        /// The app.
        app: String,
    },
    /// A watched process ended.
    Exit {
        /// The app it belongs to.
        app: String,
        /// Its PID.
        pid: u32,
        /// How it ended.
        exit: Exit,
    },
    /// A copy's port answers from its own socket.
    Ready {
        /// The app.
        app: String,
        /// The copy's process.
        pid: u32,
        /// When (Unix ms) its init said R listens, if it did.
        listening_ms: Option<u64>,
        /// Its R process, from its launcher's report.
        r_pid: Option<u32>,
        /// When (Unix ms) its R started, from the same report.
        r_started_ms: Option<u64>,
    },
    /// The load balancer saw a copy refuse a connection.
    StandIn {
        /// The app.
        app: String,
        /// The copy that refused, if one did.
        down: Option<u32>,
        /// Every active copy was full: the app grows (README, "Capacity").
        full: bool,
    },
    /// The load balancer's process ended.
    ProxyExit,
    /// `shinyctl shutdown`: the loop ends (see [`Daemon::shutting_down`]).
    Shutdown,
}

/// Everything the daemon holds, behind one lock ([`Shared`]). Its fields
/// are private to `serve`; the API changes it only through intent methods
/// (`apply`, `delete`, `stop_app`, `ask_wake`, `status_view` …).
pub struct Daemon {
    /// The home folder.
    home: Home,
    /// Every app, by name.
    apps: BTreeMap<String, AppRt>,
    /// Where events go.
    events: mpsc::UnboundedSender<Event>,
    /// The load balancer's PID as the event loop last knew it (the loop
    /// alone holds `proxy_ctl::ProxyCtl` and talks to the load balancer,
    /// with this lock released).
    proxy_pid: Option<u32>,
    /// The last traffic figures from the load balancer, by app then copy.
    traffic: HashMap<String, HashMap<u32, CopyTraffic>>,
    /// The load balancer's figures were read at least once since this
    /// daemon started: before, `traffic` is empty for want of them, not
    /// because no visitor is connected.
    traffic_heard: bool,
    /// The requests the load balancer refuses for a while, by app (each was
    /// in flight when two copies died).
    refusing: HashMap<String, Vec<Refusing>>,
    /// The apps' listening sockets, held here and given to the load balancer.
    sockets: deploys::sockets::HeldSockets,
    /// Copies the cycle decided to stop, signalled once the load balancer
    /// has a table without them (observe, decide, record, push, act).
    stops: Vec<PendingStop>,
    /// Launchers the cycles readied, run once the lock is released.
    launches: Vec<PendingLaunch>,
    /// The cgroups copies get for their limits (found at start).
    cgroups: crate::sys::cgroup::Cgroups,
    /// Restarts and wakes counted for metrics.
    tallies: Tallies,
    /// Each running copy's CPU percent, as the sampler last read it.
    cpu_percent: watches::cpu::CpuPercent,
    /// Each running copy's memory (its process tree's proportional set
    /// size, `procfs::mem_bytes`), by PID, as the sampler last read it
    /// (every 5 s, off the lock): status's MEM and what the memory bound on
    /// growth counts.
    copy_mem: HashMap<u32, u64>,
    /// The pool's zygote's memory, its proportional share, as the same
    /// sampler last read it: what the memory bound counts for the pool.
    pool_mem: u64,
    /// `shinyctl shutdown` asked the daemon to stop; `Some(true)` with
    /// `--all`: the copies and the load balancer are stopped first.
    shutting_down: Option<bool>,
    /// The copies tables the cycles made and the newest pushed, so status
    /// and a deploy's progress answer from what the load balancer routes by.
    table_generations: table_sync::TableGenerations,
}

/// A copy's launcher, readied by a cycle (its record saved, its port
/// picked), to be run with the daemon's lock released.
pub struct PendingLaunch {
    /// The app.
    pub app: String,
    /// The copy.
    pub copy: u32,
    /// The copy's revision, so a record replaced meanwhile is not taken
    /// for it.
    pub revision: u64,
    /// The launcher, ready to run.
    pub launching: copies::act::Launching,
}

impl PendingLaunch {
    /// Runs the launcher (blocking: fork, exec).
    pub fn run(self) -> Launched {
        Launched { app: self.app, copy: self.copy, revision: self.revision, result: self.launching.spawn() }
    }
}

/// A launcher that ran, or why it did not.
pub struct Launched {
    /// The app.
    pub app: String,
    /// The copy.
    pub copy: u32,
    /// The copy's revision, as readied.
    pub revision: u64,
    /// The launcher's PID, and where it says R listens.
    pub result: anyhow::Result<copies::act::Spawned>,
}

/// The daemon as shared between the loop, the API and the watches: its one
/// front door. The lock is a `std::sync::Mutex`, whose guard is not `Send`,
/// so the compiler refuses a guard held across an `.await` in any spawned
/// task; code that waits on another process or a socket copies out what it
/// needs, lets go, waits, and locks again:
///
/// ```compile_fail
/// fn spawned<F: std::future::Future + Send>(_: F) {}
/// fn holds_across_an_await(shared: shinyctl::serve::Shared) {
///     spawned(async move {
///         let d = shared.lock();
///         tokio::task::yield_now().await;
///         drop(d);
///     });
/// }
/// ```
#[derive(Clone)]
pub struct Shared(Arc<std::sync::Mutex<Daemon>>);

impl Shared {
    /// The daemon, shared.
    pub fn new(daemon: Daemon) -> Shared {
        Shared(Arc::new(std::sync::Mutex::new(daemon)))
    }

    /// Locks the daemon. Hold the guard for in-memory work only: never
    /// across a `/proc` scan, a fork and exec, or a release's copy.
    ///
    /// A lock poisoned by a panic while held (a bug) is taken back as it
    /// is, logged once: the daemon keeps its copies running rather than
    /// stopping with them unwatched.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Daemon> {
        lock_or_recover(&self.0)
    }
}

/// Locks `mutex`; one poisoned by a panic is taken back as it is, logged
/// once (the poison is cleared).
fn lock_or_recover<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| {
        tracing::error!("a task panicked while it held the daemon's lock; going on with the state it left");
        mutex.clear_poison();
        poisoned.into_inner()
    })
}

impl Daemon {
    /// The addresses the apps listen on (an app being deleted no longer does).
    pub fn listen_addrs(&self) -> Vec<deploys::sockets::Addr> {
        self.apps
            .values()
            .filter(|a| !a.recorded.deleting)
            .map(|a| (a.recorded.spec.route.host.to_string(), a.recorded.spec.route.port))
            .collect()
    }
}

/// The path of a copy's log, for messages.
pub fn log_path(home: &Home, spec: &AppSpec, copy: u32) -> String {
    home.copy_log(&spec.group, &spec.name, copy).display().to_string()
}

/// True when a path is the same file as another, by canonical path.
pub fn same_path(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_lock_poisoned_by_a_panic_is_taken_back_with_its_data() {
        let mutex = std::sync::Arc::new(std::sync::Mutex::new(1u32));
        let held = mutex.clone();
        let panicked = std::thread::spawn(move || {
            let mut guard = held.lock().unwrap();
            *guard = 2;
            panic!("a bug while the lock is held");
        })
        .join();
        assert!(panicked.is_err() && mutex.is_poisoned());
        assert_eq!(*super::lock_or_recover(&mutex), 2, "the state the task left");
        assert!(!mutex.is_poisoned(), "logged once: the poison is cleared");
    }
}
