//! The cycle for one app: observe what its processes are doing, decide
//! (the pure [`reconcile::decide`]), record the new state, act on the plan;
//! then, for all apps at once, push the copies table and answer the wakes.
//!
//! What each step touches of an app: observe reads the recorded state and
//! the tracked processes; decide and record replace the recorded state and
//! the tracked roles and timer; act starts and stops the processes the
//! state names and tracks them.

use tokio::sync::mpsc;

use crate::home::Home;
use crate::reconcile::{self, Action, Observed, ObservedCopy, Process};
use crate::release;
use crate::sys::procfs;
use crate::wire::{CopyRecord, Exit, ProxyApp, ProxyCopy, ProxyTable};

use crate::serve::app::{AppRt, Recorded, Tracked, WakeOutcome, WakeSteps};
use crate::serve::copies::act;
use crate::serve::copies::copy_cgroups;
use crate::serve::copies::probe::ProbeFacts;
use crate::serve::copies::stops;
use crate::serve::copies::tallies;
use crate::serve::log_path;
use crate::serve::now_ms;
use crate::serve::state_files;
use crate::serve::watches::memory;
use crate::serve::Daemon;
use crate::serve::Event;
use crate::serve::Launched;
use crate::serve::PendingLaunch;
use crate::serve::PendingStop;

impl Daemon {
    /// Observe: what each recorded process is doing now, from what is
    /// tracked, /proc and the load balancer's traffic figures. Starts
    /// tracking a running process the daemon does not watch yet (adopted).
    pub(in crate::serve) fn observe(&mut self, name: &str, facts: &ProbeFacts) -> Observed {
        let events = self.events.clone();
        let home = self.home.clone();
        let memory = self.memory_room(name);
        let traffic = self.traffic.get(name).cloned().unwrap_or_default();
        let traffic_unknown = !self.traffic_heard;
        let cgroups = &self.cgroups;
        let counts = &mut self.tallies;
        let Some(AppRt { recorded, tracked, wake }) = self.apps.get_mut(name) else { return Observed::default() };
        // Requests held for a wake are activity until they are answered: the
        // woken app must not fall asleep again in the cycle its copy gets
        // ready, before the held requests reach it.
        let held = if wake.waiters.is_empty() { 0 } else { now_ms() };
        let mut observed = Observed {
            last_request_ms: tracked.last_request_ms.max(held),
            full: std::mem::take(&mut tracked.full),
            memory,
            traffic_unknown,
            ..Observed::default()
        };
        for rec in &recorded.state.copies {
            let Some(pid) = rec.pid else { continue };
            let gone = tracked.process(pid).exit.or_else(|| {
                // Gone before its watcher reported: reap it here if it is our
                // child; if it died while nobody watched, its status is unknown.
                (!facts.alive(pid, rec.port, rec.pid_start)).then(|| {
                    let (code, signal) = act::reap(pid).unwrap_or((None, None));
                    Exit { at_ms: now_ms(), code, signal, memory: None, start_timeout_ms: None, disk: None }
                })
            });
            let process = if let Some(mut exit) = gone {
                if let Some(why) = refusal(&self.home, &recorded.spec, rec.copy, pid, &exit) {
                    observed.refused.insert(rec.copy, why);
                }
                let limit = memory::sandbox_of(&recorded.spec, &recorded.state, rec).memory;
                exit.memory = memory::memory_stop_at_exit(cgroups, tracked, name, rec, pid, limit);
                if exit.memory.is_some() {
                    // Seen once: the cycle folds this exit in.
                    counts.stopped_for_memory(name, rec.copy);
                }
                exit.disk = tracked.process(pid).disk_stop;
                Process::Exited(exit)
            } else {
                let put_to_sleep = recorded.state.asleep_since_ms.is_some() && !rec.checking;
                let owner = port_owner(name, rec, pid, put_to_sleep, tracked, facts);
                adopt_ready(rec, pid, tracked, facts);
                let ready = tracked.process(pid).ready;
                // The daemon watches what it starts from the start, so a
                // process first watched here is one it adopted.
                let scratch = home.scratch_dir(&recorded.spec.group, &recorded.spec.name, rec.copy);
                if follow(name, rec, ready, tracked, &events, scratch, act::Heard::default()) {
                    tracing::info!(app = name, copy = rec.copy, pid, "adopted copy");
                }
                match owner {
                    procfs::PortOwner::Other => Process::PortTaken,
                    _ => Process::Running { ready },
                }
            };
            let t = traffic.get(&rec.copy);
            observed.copies.insert(
                rec.copy,
                ObservedCopy { process, connections: t.map_or(0, |t| t.connections), sessions: t.map_or(0, |t| t.sessions) },
            );
        }
        observed
    }

