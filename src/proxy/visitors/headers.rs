//! The header rules between a visitor and a copy: which headers belong to
//! one connection and are dropped on the way (RFC 9110 §7.6.1), what a copy
//! is told about the visitor (`X-Forwarded-For`, `X-Real-IP`,
//! `X-Forwarded-Proto`; a visitor's own forwarded-style headers are
//! replaced or removed, a trusted proxy's are kept and appended to), and
//! what a request's headers say about it (a page load).

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::{request, response};
use hyper::{Method, Uri, Version};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Hop-by-hop whatever `Connection` says (`Upgrade` apart: kept for a
/// protocol switch).
const HOP_BY_HOP: [HeaderName; 5] = [KEEP_ALIVE, PROXY_CONNECTION, header::TE, header::TRAILER, header::TRANSFER_ENCODING];
/// A visitor's forwarded-style headers that are removed, not replaced,
/// unless it is a trusted proxy.
const NOT_BELIEVED: [HeaderName; 3] = [FORWARDED, X_FORWARDED_HOST, X_FORWARDED_PORT];

/// Who sent a request, as the copy is told.
pub struct Sender<'a> {
    /// The connection's peer address, as a header value.
    pub address: &'a HeaderValue,
    /// The peer is one of the app's `trusted-proxies`.
    pub trusted: bool,
}

/// The request as a copy gets it: hop-by-hop headers out, the visitor's
/// address in (`from`), origin-form, HTTP/1.1.
pub fn for_copy(parts: &mut request::Parts, from: &Sender, upgrade: bool) {
    let h = &mut parts.headers;
    strip_hop_by_hop(h, upgrade);
    drop_underscored(h);
    if upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    forwarded(h, from);
    // The visitor already got its 100 Continue from us when the body was read.
    h.remove(header::EXPECT);
    if !h.contains_key(header::HOST) {
        h.insert(header::HOST, HeaderValue::from_static("localhost"));
    }
    parts.version = Version::HTTP_11;
    if parts.uri.authority().is_some() {
        // Absolute-form from a visitor: copies expect origin-form.
        parts.uri = parts.uri.path_and_query().map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
    }
}

/// Drops every header whose name holds `_`. R's web server (httpuv) reads
/// `_` and `-` alike, so a visitor's `X_Forwarded_For` or `X-Real_IP`
/// would reach the app as the forwarded header this load balancer sets or
/// removes; nginx drops such names by default for the same reason
/// (`underscores_in_headers off`). No allocation unless one is there.
fn drop_underscored(h: &mut HeaderMap) {
    if !h.keys().any(|n| n.as_str().contains('_')) {
        return;
    }
    let names: Vec<header::HeaderName> = h.keys().filter(|n| n.as_str().contains('_')).cloned().collect();
    for name in names {
        h.remove(&name);
    }
}

/// The answer's head as the visitor gets it: hop-by-hop headers out
/// (keeping `Upgrade` when `switching`), HTTP/1.1, and `place` (the
/// `Set-Cookie` that places the visitor on the copy), when given.
pub fn for_visitor(parts: &mut response::Parts, switching: bool, place: Option<&HeaderValue>) {
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers, switching);
    drop_placements(&mut parts.headers);
    if let Some(set_cookie) = place {
        parts.headers.append(header::SET_COOKIE, set_cookie.clone());
        // A shared cache must not hand one visitor's placement to everyone.
        if !switching && !parts.headers.contains_key(header::CACHE_CONTROL) {
            parts.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
        }
    }
}

/// Drops an app's own `Set-Cookie` of a sticky cookie's name (`lb_…`, any
/// port: a browser sends a host's cookies to each of its ports), so one
/// app cannot place its visitors on a copy of another app, nor on a copy
/// of its own that this load balancer did not choose. No allocation
/// unless the answer sets a cookie.
fn drop_placements(h: &mut HeaderMap) {
    let ours = |v: &HeaderValue| v.as_bytes().trim_ascii_start().starts_with(b"lb_");
    if !h.get_all(header::SET_COOKIE).iter().any(ours) {
        return;
    }
    let kept: Vec<HeaderValue> = h.get_all(header::SET_COOKIE).iter().filter(|v| !ours(v)).cloned().collect();
    h.remove(header::SET_COOKIE);
    for v in kept {
        h.append(header::SET_COOKIE, v);
    }
}

