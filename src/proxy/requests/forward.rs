//! One visitor's request, from the listener to a copy and back: pick the
//! copy (sticky cookie, else the app's lb-policy), send the request on an
//! idle keep-alive connection or a new one, stream both bodies, and when a
//! copy refuses the connection, mark it down and send the request at once
//! to a stand-in. With no copy to send to, the request is held: while a
//! sleeping app wakes (the daemon is asked), or until a new table brings a
//! copy back.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hyper::body::{Body, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::http::request;
use hyper::{Method, Request, Response, StatusCode};
use tokio::time::Instant;

use crate::proxy::copies::balance::{self, Capacity, Need, Placement};
use crate::proxy::copies::copy_conn::UpBody;
use crate::proxy::copies::retry;
use crate::proxy::copies::table::{LiveApp, LiveCopy};
use crate::proxy::daemon_link::{wake_outcome, WakeAnswer};
use crate::proxy::error_source::ErrorSource;
use crate::proxy::progress::Idle;
use crate::proxy::requests::attempt::Attempt;
use crate::proxy::requests::upstream::{self, send, Failure, Kind, Sent};
use crate::proxy::shared::BalancerState;
use crate::proxy::tunnels::websocket;
use crate::proxy::visitors::body::DownBody;
use crate::proxy::visitors::headers;
use crate::proxy::visitors::pages;
use crate::sys::clock::{mono_ms, now_ms};
use crate::wire::{LbPolicy, Role};

pub use crate::proxy::requests::client::VisitorConnection;

/// The hyper service: every request of a visitor's connection.
pub async fn handle(req: Request<Incoming>, client: Arc<VisitorConnection>) -> Result<Response<DownBody>, Infallible> {
    Ok(forward(req, &client).await)
}

async fn forward(req: Request<Incoming>, client: &VisitorConnection) -> Response<DownBody> {
    let started = std::time::Instant::now();
    let mut resp = route(req, client).await;
    if let Some(stats) = &client.stats {
        stats.count(resp.status(), started.elapsed());
    }
    if client.shared.stopping.load(Ordering::Relaxed) && resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // Stopping: hyper closes the connection after this answer.
        resp.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The answer to one request: from a copy, or a page of our own.
async fn route(mut req: Request<Incoming>, client: &VisitorConnection) -> Response<DownBody> {
    let shared = &client.shared;
    let mut app = match admit(&req, client) {
        Ok(app) => app,
        Err(page) => return *page,
    };
    let now = now_ms();
    // Written once a millisecond at most: both workers write it.
    if app.counters.last_request_ms.load(Ordering::Relaxed) != now {
        app.counters.last_request_ms.store(now, Ordering::Relaxed);
    }
    let client_upgrade = websocket::is_upgrade(req.headers()).then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let claimed = claimed_copy(&app, &parts);
    let from = headers::Sender { address: &client.xff, trusted: app.trusts(client.peer) };
    headers::for_copy(&mut parts, &from, client_upgrade.is_some());
    // A request without a body can be sent again if it is lost on a dying
    // connection; one with a body cannot (it was consumed).
    let replayable = body.is_end_stream();
    let kind = if client_upgrade.is_some() {
        Kind::Upgrade
    } else if replayable && retry::is_safe(&parts.method) {
        Kind::Resendable
    } else {
        Kind::Once
    };
    let mut attempt = Attempt::new(&parts);
    if attempt.refused(&app, mono_ms()) {
        tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, request = %attempt.line(),
            "answered 502 at once: this request was in flight when two copies died within a minute");
        return pages::bad_gateway(&app.name);
    }
    let mut body = UpBody::VisitorConnection(body, Idle::default());
    loop {
        let (i, spare);
        (app, i, spare) = match wait_for_copy(shared, client.port, app, claimed, &mut attempt).await {
            Ok(found) => found,
            Err(page) => return page,
        };
        let copy = &app.copies[i];
        if spare && !copy.full_reported.swap(true, Ordering::Relaxed) {
            shared.daemon.report_full(&app.name, copy.copy);
        }
        if app.capacity.is_some() && claimed != Some(copy.copy) && client_upgrade.is_none() && attempt.sends == 0 {
            // Counts toward the copy's max-sessions until its WebSocket opens.
            copy.state.place(mono_ms(), (!app.trusts(client.peer)).then_some(client.peer));
        }
        // Told now rather than once the stand-in answers: a slow answer
        // must not delay the daemon making it active.
        shared.daemon.report_stand_in(&app.name, attempt.notice.take(), (copy.role == Role::Warm).then_some(copy.copy));
        attempt.sends += 1;
        let sent_ms = attempt.held_for_wake_ms.map(|_| now_ms());
        body = match send(copy, &parts, body, kind).await {
            Ok(sent) => {
                if let Some(at) = sent_ms {
                    attempt.say_woken(&app.name, copy.copy, at, sent.resp.status());
                }
                return respond(shared, &app, copy, claimed, sent, client_upgrade);
            }
            Err(failure) => {
                let died = match failure {
                    Failure::Ending => true,
                    Failure::Lost(_) => upstream::died(copy.pid).await,
                    Failure::Refused(..) | Failure::Local(_) => false,
                };
                match attempt.failed(shared, &app, copy, failure, replayable, died) {
                    Ok(again) => again,
                    Err(page) => return page,
                }
            }
        };
    }
}

