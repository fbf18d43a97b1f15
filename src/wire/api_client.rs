//! The daemon's API as a typed client: one method per route of `api.sock`
//! (see `serve::api`), used by the command and by the daemon's own checks
//! (is one already running?). The route paths are built in [`routes`] only,
//! for the load balancer's calls too (stand-in, wake).

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use serde::{Deserialize, Serialize};

use crate::home::Home;
use crate::wire::{ActionReply, ApiError, ApplyRequest, LogsReply, ReloadReply, RolloutReply, StatusReport};

/// The paths of the API's routes, as the client calls them: each written
/// by [`ApiRequest::target`](super::request::ApiRequest::target), which the
/// daemon's parse reads back.
pub mod routes {
    use crate::wire::request::ApiRequest as R;

    /// `GET`: the daemon's build and PID ([`super::VersionReply`]).
    pub const VERSION: &str = "/v1/version";
    /// `POST`: apply a manifest (`ApplyRequest`).
    pub const APPLY: &str = "/v1/apply";
    /// `POST`: apply every registered manifest again from its path.
    pub const RELOAD: &str = "/v1/reload";

    /// `GET`: every app's status, or one app's.
    pub fn status(app: Option<&str>) -> String {
        R::Status { app: app.map(str::to_string) }.target()
    }

    /// `POST`: redeploy an app; with `now`, the old copies stop as soon as
    /// the new ones are ready.
    pub fn restart(app: &str, now: bool) -> String {
        R::Restart { app: app.into(), now }.target()
    }

    /// `POST`: redeploy the last release that served before the current
    /// one, or release `to`; with `now`, the old copies stop as soon as the
    /// new ones are ready.
    pub fn rollback(app: &str, now: bool, to: Option<&str>) -> String {
        R::Rollback { app: app.into(), now, to: to.map(str::to_string) }.target()
    }

    /// `GET`: the kept releases (`ReleaseRow`s).
    pub fn releases(app: &str) -> String {
        R::Releases { app: app.into() }.target()
    }

    /// `DELETE`: stop an app's copies and forget it; with `now`, at once.
    pub fn delete(app: &str, now: bool) -> String {
        R::Delete { app: app.into(), now }.target()
    }

    /// `GET`: where the copies' logs are (`LogsReply`).
    pub fn logs(app: &str) -> String {
        R::Logs { app: app.into(), copy: None }.target()
    }

    /// `POST` (from the load balancer): a copy refused a connection and a
    /// warm copy stood in (`StandIn`).
    pub fn stand_in(app: &str) -> String {
        R::StandIn { app: app.into() }.target()
    }

    /// `POST`: an operator's command on an app: `stop`, `start`.
    pub fn operate(app: &str, what: &str) -> String {
        match what {
            "start" => R::Start { app: app.into() }.target(),
            "stop" => R::Stop { app: app.into() }.target(),
            // No such route: the daemon answers 404 naming it.
            other => format!("/v1/apps/{app}/{other}"),
        }
    }

    /// `POST`: set an app's replicas.
    pub fn scale(app: &str, replicas: u32) -> String {
        R::Scale { app: app.into(), replicas }.target()
    }

    /// `POST`: stop the daemon; with `all`, its copies and load balancer first.
    pub fn shutdown(all: bool) -> String {
        R::Shutdown { all }.target()
    }

    /// `GET`: how the deploy of `revision` is going (`RolloutReply`).
    pub fn rollout(app: &str, revision: u64) -> String {
        R::Rollout { app: app.into(), revision }.target()
    }

    /// `POST` (from the load balancer): wake a sleeping app; answers once a
    /// copy is active.
    pub fn wake(app: &str) -> String {
        R::Wake { app: app.into() }.target()
    }
}

/// `GET /v1/version`: the daemon's build and PID.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VersionReply {
    /// The build (`wire::BUILD`) of the daemon that answered.
    pub version: String,
    /// Its PID.
    pub pid: u32,
}

/// How long the command waits for an answer.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long apply and restart may take: they answer once the release is
/// taken, and copying a working-dir near the 2 GiB limit onto a slow disk
/// takes a while.
const DEPLOY_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the check for a running daemon waits.
const ANSWERS_TIMEOUT: Duration = Duration::from_secs(2);

