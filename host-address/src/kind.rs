//! What kind of address an IP is, as far as reaching it from another host goes.
//!
//! Shared by the worker's choice and the controller's check so both sides agree on what
//! "loopback" or "link-local" means.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};

/// The reachability class of an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressKind {
    /// `0.0.0.0` or `::`: "any address", never a place to connect to.
    Unspecified,
    /// `224.0.0.0/4` or `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `127.0.0.0/8` or `::1`: reachable from this host only.
    Loopback,
    /// `169.254.0.0/16` or `fe80::/10`: reachable on one link only (IPv6 needs a zone).
    LinkLocal,
    /// Anything else: private, global or unique-local addresses.
    Routable,
}

impl AddressKind {
    /// Classifies `ip`. IPv4-mapped IPv6 addresses (`::ffff:127.0.0.1`) are classified as
    /// the IPv4 address they carry, so they cannot smuggle a loopback address past a check.
    pub fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                if v4.is_unspecified() {
                    Self::Unspecified
                } else if v4.is_multicast() {
                    Self::Multicast
                } else if v4 == Ipv4Addr::BROADCAST {
                    Self::Broadcast
                } else if v4.is_loopback() {
                    Self::Loopback
                } else if v4.is_link_local() {
                    Self::LinkLocal
                } else {
                    Self::Routable
                }
            }
            IpAddr::V6(v6) => {
                if v6.is_unspecified() {
                    Self::Unspecified
                } else if v6.is_multicast() {
                    Self::Multicast
                } else if v6.is_loopback() {
                    Self::Loopback
                } else if v6.is_unicast_link_local() {
                    Self::LinkLocal
                } else {
                    Self::Routable
                }
            }
        }
    }

    /// Whether no configuration can make this address a host's address.
    pub fn is_never_usable(self) -> bool {
        matches!(self, Self::Unspecified | Self::Multicast | Self::Broadcast)
    }
}

impl fmt::Display for AddressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unspecified => "unspecified",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Loopback => "loopback",
            Self::LinkLocal => "link-local",
            Self::Routable => "routable",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(input: &str, expect: Expect) {
        let out: Vec<String> = input
            .split_whitespace()
            .map(|s| format!("{s} {}", AddressKind::of(s.parse().unwrap())))
            .collect();
        expect.assert_eq(&out.join("\n"));
    }

    #[test]
    fn classifies() {
        check(
            "0.0.0.0 :: 224.0.0.1 ff02::1 255.255.255.255 127.0.0.11 ::1 ::ffff:127.0.0.1 \
             169.254.1.1 fe80::1 10.0.0.1 192.168.1.5 fd00::1 2001:db8::1 ::ffff:10.0.0.1",
            expect![[r#"
                0.0.0.0 unspecified
                :: unspecified
                224.0.0.1 multicast
                ff02::1 multicast
                255.255.255.255 broadcast
                127.0.0.11 loopback
                ::1 loopback
                ::ffff:127.0.0.1 loopback
                169.254.1.1 link-local
                fe80::1 link-local
                10.0.0.1 routable
                192.168.1.5 routable
                fd00::1 routable
                2001:db8::1 routable
                ::ffff:10.0.0.1 routable"#]],
        );
    }
}
