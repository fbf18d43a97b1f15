//! Every request of the daemon's API (`api.sock`, HTTP/1.1 with JSON under
//! `/v1/…`, usable with curl) as one typed value: [`ApiRequest::parse`]
//! reads it from the method, path and query, and the daemon matches on it
//! (`serve::api`), every route named once; [`ApiRequest::target`] writes
//! the path and query back, for the client (`api_client::routes`). The two
//! are each other's inverse (a test runs every route both ways).
//!
//! - `GET  /v1/version`
//! - `GET  /v1/status[?app=NAME]`
//! - `POST /v1/apply` (ApplyRequest; takes a release when it deploys)
//! - `POST /v1/reload` (every registered manifest applied again from its path)
//! - `POST /v1/apps/NAME/restart[?now=1]` (reads the manifest again, takes a release)
//! - `POST /v1/apps/NAME/rollback[?now=1][&to=ID]` (the release before the current one)
//! - `GET  /v1/apps/NAME/releases`
//! - `DELETE /v1/apps/NAME[?now=1]`
//! - `GET  /v1/apps/NAME/logs[?copy=N]`
//! - `GET  /v1/apps/NAME/rollout?revision=N`
//! - `POST /v1/apps/NAME/stop`, `POST /v1/apps/NAME/start`
//! - `POST /v1/apps/NAME/scale?replicas=N`
//! - `POST /v1/shutdown[?all=1]`
//! - `POST /v1/apps/NAME/stand-in` (StandIn, from the load balancer)
//! - `POST /v1/apps/NAME/wake` (from the load balancer; answers once awake)
//! - `GET  /v1/metrics` (Prometheus text), `GET /v1/health`

use hyper::Method;

/// One request of the API. A request with a body (`Apply`, `StandIn`)
/// names the route; the handler reads the body, with its own limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiRequest {
    /// The daemon's build and PID.
    Version,
    /// Every app's status, or one app's.
    Status {
        /// Only this app.
        app: Option<String>,
    },
    /// Apply a manifest (the body: `ApplyRequest`).
    Apply,
    /// Apply every registered manifest again from its path.
    Reload,
    /// Redeploy an app from its manifest as it is now.
    Restart {
        /// The app.
        app: String,
        /// Stop the old copies as soon as the new ones are ready.
        now: bool,
    },
    /// Redeploy the release before the current one, or `to`.
    Rollback {
        /// The app.
        app: String,
        /// Stop the old copies as soon as the new ones are ready.
        now: bool,
        /// This kept release.
        to: Option<String>,
    },
    /// The app's kept releases.
    Releases {
        /// The app.
        app: String,
    },
    /// Stop an app's copies and forget it.
    Delete {
        /// The app.
        app: String,
        /// Without draining.
        now: bool,
    },
    /// Where the copies' logs are.
    Logs {
        /// The app.
        app: String,
        /// Only this copy.
        copy: Option<u32>,
    },
    /// How the deploy of a revision is going.
    Rollout {
        /// The app.
        app: String,
        /// The revision the deploy started.
        revision: u64,
    },
    /// Stop an app's copies; its port answers that it is stopped.
    Stop {
        /// The app.
        app: String,
    },
    /// Start an app that `Stop` stopped.
    Start {
        /// The app.
        app: String,
    },
    /// Set an app's replicas.
    Scale {
        /// The app.
        app: String,
        /// The new number of replicas.
        replicas: u32,
    },
    /// Stop the daemon.
    Shutdown {
        /// Its copies and load balancer first.
        all: bool,
    },
    /// The Prometheus series.
    Metrics,
    /// Whether the daemon and its load balancer are up.
    Health,
    /// From the load balancer: wake a sleeping app.
    Wake {
        /// The app.
        app: String,
    },
    /// From the load balancer: a warm copy stood in (the body: `StandIn`).
    StandIn {
        /// The app.
        app: String,
    },
}

/// Why a request names no route of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// No route has this method and path (404).
    NoSuchRoute(String),
    /// The route needs a query value it did not get (400).
    BadQuery(&'static str),
}

impl std::fmt::Display for RouteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteError::NoSuchRoute(what) => write!(f, "no such API route: {what}"),
            RouteError::BadQuery(what) => f.write_str(what),
        }
    }
}

