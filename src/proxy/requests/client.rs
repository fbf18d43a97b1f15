//! A visitor's connection as its requests see it: the app's port, the
//! visitor's address, and its place under the connection caps (`caps.rs`),
//! taken when the connection is accepted and given back when it closes.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use hyper::header::HeaderValue;

use crate::proxy::copies::table::AppCounters;
use crate::proxy::counters;
use crate::proxy::error_source::ErrorSource;
use crate::proxy::shared::BalancerState;
use crate::proxy::visitors::caps::{self, Counts, Verdict};

/// A client connection's own facts, shared by its requests.
pub struct VisitorConnection {
    /// Everything the load balancer shares.
    pub shared: Arc<BalancerState>,
    /// The public port the connection came in on: which app it is for.
    pub port: u16,
    /// The visitor's address (IPv4 without a `::ffff:` prefix).
    pub peer: IpAddr,
    /// The same, ready to be sent as `X-Forwarded-For` or `X-Real-IP`.
    pub xff: HeaderValue,
    /// Past a cap: every request is answered 503 and the connection closes.
    pub busy: bool,
    /// The metrics of the app its port served when it was accepted: its
    /// answers and bytes count there (looked up once, not per request).
    pub stats: Option<Arc<counters::AppCounters>>,
    /// Counted under the per-address cap (not loopback, not a trusted
    /// proxy): the address to uncount.
    counted_address: Option<IpAddr>,
    /// The app this connection is counted against, when it was admitted.
    counted_app: Option<Arc<AppCounters>>,
}

impl VisitorConnection {
    /// Takes in a new visitor connection on `port`, counted under the caps.
    /// `None`: far past a cap, close it at once. Called in the accept loop,
    /// in the order connections were accepted, before the connection goes
    /// to a worker: so the connection past a cap is the one that came last,
    /// and the load balancer's open count never runs ahead of the caps'.
    pub fn admit(peer: SocketAddr, port: u16, shared: &Arc<BalancerState>) -> Option<Arc<VisitorConnection>> {
        let ip = peer.ip().to_canonical();
        let app = shared.table.app(port);
        let exempt = ip.is_loopback() || app.as_ref().is_some_and(|a| a.trusts(ip));
        let counted_address = (!exempt).then_some(ip);
        let (total, address) = shared.gate.enter(counted_address);
        let (app_open, app_max) = app.as_ref().map_or((0, usize::MAX), |a| (a.counters.open.load(Ordering::Relaxed), a.max_connections));
        let verdict = caps::verdict(Counts { total, budget: shared.gate.budget, app: app_open, app_max, address });
        let mut client = VisitorConnection {
            shared: shared.clone(),
            port,
            peer: ip,
            xff: address_header(ip),
            busy: verdict != Verdict::Admit,
            stats: app.as_ref().map(|a| shared.requests.of(&a.name)),
            counted_address,
            counted_app: None,
        };
        match verdict {
            Verdict::Admit => {
                if let Some(a) = &app {
                    a.counters.open.fetch_add(1, Ordering::Relaxed);
                    client.counted_app = Some(a.counters.clone());
                }
            }
            Verdict::Busy => {
                tracing::debug!(source = %ErrorSource::Downstream, port, %ip, total, app_open, ?address, "past a connection cap: 503");
            }
            Verdict::Close => {
                tracing::debug!(source = %ErrorSource::Downstream, port, %ip, total, app_open, ?address, "far past a connection cap: closed");
                // Dropping the client uncounts it.
                return None;
            }
        }
        Some(Arc::new(client))
    }
}

impl Drop for VisitorConnection {
    fn drop(&mut self) {
        self.shared.gate.leave(self.counted_address);
        if let Some(app) = &self.counted_app {
            app.open.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The visitor's address as a header value.
fn address_header(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(ip.to_string())).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_written_plainly() {
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(address_header(mapped.to_canonical()), "192.0.2.7");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(address_header(v6), "2001:db8::1");
    }
}
