//! The cycle for one app: observe what its processes are doing, decide
//! (the pure [`reconcile::decide`]), record the new state, act on the plan;
//! then, for all apps at once, push the copies table and answer the wakes.
//!
//! What each step touches of an app: observe reads the recorded state and
//! the tracked processes; decide and record replace the recorded state and
//! the tracked roles and timer; act starts and stops the processes the
//! state names and tracks them.

use std::collections::HashSet;

use tokio::sync::mpsc;

use crate::model::{CopyRecord, Exit, ProxyApp, ProxyCopy, ProxyTable};
use crate::procfs;
use crate::reconcile::{self, Action, Observed, Process, Seen};

use super::{act, log_path, now_ms, record, Daemon, Event};

impl Daemon {
    /// Observe: what each recorded process is doing now.
    pub(super) fn observe(&mut self, name: &str) -> Observed {
        let events = self.events.clone();
        let traffic = self.traffic.get(name).cloned().unwrap_or_default();
        let Some(app) = self.apps.get_mut(name) else { return Observed::default() };
        let mut observed = Observed { last_request_ms: app.tracked.last_request_ms, ..Observed::default() };
        for rec in &app.recorded.state.copies {
            let Some(pid) = rec.pid else { continue };
            let process = if let Some(exit) = app.tracked.exits.get(&pid) {
                Process::Exited(*exit)
            } else if !rec.pid_start.is_some_and(|s| procfs::is_alive(pid, s)) {
                // Gone before its watcher reported: reap it here if it is our
                // child; if it died while nobody watched, its status is unknown.
                let (code, signal) = act::reap(pid).unwrap_or((None, None));
                Process::Exited(Exit { at_ms: now_ms(), code, signal })
            } else {
                let ready = app.tracked.ready.contains(&pid);
                // The daemon watches what it starts from the start, so a
                // process first watched here is one it adopted.
                if follow(name, rec, ready, &mut app.tracked.watched, &mut app.tracked.probing, &events) {
                    tracing::info!(app = name, copy = rec.copy, pid, "adopted copy");
                }
                Process::Running { ready }
            };
            let t = traffic.get(&rec.copy);
            observed
                .copies
                .insert(rec.copy, Seen { process, connections: t.map_or(0, |t| t.connections), sessions: t.map_or(0, |t| t.sessions) });
        }
        observed
    }

    /// One cycle for one app: observe, decide, record, (push happens for
    /// all apps after the cycles), act.
    pub(super) fn cycle(&mut self, name: &str) {
        let observed = self.observe(name);
        let now = now_ms();
        let home = self.home.clone();
        let taken: Vec<u16> = self.apps.values().flat_map(|a| a.recorded.state.copies.iter().map(|r| r.port)).collect();
        let events = self.events.clone();
        let Some(app) = self.apps.get_mut(name) else { return };
        // A wake is done once the processes put to sleep are gone, so no
        // dying process is taken for a ready copy.
        if app.wake.requested {
            if app.recorded.state.asleep_since_ms.is_none() {
                app.wake.requested = false;
            } else if app.recorded.state.copies.iter().all(|r| r.pid.is_none()) {
                app.recorded.state.asleep_since_ms = None;
                app.wake.requested = false;
                app.wake.woke_ms = Some(now);
                tracing::info!(app = name, "waking");
            }
        }
        let mut spec = app.recorded.spec.clone();
        if app.recorded.deleting {
            spec.replicas = 0;
            spec.warm_replicas = 0;
        }
        let plan = reconcile::decide(&spec, &app.recorded.state, &observed, now);
        let before = std::mem::replace(&mut app.recorded.state, plan.state);
        app.tracked.roles = plan.roles;
        app.tracked.wake_at_ms = plan.wake_at_ms;
        // Exits are folded in; forget them and the PIDs they were about.
        for pid in before.copies.iter().filter_map(|r| r.pid) {
            if !app.recorded.state.copies.iter().any(|r| r.pid == Some(pid)) || app.tracked.exits.contains_key(&pid) {
                app.tracked.forget(pid);
            }
        }
        // A forgotten copy's own disk goes with it, so a later copy with the
        // same number (a redeploy, a new app of the same name) starts empty.
        for gone in before.copies.iter().filter(|r| !app.recorded.state.copies.iter().any(|n| n.copy == r.copy)) {
            let _ = std::fs::remove_dir_all(home.scratch_dir(&app.recorded.spec.group, &app.recorded.spec.name, gone.copy));
        }
        if app.recorded.state != before {
            record::save_state(&app.recorded.spec.state_file, &app.recorded.state);
        }
        // Act.
        let mut changed = false;
        for action in plan.actions {
            match action {
                Action::Start(copy) => {
                    let Some(rec) = app.recorded.state.copies.iter_mut().find(|r| r.copy == copy) else { continue };
                    match act::start_copy(&home, &app.recorded.spec, rec, &taken) {
                        Ok(()) => {
                            tracing::info!(app = name, copy, pid = rec.pid.unwrap_or(0), port = rec.port, "started copy");
                            follow(name, rec, false, &mut app.tracked.watched, &mut app.tracked.probing, &events);
                        }
                        Err(e) => {
                            tracing::error!(app = name, copy, "cannot start copy: {e:#}");
                            // Counted like a crash, so it is retried after a backoff.
                            rec.crashes += 1;
                            rec.last_exit = Some(Exit { at_ms: now, code: Some(127), signal: None });
                            let _ = events.send(Event::Changed { app: name.to_string() });
                        }
                    }
                    changed = true;
                }
                Action::Stop(copy) => {
                    let Some(rec) = app.recorded.state.copies.iter().find(|r| r.copy == copy) else { continue };
                    let Some(pid) = rec.pid else { continue };
                    if app.tracked.stopping.insert(pid) {
                        tracing::info!(app = name, copy, pid, "stopping copy");
                        act::stop_process(pid, rec.pid_start);
                    }
                }
            }
        }
        if changed {
            record::save_state(&app.recorded.spec.state_file, &app.recorded.state);
        }
        if app.recorded.deleting && app.recorded.state.copies.is_empty() {
            let _ = std::fs::remove_file(&app.recorded.spec.state_file);
            self.apps.remove(name);
            tracing::info!(app = name, "deleted");
        }
    }

