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

/// One granted port read in place from a grant's text (see [`PortGrantRef`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantedPortRef<'a> {
    /// The declared name, borrowed from the grant unless it holds escapes.
    #[serde(borrow)]
    pub name: std::borrow::Cow<'a, str>,
    /// The port number granted on the host.
    pub port: u16,
    /// Its protocol.
    pub protocol: Protocol,
}

/// A port grant read in place: the same format as [`PortGrant`], its names borrowed from
/// the grant's text, for readers that only look (the endpoint table decodes the grant of
/// every job it is told of; owned names were an allocation per port).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortGrantRef<'a> {
    /// The ports, in declaration order.
    #[serde(borrow)]
    pub ports: Vec<GrantedPortRef<'a>>,
}

impl<'a> PortGrantRef<'a> {
    /// Reads a grant as stored by the host.
    pub fn from_grant(grant: &'a Grant) -> Result<Self, MalformedGrant> {
        grant.decode().map_err(MalformedGrant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_reads_back_owned_and_in_place_and_its_text_is_the_old_one() {
        let g = PortGrant {
            ports: vec![
                GrantedPort {
                    name: "http".into(),
                    port: 20417,
                    protocol: Protocol::Tcp,
                },
                GrantedPort {
                    name: "dns".into(),
                    port: 53,
                    protocol: Protocol::Udp,
                },
            ],
        };
        let grant = g.to_grant();
        // What a host whose grants were `Value`s (sorted keys) stored, byte for byte.
        assert_eq!(
            grant.as_str(),
            serde_json::to_value(&g).unwrap().to_string()
        );
        assert_eq!(PortGrant::from_grant(&grant).unwrap(), g);
        let view = PortGrantRef::from_grant(&grant).unwrap();
        assert!(matches!(
            view.ports[0].name,
            std::borrow::Cow::Borrowed("http")
        ));
        assert_eq!(
            view.ports
                .iter()
                .map(|p| (&*p.name, p.port, p.protocol))
                .collect::<Vec<_>>(),
            [("http", 20417, Protocol::Tcp), ("dns", 53, Protocol::Udp)]
        );
        // A name with an escape cannot be borrowed: read owned, not refused.
        let escaped =
            Grant::from_json(r#"{"ports":[{"name":"a\"b","port":1,"protocol":"tcp"}]}"#).unwrap();
        assert_eq!(
            PortGrantRef::from_grant(&escaped).unwrap().ports[0].name,
            "a\"b"
        );
        // The same checks as the owned form.
        for bad in [
            r#"{"ports":[{"name":"a","port":1,"protocol":"tcp","x":1}]}"#,
            r#"{"ports":[{"name":"a","port":70000,"protocol":"tcp"}]}"#,
            r#"{"ports":3}"#,
        ] {
            let bad = Grant::from_json(bad).unwrap();
            assert!(PortGrantRef::from_grant(&bad).is_err(), "{bad}");
            assert!(PortGrant::from_grant(&bad).is_err(), "{bad}");
        }
    }
}