/// What `/.shinyctl/health` says (README, "Several machines"): up while the
/// app sleeps (a request wakes it) or has a copy that can take a new
/// visitor; down when it is stopped, being deleted, left down, or has no
/// such copy (still starting, crash-looping), so a front load balancer
/// sends its visitors to another host meanwhile.
fn can_serve(app: &LiveApp) -> bool {
    let now = crate::sys::clock::now_ms();
    let serving = |c: &crate::proxy::copies::table::LiveCopy| {
        matches!(c.role, Role::Active | Role::Warm) && !c.state.gone.load(Ordering::Relaxed) && !c.state.is_down(now)
    };
    !app.stopped && !app.down && app.listening && (app.asleep || app.copies.iter().any(serving))
}

/// The app a request is for, or the page of our own that answers it before
/// any copy is chosen: the connection over the cap, no app on the port,
/// CONNECT, the health path, a WebSocket handshake that is not one (boxed:
/// a page is the rare path, the app the common one).
fn admit(req: &Request<Incoming>, client: &VisitorConnection) -> Result<Arc<LiveApp>, Box<Response<DownBody>>> {
    if client.busy {
        return Err(Box::new(pages::busy()));
    }
    let Some(app) = client.shared.table.app(client.port) else {
        return Err(Box::new(pages::no_app(client.port)));
    };
    if req.method() == Method::CONNECT {
        return Err(Box::new(pages::not_allowed()));
    }
    // Answered here, not by a copy, and no activity: a front proxy's check
    // keeps no sleeping app awake.
    if req.uri().path() == pages::HEALTH_PATH {
        return Err(Box::new(pages::health(&app.name, can_serve(&app))));
    }
    if websocket::is_upgrade(req.headers()) {
        let has_body = !req.body().is_end_stream();
        match websocket::check_handshake(req.method(), req.headers(), has_body) {
            Ok(()) => {}
            Err(websocket::BadHandshake::Malformed(why)) => return Err(Box::new(pages::bad_handshake(why))),
            Err(websocket::BadHandshake::Version) => return Err(Box::new(pages::websocket_version())),
        }
    }
    Ok(app)
}

/// The copy the request's sticky cookie names, if any. A visitor of a
/// draining copy who loads the page anew (a reload, not one of the open
/// page's own requests) claims none and gets the new version:
/// README, "Staying up" ("reloading it brings the new version").
fn claimed_copy(app: &LiveApp, parts: &request::Parts) -> Option<u32> {
    let claimed = parts.headers.get_all(header::COOKIE).iter().find_map(|v| app.sticky_copy(v.as_bytes()))?;
    let draining = app.index_of(claimed).is_some_and(|i| app.copies[i].role == Role::Draining);
    if draining && headers::is_page_load(parts) {
        return None;
    }
    Some(claimed)
}

