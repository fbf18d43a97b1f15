//! The pure heart of the cycle: [`decide`] takes the app's spec, what was
//! recorded, what was observed and the time, and returns what to record, the
//! roles, and what to start and stop. It does no I/O and reads no clock, so
//! it is tested with tables that read like the README's "Staying up".
//!
//! It is idempotent: called twice with the same inputs it plans the same, and
//! it does not care why it was called (a tick, a command, an exit).

use std::collections::BTreeMap;

use crate::manifest::{AppSpec, RestartPolicy, ScaleSpec};
use crate::wire::{AppState, CopyRecord, Exit, HeldVersion, Role};

pub mod capacity;
mod notes;
mod rollout;
#[cfg(test)]
mod tests;

pub use notes::{notes, CopyLog};
pub use rollout::rollout;

/// How long a draining copy is kept even with no sessions, for a page that
/// opens its WebSocket just after it loaded.
pub const SETTLE_MS: u64 = 10_000;
/// The first restart waits this long; each crash doubles it.
pub const BACKOFF_START_MS: u64 = 2_000;
/// Restarts never wait longer than this.
pub const BACKOFF_MAX_MS: u64 = 60_000;
/// A copy stopped with `--now` (or `delete --now`) first leaves the load
/// balancer's new visitors for this long, so a request that was on its way
/// to it (accepted as the port closed, or picked just before the push)
/// reaches a copy that still runs.
pub const NOW_PAUSE_MS: u64 = 100;
/// ... and is stopped once no request is in flight to it, or at this, even
/// with one: `--now` does not wait for visitors, only for answers under way.
pub const NOW_GRACE_MS: u64 = 1_000;
/// A copy that stays up this long has its crash count cleared.
pub const STAYED_UP_MS: u64 = 60_000;
/// A copy still not ready after this long is worth a line under status.
pub const SLOW_START_MS: u64 = 60_000;

/// What the observe step saw of one copy's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    /// The recorded process runs; `ready` once its port answers HTTP from a
    /// socket of its own.
    Running {
        /// Its port answers HTTP and the socket is its own.
        ready: bool,
    },
    /// The recorded process is gone.
    Exited(Exit),
    /// The recorded process runs, but another program listens on its port
    /// where a connection to 127.0.0.1 arrives: it moves to another port
    /// (stopped, then started again at once, not counted as a crash).
    PortTaken,
}

/// What the observe step saw of one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObservedCopy {
    /// Its process.
    pub process: Process,
    /// Requests in flight plus open WebSockets, from the load balancer.
    pub connections: u64,
    /// Open WebSockets, from the load balancer.
    pub sessions: u64,
}

/// Everything observed of an app.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Each copy, by copy number. A copy with a recorded process but no
    /// entry is taken as running and not ready.
    pub copies: BTreeMap<u32, ObservedCopy>,
    /// Unix ms of the app's last request through the load balancer, 0 if none.
    pub last_request_ms: u64,
    /// Copies whose launcher refused to start R (`sandbox.mode: strict` and
    /// a fence missing), with why: left down, not retried as a crash.
    pub refused: BTreeMap<u32, String>,
    /// The load balancer sent a new visitor to the warm copy because every
    /// active copy was full (`max-sessions`), since the last cycle.
    pub full: bool,
    /// How much memory the daemon's copies use against the bound growth
    /// keeps under (`SHINYCTL_MAX_MEMORY`); none when not looked at (an app
    /// that cannot grow).
    pub memory: Option<MemoryRoom>,
    /// The load balancer's connection and session figures have not been
    /// read since this daemon started (it adopted the copies a moment ago):
    /// zero connections then says nothing, and a draining copy is not taken
    /// for idle, or its open sessions would end with the daemon's restart.
    pub traffic_unknown: bool,
}

/// The memory growth may use (README, "Capacity").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryRoom {
    /// What every copy the daemon runs uses now, every app's, spares
    /// included, in bytes.
    pub used: u64,
    /// The bound: `SHINYCTL_MAX_MEMORY`, or a share of the machine's memory.
    pub bound: u64,
    /// What one more copy of this app is taken to need: the most one of its
    /// running copies uses now.
    pub per_copy: u64,
}

