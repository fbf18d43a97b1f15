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

use std::collections::HashMap;

use tokio::sync::oneshot;

use crate::manifest::AppSpec;
use crate::wire::{AppState, DiskStop, Exit, MemoryStop, Role};

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

/// What is tracked at run time: each process the state names, by PID,
/// and what the last cycle decided.
#[derive(Default)]
pub struct Tracked {
    /// What is known of each process, by PID (one record per process:
    /// forgotten whole once the state no longer needs news of it).
    pub processes: HashMap<u32, TrackedProcess>,
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
    /// What the disk surely holds of its state file, so a save that changes
    /// only processes does not wait for the disk.
    pub on_disk: OnDisk,
}

/// What the disk surely holds of an app's state file: the [`AppState::lasting`](crate::wire::AppState::lasting)
/// part of the version last written to it with fsync.
#[derive(Default)]
pub struct OnDisk {
    /// The file and that part; none before this daemon's first durable
    /// write of it.
    pub last: Option<(std::path::PathBuf, AppState)>,
}

/// What the daemon knows at run time of one process the state names.
#[derive(Default, Clone, Copy)]
pub struct TrackedProcess {
    /// Seen ready (its port answers from its own socket).
    pub ready: bool,
    /// Its R process, when its launcher's report named it as it became
    /// ready (for the copies table).
    pub r_pid: Option<u32>,
    /// A readiness probe runs for it.
    pub probing: bool,
    /// An exit watcher runs for it.
    pub watched: bool,
    /// Told to stop.
    pub stopping: bool,
    /// Its exit, seen and not yet folded into the state.
    pub exit: Option<Exit>,
    /// The memory watch stopped it, with what it used: its exit carries it.
    pub memory_stop: Option<MemoryStop>,
    /// The disk watch stopped it, with what its disk held: its exit
    /// carries it.
    pub disk_stop: Option<DiskStop>,
    /// When its port was first seen held by a socket outside the copy
    /// (ms); the copy moves only once that is still so a while later.
    pub port_taken_since: Option<u64>,
}

impl Tracked {
    /// What is known of process `pid` (nothing, when it is not tracked).
    pub fn process(&self, pid: u32) -> TrackedProcess {
        self.processes.get(&pid).copied().unwrap_or_default()
    }

    /// The record of process `pid`, made empty if it had none.
    pub fn process_mut(&mut self, pid: u32) -> &mut TrackedProcess {
        self.processes.entry(pid).or_default()
    }

    /// Notes that `pid` is no longer ready (not until it answers again);
    /// returns true when it was. A process not tracked stays untracked.
    pub fn unready(&mut self, pid: u32) -> bool {
        self.processes.get_mut(&pid).is_some_and(|p| std::mem::take(&mut p.ready))
    }

    /// After a plan replaced the state: its exits are folded in, so forget
    /// them and the processes they were about, and the processes the state
    /// no longer names.
    pub fn fold(&mut self, before: &AppState, after: &AppState) {
        for pid in before.copies.iter().filter_map(|r| r.pid) {
            if !after.copies.iter().any(|r| r.pid == Some(pid)) || self.process(pid).exit.is_some() {
                self.forget(pid);
            }
        }
    }

    /// Forgets a process once the state no longer needs news of it.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
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
    /// The moments of the wake in progress, said in one line when it ends.
    pub steps: WakeSteps,
}

/// The moments (Unix ms) of one wake's steps in the daemon, from the load
/// balancer's ask to the table that lets the held requests go: said in one
/// line of api.log when the wake ends ([`WakeSteps::describe`]), so a slow
/// wake shows where it spent its time (`bench/wake.sh` reads it).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WakeSteps {
    /// The first ask reached the daemon.
    pub asked: Option<u64>,
    /// The cycle ended the sleep (the processes put to sleep were gone).
    pub woke: Option<u64>,
    /// The first copy's launcher was forked.
    pub forked: Option<u64>,
    /// Its R started (the launcher's report): R's own time runs from here
    /// to its `listen`.
    pub r_started: Option<u64>,
    /// Its init said R listens (none for a copy without the ports fence).
    pub listening: Option<u64>,
    /// The daemon folded in that the copy is ready: it listens from its own
    /// socket, after the init's word (`act::Heard::waking`).
    pub ready: Option<u64>,
    /// The table with the copy active was pushed to the load balancer.
    pub pushed: Option<u64>,
}

impl WakeSteps {
    /// `cycle +1 ms, launcher forked +12, R started +20, R listening +640,
    /// ready seen +650, table pushed +655`: each step since the ask, in
    /// order; a step not seen is left out.
    pub fn describe(&self) -> String {
        let Some(asked) = self.asked else { return String::new() };
        let steps = [
            ("cycle", self.woke),
            ("launcher forked", self.forked),
            ("R started", self.r_started),
            ("R listening", self.listening),
            ("ready seen", self.ready),
            ("table pushed", self.pushed),
        ];
        let mut out = Vec::new();
        for (name, at) in steps {
            if let Some(at) = at {
                let unit = if out.is_empty() { " ms" } else { "" };
                out.push(format!("{name} +{}{unit}", at.saturating_sub(asked)));
            }
        }
        out.join(", ")
    }