    /// One cycle for one app: observe, decide, record, (push happens for
    /// all apps after the cycles), act. `facts`: what was looked up in
    /// /proc for it just before, with the lock released.
    pub(in crate::serve) fn cycle(&mut self, name: &str, facts: &ProbeFacts) {
        let observed = self.observe(name, facts);
        let now = now_ms();
        let taken: Vec<u16> = self.apps.values().flat_map(|a| a.recorded.state.copies.iter().map(|r| r.port)).collect();
        let cx = ActContext { name, home: &self.home, events: &self.events, now, cgroups: &self.cgroups };
        let stops = &mut self.stops;
        let launches = &mut self.launches;
        let counts = &mut self.tallies;
        let Some(AppRt { recorded, tracked, wake }) = self.apps.get_mut(name) else { return };
        let waking = wake.settle(&mut recorded.state, now);
        if waking {
            tracing::info!(app = name, "waking");
            counts.wake_began(name);
        }
        // Each end is said once, in the cycle that folds it in (whether the
        // pidfd's event or a look in /proc saw it first), before a forgotten
        // copy's disk (and its launcher's report, naming R) goes.
        for rec in &recorded.state.copies {
            let Some(pid) = rec.pid else { continue };
            if let Some(reconcile::Process::Exited(exit)) = observed.copies.get(&rec.copy).map(|s| s.process) {
                // Asleep, a copy that ends was put to sleep, but for the check of a
                // version deployed meanwhile, which ends on its own only by failing.
                let asked = tracked.process(pid).stopping || (recorded.state.asleep_since_ms.is_some() && !rec.checking);
                use crate::serve::copies::copy_end::{note, AppStop};
                let app_stop =
                    if recorded.deleting { Some(AppStop::Delete) } else { recorded.state.stopped_since_ms.map(|_| AppStop::Stop) };
                note(cx.home, &recorded.spec, rec, &exit, asked, app_stop);
            }
        }
        let plan = reconcile::decide(&recorded.spec, recorded.deleting, &recorded.state, &observed, now);
        if let Some(why) = &plan.scaled {
            tracing::info!(app = name, "{name} {why}");
        }
        // Record: the plan's state replaces the recorded one.
        let before = std::mem::replace(&mut recorded.state, plan.state);
        for copy in plan.actions.iter().filter_map(|a| if let Action::Start(c) = a { Some(*c) } else { None }) {
            if let Some(reason) = tallies::restart_reason(&before, &recorded.state, copy, waking) {
                counts.started(name, copy, reason);
            }
        }
        note_start_timeouts(&cx, recorded, &before);
        // A release served once a copy of it was ready: one with a role, or
        // a sleeping app's check, which is stopped as soon as it is ready.
        let ready =
            observed.copies.iter().filter(|(_, o)| matches!(o.process, reconcile::Process::Running { ready: true })).map(|(c, _)| *c);
        release::mark_served(&mut recorded.state, &plan.roles.iter().map(|(c, _)| *c).chain(ready).collect::<Vec<_>>());
        tracked.roles = plan.roles;
        tracked.wake_at_ms = plan.wake_at_ms;
        tracked.fold(&before, &recorded.state);
        if wake.may_settle(&recorded.state) {
            // This cycle folded in the last exit a wake waited on: the wake
            // goes ahead in a cycle now, not at the next tick.
            let _ = cx.events.send(Event::Changed { app: name.to_string() });
        }
        let_go_of_ended(&cx, recorded, &before);
        release::prune(cx.home, &recorded.spec, &mut recorded.state);
        // Recorded once, after the starts are readied (their ports): each
        // save waits for the disk (fsync, 2–16 ms here), and a wake's
        // launcher waits for this cycle. Nothing runs or stops before the
        // cycle ends, so no moment between the two needs its own record.
        let acted = act_on(&cx, plan.actions, recorded, tracked, &taken, stops, launches);
        if acted || recorded.state != before || tracked.state_error.is_some() {
            state_files::record(recorded, tracked);
        }
        if recorded.deleting && recorded.state.copies.is_empty() {
            state_files::forget_deleted(cx.home, name, recorded);
            self.apps.remove(name);
            self.save_registry_or_warn();
        }
    }

