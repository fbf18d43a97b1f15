//! The daemon, `shinyctl serve` (shinyctl-api). For each app, every 5 s and
//! at once on any event, it runs the cycle: observe, decide, record, push,
//! act. Only the daemon writes state (`state.json`, `registry.json`,
//! `proxy/table.json`).

mod act;
mod api;
mod proxy_ctl;
mod record;
mod status;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};

use crate::home::Home;
use crate::manifest::AppSpec;
use crate::model::{AppState, CopyTraffic, Exit, ProxyApp, ProxyCopy, ProxyTable, Role};
use crate::procfs;
use crate::reconcile::{self, Action, Observed, Process, Seen};

pub use act::now_ms;

/// How often the cycle runs when nothing happens.
pub const TICK: Duration = Duration::from_secs(5);
/// Copy logs rotate past this size.
pub const LOG_ROTATE_BYTES: u64 = 1 << 30;

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
    },
    /// The load balancer saw a copy refuse a connection.
    StandIn {
        /// The app.
        app: String,
        /// The copy that refused.
        down: u32,
    },
    /// The load balancer's process ended.
    ProxyExit,
}

/// The daemon's in-memory view of one app.
pub struct AppRt {
    /// The applied spec.
    pub spec: AppSpec,
    /// What is recorded in state.json (the last plan's state).
    pub state: AppState,
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
    /// The last roles decided, for the copies table and status.
    pub roles: Vec<(u32, Role)>,
    /// When a timer in the last plan runs out.
    pub wake_at_ms: Option<u64>,
    /// Deleted: forgotten once its copies are gone.
    pub deleting: bool,
    /// Unix ms of its last request through the load balancer (the latest
    /// the load balancer reported; kept when a new load balancer starts at 0).
    pub last_request_ms: u64,
    /// A request asked for a wake; done once the sleeping processes are gone.
    pub wake_requested: bool,
    /// Unix ms of the last wake, to tell a wake that failed.
    pub woke_ms: Option<u64>,
    /// The requests for a wake waiting for its outcome: Ok once a copy is
    /// active, Err with why when a copy of the wake exited.
    pub wake_waiters: Vec<tokio::sync::oneshot::Sender<Result<(), String>>>,
}

impl AppRt {
    /// An app as loaded or applied.
    pub fn new(spec: AppSpec, state: AppState) -> AppRt {
        AppRt {
            spec,
            state,
            ready: HashSet::new(),
            probing: HashSet::new(),
            watched: HashSet::new(),
            stopping: HashSet::new(),
            exits: HashMap::new(),
            roles: Vec::new(),
            wake_at_ms: None,
            deleting: false,
            last_request_ms: 0,
            wake_requested: false,
            woke_ms: None,
            wake_waiters: Vec::new(),
        }
    }
}

/// Everything the daemon holds, behind one lock.
pub struct Daemon {
    /// The home folder.
    pub home: Home,
    /// Every app, by name.
    pub apps: BTreeMap<String, AppRt>,
    /// Where events go.
    pub events: mpsc::UnboundedSender<Event>,
    /// The load balancer.
    pub proxy: proxy_ctl::ProxyCtl,
    /// The last traffic figures from the load balancer, by app then copy.
    pub traffic: HashMap<String, HashMap<u32, CopyTraffic>>,
}

/// The daemon as shared between the loop and the API.
pub type Shared = Arc<Mutex<Daemon>>;