/// A client of one home's `api.sock`. Its calls block (each on a small
/// runtime of its own), for code that is not async: the command, and the
/// daemon before its runtime starts.
pub struct Client {
    /// The socket.
    sock: PathBuf,
    /// How long a call may take.
    timeout: Duration,
}

impl Client {
    /// A client of the home's daemon.
    pub fn new(home: &Home) -> Client {
        Client { sock: home.api_sock(), timeout: TIMEOUT }
    }

    /// True when a daemon answers on the home's socket (within 2 s).
    pub fn answers(home: &Home) -> bool {
        // Any 2xx will do: a daemon of another build may answer otherwise.
        Client { sock: home.api_sock(), timeout: ANSWERS_TIMEOUT }.call(Method::GET, routes::VERSION, None).is_ok()
    }

    /// `GET /v1/version`.
    pub fn version(&self) -> anyhow::Result<VersionReply> {
        self.json(Method::GET, routes::VERSION, None)
    }

    /// `GET /v1/status[?app=NAME]`, as the daemon wrote it (for `--json`).
    pub fn status_json(&self, app: Option<&str>) -> anyhow::Result<Bytes> {
        self.call(Method::GET, &routes::status(app), None)
    }

    /// `GET /v1/status[?app=NAME]`.
    pub fn status(&self, app: Option<&str>) -> anyhow::Result<StatusReport> {
        Ok(serde_json::from_slice(&self.status_json(app)?)?)
    }

    /// `POST /v1/apply`; a request over the API's limit is refused here,
    /// naming the manifest and the limit.
    pub fn apply(&self, req: &ApplyRequest) -> anyhow::Result<ActionReply> {
        let body = serde_json::to_vec(req)?;
        req.check_size(body.len())?;
        self.deploying().json(Method::POST, routes::APPLY, Some(body))
    }

    /// `POST /v1/reload`: every registered manifest applied again.
    pub fn reload(&self) -> anyhow::Result<ReloadReply> {
        self.deploying().json(Method::POST, routes::RELOAD, None)
    }

    /// `POST /v1/apps/NAME/restart[?now=1]`.
    pub fn restart(&self, app: &str, now: bool) -> anyhow::Result<ActionReply> {
        self.deploying().json(Method::POST, &routes::restart(app, now), None)
    }

    /// `POST /v1/apps/NAME/rollback[?now=1][&to=ID]`.
    pub fn rollback(&self, app: &str, now: bool, to: Option<&str>) -> anyhow::Result<ActionReply> {
        self.json(Method::POST, &routes::rollback(app, now, to), None)
    }

    /// `GET /v1/apps/NAME/releases`.
    pub fn releases(&self, app: &str) -> anyhow::Result<Vec<crate::wire::ReleaseRow>> {
        self.json(Method::GET, &routes::releases(app), None)
    }

    /// This client with room for a deploy, which answers once its release
    /// is taken.
    fn deploying(&self) -> Client {
        Client { sock: self.sock.clone(), timeout: self.timeout.max(DEPLOY_TIMEOUT) }
    }

    /// `DELETE /v1/apps/NAME[?now=1]`.
    pub fn delete(&self, app: &str, now: bool) -> anyhow::Result<ActionReply> {
        self.json(Method::DELETE, &routes::delete(app, now), None)
    }

    /// `POST /v1/apps/NAME/stop` or `/start`.
    pub fn operate(&self, app: &str, what: &str) -> anyhow::Result<ActionReply> {
        self.json(Method::POST, &routes::operate(app, what), None)
    }

    /// `POST /v1/apps/NAME/scale?replicas=N`.
    pub fn scale(&self, app: &str, replicas: u32) -> anyhow::Result<ActionReply> {
        self.json(Method::POST, &routes::scale(app, replicas), None)
    }

    /// `POST /v1/shutdown[?all=1]`.
    pub fn shutdown(&self, all: bool) -> anyhow::Result<ActionReply> {
        self.json(Method::POST, &routes::shutdown(all), None)
    }

