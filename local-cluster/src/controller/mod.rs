//! The controller: cluster state, the scheduler, and the apiserver's host routes.
//!
//! ```text
//!  HTTP ──► api.rs handlers ──Command──► task.rs (one task) ──► core.rs (sync state machine)
//!             ▲                                                   │ model.rs Txn → Store
//!             └──── watch<View> / watch<Assignments> ◄────────────┘ scheduler.rs (pure)
//! ```
//!
//! Invariants:
//! - One task owns the mutable state; handlers send commands and read snapshots.
//! - Every mutation is persisted as one atomic batch before it is applied in memory,
//!   announced to listeners or answered; plugin releases follow the commit.
//! - Grants are released exactly when a job ends: reported exited (also when stopping),
//!   launch refused, or its host lost past the grace period.
//! - The global revision strictly increases, is persisted, and continues after a restart.
//! - Change-driven: the scheduler runs after a change, timers sleep until the next
//!   deadline; nothing polls.
#![warn(missing_docs)]

pub(crate) mod api;
mod core;
mod metrics;
pub(crate) mod model;
pub mod quota;
pub(crate) mod rollout;
mod scheduler;
pub mod standby;
mod task;
#[cfg(test)]
mod tests;

use crate::auth::Tokens;
use crate::serve::serve;
use crate::store::Store;
use anyhow::Context as _;
use plugin_api::{ApiContext, ApiExtension, ClusterListener, HostFactsPolicy, ResourcePlugin};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

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
    pub connections: crate::serve::ConnLimits,
    /// Per-project limits on what services declare (`[quotas.*]`).
    pub quotas: quota::Quotas,
}

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
            connections: crate::serve::ConnLimits::default(),
            quotas: quota::Quotas::default(),
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

/// Creates `cfg.data_dir` if needed and opens the embedded store in it.
pub fn open_store(cfg: &ControllerConfig) -> anyhow::Result<Arc<dyn Store>> {
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("cannot create data dir {}", cfg.data_dir.display()))?;
    let path = cfg.store_path();
    let store = crate::store::RedbStore::open(&path)
        .with_context(|| format!("cannot open the controller store {}", path.display()))?;
    Ok(Arc::new(store))
}

/// The plugins the integrator wires in (through the `plugin-api` traits only).
#[derive(Default)]
pub struct ControllerPlugins {
    /// Consumable resources the scheduler allocates (e.g. ports).
    pub resources: Vec<Box<dyn ResourcePlugin>>,
    /// Checks of worker-reported host facts.
    pub facts_policies: Vec<Arc<dyn HostFactsPolicy>>,
    /// Receivers of the change feed.
    pub listeners: Vec<Arc<dyn ClusterListener>>,
    /// Extra apiserver routes.
    pub extensions: Vec<Arc<dyn ApiExtension>>,
}

impl std::fmt::Debug for ControllerPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerPlugins")
            .field(
                "resources",
                &self.resources.iter().map(|p| p.name()).collect::<Vec<_>>(),
            )
            .field("facts_policies", &self.facts_policies.len())
            .field("listeners", &self.listeners.len())
            .field("extensions", &self.extensions.len())
            .finish()
    }
}

/// A controller whose state task runs, without a socket: serve [`Controller::router`]
/// yourself (tests use `tower::ServiceExt::oneshot`), or use [`start`].
#[derive(Debug)]
pub struct Controller {
    api: api::ApiState,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
    /// Set when the state task stopped itself (see [`Controller::failed`]).
    fatal: watch::Receiver<Option<String>>,
}

