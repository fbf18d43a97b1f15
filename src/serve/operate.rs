//! The operator's commands on a running app and on the daemon (README,
//! "Stop and start"): `stop`, `start`, `scale` and `shutdown [--all]`.

use hyper::StatusCode;

use super::reply::{error, not_found, ok, Reply};
use super::{record, Event, Shared};

/// `POST /v1/apps/NAME/stop`: the app's copies stop (requests in flight
/// get up to a second, as with `--now`), its port stays held and answers
/// that the app is stopped; no request wakes it. Kept in state.json, so a
/// restarted daemon keeps it stopped.
pub async fn stop(shared: &Shared, name: &str) -> Reply {
    let mut d = shared.lock();
    let Some(app) = d.apps.get_mut(name).filter(|a| !a.recorded.deleting) else { return not_found(name) };
    if app.recorded.state.stopped_since_ms.is_some() {
        return ok(format!("{name}: already stopped; `shinyctl start {name}` starts it."));
    }
    app.recorded.state.stopped_since_ms = Some(super::now_ms());
    app.recorded.state.stop_now = true;
    let copies = app.recorded.state.copies.iter().filter(|r| r.pid.is_some()).count();
    app.tracked.state_error = record::save_state(&app.recorded.spec.state_file, &app.recorded.state).err().map(|e| e.to_string());
    let _ = d.events.send(Event::Changed { app: name.to_string() });
    let port = d.apps.get(name).map_or(0, |a| a.recorded.spec.route.port);
    ok(format!(
        "{name}: stopping {copies} {}; port {port} stays held and answers that {name} is stopped. `shinyctl start {name}` starts it again.",
        if copies == 1 { "copy" } else { "copies" }
    ))
}

/// `POST /v1/apps/NAME/start`: undoes `stop`; the copies start (awake).
pub async fn start(shared: &Shared, name: &str) -> Reply {
    let mut d = shared.lock();
    let Some(app) = d.apps.get_mut(name).filter(|a| !a.recorded.deleting) else { return not_found(name) };
    if app.recorded.state.stopped_since_ms.take().is_none() {
        return ok(format!("{name}: not stopped; nothing to start."));
    }
    app.recorded.state.asleep_since_ms = None;
    app.recorded.state.awake_since_ms = None;
    let n = app.recorded.spec.scale.replicas + app.recorded.spec.scale.warm_replicas;
    app.tracked.state_error = record::save_state(&app.recorded.spec.state_file, &app.recorded.state).err().map(|e| e.to_string());
    let _ = d.events.send(Event::Changed { app: name.to_string() });
    ok(format!("{name}: starting {n} {}. Watch: shinyctl status {name}", if n == 1 { "copy" } else { "copies" }))
}

/// `POST /v1/apps/NAME/scale?replicas=N`: sets `replicas` (the active
/// copies) without a redeploy, until the manifest is applied again.
pub async fn scale(shared: &Shared, name: &str, replicas: u32) -> Reply {
    let max = crate::manifest::MAX_COPIES;
    if replicas == 0 || u64::from(replicas) > max {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{name}: {replicas} replicas is not allowed; allowed: 1 to {max} (`shinyctl stop {name}` stops every copy)"),
        );
    }
    let mut d = shared.lock();
    let Some(app) = d.apps.get_mut(name).filter(|a| !a.recorded.deleting) else { return not_found(name) };
    let was = std::mem::replace(&mut app.recorded.spec.scale.replicas, replicas);
    if let Err(e) = d.save_registry() {
        return error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write registry.json: {e:#}"));
    }
    let _ = d.events.send(Event::Changed { app: name.to_string() });
    ok(format!(
        "{name}: replicas {was} -> {replicas}, until its manifest is applied again (set replicas: {replicas} there to keep it). Watch: shinyctl status {name}"
    ))
}

/// `POST /v1/shutdown[?all=1]`: the daemon stops once it has answered; the
/// load balancer and the copies run on (a new daemon adopts them), or with
/// `all` are stopped too, first.
pub async fn shutdown(shared: &Shared, all: bool) -> Reply {
    let mut d = shared.lock();
    d.shutting_down = Some(all);
    let _ = d.events.send(Event::Shutdown);
    let pid = std::process::id();
    ok(if all {
        format!("shinyctl serve (pid {pid}) stops its apps' copies and the load balancer, then itself.")
    } else {
        format!("shinyctl serve (pid {pid}) stops; the load balancer and the copies keep running, and a new daemon adopts them.")
    })
}
