//! The apiserver: `/healthz`, `/metrics`, the `/v1` service and host routes, the
//! `/internal/v1` worker routes of [`crate::proto`], and every extension's routes.
//!
//! Handlers authenticate with the [`Principal`] extractor, read the state task's latest
//! [`View`] for queries and send commands for changes. Errors are [`ApiError`] JSON;
//! client mistakes are logged at debug level only.

use super::core::{Applied, CoreError, HostView, JobView, ServiceView, View};
use super::model::ServiceState;
use super::task::Command;
use crate::proto::{
    Assignments, Caller, RegisterRequest, WorkerEvent, CLUSTER_HEADER, INSTANCE_HEADER,
};
use crate::serve::{json_errors, metrics_response};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};
use plugin_api::{
    ApiContext, ApiError, ApiExtension, FieldError, HostFacts, JobState, Permission, Principal,
    PrincipalKind, Resolved, ServiceKey,
};
use prometheus_client::registry::Registry;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// Default and cap of `wait` on the assignments blocking query.
const WAIT_DEFAULT: Duration = Duration::from_secs(30);
const WAIT_MAX: Duration = Duration::from_secs(600);
/// Default `wait` of the service detail's blocking query (as the endpoint queries').
const DETAIL_WAIT_DEFAULT: Duration = Duration::from_secs(300);

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
    /// The hosts the tokens file has a `[[worker]]` entry for: a refused worker is told
    /// whether its secret is wrong or its host has no entry at all.
    pub(crate) worker_hosts: Arc<std::collections::BTreeSet<String>>,
}

impl std::fmt::Debug for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiState").finish_non_exhaustive()
    }
}

/// Builds the whole apiserver router.
pub(crate) fn build(state: ApiState) -> Router {
    let limit = state.body_limit;
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/services", post(submit).get(list_services))
        .route("/v1/services/{name}/scale", post(scale_service))
        .route("/v1/services/{name}/restart", post(restart_service))
        .route(
            "/v1/services/{name}",
            get(get_service).put(put_service).delete(delete_service),
        )
        .route("/v1/hosts", get(list_hosts))
        .with_state(state.clone());
    // Every worker-protocol answer, refusals included, names the cluster: a worker takes
    // no answer (and no order) from another cluster's controller.
    let cluster = HeaderValue::from_str(&state.cluster_id).ok();
    let internal = Router::new()
        .route("/internal/v1/hosts/{host}/register", post(register))
        .route("/internal/v1/hosts/{host}/heartbeat", post(heartbeat))
        .route("/internal/v1/hosts/{host}/facts", put(facts))
        .route("/internal/v1/hosts/{host}/assignments", get(assignments))
        .route("/internal/v1/hosts/{host}/events", post(events))
        .with_state(state.clone())
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let cluster = cluster.clone();
            async move {
                if let Some(c) = cluster {
                    r.headers_mut().insert(CLUSTER_HEADER, c);
                }
                r
            }
        }));
    app = app.merge(internal);
    for ext in &state.extensions {
        app = app.merge(ext.router(state.ctx.clone()));
    }
    app.fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .layer(axum::middleware::map_response(
            move |r: Response| async move { json_errors(r, limit) },
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(Extension(state.ctx.clone()))
}

fn internal(msg: &str) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", msg)
}

fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "the controller is shutting down",
    )
}

