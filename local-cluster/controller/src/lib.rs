//! The controller: cluster state, the scheduler, and the apiserver's host routes.
//!
//! ```text
//!  HTTP ──► api/ handlers ──Command──► task.rs (one task) ──► core/ (sync state machine)
//!             ▲                                                 │ model.rs Txn → Store
//!             └──── watch<View> / watch<Assignments> ◄──────────┘ scheduler.rs (pure)
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
mod config;
mod core;
mod metrics;
pub mod quota;
mod scheduler;
pub mod standby;
mod task;
#[cfg(test)]
mod tests;

pub use config::{
    ConfigError, ControllerConfig, DisruptionThreshold, DEFAULT_DRAIN_ACK_TIMEOUT,
    MIN_DRAIN_ACK_TIMEOUT,
};

use anyhow::Context as _;
use plugin_api::{ApiContext, ApiExtension, ClusterListener, HostFactsPolicy, ResourcePlugin};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use xce_serve::keyring::Keyring;
use xce_serve::serve;
use xce_store::Store;

/// The registry `/metrics` serves: the controller's own metrics, the tokens', the
/// plugins', the standby role's and the serving layer's.
fn registry(
    metrics: &metrics::Metrics,
    keyring: &Keyring,
    resources: &[Box<dyn ResourcePlugin>],
    extensions: &[Arc<dyn ApiExtension>],
    role: &standby::Role,
) -> prometheus_client::registry::Registry {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    keyring.register(&mut registry);
    for p in resources {
        p.register_metrics(&mut registry);
    }
    for e in extensions {
        e.register_metrics(&mut registry);
    }
    role.register(&mut registry);
    xce_serve::register_metrics(&mut registry);
    xce_serve::version::register_build_info(&mut registry);
    registry
}

/// What a store is, for a backup's header: one that others follow is etcd, the embedded
/// one redb.
fn store_kind(store: &dyn Store) -> &'static str {
    if store.journals_events() {
        "etcd"
    } else {
        "redb"
    }
}

/// Creates `cfg.data_dir` if needed and opens the embedded store in it.
pub fn open_store(cfg: &ControllerConfig) -> anyhow::Result<Arc<dyn Store>> {
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("cannot create data dir {}", cfg.data_dir.display()))?;
    let path = cfg.store_path();
    let store = xce_store::RedbStore::open(&path)
        .with_context(|| format!("cannot open the controller store {}", path.display()))?;
    Ok(Arc::new(store))
}

/// The plugins the integrator wires in (through the `plugin-api` traits only).
#[derive(Default)]
pub struct ControllerPlugins {
    /// Consumable resources the scheduler allocates (e.g. ports). None may be named like a
    /// field of a job or a host in the answers (`state`, `id`, …): its summaries are shown
    /// beside those fields, so the controller refuses such a plugin at start.
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
    /// metric, and spawns the state task. Must run inside a tokio runtime. Refuses a
    /// resource plugin named like a field of the job or host answers, beside which its
    /// summaries are shown (`xce_wire::summaries::check_plugin_name`), and two resource
    /// plugins of one name.
    pub async fn new(
        cfg: &ControllerConfig,
        tokens: impl Into<Keyring>,
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
        tokens: impl Into<Keyring>,
        plugins: ControllerPlugins,
        store: Arc<dyn Store>,
        role: &standby::Role,
    ) -> anyhow::Result<Self> {
        Self::with_job_tag(cfg, tokens, plugins, store, role, xce_model::job_tag).await
    }

    /// [`with_role`](Self::with_role), the job ids of this load tagged by `job_tag`: a
    /// random tag in every real controller (so a store that went back repeats no id),
    /// none in the unit tests whose expectations name plain `j-<n>` ids.
    pub(crate) async fn with_job_tag(
        cfg: &ControllerConfig,
        tokens: impl Into<Keyring>,
        plugins: ControllerPlugins,
        store: Arc<dyn Store>,
        role: &standby::Role,
        job_tag: fn() -> String,
    ) -> anyhow::Result<Self> {
        let keyring = tokens.into();
        cfg.validate().context("invalid controller config")?;
        let ControllerPlugins {
            resources,
            facts_policies,
            listeners,
            extensions,
        } = plugins;
        check_plugin_names(&resources)?;
        let metrics = metrics::Metrics::default();
        let registry = registry(&metrics, &keyring, &resources, &extensions, role);
        let timing = core::Timing {
            heartbeat_interval: cfg.heartbeat_interval,
            unreachable_after: cfg.unreachable_after,
            grace_period: cfg.grace_period,
            disruption_threshold: cfg.disruption_threshold,
            drain_ack_timeout: cfg.drain_ack_timeout,
        };
        let mut core = core::Core::load(
            timing,
            store.clone(),
            core::Wiring {
                resources,
                policies: facts_policies,
                listeners,
                job_tag,
            },
            metrics,
            tokio::time::Instant::now(),
        )
        .context("cannot load the controller state from the store")?;
        core.upgrade_format(cfg.store_format, tokio::time::Instant::now());
        core.set_quotas(cfg.quotas.clone());
        core.watch_pauses()
            .context("cannot start the controller's pause-detection thread")?;
        let view = core.view();
        let cluster_id: Arc<str> = core.cluster_id().into();
        let (tx, rx) = mpsc::channel(256);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (fatal_tx, fatal) = watch::channel(None);
        let task = task::spawn(task::run(core, rx, shutdown_rx.clone(), fatal_tx));
        let api = api::ApiState {
            tx,
            view,
            ctx: ApiContext {
                auth: Arc::new(keyring.clone()),
            },
            keyring,
            registry: Arc::new(registry),
            extensions,
            body_limit: cfg.body_limit,
            metrics: cfg.metrics,
            dns_ttl: cfg.dns_ttl,
            shutdown: shutdown_rx,
            cluster_id,
            store_kind: store_kind(&*store),
            store,
        };
        Ok(Self {
            api,
            shutdown,
            task,
            fatal,
        })
    }

