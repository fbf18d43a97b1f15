//! WebSockets: a Shiny session is one. The upgrade request goes to the copy
//! on a connection of its own; once both sides have switched protocols the
//! bytes are copied both ways as they come, and the copy counts one
//! session for as long as the tunnel lives.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use hyper::header::{self, HeaderMap};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::shared::ErrorSource;
use super::table::CopyState;

/// True for a request that asks to switch to the WebSocket protocol
/// (`Connection: upgrade` and `Upgrade: websocket`, in any case, among
/// other tokens).
pub fn is_upgrade(h: &HeaderMap) -> bool {
    has_token(h, header::UPGRADE, "websocket") && has_token(h, header::CONNECTION, "upgrade")
}

fn has_token(h: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    h.get_all(name).iter().any(|v| v.to_str().unwrap_or("").split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// One open WebSocket, counted on its copy (a connection and a session)
/// until dropped.
pub struct Session {
    /// The copy's counters.
    state: Arc<CopyState>,
}

impl Session {
    /// Counts a new session on the copy.
    pub fn new(state: Arc<CopyState>) -> Session {
        state.connections.fetch_add(1, Ordering::Relaxed);
        state.sessions.fetch_add(1, Ordering::Relaxed);
        Session { state }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.state.sessions.fetch_sub(1, Ordering::Relaxed);
        self.state.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Once the visitor's and the copy's connections have both switched
/// protocols, copies bytes between them until either side closes.
pub fn tunnel(client: OnUpgrade, upstream: OnUpgrade, session: Session, app: String, copy: u32) {
    tokio::spawn(async move {
        let _session = session;
        let (client, upstream) = match tokio::join!(client, upstream) {
            (Ok(c), Ok(u)) => (c, u),
            (Err(e), _) => {
                tracing::debug!(source = %ErrorSource::Downstream, app, copy, "WebSocket upgrade: {e}");
                return;
            }
            (_, Err(e)) => {
                tracing::debug!(source = %ErrorSource::Upstream, app, copy, "WebSocket upgrade: {e}");
                return;
            }
        };
        let mut client = TokioIo::new(client);
        let mut upstream = TokioIo::new(upstream);
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            // Either side may go away without a close handshake; that is the
            // end of a session, not a fault of ours.
            tracing::debug!(app, copy, "WebSocket closed: {e}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn websocket_upgrades_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("WebSocket"));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(is_upgrade(&h));
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        assert!(!is_upgrade(&h));
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        assert!(!is_upgrade(&h));
        assert!(!is_upgrade(&HeaderMap::new()));
    }
}