/// The copy that takes the request (the app's current table entry and the
/// copy's index in it), at once when one can; else the request is held:
/// until a new table brings a copy, while a sleeping app wakes (the daemon
/// is asked, once for the requests that arrive together), up to the app's
/// hold (15 s) or, when it wakes, its request-timeout (at most 30 s); while
/// every copy is full at `max-replicas`, up to request-timeout for a session
/// to end. A hold that ends without a copy gives the page that answers the
/// request. The flag is true for a spare that took a new visitor because
/// every active copy was full.
async fn wait_for_copy(
    shared: &BalancerState,
    port: u16,
    mut app: Arc<LiveApp>,
    claimed: Option<u32>,
    attempt: &mut Attempt,
) -> Result<(Arc<LiveApp>, usize, bool), Response<DownBody>> {
    loop {
        if app.stopped {
            return Err(pages::stopped(&app.name));
        }
        match pick(&app, claimed, attempt) {
            Chosen::Copy(i) => return Ok((app, i, false)),
            Chosen::Spare(i) => return Ok((app, i, true)),
            Chosen::Busy | Chosen::None => {}
        }
        if app.down {
            return Err(pages::down(&app.name));
        }
        let mut changes = shared.table.subscribe();
        // A swap between the look above and subscribe() would be missed.
        app = shared.table.app(port).ok_or_else(|| pages::no_app(port))?;
        let busy = match pick(&app, claimed, attempt) {
            Chosen::Copy(i) => return Ok((app, i, false)),
            Chosen::Spare(i) => return Ok((app, i, true)),
            Chosen::Busy => true,
            Chosen::None => false,
        };
        shared.daemon.report_stand_in(&app.name, attempt.notice.take(), None);
        if app.asleep && attempt.wake.is_none() && !attempt.woken {
            attempt.held_for_wake_ms.get_or_insert_with(now_ms);
            attempt.wake = Some(shared.daemon.ask_wake(&app.counters.wake, &app.name, app.wake_hold));
        }
        let (until, waking) = *attempt.hold.get_or_insert_with(|| {
            let limit = if app.asleep {
                app.wake_hold
            } else if busy {
                app.busy_hold
            } else {
                app.hold
            };
            (Instant::now() + limit, app.asleep)
        });
        tokio::select! {
            _ = changes.changed() => {}
            // A session that ends is not announced: looked at again shortly.
            _ = tokio::time::sleep(BUSY_LOOK_AGAIN), if busy => {}
            outcome = wake_outcome(attempt.wake.as_mut()) => match outcome {
                // The table with the woken copy is on its way, if not here.
                WakeAnswer::Awake => {
                    attempt.wake = None;
                    attempt.woken = true;
                }
                WakeAnswer::Failed => return Err(pages::wake_failed(&app.name)),
                WakeAnswer::TimedOut => return Err(pages::wake_timed_out(&app.name)),
            },
            _ = tokio::time::sleep_until(until) => {
                if waking {
                    tracing::warn!(app = %app.name, "{} was not awake within {:?}", app.name, app.wake_hold);
                    return Err(pages::wake_timed_out(&app.name));
                }
                if busy {
                    tracing::warn!(app = %app.name, "every copy was full at max-replicas for {:?}; answered busy", app.busy_hold);
                    return Err(pages::app_busy(&app.name));
                }
                tracing::warn!(app = %app.name, "no copy could take a request within {:?}", app.hold);
                return Err(pages::restarting(&app.name));
            }
        }
        app = shared.table.app(port).ok_or_else(|| pages::no_app(port))?;
    }
}

/// How often a visitor held because every copy is full looks again.
const BUSY_LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(100);

/// What [`choose`] found for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chosen {
    /// This copy.
    Copy(usize),
    /// This spare, because every active copy is full: the daemon is told.
    Spare(usize),
    /// Every copy is full at `max-replicas`: wait for a session to end.
    Busy,
    /// No copy can take it now.
    None,
}

/// The copy for this request ([`choose`]): another than the one that lost
/// it when there is one, else that one again (it may only have dropped a
/// connection, or it comes back).
fn pick(app: &LiveApp, claimed: Option<u32>, attempt: &Attempt) -> Chosen {
    let now = now_ms();
    match choose(app, claimed, attempt.stand_in, attempt.avoid, now) {
        Chosen::None if attempt.avoid.is_some() => choose(app, claimed, attempt.stand_in, None, now),
        chosen => chosen,
    }
}

