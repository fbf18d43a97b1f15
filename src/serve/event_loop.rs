//! The daemon's event loop: wait for an event, an app's timer or the tick,
//! then run the cycle for the apps that are due, push the table and answer
//! the wakes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::home::Home;
use crate::wire::api_client::Client;

use super::api;
use super::notify;
use super::now_ms;
use super::proxy_ctl;
use super::Daemon;
use super::Event;
use super::PendingLaunch;
use super::Shared;
use super::Tallies;
use super::TICK;
use crate::serve::copies::orphans;
use crate::serve::copies::probe;
use crate::serve::deploys::sockets;
use crate::serve::state_files;
use crate::serve::views::metrics;
use crate::serve::watches::memory;

/// Runs the daemon in the foreground until SIGTERM or SIGINT. Stopping it
/// stops only the daemon: the copies and the load balancer keep running.
pub fn run(home: Home) -> anyhow::Result<()> {
    // Before any thread starts, and before anything is spawned.
    let notify_socket = notify::take_socket();
    home.ensure()?;
    if Client::answers(&home) {
        anyhow::bail!("shinyctl serve is already running for {} (it answers on {})", home.root.display(), home.api_sock().display());
    }
    // A daemon that was just told to stop (`pkill … && shinyctl serve -d`)
    // lets go of the lock a moment later: wait for it rather than fail.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lock = loop {
        match state_files::lock_exclusive(&home.serve_lock()) {
            Ok(lock) => break lock,
            Err(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => anyhow::bail!("shinyctl serve is already running for {}", home.root.display()),
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (writer, _guard) = tracing_appender::non_blocking(tracing_appender::rolling::never(&home.root, "api.log"));
    // Also to stderr: in the foreground (a service), journald has it. Not
    // when stderr is api.log itself (a daemon started by `-d` or `apply`).
    use tracing_subscriber::fmt::writer::MakeWriterExt;
    let to_stderr = !same_file(Path::new("/proc/self/fd/2"), &home.api_log());
    crate::logging::init(writer.and(std::io::stderr.with_filter(move |_| to_stderr)), false)?;
    // The loop runs as a spawned task, so the compiler holds it to the rule
    // the other tasks keep: no guard of the daemon's lock across an `.await`.
    let result = rt.block_on(async move {
        tokio::spawn(run_async(home, notify_socket)).await.unwrap_or_else(|e| Err(anyhow::anyhow!("the daemon's loop ended: {e}")))
    });
    drop(lock);
    result
}

/// `shutdown --all`: every copy and the load balancer stopped (SIGTERM,
/// SIGKILL after the grace), at once and side by side; the copies' records
/// keep their numbers, ports and disks without a process, so the next
/// daemon starts them anew (not as crashes). Each disk is kept in its image
/// but unmounted, and each copy's cgroup removed: nothing of shinyctl's is
/// left in the kernel, so the home can be moved or removed, and the next
/// start mounts the disk again, as after a reboot.
async fn stop_everything(shared: &Shared, proxy_pid: Option<u32>) {
    tracing::info!("shinyctl serve stopping, with every copy and the load balancer (shutdown --all)");
    let mut procs: Vec<(u32, Option<u64>)> = Vec::new();
    {
        let mut d = shared.lock();
        for app in d.apps.values_mut() {
            for rec in app.recorded.state.copies.iter_mut() {
                if let Some(pid) = rec.pid.take() {
                    procs.push((pid, rec.pid_start.take()));
                }
            }
            state_files::record(&app.recorded, &mut app.tracked);
        }
    }
    procs.extend(proxy_pid.map(|p| (p, crate::sys::procfs::start_ticks(p))));
    let stops: Vec<_> = procs
        .into_iter()
        .map(|(pid, start)| tokio::task::spawn_blocking(move || crate::serve::copies::act::stop_and_wait(pid, start)))
        .collect();
    for s in stops {
        let _ = s.await;
    }
    finish_deletes(shared).await;
    let detached: Vec<std::thread::JoinHandle<()>> = {
        let d = shared.lock();
        let mut threads = Vec::new();
        for (name, app) in &d.apps {
            let spec = &app.recorded.spec;
            for rec in &app.recorded.state.copies {
                let scratch = d.home.scratch_dir(&spec.group, &spec.name, rec.copy);
                threads.extend(crate::wire::launch::detach_disk(&scratch));
                d.cgroups.remove(&crate::sys::cgroup::leaf(name, rec.copy));
            }
        }
        threads
    };
    // The daemon exits next: what the disks cached is written back first.
    let _ = tokio::task::spawn_blocking(move || detached.into_iter().for_each(|t| drop(t.join()))).await;
}

/// After `shutdown --all` has stopped every copy: an app being deleted is
/// done with, so what its cycles would have removed as its copies ended
/// goes now (each copy's disk, unmounted, its cgroups, its state file and
/// releases). The next daemon does not know the app (registry.json leaves
/// it out) and would never remove them. Waits for the removals, which run
/// on threads of their own, since the daemon exits next.
async fn finish_deletes(shared: &Shared) {
    let removals: Vec<std::thread::JoinHandle<()>> = {
        let mut d = shared.lock();
        let deleting: Vec<String> = d.apps.iter().filter(|(_, a)| a.recorded.deleting).map(|(n, _)| n.clone()).collect();
        let mut threads = Vec::new();
        for name in deleting {
            let Some(app) = d.apps.remove(&name) else { continue };
            let spec = &app.recorded.spec;
            for rec in &app.recorded.state.copies {
                threads.extend(crate::wire::launch::remove_scratch(&d.home.scratch_dir(&spec.group, &spec.name, rec.copy)));
                d.cgroups.remove(&crate::sys::cgroup::leaf(&name, rec.copy));
            }
            state_files::forget_deleted(&d.home, &name, &app.recorded);
        }
        d.save_registry_or_warn();
        threads
    };
    let _ = tokio::task::spawn_blocking(move || removals.into_iter().for_each(|t| drop(t.join()))).await;
}

/// True when two paths name the same file (device and inode).
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The daemon's life: started (state loaded, copies adopted, the API and
/// the watches running), then one turn of the loop per wait ([`next_work`],
/// [`run_cycles`]) until a signal or `shutdown`, then its end.
async fn run_async(home: Home, notify_socket: Option<std::ffi::OsString>) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let listener = api::bind(&home)?;
    // The loop alone talks to the load balancer, with the daemon's lock
    // released, so status and the API answer while it starts or is slow.
    let mut proxy = proxy_ctl::ProxyCtl::new(&home)?;
    let shared = start(&home, tx.clone(), listener, notify_socket.as_ref()).await?;
    let mut signals = Signals::new()?;
    let mut next_tick = tokio::time::Instant::now();
    let mut rotating = state_files::Rotation::default();
    while let Some(work) = next_work(&shared, &mut rx, &mut signals, &mut next_tick).await {
        // A daemon told to stop starts nothing more, a load balancer least
        // of all: one killed beside it would come back with no one to end it.
        // A SIGTERM sent with the kill may reach the signal driver after the
        // exit does: a moment's wait before the cycle that would start a new one.
        if work.proxy_exited {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if signals.pending().await || shared.lock().shutting_down.is_some() {
            break;
        }
        if work.proxy_exited {
            proxy.forget();
        }
        run_cycles(&shared, &home, &mut proxy, &tx, work, &mut rotating).await;
    }
    crate::serve::copies::zygote_pool::stop();
    if shared.lock().shutting_down == Some(true) {
        stop_everything(&shared, proxy.pid()).await;
    } else {
        tracing::info!("shinyctl serve stopping; the copies and the load balancer keep running");
    }
    if let Some(socket) = &notify_socket {
        let _ = notify::send(socket, "STOPPING=1");
    }
    let _ = std::fs::remove_file(home.api_sock());
    Ok(())
}

/// The daemon made: the pool started, the load balancer's sockets taken
/// back, the saved state loaded, copies no record named adopted or
/// stopped; then the API, the watches, the metrics and systemd's
/// readiness running on their own tasks.
async fn start(
    home: &Home,
    events: mpsc::UnboundedSender<Event>,
    listener: tokio::net::UnixListener,
    notify_socket: Option<&std::ffi::OsString>,
) -> anyhow::Result<Shared> {
    // Before any process is started: a v2 daemon moves itself into its leaf.
    let cgroups = crate::sys::cgroup::Cgroups::discover(&crate::sys::cgroup::home_tag(&home.root));
    crate::serve::copies::zygote_pool::start(home, &cgroups);
    let sockets = sockets::HeldSockets::adopt(take_back_sockets(home).await);
    let mut daemon = Daemon {
        home: home.clone(),
        apps: BTreeMap::new(),
        events,
        proxy_pid: None,
        traffic: HashMap::new(),
        traffic_heard: false,
        refusing: HashMap::new(),
        sockets,
        stops: Vec::new(),
        launches: Vec::new(),
        tallies: Tallies::default(),
        cpu_percent: Default::default(),
        copy_mem: Default::default(),
        pool_mem: 0,
        cgroups: cgroups.clone(),
        shutting_down: None,
        table_generations: Default::default(),
    };
    daemon.load()?;
    // Copies started by a daemon that ended before it recorded them.
    let (adopted, stopped) = daemon.settle_unrecorded(&orphans::launchers_of(&home.root));
    if adopted + stopped > 0 {
        tracing::info!(adopted, stopped, "copies no record named");
    }
    let wanted = daemon.listen_addrs();
    daemon.sockets.sync(&wanted);
    tracing::info!(pid = std::process::id(), apps = daemon.apps.len(), "shinyctl serve started");
    tracing::info!("{}", cgroups.describe());
    let shared = Shared::new(daemon);
    tokio::spawn(api::serve(listener, shared.clone()));
    memory::spawn_watch(shared.clone(), cgroups);
    crate::serve::watches::disk::spawn_watch(shared.clone());
    crate::serve::watches::cpu::spawn_sampler(shared.clone(), crate::serve::copies::zygote_pool::memory_used);
    tokio::spawn(metrics::serve_tcp_from_env(shared.clone()));
    if let Some(socket) = notify_socket.cloned() {
        tokio::spawn(notify::ready_when_answering(socket, home.api_sock()));
    }
    Ok(shared)
}

/// SIGTERM and SIGINT, each of which stops the daemon.
struct Signals {
    /// SIGTERM (systemd's stop, `kill`).
    term: tokio::signal::unix::Signal,
    /// SIGINT (Ctrl-C in the foreground).
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// True when either signal has come and not been taken yet; never waits.
    async fn pending(&mut self) -> bool {
        tokio::select! {
            biased;
            _ = self.term.recv() => true,
            _ = self.int.recv() => true,
            _ = std::future::ready(()) => false,
        }
    }
}

/// What one turn of the loop is for.
struct Work {
    /// The apps whose cycle runs (an event named them, or their timer ran out).
    due: HashSet<String>,
    /// The tick: every app's cycle, the load balancer ensured, logs rotated.
    all: bool,
    /// The load balancer's process ended.
    proxy_exited: bool,
}

/// Waits for the next turn: events (taken all at once), an app's timer, or
/// the tick. `None` when the daemon is to stop (a signal, or no one left
/// to send events).
async fn next_work(
    shared: &Shared,
    rx: &mut mpsc::UnboundedReceiver<Event>,
    signals: &mut Signals,
    next_tick: &mut tokio::time::Instant,
) -> Option<Work> {
    let mut work = Work { due: HashSet::new(), all: false, proxy_exited: false };
    let wake = shared.lock().next_wake(*next_tick);
    tokio::select! {
        ev = rx.recv() => {
            let ev = ev?;
            let mut d = shared.lock();
            for ev in std::iter::once(ev).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                work.proxy_exited |= matches!(ev, Event::ProxyExit);
                d.note_event(ev, &mut work.due, &mut work.all);
            }
        }
        _ = tokio::time::sleep_until(wake) => {
            if tokio::time::Instant::now() >= *next_tick {
                work.all = true;
                *next_tick = tokio::time::Instant::now() + TICK;
            } else {
                let d = shared.lock();
                let now = now_ms();
                work.due.extend(d.apps.iter().filter(|(_, a)| a.tracked.wake_at_ms.is_some_and(|w| w <= now)).map(|(n, _)| n.clone()));
            }
        }
        _ = signals.term.recv() => return None,
        _ = signals.int.recv() => return None,
    }
    Some(work)
}

/// One turn's cycles: observe, decide, record under the lock; the
/// launchers, the sockets, the push and the load balancer's figures off
/// it; the stops after the push; then the wakes answered.
async fn run_cycles(
    shared: &Shared,
    home: &Home,
    proxy: &mut proxy_ctl::ProxyCtl,
    tx: &mpsc::UnboundedSender<Event>,
    work: Work,
    rotating: &mut state_files::Rotation,
) {
    let Work { mut due, all, .. } = work;
    if all {
        proxy.ensure(home, tx).await;
        let logs = shared.lock().log_paths();
        rotating.start(logs);
    }
    // What /proc says of the due apps' processes, looked up with the
    // lock released (`status` does not wait for it), while the load
    // balancer is asked for its figures: the two are apart, and a wake
    // waits for both (README, "Sleep").
    let probes = {
        let d = shared.lock();
        if all {
            due.extend(d.apps.keys().cloned());
        }
        d.probes(&due)
    };
    let looked_up = tokio::task::spawn_blocking(move || probe::ProbeFacts::find(probes));
    let (stats, facts) = tokio::join!(proxy.stats(home), looked_up);
    let facts = facts.unwrap_or_default();
    // Stops are added by the cycles alone, so whether any wait is known
    // here, without locking again after the push.
    let (table, generation, launches, stopping) = {
        let mut guard = shared.lock();
        let d = &mut *guard;
        d.proxy_pid = proxy.pid();
        if let Some(stats) = stats {
            d.fold_traffic(stats);
        }
        if all {
            // Again: an app applied since the lookups is cycled too
            // (its processes looked up on the spot).
            due.extend(d.apps.keys().cloned());
            d.sweep_cgroups();
        }
        for app in due {
            d.cycle(&app, &facts);
        }
        let table = d.table();
        let generation = d.table_generations.made(&table);
        (table, generation, d.take_launches(), !d.stops.is_empty())
    };
    run_launches(shared, launches).await;
    // The sockets first: a port the apps no longer name closes before
    // the table goes (no connection waits in a queue nobody reads);
    // a new one waits until the table names it.
    sync_sockets(shared, home, proxy.pid()).await;
    let pushed = proxy.push(home, table).await;
    let pushed_ms = now_ms();
    // What the load balancer still answers for the copies it no longer
    // has, asked after the push: a stop waits for those answers.
    let after = if pushed && stopping { proxy.stats(home).await } else { None };
    let listening = {
        let mut d = shared.lock();
        d.table_generations.pushed(generation);
        d.run_stops(pushed, after.as_ref());
        // The old load balancer goes once the new one listens on every socket.
        d.sockets.has_been_given(proxy.pid())
    };
    proxy.retire_old(home, listening).await;
    shared.lock().resolve_wakes(pushed_ms);
}

/// The launchers the cycles readied, run with the lock released: a fork
/// and exec wait on the scheduler, `status` does not.
async fn run_launches(shared: &Shared, launches: Vec<PendingLaunch>) {
    if launches.is_empty() {
        return;
    }
    let ran = tokio::task::spawn_blocking(move || launches.into_iter().map(PendingLaunch::run).collect()).await.unwrap_or_else(|e| {
        // Never seen: spawning does not panic. The records still wait for
        // a process, so the next cycle starts them again.
        tracing::error!("the copies' launchers could not be run: {e}");
        Vec::new()
    });
    shared.lock().launched(ran);
}

/// The listening sockets of the load balancer that runs, if one does (a
/// daemon that restarts): asked for on `handover.sock`, off the runtime.
async fn take_back_sockets(home: &Home) -> HashMap<sockets::Addr, std::net::TcpListener> {
    let path = crate::wire::handover::path(home);
    if !path.exists() {
        return HashMap::new();
    }
    match tokio::task::spawn_blocking(move || crate::wire::handover::ask(&path)).await {
        Ok(Ok(got)) => {
            tracing::info!("took back {} listening sockets from the running load balancer", got.len());
            got
        }
        Ok(Err(e)) => {
            tracing::info!("no listening socket from a running load balancer ({e}); binding them anew");
            HashMap::new()
        }
        Err(_) => HashMap::new(),
    }
}

/// Makes the listening sockets held match the apps and gives the load
/// balancer the set when it changed. A port that could not be bound is
/// tried once more after the load balancer has let go of the sockets left
/// out (a host changed on the same port: the old socket held it).
async fn sync_sockets(shared: &Shared, home: &Home, proxy_pid: Option<u32>) {
    for _ in 0..2 {
        let give = {
            let mut d = shared.lock();
            let wanted = d.listen_addrs();
            d.sockets.sync(&wanted);
            d.sockets.to_give(proxy_pid)
        };
        let Some((pid, set)) = give else { return };
        give_sockets(shared, home, pid, set).await;
        if !shared.lock().sockets.has_failures() {
            return;
        }
    }
}

/// Gives the load balancer `pid` the set of listening sockets, off the
/// daemon's lock (the exchange waits on the load balancer), and notes it.
async fn give_sockets(shared: &Shared, home: &Home, pid: u32, set: Vec<(sockets::Addr, std::net::TcpListener)>) {
    let path = crate::wire::handover::path(home);
    let result = tokio::task::spawn_blocking(move || sockets::give(&path, &set).map(|took| (took, set))).await;
    match result {
        Ok(Ok((took, set))) if took == pid => {
            tracing::info!(pid, "gave the load balancer {} listening sockets", set.len());
            shared.lock().sockets.given(pid, set.into_iter().map(|(a, _)| a).collect());
        }
        Ok(Ok((took, _))) => tracing::warn!(pid, took, "handover.sock is served by another load balancer than the one the daemon runs"),
        Ok(Err(e)) => tracing::warn!(pid, "cannot give the load balancer its listening sockets: {e}; trying again"),
        Err(e) => tracing::warn!("cannot give the load balancer its listening sockets: {e}"),
    }
}

impl Daemon {
    /// When the loop should wake next: the tick, or an app's timer.
    fn next_wake(&self, next_tick: tokio::time::Instant) -> tokio::time::Instant {
        let now = now_ms();
        let soonest = self.apps.values().filter_map(|a| a.tracked.wake_at_ms).chain(self.stops_due_ms()).min();
        match soonest {
            Some(w) if w <= now => tokio::time::Instant::now(),
            Some(w) => next_tick.min(tokio::time::Instant::now() + Duration::from_millis(w - now)),
            None => next_tick,
        }
    }

    /// Folds an event into the in-memory view and marks its app due.
    fn note_event(&mut self, ev: Event, due: &mut HashSet<String>, all: &mut bool) {
        match ev {
            Event::Changed { app } => {
                due.insert(app);
            }
            Event::Exit { app, pid, exit } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    // An exit the cycle already folded in (it reaped first) is old news.
                    if a.recorded.state.copies.iter().any(|r| r.pid == Some(pid)) {
                        a.tracked.process_mut(pid).exit = Some(exit);
                    }
                    a.tracked.unready(pid);
                }
                due.insert(app);
            }
            Event::Ready { app, pid, listening_ms, r_pid, r_started_ms } => {
                crate::serve::views::status_view::log_missing_fences(self, &app, pid);
                if let Some(a) = self.apps.get_mut(&app) {
                    a.wake.note_ready(r_started_ms, listening_ms, now_ms());
                    let process = a.tracked.process_mut(pid);
                    process.probing = false;
                    process.ready = true;
                    process.r_pid = r_pid;
                }
                due.insert(app);
            }
            Event::StandIn { app, down, full } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    // Not ready until it answers again (if it is alive at all).
                    if let Some(pid) = a.recorded.state.copies.iter().find(|r| Some(r.copy) == down).and_then(|r| r.pid) {
                        a.tracked.unready(pid);
                    }
                    // Taken by the next cycle's decide: the app grows.
                    a.tracked.full |= full;
                }
                due.insert(app);
            }
            // The loop ends once the events in hand are folded in.
            Event::Shutdown => {}
            Event::ProxyExit => {
                tracing::warn!("the load balancer exited; starting it again");
                self.tallies.load_balancer_restarts += 1;
                // Started by the loop once it has checked it is not stopping.
                *all = true;
            }
        }
    }

    /// Folds in the open connections and sessions per copy the load
    /// balancer reported.
    pub(super) fn fold_traffic(&mut self, stats: crate::wire::ProxyStats) {
        for a in &stats.apps {
            if let Some(app) = self.apps.get_mut(&a.name) {
                app.tracked.last_request_ms = app.tracked.last_request_ms.max(a.last_request_ms);
            }
        }
        self.refusing = stats.apps.iter().map(|a| (a.name.clone(), a.refusing.clone())).collect();
        self.traffic = stats.apps.into_iter().map(|a| (a.name, a.copies.into_iter().map(|c| (c.copy, c)).collect())).collect();
        self.traffic_heard = true;
    }
}
