//! The REST answers this client reads (docs/api.md, the apiserver's shapes), as lenient serde
//! types: unknown fields are ignored so a newer server does not break an older client.
//!
//! Endpoint entries are checked once after parsing ([`check`]), because the
//! `plain` and `env` outputs end up in shell `eval`s and config files: past the check an
//! address and a port name are known to need no quoting.

use crate::error::{CliError, ErrorKind};
use port_resource::name::PortName;
use serde::Deserialize;

/// `GET /v1/services/{name}/endpoints`: the wire type of `endpoint-table`, which owns
/// the shape. Addresses are `IpAddr`, so parsing already proves they need no quoting.
pub(crate) use endpoint_table::wire::EndpointAnswer as Endpoint;
pub(crate) use endpoint_table::wire::EndpointsAnswer as EndpointEntry;

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

/// `GET /v1/services`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ServiceList {
    pub(crate) services: Vec<ServiceSummary>,
}

/// One row of `GET /v1/services`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ServiceSummary {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) project: String,
    #[serde(default)]
    pub(crate) replicas: u32,
    #[serde(default)]
    pub(crate) ready: u32,
    #[serde(default)]
    pub(crate) pending: u32,
    #[serde(default)]
    pub(crate) pending_reason: Option<String>,
    #[serde(default)]
    pub(crate) state: String,
}

/// `GET /v1/services/{name}`, and the answer of `POST /v1/services`, `PUT
/// /v1/services/{name}`, `…/scale` and `…/restart`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ServiceDetail {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) project: String,
    #[serde(default)]
    pub(crate) replicas: u32,
    /// `active` or `stopping`.
    #[serde(default)]
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) index: u64,
    /// The generation of the current profile; 0 from an apiserver that predates rollouts.
    #[serde(default)]
    pub(crate) generation: u64,
    /// `None` from an apiserver that predates rollouts.
    #[serde(default)]
    pub(crate) rollout: Option<Rollout>,
    #[serde(default)]
    pub(crate) profile: serde_json::Value,
    #[serde(default)]
    pub(crate) pending: Vec<PendingReplica>,
    #[serde(default)]
    pub(crate) jobs: Vec<JobRow>,
    /// Per replica slot: restarts, the last exit and the log; empty from an apiserver
    /// that predates it.
    #[serde(default)]
    pub(crate) replica_status: Vec<ReplicaStatus>,
}

/// What happened to one replica slot across its jobs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ReplicaStatus {
    pub(crate) replica: u32,
    /// Jobs of the slot that ended by themselves and were replaced.
    #[serde(default)]
    pub(crate) restarts: u64,
    #[serde(default)]
    pub(crate) last_exit: Option<LastExit>,
    /// The log file of the slot's newest job, on `log_host`.
    #[serde(default)]
    pub(crate) log: Option<String>,
    #[serde(default)]
    pub(crate) log_host: Option<String>,
}

/// The last time a replica's job ended by itself.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct LastExit {
    #[serde(default)]
    pub(crate) job: String,
    #[serde(default)]
    pub(crate) host: String,
    /// RFC 3339.
    #[serde(default)]
    pub(crate) at: String,
    /// `exit 3`, `SIGKILL (signal 9)`, or why it could not be started.
    #[serde(default)]
    pub(crate) summary: String,
}

/// Where the service's latest change stands (docs/api.md, docs/design.md).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Rollout {
    /// The generation this rollout brings the service to.
    pub(crate) generation: u64,
    pub(crate) state: RolloutState,
    /// Live jobs of `generation` that are not draining or stopping.
    #[serde(default)]
    pub(crate) updated: u32,
    /// Ready jobs of any generation.
    #[serde(default)]
    pub(crate) ready: u32,
    /// Live jobs of older generations that are not draining or stopping.
    #[serde(default)]
    pub(crate) outdated: u32,
    /// Why it waits, why it failed, or what was reverted.
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

/// `rollout.state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RolloutState {
    Progressing,
    Complete,
    Failed,
    Reverted,
    /// A state this client does not know (a newer apiserver): treated as still moving.
    #[serde(other)]
    Unknown,
}

impl RolloutState {
    /// As the REST API spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RolloutState::Progressing => "progressing",
            RolloutState::Complete => "complete",
            RolloutState::Failed => "failed",
            RolloutState::Reverted => "reverted",
            RolloutState::Unknown => "unknown",
        }
    }
}

/// A replica no host can hold yet.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PendingReplica {
    pub(crate) replica: u32,
    /// Lenient: a reason the server could not give (`null`) must not fail the command.
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

/// A placed replica in a service detail.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct JobRow {
    pub(crate) job: String,
    pub(crate) replica: u32,
    #[serde(default)]
    pub(crate) host: String,
    #[serde(default)]
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) ready: bool,
    /// The generation the job runs; `None` from an apiserver that predates rollouts.
    #[serde(default)]
    pub(crate) generation: Option<u64>,
    /// Plugin name → that plugin's grant summary (opaque here).
    #[serde(default)]
    pub(crate) ports: serde_json::Value,
}

/// `DELETE /v1/services/{name}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct StopAnswer {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) stopping: u32,
}

/// `GET /v1/hosts`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct HostList {
    /// The cluster's id (absent from controllers older than cluster ids).
    #[serde(default)]
    pub(crate) cluster: Option<String>,
    pub(crate) hosts: Vec<HostRow>,
}

/// One exec host.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct HostRow {
    pub(crate) id: String,
    #[serde(default)]
    pub(crate) state: String,
    #[serde(default)]
    pub(crate) ip_addr: Option<String>,
    #[serde(default)]
    pub(crate) addresses: Vec<HostAddress>,
    #[serde(default)]
    pub(crate) jobs: u32,
    /// The port plugin's host summary (`range`, `capacity`, `used`, `unavailable`); absent
    /// without a port plugin.
    #[serde(default)]
    pub(crate) ports: Option<serde_json::Value>,
}

/// One address of a host.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct HostAddress {
    pub(crate) ip: String,
    #[serde(default)]
    pub(crate) interface: Option<String>,
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