/// The copy for this request: the one its cookie names while that copy is
/// up (whatever its role), else, for an app with `max-sessions`, where
/// [`balance::place`] puts a new visitor, else one picked by the app's
/// policy; never `avoid` (the copy process that lost it: a retry goes to
/// another).
fn choose(app: &LiveApp, claimed: Option<u32>, failed: bool, avoid: Option<(u32, u32)>, now: u64) -> Chosen {
    let mut need = if failed { Need::StandIn } else { Need::NewVisitor };
    let avoided = |i: usize| avoid == Some((app.copies[i].copy, app.copies[i].pid));
    if let Some(i) = claimed.and_then(|n| app.index_of(n)) {
        if !app.copies[i].state.is_down(now) && !avoided(i) {
            return Chosen::Copy(i);
        }
        need = Need::StandIn;
    }
    let rr = match app.policy {
        LbPolicy::RoundRobin => app.counters.rr.fetch_add(1, Ordering::Relaxed),
        _ => 0,
    };
    let random = match app.policy {
        LbPolicy::Random => random(),
        _ => 0,
    };
    let candidate = |i: usize| {
        let mut c = app.copies[i].candidate(now);
        c.down |= avoided(i);
        c
    };
    if let Some((max_sessions, most)) = app.capacity.filter(|_| need == Need::NewVisitor && app.listening) {
        let active = app.copies.iter().filter(|c| c.role == Role::Active).count();
        let cap = Capacity { max_sessions, may_grow: active < most as usize };
        match balance::place(app.policy, app.copies.len(), candidate, cap, rr, random) {
            Some(Placement::Copy(i)) => return Chosen::Copy(i),
            Some(Placement::Spare(i)) => return Chosen::Spare(i),
            Some(Placement::Hold) => return Chosen::Busy,
            None => {}
        }
    }
    balance::pick_by(app.policy, app.copies.len(), candidate, need, rr, random)
        .or_else(|| (!app.listening).then(|| balance::pick_leaving(app.policy, app.copies.len(), candidate, rr, random)).flatten())
        .map_or(Chosen::None, Chosen::Copy)
}

/// The answer as the visitor gets it.
fn respond(
    shared: &BalancerState,
    app: &LiveApp,
    copy: &LiveCopy,
    claimed: Option<u32>,
    sent: Sent,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
) -> Response<DownBody> {
    let Sent { resp, lease } = sent;
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    let (mut parts, mut body) = resp.into_parts();
    headers::for_visitor(&mut parts, switching, (claimed != Some(copy.copy)).then_some(&copy.set_cookie));
    match (body.upgraded(), client_upgrade) {
        (Some(upstream), Some(client)) => {
            parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            shared.requests.session_opened(&app.name);
            let session = crate::proxy::tunnels::pump::Session::new(copy.state.clone(), Some(shared.requests.of(&app.name)));
            websocket::tunnel(&shared.pump, client, upstream, session, app.name.clone(), copy.copy);
            drop(lease);
            Response::from_parts(parts, DownBody::empty())
        }
        (Some(_), None) => {
            // Not reached: a copy's connection refuses a switch it was not asked for.
            tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, copy = copy.copy, "copy switched protocols unasked");
            pages::bad_gateway(&app.name)
        }
        (None, _) => {
            let lease = if body.is_end_stream() {
                // Nothing to stream (HEAD, 204, 304): the connection is free now.
                lease.finish(body.reusable());
                None
            } else {
                Some(lease)
            };
            Response::from_parts(parts, DownBody::Upstream { body, lease, idle: Idle::default() })
        }
    }
}