impl Controller {
    /// Loads the state from `store`, brings the plugins up to it (`host_up` for every
    /// known host, `restore` for every live job), resyncs the listeners, registers every
    /// metric, and spawns the state task. Must run inside a tokio runtime.
    pub async fn new(
        cfg: &ControllerConfig,
        tokens: Tokens,
        plugins: ControllerPlugins,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<Self> {
        let role = standby::Role::default();
        role.serving();
        Self::with_role(cfg, tokens, plugins, store, &role).await
    }

    /// [`new`](Self::new) for an elected controller: `role` (the process's, shared with
    /// its standby listener) goes on `/metrics` as it is.
    pub async fn with_role(
        cfg: &ControllerConfig,
        tokens: Tokens,
        plugins: ControllerPlugins,
        store: Arc<dyn Store>,
        role: &standby::Role,
    ) -> anyhow::Result<Self> {
        cfg.validate().context("invalid controller config")?;
        let ControllerPlugins {
            resources,
            facts_policies,
            listeners,
            extensions,
        } = plugins;
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = metrics::Metrics::default();
        metrics.register(&mut registry);
        for p in &resources {
            p.register_metrics(&mut registry);
        }
        for e in &extensions {
            e.register_metrics(&mut registry);
        }
        role.register(&mut registry);
        let timing = core::Timing {
            heartbeat_interval: cfg.heartbeat_interval,
            unreachable_after: cfg.unreachable_after,
            grace_period: cfg.grace_period,
            disruption_threshold: cfg.disruption_threshold,
        };
        let mut core = core::Core::load(
            timing,
            store,
            core::Wiring {
                resources,
                policies: facts_policies,
                listeners,
            },
            metrics,
            tokio::time::Instant::now(),
        )
        .context("cannot load the controller state from the store")?;
        core.set_quotas(cfg.quotas.clone());
        let view = core.view();
        let cluster_id: Arc<str> = core.cluster_id().into();
        let (tx, rx) = mpsc::channel(256);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (fatal_tx, fatal) = watch::channel(None);
        let task = tokio::spawn(task::run(core, rx, shutdown_rx.clone(), fatal_tx));
        let worker_hosts = tokens.workers().iter().map(|w| w.host.clone()).collect();
        let api = api::ApiState {
            tx,
            view,
            worker_hosts: Arc::new(worker_hosts),
            ctx: ApiContext {
                auth: Arc::new(tokens),
            },
            registry: Arc::new(registry),
            extensions,
            body_limit: cfg.body_limit,
            shutdown: shutdown_rx,
            cluster_id,
        };
        Ok(Self {
            api,
            shutdown,
            task,
            fatal,
        })
    }

    /// Resolves, with the reason, when the controller stopped itself because the store
    /// said its view is stale ([`crate::store::StoreError::Stale`]: another writer, a lost
    /// leadership, a commit reported failed that landed after all). Every change would fail
    /// from then on, so its state task has ended; the caller should exit (a standby, or a
    /// restart, reloads from the store). Never resolves otherwise.
    pub async fn failed(&self) -> String {
        let mut fatal = self.fatal.clone();
        let reason = match fatal.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The task ended for another reason (shutdown): nothing to report, ever.
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// The apiserver's routes (see [`router`]).
    pub fn router(&self) -> axum::Router {
        router(self)
    }

    /// Stops the state task (pending blocking queries answer at once, the extensions'
    /// watches end: see [`ApiExtension::drain`]) and waits for it. The store is released
    /// when this returns, unless a router still holds a handle.
    pub async fn shutdown(self) {
        self.drain();
        let _ = self.task.await;
    }

    /// Tells the state task, the server and the extensions to stop: blocking queries
    /// answer with the current state, streams end, the listener closes.
    fn drain(&self) {
        let _ = self.shutdown.send(true);
        for e in &self.api.extensions {
            e.drain();
        }
    }
}

/// The whole apiserver: `/healthz`, `/metrics`, `/v1` services and hosts, the
/// `/internal/v1` worker routes, and every extension's routes, with the [`ApiContext`]
/// installed as a request extension (so `plugin_api::Principal` works everywhere) and the
/// body limit answering 413 in the JSON error shape.
pub fn router(controller: &Controller) -> axum::Router {
    api::build(controller.api.clone())
}

/// A controller serving on a socket.
#[derive(Debug)]
pub struct RunningController {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    controller: Controller,
    server: JoinHandle<std::io::Result<()>>,
}

/// Builds the controller (see [`Controller::new`]), binds `cfg.listen` and serves.
pub async fn start(
    cfg: ControllerConfig,
    tokens: Tokens,
    plugins: ControllerPlugins,
    store: Arc<dyn Store>,
) -> anyhow::Result<RunningController> {
    let controller = Controller::new(&cfg, tokens, plugins, store).await?;
    serving(cfg, controller)
}

/// [`start`] for an elected controller (see [`Controller::with_role`]).
pub async fn start_with_role(
    cfg: ControllerConfig,
    tokens: Tokens,
    plugins: ControllerPlugins,
    store: Arc<dyn Store>,
    role: &standby::Role,
) -> anyhow::Result<RunningController> {
    let controller = Controller::with_role(&cfg, tokens, plugins, store, role).await?;
    serving(cfg, controller)
}

fn serving(cfg: ControllerConfig, controller: Controller) -> anyhow::Result<RunningController> {
    let (addr, server) = serve(
        cfg.listen,
        controller.router(),
        cfg.connections,
        controller.shutdown.subscribe(),
    )?;
    Ok(RunningController {
        addr,
        controller,
        server,
    })
}

impl RunningController {
    /// See [`Controller::failed`].
    pub async fn failed(&self) -> String {
        self.controller.failed().await
    }

    /// Stops serving and stops the state task: the listener closes, blocking queries
    /// answer at once with the current state, streams end, other requests in flight get
    /// up to `connections.drain_timeout` to finish before their connections are dropped.
    pub async fn shutdown(self) {
        self.controller.drain();
        let _ = self.server.await;
        self.controller.shutdown().await;
    }

    /// Serves until the server fails (it does not stop by itself otherwise).
    pub async fn wait(self) -> anyhow::Result<()> {
        let r = self.server.await;
        self.controller.shutdown().await;
        r.context("apiserver task panicked")?
            .context("apiserver failed")
    }
}