    /// Answers the requests waiting for a wake, once the table the load
    /// balancer has shows an active copy, or every copy of the wake exited.
    pub(in crate::serve) fn resolve_wakes(&mut self, pushed_ms: u64) {
        for (name, app) in self.apps.iter_mut().filter(|(_, a)| !a.wake.waiters.is_empty()) {
            if let Some(outcome) = wake_outcome(&self.home, app) {
                let mut steps = std::mem::take(&mut app.wake.steps);
                if let (Some(asked), true) = (app.wake.asked_ms.take(), outcome.is_ok()) {
                    self.tallies.wake_ended(name, std::time::Duration::from_millis(now_ms().saturating_sub(asked)));
                    steps.pushed = Some(pushed_ms);
                    say_wake(name, &steps);
                }
                if outcome.is_err() {
                    self.tallies.wake_failed(name);
                }
                app.wake.answer(outcome);
            }
        }
    }

    /// The copies table for every app, from the last roles.
    pub(in crate::serve) fn table(&self) -> ProxyTable {
        let apps = self
            .apps
            .values()
            .map(|a| ProxyApp {
                name: a.recorded.spec.name.clone(),
                route: a.recorded.spec.route.clone(),
                asleep: a.recorded.state.asleep_since_ms.is_some(),
                listening: !a.recorded.deleting,
                stopped: a.recorded.state.stopped_since_ms.is_some(),
                down: a.recorded.state.asleep_since_ms.is_none()
                    && !a.recorded.deleting
                    && !a.recorded.state.copies.is_empty()
                    && a.recorded.state.copies.iter().all(|r| r.pid.is_none() && r.left_down.is_some()),
                max_sessions: a.recorded.spec.scale.max_sessions,
                max_replicas: a.recorded.spec.scale.max_active(),
                copies: a
                    .tracked
                    .roles
                    .iter()
                    .filter_map(|(copy, role)| {
                        let rec = a.recorded.state.copies.iter().find(|r| r.copy == *copy)?;
                        let pid = rec.pid?;
                        Some(ProxyCopy { copy: *copy, port: rec.port, role: *role, pid, r_pid: a.tracked.process(pid).r_pid })
                    })
                    .collect(),
            })
            .collect();
        ProxyTable { apps }
    }

    /// After the push (`pushed`: the load balancer has the table), act on
    /// the stops the cycles decided: the load balancer no longer sends those
    /// copies anything, and `after` (its figures, asked after the push)
    /// shows no answer to them under way. One it cannot reach holds a stop
    /// up for [`STOP_WAITS_FOR_PUSH_MS`] at most; answers under way, for
    /// [`crate::serve::STOP_WAITS_FOR_ANSWERS_MS`] (a `--now`, its grace).
    pub(in crate::serve) fn run_stops(&mut self, pushed: bool, after: Option<&crate::wire::ProxyStats>) {
        let now = now_ms();
        self.stops.retain_mut(|s| {
            let requests = after.map(|a| stops::leaving_requests(a, &s.app, s.pid));
            let go = s.due(pushed, requests, now);
            if go {
                act::stop_process(s.pid, s.pid_start);
            } else if let Some(n) = requests.filter(|&n| n > 0) {
                if !std::mem::replace(&mut s.waiting, true) {
                    tracing::info!(
                        app = s.app,
                        copy = s.copy,
                        pid = s.pid,
                        "copy {} stops once the {n} answer(s) under way to it are given",
                        s.copy
                    );
                }
            }
            !go
        });
    }

    /// When a stop is to be looked at again: one held up by an unreachable
    /// load balancer, or waiting for answers under way.
    pub(in crate::serve) fn stops_due_ms(&self) -> Option<u64> {
        let now = now_ms();
        self.stops.iter().map(|s| s.next_look_ms(now)).min()
    }
}