fn from_core(e: CoreError) -> ApiError {
    match e {
        CoreError::ServiceNotFound(name) => ApiError::service_not_found(&name),
        CoreError::Forbidden(m) => ApiError::forbidden(m),
        CoreError::Conflict(name) => ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("service {name:?} already exists"),
        ),
        CoreError::Invalid(details) => ApiError::invalid("invalid profile", details),
        CoreError::Refused(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
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
        e @ CoreError::WrongCluster { .. } => {
            ApiError::new(StatusCode::CONFLICT, "wrong_cluster", e.to_string())
        }
        CoreError::UnknownHost(h) => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("host {h:?} is not registered"),
        ),
        // Internals are logged where they happen and never exposed.
        CoreError::Store(crate::store::StoreError::Io { no_space: true, .. }) => ApiError::new(
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
    async fn call<T>(
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
    fn view(&self) -> Result<Arc<View>, ApiError> {
        if self.tx.is_closed() {
            return Err(unavailable());
        }
        Ok(self.view.borrow().clone())
    }
}

// --- auth helpers ---

/// Users only: worker credentials read nothing of the `/v1` API.
fn user(p: &Principal) -> Result<(), ApiError> {
    match p.kind {
        PrincipalKind::User => Ok(()),
        PrincipalKind::Worker { .. } => Err(ApiError::forbidden(
            "worker credentials may only call the worker api of their host",
        )),
    }
}

/// The worker of `host` only. A refusal says what is wrong, so the operator reading the
/// worker's log knows what to fix: 401 `unauthenticated` is a wrong (or missing) secret
/// for a host the tokens file has a `[[worker]]` entry for; `no_worker_entry` (401 with a
/// secret that matches nothing, 403 with another host's credential) is a host the tokens
/// file has no entry for; 403 `forbidden` another host's credential, or a user token.
/// Host ids are not secrets (every viewer lists them), so telling which hosts have an
/// entry gives nothing away.
fn worker_of(st: &ApiState, who: Result<Principal, ApiError>, host: &str) -> Result<(), ApiError> {
    let has_entry = st.worker_hosts.contains(host);
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
        PrincipalKind::Worker { host: h } if h == host => Ok(()),
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

// --- /healthz ---

/// 200 `ok` while the state task runs (so changes can be committed); 503 once it has
/// stopped (a store that went stale or cannot write, or shutdown): a load balancer or a
/// supervisor sees it. The first line is `ok`; the second names the cluster
/// (`cluster: <id>`), also in the `X-Xce-Cluster` header.
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
        format!("ok\ncluster: {}\n", st.cluster_id),
    )
        .into_response()
}

// --- /metrics ---

async fn metrics(State(st): State<ApiState>) -> Response {
    metrics_response(&st.registry)
}

// --- /v1/services ---

fn state_name(s: JobState) -> &'static str {
    match s {
        JobState::Placed => "placed",
        JobState::Running => "running",
        JobState::Draining => "draining",
        JobState::Stopping => "stopping",
        JobState::Unknown => "unknown",
        JobState::Exited => "exited",
        JobState::Lost => "lost",
    }
}

fn service_state(s: ServiceState) -> &'static str {
    match s {
        ServiceState::Active => "active",
        ServiceState::Stopping => "stopping",
    }
}

fn job_json(j: &JobView) -> Value {
    let mut m = Map::new();
    m.insert("job".into(), json!(j.info.job));
    m.insert("replica".into(), json!(j.info.replica));
    m.insert("host".into(), json!(j.info.host));
    m.insert("state".into(), json!(state_name(j.info.state)));
    m.insert("ready".into(), json!(j.info.ready));
    m.insert("generation".into(), json!(j.info.generation));
    m.insert("log".into(), json!(j.log));
    for (plugin, v) in &j.summaries {
        m.entry(plugin.clone()).or_insert_with(|| v.clone());
    }
    Value::Object(m)
}

fn service_detail(s: &ServiceView) -> Value {
    json!({
        "name": s.info.name,
        "project": s.info.project,
        "replicas": s.info.replicas,
        "state": service_state(s.state),
        "index": s.info.rev,
        "generation": s.info.generation,
        "rollout": rollout_json(s),
        "profile": s.info.profile,
        "pending": s.pending.iter().map(|(r, why)| json!({"replica": r, "reason": why})).collect::<Vec<_>>(),
        "jobs": s.jobs.iter().map(job_json).collect::<Vec<_>>(),
        "replica_status": (0..s.info.replicas).map(|r| replica_json(s, r)).collect::<Vec<_>>(),
    })
}

