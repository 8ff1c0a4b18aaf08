//! The apiserver: `/healthz`, `/metrics`, the `/v1` service and host routes
//! (`services.rs`), the `/internal/v1` worker routes of [`xce_proto::worker`] (`worker.rs`), and
//! every extension's routes; what the handlers share is in `state.rs`.
//!
//! Handlers authenticate with the [`Principal`](plugin_api::Principal) extractor, read
//! the state task's latest [`View`](crate::core::View) for queries and send
//! commands for changes. Errors are [`ApiError`] JSON; client mistakes are logged at debug
//! level only.

// Visible to the controller: its tests render replica slots with `replica_json` and
// compare `service_detail` written directly with its tree.
mod backup;
mod hosts;
pub(super) mod services;
mod skew;
mod state;
mod worker;

pub(crate) use state::ApiState;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use plugin_api::{ApiError, Principal};
use xce_proto::worker::CLUSTER_HEADER;
use xce_serve::{json_errors, metrics_response};

/// Builds the whole apiserver router.
pub(crate) fn build(state: ApiState) -> Router {
    let limit = state.body_limit;
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .with_state(state.clone())
        .merge(services::router(state.clone()))
        .merge(backup::router(state.clone()))
        .merge(hosts::router(state.clone()))
        .merge(worker::router(state.clone()));
    for ext in &state.extensions {
        app = app.merge(ext.router(state.ctx.clone()));
    }
    app.fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        // Before any route does anything: a peer outside the version skew is refused.
        .layer(axum::middleware::from_fn(skew::check))
        .layer(axum::middleware::map_response(
            move |r: Response| async move { json_errors(r, limit) },
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(Extension(state.ctx.clone()))
        // Outermost: it logs the answers every other layer and extractor gave.
        .layer(axum::middleware::from_fn_with_state(
            state.ctx.clone(),
            xce_serve::audit::layer,
        ))
}

// --- /healthz ---

/// 200 `ok` while the state task runs (so changes can be committed); 503 once it has
/// stopped (a store that went stale or cannot write, or shutdown): a load balancer or a
/// supervisor sees it. The first line is `ok`; the second names the cluster
/// (`cluster: <id>`), also in the `X-Xce-Cluster` header; then `version:` and `commit:`.
async fn healthz(State(st): State<ApiState>) -> Response {
    if st.tx.is_closed() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the controller cannot commit changes (its state task has stopped)",
        )
        .into_response();
    }
    (
        [(CLUSTER_HEADER, st.cluster_id.to_string())],
        format!(
            "ok\ncluster: {}\n{}",
            st.cluster_id,
            xce_serve::version::health_lines()
        ),
    )
        .into_response()
}

// --- /metrics ---

/// Its labels name every tenant's projects and services: `metrics.view` (or `admin`)
/// unless `[metrics] public = true`.
async fn metrics(State(st): State<ApiState>, who: Result<Principal, ApiError>) -> Response {
    match st.metrics.admit(who) {
        Ok(()) => metrics_response(&st.registry),
        Err(e) => e.into_response(),
    }
}
