//! What the handlers share: the [`ApiState`], the call into the state task, and how the
//! core's errors become answers.

use crate::core::{CoreError, View};
use crate::task::Command;
use axum::http::StatusCode;
use plugin_api::{ApiContext, ApiError, ApiExtension, FieldError, Parked, Principal};
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Cap of `wait` on every blocking query (a service's detail, a host's assignments).
const WAIT_MAX: Duration = Duration::from_secs(600);

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub(crate) tx: mpsc::Sender<Command>,
    pub(crate) view: watch::Receiver<Arc<View>>,
    pub(crate) ctx: ApiContext,
    pub(crate) registry: Arc<Registry>,
    pub(crate) extensions: Vec<Arc<dyn ApiExtension>>,
    pub(crate) body_limit: usize,
    pub(crate) shutdown: watch::Receiver<bool>,
    /// The cluster's identity (on `/healthz`, `/v1/hosts` and every `/internal/v1`
    /// answer).
    pub(crate) cluster_id: Arc<str>,
    /// The tokens in force (also `ctx.auth`): a refused worker is told whether its secret
    /// is wrong or its host has no `[[worker]]` entry at all.
    pub(crate) keyring: xce_serve::keyring::Keyring,
    /// The store the state task writes, for `GET /v1/store/backup` (a read transaction
    /// of its own; never a write).
    pub(crate) store: Arc<dyn xce_store::Store>,
    /// What the store is (`redb`, `etcd`), written into a backup's header.
    pub(crate) store_kind: &'static str,
    /// Who may read `/metrics`.
    pub(crate) metrics: xce_serve::auth::MetricsConfig,
    /// See [`crate::ControllerConfig::dns_ttl`].
    pub(crate) dns_ttl: Option<std::time::Duration>,
}

impl ApiState {
    /// Counts a parked request of `who` against the extensions' watcher caps
    /// ([`ApiExtension::park`]): the places to hold while it waits, or the refusal (429).
    pub(crate) fn park(&self, who: &Principal) -> Result<Vec<Parked>, ApiError> {
        self.extensions.iter().filter_map(|e| e.park(who)).collect()
    }
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

pub(super) fn internal(msg: &str) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", msg)
}

pub(super) fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the controller is shutting down",
    )
}

pub(super) fn from_core(e: CoreError) -> ApiError {
    match e {
        CoreError::ServiceNotFound(name) => ApiError::service_not_found(&name),
        CoreError::Forbidden(m) => ApiError::forbidden(m),
        CoreError::Conflict(name) => ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("service {name:?} already exists"),
        ),
        CoreError::Invalid(details) => ApiError::invalid("invalid profile", details),
        // Its own code: a client tells the user to wait, not to stop it (it is stopping).
        CoreError::Refused(m) => ApiError::new(StatusCode::CONFLICT, "stopping", m),
        CoreError::Quota(e) => ApiError {
            details: vec![FieldError::new(
                format!("quotas.{}.{}", e.project, e.quota),
                format!(
                    "limit {}, in use {}, this change needs {}",
                    e.limit, e.used, e.wanted
                ),
            )],
            ..ApiError::new(StatusCode::FORBIDDEN, "quota_exceeded", e.to_string())
        },
        CoreError::FactsRefused(details) => ApiError::invalid("host facts refused", details),
        e @ CoreError::AddressTaken { .. } => ApiError {
            details: vec![FieldError::new("ip_addr", e.to_string())],
            ..ApiError::new(StatusCode::CONFLICT, "address_in_use", "host facts refused")
        },
        e @ CoreError::HostTaken { .. } => {
            ApiError::new(StatusCode::CONFLICT, "host_taken", e.to_string())
        }
        e @ CoreError::SessionRequired(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "session_required", e.to_string())
        }
        e @ CoreError::SessionInvalid(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "session_invalid", e.to_string())
        }
        e @ CoreError::DigestRequired => ApiError::invalid(
            "invalid heartbeat",
            vec![FieldError::new("body", e.to_string())],
        ),
        CoreError::NoEntropy(_) => internal("the controller could not make a session secret"),
        e @ CoreError::WrongCluster { .. } => {
            ApiError::new(StatusCode::CONFLICT, "wrong_cluster", e.to_string())
        }
        CoreError::UnknownHost(h) => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("host {h:?} is not registered"),
        ),
        // Internals are logged where they happen and never exposed.
        CoreError::Store(xce_store::StoreError::Io { no_space: true, .. }) => ApiError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "insufficient_storage",
            "the controller could not persist the change: no space left on its store's device; \
             the change was not acknowledged (a failed write may still have landed: check after \
             the restart), and the controller stops so a supervisor restarts it",
        ),
        CoreError::Store(_) => internal("the controller could not persist the change"),
    }
}

impl ApiState {
    pub(super) async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, CoreError>>) -> Command,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).await.map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())?.map_err(from_core)
    }

    /// The readers' view, while the state task runs: once it has stopped (shutdown, or a
    /// store that went stale under it) the view is no longer kept current, so nobody is
    /// served from it.
    pub(super) fn view(&self) -> Result<Arc<View>, ApiError> {
        if self.tx.is_closed() {
            return Err(unavailable());
        }
        Ok(self.view.borrow().clone())
    }
}

/// The `?index=N&wait=D` of a blocking query: `index` is 0 when absent, `wait` is
/// `default_wait` when absent and at most [`WAIT_MAX`].
pub(super) fn blocking_query(
    q: &HashMap<String, String>,
    default_wait: Duration,
) -> Result<(u64, Duration), ApiError> {
    let index: u64 = match q.get("index") {
        None => 0,
        Some(s) => s
            .parse()
            .map_err(|_| ApiError::bad_param("index", "must be a non-negative integer"))?,
    };
    let wait = match q.get("wait") {
        None => default_wait,
        Some(s) => humantime::parse_duration(s)
            .map_err(|e| ApiError::bad_param("wait", format!("not a duration ({e})")))?
            .min(WAIT_MAX),
    };
    Ok((index, wait))
}
