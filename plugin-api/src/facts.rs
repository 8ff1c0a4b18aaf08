//! What a worker reports about its host, and the controller's check of it.

use crate::vocab::{FieldError, HostId};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// One usable address of a host.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct HostAddress {
    /// The address.
    pub ip: IpAddr,
    /// The interface it was found on, when known (`None` for a configured address).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
}

/// Everything a worker reports about its host. Sent at registration and again only when
/// it changed (the worker compares the whole value).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostFacts {
    /// The host's advertised address (what replicas are reached at). `None` until a
    /// provider sets it.
    #[serde(default)]
    pub ip_addr: Option<IpAddr>,
    /// All usable addresses, advertised one included.
    #[serde(default)]
    pub addresses: Vec<HostAddress>,
    /// Provider-specific facts, keyed by provider name (e.g. `ports` → the host's dynamic
    /// range and reserved list). Opaque to the host.
    #[serde(default)]
    pub sections: BTreeMap<String, serde_json::Value>,
}

/// Why a provider could not collect its facts.
#[derive(Debug, thiserror::Error)]
#[error("{provider}: {message}")]
#[non_exhaustive]
pub struct FactsError {
    /// The provider's name.
    pub provider: String,
    /// What went wrong, lowercase.
    pub message: String,
}

impl FactsError {
    /// Builds an error for `provider`.
    pub fn new(provider: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            provider: provider.into(),
            message: message.into(),
        }
    }
}

/// Contributes facts about the worker's host.
///
/// **Who calls it**: the worker, once at start (an `Err` there stops the worker start with
/// the message), then again on its re-read timer; the worker sends the combined facts to
/// the controller only when they differ from the last accepted report. Calls never overlap.
/// A provider fills in only its own part: `ip_addr`/`addresses`, or `sections[name]`.
#[async_trait]
pub trait HostFactsProvider: Send + Sync + 'static {
    /// The provider's name (and its key in [`HostFacts::sections`] if it uses one).
    fn name(&self) -> &'static str;

    /// Fills in this provider's part of `facts`.
    async fn collect(&self, facts: &mut HostFacts) -> Result<(), FactsError>;
}

#[async_trait]
impl<T: HostFactsProvider + ?Sized> HostFactsProvider for std::sync::Arc<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    async fn collect(&self, facts: &mut HostFacts) -> Result<(), FactsError> {
        (**self).collect(facts).await
    }
}

/// The controller's check of a host's report, before anything uses it.
///
/// **Who calls it**: the controller, for every registration and re-report, after it has
/// authenticated the worker as `host`. On `Err` the report is refused as a whole: the
/// host keeps its previous facts, and the controller logs every problem. Pure.
pub trait HostFactsPolicy: Send + Sync + 'static {
    /// Checks `facts` reported for `host`.
    fn check(&self, host: &HostId, facts: &HostFacts) -> Result<(), Vec<FieldError>>;
}
