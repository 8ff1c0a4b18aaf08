//! The grant format: what the scheduler reserved for one job. Persisted with the job,
//! handed to the worker's launch hook and to cluster listeners (the endpoint table).

use plugin_api::Grant;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The plugin's name: its profile section (`service.ports`), host-facts section and grant
/// key. Here (not in `lib.rs`) so that the modules import it from the module that defines
/// it and `lib.rs` only re-exports.
pub const PLUGIN_NAME: &str = "ports";

/// Transport protocol of a port. tcp/80 and udp/80 are different ports.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    Tcp,
    /// UDP.
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// One granted port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
// Fields in key order: the encoded text is then byte for byte what the hosts stored when
// grants were `serde_json::Value`s (sorted keys), so equal grants compare as equal text.
pub struct GrantedPort {
    /// The declared name.
    pub name: String,
    /// The port number granted on the host.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
}

/// All ports granted to one job, in declaration order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PortGrant {
    /// The ports.
    pub ports: Vec<GrantedPort>,
}

/// A grant value that is not a port grant.
#[derive(Debug, thiserror::Error)]
// The cause is in the message and deliberately not a `source` (chains would repeat it).
#[error("malformed port grant: {0}")]
pub struct MalformedGrant(plugin_api::GrantError);

impl PortGrant {
    /// Decodes a grant as stored by the host, straight from its text (no JSON tree).
    pub fn from_grant(grant: &Grant) -> Result<Self, MalformedGrant> {
        grant.decode().map_err(MalformedGrant)
    }

    /// Encodes for the host to persist, straight to text (no JSON tree).
    pub fn to_grant(&self) -> Grant {
        Grant::encode(self).expect("a port grant always serializes")
    }

    /// The port granted under `name`, if any.
    pub fn get(&self, name: &str) -> Option<&GrantedPort> {
        self.ports.iter().find(|p| p.name == name)
    }
}
