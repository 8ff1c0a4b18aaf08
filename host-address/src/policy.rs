//! The controller side: the check of a worker's reported addresses.

use crate::config::Cidr;
use crate::kind::AddressKind;
use plugin_api::{FieldError, HostFacts, HostFactsPolicy, HostId};
use std::net::IpAddr;

/// At most this many addresses per report; a host with more is misconfigured or hostile.
pub const MAX_ADDRESSES: usize = 256;

/// Which hosts may report loopback or link-local addresses.
///
/// ```toml
/// [address]
/// allow_loopback_hosts = ["*"]          # every host (xced dev: all workers on 127.0.0.x)
/// allow_link_local_hosts = ["exec-07"]  # only this host
/// ```
///
/// A list of host ids; `"*"` matches every host. Both default to empty: nobody.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Hosts that may report loopback addresses (`127.0.0.0/8`, `::1`).
    pub allow_loopback_hosts: Vec<HostId>,
    /// Hosts that may report link-local addresses (`169.254.0.0/16`, `fe80::/10`).
    pub allow_link_local_hosts: Vec<HostId>,
    /// When not empty: the networks a host's advertised address (`ip_addr`) must be in,
    /// e.g. `["10.0.0.0/8"]`; a compromised host cannot send its endpoints' traffic
    /// anywhere else.
    pub networks: Vec<Cidr>,
}

/// Refuses reports whose addresses no other host could reach, unless the host is
/// configured for them. Implements [`HostFactsPolicy`].
///
/// Refused: a missing `ip_addr`, an `ip_addr` not among `addresses`, unspecified,
/// multicast and broadcast addresses, loopback and link-local addresses of hosts not
/// allowed them, duplicate entries, empty or overlong interface names, more than
/// [`MAX_ADDRESSES`] addresses. That the worker reports for its own host is the caller's
/// check (it authenticates the worker before calling).
#[derive(Debug, Clone)]
pub struct AddressPolicy {
    config: PolicyConfig,
}

impl AddressPolicy {
    /// Builds the policy.
    pub fn new(config: PolicyConfig) -> Self {
        Self { config }
    }

    /// Why `ip` may not be an address of `host`, if it may not.
    fn refusal(&self, host: &HostId, ip: IpAddr) -> Option<String> {
        let allowed = |list: &[HostId]| list.iter().any(|h| h == "*" || h == host);
        match AddressKind::of(ip) {
            kind if kind.is_never_usable() => {
                Some(format!("{kind} address {ip} cannot be a host's address"))
            }
            AddressKind::Loopback if !allowed(&self.config.allow_loopback_hosts) => Some(format!(
                "loopback address {ip} is not allowed for host {host} \
                 (controller setting allow_loopback_hosts)"
            )),
            AddressKind::LinkLocal if !allowed(&self.config.allow_link_local_hosts) => {
                Some(format!(
                    "link-local address {ip} is not allowed for host {host} \
                     (controller setting allow_link_local_hosts)"
                ))
            }
            _ => None,
        }
    }
}

