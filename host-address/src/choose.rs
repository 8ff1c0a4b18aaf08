//! Choosing the advertised address and the reported list: a pure function over a list of
//! interfaces and the settings.

use crate::config::{AddressConfig, Advertise, Cidr, ConfigError, Family};
use crate::interfaces::Interface;
use crate::kind::AddressKind;
use plugin_api::{HostAddress, HostFacts};
use std::fmt;
use std::net::IpAddr;

/// What a host reports: its advertised address and every usable address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The advertised address (`ip_addr`, `XCE_HOST_IP`).
    pub ip_addr: IpAddr,
    /// All usable addresses, the advertised one first, then the others in interface order.
    pub addresses: Vec<HostAddress>,
}

impl Choice {
    /// Writes this choice into the host's facts (`ip_addr` and `addresses`, replaced whole).
    pub fn apply(self, facts: &mut HostFacts) {
        facts.ip_addr = Some(self.ip_addr);
        facts.addresses = self.addresses;
    }
}

/// An address that was left out, and why; listed in errors so the user sees what the
/// host has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The interface it is on.
    pub interface: String,
    /// The address.
    pub ip: IpAddr,
    /// Why it was left out.
    pub reason: SkipReason,
}

/// Why an address was left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// Its interface is down or not running.
    InterfaceDown,
    /// Its kind is not usable (or, for loopback, not allowed).
    Kind(AddressKind),
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason {
            SkipReason::InterfaceDown => {
                write!(f, "{} {} (interface down)", self.interface, self.ip)
            }
            SkipReason::Kind(kind) => write!(f, "{} {} ({kind})", self.interface, self.ip),
        }
    }
}

/// Why no address could be chosen. Every message says what to configure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChooseError {
    /// The settings are invalid whatever the interfaces.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No `advertise` and no interface has a usable address.
    #[error(
        "no usable address on this host ({}); set advertise to one of this host's IPs, an \
         interface name or a CIDR{}",
        list_skipped(.skipped), loopback_hint(.skipped)
    )]
    NoUsableAddress {
        /// Everything that was left out.
        skipped: Vec<Skipped>,
    },
    /// `advertise` names an interface this host does not have.
    #[error("advertise: no interface named {name} on this host (interfaces: {})", .available.join(", "))]
    NoSuchInterface {
        /// The configured name.
        name: String,
        /// The names this host has.
        available: Vec<String>,
    },
    /// `advertise` names an interface that is down.
    #[error("advertise: interface {name} is down")]
    InterfaceDown {
        /// The configured name.
        name: String,
    },
    /// `advertise` names an interface without a usable address.
    #[error(
        "advertise: interface {name} has no usable address ({}){}",
        list_or(.skipped, "it has no address"), loopback_hint(.skipped)
    )]
    NoUsableOnInterface {
        /// The configured name.
        name: String,
        /// Its addresses that were left out.
        skipped: Vec<Skipped>,
    },
    /// `advertise` is a CIDR no usable address is in.
    #[error(
        "advertise: no usable address of this host is in {cidr} (usable: {}; skipped in \
         {cidr}: {}){}",
        list_addrs(.usable), list_or(.skipped, "none"), loopback_hint(.skipped)
    )]
    NoneInCidr {
        /// The configured network.
        cidr: Cidr,
        /// The usable addresses (all outside it).
        usable: Vec<HostAddress>,
        /// The addresses inside it that were left out.
        skipped: Vec<Skipped>,
    },
    /// `advertise` is an IP this host does not have.
    #[error(
        "advertise: {ip} is not an address of this host (its addresses: {}); set advertise \
         to one of them, an interface name or a CIDR",
        list_addrs(.local)
    )]
    NotLocal {
        /// The configured address.
        ip: IpAddr,
        /// Every address of every interface.
        local: Vec<HostAddress>,
    },
    /// `advertise` is an IP on an interface that is down.
    #[error("advertise: {ip} is on interface {interface}, which is down")]
    AdvertiseDown {
        /// The configured address.
        ip: IpAddr,
        /// Its interface.
        interface: String,
    },
}

