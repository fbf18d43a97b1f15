//! The operator's commands on a running app and on the daemon (README,
//! "Stop and start"), as the daemon's intent methods: `stop_app`,
//! `start_app`, `scale`, `delete`, `shut_down`, and `ask_wake`, the load
//! balancer's wake. Each changes the daemon's state under its lock (no
//! waiting inside) and tells the loop.

use tokio::sync::oneshot;

use crate::serve::app::WakeOutcome;
use crate::serve::error::{Done, ServeError};
use crate::serve::state_files;
use crate::serve::AppRt;
use crate::serve::Daemon;
use crate::serve::Event;

impl Daemon {
    /// An app that is not being deleted, by name.
    fn live_app(&mut self, name: &str) -> Result<&mut AppRt, ServeError> {
        self.apps.get_mut(name).filter(|a| !a.recorded.deleting).ok_or_else(|| ServeError::NoSuchApp(name.to_string()))
    }

    /// Tells the loop that app `name` changed: its cycle runs at once.
    fn changed(&self, name: &str) {
        let _ = self.events.send(Event::Changed { app: name.to_string() });
    }

    /// `POST /v1/apps/NAME/stop`: the app's copies stop (requests in flight
    /// get up to a second, as with `--now`), its port stays held and answers
    /// that the app is stopped; no request wakes it. Kept in state.json, so a
    /// restarted daemon keeps it stopped.
    pub(in crate::serve) fn stop_app(&mut self, name: &str) -> Result<Done, ServeError> {
        let app = self.live_app(name)?;
        if app.recorded.state.stopped_since_ms.is_some() {
            return Ok(Done::said(format!("{name}: already stopped; `shinyctl start {name}` starts it.")));
        }
        let asleep = app.recorded.state.asleep_since_ms.is_some();
        app.recorded.state.stopped_since_ms = Some(crate::serve::now_ms());
        app.recorded.state.stop_now = true;
        let copies = app.recorded.state.copies.iter().filter(|r| r.pid.is_some()).count();
        state_files::record(&app.recorded, &mut app.tracked);
        let port = app.recorded.spec.route.port;
        self.changed(name);
        let what = match copies {
            0 if asleep => "asleep, no copy runs".to_string(),
            1 => "stopping 1 copy".to_string(),
            n => format!("stopping {n} copies"),
        };
        Ok(Done::said(format!(
            "{name}: {what}; port {port} stays held and answers that {name} is stopped. `shinyctl start {name}` starts it again."
        )))
    }

    /// `POST /v1/apps/NAME/start`: undoes `stop`; the copies start (awake).
    pub(in crate::serve) fn start_app(&mut self, name: &str) -> Result<Done, ServeError> {
        let app = self.live_app(name)?;
        if app.recorded.state.stopped_since_ms.take().is_none() {
            return Ok(Done::said(format!("{name}: not stopped; nothing to start.")));
        }
        app.recorded.state.asleep_since_ms = None;
        app.recorded.state.awake_since_ms = None;
        let n = app.recorded.spec.scale.replicas + app.recorded.spec.scale.warm_replicas;
        state_files::record(&app.recorded, &mut app.tracked);
        self.changed(name);
        Ok(Done::said(format!("{name}: starting {n} {}. Watch: shinyctl status {name}", if n == 1 { "copy" } else { "copies" })))
    }

    /// `POST /v1/apps/NAME/scale?replicas=N`: sets `replicas` (the active
    /// copies) without a redeploy, until the manifest is applied again.
    pub(in crate::serve) fn scale(&mut self, name: &str, replicas: u32) -> Result<Done, ServeError> {
        let max = crate::manifest::MAX_COPIES;
        if replicas == 0 || u64::from(replicas) > max {
            return Err(ServeError::Invalid(format!(
                "{name}: {replicas} replicas is not allowed; allowed: 1 to {max} (`shinyctl stop {name}` stops every copy)"
            )));
        }
        let app = self.live_app(name)?;
        let was = std::mem::replace(&mut app.recorded.spec.scale.replicas, replicas);
        self.save_registry().map_err(ServeError::Registry)?;
        self.changed(name);
        Ok(Done::said(format!(
            "{name}: replicas {was} -> {replicas}, until its manifest is applied again (set replicas: {replicas} there to keep it). Watch: shinyctl status {name}"
        )))
    }