/// The value of `key` in a query string.
fn query<'a>(q: Option<&'a str>, key: &str) -> Option<&'a str> {
    q?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then_some(v)
    })
}

/// A flag of the query: present bare, `1` or `true`.
fn flag(q: Option<&str>, key: &str) -> bool {
    matches!(query(q, key), Some("" | "1" | "true"))
}

impl ApiRequest {
    /// The request a method, path and query (without `?`) name.
    pub fn parse(method: &Method, path: &str, q: Option<&str>) -> Result<ApiRequest, RouteError> {
        use ApiRequest as R;
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let app = |name: &str| name.to_string();
        Ok(match (method.clone(), parts.as_slice()) {
            (Method::GET, ["v1", "version"]) => R::Version,
            (Method::GET, ["v1", "status"]) => R::Status { app: query(q, "app").map(str::to_string) },
            (Method::POST, ["v1", "apply"]) => R::Apply,
            (Method::POST, ["v1", "reload"]) => R::Reload,
            (Method::POST, ["v1", "shutdown"]) => R::Shutdown { all: flag(q, "all") },
            (Method::GET, ["v1", "metrics"]) => R::Metrics,
            (Method::GET, ["v1", "health"]) => R::Health,
            (Method::DELETE, ["v1", "apps", name]) => R::Delete { app: app(name), now: flag(q, "now") },
            (Method::POST, ["v1", "apps", name, "restart"]) => R::Restart { app: app(name), now: flag(q, "now") },
            (Method::POST, ["v1", "apps", name, "rollback"]) => {
                R::Rollback { app: app(name), now: flag(q, "now"), to: query(q, "to").map(str::to_string) }
            }
            (Method::GET, ["v1", "apps", name, "releases"]) => R::Releases { app: app(name) },
            (Method::GET, ["v1", "apps", name, "logs"]) => R::Logs { app: app(name), copy: query(q, "copy").and_then(|c| c.parse().ok()) },
            (Method::GET, ["v1", "apps", name, "rollout"]) => {
                let revision =
                    query(q, "revision").and_then(|r| r.parse().ok()).ok_or(RouteError::BadQuery("rollout needs ?revision=N"))?;
                R::Rollout { app: app(name), revision }
            }
            (Method::POST, ["v1", "apps", name, "stop"]) => R::Stop { app: app(name) },
            (Method::POST, ["v1", "apps", name, "start"]) => R::Start { app: app(name) },
            (Method::POST, ["v1", "apps", name, "scale"]) => {
                let replicas = query(q, "replicas").and_then(|r| r.parse().ok()).ok_or(RouteError::BadQuery("scale needs ?replicas=N"))?;
                R::Scale { app: app(name), replicas }
            }
            (Method::POST, ["v1", "apps", name, "wake"]) => R::Wake { app: app(name) },
            (Method::POST, ["v1", "apps", name, "stand-in"]) => R::StandIn { app: app(name) },
            _ => return Err(RouteError::NoSuchRoute(format!("{method} {path}"))),
        })
    }

    /// The request's HTTP method.
    pub fn method(&self) -> Method {
        use ApiRequest as R;
        match self {
            R::Version | R::Status { .. } | R::Releases { .. } | R::Logs { .. } | R::Rollout { .. } | R::Metrics | R::Health => Method::GET,
            R::Delete { .. } => Method::DELETE,
            R::Apply
            | R::Reload
            | R::Restart { .. }
            | R::Rollback { .. }
            | R::Stop { .. }
            | R::Start { .. }
            | R::Scale { .. }
            | R::Shutdown { .. }
            | R::Wake { .. }
            | R::StandIn { .. } => Method::POST,
        }
    }

