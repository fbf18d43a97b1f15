//! What one request has been through across its sends and holds, and what
//! a failed send makes of it (`Attempt::failed`): a copy that refused is
//! marked down and the request goes to a stand-in; a local error is a 503
//! that blames no copy; a request lost on its way is sent again once, to
//! another copy, when `copies/retry.rs` says it may be.

use hyper::http::request;
use hyper::{Method, Response, Uri};
use tokio::time::Instant;

use crate::proxy::copies::copy_conn::UpBody;
use crate::proxy::copies::retry::{self, Lost};
use crate::proxy::copies::table::{LiveApp, LiveCopy};
use crate::proxy::daemon_link::WakeWatch;
use crate::proxy::error_source::ErrorSource;
use crate::proxy::requests::upstream::Failure;
use crate::proxy::shared::BalancerState;
use crate::proxy::visitors::body::DownBody;
use crate::proxy::visitors::pages;
use crate::sys::clock::{mono_ms, now_ms};

/// Sends of one request at most (new connections, stand-ins, a retry).
const MAX_SENDS: u32 = 5;

/// What one request has been through, across its sends and holds.
pub struct Attempt {
    /// The request's method, for the retry rule and the deaths.
    method: Method,
    /// Its target (path and query), for the deaths.
    uri: Uri,
    /// Set once this request finds a copy down: new visitors then go to a
    /// stand-in first.
    pub stand_in: bool,
    /// The copy this request marked down: the daemon is told once a
    /// stand-in is picked (or none can be).
    pub notice: Option<u32>,
    /// When the hold ends, and whether it waits for a wake; set when the
    /// request is first held and kept for any later hold.
    pub hold: Option<(Instant, bool)>,
    /// The wake this request waits for.
    pub wake: Option<WakeWatch>,
    /// A wake ended with the app awake: no other is asked for.
    pub woken: bool,
    /// When (Unix ms) the request was first held for a wake: its send is
    /// said in the log with the moments of its steps ([`Attempt::say_woken`]).
    pub held_for_wake_ms: Option<u64>,
    /// Sends so far (new connections, stand-ins and retries).
    pub sends: u32,
    /// It was lost once and sent again: never a second time.
    retried: bool,
    /// Copy deaths it was in flight at.
    deaths: u32,
    /// The copy (number, process) that lost it: the retry goes elsewhere.
    pub avoid: Option<(u32, u32)>,
}

impl Attempt {
    /// A request about to be sent for the first time.
    pub fn new(parts: &request::Parts) -> Attempt {
        Attempt {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            stand_in: false,
            notice: None,
            hold: None,
            wake: None,
            woken: false,
            held_for_wake_ms: None,
            sends: 0,
            retried: false,
            deaths: 0,
            avoid: None,
        }
    }

    /// Says in the log when a request held for a wake of `app` was sent to
    /// `copy` (Unix ms `sent_ms`) and answered (now, `status`), with when it
    /// was first held: the load balancer's side of the daemon's `woke in`
    /// line, whose `asked_ms` it lines up with. Nothing for a request that
    /// was not held for a wake.
    pub fn say_woken(&self, app: &str, copy: u32, sent_ms: u64, status: hyper::StatusCode) {
        let Some(held) = self.held_for_wake_ms else { return };
        let answered = now_ms();
        tracing::info!(
            app,
            copy,
            held_ms = held,
            "a request held for the wake of {app}: sent to copy {copy} +{} ms, answered {} +{}",
            sent_ms.saturating_sub(held),
            status.as_u16(),
            answered.saturating_sub(held)
        );
    }

    /// The request as deaths remember it: `GET /path?query`.
    pub fn line(&self) -> String {
        retry::key(&self.method, self.uri.path_and_query().map_or("/", |pq| pq.as_str()))
    }

    /// True while this request is answered 502 at once (it was in flight
    /// when two of the app's copies died within a minute).
    pub fn refused(&self, app: &LiveApp, now: u64) -> bool {
        let deaths = app.counters.deaths.lock().unwrap_or_else(|e| e.into_inner());
        !deaths.is_empty() && deaths.refused(&self.line(), now)
    }

