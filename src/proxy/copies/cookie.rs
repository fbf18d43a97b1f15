//! The sticky cookie `lb_<port>`: its value is `<copy>.<hex HMAC-SHA256 of
//! "<port>:<copy>">`, keyed with `proxy/cookie.key`, so a visitor can
//! neither forge a copy number nor carry a cookie from one app to another.
//!
//! The value only depends on the key, the port and the copy number, so the
//! table computes each copy's value once when it is pushed; a request then
//! only compares bytes (see [`same`]).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The cookie's name for an app's public port: `lb_8080`.
pub fn name(port: u16) -> String {
    format!("lb_{port}")
}

/// The signed value for `copy` of the app on `port`: `3.<64 hex digits>`.
pub fn sign(key: &[u8], port: u16, copy: u32) -> String {
    let mac = mac(key, port, copy);
    let mut out = String::with_capacity(11 + 1 + mac.len() * 2);
    out.push_str(&copy.to_string());
    out.push('.');
    for b in mac {
        out.push(char::from(HEX[(b >> 4) as usize]));
        out.push(char::from(HEX[(b & 0xf) as usize]));
    }
    out
}

/// The copy number a value names, when its MAC is right for `port`; `None`
/// for a forged, malformed or other app's value. The load balancer compares
/// with each copy's value computed once per table instead
/// (`LiveApp::sticky_copy` in table.rs); this is the same check written
/// out, for the tests.
#[cfg(test)]
pub fn verify(key: &[u8], port: u16, value: &str) -> Option<u32> {
    let copy = copy_of(value)?;
    same(value.as_bytes(), sign(key, port, copy).as_bytes()).then_some(copy)
}

/// The copy number a value claims, before any check: the digits before the
/// dot, without sign or leading zero so each copy has one spelling.
pub fn copy_of(value: &str) -> Option<u32> {
    let (digits, _) = value.split_once('.')?;
    if digits.is_empty() || digits.len() > 10 || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Compares two values in time that does not depend on where they differ,
/// so the MAC cannot be guessed byte by byte.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in one `Cookie` header (`a=1; lb_8080=3.ab…`).
/// Later duplicates lose: the first one is what a browser sends for the
/// most specific path.
pub fn find<'a>(header: &'a [u8], name: &str) -> Option<&'a str> {
    let name = name.as_bytes();
    for pair in header.split(|&b| b == b';') {
        let pair = trim(pair);
        if pair.len() > name.len() && pair.starts_with(name) && pair[name.len()] == b'=' {
            let value = trim(&pair[name.len() + 1..]);
            let value = value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value);
            return std::str::from_utf8(value).ok();
        }
    }
    None
}

/// The `Set-Cookie` header value that places a visitor on a copy.
pub fn set_cookie(name: &str, value: &str) -> String {
    format!("{name}={value}; Path=/; HttpOnly; SameSite=Lax")
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn mac(key: &[u8], port: u16, copy: u32) -> [u8; 32] {
    // HMAC accepts a key of any length, so this cannot fail.
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(format!("{port}:{copy}").as_bytes());
    m.finalize().into_bytes().into()
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    #[test]
    fn a_signed_value_verifies_and_names_its_copy() {
        let v = sign(&KEY, 8080, 3);
        assert!(v.starts_with("3."));
        assert_eq!(v.len(), 2 + 64);
        assert!(v[2..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(verify(&KEY, 8080, &v), Some(3));
        assert_eq!(verify(&KEY, 8080, &sign(&KEY, 8080, 4_000_000_000)), Some(4_000_000_000));
    }

    #[test]
    fn the_mac_is_hmac_sha256_of_port_and_copy() {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&KEY).unwrap();
        m.update(b"8080:3");
        let hex: String = m.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sign(&KEY, 8080, 3), format!("3.{hex}"));
    }

    #[test]
    fn a_forged_value_is_refused() {
        let v = sign(&KEY, 8080, 3);
        // Another copy number with the MAC of copy 3.
        assert_eq!(verify(&KEY, 8080, &v.replacen("3.", "4.", 1)), None);
        // One digit of the MAC changed.
        let mut bytes = v.clone().into_bytes();
        let last = bytes.len() - 1;
        bytes[last] = if bytes[last] == b'0' { b'1' } else { b'0' };
        assert_eq!(verify(&KEY, 8080, std::str::from_utf8(&bytes).unwrap()), None);
        // Another key.
        assert_eq!(verify(&[8; 32], 8080, &v), None);
    }

    #[test]
    fn a_value_for_another_port_is_refused() {
        let v = sign(&KEY, 8081, 3);
        assert_eq!(verify(&KEY, 8080, &v), None);
        assert_eq!(verify(&KEY, 8081, &v), Some(3));
    }

    #[test]
    fn malformed_values_are_refused() {
        let good = sign(&KEY, 8080, 3);
        let mac = &good[2..];
        for bad in [
            String::new(),
            "3".into(),
            "3.".into(),
            ".abc".into(),
            format!("03.{mac}"),
            format!("+3.{mac}"),
            format!("-3.{mac}"),
            format!("x.{mac}"),
            format!("99999999999.{mac}"),
            format!("3.{}", &mac[..63]),
            format!("3.{mac}0"),
            format!("3.{}", mac.to_uppercase()),
            format!(" 3.{mac}"),
        ] {
            assert_eq!(verify(&KEY, 8080, &bad), None, "{bad:?}");
        }
    }

    #[test]
    fn find_reads_one_cookie_out_of_a_header() {
        let h = b"a=1; lb_8080=3.abc;lb_80=9.x ; lb_8080x=5.y";
        assert_eq!(find(h, "lb_8080"), Some("3.abc"));
        assert_eq!(find(h, "lb_80"), Some("9.x"));
        assert_eq!(find(h, "lb_808"), None);
        assert_eq!(find(b"lb_8080=\"3.q\"", "lb_8080"), Some("3.q"));
        assert_eq!(find(b"lb_8080=", "lb_8080"), Some(""));
        assert_eq!(find(b"lb_8080", "lb_8080"), None);
        assert_eq!(find(b"", "lb_8080"), None);
        assert_eq!(find(b";;;", "lb_8080"), None);
        assert_eq!(find(b"lb_8080=\xff", "lb_8080"), None);
        assert_eq!(find(b"lb_8080=1.a; lb_8080=2.b", "lb_8080"), Some("1.a"));
    }

    #[test]
    fn set_cookie_has_the_documented_attributes() {
        assert_eq!(set_cookie("lb_8080", "3.ab"), "lb_8080=3.ab; Path=/; HttpOnly; SameSite=Lax");
        assert_eq!(name(8080), "lb_8080");
    }
}