/// One replica slot: how often its jobs ended by themselves and were replaced, the last
/// such end and its cause, and where the output of its newest job (live, or else the last
/// that ended) is on its host.
pub(crate) fn replica_json(s: &ServiceView, replica: u32) -> Value {
    let slot = s.slots.get(&replica);
    // The newest live job of the slot that has a log (jobs are sorted by replica, then
    // job number).
    let live = s
        .jobs
        .iter()
        .rfind(|j| j.info.replica == replica && j.log.is_some());
    let (log, host) = match live {
        Some(j) => (j.log.clone(), Some(j.info.host.clone())),
        None => (
            slot.and_then(|s| s.log.clone()),
            slot.and_then(|s| s.log_host.clone()),
        ),
    };
    let last_exit = slot.and_then(|s| s.last_exit.as_ref()).map(|e| {
        json!({
            "job": e.job,
            "host": e.host,
            "at": e.at,
            "code": e.cause.code,
            "signal": e.cause.signal,
            "signal_name": e.cause.signal_name(),
            "error": e.cause.error,
            "summary": e.cause.to_string(),
        })
    });
    json!({
        "replica": replica,
        "restarts": slot.map_or(0, |s| s.restarts),
        "last_exit": last_exit,
        "log": log,
        "log_host": host,
    })
}

fn rollout_json(s: &ServiceView) -> Value {
    json!({
        "generation": s.info.generation,
        "state": s.rollout.state.as_str(),
        "updated": s.counts.updated,
        "ready": s.counts.ready,
        "outdated": s.counts.outdated,
        "reason": s.rollout.reason,
    })
}

fn service_summary(s: &ServiceView) -> Value {
    json!({
        "name": s.info.name,
        "project": s.info.project,
        "replicas": s.info.replicas,
        "running": s.jobs.iter().filter(|j| j.info.state == JobState::Running).count(),
        "ready": s.jobs.iter().filter(|j| j.info.ready).count(),
        "pending": s.pending.len(),
        "pending_reason": s.pending.first().map(|(_, why)| why),
        "state": service_state(s.state),
        "index": s.info.rev,
        "generation": s.info.generation,
        "rollout": s.rollout.state.as_str(),
    })
}

/// Parses a submitted profile: JSON, or TOML with `Content-Type: application/toml`.
fn parse_profile(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let mime = ctype
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let text = std::str::from_utf8(body).map_err(|_| {
        ApiError::invalid(
            "invalid profile",
            vec![FieldError::new("profile", "not valid UTF-8")],
        )
    })?;
    match mime.as_str() {
        "application/toml" | "text/toml" => plugin_api_profile_toml(text),
        "application/json" | "" => serde_json::from_str(text).map_err(|e| {
            ApiError::invalid(
                "invalid profile",
                vec![FieldError::new("profile", format!("not valid JSON: {e}"))],
            )
        }),
        other => Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("content type {other:?} is not supported; send application/json or application/toml"),
        )),
    }
}

fn plugin_api_profile_toml(text: &str) -> Result<Value, ApiError> {
    crate::profile::toml_to_json(text).map_err(|e| ApiError::invalid("invalid profile", vec![e]))
}

async fn submit(
    State(st): State<ApiState>,
    who: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    user(&who)?;
    let doc = parse_profile(&headers, &body)?;
    let (key, _) = st
        .call(|reply| Command::Submit {
            doc,
            path: None,
            who: who.clone(),
            reply,
        })
        .await?;
    detail_response(&st, &key, StatusCode::CREATED)
}