/// Appends the reason a copy could not be started to its log, as the
/// launcher does for the reasons it finds.
fn note_in_log(log: &std::path::Path, why: &str) {
    append_line(log, &format!("--- shinyctl: the copy could not be launched: {why} ---"));
}

use crate::serve::copies::copy_end::append_line;

/// Says in the copy's log, with the time, that a copy this cycle stopped
/// for start-timeout was not ready in time (once: the cycle that stopped it).
fn note_start_timeouts(cx: &ActContext, recorded: &Recorded, before: &crate::wire::AppState) {
    // A copy stopped for start-timeout: said in its own log, with the time.
    for rec in recorded.state.copies.iter().filter(|r| r.start_timed_out.is_some()) {
        if !before.copies.iter().any(|b| b.copy == rec.copy && b.start_timed_out.is_some()) {
            let limit = crate::sys::fmt::duration(
                std::time::Duration::from_millis(rec.start_timed_out.unwrap_or_default()),
                crate::sys::fmt::DurationStyle::Span,
            );
            tracing::warn!(
                app = cx.name,
                copy = rec.copy,
                pid = rec.pid.unwrap_or_default(),
                "copy not ready within start-timeout {limit}; stopping it"
            );
            let line = format!(
                "--- shinyctl: copy {} was not ready within start-timeout {limit}; stopping it (counted as a crash) at {} ---",
                rec.copy,
                crate::sys::procfs::local_rfc3339(cx.now)
            );
            append_line(&cx.home.copy_log(&recorded.spec.group, &recorded.spec.name, rec.copy), &line);
        }
    }
}

/// What a copy leaves when it goes: a forgotten copy's disk, a copy whose
/// process is gone its cgroups.
fn let_go_of_ended(cx: &ActContext, recorded: &Recorded, before: &crate::wire::AppState) {
    // A forgotten copy's own disk goes with it, so a later copy with the
    // same number (a redeploy, a new app of the same name) starts empty.
    for gone in before.copies.iter().filter(|r| !recorded.state.copies.iter().any(|n| n.copy == r.copy)) {
        drop(crate::wire::launch::remove_scratch(&cx.home.scratch_dir(&recorded.spec.group, &recorded.spec.name, gone.copy)));
    }
    // A copy whose process is gone has its cgroups removed (made anew
    // at its next start).
    for rec in before.copies.iter().filter(|r| r.pid.is_some()) {
        if !recorded.state.copies.iter().any(|n| n.copy == rec.copy && n.pid == rec.pid) {
            cx.cgroups.remove(&crate::sys::cgroup::leaf(cx.name, rec.copy));
        }
    }
}

/// What one cycle's act step works with, besides the app.
struct ActContext<'a> {
    /// The app's name.
    name: &'a str,
    /// The home folder.
    home: &'a Home,
    /// Where the processes' watchers send their events.
    events: &'a mpsc::UnboundedSender<Event>,
    /// The cycle's time, Unix ms.
    now: u64,
    /// The cgroups copies start in.
    cgroups: &'a crate::sys::cgroup::Cgroups,
}

