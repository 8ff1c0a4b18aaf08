//! The `/internal/v1/hosts/{host}/…` routes of the worker protocol ([`xce_proto::worker`]):
//! only the worker credential of that host reaches them, and every answer names the
//! cluster.

use super::state::{blocking_query, from_core, unavailable, ApiState};
use crate::core::{HostAssignments, Report};
use crate::task::Command;
use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use plugin_api::{
    ApiError, AuthError, Credential, FieldError, HostFacts, Principal, PrincipalKind,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use xce_proto::worker::{
    Caller, Heartbeat, RegisterRequest, WorkerEvent, CLUSTER_HEADER, INSTANCE_HEADER,
    SESSION_HEADER,
};

/// Default `wait` of the assignments blocking query.
const WAIT_DEFAULT: Duration = Duration::from_secs(30);

/// The `/internal/v1` routes: the worker protocol, for each host's worker.
pub(super) fn router(state: ApiState) -> Router {
    // Every worker-protocol answer, refusals included, names the cluster: a worker takes
    // no answer (and no order) from another cluster's controller.
    let cluster = HeaderValue::from_str(&state.cluster_id).ok();
    Router::new()
        .route("/internal/v1/hosts/{host}/register", post(register))
        .route("/internal/v1/hosts/{host}/heartbeat", post(heartbeat))
        .route("/internal/v1/hosts/{host}/facts", put(facts))
        .route("/internal/v1/hosts/{host}/assignments", get(assignments))
        .route("/internal/v1/hosts/{host}/events", post(events))
        .route("/internal/v1/hosts/{host}/leave", post(leave))
        .with_state(state)
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let cluster = cluster.clone();
            async move {
                if let Some(c) = cluster {
                    r.headers_mut().insert(CLUSTER_HEADER, c);
                }
                r
            }
        }))
}

/// The worker of `host` only. A refusal says what is wrong, so the operator reading the
/// worker's log knows what to fix: 401 `unauthenticated` is a wrong (or missing) secret
/// for a host the tokens file has a `[[worker]]` entry for; `no_worker_entry` (401 with a
/// secret that matches nothing, 403 with another host's credential) is a host the tokens
/// file has no entry for; 403 `forbidden` another host's credential, or a user token.
/// Host ids are not secrets (every viewer lists them), so telling which hosts have an
/// entry gives nothing away.
fn worker_of(
    st: &ApiState,
    who: Result<Principal, ApiError>,
    host: &str,
) -> Result<Principal, ApiError> {
    let has_entry = st.keyring.has_worker(host);
    let no_entry = format!("no [[worker]] entry for host {host:?} in the controller's tokens file");
    let p = match who {
        Ok(p) => p,
        Err(e) if e.status == StatusCode::UNAUTHORIZED && has_entry => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                format!(
                    "wrong or missing secret for the worker of host {host:?} ({})",
                    e.message
                ),
            ))
        }
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "no_worker_entry",
                format!("{no_entry} ({})", e.message),
            ))
        }
        Err(e) => return Err(e),
    };
    match &p.kind {
        PrincipalKind::Worker { host: h } if h == host => Ok(p),
        PrincipalKind::Worker { host: h } if has_entry => Err(ApiError::forbidden(format!(
            "a worker may act for its own host only: this credential is host {h:?}'s, not host {host:?}'s"
        ))),
        PrincipalKind::Worker { host: h } => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "no_worker_entry",
            format!("{no_entry} (this credential is host {h:?}'s)"),
        )),
        PrincipalKind::User => Err(ApiError::forbidden(
            "the worker api needs a worker credential (a [[worker]] secret), not a user token",
        )),
    }
}

// --- /internal/v1 ---

fn json_body<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(
            "invalid request body",
            vec![FieldError::new("body", e.to_string())],
        )
    })
}

/// A worker-protocol request, as every handler needs it: the credential checked for the
/// `{host}` of the path ([`worker_of`]), and the sender (its identity headers and its
/// connection's peer, for the host-holder and cluster checks and the logs).
struct WorkerCall {
    host: String,
    caller: Caller,
    /// The worker credential, followed across reloads of the tokens (the assignments
    /// blocking query ends when it is removed).
    credential: Credential,
}

