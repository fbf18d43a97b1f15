//! The load balancer's link to the daemon, on `api.sock`: it reports a copy
//! that refused a connection and the warm copy that stood in
//! (`POST /v1/apps/<app>/stand-in`), and asks for a sleeping app to be
//! woken (`POST /v1/apps/<app>/wake`). These two routes are typed in `api_client::routes` and
//! nowhere else in the load balancer. Neither call holds a request up for
//! longer than the daemon's answer, and a daemon that is down only means
//! the load balancer carries on with the table it has.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use hyper::{Method, StatusCode};
use tokio::sync::watch;

use crate::wire::StandIn;

/// How a wake asked of the daemon ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WakeAnswer {
    /// A copy is active.
    Awake,
    /// The wake failed (or the daemon could not be asked).
    Failed,
    /// No copy was ready within the app's request-timeout.
    TimedOut,
}

/// A wake being waited for: `None` inside until it ends.
pub type WakeWatch = watch::Receiver<Option<WakeAnswer>>;

/// The wake an app asked of the daemon, shared by the requests that arrive
/// while it goes on.
pub type WakeSlot = Mutex<Option<WakeWatch>>;

/// Where the daemon listens.
pub struct DaemonLink {
    /// The daemon's `api.sock`.
    pub api_sock: PathBuf,
}

impl DaemonLink {
    /// Tells the daemon, without delaying anyone, that `down` refused a
    /// connection and which warm copy stood in. Errors are ignored: the
    /// daemon may be down, and the load balancer carries on with the table
    /// it has.
    pub fn report_stand_in(&self, app: &str, down: Option<u32>, stand_in: Option<u32>) {
        let Some(down) = down else { return };
        tracing::info!(app, down, ?stand_in, "telling the daemon that copy {down} is down");
        self.post_stand_in(app, StandIn { down: Some(down), stand_in, full: false });
    }

    /// Tells the daemon, without delaying anyone, that every active copy of
    /// `app` was full and the warm copy `stand_in` took a new visitor: the
    /// app grows (README, "Capacity").
    pub fn report_full(&self, app: &str, stand_in: u32) {
        tracing::info!(app, stand_in, "every active copy is full; telling the daemon that warm copy {stand_in} took a new visitor");
        self.post_stand_in(app, StandIn { down: None, stand_in: Some(stand_in), full: true });
    }

    /// Sends a stand-in report in the background; errors are ignored.
    fn post_stand_in(&self, app: &str, report: StandIn) {
        let sock = self.api_sock.clone();
        let path = crate::wire::api_client::routes::stand_in(app);
        let body = serde_json::to_vec(&report).unwrap_or_default();
        tokio::spawn(async move {
            match crate::wire::uds::request(&sock, Method::POST, &path, Some(body), Duration::from_secs(1)).await {
                Ok((status, _)) if status.is_success() => {}
                Ok((status, _)) => tracing::debug!("the daemon answered {status} to {path}"),
                Err(e) => tracing::debug!("cannot tell the daemon ({path}): {e:#}"),
            }
        });
    }

    /// Asks the daemon to wake the sleeping app `app`, or joins the wake
    /// another request already asked for (kept in `slot`), so requests that
    /// arrive together share one. `limit` is how long a request may wait.
    pub fn ask_wake(&self, slot: &WakeSlot, app: &str, limit: Duration) -> WakeWatch {
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(rx) = slot.as_ref().filter(|rx| rx.borrow().is_none()) {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(None);
        *slot = Some(rx.clone());
        let sock = self.api_sock.clone();
        let name = app.to_string();
        tracing::info!(app = %name, "asking the daemon to wake {name}");
        tokio::spawn(async move {
            let outcome = ask_until_answered(&sock, &name, limit).await;
            tx.send_replace(Some(outcome));
        });
        rx
    }
}

/// How often a wake is asked again while the daemon does not answer.
const ASK_AGAIN: Duration = Duration::from_millis(200);

/// Asks the daemon for the wake of `name` and waits for its answer, up to
/// `limit`. A daemon that does not answer at all (an upgrade restarts it:
/// its socket is gone or refuses) is asked again until then, so a visitor
/// who comes meanwhile is held, not told the app could not be woken.
async fn ask_until_answered(sock: &std::path::Path, name: &str, limit: Duration) -> WakeAnswer {
    let path = crate::wire::api_client::routes::wake(name);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // The daemon answers by the app's request-timeout itself; the
        // margins only cover it being slow to.
        let ask = crate::wire::uds::request(sock, Method::POST, &path, None, left + Duration::from_secs(5));
        match tokio::time::timeout(left + Duration::from_secs(1), ask).await {
            Ok(Ok((status, _))) if status.is_success() => return WakeAnswer::Awake,
            Ok(Ok((StatusCode::GATEWAY_TIMEOUT, _))) => return WakeAnswer::TimedOut,
            Ok(Ok((status, body))) => {
                tracing::warn!(app = %name, "the daemon could not wake it ({status}): {}", String::from_utf8_lossy(&body));
                return WakeAnswer::Failed;
            }
            Ok(Err(e)) if left > ASK_AGAIN => {
                tracing::debug!(app = %name, "the daemon does not answer a wake ({e:#}); asking again");
                tokio::time::sleep(ASK_AGAIN).await;
            }
            Ok(Err(e)) => {
                tracing::warn!(app = %name, "cannot ask the daemon for a wake: {e:#}");
                return WakeAnswer::TimedOut;
            }
            Err(_) => return WakeAnswer::TimedOut,
        }
    }
}

/// How the wake being waited for ended; never, when there is none.
pub async fn wake_outcome(wake: Option<&mut WakeWatch>) -> WakeAnswer {
    let Some(rx) = wake else { return std::future::pending().await };
    match rx.wait_for(Option::is_some).await {
        Ok(outcome) => outcome.unwrap_or(WakeAnswer::Failed),
        // The asking task is gone without an answer.
        Err(_) => WakeAnswer::Failed,
    }
}