/// Act: starts and stops the processes the plan names, and tracks them.
/// Returns true when a start changed the recorded state (its PID, port,
/// or a failure counted as a crash).
fn act_on(
    cx: &ActContext,
    actions: Vec<Action>,
    recorded: &mut Recorded,
    tracked: &mut Tracked,
    taken: &[u16],
    stops: &mut Vec<PendingStop>,
    launches: &mut Vec<PendingLaunch>,
) -> bool {
    let name = cx.name;
    let mut changed = false;
    let mut taken = taken.to_vec();
    for action in actions {
        match action {
            Action::Start(copy) => {
                // The copy's recorded release and the settings it was deployed with.
                let Some(run) =
                    recorded.state.copies.iter().find(|r| r.copy == copy).map(|r| release::run_dir(&recorded.spec, &recorded.state, r))
                else {
                    continue;
                };
                let uid = recorded.state.uid;
                let Some(rec) = recorded.state.copies.iter_mut().find(|r| r.copy == copy) else { continue };
                let prepared = run.map_err(anyhow::Error::from).and_then(|(dir, spec)| {
                    let cgroups = copy_cgroups::cgroups_for(cx.cgroups, &spec, copy)?;
                    let range = crate::sys::ids::Scheme::current().range().filter(|_| crate::serve::copies::act::runs_as_own_uid(&spec));
                    let uid = match (uid, range) {
                        (_, None) => None,
                        (Some(uid), Some(_)) => Some(uid),
                        (None, Some(range)) => {
                            let file = crate::sys::ids::ids_file();
                            let given = crate::sys::ids::of_app(&file, range, &cx.home.root, &spec.group, &spec.name)?;
                            tracing::info!(app = name, uid = given, "the app's own uid");
                            Some(given)
                        }
                    };
                    act::prepare_start(cx.home, &spec, rec, &dir, &taken, cgroups, uid).map(|l| (l, uid))
                });
                match prepared {
                    Ok((launching, got)) => {
                        if got.is_some() {
                            recorded.state.uid = got;
                        }
                        // Another copy started in this cycle looks elsewhere.
                        taken.push(rec.port);
                        launches.push(PendingLaunch { app: name.to_string(), copy, revision: rec.revision, launching });
                    }
                    Err(e) => not_started(cx, recorded, copy, &e),
                }
                changed = true;
            }
            Action::Stop(copy) => {
                let Some(rec) = recorded.state.copies.iter().find(|r| r.copy == copy) else { continue };
                let Some(pid) = rec.pid else { continue };
                if !std::mem::replace(&mut tracked.process_mut(pid).stopping, true) {
                    tracing::info!(app = name, copy, pid, "stopping copy");
                    let hurried_since = rec.drain_started_ms.filter(|_| rec.hurried);
                    stops.push(PendingStop::new(name, copy, pid, rec.pid_start, cx.now, hurried_since));
                }
            }
        }
    }
    changed
}

/// Why the launcher of `copy` (its recorded process `pid`, which ended
/// with `exit`) refused to start R: its exit status says a refusal and its
/// report, written by that same process, says why.
fn refusal(home: &crate::home::Home, spec: &crate::manifest::AppSpec, copy: u32, pid: u32, exit: &Exit) -> Option<String> {
    if exit.code != Some(crate::wire::launch::EXIT_REFUSED) || exit.signal.is_some() {
        return None;
    }
    crate::wire::launch::report::read_report(&home.scratch_dir(&spec.group, &spec.name, copy), pid)?.refused
}

/// A copy whose launcher could not be readied or run: the reason in the
/// daemon's log and the copy's, and counted like a crash, so it is tried
/// again after a backoff; one that `mode: strict` refuses (its cgroups
/// missing) is left down instead.
fn not_started(cx: &ActContext, recorded: &mut Recorded, copy: u32, e: &anyhow::Error) {
    tracing::error!(app = cx.name, copy, "cannot start copy: {e:#}");
    // In the copy's log too, where status finds the error it quotes.
    note_in_log(&cx.home.copy_log(&recorded.spec.group, &recorded.spec.name, copy), &format!("{e:#}"));
    let refused = e.downcast_ref::<copy_cgroups::Refused>();
    if let Some(rec) = recorded.state.copies.iter_mut().find(|r| r.copy == copy) {
        if let Some(why) = refused {
            rec.left_down = Some(crate::wire::refused(&why.0));
            let _ = cx.events.send(Event::Changed { app: cx.name.to_string() });
            return;
        }
        rec.crashes += 1;
        rec.last_exit = Some(Exit { at_ms: cx.now, code: Some(127), signal: None, memory: None, start_timeout_ms: None, disk: None });
    }
    let _ = cx.events.send(Event::Changed { app: cx.name.to_string() });
}

impl Daemon {
    /// The launchers the cycles readied, to run with the lock released.
    pub(in crate::serve) fn take_launches(&mut self) -> Vec<PendingLaunch> {
        std::mem::take(&mut self.launches)
    }

