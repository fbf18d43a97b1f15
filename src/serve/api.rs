//! The API on `api.sock`: HTTP/1.1 with JSON bodies under `/v1/…`.
//!
//! - `GET  /v1/version`
//! - `GET  /v1/status[?app=NAME]`
//! - `POST /v1/apply` (ApplyRequest; takes a release when it deploys)
//! - `POST /v1/reload` (every registered manifest applied again from its path)
//! - `POST /v1/apps/NAME/restart[?now=1]` (reads the manifest again, takes a release)
//! - `POST /v1/apps/NAME/rollback[?now=1]` (the release before the current one)
//! - `DELETE /v1/apps/NAME[?now=1]`
//! - `GET  /v1/apps/NAME/logs?copy=N`
//! - `POST /v1/apps/NAME/stand-in` (StandIn, from the load balancer)
//! - `POST /v1/apps/NAME/wake` (from the load balancer; answers once awake)
//! - `GET  /v1/metrics` (Prometheus text), `GET /v1/health` (see `metrics`)

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use hyper::{Method, Request, StatusCode};

use crate::api_client::VersionReply;
use crate::home::Home;
use crate::model::{ApplyRequest, LogsReply, RolloutReply, RolloutState, StandIn};
use crate::uds;

use super::reply::{error, not_found, ok, Reply};
use super::{Event, Shared};

/// Binds api.sock (mode 0600), replacing a stale one.
pub fn bind(home: &Home) -> anyhow::Result<tokio::net::UnixListener> {
    let path = home.api_sock();
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Serves the API until the daemon stops.
pub async fn serve(listener: tokio::net::UnixListener, shared: Shared) {
    uds::serve(listener, move |req| {
        let shared = shared.clone();
        async move { handle(req, shared).await }
    })
    .await;
}

/// The value of `key` in the query string.
fn query<'a>(req: &'a Request<hyper::body::Incoming>, key: &str) -> Option<&'a str> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then_some(v)
    })
}

fn flag(req: &Request<hyper::body::Incoming>, key: &str) -> bool {
    matches!(query(req, key), Some("" | "1" | "true"))
}