/// What to do to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Start a process for this copy (its record is already in the plan's
    /// state; a port of 0 means: pick a free one).
    Start(u32),
    /// Stop this copy's process: SIGTERM to its group, SIGKILL after 10 s.
    Stop(u32),
}

/// The outcome of one decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// What to record in state.json.
    pub state: AppState,
    /// The ready copies that take traffic, with their roles: active ones
    /// oldest first, then warm, then draining. This is the copies table.
    pub roles: Vec<(u32, Role)>,
    /// What to start and stop.
    pub actions: Vec<Action>,
    /// When a timer runs out (a backoff, a settle, a drain-timeout) and the
    /// cycle should run again, in unix ms.
    pub wake_at_ms: Option<u64>,
    /// Why the app grew or shrank this cycle (README, "Capacity"), for the
    /// daemon's log; none when it did neither.
    pub scaled: Option<String>,
}

/// How long a copy waits before its restart after `crashes` crashes.
pub fn backoff_ms(crashes: u32) -> u64 {
    let doublings = crashes.saturating_sub(1).min(16);
    (BACKOFF_START_MS << doublings).min(BACKOFF_MAX_MS)
}

/// Where a copy stands this cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    /// No process: waiting for its restart, or left down.
    Down,
    /// Its process runs and is not ready yet.
    Starting,
    /// Its process runs and is ready.
    Ready,
}

