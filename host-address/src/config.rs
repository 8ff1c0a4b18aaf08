//! The worker's address settings: `[address]` in the worker config.

use crate::kind::AddressKind;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// How the worker chooses the address it advertises.
///
/// ```toml
/// [address]
/// advertise = "eth0"        # or "10.0.0.5", "::1", "10.0.0.0/8", "fd00::/8"; optional
/// prefer = "ipv4"           # or "ipv6"; used when several families are usable
/// allow_loopback = false    # true only for single-machine setups (xced dev)
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AddressConfig {
    /// What to advertise: an IP, an interface name or a CIDR to pick from. `None` reads all
    /// interfaces and takes the first usable address of the preferred family.
    pub advertise: Option<Advertise>,
    /// The family to pick when several are usable. A preference, not a requirement: a host
    /// with only IPv6 advertises IPv6 even with `prefer = "ipv4"`.
    pub prefer: Family,
    /// Whether loopback addresses may be reported and advertised. Needed for an explicit
    /// loopback `advertise` too, so a single-machine config copied to a real host fails
    /// loudly instead of advertising an address no other host can reach.
    pub allow_loopback: bool,
}

impl AddressConfig {
    /// Checks what can be checked without looking at the interfaces.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let Some(Advertise::Ip(ip)) = self.advertise else {
            return Ok(());
        };
        match AddressKind::of(ip) {
            kind if kind.is_never_usable() => Err(ConfigError::AdvertiseNeverUsable { ip, kind }),
            AddressKind::Loopback if !self.allow_loopback => {
                Err(ConfigError::AdvertiseLoopback { ip })
            }
            AddressKind::LinkLocal if ip.is_ipv6() => Err(ConfigError::AdvertiseLinkLocalV6 { ip }),
            _ => Ok(()),
        }
    }
}

/// An address family.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// IPv4 (the default preference).
    #[default]
    Ipv4,
    /// IPv6.
    Ipv6,
}

impl Family {
    /// The family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self::Ipv4,
            IpAddr::V6(_) => Self::Ipv6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ipv4 => "ipv4",
            Self::Ipv6 => "ipv6",
        })
    }
}

/// The parsed `advertise` setting. Written as one string in the config; which kind it is
/// follows from its form.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Advertise {
    /// Exactly this address.
    Ip(IpAddr),
    /// The best usable address of this interface.
    Interface(String),
    /// The best usable address inside this network.
    Cidr(Cidr),
}

impl FromStr for Advertise {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let invalid = |reason: &str| ConfigError::InvalidAdvertise {
            value: s.to_owned(),
            reason: reason.to_owned(),
        };
        if s.is_empty() {
            return Err(invalid("empty; give an IP, an interface name or a CIDR"));
        }
        if let Ok(ip) = s.parse::<IpAddr>() {
            return Ok(Self::Ip(ip));
        }
        if s.contains('/') {
            return s
                .parse::<Cidr>()
                .map(Self::Cidr)
                .map_err(|e| invalid(&e.to_string()));
        }
        // Interface names may contain dots and (for IPv4 aliases like `eth0:1`) one colon,
        // so only strings that can be nothing but a mistyped address are refused as such.
        if s.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(invalid("not a valid IPv4 address"));
        }
        if s.contains("::") || s.matches(':').count() > 1 {
            return Err(invalid("not a valid IPv6 address"));
        }
        // Linux IFNAMSIZ is 16 including the terminating NUL.
        if s.len() > 15 {
            return Err(invalid(
                "not an IP or CIDR, and too long for an interface name (at most 15 bytes)",
            ));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(invalid("an interface name cannot contain whitespace"));
        }
        Ok(Self::Interface(s.to_owned()))
    }
}

impl TryFrom<String> for Advertise {
    type Error = ConfigError;

    fn try_from(s: String) -> Result<Self, ConfigError> {
        s.parse()
    }
}

impl From<Advertise> for String {
    fn from(a: Advertise) -> String {
        a.to_string()
    }
}

impl fmt::Display for Advertise {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(ip) => ip.fmt(f),
            Self::Interface(name) => f.write_str(name),
            Self::Cidr(net) => net.fmt(f),
        }
    }
}