/// A cheap random number (xorshift64*, one state per thread) for the
/// random policy; nothing secret depends on it.
fn random() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
            let here = &t as *const u64 as u64;
            (t ^ here.rotate_left(32)) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::copies::table::Table;
    use crate::wire::{ProxyApp, ProxyCopy, ProxyTable};

    const KEY: [u8; 32] = [3; 32];

    /// App `web` on port 8080 with `copies` (number, role), as a pushed table
    /// makes it.
    fn app(policy: LbPolicy, copies: &[(u32, Role)]) -> Arc<LiveApp> {
        let copies =
            copies.iter().map(|&(copy, role)| ProxyCopy { copy, port: 20000 + copy as u16, role, pid: copy, r_pid: None }).collect();
        let source = ProxyTable { apps: vec![ProxyApp::for_tests("web", policy, copies)] };
        Table::build(source, &KEY, &Table::default()).apps[0].clone()
    }

    /// The copy number `choose` picks.
    fn chosen(app: &LiveApp, claimed: Option<u32>, stand_in: bool) -> Option<u32> {
        match choose(app, claimed, stand_in, None, 1_000_000) {
            Chosen::Copy(i) | Chosen::Spare(i) => Some(app.copies[i].copy),
            Chosen::Busy | Chosen::None => None,
        }
    }

    #[test]
    fn a_claimed_copy_that_is_up_is_chosen_whatever_its_role() {
        let web = app(LbPolicy::First, &[(1, Role::Active), (2, Role::Warm), (3, Role::Draining)]);
        assert_eq!(chosen(&web, None, false), Some(1));
        assert_eq!(chosen(&web, Some(2), false), Some(2));
        assert_eq!(chosen(&web, Some(3), false), Some(3), "a draining copy keeps its visitors");
        assert_eq!(chosen(&web, Some(9), false), Some(1), "a copy gone from the table: the policy picks");
    }

    #[test]
    fn a_claimed_copy_that_is_down_sends_its_visitor_to_a_stand_in() {
        let web = app(LbPolicy::First, &[(1, Role::Active), (2, Role::Active), (3, Role::Warm)]);
        web.copies[0].state.mark_down(1_000_000);
        assert_eq!(chosen(&web, Some(1), false), Some(3), "the warm copy stands in, not active copy 2");
        assert_eq!(chosen(&web, None, false), Some(2), "a new visitor gets an active copy that is up");
        assert_eq!(chosen(&web, None, true), Some(3), "once a request found a copy down, a warm copy first");
        web.copies[1].state.mark_down(1_000_000);
        web.copies[2].state.mark_down(1_000_000);
        assert_eq!(chosen(&web, Some(1), false), None, "nothing up: the request is held");
    }

    #[test]
    fn a_reload_leaves_a_draining_copy_and_the_pages_own_requests_stay() {
        let web = app(LbPolicy::First, &[(1, Role::Draining), (2, Role::Active)]);
        let cookie = format!("lb_8080={}", web.copies[0].cookie);
        let parts = |navigate: bool, path: &str| {
            let mut req = Request::builder().uri(path).header(header::COOKIE, &cookie);
            if navigate {
                req = req.header("sec-fetch-mode", "navigate").header("sec-fetch-dest", "document");
            }
            req.body(()).unwrap().into_parts().0
        };
        assert_eq!(claimed_copy(&web, &parts(true, "/")), None, "a reload gets the new version");
        assert_eq!(claimed_copy(&web, &parts(false, "/shared/shiny.js")), Some(1));
        assert_eq!(claimed_copy(&web, &parts(true, "/session/abc/download/x")), Some(1), "a download belongs to the open page");
        let active = format!("lb_8080={}", web.copies[1].cookie);
        let reload =
            Request::builder().header(header::COOKIE, active).header("sec-fetch-mode", "navigate").body(()).unwrap().into_parts().0;
        assert_eq!(claimed_copy(&web, &reload), Some(2), "a reload stays on an active copy");
    }

    #[test]
    fn random_picks_are_spread_and_not_an_alternation() {
        let web = app(LbPolicy::Random, &[(1, Role::Active), (2, Role::Active)]);
        let picks: Vec<u32> = (0..2000).map(|_| chosen(&web, None, false).unwrap()).collect();
        let ones = picks.iter().filter(|&&c| c == 1).count();
        // Binomial(2000, 1/2): 1000 ± 22; these bounds are 9 deviations out.
        assert!((800..=1200).contains(&ones), "copy 1 got {ones} of 2000");
        // A counter would alternate (no repeats) or repeat always; random
        // repeats about half the time.
        let repeats = picks.windows(2).filter(|w| w[0] == w[1]).count();
        assert!((800..=1200).contains(&repeats), "{repeats} repeats in 1999 pairs");
    }

    #[test]
    fn each_thread_draws_its_own_numbers() {
        let draw = || std::thread::spawn(|| (0..4).map(|_| random()).collect::<Vec<u64>>()).join().unwrap();
        assert_ne!(draw(), draw(), "two workers must not pick in lockstep");
    }
}
