//! The host's network interfaces, as plain data.
//!
//! [`choose`](crate::choose()) works on a slice of [`Interface`] so tests can describe any
//! host; [`read_interfaces`] fills it from the real machine.

use nix::net::if_::InterfaceFlags;
use std::net::IpAddr;

/// One network interface and its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// The name, e.g. `eth0` (IPv4 alias labels like `eth0:1` are separate interfaces).
    pub name: String,
    /// Administratively up *and* operationally running (`IFF_UP | IFF_RUNNING`): a bridge
    /// with no carrier is up but not running, and nothing can reach an address on it.
    pub up: bool,
    /// A loopback interface (`IFF_LOOPBACK`).
    pub loopback: bool,
    /// Its addresses, in the kernel's order.
    pub addrs: Vec<InterfaceAddr>,
}

/// One address of an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The address.
    pub ip: IpAddr,
    /// The prefix length of its network (`8` for `127.0.0.1/8`).
    pub prefix: u8,
}

/// Reads the interfaces of this machine, in the kernel's order (by interface index on
/// Linux), each with all its IPv4 and IPv6 addresses.
pub fn read_interfaces() -> std::io::Result<Vec<Interface>> {
    let mut out: Vec<Interface> = Vec::new();
    for entry in sys::getifaddrs()? {
        let i = match out.iter().position(|i| i.name == entry.name) {
            Some(i) => i,
            None => {
                out.push(Interface {
                    name: entry.name.clone(),
                    up: false,
                    loopback: false,
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        let iface = &mut out[i];
        let flags = entry.flags;
        let up_mask = InterfaceFlags::IFF_UP | InterfaceFlags::IFF_RUNNING;
        // Every entry of one interface carries the same flags; or-ing them keeps the
        // answer right even if a platform leaves them out on some entries.
        iface.up |= flags.contains(up_mask);
        iface.loopback |= flags.contains(InterfaceFlags::IFF_LOOPBACK);
        if let Some(addr) = entry.addr {
            if !iface.addrs.contains(&addr) {
                iface.addrs.push(addr);
            }
        }
    }
    Ok(out)
}

/// The one place this crate asks the system: `getifaddrs(3)` through `nix`, which copies
/// the list into owned values and frees it.
mod sys {
    use super::InterfaceAddr;
    use nix::net::if_::InterfaceFlags;
    use std::io;
    use std::net::IpAddr;

    pub(super) struct Entry {
        pub(super) name: String,
        pub(super) flags: InterfaceFlags,
        pub(super) addr: Option<InterfaceAddr>,
    }

    pub(super) fn getifaddrs() -> io::Result<Vec<Entry>> {
        let list = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
        Ok(list
            .map(|ifa| {
                let ip = ifa.address.as_ref().and_then(ip_of);
                let addr = ip.map(|ip| InterfaceAddr {
                    ip,
                    prefix: ifa
                        .netmask
                        .as_ref()
                        .and_then(ip_of)
                        .map_or(full(ip), prefix_len),
                });
                Entry {
                    name: ifa.interface_name,
                    flags: ifa.flags,
                    addr,
                }
            })
            .collect())
    }

    /// The IP in `sa`, if it is an IPv4 or IPv6 socket address.
    fn ip_of(sa: &nix::sys::socket::SockaddrStorage) -> Option<IpAddr> {
        if let Some(sin) = sa.as_sockaddr_in() {
            Some(IpAddr::V4(sin.ip()))
        } else {
            sa.as_sockaddr_in6().map(|sin6| IpAddr::V6(sin6.ip()))
        }
    }

    fn full(ip: IpAddr) -> u8 {
        if ip.is_ipv4() {
            32
        } else {
            128
        }
    }

    fn prefix_len(mask: IpAddr) -> u8 {
        let ones = match mask {
            IpAddr::V4(m) => u32::from(m).leading_ones(),
            IpAddr::V6(m) => u128::from(m).leading_ones(),
        };
        ones as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every machine this runs on has an up loopback interface holding 127.0.0.1/8; this
    /// checks the copy (names, flags, netmask to prefix) against it.
    #[test]
    fn reads_loopback_of_this_machine() {
        let interfaces = read_interfaces().unwrap();
        let lo = interfaces
            .iter()
            .find(|i| i.loopback)
            .unwrap_or_else(|| panic!("no loopback interface in {interfaces:?}"));
        assert!(lo.up, "{lo:?}");
        let want = InterfaceAddr {
            ip: "127.0.0.1".parse().unwrap(),
            prefix: 8,
        };
        assert!(lo.addrs.contains(&want), "{lo:?}");
    }
}
