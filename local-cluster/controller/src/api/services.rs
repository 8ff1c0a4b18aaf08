//! The `/v1` routes, for users (worker credentials are refused): services (list, detail
//! and its blocking query, create, update, scale, restart, stop) and hosts. A path's name
//! resolves among the projects the caller may view only.

use super::state::{blocking_query, internal, unavailable, ApiState};
use crate::core::{Applied, HostView, JobView, ServiceView, View};
use crate::task::Command;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use plugin_api::{
    ApiError, FieldError, JobState, Permission, Principal, PrincipalKind, Resolved, ServiceKey,
};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::time::Duration;
use xce_model::ServiceState;

/// Default `wait` of the service detail's blocking query (as the endpoint queries').
const DETAIL_WAIT_DEFAULT: Duration = Duration::from_secs(300);

/// The `/v1` routes: services and hosts, for users.
pub(super) fn router(state: ApiState) -> Router {
    Router::new()
        .route("/v1/services", post(submit).get(list_services))
        .route("/v1/services/{name}/scale", post(scale_service))
        .route("/v1/services/{name}/restart", post(restart_service))
        .route(
            "/v1/services/{name}",
            get(get_service).put(put_service).delete(delete_service),
        )
        .route("/v1/hosts", get(list_hosts))
        .with_state(state)
}

/// Users only: worker credentials read nothing of the `/v1` API.
fn user(p: &Principal) -> Result<(), ApiError> {
    match p.kind {
        PrincipalKind::User => Ok(()),
        PrincipalKind::Worker { .. } => Err(ApiError::forbidden(
            "worker credentials may only call the worker api of their host",
        )),
    }
}

// --- /v1/services ---

fn service_state(s: ServiceState) -> &'static str {
    match s {
        ServiceState::Active => "active",
        ServiceState::Stopping => "stopping",
    }
}

fn job_json(j: &JobView) -> Value {
    let mut m = Map::new();
    m.insert("job".into(), json!(j.rec.info.job));
    m.insert("replica".into(), json!(j.rec.info.replica));
    m.insert("host".into(), json!(j.rec.info.host));
    m.insert("state".into(), json!(j.rec.info.state.to_string()));
    m.insert("ready".into(), json!(j.rec.info.ready));
    m.insert("generation".into(), json!(j.rec.info.generation));
    m.insert("log".into(), json!(j.rec.log));
    if let Some(text) = &j.summaries {
        // The view keeps the summaries as the text of a JSON object it wrote itself.
        if let Ok(Value::Object(summaries)) = serde_json::from_str::<Value>(text) {
            for (plugin, v) in summaries {
                m.entry(plugin).or_insert(v);
            }
        }
    }
    Value::Object(m)
}

/// A service's detail, written straight into the answer's text. As one `Value` tree, the
/// answer to the submit of a 10,000-replica service held every job's and slot's object
/// at once, ~1 KB of B-tree nodes and strings per replica (a heap profile found it at
/// the controller's heap peak); here one job's or one slot's object lives at a time.
/// Fields in key order: the text is the tree's (a `serde_json::Map` sorts its keys).
#[derive(serde::Serialize)]
#[serde(bound = "J: Fn(usize) -> Value, R: Fn(usize) -> Value")]
pub(crate) struct Detail<'a, J, R> {
    generation: u64,
    index: u64,
    jobs: Each<J>,
    name: &'a str,
    pending: Vec<Value>,
    profile: &'a Value,
    project: &'a str,
    replica_status: Each<R>,
    replicas: u32,
    rollout: Value,
    state: &'static str,
}

/// A JSON array of `n` values, each made by `f(i)` when it is written.
pub(crate) struct Each<F>(usize, F);

impl<F: Fn(usize) -> Value> serde::Serialize for Each<F> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq((0..self.0).map(&self.1))
    }
}

pub(crate) fn service_detail(
    s: &ServiceView,
) -> Detail<'_, impl Fn(usize) -> Value + '_, impl Fn(usize) -> Value + '_> {
    Detail {
        generation: s.info.generation,
        index: s.info.rev,
        jobs: Each(s.jobs.len(), |i| job_json(&s.jobs[i])),
        name: &s.info.name,
        pending: s
            .pending
            .iter()
            .map(|(r, why)| json!({"replica": r, "reason": why}))
            .collect(),
        profile: &s.info.profile,
        project: &s.info.project,
        replica_status: Each(s.info.replicas as usize, |r| {
            // `r` < `replicas`, a `u32`.
            replica_json(s, r as u32)
        }),
        replicas: s.info.replicas,
        rollout: rollout_json(s),
        state: service_state(s.state),
    }
}

/// One replica slot: how often its jobs ended by themselves and were replaced, the last
/// such end and its cause, and where the output of its newest job (live, or else the last
/// that ended) is on its host.
pub(crate) fn replica_json(s: &ServiceView, replica: u32) -> Value {
    let slot = s.slots.get(&replica);
    // The newest live job of the slot that has a log (jobs are sorted by replica, then
    // job number).
    let live = s.jobs.of_replica(replica).rfind(|j| j.rec.log.is_some());
    let (log, host) = match live {
        Some(j) => (j.rec.log.clone(), Some(j.rec.info.host.clone())),
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
        "running": s.jobs.iter().filter(|j| j.rec.info.state == JobState::Running).count(),
        "ready": s.jobs.iter().filter(|j| j.rec.info.ready).count(),
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
    xce_proto::profile::toml_to_json(text)
        .map_err(|e| ApiError::invalid("invalid profile", vec![e]))
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
                    xce_proto::profile::MAX_REPLICAS
                ),
            )],
        )
    })?;
    if !(1..=xce_proto::profile::MAX_REPLICAS as i64).contains(&b.replicas) {
        return Err(ApiError::invalid(
            "invalid scale request",
            vec![FieldError::new(
                "replicas",
                format!(
                    "must be between 1 and {} (to stop the service, delete it)",
                    xce_proto::profile::MAX_REPLICAS
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

/// Resolves a path's service name for `who` (docs/api.md): among the projects the caller
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
        .map(|s| service_summary(s))
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
    let (index, wait) = blocking_query(&q, DETAIL_WAIT_DEFAULT)?;
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
            // Its token was revoked (or lost the view) by a reload of the tokens.
            () = who.credential.lost(Permission::JobView, &s.info.project) => {
                return Err(who.credential.lost_answer(&name));
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
        "hosts": view.hosts.iter().map(|h| host_json(h)).collect::<Vec<_>>(),
    })))
}