async fn handle(req: Request<hyper::body::Incoming>, shared: Shared) -> Reply {
    let path = req.uri().path().to_string();
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match (req.method().clone(), parts.as_slice()) {
        (Method::GET, ["v1", "version"]) => {
            uds::json_response(StatusCode::OK, &VersionReply { version: crate::model::BUILD.to_string(), pid: std::process::id() })
        }
        (Method::GET, ["v1", "status"]) => {
            let app = query(&req, "app").map(str::to_string);
            // The load balancer's figures are fetched with the lock released.
            let home = shared.lock().home.clone();
            // So is what /proc says of the copies.
            let (stats, shown) = tokio::join!(
                super::proxy_ctl::fetch_stats(&home, super::proxy_ctl::STATUS_TIMEOUT),
                super::status::look_up(&shared, app.as_deref())
            );
            let mut d = shared.lock();
            if let Some(stats) = stats {
                d.fold_traffic(stats);
            }
            match super::status::report(&d, app.as_deref(), &shown) {
                Ok(r) => uds::json_response(StatusCode::OK, &r),
                Err(e) => error(StatusCode::NOT_FOUND, e),
            }
        }
        (Method::POST, ["v1", "apply"]) => {
            let body = match uds::read_body(req.into_body(), ApplyRequest::MAX_BODY).await {
                Ok(b) => b,
                Err(e) if e.downcast_ref::<uds::TooLarge>().is_some() => {
                    let limit = ApplyRequest::MAX_BODY;
                    let message = format!(
                        "the apply request is too large: this API takes at most {} ({limit} bytes) of JSON, the manifest's text and path",
                        crate::manifest::show_size(limit as u64)
                    );
                    return error(StatusCode::PAYLOAD_TOO_LARGE, message);
                }
                Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
            };
            let Ok(apply) = serde_json::from_slice::<ApplyRequest>(&body) else {
                return error(StatusCode::BAD_REQUEST, "the body is not an apply request");
            };
            super::deploy::apply(&shared, apply).await
        }
        (Method::POST, ["v1", "apps", name, "restart"]) => super::deploy::restart(&shared, name, flag(&req, "now")).await,
        (Method::POST, ["v1", "apps", name, "rollback"]) => {
            super::deploy::rollback(&shared, name, flag(&req, "now"), query(&req, "to")).await
        }
        (Method::GET, ["v1", "apps", name, "releases"]) => {
            let d = shared.lock();
            let Some(app) = d.apps.get(*name) else { return not_found(name) };
            uds::json_response(StatusCode::OK, &crate::release::rows(&app.recorded.state))
        }
        (Method::DELETE, ["v1", "apps", name]) => {
            let now = flag(&req, "now");
            let mut d = shared.lock();
            // Deleting again (with --now) hurries a delete that drains.
            let Some(app) = d.apps.get_mut(*name).filter(|a| !a.recorded.deleting || now) else { return not_found(name) };
            app.recorded.deleting = true;
            app.recorded.state.stop_now = now;
            let copies = app.recorded.state.copies.len();
            if let Err(e) = d.save_registry() {
                return error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot write registry.json: {e:#}"));
            }
            let _ = d.events.send(Event::Changed { app: name.to_string() });
            let how = match (copies, now) {
                (1, true) => "its 1 copy stops now",
                (1, false) => "its 1 copy stops once its sessions end",
                (_, true) => "its {n} copies stop now",
                (_, false) => "its {n} copies stop once their sessions end",
            };
            ok(format!("{name}: deleted; {}.", how.replace("{n}", &copies.to_string())))
        }
        (Method::GET, ["v1", "apps", name, "logs"]) => {
            let copy = query(&req, "copy").and_then(|c| c.parse::<u32>().ok());
            let d = shared.lock();
            let Some(app) = d.apps.get(*name) else { return not_found(name) };
            let copies = super::logs::of_app(&d.home, &app.recorded.spec, &app.recorded.state);
            let path = match copy {
                Some(n) => super::log_path(&d.home, &app.recorded.spec, n),
                None => copies.first().map(|c| c.path.clone()).unwrap_or_else(|| super::log_path(&d.home, &app.recorded.spec, 1)),
            };
            uds::json_response(StatusCode::OK, &LogsReply { path, copies })
        }
        (Method::GET, ["v1", "apps", name, "rollout"]) => {
            let Some(revision) = query(&req, "revision").and_then(|r| r.parse::<u64>().ok()) else {
                return error(StatusCode::BAD_REQUEST, "rollout needs ?revision=N");
            };
            let d = shared.lock();
            let Some(app) = d.apps.get(*name).filter(|a| !a.recorded.deleting) else {
                let gone = RolloutReply { state: RolloutState::Failed, message: format!("{name} was deleted") };
                return uds::json_response(StatusCode::OK, &gone);
            };
            let (spec, state) = (&app.recorded.spec, &app.recorded.state);
            let reply =
                crate::reconcile::rollout(state, &spec.settings_hash(), spec.scale.replicas, &app.tracked.roles, revision, super::now_ms());
            uds::json_response(StatusCode::OK, &reply)
        }
        (Method::POST, ["v1", "apps", name, "stop"]) => super::operate::stop(&shared, name).await,
        (Method::POST, ["v1", "apps", name, "start"]) => super::operate::start(&shared, name).await,
        (Method::POST, ["v1", "apps", name, "scale"]) => {
            let Some(n) = query(&req, "replicas").and_then(|r| r.parse::<u32>().ok()) else {
                return error(StatusCode::BAD_REQUEST, "scale needs ?replicas=N");
            };
            super::operate::scale(&shared, name, n).await
        }
        (Method::POST, ["v1", "shutdown"]) => super::operate::shutdown(&shared, flag(&req, "all")).await,
        (Method::POST, ["v1", "reload"]) => super::reload::reload(&shared).await,
        (Method::GET, ["v1", "metrics"]) => super::metrics::metrics(&shared, super::metrics::accept(&req)).await,
        (Method::GET, ["v1", "health"]) => super::metrics::health(&shared).await,
        (Method::POST, ["v1", "apps", name, "wake"]) => wake(&shared, name).await,
        (Method::POST, ["v1", "apps", name, "stand-in"]) => {
            let body = uds::read_body(req.into_body(), 64 << 10).await.unwrap_or_default();
            let Ok(ev) = serde_json::from_slice::<StandIn>(&body) else {
                return error(StatusCode::BAD_REQUEST, "the body is not a stand-in report");
            };
            let d = shared.lock();
            if let Some(down) = ev.down {
                tracing::warn!(app = name, down, stand_in = ?ev.stand_in, "copy refused a connection; the load balancer used a stand-in");
            }
            if ev.full {
                tracing::info!(app = name, stand_in = ?ev.stand_in, "every active copy is full; the load balancer sent a new visitor to the spare");
            }
            let _ = d.events.send(Event::StandIn { app: name.to_string(), down: ev.down, full: ev.full });
            ok("noted")
        }
        _ => error(StatusCode::NOT_FOUND, format!("no such API route: {} {path}", req.method())),
    }
}

/// `POST /v1/apps/NAME/wake`, from the load balancer: wakes a sleeping app
/// and answers once a copy is active (200), when the wake failed (503), or
/// at request-timeout (504). Requests that arrive together share the wake.
async fn wake(shared: &Shared, name: &str) -> Reply {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let timeout = {
        let mut d = shared.lock();
        let Some(app) = d.apps.get_mut(name).filter(|a| !a.recorded.deleting) else { return not_found(name) };
        if app.recorded.state.asleep_since_ms.is_none() && app.tracked.has_active() {
            return ok(format!("{name} is awake"));
        }
        app.wake.requested = true;
        app.wake.asked_ms.get_or_insert(super::now_ms());
        app.wake.waiters.push(tx);
        let timeout = Duration::from_millis(app.recorded.spec.route.request_timeout_ms);
        let _ = d.events.send(Event::Changed { app: name.to_string() });
        timeout
    };
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(Ok(()))) => ok(format!("{name} is awake")),
        Ok(Ok(Err(why))) => error(StatusCode::SERVICE_UNAVAILABLE, format!("{name} did not wake: {why}")),
        Ok(Err(_)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("{name} did not wake")),
        Err(_) => error(StatusCode::GATEWAY_TIMEOUT, format!("{name} was not ready within its request-timeout")),
    }
}