impl FromRequestParts<ApiState> for WorkerCall {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &ApiState) -> Result<Self, ApiError> {
        let who = Principal::from_request_parts(parts, st).await;
        let Path(host) = Path::<String>::from_request_parts(parts, st)
            .await
            .map_err(|e| ApiError::bad_param("host", e.body_text()))?;
        let who = worker_of(st, who, &host);
        let header = |name: &str| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .map(str::to_owned)
        };
        let caller = Caller {
            instance: header(INSTANCE_HEADER),
            cluster: header(CLUSTER_HEADER),
            session: header(SESSION_HEADER),
            peer: parts
                .extensions
                .get::<xce_serve::Peer>()
                .map(|p| p.0.to_string()),
        };
        let who = who?;
        Ok(WorkerCall {
            host,
            caller,
            credential: who.credential,
        })
    }
}

async fn register(
    State(st): State<ApiState>,
    WorkerCall { host, caller, .. }: WorkerCall,
    body: Bytes,
) -> Result<Json<xce_proto::worker::RegisterResponse>, ApiError> {
    let req: RegisterRequest = json_body(&body)?;
    let resp = st
        .call(|reply| Command::Register {
            host,
            caller,
            req,
            reply,
        })
        .await?;
    Ok(Json(resp))
}

/// 204 when the worker's digests match what the controller holds (or it sent none: a
/// worker without a session), else 200 with what differs.
async fn heartbeat(
    State(st): State<ApiState>,
    WorkerCall { host, caller, .. }: WorkerCall,
    body: Bytes,
) -> Result<Response, ApiError> {
    let beat: Option<Heartbeat> = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(json_body(&body)?)
    };
    let answer = st
        .call(|reply| Command::Heartbeat {
            host,
            caller,
            beat,
            reply,
        })
        .await?;
    Ok(match answer {
        None => StatusCode::NO_CONTENT.into_response(),
        Some(a) => Json(a).into_response(),
    })
}

async fn facts(
    State(st): State<ApiState>,
    WorkerCall { host, caller, .. }: WorkerCall,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let facts: HostFacts = json_body(&body)?;
    st.call(|reply| Command::Facts {
        host,
        caller,
        facts,
        reply,
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn events(
    State(st): State<ApiState>,
    WorkerCall { host, caller, .. }: WorkerCall,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let events: Vec<WorkerEvent> = json_body(&body)?;
    st.call(|reply| Command::Events {
        report: Report {
            host,
            caller,
            events,
        },
        reply,
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `?index=N&wait=30s`: answers when the host's index differs from N (normally: is
/// greater; a smaller one means the controller's state was replaced), or when `wait`
/// runs out.
async fn assignments(
    State(st): State<ApiState>,
    WorkerCall {
        host,
        caller,
        credential,
    }: WorkerCall,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let (index, wait) = blocking_query(&q, WAIT_DEFAULT)?;
    let (tx, rx) = oneshot::channel();
    st.tx
        .send(Command::Assignments {
            host,
            caller,
            reply: tx,
        })
        .await
        .map_err(|_| unavailable())?;
    let mut rx = rx.await.map_err(|_| unavailable())?.map_err(from_core)?;
    let current = rx.borrow_and_update().index;
    if current == index {
        let mut shutdown = st.shutdown.clone();
        tokio::select! {
            _ = rx.changed() => {}
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|s| *s) => {}
            // The credential was removed by a reload of the tokens: 401 now, as the
            // worker's next request would be.
            () = credential.removed() => {
                return Err(ApiError::unauthenticated(AuthError::Revoked));
            }
        }
    }
    // Written out from the shared records (`core/assign.rs`): the same bytes as
    // `Assignments`.
    let a: Arc<HostAssignments> = rx.borrow().clone();
    let mut resp = Json(&*a).into_response();
    if let Ok(v) = HeaderValue::from_str(&a.index.to_string()) {
        resp.headers_mut().insert("x-xce-index", v);
    }
    Ok(resp)
}

/// A worker leaving: its host drains; the answer says how many live replicas are left
/// on it (the worker asks again until none is).
async fn leave(
    State(st): State<ApiState>,
    WorkerCall { host, caller, .. }: WorkerCall,
) -> Result<Json<xce_proto::worker::LeaveAnswer>, ApiError> {
    let status = st
        .call(|reply| Command::Leave {
            host,
            caller,
            reply,
        })
        .await?;
    Ok(Json(xce_proto::worker::LeaveAnswer {
        left: u32::try_from(status.left).unwrap_or(u32::MAX),
    }))
}
