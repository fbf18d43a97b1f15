//! The header rules between a visitor and a copy: which headers belong to
//! one connection and are dropped on the way (RFC 9110 §7.6.1), what a copy
//! is told about the visitor (`X-Forwarded-For`, `X-Forwarded-Proto`), and
//! what a request's headers say about it (a page load).

use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::http::{request, response};
use hyper::{Method, Uri, Version};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// The request as a copy gets it: hop-by-hop headers out, the visitor's
/// address in (`xff`), origin-form, HTTP/1.1.
pub fn for_copy(parts: &mut request::Parts, xff: &HeaderValue, upgrade: bool) {
    let h = &mut parts.headers;
    strip_hop_by_hop(h, upgrade);
    if upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    // The visitor's address only: an incoming X-Forwarded-For is not trusted.
    h.insert(X_FORWARDED_FOR, xff.clone());
    h.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
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

/// The answer's head as the visitor gets it: hop-by-hop headers out
/// (keeping `Upgrade` when `switching`), HTTP/1.1, and `place` (the
/// `Set-Cookie` that places the visitor on the copy), when given.
pub fn for_visitor(parts: &mut response::Parts, switching: bool, place: Option<&HeaderValue>) {
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers, switching);
    if let Some(set_cookie) = place {
        parts.headers.append(header::SET_COOKIE, set_cookie.clone());
        // A shared cache must not hand one visitor's placement to everyone.
        if !switching && !parts.headers.contains_key(header::CACHE_CONTROL) {
            parts.headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("private"));
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
    if let Some(conn) = h.get(header::CONNECTION) {
        // Headers the sender named in Connection are hop-by-hop too. Rare
        // beyond the standard ones, so the allocation is rare as well.
        let named: Vec<HeaderName> = conn
            .to_str()
            .unwrap_or("")
            .split(',')
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
    h.remove(KEEP_ALIVE);
    h.remove(PROXY_CONNECTION);
    h.remove(header::TE);
    h.remove(header::TRAILER);
    h.remove(header::TRANSFER_ENCODING);
    if !keep_upgrade {
        h.remove(header::UPGRADE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