fn list_skipped(skipped: &[Skipped]) -> String {
    if skipped.is_empty() {
        return "no interface has an address".to_owned();
    }
    skipped
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn list_or(skipped: &[Skipped], empty: &str) -> String {
    if skipped.is_empty() {
        return empty.to_owned();
    }
    list_skipped(skipped)
}

fn list_addrs(addrs: &[HostAddress]) -> String {
    if addrs.is_empty() {
        return "none".to_owned();
    }
    addrs
        .iter()
        .map(|a| match &a.interface {
            Some(i) => format!("{i} {}", a.ip),
            None => a.ip.to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn loopback_hint(skipped: &[Skipped]) -> &'static str {
    let loopback = skipped
        .iter()
        .any(|s| s.reason == SkipReason::Kind(AddressKind::Loopback));
    if loopback {
        "; set allow_loopback = true to use loopback (single-machine setups only)"
    } else {
        ""
    }
}

/// A usable address and what ranks it.
struct Candidate<'a> {
    iface: &'a Interface,
    ip: IpAddr,
}

impl Candidate<'_> {
    fn host_address(&self) -> HostAddress {
        HostAddress {
            ip: self.ip,
            interface: Some(self.iface.name.clone()),
        }
    }
}

/// Every address of the host, sorted into usable and left out (in interface order).
struct Sorted<'a> {
    usable: Vec<Candidate<'a>>,
    skipped: Vec<Skipped>,
}

impl<'a> Sorted<'a> {
    fn new(interfaces: &'a [Interface], allow_loopback: bool) -> Self {
        let mut usable = Vec::new();
        let mut skipped = Vec::new();
        for iface in interfaces {
            for addr in &iface.addrs {
                match skip_reason(iface, addr.ip, allow_loopback) {
                    None => usable.push(Candidate { iface, ip: addr.ip }),
                    Some(reason) => skipped.push(Skipped {
                        interface: iface.name.clone(),
                        ip: addr.ip,
                        reason,
                    }),
                }
            }
        }
        Sorted { usable, skipped }
    }