    /// Records the launchers that ran (or why one did not) in their
    /// copies' records, and starts watching them. A launcher whose copy no
    /// longer waits for it (deleted, or told to stop, while it started) is
    /// stopped again.
    pub(in crate::serve) fn launched(&mut self, done: Vec<Launched>) {
        let now = now_ms();
        for Launched { app: name, copy, revision, result } in done {
            let cx = ActContext { name: &name, home: &self.home, events: &self.events, now, cgroups: &self.cgroups };
            let app = self.apps.get_mut(&name);
            let waiting = app.as_ref().is_some_and(|a| {
                a.recorded
                    .state
                    .copies
                    .iter()
                    .any(|r| r.copy == copy && r.revision == revision && r.pid.is_none() && r.stop_started_ms.is_none())
            });
            let Some(AppRt { recorded, tracked, wake }) = app.filter(|_| waiting) else {
                if let Ok(act::Spawned { pid, .. }) = result {
                    tracing::info!(app = name, copy, pid, "stopping a copy that was no longer wanted once it started");
                    // Watched, so the daemon reaps its child when it ends.
                    act::watch_exit(name.clone(), pid, self.events.clone());
                    act::stop_process(pid, procfs::start_ticks(pid));
                }
                continue;
            };
            match result {
                Ok(act::Spawned { pid, told }) => {
                    let rec = recorded.state.copies.iter_mut().find(|r| r.copy == copy).expect("checked above");
                    act::started(rec, pid);
                    if wake.steps.asked.is_some() {
                        WakeSteps::note(&mut wake.steps.forked, rec.started_ms.unwrap_or(now));
                    }
                    tracing::info!(app = name, copy, pid, port = rec.port, "started copy");
                    let scratch = cx.home.scratch_dir(&recorded.spec.group, &recorded.spec.name, copy);
                    let heard = act::Heard { told, waking: wake.steps.asked.is_some() };
                    follow(&name, rec, false, tracked, cx.events, scratch, heard);
                }
                Err(e) => not_started(&cx, recorded, copy, &e),
            }
            state_files::record(recorded, tracked);
        }
    }
}

/// Says in api.log where a wake that ended with a copy active spent its
/// time: `hello woke in 702 ms: cycle +1 ms, launcher forked +9, …` with
/// the moment it was asked (Unix ms), which lines up the load balancer's
/// line for a held request (`proxy::forward`).
fn say_wake(name: &str, steps: &WakeSteps) {
    let (Some(asked), Some(pushed)) = (steps.asked, steps.pushed) else { return };
    tracing::info!(app = name, asked_ms = asked, "{name} woke in {} ms: {}", pushed.saturating_sub(asked), steps.describe());
}

/// How a wake ended, if it has: `Ok` once a copy is active, `Err` when the
/// app was deleted or every copy exited since the wake.
fn wake_outcome(home: &Home, app: &AppRt) -> Option<WakeOutcome> {
    let AppRt { recorded, tracked, wake } = app;
    if tracked.has_active() {
        return Some(Ok(()));
    }
    if recorded.deleting {
        return Some(Err(format!("{} was deleted", recorded.spec.name)));
    }
    // One broken copy must not fail a wake that another copy serves.
    let since = wake.woke_ms.unwrap_or(u64::MAX);
    let exited = |r: &&CopyRecord| r.last_exit.is_some_and(|e| e.at_ms >= since);
    let all_exited = !recorded.state.copies.is_empty() && recorded.state.copies.iter().all(|r| exited(&r));
    all_exited.then(|| recorded.state.copies.iter().find(exited)).flatten().map(|r| {
        let exit = r.last_exit.map(|e| e.describe()).unwrap_or_default();
        Err(format!("copy {} {exit} while waking; see {}", r.copy, log_path(home, &recorded.spec, r.copy)))
    })
}

/// Who listens where 127.0.0.1 reaches a running copy's port, checked
/// every cycle: a ready copy whose socket is no longer its own is not
/// ready (probed again), and one whose port another program holds moves.
fn port_owner(name: &str, rec: &CopyRecord, pid: u32, put_to_sleep: bool, tracked: &mut Tracked, facts: &ProbeFacts) -> procfs::PortOwner {
    // A copy on its way out, stopped or put to sleep (a copy checking a
    // version deployed while asleep is not): its R may be gone while its
    // launcher ends, which is no move and no failure.
    if rec.moving_from.is_some() || rec.stop_started_ms.is_some() || put_to_sleep {
        return procfs::PortOwner::Ours;
    }
    let owner = taken_for_a_while(tracked, pid, facts.owner(pid, rec.port), now_ms());
    if owner != procfs::PortOwner::Ours && tracked.unready(pid) {
        tracing::warn!(
            app = name,
            copy = rec.copy,
            pid,
            port = rec.port,
            "copy {} no longer answers from its own socket on port {}: {owner:?}",
            rec.copy,
            rec.port
        );
        tracked.process_mut(pid).probing = false;
    }
    if owner == procfs::PortOwner::Other {
        tracing::warn!(
            app = name,
            copy = rec.copy,
            pid,
            port = rec.port,
            "another program listens on copy {}'s port {}; it moves",
            rec.copy,
            rec.port
        );
    }
    owner
}

