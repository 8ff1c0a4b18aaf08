//! The REST answers this client reads (docs/api.md): `xce-wire`'s types, the ones the
//! server writes them with, lenient: unknown fields are ignored so a newer server does not
//! break an older client, and most fields have defaults for an older one.
//!
//! Endpoint entries are checked once after parsing ([`check`]), because the
//! `plain` and `env` outputs end up in shell `eval`s and config files: past the check an
//! address and a port name are known to need no quoting.

use crate::error::{CliError, ErrorKind};
use port_resource::name::PortName;

/// `GET /v1/services/{name}/endpoints`: `xce-wire`'s type, which the endpoint table writes
/// its answers with. Addresses are `IpAddr`, so parsing already proves they need no
/// quoting.
pub(crate) use xce_wire::endpoints::EndpointAnswer as Endpoint;
pub(crate) use xce_wire::endpoints::EndpointsAnswer as EndpointEntry;

/// The other answers: `xce-wire`'s types, which the server writes them with (owned here).
pub(crate) use xce_wire::services::RolloutState;

/// `GET /v1/services`.
pub(crate) type ServiceList = xce_wire::services::ServiceList<'static>;
/// `GET /v1/services/{name}`, and the answer of `POST /v1/services`, `PUT
/// /v1/services/{name}`, `…/scale` and `…/restart`.
pub(crate) type ServiceDetail = xce_wire::services::ServiceDetail<'static>;
/// What happened to one replica slot across its jobs.
pub(crate) type ReplicaStatus = xce_wire::services::ReplicaStatus<'static>;
/// Where the service's latest change stands.
pub(crate) type Rollout = xce_wire::services::Rollout<'static>;
/// A placed replica in a service detail.
pub(crate) type JobRow = xce_wire::services::JobAnswer<'static>;
/// `DELETE /v1/services/{name}`.
pub(crate) type StopAnswer = xce_wire::services::StopAnswer<'static>;
/// `GET /v1/hosts`.
pub(crate) type HostList = xce_wire::hosts::HostList<'static>;
/// One host of `GET /v1/hosts`, and the answer of `POST /v1/hosts/{id}/cordon|uncordon|drain`.
pub(crate) type HostAnswer = xce_wire::hosts::HostAnswer<'static>;

/// The port names a service profile (as `GET /v1/services/{name}` shows it) declares, in
/// declaration order: the order `XCE_PORTS` has and tables follow. Only names that need
/// no quoting (the entry check's rule), so they are safe in `env` output too.
pub(crate) fn declared_ports(profile: &serde_json::Value) -> Vec<String> {
    let ports = profile.get("ports").and_then(|p| p.as_array());
    ports
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("name")?.as_str())
        .filter(|n| is_port_name(n))
        .map(str::to_owned)
        .collect()
}

// === endpoint entries ===

/// Checks what the outputs trust beyond the types: every port name is a valid port name,
/// so `XCE_ENDPOINTS_<NAME>` is a valid shell variable name.
pub(crate) fn check(entry: &EndpointEntry) -> Result<(), CliError> {
    for e in &entry.endpoints {
        if let Some(name) = e.ports.keys().find(|n| !is_port_name(n)) {
            return Err(CliError::new(
                ErrorKind::Server,
                format!(
                    "the apiserver sent an invalid endpoint entry: replica {} has an invalid port name: {name:?}",
                    e.replica
                ),
            ));
        }
    }
    Ok(())
}

/// The ready endpoints of an entry (all of them, unless `?include=all` added others).
pub(crate) fn ready(entry: &EndpointEntry) -> impl Iterator<Item = &Endpoint> {
    entry.endpoints.iter().filter(|e| is_ready(e))
}

/// Ready unless the server said otherwise (and it has an address to reach it at).
pub(crate) fn is_ready(e: &Endpoint) -> bool {
    e.ready != Some(false) && e.address.is_some()
}

/// `address:port`, IPv6 in brackets; `None` without an address.
pub(crate) fn socket(e: &Endpoint, port: u16) -> Option<String> {
    e.address
        .map(|ip| std::net::SocketAddr::new(ip, port).to_string())
}

/// A valid port name (docs/profile.md), by `port-resource`'s rule, the one the server checked
/// the profile with: past it, a name needs no quoting and its `XCE_*` form is unique.
pub(crate) fn is_port_name(s: &str) -> bool {
    PortName::new(s).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check_entry(json: &str, expect: Expect) {
        let actual = match serde_json::from_str::<EndpointEntry>(json) {
            Err(e) => format!("parse error: {e}"),
            Ok(entry) => match check(&entry) {
                Ok(()) => entry
                    .endpoints
                    .iter()
                    .map(|e| {
                        let sockets: Vec<_> =
                            e.ports.values().filter_map(|p| socket(e, *p)).collect();
                        format!("{} ready={} {}", e.replica, is_ready(e), sockets.join(","))
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
                Err(e) => e.to_string(),
            },
        };
        expect.assert_eq(&actual);
    }

    #[test]
    fn parses_and_checks_entries() {
        check_entry(
            r#"{"service":"web","index":42,"endpoints":[
                {"replica":0,"job":"j-17","host":"exec-01","address":"127.0.0.11","ports":{"http":20417}},
                {"replica":1,"job":"j-18","host":"exec-02","address":"fd00::2","ports":{"http":20533},"ready":false,"state":"running"},
                {"replica":2,"job":"j-19","host":"exec-03","ports":{"http":20111},"ready":false,"state":"placed"}]}"#,
            expect![[r#"
                0 ready=true 127.0.0.11:20417
                1 ready=false [fd00::2]:20533
                2 ready=false "#]],
        );
        check_entry(
            r#"{"service":"web","index":1,"endpoints":[
                {"replica":0,"job":"j-1","host":"h","address":"$(reboot)","ports":{"http":1}}]}"#,
            expect!["parse error: invalid IP address syntax at line 2 column 73"],
        );
        check_entry(
            r#"{"service":"web","index":1,"endpoints":[
                {"replica":0,"job":"j-1","host":"h","address":"10.0.0.1","ports":{"A=B;x":1}}]}"#,
            expect![[
                r#"error: the apiserver sent an invalid endpoint entry: replica 0 has an invalid port name: "A=B;x""#
            ]],
        );
        check_entry(
            r#"{"service":"web","endpoints":[]}"#,
            expect!["parse error: missing field `index` at line 1 column 32"],
        );
    }
}
