//! One app as the daemon holds it, in three parts kept apart (as pueue keeps
//! its saved state apart from its children):
//!
//! - [`Recorded`]: what outlives the daemon: the spec (registry.json) and the
//!   state (state.json). A restarted daemon gets exactly this back.
//! - [`Tracked`]: what the daemon learns at run time about the processes the
//!   state names (ready, probed, watched, told to stop, exited) and what the
//!   last cycle decided. A restarted daemon starts it empty and learns it
//!   again from /proc and the load balancer.
//! - [`Wake`]: a wake asked for by the load balancer and the requests
//!   waiting on it.

use std::collections::{HashMap, HashSet};

use tokio::sync::oneshot;

use crate::manifest::AppSpec;
use crate::model::{AppState, Exit, MemoryStop, Role};

/// The daemon's in-memory view of one app.
pub struct AppRt {
    /// The spec and state, as recorded on disk.
    pub recorded: Recorded,
    /// What is known of its processes at run time.
    pub tracked: Tracked,
    /// A wake in progress, if any.
    pub wake: Wake,
}

impl AppRt {
    /// An app as loaded or applied: nothing tracked, no wake.
    pub fn new(spec: AppSpec, state: AppState) -> AppRt {
        AppRt { recorded: Recorded { spec, state, deleting: false }, tracked: Tracked::default(), wake: Wake::default() }
    }
}

/// What is recorded: the spec in registry.json, the state in state.json.
pub struct Recorded {
    /// The applied spec.
    pub spec: AppSpec,
    /// What is recorded in state.json (the last plan's state).
    pub state: AppState,
    /// Deleted: left out of registry.json, and forgotten once its copies
    /// are gone.
    pub deleting: bool,
}

/// What is tracked at run time, by PID of the processes the state names.
#[derive(Default)]
pub struct Tracked {
    /// Processes seen ready (port answers from their own socket), by PID.
    pub ready: HashSet<u32>,
    /// Processes with a readiness probe running.
    pub probing: HashSet<u32>,
    /// Processes with an exit watcher.
    pub watched: HashSet<u32>,
    /// Processes told to stop.
    pub stopping: HashSet<u32>,
    /// Exits seen and not yet folded into the state, by PID.
    pub exits: HashMap<u32, Exit>,
    /// Processes the memory watch stopped, by PID, with what they used:
    /// their exits carry it.
    pub memory_stops: HashMap<u32, MemoryStop>,
    /// Processes the disk watch stopped, by PID, with what their disk
    /// held: their exits carry it.
    pub disk_stops: HashMap<u32, crate::model::DiskStop>,
    /// Processes the disk watch has measured once, by PID; true for one
    /// whose disk already held more than its size then (files kept from a
    /// build before `sandbox.disk`, or a size made smaller): it is not
    /// stopped for them, only its next deploy (an empty disk) is held to it.
    pub disk_measured: HashMap<u32, bool>,
    /// The last roles decided, for the copies table and status.
    pub roles: Vec<(u32, Role)>,
    /// When a timer in the last plan runs out.
    pub wake_at_ms: Option<u64>,
    /// Unix ms of its last request through the load balancer (the latest
    /// the load balancer reported; kept when a new load balancer starts at 0).
    pub last_request_ms: u64,
    /// Why the last write of state.json failed (the previous file stays
    /// whole; the copies keep running); none once a write succeeds.
    pub state_error: Option<String>,
    /// The load balancer reported every active copy full since the last
    /// cycle (README, "Capacity"); the next cycle takes it.
    pub full: bool,
}

impl Tracked {
    /// After a plan replaced the state: its exits are folded in, so forget
    /// them and the processes they were about, and the processes the state
    /// no longer names.
    pub fn fold(&mut self, before: &AppState, after: &AppState) {
        for pid in before.copies.iter().filter_map(|r| r.pid) {
            if !after.copies.iter().any(|r| r.pid == Some(pid)) || self.exits.contains_key(&pid) {
                self.forget(pid);
            }
        }
    }

    /// Forgets a process once the state no longer needs news of it.
    pub fn forget(&mut self, pid: u32) {
        self.exits.remove(&pid);
        self.memory_stops.remove(&pid);
        self.disk_stops.remove(&pid);
        self.disk_measured.remove(&pid);
        self.ready.remove(&pid);
        self.probing.remove(&pid);
        self.watched.remove(&pid);
        self.stopping.remove(&pid);
    }

    /// True when the last cycle gave a copy the active role.
    pub fn has_active(&self) -> bool {
        self.roles.iter().any(|(_, r)| *r == Role::Active)
    }
}

/// The outcome a waiting request gets: `Ok` once a copy is active, `Err`
/// with why when the wake failed.
pub type WakeOutcome = Result<(), String>;

/// A wake asked for by the load balancer.
#[derive(Default)]
pub struct Wake {
    /// A request asked for a wake; done once the sleeping processes are gone.
    pub requested: bool,
    /// Unix ms of the last wake, to tell a wake that failed.
    pub woke_ms: Option<u64>,
    /// Unix ms when the first request waiting for the wake asked for it,
    /// until the wake ends (for the wake-duration metric).
    pub asked_ms: Option<u64>,
    /// The requests waiting for the wake's outcome.
    pub waiters: Vec<oneshot::Sender<WakeOutcome>>,
}

impl Wake {
    /// Ends the sleep once a requested wake can go ahead: when the processes
    /// put to sleep are gone, so no dying process is taken for a ready copy.
    /// Returns true when it woke the app now.
    pub fn settle(&mut self, state: &mut AppState, now: u64) -> bool {
        if !self.requested {
            return false;
        }
        if state.asleep_since_ms.is_none() {
            // Not asleep (a copy on its way up): no wake to time.
            self.requested = false;
            self.asked_ms = None;
        } else if state.copies.iter().all(|r| r.pid.is_none() || r.checking) {
            // A copy checking a version deployed while asleep goes on; the
            // wake does not wait for it.
            state.asleep_since_ms = None;
            self.requested = false;
            self.woke_ms = Some(now);
            return true;
        }
        false
    }

    /// Answers every waiting request with the same outcome.
    pub fn answer(&mut self, outcome: WakeOutcome) {
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(outcome.clone());
        }
    }
}
