//! The load balancer's own answers, when no copy gives one.

use bytes::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

use crate::proxy::visitors::body::DownBody;

/// 503 while an app has no copy that can take a request: a page that says
/// so and reloads itself every 5 seconds.
pub fn restarting(app: &str) -> Response<DownBody> {
    let app = escape(app);
    let html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
         <title>{app} is restarting</title></head>\n<body><h1>{app} is restarting</h1>\
         <p>This page reloads by itself in a few seconds.</p></body></html>\n"
    );
    let mut resp = page(StatusCode::SERVICE_UNAVAILABLE, html);
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    resp
}

/// 503 for a new visitor while every copy of the app is full at
/// `max-replicas` and no session ended within request-timeout: a page that
/// says the app is busy and reloads itself (README, "Capacity").
pub fn app_busy(app: &str) -> Response<DownBody> {
    let app = escape(app);
    let html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"10\">\
         <title>{app} is busy</title></head>\n<body><h1>{app} is busy</h1>\
         <p>Every place is taken just now. This page reloads by itself in a few seconds.</p></body></html>\n"
    );
    let mut resp = page(StatusCode::SERVICE_UNAVAILABLE, html);
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("10"));
    resp
}

/// The path on every app's port that the load balancer answers itself,
/// for a front proxy's health check: 200 while the app serves or can be
/// woken, 503 once it is stopped, being deleted, or down (every copy left
/// down). It wakes nothing.
pub const HEALTH_PATH: &str = "/.shinyctl/health";

/// The answer on [`HEALTH_PATH`].
pub fn health(app: &str, up: bool) -> Response<DownBody> {
    let (status, word) = if up { (StatusCode::OK, "up") } else { (StatusCode::SERVICE_UNAVAILABLE, "down") };
    let mut resp = page(status, format!("{} {word}\n", escape(app)));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// 503 for an app stopped by `shinyctl stop`: a page that says so, with
/// Retry-After (a health check sees the app down; a browser tries later).
pub fn stopped(app: &str) -> Response<DownBody> {
    let app = escape(app);
    let html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{app} is stopped</title></head>\n\
         <body><h1>{app} is stopped</h1><p>Its operator stopped it; it is not running now. Try again later.</p></body></html>\n"
    );
    let mut resp = page(StatusCode::SERVICE_UNAVAILABLE, html);
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
    resp
}

/// 503 for an app whose every copy is left down, none to come back until
/// its operator acts: said at once, not after a hold.
pub fn down(app: &str) -> Response<DownBody> {
    let app = escape(app);
    let html = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{app} is down</title></head>\n\
         <body><h1>{app} is down</h1><p>Its copies ended and none is started again on its own. \
         Its owner can see why with <code>shinyctl status {app}</code>.</p></body></html>\n"
    );
    let mut resp = page(StatusCode::SERVICE_UNAVAILABLE, html);
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("60"));
    resp
}

/// 503 when the daemon could not wake a sleeping app.
pub fn wake_failed(app: &str) -> Response<DownBody> {
    let app = escape(app);
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{app} did not start</title></head>\n\
             <body><h1>{app} did not start</h1><p>The app was asleep and could not be woken. \
             Its owner can see why with <code>shinyctl status {app}</code>.</p></body></html>\n"
        ),
    )
}

/// 504 when a sleeping app was not ready within its request-timeout.
pub fn wake_timed_out(app: &str) -> Response<DownBody> {
    let app = escape(app);
    page(
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"5\">\
             <title>{app} is waking up</title></head>\n<body><h1>{app} is still waking up</h1>\
             <p>This page reloads by itself in a few seconds.</p></body></html>\n"
        ),
    )
}

/// 502 when a copy failed mid-way and the request could not be sent again.
pub fn bad_gateway(app: &str) -> Response<DownBody> {
    let app = escape(app);
    page(
        StatusCode::BAD_GATEWAY,
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{app}: bad gateway</title></head>\n\
             <body><h1>{app} did not answer</h1><p>The app stopped in the middle of this request. \
             Reload the page to try again.</p></body></html>\n"
        ),
    )
}

/// 503 past a connection cap (the app's `max-connections`, or this
/// visitor's address): plain text, cheap to send, and the connection
/// closes after it.
pub fn busy() -> Response<DownBody> {
    let mut resp = Response::new(DownBody::Full(Some(Bytes::from_static(b"Too many connections; try again in a few seconds.\n"))));
    *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    h.insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// 503 when the load balancer itself lacks something (file descriptors,
/// buffers, memory) to reach a copy: no copy is at fault.
pub fn overloaded(app: &str) -> Response<DownBody> {
    let app = escape(app);
    let mut resp = page(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{app} is busy</title></head>\n\
             <body><h1>{app} is busy</h1><p>Try again in a few seconds.</p></body></html>\n"
        ),
    );
    resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
    resp
}

/// 503 on a port whose app left the table (a connection kept open from
/// before).
pub fn no_app(port: u16) -> Response<DownBody> {
    page(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>No app</title></head>\n<body><h1>No app runs on port {port}</h1></body></html>\n"),
    )
}

/// 405 for CONNECT: this is not a forward proxy.
pub fn not_allowed() -> Response<DownBody> {
    page(StatusCode::METHOD_NOT_ALLOWED, "<!doctype html>\n<html><body><h1>Method not allowed</h1></body></html>\n".to_string())
}

/// 400 for a malformed WebSocket handshake, saying `why`.
pub fn bad_handshake(why: &str) -> Response<DownBody> {
    page(
        StatusCode::BAD_REQUEST,
        format!("<!doctype html>\n<html><body><h1>Bad WebSocket handshake</h1><p>{}</p></body></html>\n", escape(why)),
    )
}

/// 426 naming version 13, for a WebSocket handshake of another version
/// (RFC 6455, 4.2.2).
pub fn websocket_version() -> Response<DownBody> {
    let mut resp =
        page(StatusCode::UPGRADE_REQUIRED, "<!doctype html>\n<html><body><h1>Only WebSocket version 13</h1></body></html>\n".to_string());
    resp.headers_mut().insert("sec-websocket-version", HeaderValue::from_static("13"));
    resp
}

fn page(status: StatusCode, html: String) -> Response<DownBody> {
    let mut resp = Response::new(DownBody::Full(Some(Bytes::from(html))));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}