/// The forwarded-style headers. From a trusted proxy, `X-Forwarded-For` is
/// appended to and the rest kept (a TLS terminator in front says the
/// scheme, host and port the visitor used). From anyone else they are not
/// believed: the visitor's address replaces `X-Forwarded-For` and
/// `X-Real-IP`, the scheme is `http`, and `Forwarded`, `X-Forwarded-Host`
/// and `X-Forwarded-Port` are removed.
fn forwarded(h: &mut HeaderMap, from: &Sender) {
    if from.trusted {
        let chain: Vec<&str> =
            h.get_all(&X_FORWARDED_FOR).iter().filter_map(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty()).collect();
        let xff = if chain.is_empty() {
            from.address.clone()
        } else {
            let joined = format!("{}, {}", chain.join(", "), from.address.to_str().unwrap_or("unknown"));
            HeaderValue::from_str(&joined).unwrap_or_else(|_| from.address.clone())
        };
        h.insert(X_FORWARDED_FOR, xff);
        if !h.contains_key(&X_REAL_IP) {
            h.insert(X_REAL_IP, from.address.clone());
        }
        if !h.contains_key(&X_FORWARDED_PROTO) {
            h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        }
        return;
    }
    h.insert(X_FORWARDED_FOR, from.address.clone());
    h.insert(X_REAL_IP, from.address.clone());
    h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    if h.keys().any(|k| NOT_BELIEVED.contains(k)) {
        for name in NOT_BELIEVED {
            h.remove(name);
        }
    }
}

/// True for a browser loading a page (a navigation), as opposed to the
/// requests an open page makes itself. Shiny's per-session URLs (downloads,
/// uploads under `session/<token>/`) belong to an open page even when the
/// browser fetches them as a navigation.
pub fn is_page_load(parts: &request::Parts) -> bool {
    let navigate = parts.headers.get("sec-fetch-mode").is_some_and(|v| v.as_bytes() == b"navigate");
    let document = parts.headers.get("sec-fetch-dest").is_none_or(|v| v.as_bytes() == b"document");
    parts.method == Method::GET && navigate && document && !parts.uri.path().contains("/session/")
}

