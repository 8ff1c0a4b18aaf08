//! The host's network interfaces, as plain data.
//!
//! [`choose`](crate::choose) works on a slice of [`Interface`] so tests can describe any
//! host; [`read_interfaces`] fills it from the real machine.

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
        let up_mask = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
        // Every entry of one interface carries the same flags; or-ing them keeps the
        // answer right even if a platform leaves them out on some entries.
        iface.up |= flags & up_mask == up_mask;
        iface.loopback |= flags & libc::IFF_LOOPBACK as u32 != 0;
        if let Some(addr) = entry.addr {
            if !iface.addrs.contains(&addr) {
                iface.addrs.push(addr);
            }
        }
    }
    Ok(out)
}

/// The one place this crate talks to the C library.
#[allow(unsafe_code)]
mod sys {
    use super::InterfaceAddr;
    use std::ffi::CStr;
    use std::io;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    pub(super) struct Entry {
        pub(super) name: String,
        pub(super) flags: u32,
        pub(super) addr: Option<InterfaceAddr>,
    }

    /// Copies the list `getifaddrs(3)` returns into owned values and frees it.
    pub(super) fn getifaddrs() -> io::Result<Vec<Entry>> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: `head` is a valid place for the call to store the list pointer.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut cur = head;
        while !cur.is_null() {
            // SAFETY: `cur` is a non-null node of the list getifaddrs returned, which
            // stays valid until freeifaddrs below.
            let ifa = unsafe { &*cur };
            cur = ifa.ifa_next;
            if ifa.ifa_name.is_null() {
                continue;
            }
            // SAFETY: ifa_name is a non-null, NUL-terminated string owned by the list.
            let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: both pointers are null or point to sockaddrs owned by the list.
            let ip = unsafe { ip_of(ifa.ifa_addr) };
            let addr = ip.map(|ip| InterfaceAddr {
                ip,
                // SAFETY: as above.
                prefix: unsafe { ip_of(ifa.ifa_netmask) }.map_or(full(ip), prefix_len),
            });
            out.push(Entry {
                name,
                flags: ifa.ifa_flags as u32,
                addr,
            });
        }
        // SAFETY: `head` came from a successful getifaddrs and is freed exactly once;
        // nothing borrowed from it outlives this point (everything above was copied).
        unsafe { libc::freeifaddrs(head) };
        Ok(out)
    }

    /// The IP in `sa`, if it is an IPv4 or IPv6 socket address.
    ///
    /// # Safety
    /// `sa` is null or points to a socket address whose length matches its family.
    unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
        if sa.is_null() {
            return None;
        }
        // SAFETY: the caller promises `sa` points to a sockaddr; sa_family is its first
        // field in every variant.
        match i32::from(unsafe { (*sa).sa_family }) {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in; read_unaligned because the
                // list gives no alignment promise for the wider type.
                let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(
                    sin.sin_addr.s_addr,
                ))))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6; as above.
                let sin6 = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in6>()) };
                Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
            }
            _ => None,
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
    /// checks the FFI copy (names, flags, netmask to prefix) against it.
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
