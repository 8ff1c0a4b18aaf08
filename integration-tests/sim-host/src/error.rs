//! Why a simulation may not run.

/// Why a simulation could not run (a violation is not an error: it is counted).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A setting the plugins refused.
    #[error("config: {0}")]
    Config(String),
    /// The loopback apiserver could not start.
    #[error("apiserver: {0}")]
    Serve(String),
    /// A host's report was refused by the policy or a plugin.
    #[error("host {host}: {reason}")]
    Host {
        /// The host.
        host: String,
        /// Why.
        reason: String,
    },
    /// A service the scenario generated was refused.
    #[error("service {service}: {reason}")]
    Service {
        /// The service.
        service: String,
        /// Why.
        reason: String,
    },
}
