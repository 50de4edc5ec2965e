//! Address classes: which resolved addresses are refused unless a CIDR rule allows them.
//!
//! A public name that resolves to a private, loopback, link-local or cloud-metadata address is
//! how SSRF and DNS-rebinding attacks reach the inside; `classify` names every such class so the
//! decision and the log can say which one was hit.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The class of an address, as far as egress is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddrClass {
    /// A routable public address.
    Public,
    /// A cloud instance-metadata endpoint (169.254.169.254, 100.100.100.200, 168.63.129.16,
    /// fd00:ec2::254): the most valuable SSRF target, named on its own.
    Metadata,
    /// 127.0.0.0/8 and ::1.
    Loopback,
    /// RFC 1918: 10/8, 172.16/12, 192.168/16.
    Private,
    /// Carrier-grade NAT, 100.64.0.0/10.
    Cgnat,
    /// 169.254.0.0/16 and fe80::/10.
    LinkLocal,
    /// fc00::/7.
    UniqueLocal,
    /// 224.0.0.0/4 and ff00::/8.
    Multicast,
    /// 0.0.0.0 and ::.
    Unspecified,
    /// 255.255.255.255.
    Broadcast,
    /// 0.0.0.0/8 ("this network").
    ThisNetwork,
    /// IPv6 forms that carry an IPv4 address (mapped, compatible, 6to4, NAT64, Teredo), which
    /// could smuggle any IPv4 class past an IPv6-only check.
    EmbedsIpv4,
    /// Reserved, documentation and benchmarking ranges (240/4, 192.0.0/24, 192.0.2/24,
    /// 198.18/15, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 100::/64).
    Reserved,
}

// === impl AddrClass ===

impl AddrClass {
    /// Whether addresses of this class may be dialled without a CIDR allow rule.
    pub fn is_public(self) -> bool {
        self == Self::Public
    }

    /// A stable name for logs, metrics and `policy explain`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Metadata => "metadata",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::Cgnat => "cgnat",
            Self::LinkLocal => "link_local",
            Self::UniqueLocal => "unique_local",
            Self::Multicast => "multicast",
            Self::Unspecified => "unspecified",
            Self::Broadcast => "broadcast",
            Self::ThisNetwork => "this_network",
            Self::EmbedsIpv4 => "embeds_ipv4",
            Self::Reserved => "reserved",
        }
    }
}