    /// `GET /v1/apps/NAME/rollout?revision=N`.
    pub fn rollout(&self, app: &str, revision: u64) -> anyhow::Result<RolloutReply> {
        self.json(Method::GET, &routes::rollout(app, revision), None)
    }

    /// `GET /v1/apps/NAME/logs`.
    pub fn logs(&self, app: &str) -> anyhow::Result<LogsReply> {
        self.json(Method::GET, &routes::logs(app), None)
    }

    /// Calls a route and reads its JSON answer.
    fn json<T: serde::de::DeserializeOwned>(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> anyhow::Result<T> {
        Ok(serde_json::from_slice(&self.call(method, path, body)?)?)
    }

    /// Calls a route and returns the body of a 2xx answer; any other answer
    /// becomes an error carrying the daemon's message.
    fn call(&self, method: Method, path: &str, body: Option<Vec<u8>>) -> anyhow::Result<Bytes> {
        let (status, bytes) = crate::wire::uds::request_blocking(&self.sock, method, path, body, self.timeout).map_err(|e| {
            // Only a socket nothing listens on means the daemon is not
            // running; any other failure is said as it is.
            if e.downcast_ref::<crate::wire::uds::NotListening>().is_some() {
                anyhow::anyhow!(
                    "shinyctl serve is not running (nothing answers on {}). Start it with `shinyctl serve -d`; `shinyctl apply` starts it too.",
                    self.sock.display()
                )
            } else {
                anyhow::anyhow!("talking to shinyctl serve on {} failed: {e:#}", self.sock.display())
            }
        })?;
        if status.is_success() {
            return Ok(bytes);
        }
        match serde_json::from_slice::<ApiError>(&bytes) {
            Ok(e) => Err(Refused { status, message: e.error }.into()),
            Err(_) => anyhow::bail!("shinyctl serve answered {status}: {}", String::from_utf8_lossy(&bytes)),
        }
    }
}

/// The daemon's answer to a request it refused: its status and message
/// (shown as the message alone), for a caller that tells a 404 (no such
/// app) from the rest.
#[derive(Debug)]
pub struct Refused {
    /// The answer's status (404: no such app or route).
    pub status: hyper::StatusCode,
    /// The daemon's message.
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

/// True when `e` is the daemon saying there is no such app (or route).
pub fn is_not_found(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>().is_some_and(|r| r.status == hyper::StatusCode::NOT_FOUND)
}

/// Starts the daemon in the background (its command line is exactly
/// `…/shinyctl serve`) and waits until its API answers.
pub fn spawn_daemon(home: &Home) -> anyhow::Result<()> {
    home.ensure()?;
    let mut child = crate::sys::spawn::spawn_self(home, "serve", &[])?;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        if Client::answers(home) {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!("shinyctl serve exited at start ({status}); see {}", home.api_log().display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("shinyctl serve did not answer within 15 s; see {}", home.api_log().display())
}

#[cfg(test)]
mod tests {
    use super::routes;

    #[test]
    fn routes_are_the_documented_paths() {
        assert_eq!(routes::status(None), "/v1/status");
        assert_eq!(routes::status(Some("a")), "/v1/status?app=a");
        assert_eq!(routes::restart("a", false), "/v1/apps/a/restart");
        assert_eq!(routes::restart("a", true), "/v1/apps/a/restart?now=1");
        assert_eq!(routes::delete("a", true), "/v1/apps/a?now=1");
        assert_eq!(routes::logs("a"), "/v1/apps/a/logs");
        assert_eq!(routes::stand_in("a"), "/v1/apps/a/stand-in");
        assert_eq!(routes::wake("a"), "/v1/apps/a/wake");
        assert_eq!(routes::rollback("a", true, Some("r1")), "/v1/apps/a/rollback?now=1&to=r1");
        assert_eq!(routes::operate("a", "stop"), "/v1/apps/a/stop");
        use crate::wire::request::ApiRequest;
        for (path, req) in
            [(routes::VERSION, ApiRequest::Version), (routes::APPLY, ApiRequest::Apply), (routes::RELOAD, ApiRequest::Reload)]
        {
            assert_eq!(path, req.target());
        }
    }
}