    /// The best usable address that `pick` accepts, ranked by: not loopback, not on a
    /// loopback interface (a VIP on `lo`), of the `prefer`red family, interface order.
    fn best(&self, prefer: Family, pick: impl Fn(&Candidate<'_>) -> bool) -> Option<HostAddress> {
        self.usable
            .iter()
            .enumerate()
            .filter(|(_, c)| pick(c))
            .min_by_key(|(pos, c)| {
                (
                    AddressKind::of(c.ip) == AddressKind::Loopback,
                    c.iface.loopback,
                    Family::of(c.ip) != prefer,
                    *pos,
                )
            })
            .map(|(_, c)| c.host_address())
    }

    /// The addresses left out that `pick` accepts, for an error.
    fn skipped_where(&self, pick: impl Fn(&Skipped) -> bool) -> Vec<Skipped> {
        self.skipped.iter().filter(|s| pick(s)).cloned().collect()
    }

    /// The choice of `advertised`: it first, then the other usable addresses.
    fn choice(&self, advertised: HostAddress) -> Choice {
        let mut addresses = vec![advertised.clone()];
        addresses.extend(
            self.usable
                .iter()
                .map(Candidate::host_address)
                .filter(|a| *a != advertised),
        );
        Choice {
            ip_addr: advertised.ip,
            addresses,
        }
    }
}

/// Why the address `ip` of `iface` is not usable, if it is not.
fn skip_reason(iface: &Interface, ip: IpAddr, allow_loopback: bool) -> Option<SkipReason> {
    if !iface.up {
        return Some(SkipReason::InterfaceDown);
    }
    match AddressKind::of(ip) {
        AddressKind::Routable => None,
        AddressKind::Loopback if allow_loopback => None,
        kind => Some(SkipReason::Kind(kind)),
    }
}

/// Chooses the advertised address and the reported list from `interfaces` (in the
/// kernel's order) under `config`.
///
/// Usable: on an up interface; not unspecified, multicast, broadcast or link-local; not
/// loopback unless `allow_loopback`. Without `advertise`, the first usable address wins,
/// ranked by: not loopback, not on a loopback interface (a VIP on `lo`), of the preferred
/// family, interface order. `advertise` narrows the choice to one IP, one interface or one
/// network. A configured loopback IP need not be listed on an interface (Linux routes all
/// of `127.0.0.0/8` to `lo`); any other configured IP must be.
pub fn choose(interfaces: &[Interface], config: &AddressConfig) -> Result<Choice, ChooseError> {
    config.validate()?;
    let sorted = Sorted::new(interfaces, config.allow_loopback);
    let advertised =
        match &config.advertise {
            None => sorted.best(config.prefer, |_| true).ok_or_else(|| {
                ChooseError::NoUsableAddress {
                    skipped: sorted.skipped.clone(),
                }
            })?,
            Some(Advertise::Interface(name)) => on_interface(interfaces, name, &sorted, config)?,
            Some(Advertise::Cidr(cidr)) => sorted
                .best(config.prefer, |c| cidr.contains(c.ip))
                .ok_or_else(|| ChooseError::NoneInCidr {
                    cidr: *cidr,
                    usable: sorted.usable.iter().map(Candidate::host_address).collect(),
                    skipped: sorted.skipped_where(|s| cidr.contains(s.ip)),
                })?,
            Some(Advertise::Ip(ip)) => locate(interfaces, *ip)?,
        };
    Ok(sorted.choice(advertised))
}

/// The best usable address of the interface `advertise` names.
fn on_interface(
    interfaces: &[Interface],
    name: &str,
    sorted: &Sorted<'_>,
    config: &AddressConfig,
) -> Result<HostAddress, ChooseError> {
    let Some(iface) = interfaces.iter().find(|i| i.name == name) else {
        return Err(ChooseError::NoSuchInterface {
            name: name.to_owned(),
            available: interfaces.iter().map(|i| i.name.clone()).collect(),
        });
    };
    if !iface.up {
        return Err(ChooseError::InterfaceDown {
            name: name.to_owned(),
        });
    }
    sorted
        .best(config.prefer, |c| c.iface.name == name)
        .ok_or_else(|| ChooseError::NoUsableOnInterface {
            name: name.to_owned(),
            skipped: sorted.skipped_where(|s| s.interface == name),
        })
}

/// Finds the interface of a configured IP (already validated by [`AddressConfig::validate`]).
fn locate(interfaces: &[Interface], ip: IpAddr) -> Result<HostAddress, ChooseError> {
    let loopback = AddressKind::of(ip) == AddressKind::Loopback;
    let holder = interfaces
        .iter()
        .find(|i| i.addrs.iter().any(|a| a.ip == ip))
        .or_else(|| {
            // 127.0.0.11 is not listed anywhere but lives on the loopback interface that
            // holds 127.0.0.1/8.
            interfaces.iter().find(|i| {
                loopback
                    && i.loopback
                    && i.addrs
                        .iter()
                        .any(|a| Cidr::try_new(a.ip, a.prefix).is_ok_and(|n| n.contains(ip)))
            })
        });
    match holder {
        Some(i) if !i.up => Err(ChooseError::AdvertiseDown {
            ip,
            interface: i.name.clone(),
        }),
        Some(i) => Ok(HostAddress {
            ip,
            interface: Some(i.name.clone()),
        }),
        None if loopback => Ok(HostAddress {
            ip,
            interface: None,
        }),
        None => Err(ChooseError::NotLocal {
            ip,
            local: interfaces
                .iter()
                .flat_map(|i| {
                    i.addrs.iter().map(|a| HostAddress {
                        ip: a.ip,
                        interface: Some(i.name.clone()),
                    })
                })
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interfaces::InterfaceAddr;
    use expect_test::{expect, Expect};

    /// `interfaces`: one line per interface, `name up|down [loopback] ip/prefix...`;
    /// `config`: the `[address]` table as TOML.
    fn check(interfaces: &str, config: &str, expect: Expect) {
        let interfaces: Vec<Interface> = interfaces
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|line| {
                let mut words = line.split_whitespace();
                let mut iface = Interface {
                    name: words.next().unwrap().to_owned(),
                    up: false,
                    loopback: false,
                    addrs: Vec::new(),
                };
                for w in words {
                    match w {
                        "up" => iface.up = true,
                        "down" => iface.up = false,
                        "loopback" => iface.loopback = true,
                        _ => {
                            let (ip, prefix) = w.split_once('/').unwrap();
                            iface.addrs.push(InterfaceAddr {
                                ip: ip.parse().unwrap(),
                                prefix: prefix.parse().unwrap(),
                            });
                        }
                    }
                }
                iface
            })
            .collect();
        let config: AddressConfig = toml::from_str(config).unwrap();
        let out = match choose(&interfaces, &config) {
            Ok(choice) => {
                let mut out = format!("ip_addr {}", choice.ip_addr);
                for a in &choice.addresses {
                    let iface = a.interface.as_deref().unwrap_or("-");
                    out.push_str(&format!("\n  {iface} {}", a.ip));
                }
                out
            }
            Err(e) => format!("error: {e}"),
        };
        expect.assert_eq(&out);
    }

    const LO: &str = "lo up loopback 127.0.0.1/8 ::1/128";

    #[test]
    fn ipv4_only() {
        check(
            &format!("{LO}\neth0 up 10.0.0.5/24"),
            "",
            expect![[r#"
            ip_addr 10.0.0.5
              eth0 10.0.0.5"#]],
        );
    }

    #[test]
    fn ipv6_only() {
        // Link-local is skipped; the preference for IPv4 is only a preference.
        check(
            &format!("{LO}\neth0 up fe80::5/64 2001:db8::5/64 fd00::5/64"),
            "",
            expect![[r#"
                ip_addr 2001:db8::5
                  eth0 2001:db8::5
                  eth0 fd00::5"#]],
        );
    }

    #[test]
    fn both_families() {
        let ifaces = format!("{LO}\neth0 up 2001:db8::5/64 10.0.0.5/24\neth1 up 192.168.1.5/24");
        check(
            &ifaces,
            "",
            expect![[r#"
            ip_addr 10.0.0.5
              eth0 10.0.0.5
              eth0 2001:db8::5
              eth1 192.168.1.5"#]],
        );
        check(
            &ifaces,
            r#"prefer = "ipv6""#,
            expect![[r#"
            ip_addr 2001:db8::5
              eth0 2001:db8::5
              eth0 10.0.0.5
              eth1 192.168.1.5"#]],
        );
    }

    #[test]
    fn loopback_only() {
        check(LO, "", expect!["error: no usable address on this host (lo 127.0.0.1 (loopback), lo ::1 (loopback)); set advertise to one of this host's IPs, an interface name or a CIDR; set allow_loopback = true to use loopback (single-machine setups only)"]);
        check(
            LO,
            "allow_loopback = true",
            expect![[r#"
            ip_addr 127.0.0.1
              lo 127.0.0.1
              lo ::1"#]],
        );
        check(
            LO,
            "allow_loopback = true\nprefer = \"ipv6\"",
            expect![[r#"
            ip_addr ::1
              lo ::1
              lo 127.0.0.1"#]],
        );
    }

    #[test]
    fn allowed_loopback_is_last_resort() {
        check(
            &format!("{LO}\neth0 up 10.0.0.5/24"),
            "allow_loopback = true",
            expect![[r#"
                ip_addr 10.0.0.5
                  eth0 10.0.0.5
                  lo 127.0.0.1
                  lo ::1"#]],
        );
    }

    #[test]
    fn vip_on_loopback_interface_not_preferred() {
        check(
            "lo up loopback 127.0.0.1/8 10.1.1.1/32\neth0 up 10.0.0.5/24",
            "",
            expect![[r#"
                ip_addr 10.0.0.5
                  eth0 10.0.0.5
                  lo 10.1.1.1"#]],
        );
    }

    #[test]
    fn down_and_unusable_skipped() {
        check(
            &format!(
                "{LO}\ndocker0 down 172.17.0.1/16\nweird up 0.0.0.0/0 224.0.0.1/4 \
                 255.255.255.255/32 169.254.7.7/16\neth0 up 10.0.0.5/24"
            ),
            "",
            expect![[r#"
                ip_addr 10.0.0.5
                  eth0 10.0.0.5"#]],
        );
    }

    #[test]
    fn nothing_usable() {
        check(
            &format!("{LO}\neth0 up fe80::5/64 169.254.7.7/16\neth1 down 10.0.0.5/24"),
            "",
            expect!["error: no usable address on this host (lo 127.0.0.1 (loopback), lo ::1 (loopback), eth0 fe80::5 (link-local), eth0 169.254.7.7 (link-local), eth1 10.0.0.5 (interface down)); set advertise to one of this host's IPs, an interface name or a CIDR; set allow_loopback = true to use loopback (single-machine setups only)"],
        );
        check("eth0 up", "", expect!["error: no usable address on this host (no interface has an address); set advertise to one of this host's IPs, an interface name or a CIDR"]);
        check("", "", expect!["error: no usable address on this host (no interface has an address); set advertise to one of this host's IPs, an interface name or a CIDR"]);
    }

    #[test]
    fn cidr() {
        let ifaces =
            format!("{LO}\neth0 up 10.0.0.5/24 fd00::5/64\neth1 up 192.168.1.5/24 fd01::5/64");
        check(
            &ifaces,
            r#"advertise = "192.168.0.0/16""#,
            expect![[r#"
            ip_addr 192.168.1.5
              eth1 192.168.1.5
              eth0 10.0.0.5
              eth0 fd00::5
              eth1 fd01::5"#]],
        );
        check(
            &ifaces,
            r#"advertise = "fd01::/16""#,
            expect![[r#"
            ip_addr fd01::5
              eth1 fd01::5
              eth0 10.0.0.5
              eth0 fd00::5
              eth1 192.168.1.5"#]],
        );
        check(&ifaces, r#"advertise = "172.16.0.0/12""#, expect!["error: advertise: no usable address of this host is in 172.16.0.0/12 (usable: eth0 10.0.0.5, eth0 fd00::5, eth1 192.168.1.5, eth1 fd01::5; skipped in 172.16.0.0/12: none)"]);
        check(&ifaces, r#"advertise = "127.0.0.0/8""#, expect!["error: advertise: no usable address of this host is in 127.0.0.0/8 (usable: eth0 10.0.0.5, eth0 fd00::5, eth1 192.168.1.5, eth1 fd01::5; skipped in 127.0.0.0/8: lo 127.0.0.1 (loopback)); set allow_loopback = true to use loopback (single-machine setups only)"]);
        check(
            &ifaces,
            "advertise = \"127.0.0.0/8\"\nallow_loopback = true",
            expect![[r#"
                ip_addr 127.0.0.1
                  lo 127.0.0.1
                  lo ::1
                  eth0 10.0.0.5
                  eth0 fd00::5
                  eth1 192.168.1.5
                  eth1 fd01::5"#]],
        );
    }

    #[test]
    fn interface_name() {
        let ifaces = format!(
            "{LO}\neth0 up 10.0.0.5/24\neth1 up fd01::5/64 192.168.1.5/24\neth2 down 10.2.0.5/24\neth3 up fe80::3/64"
        );
        check(
            "eth0 up",
            r#"advertise = "eth0""#,
            expect!["error: advertise: interface eth0 has no usable address (it has no address)"],
        );
        check(
            &ifaces,
            r#"advertise = "eth1""#,
            expect![[r#"
            ip_addr 192.168.1.5
              eth1 192.168.1.5
              eth0 10.0.0.5
              eth1 fd01::5"#]],
        );
        check(
            &ifaces,
            "advertise = \"eth1\"\nprefer = \"ipv6\"",
            expect![[r#"
                ip_addr fd01::5
                  eth1 fd01::5
                  eth0 10.0.0.5
                  eth1 192.168.1.5"#]],
        );
        check(&ifaces, r#"advertise = "eth9""#, expect!["error: advertise: no interface named eth9 on this host (interfaces: lo, eth0, eth1, eth2, eth3)"]);
        check(
            &ifaces,
            r#"advertise = "eth2""#,
            expect!["error: advertise: interface eth2 is down"],
        );
        check(&ifaces, r#"advertise = "eth3""#, expect!["error: advertise: interface eth3 has no usable address (eth3 fe80::3 (link-local))"]);
        check(&ifaces, r#"advertise = "lo""#, expect!["error: advertise: interface lo has no usable address (lo 127.0.0.1 (loopback), lo ::1 (loopback)); set allow_loopback = true to use loopback (single-machine setups only)"]);
        check(
            &ifaces,
            "advertise = \"lo\"\nallow_loopback = true",
            expect![[r#"
                ip_addr 127.0.0.1
                  lo 127.0.0.1
                  lo ::1
                  eth0 10.0.0.5
                  eth1 fd01::5
                  eth1 192.168.1.5"#]],
        );
    }

    #[test]
    fn explicit_ip() {
        let ifaces = format!("{LO}\neth0 up 10.0.0.5/24 169.254.7.7/16\neth2 down 10.2.0.5/24");
        check(
            &ifaces,
            r#"advertise = "10.0.0.5""#,
            expect![[r#"
            ip_addr 10.0.0.5
              eth0 10.0.0.5"#]],
        );
        check(&ifaces, r#"advertise = "10.0.0.9""#, expect!["error: advertise: 10.0.0.9 is not an address of this host (its addresses: lo 127.0.0.1, lo ::1, eth0 10.0.0.5, eth0 169.254.7.7, eth2 10.2.0.5); set advertise to one of them, an interface name or a CIDR"]);
        check(
            &ifaces,
            r#"advertise = "10.2.0.5""#,
            expect!["error: advertise: 10.2.0.5 is on interface eth2, which is down"],
        );
        check(
            &ifaces,
            r#"advertise = "169.254.7.7""#,
            expect![[r#"
            ip_addr 169.254.7.7
              eth0 169.254.7.7
              eth0 10.0.0.5"#]],
        );
        check(&ifaces, r#"advertise = "127.0.0.11""#, expect!["error: advertise 127.0.0.11 is a loopback address, reachable from this machine only; set allow_loopback = true to advertise it (single-machine setups only)"]);
    }

    #[test]
    fn dev_mode_loopback_hosts() {
        // xced dev: every worker on its own 127.0.0.x, attributed to lo.
        let ifaces = format!("{LO}\neth0 up 10.0.0.5/24");
        check(
            &ifaces,
            "advertise = \"127.0.0.12\"\nallow_loopback = true",
            expect![[r#"
                ip_addr 127.0.0.12
                  lo 127.0.0.12
                  lo 127.0.0.1
                  lo ::1
                  eth0 10.0.0.5"#]],
        );
        check(
            &ifaces,
            "advertise = \"::1\"\nallow_loopback = true",
            expect![[r#"
                ip_addr ::1
                  lo ::1
                  lo 127.0.0.1
                  eth0 10.0.0.5"#]],
        );
        // Without a loopback interface holding 127.0.0.0/8 there is none to name.
        check(
            "eth0 up 10.0.0.5/24",
            "advertise = \"127.0.0.12\"\nallow_loopback = true",
            expect![[r#"
                ip_addr 127.0.0.12
                  - 127.0.0.12
                  eth0 10.0.0.5"#]],
        );
    }
}