/// Decides one cycle for one app. Pure: no I/O, no clock.
///
/// Long on purpose: its numbered steps are the README's "Staying up" rules in the
/// order they apply to one state (fold what happened, sleep, the switch,
/// outdated copies, scaling, drains, processes, roles), and they share the
/// same few views of that state (`phase`, `is_current`, `serving`); read it
/// top to bottom beside the doc. The timelines in `tests.rs` pin each step.
///
/// `deleting`: the app is being deleted. It then wants no copies, as a
/// stopped app does (its state says so): its scale spec is read as no
/// active copy and no spare.
pub fn decide(spec: &AppSpec, deleting: bool, state: &AppState, observed: &Observed, now_ms: u64) -> Plan {
    let settings = spec.settings_hash();
    let mut st = state.clone();
    let wanting_none;
    let spec = if deleting || st.stopped_since_ms.is_some() {
        wanting_none = AppSpec { scale: ScaleSpec { replicas: 0, warm_replicas: 0, ..spec.scale.clone() }, ..spec.clone() };
        &wanting_none
    } else {
        spec
    };
    st.app = spec.name.clone();
    if st.next_copy == 0 {
        st.next_copy = st.copies.iter().map(|c| c.copy + 1).max().unwrap_or(1);
    }
    let mut actions = Vec::new();
    let mut wake: Option<u64> = None;
    let mut wake_at = |t: u64| wake = Some(wake.map_or(t, |w| w.min(t)));

    // 1. Fold in what happened: exits, copies that stayed up.
    let asleep = st.asleep_since_ms.is_some();
    st.copies.retain_mut(|rec| {
        let seen = observed.copies.get(&rec.copy);
        fold_observation(rec, seen, observed.refused.get(&rec.copy).map(String::as_str), spec.scale.restart_policy, asleep, now_ms)
    });
    for rec in st.copies.iter_mut().filter(|r| r.moving_from.is_none() && r.stop_started_ms.is_none()) {
        if matches!(observed.copies.get(&rec.copy).map(|s| s.process), Some(Process::PortTaken)) {
            rec.moving_from = Some(rec.port);
            actions.push(Action::Stop(rec.copy));
        }
    }

    let phase = |rec: &CopyRecord| -> Phase {
        match (rec.pid, observed.copies.get(&rec.copy).map(|s| s.process)) {
            (None, _) => Phase::Down,
            (Some(_), Some(Process::Running { ready: true })) => Phase::Ready,
            (Some(_), _) => Phase::Starting,
        }
    };
    let conns = |copy: u32| observed.copies.get(&copy).map_or(0, |s| s.connections);
    let sessions = |copy: u32| observed.copies.get(&copy).map_or(0, |s| s.sessions);
    let revision = st.revision;
    let is_current = |rec: &CopyRecord| rec.revision == revision && rec.settings == settings;
    // Copies still in play: not being stopped and not draining.
    let serving = |rec: &CopyRecord| rec.stop_started_ms.is_none() && rec.drain_started_ms.is_none();

    // 1. (cont.) A stop during a deploy that has not taken over remembers
    // the version that served, and the start after it runs that version
    // again beside the deployed one, which takes over once ready (step 2):
    // a broken deploy stays out of the visitors' way across stop and start.
    if state.stopped_since_ms.is_some() && !deleting {
        if st.held_version.is_none() {
            st.held_version = st.copies.iter().find(|r| !is_current(r) && serving(r) && phase(r) == Phase::Ready).map(|r| HeldVersion {
                revision: r.revision,
                settings: r.settings.clone(),
                release: r.release.clone(),
            });
        }
    } else if let Some(held) = st.held_version.take().filter(|_| !deleting) {
        for _ in 0..spec.scale.replicas.max(1) {
            new_copy_of(&mut st, held.clone());
        }
    }

    // 1a. A copy not ready within start-timeout is stopped; its end is a
    // crash (fold_observation), so it comes back after a backoff, or a wake
    // waiting on it fails.
    for rec in st.copies.iter_mut() {
        if phase(rec) == Phase::Ready {
            rec.ever_ready = true;
        }
    }
    for rec in st
        .copies
        .iter_mut()
        .filter(|r| !r.ever_ready && r.stop_started_ms.is_none() && r.drain_started_ms.is_none() && r.start_timed_out.is_none())
    {
        let Some(started) = rec.started_ms.filter(|_| phase(rec) == Phase::Starting) else { continue };
        let due = started.saturating_add(spec.scale.start_timeout_ms);
        if now_ms >= due {
            rec.start_timed_out = Some(spec.scale.start_timeout_ms);
            actions.push(Action::Stop(rec.copy));
        } else {
            wake_at(due);
        }
    }

    // 1b. Sleep: a settled app (none draining or being stopped; none on its
    // first start, unless it is stuck there past SLOW_START_MS; every copy
    // current, or the current version's copies all failed, each having
    // ended before it was ready, while the version before serves: a failed
    // deploy is no deploy under way) with no open connection sleeps
    // idle-timeout after its last activity: its last request, when it last
    // woke or was deployed, or the start of a copy that is up or starting for
    // the first time. A crash-looping copy's restarts are not activity, so an
    // idle broken app sleeps instead of restarting R forever, and so does one
    // whose copy is left down or stuck starting.
    if !asleep && st.awake_since_ms.is_none() {
        st.awake_since_ms = Some(now_ms);
    }
    if !asleep && spec.scale.idle_timeout_ms > 0 {
        // A copy on its first start (not crash-looping) that is not stuck
        // yet holds the sleep off until it is ready.
        let first_start = |r: &CopyRecord| {
            phase(r) == Phase::Starting && r.crashes == 0 && r.started_ms.is_some_and(|s| now_ms < s.saturating_add(SLOW_START_MS))
        };
        if st.copies.iter().any(first_start) {
            // Idle-timeout counts from when the app is whole, not from before.
            st.awake_since_ms = Some(now_ms);
        }
        let failed = |r: &CopyRecord| phase(r) != Phase::Ready && (r.crashes > 0 || r.left_down.is_some());
        let current = || st.copies.iter().filter(|r| is_current(r));
        let deployed = st.copies.iter().all(is_current) || (current().next().is_some() && current().all(failed));
        let settled = !st.copies.is_empty() && deployed && st.copies.iter().all(|r| serving(r) && !first_start(r));
        let busy = st.copies.iter().any(|r| conns(r.copy) > 0);
        if settled && !busy {
            let counts = |r: &&CopyRecord| phase(r) == Phase::Ready || (phase(r) == Phase::Starting && r.crashes == 0);
            let newest = st.copies.iter().filter(counts).filter_map(|r| r.started_ms).max().unwrap_or(0);
            let last_activity = observed.last_request_ms.max(newest).max(st.awake_since_ms.unwrap_or(0));
            let sleep_at = last_activity.saturating_add(spec.scale.idle_timeout_ms);
            if now_ms >= sleep_at {
                st.asleep_since_ms = Some(now_ms);
            } else {
                wake_at(sleep_at);
            }
        }
    }
    if st.asleep_since_ms.is_some() {
        return decide_asleep(spec, st, &is_current, &|r| phase(r) == Phase::Ready);
    }

    // A check begun asleep that got ready awake is done.
    for rec in st.copies.iter_mut().filter(|r| r.checking) {
        rec.checking = phase(rec) != Phase::Ready;
    }

    // 1c. Capacity: how many active copies, from the sessions open on the
    // copies that serve (draining ones keep theirs and need no room).
    let load: u64 = st.copies.iter().filter(|r| serving(r) && phase(r) == Phase::Ready).map(|r| sessions(r.copy)).sum();
    let grown = capacity::step(spec, &mut st, load, observed.full, observed.memory, now_ms);
    if let Some(t) = grown.wake_at_ms {
        wake_at(t);
    }
    let active_n = grown.active;

    // 2. The switch: the new version serves once as many of its copies as
    // there are to be active are ready.
    let ready_current = st.copies.iter().filter(|r| is_current(r) && serving(r) && phase(r) == Phase::Ready).count();
    let outdated_left = st.copies.iter().any(|r| !is_current(r) && serving(r));
    let switched = !outdated_left || ready_current >= active_n as usize;

    // 3. Outdated copies: before the switch they keep serving (and come back
    // if they crash, since the new version may be broken), except copies of a
    // version in between that never served: a redeploy during another goes
    // straight to the newest. After the switch, they drain or stop.
    if !switched {
        let version = |r: &CopyRecord| (r.revision, r.settings.clone());
        let serving_versions: Vec<(u64, String)> =
            st.copies.iter().filter(|r| !is_current(r) && serving(r) && phase(r) == Phase::Ready).map(version).collect();
        if !serving_versions.is_empty() {
            for rec in st.copies.iter_mut() {
                if !is_current(rec) && serving(rec) && phase(rec) != Phase::Ready && !serving_versions.contains(&version(rec)) {
                    rec.stop_started_ms = Some(now_ms);
                }
            }
        }
    } else {
        let outdated_roles = roles_of(&st, active_n, |r| !is_current(r) && serving(r) && phase(r) == Phase::Ready);
        for rec in st.copies.iter_mut().filter(|r| !is_current(r) && serving(r)) {
            match phase(rec) {
                Phase::Down => rec.stop_started_ms = Some(now_ms),
                Phase::Starting => rec.stop_started_ms = Some(now_ms),
                Phase::Ready => {
                    let was_warm = outdated_roles.get(&rec.copy) == Some(&Role::Warm);
                    if was_warm && conns(rec.copy) == 0 {
                        rec.stop_started_ms = Some(now_ms);
                    } else {
                        rec.drain_started_ms = Some(now_ms);
                    }
                }
            }
        }
    }

    // 4. Scaling: how many current copies there should be. Before the
    // switch only the ones that will serve start; the spares follow it.
    let target = if switched { active_n + spec.scale.warm_replicas } else { active_n } as usize;
    let mut current: Vec<usize> = (0..st.copies.len()).filter(|&i| is_current(&st.copies[i]) && serving(&st.copies[i])).collect();
    if current.len() > target {
        let roles = roles_of(&st, active_n, |r| is_current(r) && serving(r) && phase(r) == Phase::Ready);
        // Removal order: no process, still starting, then ready ones with the
        // fewest open sessions, a warm copy before an active one when they tie.
        current.sort_by_key(|&i| {
            let rec = &st.copies[i];
            let p = phase(rec);
            let active = roles.get(&rec.copy) == Some(&Role::Active);
            (
                p,
                if p == Phase::Ready { sessions(rec.copy) } else { 0 },
                active,
                std::cmp::Reverse(rec.started_ms),
                std::cmp::Reverse(rec.copy),
            )
        });
        for &i in &current[..current.len() - target] {
            let rec = &mut st.copies[i];
            if phase(rec) == Phase::Ready {
                rec.drain_started_ms = Some(now_ms);
            } else {
                rec.stop_started_ms = Some(now_ms);
            }
        }
    } else {
        for _ in current.len()..target {
            new_copy(&mut st, &settings);
        }
    }

    // 5. Draining copies stop when their sessions are gone (after the
    // settle), at drain-timeout, or with --now once the answers under way
    // are given (NOW_PAUSE_MS at least, NOW_GRACE_MS at most).
    for rec in st.copies.iter_mut().filter(|r| r.stop_started_ms.is_none()) {
        let Some(since) = rec.drain_started_ms else { continue };
        // A copy drains only once it was ready; one whose readiness is not
        // known (adopted by a daemon that just started, probed again) still
        // holds its sessions. Only one with no process has nothing to drain.
        if phase(rec) == Phase::Down {
            rec.stop_started_ms = Some(now_ms);
            continue;
        }
        let settle_end = since + SETTLE_MS;
        let timeout_end = since.saturating_add(spec.scale.drain_timeout_ms);
        let idle = !observed.traffic_unknown && conns(rec.copy) == 0;
        let in_flight = conns(rec.copy).saturating_sub(sessions(rec.copy));
        // A --now hurries it from then on, whatever comes after. One that
        // drained for a while already has its moments behind it.
        rec.hurried |= st.stop_now;
        let (pause_end, grace_end) = (since + NOW_PAUSE_MS, since + NOW_GRACE_MS);
        let due = rec.hurried && now_ms >= pause_end && (in_flight == 0 || now_ms >= grace_end);
        if due || now_ms >= timeout_end || (idle && now_ms >= settle_end) {
            rec.stop_started_ms = Some(now_ms);
        } else if rec.hurried {
            // Looked at again soon: the requests in flight end in moments.
            wake_at(if now_ms < pause_end { pause_end } else { (now_ms + NOW_PAUSE_MS).min(grace_end) }.min(timeout_end));
        } else {
            wake_at(if idle { settle_end.min(timeout_end) } else { timeout_end });
        }
    }

    // 6. Processes: stop what was told to stop; start what has no process
    // once its backoff is over.
    for rec in &st.copies {
        if rec.stop_started_ms.is_some() {
            if rec.pid.is_some() {
                actions.push(Action::Stop(rec.copy));
            }
            continue;
        }
        if rec.pid.is_some() || rec.left_down.is_some() || rec.drain_started_ms.is_some() {
            continue;
        }
        let restart_at = match rec.last_exit {
            Some(exit) if rec.crashes > 0 => exit.at_ms + backoff_ms(rec.crashes),
            _ => now_ms,
        };
        if now_ms >= restart_at {
            actions.push(Action::Start(rec.copy));
        } else {
            wake_at(restart_at);
        }
    }
    // A copy told to stop that has no process is gone for good.
    st.copies.retain(|r| r.stop_started_ms.is_none() || r.pid.is_some());
    if st.copies.iter().all(|r| is_current(r) && r.drain_started_ms.is_none()) {
        st.stop_now = false;
    }

    // 7. Roles, worked out anew: the oldest `active_n` ready copies of the
    // version that serves are active, the rest warm; draining ones drain.
    let serves = |r: &CopyRecord| if switched { is_current(r) } else { !is_current(r) };
    let mut roles: Vec<(u32, Role)> = Vec::new();
    let ready_serving = by_age(&st, |r| serving(r) && phase(r) == Phase::Ready && serves(r));
    let ready_other = by_age(&st, |r| serving(r) && phase(r) == Phase::Ready && !serves(r));
    for (n, copy) in ready_serving.iter().chain(ready_other.iter()).enumerate() {
        roles.push((*copy, if n < active_n as usize { Role::Active } else { Role::Warm }));
    }
    for copy in by_age(&st, |r| r.stop_started_ms.is_none() && r.drain_started_ms.is_some() && phase(r) == Phase::Ready) {
        roles.push((copy, Role::Draining));
    }
    // Keep the table's order: active oldest first, then warm, then draining.
    roles.sort_by_key(|(_, role)| *role as u8);

    Plan { state: st, roles, actions, wake_at_ms: wake, scaled: grown.change }
}