/// A network, e.g. `10.0.0.0/8` or `fd00::/8`. Host bits given in the text are cleared
/// (`10.1.2.3/8` is `10.0.0.0/8`), as `ip route` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Builds the network of `addr` with `prefix` bits (host bits cleared); refuses a
    /// prefix longer than the address.
    pub fn try_new(addr: IpAddr, prefix: u8) -> Result<Self, CidrError> {
        let max = match addr {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        if prefix > max {
            return Err(CidrError::Prefix);
        }
        Ok(Self {
            network: mask(addr, prefix),
            prefix,
        })
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` is inside this network. Families never mix.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == Family::of(self.network) && mask(ip, self.prefix) == self.network
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & m).into())
        }
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, CidrError> {
        let (addr, prefix) = s.split_once('/').ok_or(CidrError::NoPrefix)?;
        let addr: IpAddr = addr.parse().map_err(|_| CidrError::Address)?;
        let prefix: u8 = prefix.parse().map_err(|_| CidrError::Prefix)?;
        Self::try_new(addr, prefix)
    }
}

impl TryFrom<String> for Cidr {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse().map_err(|e: CidrError| format!("{s:?}: {e}"))
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// Why a string is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// No `/prefix` part.
    #[error("a CIDR needs a /prefix, e.g. 10.0.0.0/8")]
    NoPrefix,
    /// The part before `/` is not an IP.
    #[error("the network part of the CIDR is not an IP address")]
    Address,
    /// The prefix is not a number up to 32 (IPv4) or 128 (IPv6).
    #[error("the CIDR prefix must be a number up to 32 for IPv4 or 128 for IPv6")]
    Prefix,
}

/// A worker address setting that can never work, found before any interface is read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `advertise` is neither an IP, an interface name nor a CIDR.
    #[error("invalid advertise {value:?}: {reason}")]
    InvalidAdvertise {
        /// The setting as written.
        value: String,
        /// Why it is invalid.
        reason: String,
    },
    /// `advertise` is an unspecified, multicast or broadcast address.
    #[error("advertise {ip} cannot be a host's address ({kind})")]
    AdvertiseNeverUsable {
        /// The address.
        ip: IpAddr,
        /// Its kind.
        kind: AddressKind,
    },
    /// `advertise` is loopback but `allow_loopback` is off.
    #[error(
        "advertise {ip} is a loopback address, reachable from this machine only; \
         set allow_loopback = true to advertise it (single-machine setups only)"
    )]
    AdvertiseLoopback {
        /// The address.
        ip: IpAddr,
    },
    /// `advertise` is an IPv6 link-local address, which peers cannot use without a zone.
    #[error(
        "advertise {ip} is an IPv6 link-local address, which needs a zone and cannot be \
         written as [addr]:port; advertise a global or unique-local address instead"
    )]
    AdvertiseLinkLocalV6 {
        /// The address.
        ip: IpAddr,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// Parses `[address]` settings from TOML and validates them; shows the parsed form.
    fn check(input: &str, expect: Expect) {
        let out = match toml::from_str::<AddressConfig>(input) {
            Ok(cfg) => match cfg.validate() {
                Ok(()) => format!("{cfg:?}"),
                Err(e) => format!("error: {e}"),
            },
            Err(e) => format!("parse error: {}", e.message()),
        };
        expect.assert_eq(&out);
    }

    #[test]
    fn defaults() {
        check(
            "",
            expect![[r#"AddressConfig { advertise: None, prefer: Ipv4, allow_loopback: false }"#]],
        );
    }

    #[test]
    fn advertise_forms() {
        check(
            r#"advertise = "10.0.0.5""#,
            expect![[
                r#"AddressConfig { advertise: Some(Ip(10.0.0.5)), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
        check(
            r#"advertise = "::1"
               allow_loopback = true
               prefer = "ipv6""#,
            expect![[
                r#"AddressConfig { advertise: Some(Ip(::1)), prefer: Ipv6, allow_loopback: true }"#
            ]],
        );
        check(
            r#"advertise = "eth0""#,
            expect![[
                r#"AddressConfig { advertise: Some(Interface("eth0")), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
        check(
            r#"advertise = "eth0:1""#,
            expect![[
                r#"AddressConfig { advertise: Some(Interface("eth0:1")), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
        check(
            r#"advertise = "10.1.2.3/8""#,
            expect![[
                r#"AddressConfig { advertise: Some(Cidr(Cidr { network: 10.0.0.0, prefix: 8 })), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
        check(
            r#"advertise = "fd00::/8""#,
            expect![[
                r#"AddressConfig { advertise: Some(Cidr(Cidr { network: fd00::, prefix: 8 })), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
        check(
            r#"advertise = "0.0.0.0/0""#,
            expect![[
                r#"AddressConfig { advertise: Some(Cidr(Cidr { network: 0.0.0.0, prefix: 0 })), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
    }

    #[test]
    fn rejects() {
        check(
            r#"advertise = "10.0.0.300""#,
            expect![[r#"parse error: invalid advertise "10.0.0.300": not a valid IPv4 address"#]],
        );
        check(
            r#"advertise = "fd00::zz""#,
            expect![[r#"parse error: invalid advertise "fd00::zz": not a valid IPv6 address"#]],
        );
        check(
            r#"advertise = "10.0.0.0/33""#,
            expect![[
                r#"parse error: invalid advertise "10.0.0.0/33": the CIDR prefix must be a number up to 32 for IPv4 or 128 for IPv6"#
            ]],
        );
        check(
            r#"advertise = "eth0/8""#,
            expect![[
                r#"parse error: invalid advertise "eth0/8": the network part of the CIDR is not an IP address"#
            ]],
        );
        check(
            r#"advertise = """#,
            expect![[
                r#"parse error: invalid advertise "": empty; give an IP, an interface name or a CIDR"#
            ]],
        );
        check(
            r#"advertise = "a-very-long-interface""#,
            expect![[
                r#"parse error: invalid advertise "a-very-long-interface": not an IP or CIDR, and too long for an interface name (at most 15 bytes)"#
            ]],
        );
        check(
            r#"advertise = "eth 0""#,
            expect![[
                r#"parse error: invalid advertise "eth 0": an interface name cannot contain whitespace"#
            ]],
        );
        check(
            r#"prefer = "ipv5""#,
            expect![[r#"parse error: unknown variant `ipv5`, expected `ipv4` or `ipv6`"#]],
        );
        check(
            r#"advertize = "eth0""#,
            expect![[
                r#"parse error: unknown field `advertize`, expected one of `advertise`, `prefer`, `allow_loopback`"#
            ]],
        );
    }

    #[test]
    fn validation() {
        check(
            r#"advertise = "127.0.0.11""#,
            expect![[
                r#"error: advertise 127.0.0.11 is a loopback address, reachable from this machine only; set allow_loopback = true to advertise it (single-machine setups only)"#
            ]],
        );
        check(
            r#"advertise = "127.0.0.11"
               allow_loopback = true"#,
            expect![[
                r#"AddressConfig { advertise: Some(Ip(127.0.0.11)), prefer: Ipv4, allow_loopback: true }"#
            ]],
        );
        check(
            r#"advertise = "0.0.0.0""#,
            expect!["error: advertise 0.0.0.0 cannot be a host's address (unspecified)"],
        );
        check(
            r#"advertise = "ff02::1""#,
            expect!["error: advertise ff02::1 cannot be a host's address (multicast)"],
        );
        check(
            r#"advertise = "255.255.255.255""#,
            expect!["error: advertise 255.255.255.255 cannot be a host's address (broadcast)"],
        );
        check(
            r#"advertise = "fe80::1""#,
            expect![[
                r#"error: advertise fe80::1 is an IPv6 link-local address, which needs a zone and cannot be written as [addr]:port; advertise a global or unique-local address instead"#
            ]],
        );
        check(
            r#"advertise = "169.254.3.4""#,
            expect![[
                r#"AddressConfig { advertise: Some(Ip(169.254.3.4)), prefer: Ipv4, allow_loopback: false }"#
            ]],
        );
    }

    /// `cidr ip...` → which of the IPs it contains.
    fn check_contains(input: &str, expect: Expect) {
        let mut words = input.split_whitespace();
        let cidr: Cidr = words.next().unwrap().parse().unwrap();
        let inside: Vec<&str> = words
            .filter(|ip| cidr.contains(ip.parse().unwrap()))
            .collect();
        expect.assert_eq(&format!("{cidr}: {}", inside.join(" ")));
    }

    #[test]
    fn cidr_contains() {
        check_contains(
            "10.1.2.3/8 10.0.0.1 10.255.255.255 11.0.0.0 ::ffff:10.0.0.1",
            expect!["10.0.0.0/8: 10.0.0.1 10.255.255.255"],
        );
        check_contains(
            "0.0.0.0/0 1.2.3.4 255.255.255.255 ::1",
            expect!["0.0.0.0/0: 1.2.3.4 255.255.255.255"],
        );
        check_contains(
            "192.168.1.5/32 192.168.1.5 192.168.1.6",
            expect!["192.168.1.5/32: 192.168.1.5"],
        );
        check_contains(
            "fd00::/8 fd12::1 fe80::1 10.0.0.1",
            expect!["fd00::/8: fd12::1"],
        );
        check_contains(
            "::/0 ::1 2001:db8::1 127.0.0.1",
            expect!["::/0: ::1 2001:db8::1"],
        );
    }
}