/// `PUT /v1/services/{name}`: create (201) or update (200, a rollout when the profile
/// changed; the same profile changes nothing).
async fn put_service(
    State(st): State<ApiState>,
    who: Principal,
    Path(name): Path<String>,
    Query(q): Query<ProjectQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    user(&who)?;
    let doc = parse_profile(&headers, &body)?;
    // The profile decides the project; a `?project=` that says otherwise is a mistake
    // worth stopping (the caller meant another service).
    if let Some(p) = q.project.as_deref() {
        let body_project = doc
            .get("service")
            .and_then(|s| s.get("project"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if p != body_project {
            return Err(ApiError::invalid(
                "invalid profile",
                vec![FieldError::new(
                    "service.project",
                    format!("is {body_project:?}, but the request is for project {p:?}"),
                )],
            ));
        }
    }
    let (key, applied) = st
        .call(|reply| Command::Submit {
            doc,
            path: Some(name),
            who: who.clone(),
            reply,
        })
        .await?;
    let (status, change) = match applied {
        Applied::Created => (StatusCode::CREATED, "created"),
        Applied::Updated => (StatusCode::OK, "updated"),
        Applied::Unchanged => (StatusCode::OK, "unchanged"),
    };
    let mut resp = detail_response(&st, &key, status)?;
    resp.headers_mut()
        .insert("x-xce-change", HeaderValue::from_static(change));
    Ok(resp)
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScaleBody {
    replicas: i64,
}

/// `POST /v1/services/{name}/scale` with `{"replicas": N}`.
async fn scale_service(
    State(st): State<ApiState>,
    who: Principal,
    Path(name): Path<String>,
    Query(q): Query<ProjectQuery>,
    body: Bytes,
) -> Result<Response, ApiError> {
    user(&who)?;
    let key = resolve(&*st.view()?, &name, q.project.as_deref(), &who)?;
    let b: ScaleBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            "invalid scale request",
            vec![FieldError::new(
                "replicas",
                format!(
                    "send {{\"replicas\": N}} with N between 1 and {} ({e})",
                    crate::profile::MAX_REPLICAS
                ),
            )],
        )
    })?;
    if !(1..=crate::profile::MAX_REPLICAS as i64).contains(&b.replicas) {
        return Err(ApiError::invalid(
            "invalid scale request",
            vec![FieldError::new(
                "replicas",
                format!(
                    "must be between 1 and {} (to stop the service, delete it)",
                    crate::profile::MAX_REPLICAS
                ),
            )],
        ));
    }
    st.call(|reply| Command::Scale {
        key: key.clone(),
        replicas: b.replicas as u64,
        who: who.clone(),
        reply,
    })
    .await?;
    detail_response(&st, &key, StatusCode::OK)
}

/// `POST /v1/services/{name}/restart`: every replica rolls over to a fresh one.
async fn restart_service(
    State(st): State<ApiState>,
    who: Principal,
    Path(name): Path<String>,
    Query(q): Query<ProjectQuery>,
) -> Result<Response, ApiError> {
    user(&who)?;
    let key = resolve(&*st.view()?, &name, q.project.as_deref(), &who)?;
    st.call(|reply| Command::Restart {
        key: key.clone(),
        who: who.clone(),
        reply,
    })
    .await?;
    detail_response(&st, &key, StatusCode::OK)
}

fn with_index(mut resp: Response, index: u64) -> Response {
    if let Ok(v) = HeaderValue::from_str(&index.to_string()) {
        resp.headers_mut().insert("x-xce-index", v);
    }
    resp
}

/// Resolves a path's service name for `who` (DESIGN §5): among the projects the caller
/// may view, `?project=` picking one. Unknown and invisible answer the same 404; a name
/// in several of the caller's projects answers 409 listing those (and only those).
fn resolve(
    view: &View,
    name: &str,
    project: Option<&str>,
    who: &Principal,
) -> Result<ServiceKey, ApiError> {
    if project == Some("") {
        return Err(ApiError::bad_param("project", "must not be empty"));
    }
    let projects = view
        .services
        .keys()
        .filter(|k| k.name == name)
        .map(|k| k.project.as_str());
    match plugin_api::resolve_service(name, project, projects, |p| who.may(Permission::JobView, p))
    {
        Resolved::Found(k) => Ok(k),
        Resolved::NotFound => Err(ApiError::service_not_found(name)),
        Resolved::Ambiguous(ps) => Err(ApiError::ambiguous_service(name, &ps)),
    }
}

