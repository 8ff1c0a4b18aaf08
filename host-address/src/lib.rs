//! Host addresses for xce: workers choose and report them, the controller checks them.
//!
//! - Worker: [`AddressProvider`] (a [`plugin_api::HostFactsProvider`] named `address`)
//!   reads the interfaces on every `collect`, runs [`choose()`] under [`AddressConfig`],
//!   and fills in `ip_addr` and `addresses`.
//! - Controller: [`AddressPolicy`] (a [`plugin_api::HostFactsPolicy`]) refuses reports
//!   with addresses no other host could reach, under [`PolicyConfig`].
//!
//! IPv6 in `addr:port` text is always `[addr]:port`; [`host_port`] writes it.
#![warn(missing_docs, unreachable_pub)]

mod choose;
mod config;
mod interfaces;
mod kind;
mod policy;
mod provider;

pub use choose::{choose, Choice, ChooseError, SkipReason, Skipped};
pub use config::{AddressConfig, Advertise, Cidr, CidrError, ConfigError, Family};
pub use interfaces::{read_interfaces, Interface, InterfaceAddr};
pub use kind::AddressKind;
pub use policy::{AddressPolicy, PolicyConfig, MAX_ADDRESSES};
pub use provider::AddressProvider;

use std::net::{IpAddr, SocketAddr};

/// `ip:port`, with IPv6 in brackets: `10.0.0.5:8080`, `[fd00::5]:8080`.
///
/// The same text as `SocketAddr::new(ip, port).to_string()` (no zone is ever written,
/// since a `SocketAddr` built from an `IpAddr` has none); this function names the intent.
pub fn host_port(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(input: &str, expect: Expect) {
        let out: Vec<String> = input
            .split_whitespace()
            .map(|ip| host_port(ip.parse().unwrap(), 8080))
            .collect();
        expect.assert_eq(&out.join(" "));
    }

    #[test]
    fn brackets_ipv6() {
        check(
            "127.0.0.11 ::1 fd00::5 ::ffff:10.0.0.1",
            expect!["127.0.0.11:8080 [::1]:8080 [fd00::5]:8080 [::ffff:10.0.0.1]:8080"],
        );
    }
}
