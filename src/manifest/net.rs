//! Addresses and address ranges (CIDR blocks), as `trusted-proxies` names
//! them and the load balancer matches visitors against them.

use std::fmt;
use std::net::IpAddr;

/// One address (`192.0.2.7`) or range (`10.0.0.0/8`, `2001:db8::/32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    /// The range's first address (host bits cleared).
    addr: IpAddr,
    /// How many leading bits must match: 32 (IPv4) or 128 (IPv6) for one
    /// address.
    prefix: u8,
}

impl Cidr {
    /// Reads `a.b.c.d`, `a.b.c.d/n`, an IPv6 address or `addr/n`; host bits
    /// past the prefix are cleared (`10.1.2.3/8` is `10.0.0.0/8`).
    pub fn parse(s: &str) -> Option<Cidr> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (a, Some(p.parse::<u8>().ok()?)),
            Some(_) => return None,
            None => (s, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return None;
        }
        Some(Cidr { addr: mask(addr, prefix), prefix })
    }

    /// True when `ip` is in the range (an IPv4 address written as IPv6,
    /// `::ffff:a.b.c.d`, counts as the IPv4 one).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix) == self.addr
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let max = if self.addr.is_ipv4() { 32 } else { 128 };
        if self.prefix == max {
            write!(f, "{}", self.addr)
        } else {
            write!(f, "{}/{}", self.addr, self.prefix)
        }
    }
}

/// Written as it prints (`10.0.0.0/8`, one address without a prefix), the
/// form registry.json and the copies table have always held.
impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
        let s = String::deserialize(d)?;
        Cidr::parse(&s).ok_or_else(|| serde::de::Error::custom(format!("{s:?} is not an IP address or CIDR range")))
    }
}

/// `ip` with every bit past the first `prefix` cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(prefix)) };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(prefix)) };
            IpAddr::V6((bits & m).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_ranges_match_what_they_name() {
        let one = Cidr::parse("192.0.2.7").unwrap();
        assert!(one.contains(ip("192.0.2.7")));
        assert!(one.contains(ip("::ffff:192.0.2.7")), "a dual-stack socket's form of the same address");
        assert!(!one.contains(ip("192.0.2.8")));
        let range = Cidr::parse("10.1.2.3/8").unwrap();
        assert_eq!(range.to_string(), "10.0.0.0/8");
        assert!(range.contains(ip("10.200.0.1")) && !range.contains(ip("11.0.0.1")));
        let v6 = Cidr::parse("[2001:db8::]/32").unwrap();
        assert!(v6.contains(ip("2001:db8:1::5")) && !v6.contains(ip("2001:db9::1")) && !v6.contains(ip("10.0.0.1")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("203.0.113.9")));
    }

    #[test]
    fn what_is_not_an_address_or_range_is_refused() {
        for bad in ["", "localhost", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "300.1.1.1", "::/129", "10.0.0.0/8/8"] {
            assert_eq!(Cidr::parse(bad), None, "{bad:?}");
        }
    }
}
