//! The daemon's event loop: wait for an event, an app's timer or the tick,
//! then run the cycle for the apps that are due, push the table and answer
//! the wakes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Mutex};

use crate::api_client::Client;
use crate::home::Home;

use super::{api, now_ms, proxy_ctl, record, Daemon, Event, Shared, TICK};

/// Runs the daemon in the foreground until SIGTERM or SIGINT. Stopping it
/// stops only the daemon: the copies and the load balancer keep running.
pub fn run(home: Home) -> anyhow::Result<()> {
    home.ensure()?;
    if Client::answers(&home) {
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
    crate::logging::init(writer, false)?;
    let result = rt.block_on(run_async(home));
    drop(lock);
    result
}

async fn run_async(home: Home) -> anyhow::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let listener = api::bind(&home)?;
    let proxy = proxy_ctl::ProxyCtl::new(&home)?;
    let mut daemon =
        Daemon { home: home.clone(), apps: BTreeMap::new(), events: tx.clone(), proxy, traffic: HashMap::new(), stops: Vec::new() };
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
        let mut proxy_exited = false;
        let wake = {
            let d = shared.lock().await;
            d.next_wake(next_tick)
        };
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else { break };
                let mut d = shared.lock().await;
                proxy_exited |= matches!(ev, Event::ProxyExit);
                d.note_event(ev, &mut due, &mut all).await;
                while let Ok(ev) = rx.try_recv() {
                    proxy_exited |= matches!(ev, Event::ProxyExit);
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
                    due.extend(d.apps.iter().filter(|(_, a)| a.tracked.wake_at_ms.is_some_and(|w| w <= now)).map(|(n, _)| n.clone()));
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
        // A daemon told to stop starts nothing more, a load balancer least
        // of all: one killed beside it would come back with no one to end it.
        // A SIGTERM sent with the kill may reach the signal driver after the
        // exit does: a moment's wait before the cycle that would start a new one.
        if proxy_exited {
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
    async fn note_event(&mut self, ev: Event, due: &mut HashSet<String>, all: &mut bool) {
        match ev {
            Event::Changed { app } => {
                due.insert(app);
            }
            Event::Exit { app, pid, exit } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    // An exit the cycle already folded in (it reaped first) is old news.
                    if a.recorded.state.copies.iter().any(|r| r.pid == Some(pid)) {
                        tracing::info!(app, pid, "{}", exit.describe());
                        a.tracked.exits.insert(pid, exit);
                    }
                    a.tracked.ready.remove(&pid);
                }
                due.insert(app);
            }
            Event::Ready { app, pid } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    a.tracked.probing.remove(&pid);
                    a.tracked.ready.insert(pid);
                }
                due.insert(app);
            }
            Event::StandIn { app, down } => {
                if let Some(a) = self.apps.get_mut(&app) {
                    // Not ready until it answers again (if it is alive at all).
                    if let Some(pid) = a.recorded.state.copies.iter().find(|r| r.copy == down).and_then(|r| r.pid) {
                        a.tracked.ready.remove(&pid);
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
    pub(super) async fn refresh_traffic(&mut self) {
        if let Some(stats) = self.proxy.stats(&self.home).await {
            for a in &stats.apps {
                if let Some(app) = self.apps.get_mut(&a.name) {
                    app.tracked.last_request_ms = app.tracked.last_request_ms.max(a.last_request_ms);
                }
            }
            self.traffic = stats.apps.into_iter().map(|a| (a.name, a.copies.into_iter().map(|c| (c.copy, c)).collect())).collect();
        }
    }
}