/// Removes the headers that belong to one connection, not to the message
/// (RFC 9110 §7.6.1), keeping `Upgrade` for a protocol switch.
fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    // Most messages carry none: one look at the names is cheaper than a
    // hashed remove of each (bench/proxy.sh, README "Benchmark").
    let hop = |k: &HeaderName| k == header::CONNECTION || HOP_BY_HOP.contains(k) || (!keep_upgrade && k == header::UPGRADE);
    if !h.keys().any(hop) {
        return;
    }
    if h.contains_key(header::CONNECTION) {
        // Headers the sender named in Connection, on any of its lines, are
        // hop-by-hop too. Rare beyond the standard ones, so the allocation
        // is rare as well.
        let named: Vec<HeaderName> = h
            .get_all(header::CONNECTION)
            .iter()
            .flat_map(|v| v.to_str().unwrap_or("").split(','))
            .map(str::trim)
            .filter(|t| !t.eq_ignore_ascii_case("keep-alive") && !t.eq_ignore_ascii_case("close") && !t.eq_ignore_ascii_case("upgrade"))
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            if keep_upgrade && name == header::UPGRADE {
                continue;
            }
            h.remove(name);
        }
        h.remove(header::CONNECTION);
    }
    for name in HOP_BY_HOP {
        h.remove(name);
    }
    if !keep_upgrade {
        h.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_apps_own_sticky_cookies_are_dropped_and_ours_and_its_others_kept() {
        let mut parts = hyper::Response::builder()
            .header(header::SET_COOKIE, "session=1; Path=/")
            .header(header::SET_COOKIE, "lb_40101=1.abc; Path=/")
            .header(header::SET_COOKIE, " lb_40103=2.def")
            .header(header::SET_COOKIE, "theme=dark")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let place = HeaderValue::from_static("lb_40103=1.fff; Path=/; HttpOnly");
        for_visitor(&mut parts, false, Some(&place));
        let set: Vec<&str> = parts.headers.get_all(header::SET_COOKIE).iter().map(|v| v.to_str().unwrap()).collect();
        assert_eq!(set, ["session=1; Path=/", "theme=dark", "lb_40103=1.fff; Path=/; HttpOnly"]);
    }

    #[test]
    fn hop_by_hop_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, X-Private, Upgrade"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert(header::COOKIE, HeaderValue::from_static("a=1"));
        let mut ws = h.clone();
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::COOKIE));
        strip_hop_by_hop(&mut ws, true);
        assert_eq!(ws.len(), 2);
        assert!(ws.contains_key(header::UPGRADE));
    }

    #[test]
    fn every_connection_line_is_read() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        h.append(header::CONNECTION, HeaderValue::from_static("X-Second"));
        h.insert("x-second", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }

    fn spoofed() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(FORWARDED, HeaderValue::from_static("for=6.6.6.6;proto=https"));
        h.insert(X_REAL_IP, HeaderValue::from_static("6.6.6.6"));
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("6.6.6.6"));
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("7.7.7.7"));
        h.insert(X_FORWARDED_HOST, HeaderValue::from_static("evil.example"));
        h.insert(X_FORWARDED_PORT, HeaderValue::from_static("443"));
        h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        h
    }

    #[test]
    fn a_visitors_forwarded_headers_are_replaced_or_removed() {
        let mut h = spoofed();
        let address = HeaderValue::from_static("198.51.100.4");
        forwarded(&mut h, &Sender { address: &address, trusted: false });
        assert_eq!(h.get_all(&X_FORWARDED_FOR).iter().collect::<Vec<_>>(), vec!["198.51.100.4"]);
        assert_eq!(h[&X_REAL_IP], "198.51.100.4");
        assert_eq!(h[&X_FORWARDED_PROTO], "http");
        for gone in [FORWARDED, X_FORWARDED_HOST, X_FORWARDED_PORT] {
            assert!(!h.contains_key(&gone), "{gone} reached the copy");
        }
    }

    #[test]
    fn header_names_with_an_underscore_are_dropped() {
        let mut h = spoofed();
        h.insert("x_forwarded_for", HeaderValue::from_static("6.6.6.6"));
        h.insert("x-real_ip", HeaderValue::from_static("6.6.6.6"));
        let before = h.len();
        drop_underscored(&mut h);
        assert_eq!(h.len(), before - 2);
        assert!(h.keys().all(|n| !n.as_str().contains('_')), "{h:?}");
    }

    #[test]
    fn a_trusted_proxys_chain_is_appended_to_and_its_scheme_kept() {
        let mut h = spoofed();
        let address = HeaderValue::from_static("10.0.0.2");
        forwarded(&mut h, &Sender { address: &address, trusted: true });
        assert_eq!(h.get_all(&X_FORWARDED_FOR).iter().collect::<Vec<_>>(), vec!["6.6.6.6, 7.7.7.7, 10.0.0.2"]);
        assert_eq!(h[&X_FORWARDED_PROTO], "https");
        assert_eq!(h[&X_FORWARDED_HOST], "evil.example");
        let mut bare = HeaderMap::new();
        forwarded(&mut bare, &Sender { address: &address, trusted: true });
        assert_eq!(bare[&X_FORWARDED_FOR], "10.0.0.2");
        assert_eq!(bare[&X_REAL_IP], "10.0.0.2");
        assert_eq!(bare[&X_FORWARDED_PROTO], "http");
    }
}
