//! The API on `api.sock`: HTTP/1.1 with JSON bodies under `/v1/…`. Each
//! request is read into a [`ApiRequest`] (its routes are listed there) and
//! answered by one arm of an exhaustive match.

use std::os::unix::fs::PermissionsExt;

use hyper::{Request, StatusCode};

use crate::home::Home;
use crate::wire::api_client::VersionReply;
use crate::wire::request::{ApiRequest, RouteError};
use crate::wire::uds;
use crate::wire::{ApplyRequest, StandIn};

use super::error::{Done, ServeError};
use super::reply::{deployed, error, ok, Reply};
use super::Shared;

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

async fn handle(req: Request<hyper::body::Incoming>, shared: Shared) -> Reply {
    let parsed = ApiRequest::parse(req.method(), req.uri().path(), req.uri().query());
    let request = match parsed {
        Ok(r) => r,
        Err(e @ RouteError::NoSuchRoute(_)) => return error(StatusCode::NOT_FOUND, e.to_string()),
        Err(e @ RouteError::BadQuery(_)) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    match request {
        ApiRequest::Version => {
            uds::json_response(StatusCode::OK, &VersionReply { version: crate::wire::BUILD.to_string(), pid: std::process::id() })
        }
        ApiRequest::Status { app } => {
            // The load balancer's figures are fetched with the lock released.
            let home = shared.lock().home.clone();
            // So is what /proc says of the copies.
            let (stats, shown) = tokio::join!(
                super::proxy_ctl::fetch_stats(&home, super::proxy_ctl::STATUS_TIMEOUT),
                crate::serve::views::status_view::look_up(&shared, app.as_deref())
            );
            let mut stats = stats;
            let view = shared.read_as_pushed(|d| d.status_view(app.as_deref(), &shown, stats.take())).await;
            json(view)
        }
        ApiRequest::Apply => {
            let body = match uds::read_body(req.into_body(), ApplyRequest::MAX_BODY).await {
                Ok(b) => b,
                Err(e) if e.downcast_ref::<uds::TooLarge>().is_some() => {
                    let limit = ApplyRequest::MAX_BODY;
                    let message = format!(
                        "the apply request is too large: this API takes at most {} ({limit} bytes) of JSON, the manifest's text and path",
                        crate::sys::fmt::size(limit as u64, crate::sys::fmt::SizeStyle::Manifest)
                    );
                    return error(StatusCode::PAYLOAD_TOO_LARGE, message);
                }
                Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
            };
            let Ok(apply) = serde_json::from_slice::<ApplyRequest>(&body) else {
                return error(StatusCode::BAD_REQUEST, "the body is not an apply request");
            };
            answer(crate::serve::deploys::deploy::apply(&shared, apply).await)
        }
        ApiRequest::Restart { app, now } => answer(crate::serve::deploys::deploy::restart(&shared, &app, now).await),
        ApiRequest::Rollback { app, now, to } => answer(crate::serve::deploys::deploy::rollback(&shared, &app, now, to.as_deref()).await),
        ApiRequest::Releases { app } => json(shared.lock().releases_view(&app)),
        ApiRequest::Delete { app, now } => answer(shared.change_then_push(|d| d.delete(&app, now)).await),
        ApiRequest::Logs { app, copy } => json(shared.lock().logs_view(&app, copy)),
        ApiRequest::Rollout { app, revision } => {
            uds::json_response(StatusCode::OK, &shared.read_as_pushed(|d| d.rollout_view(&app, revision)).await)
        }
        ApiRequest::Stop { app } => answer(shared.change_then_push(|d| d.stop_app(&app)).await),
        ApiRequest::Start { app } => answer(shared.change_then_push(|d| d.start_app(&app)).await),
        ApiRequest::Scale { app, replicas } => answer(shared.lock().scale(&app, replicas)),
        ApiRequest::Shutdown { all } => answer(Ok(shared.lock().shut_down(all))),
        ApiRequest::Reload => uds::json_response(StatusCode::OK, &crate::serve::deploys::reload::reload(&shared).await),
        ApiRequest::Metrics => crate::serve::views::metrics::metrics(&shared, crate::serve::views::metrics::accept(&req)).await,
        ApiRequest::Health => crate::serve::views::metrics::health(&shared).await,
        ApiRequest::Wake { app } => wake(&shared, &app).await,
        ApiRequest::StandIn { app } => {
            let body = uds::read_body(req.into_body(), 64 << 10).await.unwrap_or_default();
            let Ok(ev) = serde_json::from_slice::<StandIn>(&body) else {
                return error(StatusCode::BAD_REQUEST, "the body is not a stand-in report");
            };
            shared.lock().note_stand_in(&app, &ev);
            ok("noted")
        }
    }
}

/// The HTTP status a refusal or failure is answered with.
fn status_of(e: &ServeError) -> StatusCode {
    match e {
        ServeError::NoSuchApp(_) => StatusCode::NOT_FOUND,
        ServeError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        ServeError::Clash(_) | ServeError::Rollback(_) => StatusCode::CONFLICT,
        ServeError::Registry(_) | ServeError::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A command's outcome as the API answers it: 200 with its message (and
/// the revision a deploy started), or the error's status with its message.
fn answer(outcome: Result<Done, ServeError>) -> Reply {
    match outcome {
        Ok(done) => deployed(done.message, done.revision),
        Err(e) => error(status_of(&e), e.to_string()),
    }
}

/// A view as the API answers it: 200 with it as JSON, or the error.
fn json<T: serde::Serialize>(view: Result<T, ServeError>) -> Reply {
    match view {
        Ok(v) => uds::json_response(StatusCode::OK, &v),
        Err(e) => error(status_of(&e), e.to_string()),
    }
}

/// `POST /v1/apps/NAME/wake`, from the load balancer: wakes a sleeping app
/// and answers once a copy is active (200), when the wake failed (503), or
/// at request-timeout (504). Requests that arrive together share the wake.
async fn wake(shared: &Shared, name: &str) -> Reply {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let timeout = match shared.lock().ask_wake(name, tx) {
        Ok(Some(timeout)) => timeout,
        Ok(None) => return ok(format!("{name} is awake")),
        Err(e) => return error(status_of(&e), e.to_string()),
    };
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(Ok(()))) => ok(format!("{name} is awake")),
        Ok(Ok(Err(why))) => error(StatusCode::SERVICE_UNAVAILABLE, format!("{name} did not wake: {why}")),
        Ok(Err(_)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("{name} did not wake")),
        Err(_) => error(StatusCode::GATEWAY_TIMEOUT, format!("{name} was not ready within its request-timeout")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::release::RollbackError;

    #[test]
    fn each_refusal_keeps_its_status_and_its_message() {
        let cases = [
            (ServeError::NoSuchApp("hello".into()), StatusCode::NOT_FOUND, "no app named hello; see `shinyctl status` for the apps there are"),
            (
                RollbackError::Current { name: "hello".into(), id: "r2".into() }.into(),
                StatusCode::CONFLICT,
                "hello runs release r2 already. Nothing changed.",
            ),
            (
                RollbackError::NoneBefore { name: "hello".into(), untracked: true }.into(),
                StatusCode::CONFLICT,
                "hello has no release before the current one to roll back to: it has been deployed once (or not since releases came). Nothing changed.",
            ),
            (
                ServeError::Registry(anyhow::anyhow!("No space left on device").context("cannot write /h/registry.json")),
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot write registry.json: cannot write /h/registry.json: No space left on device",
            ),
            (ServeError::Invalid("hello: 0 replicas".into()), StatusCode::UNPROCESSABLE_ENTITY, "hello: 0 replicas"),
            (ServeError::Clash("8080 is already used".into()), StatusCode::CONFLICT, "8080 is already used"),
            (ServeError::Failed("cannot put the release in place".into()), StatusCode::INTERNAL_SERVER_ERROR, "cannot put the release in place"),
        ];
        for (e, status, message) in cases {
            assert_eq!((status_of(&e), e.to_string().as_str()), (status, message));
        }
    }
}