    /// Resolves, with the reason, when the controller stopped itself because the store
    /// said its view is stale ([`xce_store::StoreError::Stale`]: another writer, a lost
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

    /// Follows the separate apiservers' registrations in `store`'s etcd
    /// (`xce_store::etcd::fleet`) until the controller shuts down: a draining replica then
    /// gets SIGTERM only once every live apiserver has applied its removal, or
    /// `drain_ack_timeout` ran out. For the leader on an etcd store; without it (the
    /// embedded store) no drain waits for anything but `drain`.
    pub fn follow_fleet(&self, store: Arc<xce_store::EtcdStore>) {
        let tx = self.api.tx.clone();
        let mut shutdown = self.api.shutdown.clone();
        let (fleet_tx, mut fleet_rx) = watch::channel(Vec::new());
        tokio::spawn(async move {
            let follow = xce_store::etcd::fleet::follow(store, move |regs| {
                fleet_tx.send_replace(regs);
            });
            // The newest fleet only: a burst of registration changes is one command.
            let forward = async {
                while fleet_rx.changed().await.is_ok() {
                    let registrations = fleet_rx.borrow_and_update().clone();
                    if tx
                        .send(task::Command::Fleet { registrations })
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            };
            tokio::select! {
                () = follow => {}
                () = forward => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
        });
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
    tokens: impl Into<Keyring>,
    plugins: ControllerPlugins,
    store: Arc<dyn Store>,
) -> anyhow::Result<RunningController> {
    let controller = Controller::new(&cfg, tokens, plugins, store).await?;
    serving(cfg, controller)
}

/// [`start`] for an elected controller (see [`Controller::with_role`]).
pub async fn start_with_role(
    cfg: ControllerConfig,
    tokens: impl Into<Keyring>,
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
        cfg.tls,
        controller.shutdown.subscribe(),
    )?;
    Ok(RunningController {
        addr,
        controller,
        server,
    })
}

impl RunningController {
    /// See [`Controller::follow_fleet`].
    pub fn follow_fleet(&self, store: Arc<xce_store::EtcdStore>) {
        self.controller.follow_fleet(store);
    }

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

    /// Stops like [`shutdown`](Self::shutdown), for a term whose leadership is lost, but
    /// waits at most `wait` for the server and the state task. The listener closes at
    /// once either way; a state task blocked in a commit on a slow store (etcd without a
    /// quorum holds it for as long as that lasts) is left to end by itself: that commit
    /// is refused by the leader guard once another leader holds the key, or landed while
    /// this term still held it, and the task stops as soon as it returns. Requests still
    /// in flight keep the rest of their `drain_timeout`. `true`: everything stopped.
    pub async fn step_down(self, wait: std::time::Duration) -> bool {
        self.controller.drain();
        let stopped = async {
            let _ = self.server.await;
            self.controller.shutdown().await;
        };
        tokio::time::timeout(wait, stopped).await.is_ok()
    }

    /// Serves until the server fails (it does not stop by itself otherwise).
    pub async fn wait(self) -> anyhow::Result<()> {
        let r = self.server.await;
        self.controller.shutdown().await;
        r.context("apiserver task panicked")?
            .context("apiserver failed")
    }
}

/// A plugin's summaries are keys beside the job's and the host's own fields in the answers:
/// a plugin named like one of them would be lost (or hide the field). Grants, profile
/// sections and summaries are keyed by plugin name: two plugins of one name would overwrite
/// each other's.
fn check_plugin_names(resources: &[Box<dyn ResourcePlugin>]) -> anyhow::Result<()> {
    let mut names = std::collections::BTreeSet::new();
    for p in resources {
        xce_wire::summaries::check_plugin_name(p.name())
            .context("cannot load the controller's resource plugins")?;
        if !names.insert(p.name()) {
            anyhow::bail!(
                "cannot load the controller's resource plugins: two plugins are named {:?}; \
                 grants, profile sections and summaries are keyed by plugin name",
                p.name()
            );
        }
    }
    Ok(())
}
