//! The REST answers this client reads (DESIGN §5, the apiserver's shapes), as lenient serde
//! types: unknown fields are ignored so a newer server does not break an older client.
//!
//! Endpoint entries are checked once after parsing ([`EndpointEntry::check`]), because the
//! `plain` and `env` outputs end up in shell `eval`s and config files: past the check an
//! address and a port name are known to need no quoting.

use crate::error::{CliError, ErrorKind};
use serde::Deserialize;
use std::collections::BTreeMap;

/// `GET /v1/services/{name}/endpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct EndpointEntry {
    pub(crate) service: String,
    pub(crate) index: u64,
    #[serde(default)]
    pub(crate) endpoints: Vec<Endpoint>,
}

/// One replica in an endpoint entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct Endpoint {
    pub(crate) replica: u32,
    #[serde(default)]
    pub(crate) job: String,
    #[serde(default)]
    pub(crate) host: String,
    pub(crate) address: String,
    #[serde(default)]
    pub(crate) ports: BTreeMap<String, u16>,
    /// Absent on ready endpoints; `false` on the extra rows of `?include=all`.
    #[serde(default)]
    pub(crate) ready: Option<bool>,
    #[serde(default)]
    pub(crate) state: Option<String>,
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

/// `GET /v1/services/{name}` and the answer of `POST /v1/services`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ServiceDetail {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) project: String,
    #[serde(default)]
    pub(crate) replicas: u32,
    #[serde(default)]
    pub(crate) index: u64,
    #[serde(default)]
    pub(crate) profile: serde_json::Value,
    #[serde(default)]
    pub(crate) pending: Vec<PendingReplica>,
    #[serde(default)]
    pub(crate) jobs: Vec<JobRow>,
}

/// A replica no host can hold yet.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct PendingReplica {
    pub(crate) replica: u32,
    pub(crate) reason: String,
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

/// The body of every REST error.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorInner,
}

/// `{"code", "message", "details"}`.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorInner {
    #[serde(default)]
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) details: Vec<ErrorDetail>,
}

/// One field problem.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct ErrorDetail {
    #[serde(default)]
    pub(crate) field: String,
    #[serde(default)]
    pub(crate) reason: String,
}

// === impl EndpointEntry ===

impl EndpointEntry {
    /// Checks what the outputs trust: every address is an IP address (or at worst a plain
    /// host name) and every port name is a valid port name, so neither needs shell quoting.
    pub(crate) fn check(&self) -> Result<(), CliError> {
        for e in &self.endpoints {
            if !is_plain_address(&e.address) {
                return Err(bad_answer(format!(
                    "replica {} has an address that is not an ip address: {:?}",
                    e.replica, e.address
                )));
            }
            if let Some(name) = e.ports.keys().find(|n| !is_port_name(n)) {
                return Err(bad_answer(format!(
                    "replica {} has an invalid port name: {name:?}",
                    e.replica
                )));
            }
        }
        Ok(())
    }

    /// Whether an endpoint is ready (the default rows are; `?include=all` adds others).
    pub(crate) fn ready(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter().filter(|e| e.is_ready())
    }
}

impl Endpoint {
    /// Ready unless the server said otherwise.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready != Some(false)
    }

    /// `address:port`, with IPv6 addresses in brackets.
    pub(crate) fn socket(&self, port: u16) -> String {
        if self.address.contains(':') {
            format!("[{}]:{port}", self.address)
        } else {
            format!("{}:{port}", self.address)
        }
    }
}

fn bad_answer(message: String) -> CliError {
    CliError::new(
        ErrorKind::Server,
        format!("the apiserver sent an invalid endpoint entry: {message}"),
    )
}

/// An IP address (v4, or v6 with an optional `%zone`), or a DNS host name. Nothing a shell
/// would interpret.
fn is_plain_address(s: &str) -> bool {
    if s.parse::<std::net::IpAddr>().is_ok() {
        return true;
    }
    if let Some((ip, zone)) = s.split_once('%') {
        return ip.parse::<std::net::Ipv6Addr>().is_ok()
            && !zone.is_empty()
            && zone
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    }
    !s.is_empty()
        && s.len() <= 253
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// DESIGN §3 port names: `[a-z0-9-]`, 1-15 chars (the rest of the rule is the server's).
fn is_port_name(s: &str) -> bool {
    (1..=15).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check(json: &str, expect: Expect) {
        let actual = match serde_json::from_str::<EndpointEntry>(json) {
            Err(e) => format!("parse error: {e}"),
            Ok(entry) => match entry.check() {
                Ok(()) => entry
                    .endpoints
                    .iter()
                    .map(|e| {
                        let sockets: Vec<_> = e.ports.values().map(|p| e.socket(*p)).collect();
                        format!("{} ready={} {}", e.replica, e.is_ready(), sockets.join(","))
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
        check(
            r#"{"service":"web","index":42,"endpoints":[
                {"replica":0,"job":"j-17","host":"exec-01","address":"127.0.0.11","ports":{"http":20417}},
                {"replica":1,"job":"j-18","host":"exec-02","address":"fd00::2","ports":{"http":20533},"ready":false,"state":"running","future":1}]}"#,
            expect![[r#"
                0 ready=true 127.0.0.11:20417
                1 ready=false [fd00::2]:20533"#]],
        );
        check(
            r#"{"service":"web","index":1,"endpoints":[
                {"replica":0,"address":"$(reboot)","ports":{"http":1}}]}"#,
            expect![[r#"
                error: the apiserver sent an invalid endpoint entry: replica 0 has an address that is not an ip address: "$(reboot)"
            "#]],
        );
        check(
            r#"{"service":"web","index":1,"endpoints":[
                {"replica":0,"address":"fe80::1%lo","ports":{"A=B;x":1}}]}"#,
            expect![[r#"
                error: the apiserver sent an invalid endpoint entry: replica 0 has an invalid port name: "A=B;x"
            "#]],
        );
        check(
            r#"{"service":"web","endpoints":[]}"#,
            expect!["parse error: missing field `index` at line 1 column 32"],
        );
    }
}