    /// Takes in a failed send to `copy`: the body to send the request again
    /// with, or the page that answers it when it cannot be. `replayable`:
    /// the request had no body, so it can be sent again after it was lost.
    /// `died`: the send was lost and the copy's process is gone.
    // The page is the request's answer, as large as the request beside it;
    // boxing it would only add an allocation to a failure.
    #[allow(clippy::result_large_err)]
    pub fn failed(
        &mut self,
        shared: &BalancerState,
        app: &LiveApp,
        copy: &LiveCopy,
        failure: Failure,
        replayable: bool,
        died: bool,
    ) -> Result<UpBody, Response<DownBody>> {
        let again = match failure {
            Failure::Refused(back, e) => {
                // The copy failed one: its other idle connections are likely dead too.
                copy.state.pool.clear();
                self.mark_down(app, copy, &format!("refused a connection ({e})"));
                back
            }
            Failure::Local(e) => {
                tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, copy = copy.copy,
                    "cannot open a connection to copy {} ({e}): the load balancer is short of resources; answered 503, the copy is not blamed", copy.copy);
                return Err(pages::overloaded(&app.name));
            }
            Failure::Lost(e) => {
                copy.state.pool.clear();
                self.lost(app, copy, replayable, died, &e)?
            }
            Failure::Ending => {
                copy.state.pool.clear();
                self.lost(app, copy, replayable, true, &"its process began to exit")?
            }
        };
        if self.sends >= MAX_SENDS {
            tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, "no copy answered after {} attempts", self.sends);
            shared.daemon.report_stand_in(&app.name, self.notice.take(), None);
            return Err(pages::bad_gateway(&app.name));
        }
        Ok(again)
    }

    /// A request sent to `copy` and lost before any byte of an answer.
    #[allow(clippy::result_large_err)]
    fn lost(
        &mut self,
        app: &LiveApp,
        copy: &LiveCopy,
        replayable: bool,
        died: bool,
        e: &dyn std::fmt::Display,
    ) -> Result<UpBody, Response<DownBody>> {
        let line = self.line();
        if died {
            self.mark_down(app, copy, &format!("died with {line} in flight ({e})"));
            self.deaths += 1;
            let death = (u64::from(copy.copy) << 32) | u64::from(copy.pid);
            let mut deaths = app.counters.deaths.lock().unwrap_or_else(|p| p.into_inner());
            // A GET, HEAD or OPTIONS counts by its own deaths (it was sent
            // again after the first); others, never sent again, by their
            // line: a visitor who sends the same POST again.
            let refused = if retry::is_safe(&self.method) {
                if self.deaths >= 2 {
                    deaths.second_death(&line, mono_ms());
                }
                self.deaths >= 2
            } else {
                deaths.lost(&line, death, mono_ms())
            };
            drop(deaths);
            if refused {
                tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, request = %line,
                    "{line} was in flight when two copies died within a minute: it is answered 502 at once for a minute");
                return Err(pages::bad_gateway(&app.name));
            }
        }
        match retry::after_lost(&self.method, self.retried, replayable) {
            Lost::Retry => {
                tracing::info!(source = %ErrorSource::Upstream, app = %app.name, copy = copy.copy, request = %line,
                    "copy {} lost {line} ({e}); sending it once to another copy", copy.copy);
                self.retried = true;
                self.avoid = Some((copy.copy, copy.pid));
                Ok(UpBody::Empty)
            }
            _ => {
                tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, copy = copy.copy, request = %line,
                    "copy {} lost {line} ({e}); it is not sent again", copy.copy);
                Err(pages::bad_gateway(&app.name))
            }
        }
    }

    /// Marks `copy` down (it gets no visitor until it is back), tells the
    /// daemon once, and sends this request to a stand-in.
    fn mark_down(&mut self, app: &LiveApp, copy: &LiveCopy, why: &str) {
        self.stand_in = true;
        if copy.state.mark_down(now_ms()) {
            tracing::warn!(source = %ErrorSource::Upstream, app = %app.name, copy = copy.copy, port = copy.port,
                "copy {} {why}; it gets no visitor until it comes back", copy.copy);
            self.notice = Some(copy.copy);
        }
    }
}