    /// The path and query that name the request.
    pub fn target(&self) -> String {
        use ApiRequest as R;
        let on = |app: &str, what: &str| format!("/v1/apps/{app}/{what}");
        let with = |path: String, q: Vec<String>| if q.is_empty() { path } else { format!("{path}?{}", q.join("&")) };
        let now = |now: bool| if now { vec!["now=1".to_string()] } else { Vec::new() };
        match self {
            R::Version => "/v1/version".into(),
            R::Status { app } => with("/v1/status".into(), app.iter().map(|a| format!("app={a}")).collect()),
            R::Apply => "/v1/apply".into(),
            R::Reload => "/v1/reload".into(),
            R::Shutdown { all } => with("/v1/shutdown".into(), if *all { vec!["all=1".into()] } else { Vec::new() }),
            R::Metrics => "/v1/metrics".into(),
            R::Health => "/v1/health".into(),
            R::Delete { app, now: n } => with(format!("/v1/apps/{app}"), now(*n)),
            R::Restart { app, now: n } => with(on(app, "restart"), now(*n)),
            R::Rollback { app, now: n, to } => {
                with(on(app, "rollback"), now(*n).into_iter().chain(to.iter().map(|t| format!("to={t}"))).collect())
            }
            R::Releases { app } => on(app, "releases"),
            R::Logs { app, copy } => with(on(app, "logs"), copy.iter().map(|c| format!("copy={c}")).collect()),
            R::Rollout { app, revision } => format!("{}?revision={revision}", on(app, "rollout")),
            R::Stop { app } => on(app, "stop"),
            R::Start { app } => on(app, "start"),
            R::Scale { app, replicas } => format!("{}?replicas={replicas}", on(app, "scale")),
            R::Wake { app } => on(app, "wake"),
            R::StandIn { app } => on(app, "stand-in"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_request() -> Vec<ApiRequest> {
        use ApiRequest as R;
        let a = || "hello".to_string();
        vec![
            R::Version,
            R::Status { app: None },
            R::Status { app: Some(a()) },
            R::Apply,
            R::Reload,
            R::Restart { app: a(), now: false },
            R::Restart { app: a(), now: true },
            R::Rollback { app: a(), now: true, to: Some("r3".into()) },
            R::Rollback { app: a(), now: false, to: None },
            R::Releases { app: a() },
            R::Delete { app: a(), now: true },
            R::Logs { app: a(), copy: None },
            R::Logs { app: a(), copy: Some(2) },
            R::Rollout { app: a(), revision: 7 },
            R::Stop { app: a() },
            R::Start { app: a() },
            R::Scale { app: a(), replicas: 3 },
            R::Shutdown { all: true },
            R::Shutdown { all: false },
            R::Metrics,
            R::Health,
            R::Wake { app: a() },
            R::StandIn { app: a() },
        ]
    }

    #[test]
    fn every_request_is_read_back_from_the_target_it_writes() {
        for r in every_request() {
            let target = r.target();
            let (path, q) = target.split_once('?').map_or((target.as_str(), None), |(p, q)| (p, Some(q)));
            assert_eq!(ApiRequest::parse(&r.method(), path, q), Ok(r.clone()), "{target}");
        }
    }

    #[test]
    fn the_routes_are_the_documented_paths() {
        let cases = [
            (Method::GET, "/v1/status", None, ApiRequest::Status { app: None }),
            (Method::GET, "/v1/status", Some("app=a"), ApiRequest::Status { app: Some("a".into()) }),
            (Method::POST, "/v1/apps/a/restart", Some("now=true"), ApiRequest::Restart { app: "a".into(), now: true }),
            (Method::DELETE, "/v1/apps/a", Some("now"), ApiRequest::Delete { app: "a".into(), now: true }),
            (Method::GET, "/v1/apps/a/logs", Some("copy=x"), ApiRequest::Logs { app: "a".into(), copy: None }),
            (Method::POST, "/v1/apps/a/stand-in", None, ApiRequest::StandIn { app: "a".into() }),
        ];
        for (method, path, q, want) in cases {
            assert_eq!(ApiRequest::parse(&method, path, q), Ok(want), "{method} {path}");
        }
    }

    #[test]
    fn an_unknown_route_or_a_missing_value_is_said() {
        let e = ApiRequest::parse(&Method::GET, "/v1/apps/a/restart", None).unwrap_err();
        assert_eq!(e.to_string(), "no such API route: GET /v1/apps/a/restart", "the wrong method is no route");
        assert_eq!(ApiRequest::parse(&Method::GET, "/v2/status", None).unwrap_err().to_string(), "no such API route: GET /v2/status");
        let e = ApiRequest::parse(&Method::POST, "/v1/apps/a/scale", Some("replicas=many")).unwrap_err();
        assert_eq!(e, RouteError::BadQuery("scale needs ?replicas=N"));
        let e = ApiRequest::parse(&Method::GET, "/v1/apps/a/rollout", None).unwrap_err();
        assert_eq!(e.to_string(), "rollout needs ?revision=N");
    }
}
