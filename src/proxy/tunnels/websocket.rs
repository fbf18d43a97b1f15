//! WebSockets: a Shiny session is one. The upgrade request goes to the copy
//! on a connection of its own; once both sides have switched protocols the
//! two raw sockets go into the pump (pump.rs), which carries the bytes both
//! ways as they come, and the copy counts one session for as long as the
//! tunnel lives in this load balancer.

use std::sync::Arc;

use hyper::header::{self, HeaderMap};
use hyper::upgrade::{OnUpgrade, Parts};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::proxy::copies::copy_conn::has_token;
use crate::proxy::error_source::ErrorSource;
use crate::proxy::tunnels::pump::{Direction, Live, Pump};
use crate::proxy::visitors::counted::Counted;

/// True for a request that asks to switch to the WebSocket protocol
/// (`Connection: upgrade` and `Upgrade: websocket`, in any case, among
/// other tokens).
pub fn is_upgrade(h: &HeaderMap) -> bool {
    has_token(h, header::UPGRADE, "websocket") && has_token(h, header::CONNECTION, "upgrade")
}

/// What is wrong with a WebSocket handshake (RFC 6455, 4.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadHandshake {
    /// 400: not a GET, a body, or no `Sec-WebSocket-Key` of 16 bytes in base64.
    Malformed(&'static str),
    /// 426, naming version 13: a `Sec-WebSocket-Version` other than 13.
    Version,
}

/// Checks an upgrade request before it goes to a copy, so a malformed one
/// gets its 400 (or 426) from us rather than a copy's refusal or a 101 to
/// a handshake no browser sends. `has_body`: the request carries one.
pub fn check_handshake(method: &hyper::Method, h: &HeaderMap, has_body: bool) -> Result<(), BadHandshake> {
    if method != hyper::Method::GET {
        return Err(BadHandshake::Malformed("a WebSocket handshake is a GET"));
    }
    if has_body {
        return Err(BadHandshake::Malformed("a WebSocket handshake has no body"));
    }
    let one = |name: &str| {
        let mut all = h.get_all(name).iter();
        match (all.next(), all.next()) {
            (Some(v), None) => v.to_str().ok().map(str::trim),
            _ => None,
        }
    };
    if !one("sec-websocket-key").is_some_and(is_key) {
        return Err(BadHandshake::Malformed("Sec-WebSocket-Key must be 16 bytes in base64"));
    }
    if one("sec-websocket-version") != Some("13") {
        return Err(BadHandshake::Version);
    }
    Ok(())
}

/// True for the base64 of 16 bytes: 22 characters of the alphabet, the last
/// of them holding no bits past the 128th, then `==`.
fn is_key(k: &str) -> bool {
    let b = k.as_bytes();
    let alphabet = |c: &u8| c.is_ascii_alphanumeric() || *c == b'+' || *c == b'/';
    b.len() == 24 && b[..22].iter().all(alphabet) && b"AQgw".contains(&b[21]) && &b[22..] == b"=="
}

/// Once the visitor's and the copy's connections have both switched
/// protocols, carries bytes between them until both sides have closed (a
/// close is passed on) or either fails: in the pump, on the raw sockets,
/// with the bytes read past each head going first. `copy_side`: the copy's
/// socket and what it sent past its head.
pub fn tunnel(
    pump: &Arc<Pump>,
    client: OnUpgrade,
    copy_side: (TcpStream, bytes::Bytes),
    session: crate::proxy::tunnels::pump::Session,
    app: String,
    copy: u32,
) {
    let slot = pump.slot();
    tokio::spawn(async move {
        let client = match client.await {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(source = %ErrorSource::Downstream, app, copy, "WebSocket upgrade: {e}");
                return;
            }
        };
        match client.downcast::<TokioIo<Counted>>() {
            Ok(c) => slot.run(into_live(c, copy_side), app, copy, session).await,
            Err(upgraded) => {
                drop(slot);
                tracing::warn!(app, copy, "a WebSocket's connection is not a plain socket; carried outside the pump");
                let client: Side = (Box::new(TokioIo::new(upgraded)), bytes::Bytes::new());
                let (stream, down) = copy_side;
                carry_wrapped(client, (Box::new(stream), down), &app, copy).await;
                drop(session);
            }
        }
    });
}

/// The raw sockets of an upgrade, with the bytes read past each head
/// (the visitor's copied: hyper's `read_buf` keeps its whole read buffer,
/// 8 KiB or more, alive, and it is dropped here rather than held for the
/// session's life).
fn into_live(client: Parts<TokioIo<Counted>>, copy_side: (TcpStream, bytes::Bytes)) -> Live {
    let Parts { io: visitor, read_buf: up, .. } = client;
    let (copy, down) = copy_side;
    let (visitor, counters) = visitor.into_inner().into_parts();
    // What was read from the copy past its head goes to the visitor
    // outside the pump's reads: counted here.
    if let Some(c) = counters {
        c.add_bytes(true, down.len() as u64);
    }
    Live { visitor, copy, up: Direction::new(up.to_vec(), false), down: Direction::new(down.to_vec(), false) }
}

/// Either side of a tunnel as something to read and write, with the bytes
/// read past its head.
type Side = (Box<dyn Stream>, bytes::Bytes);

/// What a tunnel carries bytes over outside the pump.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// Carries a tunnel whose visitor connection is not a plain socket (a
/// wrapper type the pump does not know) as before the pump: two copy
/// buffers.
async fn carry_wrapped(client: Side, upstream: Side, app: &str, copy: u32) {
    let ((mut client, client_buf), (mut upstream, upstream_buf)) = (client, upstream);
    let first = async {
        upstream.write_all(&client_buf).await?;
        client.write_all(&upstream_buf).await?;
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await
    };
    if let Err(e) = first.await {
        tracing::debug!(app, copy, "WebSocket closed: {e}");
    }
}

#[cfg(test)]
mod handshake_tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (header::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap())).collect()
    }

    #[test]
    fn a_malformed_handshake_is_refused_with_the_right_status() {
        let get = hyper::Method::GET;
        let good = [("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="), ("sec-websocket-version", "13")];
        assert_eq!(check_handshake(&get, &headers(&good), false), Ok(()));
        assert!(matches!(check_handshake(&get, &headers(&[]), false), Err(BadHandshake::Malformed(_))), "no key");
        let bad_key = [("sec-websocket-key", "!!"), ("sec-websocket-version", "13")];
        assert!(matches!(check_handshake(&get, &headers(&bad_key), false), Err(BadHandshake::Malformed(_))));
        let long_key = [("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZR=="), ("sec-websocket-version", "13")];
        assert!(matches!(check_handshake(&get, &headers(&long_key), false), Err(BadHandshake::Malformed(_))), "bits past 16 bytes");
        let v99 = [("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="), ("sec-websocket-version", "99")];
        assert_eq!(check_handshake(&get, &headers(&v99), false), Err(BadHandshake::Version));
        assert!(matches!(check_handshake(&get, &headers(&good), true), Err(BadHandshake::Malformed(_))), "a body");
        assert!(matches!(check_handshake(&hyper::Method::POST, &headers(&good), false), Err(BadHandshake::Malformed(_))));
    }
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
