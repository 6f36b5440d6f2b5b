//! Which addresses an `http` action may reach without
//! HTTP_ACTION_ALLOW_PRIVATE.
//!
//! Rules are edited through the API, so a rule author could otherwise point
//! an action at the scheduler's own host, a cloud metadata endpoint
//! (169.254.169.254) or the internal network (server-side request forgery).
//! The ranges are spelled out here rather than taken from `std`'s helpers,
//! several of which are still unstable or narrower than needed.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not a public unicast target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestrictedClass {
    /// 127.0.0.0/8, ::1
    Loopback,
    /// 10/8, 172.16/12, 192.168/16 (RFC 1918)
    Private,
    /// 100.64.0.0/10 (RFC 6598 carrier-grade NAT)
    SharedAddressSpace,
    /// fc00::/7 (RFC 4193), and the deprecated site-local fec0::/10
    UniqueLocal,
    /// 169.254/16, fe80::/10 — includes cloud metadata services
    LinkLocal,
    /// 0.0.0.0/8 ("this network", which Linux routes to the local host), ::
    Unspecified,
    /// 224.0.0.0/4, ff00::/8
    Multicast,
    /// 255.255.255.255
    Broadcast,
}

impl RestrictedClass {
    pub fn as_str(self) -> &'static str {
        match self {
            RestrictedClass::Loopback => "loopback",
            RestrictedClass::Private => "private",
            RestrictedClass::SharedAddressSpace => "shared address space (CGNAT)",
            RestrictedClass::UniqueLocal => "unique local",
            RestrictedClass::LinkLocal => "link-local",
            RestrictedClass::Unspecified => "unspecified",
            RestrictedClass::Multicast => "multicast",
            RestrictedClass::Broadcast => "broadcast",
        }
    }
}

impl fmt::Display for RestrictedClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The class that makes `ip` off limits, or `None` for an ordinary address.
pub fn restricted_class(ip: IpAddr) -> Option<RestrictedClass> {
    match ip {
        IpAddr::V4(v4) => restricted_v4(v4),
        IpAddr::V6(v6) => restricted_v6(v6),
    }
}

fn restricted_v4(ip: Ipv4Addr) -> Option<RestrictedClass> {
    let [a, b, _, _] = ip.octets();
    let class = match (a, b) {
        (127, _) => RestrictedClass::Loopback,
        (10, _) | (192, 168) => RestrictedClass::Private,
        (172, 16..=31) => RestrictedClass::Private,
        (100, 64..=127) => RestrictedClass::SharedAddressSpace,
        (169, 254) => RestrictedClass::LinkLocal,
        (0, _) => RestrictedClass::Unspecified,
        (224..=239, _) => RestrictedClass::Multicast,
        _ if ip == Ipv4Addr::BROADCAST => RestrictedClass::Broadcast,
        _ => return None,
    };
    Some(class)
}

fn restricted_v6(ip: Ipv6Addr) -> Option<RestrictedClass> {
    // ::ffff:a.b.c.d reaches the IPv4 host a.b.c.d, so it is judged as one;
    // otherwise ::ffff:127.0.0.1 would walk straight past the loopback rule.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return restricted_v4(v4);
    }
    let first = ip.segments()[0];
    let class = if ip.is_loopback() {
        RestrictedClass::Loopback
    } else if ip.is_unspecified() {
        RestrictedClass::Unspecified
    } else if first & 0xfe00 == 0xfc00 || first & 0xffc0 == 0xfec0 {
        RestrictedClass::UniqueLocal
    } else if first & 0xffc0 == 0xfe80 {
        RestrictedClass::LinkLocal
    } else if first & 0xff00 == 0xff00 {
        RestrictedClass::Multicast
    } else {
        return None;
    };
    Some(class)
}

#[cfg(test)]
mod tests {
    use super::*;
    use RestrictedClass::*;

    fn class(text: &str) -> Option<RestrictedClass> {
        restricted_class(text.parse().unwrap())
    }

    #[test]
    fn ipv4_ranges() {
        assert_eq!(class("127.0.0.1"), Some(Loopback));
        assert_eq!(class("127.255.255.254"), Some(Loopback));
        assert_eq!(class("10.0.0.1"), Some(Private));
        assert_eq!(class("172.16.0.1"), Some(Private));
        assert_eq!(class("172.31.255.255"), Some(Private));
        assert_eq!(class("192.168.1.1"), Some(Private));
        assert_eq!(class("100.64.0.1"), Some(SharedAddressSpace));
        assert_eq!(class("100.127.255.255"), Some(SharedAddressSpace));
        assert_eq!(class("169.254.169.254"), Some(LinkLocal));
        assert_eq!(class("0.0.0.0"), Some(Unspecified));
        assert_eq!(class("0.1.2.3"), Some(Unspecified));
        assert_eq!(class("224.0.0.1"), Some(Multicast));
        assert_eq!(class("239.255.255.255"), Some(Multicast));
        assert_eq!(class("255.255.255.255"), Some(Broadcast));
    }

    #[test]
    fn ipv4_neighbours_of_the_ranges_are_public() {
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "9.255.255.255",
            "11.0.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.255.255",
            "192.169.0.0",
            "100.63.255.255",
            "100.128.0.0",
            "169.253.255.255",
            "169.255.0.0",
            "128.0.0.1",
            "223.255.255.255",
        ] {
            assert_eq!(class(public), None, "{public}");
        }
    }

    #[test]
    fn ipv6_ranges() {
        assert_eq!(class("::1"), Some(Loopback));
        assert_eq!(class("::"), Some(Unspecified));
        assert_eq!(class("fc00::1"), Some(UniqueLocal));
        assert_eq!(class("fd12:3456:789a::1"), Some(UniqueLocal));
        assert_eq!(class("fec0::1"), Some(UniqueLocal));
        assert_eq!(class("fe80::1"), Some(LinkLocal));
        assert_eq!(class("febf:ffff::1"), Some(LinkLocal));
        assert_eq!(class("ff02::1"), Some(Multicast));
        assert_eq!(class("2001:4860:4860::8888"), None);
        assert_eq!(class("2606:4700::1111"), None);
        assert_eq!(class("fbff::1"), None);
        assert_eq!(class("fe00::1"), None);
    }

    #[test]
    fn ipv4_mapped_ipv6_is_judged_as_ipv4() {
        assert_eq!(class("::ffff:127.0.0.1"), Some(Loopback));
        assert_eq!(class("::ffff:10.1.2.3"), Some(Private));
        assert_eq!(class("::ffff:169.254.169.254"), Some(LinkLocal));
        assert_eq!(class("::ffff:8.8.8.8"), None);
    }
}