/// Classifies an address. Pure and allocation-free; called once per resolved address.
pub fn classify(ip: IpAddr) -> AddrClass {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

const fn in_v4(ip: u32, net: [u8; 4], prefix: u32) -> bool {
    let net = u32::from_be_bytes(net);
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    ip & mask == net
}

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let n = u32::from(ip);
    if matches!(ip.octets(), [169, 254, 169, 254] | [100, 100, 100, 200] | [168, 63, 129, 16]) {
        AddrClass::Metadata
    } else if n == 0 {
        AddrClass::Unspecified
    } else if n == u32::MAX {
        AddrClass::Broadcast
    } else if in_v4(n, [0, 0, 0, 0], 8) {
        AddrClass::ThisNetwork
    } else if in_v4(n, [127, 0, 0, 0], 8) {
        AddrClass::Loopback
    } else if in_v4(n, [10, 0, 0, 0], 8) || in_v4(n, [172, 16, 0, 0], 12) || in_v4(n, [192, 168, 0, 0], 16) {
        AddrClass::Private
    } else if in_v4(n, [100, 64, 0, 0], 10) {
        AddrClass::Cgnat
    } else if in_v4(n, [169, 254, 0, 0], 16) {
        AddrClass::LinkLocal
    } else if in_v4(n, [224, 0, 0, 0], 4) {
        AddrClass::Multicast
    } else if in_v4(n, [240, 0, 0, 0], 4)
        || in_v4(n, [192, 0, 0, 0], 24)
        || in_v4(n, [192, 0, 2, 0], 24)
        || in_v4(n, [198, 18, 0, 0], 15)
        || in_v4(n, [198, 51, 100, 0], 24)
        || in_v4(n, [203, 0, 113, 0], 24)
    {
        AddrClass::Reserved
    } else {
        AddrClass::Public
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    let s = ip.segments();
    let n = u128::from(ip);
    let in_v6 = |net: u128, prefix: u32| n & (u128::MAX << (128 - prefix)) == net;
    if ip == Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x254) {
        AddrClass::Metadata
    } else if ip.is_unspecified() {
        AddrClass::Unspecified
    } else if ip.is_loopback() {
        AddrClass::Loopback
    } else if s[0] & 0xfe00 == 0xfc00 {
        AddrClass::UniqueLocal
    } else if s[0] & 0xffc0 == 0xfe80 {
        AddrClass::LinkLocal
    } else if s[0] & 0xff00 == 0xff00 {
        AddrClass::Multicast
    } else if in_v6(0xffff_0000_0000, 96)      // ::ffff:0:0/96 mapped
        || in_v6(0, 96)                         // ::/96 compatible (deprecated)
        || s[0] == 0x2002                       // 2002::/16 6to4
        || in_v6(0x0064_ff9b << 96, 96)         // 64:ff9b::/96 NAT64
        || in_v6(0x0064_ff9b_0001 << 80, 48)    // 64:ff9b:1::/48 local NAT64
        || (s[0] == 0x2001 && s[1] == 0)
    // 2001::/32 Teredo
    {
        AddrClass::EmbedsIpv4
    } else if (s[0] == 0x2001 && s[1] == 0x0db8) || in_v6(0x0100 << 112, 64) {
        AddrClass::Reserved
    } else {
        AddrClass::Public
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn classes_by_example() {
        let cases = [
            ("aws metadata", "169.254.169.254", AddrClass::Metadata),
            ("alibaba metadata", "100.100.100.200", AddrClass::Metadata),
            ("azure wireserver", "168.63.129.16", AddrClass::Metadata),
            ("aws ipv6 metadata", "fd00:ec2::254", AddrClass::Metadata),
            ("loopback", "127.0.0.1", AddrClass::Loopback),
            ("loopback high", "127.255.0.9", AddrClass::Loopback),
            ("ipv6 loopback", "::1", AddrClass::Loopback),
            ("rfc1918 10", "10.1.2.3", AddrClass::Private),
            ("rfc1918 172", "172.31.255.255", AddrClass::Private),
            ("not rfc1918 172.32", "172.32.0.1", AddrClass::Public),
            ("rfc1918 192.168", "192.168.0.1", AddrClass::Private),
            ("cgnat", "100.64.0.1", AddrClass::Cgnat),
            ("cgnat top", "100.127.255.254", AddrClass::Cgnat),
            ("link local", "169.254.1.1", AddrClass::LinkLocal),
            ("ipv6 link local", "fe80::1", AddrClass::LinkLocal),
            ("unique local", "fd12::1", AddrClass::UniqueLocal),
            ("multicast", "239.1.1.1", AddrClass::Multicast),
            ("ipv6 multicast", "ff02::1", AddrClass::Multicast),
            ("unspecified", "0.0.0.0", AddrClass::Unspecified),
            ("ipv6 unspecified", "::", AddrClass::Unspecified),
            ("broadcast", "255.255.255.255", AddrClass::Broadcast),
            ("this network", "0.1.2.3", AddrClass::ThisNetwork),
            ("mapped", "::ffff:127.0.0.1", AddrClass::EmbedsIpv4),
            ("mapped public", "::ffff:8.8.8.8", AddrClass::EmbedsIpv4),
            ("6to4", "2002:7f00:1::", AddrClass::EmbedsIpv4),
            ("nat64", "64:ff9b::a9fe:a9fe", AddrClass::EmbedsIpv4),
            ("teredo", "2001:0:4136:e378::1", AddrClass::EmbedsIpv4),
            ("documentation", "192.0.2.1", AddrClass::Reserved),
            ("class e", "240.0.0.1", AddrClass::Reserved),
            ("public v4", "140.82.112.3", AddrClass::Public),
            ("public v6", "2606:4700::1111", AddrClass::Public),
        ];
        for (case, ip, want) in cases {
            assert_eq!(classify(ip.parse().unwrap()), want, "{case}");
        }
    }

    proptest! {
        #[test]
        fn every_rfc1918_address_is_private(a in any::<u32>()) {
            let ip = Ipv4Addr::from(u32::from_be_bytes([10, 0, 0, 0]) | (a >> 8));
            prop_assert_eq!(classify(IpAddr::V4(ip)), AddrClass::Private);
        }

        #[test]
        fn every_mapped_address_embeds_ipv4(a in any::<u32>()) {
            let ip = Ipv4Addr::from(a).to_ipv6_mapped();
            prop_assert_eq!(classify(IpAddr::V6(ip)), AddrClass::EmbedsIpv4);
        }

        #[test]
        fn every_loopback_is_loopback(a in any::<u32>()) {
            let ip = Ipv4Addr::from(0x7f00_0000 | (a >> 8));
            prop_assert_eq!(classify(IpAddr::V4(ip)), AddrClass::Loopback);
        }

        #[test]
        fn public_agrees_with_std_for_non_special(a in any::<u32>()) {
            let ip = Ipv4Addr::from(a);
            // Whatever std calls private, loopback, link-local or multicast is never public here.
            if ip.is_private() || ip.is_loopback() || ip.is_link_local() || ip.is_multicast() || ip.is_broadcast() {
                prop_assert!(!classify(IpAddr::V4(ip)).is_public());
            }
        }
    }
}