/// A copy a daemon that just started adopts is ready at once when it was
/// ready before and its own R still listens on its port (looked up just
/// before, off the lock): the first table then names it, so a restart or
/// an upgrade of the daemon holds no visitor's request while it probes
/// again, and `status` shows its role at once. One that never was ready,
/// whose port is not its own, or whose port was not looked at (it moves or
/// is being stopped), is probed as a new one is.
fn adopt_ready(rec: &CopyRecord, pid: u32, tracked: &mut Tracked, facts: &ProbeFacts) {
    let Some((procfs::PortOwner::Ours, r_pid)) = facts.looked_up(pid, rec.port) else { return };
    if tracked.process(pid).watched || !rec.ever_ready {
        return;
    }
    let process = tracked.process_mut(pid);
    process.ready = true;
    process.r_pid = r_pid;
}

/// How long a copy's port must stay held by a socket outside the copy
/// before the copy moves off it.
const PORT_TAKEN_CONFIRM_MS: u64 = 1_000;

/// `seen` of process `pid`'s port, with `Other` confirmed: it counts only
/// once it was already so [`PORT_TAKEN_CONFIRM_MS`] before (until then the
/// port is taken as nobody's). A copy whose R is dying shows the same for a
/// moment: its descriptors are gone from `/proc` while its listening socket
/// is still in the kernel's table, and a crash must not be taken for a move
/// (a move is stopped by shinyctl, not a crash).
fn taken_for_a_while(tracked: &mut Tracked, pid: u32, seen: procfs::PortOwner, now: u64) -> procfs::PortOwner {
    if seen != procfs::PortOwner::Other {
        if tracked.process(pid).port_taken_since.is_some() {
            tracked.process_mut(pid).port_taken_since = None;
        }
        return seen;
    }
    let since = *tracked.process_mut(pid).port_taken_since.get_or_insert(now);
    if now.saturating_sub(since) >= PORT_TAKEN_CONFIRM_MS {
        procfs::PortOwner::Other
    } else {
        procfs::PortOwner::Free
    }
}

/// Watches a running copy's process for its exit and, until it is ready,
/// probes its port; each once per process. Returns true when the process
/// was not watched before.
fn follow(
    name: &str,
    rec: &CopyRecord,
    ready: bool,
    tracked: &mut Tracked,
    events: &mpsc::UnboundedSender<Event>,
    scratch: std::path::PathBuf,
    heard: act::Heard,
) -> bool {
    let Some(pid) = rec.pid else { return false };
    let process = tracked.process_mut(pid);
    let new = !std::mem::replace(&mut process.watched, true);
    if new {
        act::watch_exit(name.to_string(), pid, events.clone());
    }
    if !ready && !std::mem::replace(&mut process.probing, true) {
        act::probe_ready(name.to_string(), pid, rec.pid_start.unwrap_or(0), rec.port, scratch, events.clone(), heard);
    }
    new
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::procfs::PortOwner::{Free, Other, Ours};

    #[test]
    fn a_port_counts_as_taken_only_once_it_stays_so() {
        let mut tracked = Tracked::default();
        // R dying: its socket still listed, its descriptors gone.
        assert_eq!(taken_for_a_while(&mut tracked, 7, Other, 10_000), Free);
        assert_eq!(taken_for_a_while(&mut tracked, 7, Other, 10_900), Free);
        assert_eq!(taken_for_a_while(&mut tracked, 7, Other, 11_000), Other, "still so a second later: another program");
        // Seen as ours again: the next sighting starts over.
        assert_eq!(taken_for_a_while(&mut tracked, 7, Ours, 11_500), Ours);
        assert_eq!(taken_for_a_while(&mut tracked, 7, Other, 12_000), Free);
        assert_eq!(taken_for_a_while(&mut tracked, 8, Free, 12_000), Free);
    }
}
