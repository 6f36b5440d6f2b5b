//! Which addresses an `http` action may reach without
//! HTTP_ACTION_ALLOW_PRIVATE.
//!
//! Rules are edited through the API, so a rule author could otherwise point
//! an action at the scheduler's own host, a cloud metadata endpoint
//! (169.254.169.254) or the internal network (server-side request forgery).
//! The ranges are spelled out here rather than taken from `std`'s helpers,
//! several of which are still unstable or narrower than needed.
//!
//! The lists follow IANA's IPv4 and IPv6 Special-Purpose Address Registries:
//! every block that registry does not mark globally reachable is refused.
//! IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
//! NAT64's `64:ff9b::a.b.c.d`, 6to4's `2002:AABB:CCDD::`) are judged by the
//! IPv4 address they reach, so `[::ffff:127.0.0.1]` is loopback while a
//! DNS64 answer for a public IPv4-only host still works. Outside `2000::/3`
//! (the only IPv6 space allocated for global unicast) everything not named
//! is refused as reserved, so a block IANA adds there later is refused
//! until someone looks at it.

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
    /// fc00::/7 (RFC 4193), the deprecated site-local fec0::/10, and the
    /// local-use translation prefix 64:ff9b:1::/48 (RFC 8215)
    UniqueLocal,
    /// 169.254/16, fe80::/10 — includes cloud metadata services
    LinkLocal,
    /// 0.0.0.0/8 ("this network", which Linux routes to the local host), ::
    Unspecified,
    /// 224.0.0.0/4, ff00::/8
    Multicast,
    /// 255.255.255.255
    Broadcast,
    /// 192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32,
    /// 3fff::/20: examples in documents, never real hosts
    Documentation,
    /// 198.18.0.0/15, 2001:2::/48 (RFC 2544, RFC 5180)
    Benchmarking,
    /// 192.0.0.0/24 (IETF protocol assignments), 192.88.99.0/24 (the
    /// deprecated 6to4 relay anycast), 240.0.0.0/4; 2001::/23 apart from its
    /// globally reachable sub-blocks (Teredo included), the IPv4-compatible
    /// ::/96, the discard prefix 100::/64, and IPv6 outside 2000::/3
    Reserved,
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
            RestrictedClass::Documentation => "documentation",
            RestrictedClass::Benchmarking => "benchmarking",
            RestrictedClass::Reserved => "reserved (special-purpose)",
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
    use RestrictedClass::*;
    let [a, b, c, _] = ip.octets();
    let class = match (a, b, c) {
        (0, _, _) => Unspecified,
        (10, _, _) | (192, 168, _) | (172, 16..=31, _) => Private,
        (100, 64..=127, _) => SharedAddressSpace,
        (127, _, _) => Loopback,
        (169, 254, _) => LinkLocal,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Documentation,
        (198, 18..=19, _) => Benchmarking,
        // 192.0.0.9 and .10 (PCP and TURN anycast) are globally reachable,
        // but a webhook has no business with either; the whole /24 goes.
        (192, 0, 0) | (192, 88, 99) => Reserved,
        (224..=239, _, _) => Multicast,
        _ if ip == Ipv4Addr::BROADCAST => Broadcast,
        (240..=255, _, _) => Reserved,
        _ => return None,
    };
    Some(class)
}

/// The IPv4 address in the last 32 bits of `ip`.
fn low_v4(ip: Ipv6Addr) -> Ipv4Addr {
    let [.., a, b, c, d] = ip.octets();
    Ipv4Addr::new(a, b, c, d)
}

fn restricted_v6(ip: Ipv6Addr) -> Option<RestrictedClass> {
    use RestrictedClass::*;
    // ::ffff:a.b.c.d reaches the IPv4 host a.b.c.d, so it is judged as one;
    // otherwise ::ffff:127.0.0.1 would walk straight past the loopback rule.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return restricted_v4(v4);
    }
    let s = ip.segments();
    // NAT64 (RFC 6052): the gateway forwards to the embedded IPv4 address.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return restricted_v4(low_v4(ip));
    }
    // 6to4 (RFC 3056): 2002:AABB:CCDD::/48 is the site of IPv4 AA.BB.CC.DD.
    if s[0] == 0x2002 {
        let [_, _, a, b, c, d, ..] = ip.octets();
        return restricted_v4(Ipv4Addr::new(a, b, c, d));
    }
    let class = if ip.is_loopback() {
        Loopback
    } else if ip.is_unspecified() {
        Unspecified
    } else if s[0] & 0xfe00 == 0xfc00 || s[0] & 0xffc0 == 0xfec0 || s[..3] == [0x64, 0xff9b, 1] {
        UniqueLocal
    } else if s[0] & 0xffc0 == 0xfe80 {
        LinkLocal
    } else if s[0] & 0xff00 == 0xff00 {
        Multicast
    } else if s[..2] == [0x2001, 0xdb8] || (s[0] == 0x3fff && s[1] < 0x1000) {
        Documentation
    } else if s[..3] == [0x2001, 2, 0] {
        Benchmarking
    } else if s[0] == 0x2001 && s[1] < 0x200 && !globally_reachable_in_2001_23(ip) {
        Reserved
    } else if s[0] & 0xe000 != 0x2000 {
        // ::/96 (IPv4-compatible), 100::/64 (discard), 5f00::/16 (SRv6)
        // and unallocated space: nothing a webhook should reach.
        Reserved
    } else {
        return None;
    };
    Some(class)
}

