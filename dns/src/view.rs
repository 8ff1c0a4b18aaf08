//! Who may see which names: a query's view of the zone.

use plugin_api::{Permission, Principal};
use std::collections::BTreeSet;

/// Which projects a query may see names of.
pub trait View {
    /// Whether names of `project` may be answered.
    fn may_view(&self, project: &str) -> bool;

    /// Whether any of `projects` may be viewed (a host's name is visible to whoever
    /// may view a project with an endpoint on it).
    fn may_view_any(&self, projects: &BTreeSet<String>) -> bool {
        projects.iter().any(|p| self.may_view(p))
    }
}

/// A principal views the projects it holds `job.view` on (the endpoints' own rule), as
/// its grants are now: a reload of the tokens that shrinks them applies at once.
impl View for Principal {
    fn may_view(&self, project: &str) -> bool {
        self.may(Permission::JobView, project)
            && self.credential.allows(Permission::JobView, project)
    }
}