/// An app asleep: its processes stop, its current copies keep their
/// records (number, port, disk) without a process, and nothing takes
/// traffic; replicas and warm-replicas still set the count.
///
/// A redeploy while asleep is checked before it takes over: the sleeping
/// copies of the version before (their release, numbers, ports and disks)
/// are kept to wake with, and one copy of the new version starts
/// (`checking`). Once it has been ready it is put to sleep too, the old
/// copies are forgotten (their disks go: a redeploy starts from empty
/// disks) and the app sleeps on the new version. If it ends before it is
/// ready, it is left down with the reason and the app keeps the version
/// before, asleep or woken; the next deploy checks again.
fn decide_asleep(
    spec: &AppSpec,
    mut st: AppState,
    is_current: &dyn Fn(&CopyRecord) -> bool,
    is_ready: &dyn Fn(&CopyRecord) -> bool,
) -> Plan {
    st.awake_since_ms = None;
    // Asleep, the grown copies go (disks and all): it wakes at `replicas`
    // and grows from there.
    let shrunk = st.active_wanted.take().map(|n| format!("sleeps: back from {n} to {} active copies", spec.scale.replicas));
    if shrunk.is_some() {
        st.shrinks += 1;
        st.shrank_at_ms = st.asleep_since_ms;
    }
    st.low_since_ms = None;
    let checked = st.copies.iter().any(|r| r.checking && is_current(r) && is_ready(r));
    // The sleeping copies of the version before, kept to wake with until
    // the new one has been ready once (not a check of a version in
    // between, nor copies that were on their way out).
    let previous = |r: &CopyRecord| !is_current(r) && !r.checking && r.stop_started_ms.is_none() && r.drain_started_ms.is_none();
    let keep_previous = !checked && st.copies.iter().any(|r| previous(r) && r.pid.is_none());
    st.copies.retain(|r| {
        r.pid.is_some() || (is_current(r) && r.stop_started_ms.is_none() && r.drain_started_ms.is_none()) || (keep_previous && previous(r))
    });
    for rec in st.copies.iter_mut() {
        // A copy that was draining or being stopped is simply stopped.
        rec.drain_started_ms = None;
        if checked && rec.checking {
            rec.checking = false;
        }
    }
    let mut actions: Vec<Action> = st
        .copies
        .iter()
        .filter(|r| r.pid.is_some() && !(r.checking && is_current(r) && r.left_down.is_none()))
        .map(|r| Action::Stop(r.copy))
        .collect();
    if keep_previous {
        // The check: one new copy, started once and never again (left down
        // if it ends before it is ready).
        st.copies.retain(|r| !is_current(r) || r.checking);
        if !st.copies.iter().any(is_current) {
            let copy = new_copy(&mut st, &spec.settings_hash());
            st.copies.last_mut().expect("just pushed").checking = true;
            actions.push(Action::Start(copy));
        }
        st.stop_now = false;
        return Plan { state: st, roles: Vec::new(), actions, wake_at_ms: None, scaled: shrunk };
    }
    let target = (spec.scale.replicas + spec.scale.warm_replicas) as usize;
    let mut count = st.copies.iter().filter(|r| is_current(r)).count();
    while count > target {
        let Some(i) = st.copies.iter().rposition(|r| is_current(r) && r.pid.is_none()) else { break };
        st.copies.remove(i);
        count -= 1;
    }
    for _ in count..target {
        new_copy(&mut st, &spec.settings_hash());
    }
    st.stop_now = false;
    Plan { state: st, roles: Vec::new(), actions, wake_at_ms: None, scaled: shrunk }
}