/// The sub-blocks of 2001::/23 (IETF protocol assignments) that IANA marks
/// globally reachable: PCP, TURN and DNS-SD SRP anycast (2001:1::1–3),
/// AMT (2001:3::/32), AS112-v6 (2001:4:112::/48), ORCHIDv2 (2001:20::/28)
/// and drone remote ID tags (2001:30::/28).
fn globally_reachable_in_2001_23(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let anycast = s[..7] == [0x2001, 1, 0, 0, 0, 0, 0] && (1..=3).contains(&s[7]);
    anycast || s[1] == 3 || s[1..3] == [4, 0x112] || (0x20..=0x3f).contains(&s[1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use RestrictedClass::*;

    fn class(text: &str) -> Option<RestrictedClass> {
        restricted_class(text.parse().unwrap())
    }

    /// Every address in `inside` is of `expected`.
    fn all(expected: RestrictedClass, inside: &[&str]) {
        for address in inside {
            assert_eq!(class(address), Some(expected), "{address}");
        }
    }

    fn public(addresses: &[&str]) {
        for address in addresses {
            assert_eq!(class(address), None, "{address} should be allowed");
        }
    }

    #[test]
    fn ipv4_ranges() {
        all(Loopback, &["127.0.0.1", "127.255.255.254"]);
        all(
            Private,
            &[
                "10.0.0.1",
                "10.255.255.255",
                "172.16.0.1",
                "172.31.255.255",
                "192.168.1.1",
            ],
        );
        all(SharedAddressSpace, &["100.64.0.1", "100.127.255.255"]);
        all(LinkLocal, &["169.254.169.254", "169.254.0.0"]);
        all(Unspecified, &["0.0.0.0", "0.1.2.3", "0.255.255.255"]);
        all(Multicast, &["224.0.0.1", "239.255.255.255"]);
        all(Broadcast, &["255.255.255.255"]);
    }

    #[test]
    fn ipv4_special_purpose_ranges() {
        all(
            Reserved,
            &[
                "192.0.0.0",
                "192.0.0.8",
                "192.0.0.170",
                "192.0.0.255",
                "192.88.99.1",
                "240.0.0.0",
                "250.1.2.3",
                "255.255.255.254",
            ],
        );
        all(
            Documentation,
            &[
                "192.0.2.0",
                "192.0.2.255",
                "198.51.100.7",
                "203.0.113.0",
                "203.0.113.255",
            ],
        );
        all(
            Benchmarking,
            &[
                "198.18.0.0",
                "198.18.255.255",
                "198.19.0.1",
                "198.19.255.255",
            ],
        );
    }

    #[test]
    fn ipv4_neighbours_of_the_ranges_are_public() {
        public(&[
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
            "126.255.255.255",
            "1.0.0.0",
            "191.255.255.255",
            "192.0.1.0",
            "192.0.3.0",
            "192.88.98.255",
            "192.88.100.0",
            // AS112 and AMT: globally reachable in the registry.
            "192.31.196.1",
            "192.52.193.1",
            "192.175.48.1",
            "198.17.255.255",
            "198.20.0.0",
            "198.51.99.255",
            "198.51.101.0",
            "203.0.112.255",
            "203.0.114.0",
            "223.255.255.255",
        ]);
    }

    #[test]
    fn ipv6_ranges() {
        all(Loopback, &["::1"]);
        all(Unspecified, &["::"]);
        all(
            UniqueLocal,
            &[
                "fc00::1",
                "fd12:3456:789a::1",
                "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                "fec0::1",
                "64:ff9b:1::1",
                "64:ff9b:1:ffff::a00:1",
            ],
        );
        all(LinkLocal, &["fe80::1", "febf:ffff::1"]);
        all(Multicast, &["ff02::1", "ff0e::1", "ffff::1"]);
        public(&[
            "2001:4860:4860::8888",
            "2606:4700::1111",
            "2a00:1450:4001::1",
            "3ffe::1",
        ]);
        // Between the named ranges, outside 2000::/3: nothing allocated.
        all(Reserved, &["fbff::1", "fe00::1", "4000::1", "1fff::1"]);
    }

    #[test]
    fn ipv6_special_purpose_ranges() {
        all(
            Documentation,
            &[
                "2001:db8::1",
                "2001:db8:ffff:ffff::1",
                "3fff::1",
                "3fff:fff:ffff::1",
            ],
        );
        public(&["2001:db7:ffff::1", "2001:db9::1", "3fff:1000::1"]);
        all(Benchmarking, &["2001:2::1", "2001:2:0:ffff::1"]);
        all(
            Reserved,
            &[
                // Teredo, 2001::/32
                "2001::1",
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                // the rest of 2001::/23
                "2001:1::4",
                "2001:2:1::1",
                "2001:4::1",
                "2001:10::1",
                "2001:1ff:ffff::1",
                // discard-only, SRv6 SIDs, IPv4-compatible, IPv4-translated
                "100::1",
                "100::ffff:ffff:ffff:ffff",
                "5f00::1",
                "::2",
                "::8.8.8.8",
                "::ffff:0:808:808",
            ],
        );
        // The sub-blocks of 2001::/23 IANA marks globally reachable.
        public(&[
            "2001:1::1",
            "2001:1::2",
            "2001:1::3",
            "2001:3::1",
            "2001:4:112::1",
            "2001:20::1",
            "2001:3f::1",
            "2001:200::1",
        ]);
    }

    #[test]
    fn ipv4_compatible_ipv6_is_refused() {
        // [::127.0.0.1] in a URL: the deprecated IPv4-compatible form.
        assert_eq!(class("::127.0.0.1"), Some(Reserved));
        assert_eq!(class("::10.0.0.1"), Some(Reserved));
        assert_eq!(class("::169.254.169.254"), Some(Reserved));
    }

    #[test]
    fn ipv4_mapped_ipv6_is_judged_as_ipv4() {
        assert_eq!(class("::ffff:127.0.0.1"), Some(Loopback));
        assert_eq!(class("::ffff:10.1.2.3"), Some(Private));
        assert_eq!(class("::ffff:169.254.169.254"), Some(LinkLocal));
        assert_eq!(class("::ffff:100.64.0.1"), Some(SharedAddressSpace));
        assert_eq!(class("::ffff:198.18.0.1"), Some(Benchmarking));
        assert_eq!(class("::ffff:0.0.0.0"), Some(Unspecified));
        assert_eq!(class("::ffff:255.255.255.255"), Some(Broadcast));
        assert_eq!(class("::ffff:8.8.8.8"), None);
    }

    #[test]
    fn nat64_is_judged_by_the_ipv4_address_it_reaches() {
        assert_eq!(class("64:ff9b::127.0.0.1"), Some(Loopback));
        assert_eq!(class("64:ff9b::7f00:1"), Some(Loopback));
        assert_eq!(class("64:ff9b::10.0.0.1"), Some(Private));
        assert_eq!(class("64:ff9b::169.254.169.254"), Some(LinkLocal));
        assert_eq!(class("64:ff9b::192.0.2.1"), Some(Documentation));
        assert_eq!(class("64:ff9b::0.0.0.0"), Some(Unspecified));
        // A DNS64 answer for a public IPv4-only host stays reachable.
        assert_eq!(class("64:ff9b::8.8.8.8"), None);
        // Not the well-known /96: unallocated ::/8 space.
        assert_eq!(class("64:ff9b:0:1::808:808"), Some(Reserved));
    }

    #[test]
    fn six_to_four_is_judged_by_its_embedded_ipv4_address() {
        assert_eq!(class("2002:7f00:1::1"), Some(Loopback));
        assert_eq!(class("2002:a00:1::"), Some(Private));
        assert_eq!(class("2002:c0a8:101::1"), Some(Private));
        assert_eq!(class("2002:a9fe:a9fe::1"), Some(LinkLocal));
        assert_eq!(class("2002:6440:1::1"), Some(SharedAddressSpace));
        assert_eq!(class("2002::1"), Some(Unspecified));
        assert_eq!(class("2002:e000:1::1"), Some(Multicast));
        assert_eq!(class("2002:808:808::1"), None);
    }
}