/// `?project=P` of a request, if given.
#[derive(Debug, Default, serde::Deserialize)]
struct ProjectQuery {
    project: Option<String>,
}

/// The service's detail as the state task's view has it right after a change.
fn detail_response(
    st: &ApiState,
    key: &ServiceKey,
    status: StatusCode,
) -> Result<Response, ApiError> {
    let view = st.view()?;
    let s = view
        .services
        .get(key)
        .ok_or_else(|| internal("changed service missing from the view"))?;
    Ok(with_index(
        (status, Json(service_detail(s))).into_response(),
        s.info.rev,
    ))
}

async fn list_services(
    State(st): State<ApiState>,
    who: Principal,
) -> Result<Json<Value>, ApiError> {
    user(&who)?;
    let view = st.view()?;
    let services: Vec<Value> = view
        .services
        .values()
        .filter(|s| who.may(Permission::JobView, &s.info.project))
        .map(service_summary)
        .collect();
    Ok(Json(json!({ "services": services })))
}

/// `GET /v1/services/{name}[?index=N&wait=30s]`: the detail; with `index`, a blocking
/// query that answers once the service's index is greater than N (every change of its
/// jobs or its rollout bumps it), or when `wait` runs out.
async fn get_service(
    State(st): State<ApiState>,
    who: Principal,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    user(&who)?;
    let index: u64 = match q.get("index") {
        None => 0,
        Some(s) => s
            .parse()
            .map_err(|_| ApiError::bad_param("index", "must be a non-negative integer"))?,
    };
    let wait = match q.get("wait") {
        None => DETAIL_WAIT_DEFAULT,
        Some(s) => humantime::parse_duration(s)
            .map_err(|e| ApiError::bad_param("wait", format!("not a duration ({e})")))?
            .min(WAIT_MAX),
    };
    let deadline = tokio::time::Instant::now() + wait;
    let mut rx = st.view.clone();
    let mut shutdown = st.shutdown.clone();
    let project = q.get("project").map(String::as_str);
    loop {
        let view = st.view()?;
        let key = resolve(&view, &name, project, &who)?;
        let Some(s) = view.services.get(&key) else {
            return Err(ApiError::service_not_found(&name));
        };
        if index == 0 || s.info.rev > index {
            return Ok(with_index(
                Json(service_detail(s)).into_response(),
                s.info.rev,
            ));
        }
        rx.mark_unchanged();
        tokio::select! {
            r = rx.changed() => if r.is_err() { return Err(unavailable()) },
            () = tokio::time::sleep_until(deadline) => {
                return Ok(with_index(Json(service_detail(s)).into_response(), s.info.rev));
            }
            _ = shutdown.wait_for(|s| *s) => {
                return Ok(with_index(Json(service_detail(s)).into_response(), s.info.rev));
            }
        }
    }
}

#[derive(Debug, serde::Deserialize)]
struct DeleteQuery {
    /// Skip the drain: SIGTERM at once.
    #[serde(default)]
    now: bool,
    project: Option<String>,
}

async fn delete_service(
    State(st): State<ApiState>,
    who: Principal,
    Path(name): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> Result<Response, ApiError> {
    user(&who)?;
    let key = resolve(&*st.view()?, &name, q.project.as_deref(), &who)?;
    let n = st
        .call(|reply| Command::Delete {
            key,
            now: q.now,
            who: who.clone(),
            reply,
        })
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "name": name, "stopping": n })),
    )
        .into_response())
}

// --- /v1/hosts ---