    /// Answers the requests waiting for a wake, once the table the load
    /// balancer has shows an active copy, or every copy of the wake exited
    /// (one broken copy must not fail a wake that another copy serves).
    pub(super) fn resolve_wakes(&mut self) {
        let home = self.home.clone();
        for app in self.apps.values_mut().filter(|a| !a.wake.waiters.is_empty()) {
            let outcome = if app.tracked.has_active() {
                Some(Ok(()))
            } else if app.recorded.deleting {
                Some(Err(format!("{} was deleted", app.recorded.spec.name)))
            } else {
                let since = app.wake.woke_ms.unwrap_or(u64::MAX);
                let exited = |r: &&CopyRecord| r.last_exit.is_some_and(|e| e.at_ms >= since);
                let all_exited = !app.recorded.state.copies.is_empty() && app.recorded.state.copies.iter().all(|r| exited(&r));
                all_exited.then(|| app.recorded.state.copies.iter().find(exited)).flatten().map(|r| {
                    let exit = r.last_exit.map(|e| e.describe()).unwrap_or_default();
                    Err(format!("copy {} {exit} while waking; see {}", r.copy, log_path(&home, &app.recorded.spec, r.copy)))
                })
            };
            if let Some(outcome) = outcome {
                app.wake.answer(outcome);
            }
        }
    }

    /// The copies table for every app, from the last roles.
    pub(super) fn table(&self) -> ProxyTable {
        let apps = self
            .apps
            .values()
            .filter(|a| !a.recorded.deleting)
            .map(|a| ProxyApp {
                name: a.recorded.spec.name.clone(),
                host: a.recorded.spec.host.clone(),
                port: a.recorded.spec.port,
                policy: a.recorded.spec.lb_policy,
                request_timeout_ms: a.recorded.spec.request_timeout_ms,
                asleep: a.recorded.state.asleep_since_ms.is_some(),
                copies: a
                    .tracked
                    .roles
                    .iter()
                    .filter_map(|(copy, role)| {
                        let rec = a.recorded.state.copies.iter().find(|r| r.copy == *copy)?;
                        Some(ProxyCopy { copy: *copy, port: rec.port, role: *role, pid: rec.pid? })
                    })
                    .collect(),
            })
            .collect();
        ProxyTable { apps }
    }

    /// Push: sends the copies table to the load balancer when it changed.
    pub(super) async fn push(&mut self) {
        let table = self.table();
        let home = self.home.clone();
        self.proxy.push(&home, table).await;
    }
}

/// Watches a running copy's process for its exit and, until it is ready,
/// probes its port; each once per process. Returns true when the process
/// was not watched before.
fn follow(
    name: &str,
    rec: &CopyRecord,
    ready: bool,
    watched: &mut HashSet<u32>,
    probing: &mut HashSet<u32>,
    events: &mpsc::UnboundedSender<Event>,
) -> bool {
    let Some(pid) = rec.pid else { return false };
    let new = watched.insert(pid);
    if new {
        act::watch_exit(name.to_string(), pid, events.clone());
    }
    if !ready && probing.insert(pid) {
        act::probe_ready(name.to_string(), pid, rec.pid_start.unwrap_or(0), rec.port, events.clone());
    }
    new
}