    /// `DELETE /v1/apps/NAME[?now=1]`: the app is left out of registry.json
    /// and its copies stop (drained, or at once with `now`); forgotten once
    /// they are gone. Deleting again with `now` hurries a delete that drains.
    pub(in crate::serve) fn delete(&mut self, name: &str, now: bool) -> Result<Done, ServeError> {
        let app = self.apps.get_mut(name).ok_or_else(|| ServeError::NoSuchApp(name.to_string()))?;
        if app.recorded.deleting && (!now || app.recorded.state.stop_now) {
            let running = app.recorded.state.copies.iter().filter(|r| r.pid.is_some()).count();
            return Ok(Done::said(if app.recorded.state.stop_now {
                format!("{name}: already being deleted; {running} of its copies are being stopped now.")
            } else {
                format!("{name}: already being deleted; {running} of its copies still run until their sessions end (`shinyctl delete {name} --now` stops them now).")
            }));
        }
        app.recorded.deleting = true;
        app.recorded.state.stop_now = now;
        let copies = app.recorded.state.copies.len();
        self.save_registry().map_err(ServeError::Registry)?;
        self.changed(name);
        let how = match (copies, now) {
            (1, true) => "its 1 copy stops now",
            (1, false) => "its 1 copy stops once its sessions end",
            (_, true) => "its {n} copies stop now",
            (_, false) => "its {n} copies stop once their sessions end",
        };
        Ok(Done::said(format!("{name}: deleted; {}.", how.replace("{n}", &copies.to_string()))))
    }

    /// `POST /v1/shutdown[?all=1]`: the daemon stops once it has answered; the
    /// load balancer and the copies run on (a new daemon adopts them), or with
    /// `all` are stopped too, first.
    pub(in crate::serve) fn shut_down(&mut self, all: bool) -> Done {
        self.shutting_down = Some(all);
        let _ = self.events.send(Event::Shutdown);
        let pid = std::process::id();
        Done::said(if all {
            format!("shinyctl serve (pid {pid}) stops its apps' copies and the load balancer, then itself.")
        } else {
            format!("shinyctl serve (pid {pid}) stops; the load balancer and the copies keep running, and a new daemon adopts them.")
        })
    }

    /// The load balancer asks to wake app `name`: the waiter gets the wake's
    /// outcome. `Ok(None)` when the app is awake already (the waiter is
    /// dropped); otherwise how long the request may wait (its
    /// request-timeout).
    pub(in crate::serve) fn ask_wake(
        &mut self,
        name: &str,
        waiter: oneshot::Sender<WakeOutcome>,
    ) -> Result<Option<std::time::Duration>, ServeError> {
        let app = self.live_app(name)?;
        if app.recorded.state.asleep_since_ms.is_none() && app.tracked.has_active() {
            return Ok(None);
        }
        if !std::mem::replace(&mut app.wake.requested, true) {
            tracing::info!(app = name, "a wake of {name} asked; the load balancer holds the request");
        }
        let now = crate::serve::now_ms();
        app.wake.asked_ms.get_or_insert(now);
        crate::serve::app::WakeSteps::note(&mut app.wake.steps.asked, now);
        app.wake.waiters.push(waiter);
        let timeout = std::time::Duration::from_millis(app.recorded.spec.route.request_timeout_ms);
        self.changed(name);
        Ok(Some(timeout))
    }

    /// The load balancer's report of a stand-in: logged, and the app's cycle
    /// runs at once.
    pub(in crate::serve) fn note_stand_in(&self, name: &str, stand_in: &crate::wire::StandIn) {
        if let Some(down) = stand_in.down {
            tracing::warn!(app = name, down, stand_in = ?stand_in.stand_in, "copy refused a connection; the load balancer used a stand-in");
        }
        if stand_in.full {
            tracing::info!(app = name, stand_in = ?stand_in.stand_in, "every active copy is full; the load balancer sent a new visitor to the spare");
        }
        let _ = self.events.send(Event::StandIn { app: name.to_string(), down: stand_in.down, full: stand_in.full });
    }
}