    /// Notes a moment once: the first copy's counts.
    pub fn note(step: &mut Option<u64>, at: u64) {
        step.get_or_insert(at);
    }
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
            self.steps = WakeSteps::default();
        } else if self.may_settle(state) {
            state.asleep_since_ms = None;
            self.requested = false;
            self.woke_ms = Some(now);
            WakeSteps::note(&mut self.steps.woke, now);
            return true;
        }
        false
    }

    /// True when [`Wake::settle`] would end the sleep with `state`: a wake
    /// is asked and no process put to sleep is left. A copy checking a
    /// version deployed while asleep goes on; the wake does not wait for it.
    /// A cycle that folds in the last of those exits (`settle` comes before
    /// its decide) asks for another at once with this, rather than leave
    /// the held visitor to the next tick.
    pub fn may_settle(&self, state: &AppState) -> bool {
        self.requested && state.asleep_since_ms.is_some() && state.copies.iter().all(|r| r.pid.is_none() || r.checking)
    }

    /// Notes a copy's readiness (and when its R started and when its init
    /// said R listens) in the steps of the wake in progress, if one is.
    pub fn note_ready(&mut self, r_started_ms: Option<u64>, listening_ms: Option<u64>, now: u64) {
        if self.steps.asked.is_some() {
            if let Some(at) = r_started_ms {
                WakeSteps::note(&mut self.steps.r_started, at);
            }
            if let Some(at) = listening_ms {
                WakeSteps::note(&mut self.steps.listening, at);
            }
            WakeSteps::note(&mut self.steps.ready, now);
        }
    }

    /// Answers every waiting request with the same outcome.
    pub fn answer(&mut self, outcome: WakeOutcome) {
        for waiter in self.waiters.drain(..) {
            let _ = waiter.send(outcome.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::CopyRecord;

    #[test]
    fn a_wakes_steps_are_said_since_its_ask_in_order_and_only_while_it_goes_on() {
        let mut wake = Wake::default();
        wake.note_ready(Some(3), Some(5), 9);
        assert_eq!(wake.steps, WakeSteps::default(), "no wake asked: nothing noted");
        wake.steps.asked = Some(1000);
        wake.steps.woke = Some(1001);
        wake.steps.forked = Some(1012);
        wake.note_ready(Some(1020), Some(1640), 1650);
        // A second copy's readiness does not move the first's moments.
        wake.note_ready(Some(1030), Some(1700), 1710);
        wake.steps.pushed = Some(1655);
        assert_eq!(
            wake.steps.describe(),
            "cycle +1 ms, launcher forked +12, R started +20, R listening +640, ready seen +650, table pushed +655"
        );
        // A copy without the ports fence never says it listens (nor, without
        // a launcher's report, when R started).
        let quiet = WakeSteps { listening: None, r_started: None, ..wake.steps.clone() };
        assert_eq!(quiet.describe(), "cycle +1 ms, launcher forked +12, ready seen +650, table pushed +655");
    }

    #[test]
    fn a_wake_goes_ahead_once_the_last_process_put_to_sleep_is_gone() {
        let mut wake = Wake { requested: true, ..Default::default() };
        let mut asleep = AppState { asleep_since_ms: Some(5), ..state(&[10]) };
        assert!(!wake.may_settle(&asleep) && !wake.settle(&mut asleep, 100), "a launcher still ending: the wake waits");
        // The cycle that folds the exit in records the copy without a
        // process: the wake may go ahead, and the next cycle ends the sleep.
        asleep.copies[0].pid = None;
        assert!(wake.may_settle(&asleep));
        assert!(wake.settle(&mut asleep, 200) && asleep.asleep_since_ms.is_none() && wake.woke_ms == Some(200));
        assert!(!wake.may_settle(&asleep), "woken: nothing more to settle");
    }

    fn state(pids: &[u32]) -> AppState {
        let copies = pids.iter().enumerate().map(|(i, p)| CopyRecord { copy: i as u32 + 1, pid: Some(*p), ..Default::default() }).collect();
        AppState { copies, ..Default::default() }
    }

    #[test]
    fn a_process_is_one_record_forgotten_whole_once_its_exit_is_folded_in() {
        let mut tracked = Tracked::default();
        let exit = Exit { at_ms: 1, code: Some(1), signal: None, memory: None, start_timeout_ms: None, disk: None };
        for pid in [10, 20, 30] {
            let p = tracked.process_mut(pid);
            p.ready = true;
            p.watched = true;
        }
        tracked.process_mut(20).exit = Some(exit);
        // 20 exited, 30 is no longer named; 10 runs on.
        tracked.fold(&state(&[10, 20, 30]), &state(&[10, 20]));
        assert!(tracked.process(10).ready && tracked.process(10).watched, "a process still named keeps what is known of it");
        assert!(!tracked.processes.contains_key(&20), "an exit folded in: forgotten whole");
        assert!(!tracked.processes.contains_key(&30), "no longer named: forgotten whole");
        assert!(tracked.unready(10) && !tracked.process(10).ready, "unready reports that it was ready");
        assert!(!tracked.unready(99) && !tracked.processes.contains_key(&99), "an untracked process stays untracked");
    }
}
