//! Limits by progress, not by total time: a body that moves no byte for
//! [`BODY_IDLE`] is cut, however long it has been moving before (a Shiny
//! upload or download to a slow visitor may take minutes).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The longest a request or response body may go without a byte.
pub const BODY_IDLE: Duration = Duration::from_secs(60);

/// The error a body that stopped moving ends with.
#[derive(Debug)]
pub struct Stalled(pub &'static str);

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} moved no byte for {}s", self.0, BODY_IDLE.as_secs())
    }
}

impl std::error::Error for Stalled {}

/// What a body's error is, whatever its side.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The clock of one body: reset on every frame, it fires after
/// [`BODY_IDLE`] without one. The timer is made on the first wait only, so
/// a body that is there at once costs nothing.
#[derive(Default)]
pub struct Idle {
    /// The deadline, once the body has had to wait.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Idle {
    /// A frame came: the clock starts again.
    pub fn moved(&mut self) {
        if let Some(t) = self.timer.as_mut() {
            t.as_mut().reset(Instant::now() + BODY_IDLE);
        }
    }

    /// The body is waiting: true once it has waited too long (the task is
    /// woken when it has).
    pub fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep(BODY_IDLE)));
        timer.as_mut().poll(cx).is_ready()
    }
}

/// Polls `inner` under `idle`: a frame resets the clock, a wait past
/// [`BODY_IDLE`] ends the body with [`Stalled`] (`what` names it).
pub fn poll_watched<T, E: Into<BoxError>>(
    polled: Poll<Option<Result<T, E>>>,
    idle: &mut Idle,
    cx: &mut Context<'_>,
    what: &'static str,
) -> Poll<Option<Result<T, BoxError>>> {
    match polled {
        Poll::Ready(r) => {
            idle.moved();
            Poll::Ready(r.map(|r| r.map_err(Into::into)))
        }
        Poll::Pending if idle.expired(cx) => Poll::Ready(Some(Err(Box::new(Stalled(what))))),
        Poll::Pending => Poll::Pending,
    }
}