/// `serve -d`: starts `shinyctl serve` in its own session and returns once
/// its API answers.
pub fn detach(home: &Home) -> anyhow::Result<()> {
    // A daemon that answers may be one just told to stop (the documented
    // upgrade is `pkill … && shinyctl serve -d`): give it a second to go.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while api::answers(home) {
        if std::time::Instant::now() >= deadline {
            println!("shinyctl serve is already running ({}).", home.api_sock().display());
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    spawn_daemon(home)?;
    println!("shinyctl serve started; it answers on {}.", home.api_sock().display());
    Ok(())
}

/// Starts the daemon in the background (its command line is exactly
/// `…/shinyctl serve`) and waits until its API answers.
pub fn spawn_daemon(home: &Home) -> anyhow::Result<()> {
    home.ensure()?;
    let mut child = act::spawn_self(home, "serve", &[])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if api::answers(home) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!("shinyctl serve exited at start ({status}); see {}", home.api_log().display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("shinyctl serve did not answer within 15 s; see {}", home.api_log().display())
}

/// Runs the daemon in the foreground until SIGTERM or SIGINT. Stopping it
/// stops only the daemon: the copies and the load balancer keep running.
pub fn run(home: Home) -> anyhow::Result<()> {
    home.ensure()?;
    if api::answers(&home) {
        anyhow::bail!("shinyctl serve is already running for {} (it answers on {})", home.root.display(), home.api_sock().display());
    }
    // A daemon that was just told to stop (`pkill … && shinyctl serve -d`)
    // lets go of the lock a moment later: wait for it rather than fail.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lock = loop {
        match record::lock_exclusive(&home.serve_lock()) {
            Ok(lock) => break lock,
            Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => anyhow::bail!("shinyctl serve is already running for {}", home.root.display()),
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (writer, _guard) = tracing_appender::non_blocking(tracing_appender::rolling::never(&home.root, "api.log"));
    tracing_subscriber::fmt().with_writer(writer).with_ansi(false).with_target(false).init();
    let result = rt.block_on(run_async(home));
    drop(lock);
    result
}

async fn run_async(home: Home) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let listener = api::bind(&home)?;
    let proxy = proxy_ctl::ProxyCtl::new(&home)?;
    let mut daemon = Daemon { home: home.clone(), apps: BTreeMap::new(), events: tx.clone(), proxy, traffic: HashMap::new() };
    daemon.load()?;
    tracing::info!(pid = std::process::id(), apps = daemon.apps.len(), "shinyctl serve started");
    let shared: Shared = Arc::new(Mutex::new(daemon));
    tokio::spawn(api::serve(listener, shared.clone()));

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut next_tick = tokio::time::Instant::now();
    loop {
        let mut due: HashSet<String> = HashSet::new();
        let mut all = false;
        let wake = {
            let d = shared.lock().await;
            d.next_wake(next_tick)
        };
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                let mut d = shared.lock().await;
                d.note_event(ev, &mut due, &mut all).await;
                while let Ok(ev) = rx.try_recv() {
                    d.note_event(ev, &mut due, &mut all).await;
                }
            }
            _ = tokio::time::sleep_until(wake) => {
                if tokio::time::Instant::now() >= next_tick {
                    all = true;
                    next_tick = tokio::time::Instant::now() + TICK;
                } else {
                    let d = shared.lock().await;
                    let now = now_ms();
                    due.extend(d.apps.iter().filter(|(_, a)| a.wake_at_ms.is_some_and(|w| w <= now)).map(|(n, _)| n.clone()));
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        // A daemon told to stop starts nothing more, a load balancer least
        // of all: one killed beside it would come back with no one to end it.
        // A SIGTERM sent with the kill may reach the signal driver after the
        // exit does: a moment's wait before a cycle that may start one.
        if all {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if stop_pending(&mut term, &mut int).await {
            break;
        }
        let mut guard = shared.lock().await;
        let d = &mut *guard;
        if all {
            due.extend(d.apps.keys().cloned());
            d.proxy.ensure(&d.home, &d.events).await;
            d.rotate_logs();
        }
        d.refresh_traffic().await;
        for app in due {
            d.cycle(&app);
        }
        d.push().await;
        d.proxy.retire_old().await;
        d.resolve_wakes();
    }
    tracing::info!("shinyctl serve stopping; the copies and the load balancer keep running");
    let _ = std::fs::remove_file(home.api_sock());
    Ok(())
}

/// True when SIGTERM or SIGINT has arrived and not been handled yet.
async fn stop_pending(term: &mut tokio::signal::unix::Signal, int: &mut tokio::signal::unix::Signal) -> bool {
    tokio::select! {
        biased;
        _ = term.recv() => true,
        _ = int.recv() => true,
        _ = std::future::ready(()) => false,
    }
}

impl Daemon {
    /// Loads registry.json and each app's state.json. The processes they
    /// name that still run (same PID and start time) are adopted by the
    /// first cycle's observe, which runs at once.
    fn load(&mut self) -> anyhow::Result<()> {
        let registry = record::load_registry(&self.home)?;
        for (name, spec) in registry.apps {
            let state = record::load_state(&spec.state_file).unwrap_or_default();
            self.apps.insert(name, AppRt::new(spec, state));
        }
        Ok(())
    }

    /// When the loop should wake next: the tick, or an app's timer.
    fn next_wake(&self, next_tick: tokio::time::Instant) -> tokio::time::Instant {
        let now = now_ms();
        let soonest = self.apps.values().filter_map(|a| a.wake_at_ms).min();
        match soonest {
            Some(w) if w <= now => tokio::time::Instant::now(),
            Some(w) => next_tick.min(tokio::time::Instant::now() + Duration::from_millis(w - now)),
            None => next_tick,
        }
    }

    /// Folds an event into the in-memory view and marks its app due.
    async fn note_event(&mut self, ev: Event, due: &mut HashSet<String>, all: &mut bool) {
        match ev {
            Event::Changed { app } => {
                due.insert(app);
            }
            Event::Exit { app, pid, exit } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    // An exit the cycle already folded in (it reaped first) is old news.
                    if a.state.copies.iter().any(|r| r.pid == Some(pid)) {
                        tracing::info!(app, pid, "{}", exit.describe());
                        a.exits.insert(pid, exit);
                    }
                    a.ready.remove(&pid);
                }
                due.insert(app);
            }
            Event::Ready { app, pid } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    a.probing.remove(&pid);
                    a.ready.insert(pid);
                }
                due.insert(app);
            }
            Event::StandIn { app, down } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    // Not ready until it answers again (if it is alive at all).
                    if let Some(pid) = a.state.copies.iter().find(|r| r.copy == down).and_then(|r| r.pid) {
                        a.ready.remove(&pid);
                    }
                }
                due.insert(app);
            }
            Event::ProxyExit => {
                tracing::warn!("the load balancer exited; starting it again");
                self.proxy.forget();
                // Started by the loop once it has checked it is not stopping.
                *all = true;
            }
        }
    }

    /// Reads open connections and sessions per copy from the load balancer.
    async fn refresh_traffic(&mut self) {
        if let Some(stats) = self.proxy.stats(&self.home).await {
            for a in &stats.apps {
                if let Some(app) = self.apps.get_mut(&a.name) {
                    app.last_request_ms = app.last_request_ms.max(a.last_request_ms);
                }
            }
            self.traffic = stats.apps.into_iter().map(|a| (a.name, a.copies.into_iter().map(|c| (c.copy, c)).collect())).collect();
        }
    }

    /// Observe: what each recorded process is doing now.
    fn observe(&mut self, name: &str) -> Observed {
        let events = self.events.clone();
        let traffic = self.traffic.get(name).cloned().unwrap_or_default();
        let Some(app) = self.apps.get_mut(name) else { return Observed::default() };
        let mut observed = Observed { last_request_ms: app.last_request_ms, ..Observed::default() };
        for rec in &app.state.copies {
            let Some(pid) = rec.pid else { continue };
            let process = if let Some(exit) = app.exits.get(&pid) {
                Process::Exited(*exit)
            } else if !rec.pid_start.is_some_and(|s| procfs::is_alive(pid, s)) {
                // Gone before its watcher reported: reap it here if it is our
                // child; if it died while nobody watched, its status is unknown.
                let (code, signal) = act::reap(pid).unwrap_or((None, None));
                Process::Exited(Exit { at_ms: now_ms(), code, signal })
            } else {
                let ready = app.ready.contains(&pid);
                // The daemon watches what it starts from the start, so a
                // process first watched here is one it adopted.
                if follow(name, rec, ready, &mut app.watched, &mut app.probing, &events) {
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
    fn cycle(&mut self, name: &str) {
        let observed = self.observe(name);
        let now = now_ms();
        let home = self.home.clone();
        let taken: Vec<u16> = self.apps.values().flat_map(|a| a.state.copies.iter().map(|r| r.port)).collect();
        let events = self.events.clone();
        let Some(app) = self.apps.get_mut(name) else { return };
        // A wake is done once the processes put to sleep are gone, so no
        // dying process is taken for a ready copy.
        if app.wake_requested {
            if app.state.asleep_since_ms.is_none() {
                app.wake_requested = false;
            } else if app.state.copies.iter().all(|r| r.pid.is_none()) {
                app.state.asleep_since_ms = None;
                app.wake_requested = false;
                app.woke_ms = Some(now);
                tracing::info!(app = name, "waking");
            }
        }
        let mut spec = app.spec.clone();
        if app.deleting {
            spec.replicas = 0;
            spec.warm_replicas = 0;
        }
        let plan = reconcile::decide(&spec, &app.state, &observed, now);
        let before = std::mem::replace(&mut app.state, plan.state);
        app.roles = plan.roles;
        app.wake_at_ms = plan.wake_at_ms;
        // Exits are folded in; forget them and the PIDs they were about.
        for pid in before.copies.iter().filter_map(|r| r.pid) {
            if !app.state.copies.iter().any(|r| r.pid == Some(pid)) || app.exits.contains_key(&pid) {
                app.exits.remove(&pid);
                app.ready.remove(&pid);
                app.probing.remove(&pid);
                app.watched.remove(&pid);
                app.stopping.remove(&pid);
            }
        }
        // A forgotten copy's own disk goes with it, so a later copy with the
        // same number (a redeploy, a new app of the same name) starts empty.
        for gone in before.copies.iter().filter(|r| !app.state.copies.iter().any(|n| n.copy == r.copy)) {
            let _ = std::fs::remove_dir_all(home.scratch_dir(&app.spec.group, &app.spec.name, gone.copy));
        }
        if app.state != before {
            record::save_state(&app.spec.state_file, &app.state);
        }
        // Act.
        let mut changed = false;
        for action in plan.actions {
            match action {
                Action::Start(copy) => {
                    let Some(rec) = app.state.copies.iter_mut().find(|r| r.copy == copy) else { continue };
                    match act::start_copy(&home, &app.spec, rec, &taken) {
                        Ok(()) => {
                            tracing::info!(app = name, copy, pid = rec.pid.unwrap_or(0), port = rec.port, "started copy");
                            follow(name, rec, false, &mut app.watched, &mut app.probing, &events);
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
                    let Some(rec) = app.state.copies.iter().find(|r| r.copy == copy) else { continue };
                    let Some(pid) = rec.pid else { continue };
                    if app.stopping.insert(pid) {
                        tracing::info!(app = name, copy, pid, "stopping copy");
                        act::stop_process(pid, rec.pid_start);
                    }
                }
            }
        }
        if changed {
            record::save_state(&app.spec.state_file, &app.state);
        }
        if app.deleting && app.state.copies.is_empty() {
            let _ = std::fs::remove_file(&app.spec.state_file);
            self.apps.remove(name);
            tracing::info!(app = name, "deleted");
        }
    }

    /// Answers the requests waiting for a wake, once the table the load
    /// balancer has shows an active copy, or a copy of the wake exited.
    fn resolve_wakes(&mut self) {
        let home = self.home.clone();
        for app in self.apps.values_mut().filter(|a| !a.wake_waiters.is_empty()) {
            let outcome = if app.roles.iter().any(|(_, r)| *r == Role::Active) {
                Some(Ok(()))
            } else if app.deleting {
                Some(Err(format!("{} was deleted", app.spec.name)))
            } else {
                let since = app.woke_ms.unwrap_or(u64::MAX);
                app.state.copies.iter().find(|r| r.last_exit.is_some_and(|e| e.at_ms >= since)).map(|r| {
                    let exit = r.last_exit.map(|e| e.describe()).unwrap_or_default();
                    Err(format!("copy {} {exit} while waking; see {}", r.copy, log_path(&home, &app.spec, r.copy)))
                })
            };
            if let Some(outcome) = outcome {
                for waiter in app.wake_waiters.drain(..) {
                    let _ = waiter.send(outcome.clone());
                }
            }
        }
    }

    /// The copies table for every app, from the last roles.
    fn table(&self) -> ProxyTable {
        let apps = self
            .apps
            .values()
            .filter(|a| !a.deleting)
            .map(|a| ProxyApp {
                name: a.spec.name.clone(),
                host: a.spec.host.clone(),
                port: a.spec.port,
                policy: a.spec.lb_policy,
                request_timeout_ms: a.spec.request_timeout_ms,
                asleep: a.state.asleep_since_ms.is_some(),
                copies: a
                    .roles
                    .iter()
                    .filter_map(|(copy, role)| {
                        let rec = a.state.copies.iter().find(|r| r.copy == *copy)?;
                        Some(ProxyCopy { copy: *copy, port: rec.port, role: *role, pid: rec.pid? })
                    })
                    .collect(),
            })
            .collect();
        ProxyTable { apps }
    }

    /// Push: sends the copies table to the load balancer when it changed.
    async fn push(&mut self) {
        let table = self.table();
        let home = self.home.clone();
        self.proxy.push(&home, table).await;
    }

    /// Rotates copy logs and api.log past 1 GiB by copy-and-truncate, so a
    /// copy that writes while the daemon is down loses nothing.
    fn rotate_logs(&self) {
        let copies =
            self.apps.values().flat_map(|a| a.state.copies.iter().map(|r| self.home.copy_log(&a.spec.group, &a.spec.name, r.copy)));
        for path in copies.chain([self.home.api_log()]) {
            if let Err(e) = record::rotate_if_larger(&path, LOG_ROTATE_BYTES) {
                tracing::warn!(log = %path.display(), "cannot rotate: {e}");
            }
        }
    }

    /// Saves registry.json from the apps held (those not being deleted).
    fn save_registry(&self) -> anyhow::Result<()> {
        let apps = self.apps.iter().filter(|(_, a)| !a.deleting).map(|(n, a)| (n.clone(), a.spec.clone())).collect();
        record::save_registry(&self.home, &crate::model::Registry { apps })
    }
}

/// Watches a running copy's process for its exit and, until it is ready,
/// probes its port; each once per process. Returns true when the process
/// was not watched before.
fn follow(
    name: &str,
    rec: &crate::model::CopyRecord,
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

/// The path of a copy's log, for messages.
pub fn log_path(home: &Home, spec: &AppSpec, copy: u32) -> String {
    home.copy_log(&spec.group, &spec.name, copy).display().to_string()
}

/// True when a path is the same file as another, by canonical path.
pub fn same_path(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// True when a daemon answers on the home's socket.
pub fn api_answers(home: &Home) -> bool {
    api::answers(home)
}
