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
    /// `ready`, `unreachable` or `lost` (a string: a newer server's state must not fail a
    /// client).
    #[serde(default)]
    pub state: Cow<'a, str>,
    /// Plugin name → that plugin's summary of the host (read: every key that is not one of
    /// the host's fields).
    #[serde(flatten)]
    pub summaries: Summaries<'a>,
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
        m.field("state", &self.state)?;
        m.end()
    }
}

#[cfg(test)]
mod tests;
