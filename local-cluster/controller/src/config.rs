//! The controller's settings ([`ControllerConfig`]) and their checks. Kept apart from
//! `mod.rs` so the state machine (`core/`) can use the full-disruption threshold without
//! depending on the module that starts it.

use super::quota;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The controller's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Where the apiserver listens.
    pub listen: SocketAddr,
    /// Where the embedded store lives (the integrator opens `RedbStore` in it).
    pub data_dir: PathBuf,
    /// How often workers heartbeat (told to them at registration).
    pub heartbeat_interval: Duration,
    /// A host silent this long is unreachable (its jobs become `unknown`, kept).
    pub unreachable_after: Duration,
    /// A host silent this long is lost (its jobs end, their grants are released).
    pub grace_period: Duration,
    /// When more than this share of the hosts are unreachable at once, the controller
    /// suspects itself or its network and declares no host lost (see
    /// [`DisruptionThreshold`]).
    pub disruption_threshold: DisruptionThreshold,
    /// The largest request body accepted (413 above).
    pub body_limit: usize,
    /// What clients may hold of the API port (connection caps and timeouts).
    pub connections: xce_serve::ConnLimits,
    /// Serve the API over TLS with this certificate (`tls_cert`, `tls_key`); plain HTTP
    /// without.
    pub tls: Option<xce_serve::ServerTls>,
    /// Per-project limits on what services declare (`[quotas.*]`).
    pub quotas: quota::Quotas,
    /// Who may read `/metrics` (`[metrics]`).
    pub metrics: xce_serve::auth::MetricsConfig,
    /// How long a draining replica's SIGTERM waits, from its removal, for the separate
    /// apiservers to apply that removal (`core/acks.rs`).
    pub drain_ack_timeout: Duration,
    /// The TTL of this controller's DNS answers when it serves DNS to resolvers (`[dns]
    /// listen`): a service whose `drain` is shorter than twice it says so in its
    /// rollout status. `None`: no DNS listener, no such check.
    pub dns_ttl: Option<Duration>,
    /// The store format to write (`store_format`): a store in an older one is moved to it
    /// at load, a newer one is kept (a store never goes back). See `xce_model::FORMAT`.
    pub store_format: u64,
}

/// `drain_ack_timeout` unless told otherwise.
pub const DEFAULT_DRAIN_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest `drain_ack_timeout`: longer than an apiserver's default `max_lag` (2 s)
/// plus the second it may take to learn that a revision exists, so that an apiserver
/// not waited for any longer is failing closed.
pub const MIN_DRAIN_ACK_TIMEOUT: Duration = Duration::from_secs(4);

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7480)),
            data_dir: PathBuf::from("./xce-data"),
            heartbeat_interval: Duration::from_secs(1),
            unreachable_after: Duration::from_secs(3),
            grace_period: Duration::from_secs(30),
            disruption_threshold: DisruptionThreshold::DEFAULT,
            body_limit: 1024 * 1024,
            connections: xce_serve::ConnLimits::default(),
            tls: None,
            quotas: quota::Quotas::default(),
            metrics: xce_serve::auth::MetricsConfig::default(),
            drain_ack_timeout: DEFAULT_DRAIN_ACK_TIMEOUT,
            dns_ttl: None,
            store_format: xce_model::DEFAULT_STORE_FORMAT,
        }
    }
}

/// Why a [`ControllerConfig`] is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The grace period must outlast the unreachable timeout.
    #[error("grace_period ({grace:?}) must be longer than unreachable_after ({unreachable:?})")]
    GraceTooShort {
        /// The grace period.
        grace: Duration,
        /// The unreachable timeout.
        unreachable: Duration,
    },
    /// Heartbeats must come more often than the unreachable timeout.
    #[error("heartbeat_interval ({heartbeat:?}) must be shorter than unreachable_after ({unreachable:?})")]
    HeartbeatTooSlow {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The unreachable timeout.
        unreachable: Duration,
    },
    /// A zero heartbeat interval or body limit.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// A `drain_ack_timeout` below [`MIN_DRAIN_ACK_TIMEOUT`].
    #[error("drain_ack_timeout ({0:?}) must be at least 4s: longer than an apiserver's default max_lag (2s) plus the second it may take to learn of a revision, so that an apiserver a drain no longer waits for is failing closed")]
    DrainAckTimeout(Duration),
    /// A `disruption_threshold` outside `(0, 1]` (the value as given).
    #[error("disruption_threshold ({0}) must be more than 0 and at most 1 (1 turns the full-disruption rule off)")]
    DisruptionThreshold(String),
}

/// The full-disruption rule's threshold: when more than this share of the hosts that are
/// not lost (and at least 2 of them) are unreachable at once, the controller suspects
/// itself or its network rather than the hosts, and declares none of them lost until
/// fewer are (Kubernetes' node lifecycle controller does the same). A share in `(0, 1]`;
/// `1` turns the rule off (more than every host can never be unreachable).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisruptionThreshold(f64);

// Checked at construction: never NaN.
impl Eq for DisruptionThreshold {}

impl DisruptionThreshold {
    /// Kubernetes' `--unhealthy-zone-threshold`: more than 55 %.
    pub const DEFAULT: Self = Self(0.55);

    /// A threshold of `share` (more than 0, at most 1).
    pub fn try_new(share: f64) -> Result<Self, ConfigError> {
        if share > 0.0 && share <= 1.0 {
            Ok(Self(share))
        } else {
            Err(ConfigError::DisruptionThreshold(share.to_string()))
        }
    }

    /// The share.
    pub fn get(self) -> f64 {
        self.0
    }

    /// Whether `unreachable` of `hosts` (the hosts that are not lost) being unreachable at
    /// once is a full disruption: at least 2 of them, and more than the share. A lone
    /// host's silence is always the host's (a 2-host cluster with one dead host replaces
    /// its replicas).
    pub fn is_full_disruption(self, unreachable: usize, hosts: usize) -> bool {
        unreachable >= 2 && unreachable as f64 > self.0 * hosts as f64
    }
}

impl Default for DisruptionThreshold {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl ControllerConfig {
    /// Checks the timing rules: `0 < heartbeat_interval < unreachable_after <
    /// grace_period`, and `body_limit > 0`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.heartbeat_interval.is_zero() {
            return Err(ConfigError::Zero("heartbeat_interval"));
        }
        if self.body_limit == 0 {
            return Err(ConfigError::Zero("body_limit"));
        }
        if self.heartbeat_interval >= self.unreachable_after {
            return Err(ConfigError::HeartbeatTooSlow {
                heartbeat: self.heartbeat_interval,
                unreachable: self.unreachable_after,
            });
        }
        if self.drain_ack_timeout < MIN_DRAIN_ACK_TIMEOUT {
            return Err(ConfigError::DrainAckTimeout(self.drain_ack_timeout));
        }
        if self.grace_period <= self.unreachable_after {
            return Err(ConfigError::GraceTooShort {
                grace: self.grace_period,
                unreachable: self.unreachable_after,
            });
        }
        Ok(())
    }
}

impl ControllerConfig {
    /// The embedded store's file: `<data_dir>/controller.redb`.
    pub fn store_path(&self) -> PathBuf {
        self.data_dir.join("controller.redb")
    }
}
