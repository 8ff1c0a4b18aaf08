//! The answer of `GET /v1/hosts` (`docs/api.md`, "Services").

use crate::summaries::{Merged, Summaries, HOST_FIELDS};
use serde::{Deserialize, Serialize, Serializer};
use std::borrow::Cow;
use std::net::IpAddr;

/// `GET /v1/hosts`: the cluster's id and every exec host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostList<'a> {
    /// The cluster's id (absent from controllers older than cluster ids).
    #[serde(default)]
    pub cluster: Option<Cow<'a, str>>,
    /// The hosts.
    pub hosts: Vec<HostAnswer<'a>>,
}

/// One exec host, with each resource plugin's summary of it as a key of its own beside
/// the host's fields (`"ports": {"range", "capacity", "used", "unavailable"}`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HostAnswer<'a> {
    /// All usable addresses its worker reported, the advertised one included.
    #[serde(default)]
    pub addresses: Vec<HostAddress<'a>>,
    /// Host id.
    pub id: Cow<'a, str>,
    /// The advertised address (`None` until its worker reported one).
    #[serde(default)]
    pub ip_addr: Option<IpAddr>,
    /// Live jobs on it.
    #[serde(default)]
    pub jobs: u32,
    /// Its cordon or drain; `None` (`null`) for a host in service, and from servers older
    /// than host maintenance.
    #[serde(default)]
    pub maintenance: Option<HostMaintenance<'a>>,
    /// `ready`, `unreachable` or `lost` (a string: a newer server's state must not fail a
    /// client).
    #[serde(default)]
    pub state: Cow<'a, str>,
    /// Plugin name → that plugin's summary of the host (read: every key that is not one of
    /// the host's fields).
    #[serde(flatten)]
    pub summaries: Summaries<'a>,
}

/// A host's maintenance (`POST /v1/hosts/{id}/cordon|drain`, or its worker's leave).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostMaintenance<'a> {
    /// Who asked: a principal's name, or `worker:<host>` for its worker's leave.
    pub by: Cow<'a, str>,
    /// Live replicas still on the host.
    #[serde(default)]
    pub left: u32,
    /// Asked by the host's own worker as it left: the worker takes the host back when it
    /// registers again.
    #[serde(default)]
    pub leave: bool,
    /// The live replicas still on the host, per service.
    #[serde(default)]
    pub services: Vec<ServiceLeft<'a>>,
    /// When it was asked (RFC 3339, UTC).
    pub since: Cow<'a, str>,
    /// `cordoned` (no new placements), `draining` (replicas moving off), or `drained`
    /// (a drain with nothing left on the host: it takes nothing until uncordoned). A
    /// string: a newer server's state must not fail a client.
    pub state: Cow<'a, str>,
}

/// A service's live replicas on a host under maintenance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceLeft<'a> {
    /// The service's name.
    pub name: Cow<'a, str>,
    /// Its project.
    pub project: Cow<'a, str>,
    /// Its live replicas on the host (draining ones included, until they exited).
    pub replicas: u32,
}

/// One usable address of a host (`plugin_api::HostAddress`, keys in alphabetical order).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAddress<'a> {
    /// The interface it was found on, when known (absent for a configured address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<Cow<'a, str>>,
    /// The address.
    pub ip: IpAddr,
}

impl<'a> From<&'a plugin_api::HostAddress> for HostAddress<'a> {
    fn from(a: &'a plugin_api::HostAddress) -> Self {
        HostAddress {
            interface: a.interface.as_deref().map(Cow::Borrowed),
            ip: a.ip,
        }
    }
}

impl HostAnswer<'_> {
    /// The summary of the plugin named `plugin`, if it has one.
    pub fn summary(&self, plugin: &str) -> Option<&serde_json::Value> {
        self.summaries.get(plugin)
    }
}

impl Serialize for HostAnswer<'_> {
    /// The host's fields and the summaries, keys in alphabetical order.
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut m = Merged::new(ser, HOST_FIELDS, &self.summaries)?;
        m.field("addresses", &self.addresses)?;
        m.field("id", &self.id)?;
        m.field("ip_addr", &self.ip_addr)?;
        m.field("jobs", &self.jobs)?;
        m.field("maintenance", &self.maintenance)?;
        m.field("state", &self.state)?;
        m.end()
    }
}

#[cfg(test)]
mod tests;