/// Adds a record for a new copy of the current version (its revision and
/// release, started with `settings`); returns its number.
fn new_copy(st: &mut AppState, settings: &str) -> u32 {
    let current = HeldVersion { revision: st.revision, settings: settings.to_string(), release: st.release.clone() };
    new_copy_of(st, current)
}

/// Adds a record for a new copy of `version`; returns its number.
fn new_copy_of(st: &mut AppState, version: HeldVersion) -> u32 {
    let copy = st.next_copy;
    st.next_copy += 1;
    let HeldVersion { revision, settings, release } = version;
    st.copies.push(CopyRecord { copy, revision, settings, release, ..CopyRecord::default() });
    copy
}

/// Folds one observation into a copy's record (`refused`: why its launcher
/// refused to start R). Returns false when the copy is to be forgotten (it
/// was being stopped and its process is gone).
fn fold_observation(
    rec: &mut CopyRecord,
    seen: Option<&ObservedCopy>,
    refused: Option<&str>,
    policy: RestartPolicy,
    asleep: bool,
    now_ms: u64,
) -> bool {
    if rec.pid.is_none() {
        return rec.stop_started_ms.is_none();
    }
    match seen.map(|s| s.process) {
        Some(Process::Exited(exit)) => {
            rec.pid = None;
            rec.pid_start = None;
            let exit = Exit { start_timeout_ms: rec.start_timed_out.take(), ..exit };
            if asleep && rec.checking {
                // The check of a version deployed while asleep failed: left
                // down, and the app keeps the version before.
                rec.crashes += 1;
                rec.left_down = Some(format!(
                    "the version deployed while the app slept never got ready: it {}; the app keeps the version before",
                    exit.describe()
                ));
                rec.last_exit = Some(exit);
                return true;
            }
            if asleep {
                // Put to sleep: not a crash; the copy stays, to wake in place.
                return rec.stop_started_ms.is_none();
            }
            rec.last_exit = Some(exit);
            if rec.stop_started_ms.is_some() {
                return false;
            }
            if rec.drain_started_ms.is_some() {
                // A draining copy that dies is not brought back.
                rec.stop_started_ms = Some(now_ms);
                return false;
            }
            if rec.moving_from.take().is_some() {
                // Stopped to move: started again at once, on a port picked anew.
                rec.port = 0;
                return true;
            }
            if let Some(why) = refused {
                // Not a crash: trying again refuses again, until the machine
                // or the manifest changes (a deploy, or `restart`).
                rec.left_down = Some(crate::wire::refused(why));
                return true;
            }
            let comes_back = match policy {
                RestartPolicy::Always => true,
                RestartPolicy::OnFailure => !exit.success(),
                RestartPolicy::Never => false,
            };
            // A clean exit that stays down is no crash; one that comes back
            // counts, for its backoff (an app exiting 0 in a loop).
            if comes_back || !exit.success() {
                rec.crashes += 1;
            }
            if !comes_back {
                rec.left_down = Some(format!("it {} and restart-policy is {}", exit.describe(), policy.as_str()));
            }
        }
        Some(Process::Running { ready: true }) if rec.started_ms.is_some_and(|s| now_ms.saturating_sub(s) >= STAYED_UP_MS) => {
            rec.crashes = 0;
        }
        _ => {}
    }
    true
}

/// The copies that pass `keep`, oldest first (by start, then copy number).
fn by_age(st: &AppState, keep: impl Fn(&CopyRecord) -> bool) -> Vec<u32> {
    let mut v: Vec<&CopyRecord> = st.copies.iter().filter(|r| keep(r)).collect();
    v.sort_by_key(|r| (r.started_ms.unwrap_or(u64::MAX), r.copy));
    v.into_iter().map(|r| r.copy).collect()
}

/// Active and warm among the copies that pass `keep`: the oldest `replicas` are active.
fn roles_of(st: &AppState, replicas: u32, keep: impl Fn(&CopyRecord) -> bool) -> BTreeMap<u32, Role> {
    by_age(st, keep).into_iter().enumerate().map(|(n, c)| (c, if n < replicas as usize { Role::Active } else { Role::Warm })).collect()
}