fn host_json(h: &HostView) -> Value {
    let mut m = Map::new();
    m.insert("id".into(), json!(h.info.id));
    m.insert(
        "state".into(),
        serde_json::to_value(h.info.state).unwrap_or(Value::Null),
    );
    m.insert("ip_addr".into(), json!(h.info.facts.ip_addr));
    m.insert("addresses".into(), json!(h.info.facts.addresses));
    m.insert("jobs".into(), json!(h.jobs));
    for (plugin, v) in &h.summaries {
        m.entry(plugin.clone()).or_insert_with(|| v.clone());
    }
    Value::Object(m)
}

async fn list_hosts(State(st): State<ApiState>, who: Principal) -> Result<Json<Value>, ApiError> {
    user(&who)?;
    let view = st.view()?;
    Ok(Json(json!({
        "cluster": &*st.cluster_id,
        "hosts": view.hosts.iter().map(host_json).collect::<Vec<_>>(),
    })))
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

/// The sender of a worker request: its identity headers and its connection's peer.
fn caller(headers: &HeaderMap, peer: Option<Extension<crate::serve::Peer>>) -> Caller {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    Caller {
        instance: header(INSTANCE_HEADER),
        cluster: header(CLUSTER_HEADER),
        peer: peer.map(|Extension(p)| p.0.to_string()),
    }
}

async fn register(
    State(st): State<ApiState>,
    who: Result<Principal, ApiError>,
    Path(host): Path<String>,
    headers: HeaderMap,
    peer: Option<Extension<crate::serve::Peer>>,
    body: Bytes,
) -> Result<Json<crate::proto::RegisterResponse>, ApiError> {
    worker_of(&st, who, &host)?;
    let caller = caller(&headers, peer);
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

async fn heartbeat(
    State(st): State<ApiState>,
    who: Result<Principal, ApiError>,
    Path(host): Path<String>,
    headers: HeaderMap,
    peer: Option<Extension<crate::serve::Peer>>,
) -> Result<StatusCode, ApiError> {
    worker_of(&st, who, &host)?;
    let caller = caller(&headers, peer);
    st.call(|reply| Command::Heartbeat {
        host,
        caller,
        reply,
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn facts(
    State(st): State<ApiState>,
    who: Result<Principal, ApiError>,
    Path(host): Path<String>,
    headers: HeaderMap,
    peer: Option<Extension<crate::serve::Peer>>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    worker_of(&st, who, &host)?;
    let caller = caller(&headers, peer);
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
    who: Result<Principal, ApiError>,
    Path(host): Path<String>,
    headers: HeaderMap,
    peer: Option<Extension<crate::serve::Peer>>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    worker_of(&st, who, &host)?;
    let caller = caller(&headers, peer);
    let events: Vec<WorkerEvent> = json_body(&body)?;
    st.call(|reply| Command::Events {
        host,
        caller,
        events,
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
    who: Result<Principal, ApiError>,
    Path(host): Path<String>,
    headers: HeaderMap,
    peer: Option<Extension<crate::serve::Peer>>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    worker_of(&st, who, &host)?;
    let caller = caller(&headers, peer);
    let index: u64 = match q.get("index") {
        None => 0,
        Some(s) => s
            .parse()
            .map_err(|_| ApiError::bad_param("index", "must be a non-negative integer"))?,
    };
    let wait = match q.get("wait") {
        None => WAIT_DEFAULT,
        Some(s) => humantime::parse_duration(s)
            .map_err(|e| ApiError::bad_param("wait", format!("not a duration ({e})")))?
            .min(WAIT_MAX),
    };
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
        }
    }
    let a: Arc<Assignments> = rx.borrow().clone();
    let mut resp = Json(&*a).into_response();
    if let Ok(v) = HeaderValue::from_str(&a.index.to_string()) {
        resp.headers_mut().insert("x-xce-index", v);
    }
    Ok(resp)
}