impl HostFactsPolicy for AddressPolicy {
    fn check(&self, host: &HostId, facts: &HostFacts) -> Result<(), Vec<FieldError>> {
        let mut errors = Vec::new();
        if facts.addresses.len() > MAX_ADDRESSES {
            errors.push(FieldError::new(
                "addresses",
                format!(
                    "too many addresses: {}, at most {MAX_ADDRESSES}",
                    facts.addresses.len()
                ),
            ));
            return Err(errors);
        }
        match facts.ip_addr {
            None => errors.push(FieldError::new(
                "ip_addr",
                "missing: the worker reported no advertised address",
            )),
            Some(ip) => {
                if let Some(reason) = self.refusal(host, ip) {
                    errors.push(FieldError::new("ip_addr", reason));
                }
                let nets = &self.config.networks;
                if !nets.is_empty() && !nets.iter().any(|n| n.contains(ip)) {
                    let list: Vec<String> = nets.iter().map(Cidr::to_string).collect();
                    errors.push(FieldError::new(
                        "ip_addr",
                        format!(
                            "{ip} is outside the cluster's networks ({}; controller setting networks)",
                            list.join(", ")
                        ),
                    ));
                }
                if !facts.addresses.iter().any(|a| a.ip == ip) {
                    errors.push(FieldError::new(
                        "ip_addr",
                        format!("{ip} is not among the reported addresses"),
                    ));
                }
            }
        }
        for (i, a) in facts.addresses.iter().enumerate() {
            if let Some(reason) = self.refusal(host, a.ip) {
                errors.push(FieldError::new(format!("addresses[{i}].ip"), reason));
            }
            if let Some(name) = &a.interface {
                let bad = if name.is_empty() {
                    Some("empty interface name")
                } else if name.len() > 64 {
                    Some("interface name longer than 64 bytes")
                } else if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    Some("interface name contains whitespace or control characters")
                } else {
                    None
                };
                if let Some(reason) = bad {
                    errors.push(FieldError::new(format!("addresses[{i}].interface"), reason));
                }
            }
            if let Some(j) = facts.addresses[..i].iter().position(|b| b == a) {
                errors.push(FieldError::new(
                    format!("addresses[{i}]"),
                    format!("duplicate of addresses[{j}]"),
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    /// `config`: the controller's `[address]` table as TOML; `facts`: the report as JSON.
    fn check(config: &str, host: &str, facts: &str, expect: Expect) {
        let policy = AddressPolicy::new(toml::from_str(config).unwrap());
        let facts: HostFacts = serde_json::from_str(facts).unwrap();
        let out = match policy.check(&host.to_owned(), &facts) {
            Ok(()) => "accepted".to_owned(),
            Err(errors) => errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
        };
        expect.assert_eq(&out);
    }

    const ETH0: &str = r#"{"ip_addr":"10.0.0.5","addresses":[{"ip":"10.0.0.5","interface":"eth0"},{"ip":"2001:db8::5","interface":"eth0"}]}"#;
    const DEV: &str = r#"{"ip_addr":"127.0.0.11","addresses":[{"ip":"127.0.0.11","interface":"lo"},{"ip":"::1","interface":"lo"},{"ip":"10.0.0.5","interface":"eth0"}]}"#;
    const LINK_LOCAL: &str = r#"{"ip_addr":"169.254.7.7","addresses":[{"ip":"169.254.7.7","interface":"eth0"},{"ip":"fe80::7","interface":"eth0"}]}"#;

    #[test]
    fn accepts_routable() {
        check("", "exec-01", ETH0, expect!["accepted"]);
        // A configured address may come without an interface.
        check(
            "",
            "exec-01",
            r#"{"ip_addr":"fd00::5","addresses":[{"ip":"fd00::5"}]}"#,
            expect!["accepted"],
        );
    }

    #[test]
    fn loopback_per_host() {
        check(
            "",
            "exec-01",
            DEV,
            expect![[r#"
            ip_addr: loopback address 127.0.0.11 is not allowed for host exec-01 (controller setting allow_loopback_hosts)
            addresses[0].ip: loopback address 127.0.0.11 is not allowed for host exec-01 (controller setting allow_loopback_hosts)
            addresses[1].ip: loopback address ::1 is not allowed for host exec-01 (controller setting allow_loopback_hosts)"#]],
        );
        check(
            r#"allow_loopback_hosts = ["*"]"#,
            "exec-01",
            DEV,
            expect!["accepted"],
        );
        check(
            r#"allow_loopback_hosts = ["exec-01"]"#,
            "exec-01",
            DEV,
            expect!["accepted"],
        );
        check(
            r#"allow_loopback_hosts = ["exec-01"]"#,
            "exec-02",
            DEV,
            expect![[r#"
                ip_addr: loopback address 127.0.0.11 is not allowed for host exec-02 (controller setting allow_loopback_hosts)
                addresses[0].ip: loopback address 127.0.0.11 is not allowed for host exec-02 (controller setting allow_loopback_hosts)
                addresses[1].ip: loopback address ::1 is not allowed for host exec-02 (controller setting allow_loopback_hosts)"#]],
        );
        // Loopback carried in an IPv4-mapped IPv6 address is still loopback.
        check(
            "",
            "exec-01",
            r#"{"ip_addr":"::ffff:127.0.0.1","addresses":[{"ip":"::ffff:127.0.0.1"}]}"#,
            expect![[r#"
                ip_addr: loopback address ::ffff:127.0.0.1 is not allowed for host exec-01 (controller setting allow_loopback_hosts)
                addresses[0].ip: loopback address ::ffff:127.0.0.1 is not allowed for host exec-01 (controller setting allow_loopback_hosts)"#]],
        );
    }

    #[test]
    fn link_local_per_host() {
        check(
            "",
            "exec-07",
            LINK_LOCAL,
            expect![[r#"
            ip_addr: link-local address 169.254.7.7 is not allowed for host exec-07 (controller setting allow_link_local_hosts)
            addresses[0].ip: link-local address 169.254.7.7 is not allowed for host exec-07 (controller setting allow_link_local_hosts)
            addresses[1].ip: link-local address fe80::7 is not allowed for host exec-07 (controller setting allow_link_local_hosts)"#]],
        );
        check(
            r#"allow_link_local_hosts = ["exec-07"]"#,
            "exec-07",
            LINK_LOCAL,
            expect!["accepted"],
        );
        // Allowing loopback does not allow link-local.
        check(
            r#"allow_loopback_hosts = ["*"]"#,
            "exec-07",
            LINK_LOCAL,
            expect![[r#"
                ip_addr: link-local address 169.254.7.7 is not allowed for host exec-07 (controller setting allow_link_local_hosts)
                addresses[0].ip: link-local address 169.254.7.7 is not allowed for host exec-07 (controller setting allow_link_local_hosts)
                addresses[1].ip: link-local address fe80::7 is not allowed for host exec-07 (controller setting allow_link_local_hosts)"#]],
        );
    }

    #[test]
    fn never_usable() {
        check(
            r#"allow_loopback_hosts = ["*"]
               allow_link_local_hosts = ["*"]"#,
            "exec-01",
            r#"{"ip_addr":"0.0.0.0","addresses":[{"ip":"0.0.0.0"},{"ip":"::"},{"ip":"224.0.0.1"},{"ip":"ff02::1"},{"ip":"255.255.255.255"}]}"#,
            expect![[r#"
                ip_addr: unspecified address 0.0.0.0 cannot be a host's address
                addresses[0].ip: unspecified address 0.0.0.0 cannot be a host's address
                addresses[1].ip: unspecified address :: cannot be a host's address
                addresses[2].ip: multicast address 224.0.0.1 cannot be a host's address
                addresses[3].ip: multicast address ff02::1 cannot be a host's address
                addresses[4].ip: broadcast address 255.255.255.255 cannot be a host's address"#]],
        );
    }

    #[test]
    fn ip_addr_consistency() {
        check(
            "",
            "exec-01",
            r#"{"addresses":[{"ip":"10.0.0.5"}]}"#,
            expect!["ip_addr: missing: the worker reported no advertised address"],
        );
        check(
            "",
            "exec-01",
            r#"{"ip_addr":"10.0.0.5"}"#,
            expect!["ip_addr: 10.0.0.5 is not among the reported addresses"],
        );
        check(
            "",
            "exec-01",
            r#"{"ip_addr":"10.0.0.6","addresses":[{"ip":"10.0.0.5","interface":"eth0"}]}"#,
            expect!["ip_addr: 10.0.0.6 is not among the reported addresses"],
        );
    }

    #[test]
    fn malformed_entries() {
        check(
            "",
            "exec-01",
            r#"{"ip_addr":"10.0.0.5","addresses":[{"ip":"10.0.0.5","interface":"eth0"},{"ip":"10.0.0.5","interface":"eth0"},{"ip":"10.0.0.5","interface":"lo"},{"ip":"10.0.0.6","interface":""},{"ip":"10.0.0.7","interface":"eth 0"}]}"#,
            expect![[r#"
                addresses[1]: duplicate of addresses[0]
                addresses[3].interface: empty interface name
                addresses[4].interface: interface name contains whitespace or control characters"#]],
        );
        let many: Vec<String> = (0..=MAX_ADDRESSES)
            .map(|i| format!(r#"{{"ip":"10.0.{}.{}"}}"#, i / 250, i % 250 + 1))
            .collect();
        check(
            "",
            "exec-01",
            &format!(
                r#"{{"ip_addr":"10.0.0.1","addresses":[{}]}}"#,
                many.join(",")
            ),
            expect!["addresses: too many addresses: 257, at most 256"],
        );
    }

    #[test]
    fn networks_bound_the_advertised_address() {
        let nets = r#"networks = ["10.0.0.0/8", "fd00::/8"]"#;
        check(nets, "exec-01", ETH0, expect!["accepted"]);
        check(
            nets,
            "exec-01",
            r#"{"ip_addr":"8.8.8.8","addresses":[{"ip":"8.8.8.8","interface":"eth0"}]}"#,
            expect!["ip_addr: 8.8.8.8 is outside the cluster's networks (10.0.0.0/8, fd00::/8; controller setting networks)"],
        );
        let err = toml::from_str::<PolicyConfig>(r#"networks = ["10.0.0.0"]"#).unwrap_err();
        expect![[r#""10.0.0.0": a CIDR needs a /prefix, e.g. 10.0.0.0/8"#]]
            .assert_eq(err.message());
    }

    #[test]
    fn config_rejects_unknown_keys() {
        let err = toml::from_str::<PolicyConfig>("allow_loopback = true").unwrap_err();
        expect!["unknown field `allow_loopback`, expected one of `allow_loopback_hosts`, `allow_link_local_hosts`, `networks`"].assert_eq(err.message());
    }
}
