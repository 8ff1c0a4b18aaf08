//! Fault injection's one corruption that needs to know a plugin's grant format (the
//! others are the host skipping a step). Kept out of the host's code, which knows the
//! plugins only through `plugin-api`.

use plugin_api::{Grant, Grants, JobInfo};
use port_resource::{PortGrant, PLUGIN_NAME};

/// Rewrites the first port of `grants` to a port one of `others` (live jobs on the same
/// host) holds with the same protocol. Whether it found one.
pub(crate) fn duplicate_port<'a>(
    grants: &mut Grants,
    others: impl Iterator<Item = &'a JobInfo>,
) -> bool {
    let read = |g: Option<&Grant>| g.and_then(|g| PortGrant::from_grant(g).ok());
    let Some(mut mine) = read(grants.get(PLUGIN_NAME)) else {
        return false;
    };
    for other in others {
        let Some(theirs) = read(other.grants.get(PLUGIN_NAME)) else {
            continue;
        };
        if let (Some(a), Some(b)) = (mine.ports.first_mut(), theirs.ports.first()) {
            if a.protocol == b.protocol {
                a.port = b.port;
                grants.insert(PLUGIN_NAME, mine.to_grant());
                return true;
            }
        }
    }
    false
}
