//! Host maintenance: `POST /v1/hosts/{id}/cordon|uncordon|drain` (admin: it moves every
//! tenant's replicas), answered with the host as `GET /v1/hosts` lists it. (A worker's
//! `POST /internal/v1/hosts/{host}/leave` is in `worker.rs`, with the worker protocol.)

use super::state::ApiState;
use crate::core::{HostAction, HostView};
use crate::task::Command;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use plugin_api::{ApiError, Principal};
use std::borrow::Cow;
use std::time::{Duration, UNIX_EPOCH};
use xce_model::maintenance::Mode;
use xce_wire::hosts::{HostAddress, HostAnswer, HostMaintenance, ServiceLeft};

pub(super) fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/hosts/{id}/cordon", post(cordon))
        .route("/v1/hosts/{id}/uncordon", post(uncordon))
        .route("/v1/hosts/{id}/drain", post(drain))
        .with_state(state)
}

/// A host as `GET /v1/hosts` lists it (and the maintenance routes answer).
pub(super) fn host_answer(h: &HostView) -> HostAnswer<'_> {
    HostAnswer {
        addresses: h
            .info
            .facts
            .addresses
            .iter()
            .map(HostAddress::from)
            .collect(),
        id: Cow::Borrowed(&h.info.id),
        ip_addr: h.info.facts.ip_addr,
        jobs: u32::try_from(h.jobs).unwrap_or(u32::MAX),
        maintenance: maintenance_answer(h),
        state: Cow::Owned(h.info.state.to_string()),
        summaries: Cow::Borrowed(&h.summaries),
    }
}

/// The `maintenance` of a host's answer: its state (a drain with nothing left is
/// `drained`), who asked when, and what is left on it per service.
pub(super) fn maintenance_answer(h: &HostView) -> Option<HostMaintenance<'_>> {
    let m = h.maintenance.as_ref()?;
    let state = match m.mode {
        Mode::Cordon => "cordoned",
        Mode::Drain if h.jobs == 0 => "drained",
        Mode::Drain => "draining",
    };
    let since = UNIX_EPOCH + Duration::from_secs(m.since);
    Some(HostMaintenance {
        by: Cow::Borrowed(&m.by),
        left: u32::try_from(h.jobs).unwrap_or(u32::MAX),
        leave: m.leave,
        services: h
            .left
            .iter()
            .map(|(k, n)| ServiceLeft {
                name: Cow::Borrowed(&k.name),
                project: Cow::Borrowed(&k.project),
                replicas: u32::try_from(*n).unwrap_or(u32::MAX),
            })
            .collect(),
        since: Cow::Owned(humantime::format_rfc3339_seconds(since).to_string()),
        state: Cow::Borrowed(state),
    })
}

async fn cordon(
    st: State<ApiState>,
    who: Principal,
    id: Path<String>,
) -> Result<Response, ApiError> {
    maintain(st, who, id, HostAction::Cordon).await
}

async fn uncordon(
    st: State<ApiState>,
    who: Principal,
    id: Path<String>,
) -> Result<Response, ApiError> {
    maintain(st, who, id, HostAction::Uncordon).await
}

async fn drain(
    st: State<ApiState>,
    who: Principal,
    id: Path<String>,
) -> Result<Response, ApiError> {
    maintain(st, who, id, HostAction::Drain).await
}

/// Applies `action` to host `id` and answers with the host as it is once the scheduling
/// pass that followed has run (a drain's first replacements are placed by then).
async fn maintain(
    State(st): State<ApiState>,
    who: Principal,
    Path(id): Path<String>,
    action: HostAction,
) -> Result<Response, ApiError> {
    if !who.is_admin() {
        return Err(ApiError::forbidden(format!(
            "POST /v1/hosts/{{id}}/{} moves every project's replicas: it needs the admin permission on \"*\", which {:?} does not hold",
            action.as_str(),
            who.name
        )));
    }
    let host = id.clone();
    st.call(|reply| Command::Maintain {
        host,
        action,
        who,
        reply,
    })
    .await?;
    let view = st.view()?;
    let h = view.hosts.iter().find(|h| h.info.id == id).ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "not_found",
            format!("host {id:?} is not registered"),
        )
    })?;
    Ok(Json(host_answer(h)).into_response())
}
