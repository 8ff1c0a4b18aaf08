//! The `/v1` routes, for users (worker credentials are refused): services (list, detail
//! and its blocking query, create, update, scale, restart, stop) and hosts. A path's name
//! resolves among the projects the caller may view only.

use super::hosts::host_answer;
use super::state::{blocking_query, internal, unavailable, ApiState};
use crate::core::{Applied, JobView, ServiceView, View};
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
use serde_json::Value;
use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;
use xce_model::ServiceState;
use xce_proto::profile::MAX_PROFILE_BYTES;
use xce_wire::hosts::HostList;
use xce_wire::services::{
    JobAnswer, LastExit, PendingReplica, ReplicaStatus, Rollout, RolloutState, ServiceDetail,
    ServiceList, ServiceSummary, StopAnswer,
};

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

fn rollout_state(s: xce_model::rollout::RolloutState) -> RolloutState {
    match s {
        xce_model::rollout::RolloutState::Progressing => RolloutState::Progressing,
        xce_model::rollout::RolloutState::Complete => RolloutState::Complete,
        xce_model::rollout::RolloutState::Failed => RolloutState::Failed,
        xce_model::rollout::RolloutState::Reverted => RolloutState::Reverted,
    }
}

/// A count as the answers write it (a `u32`: replicas are at most 10,000).
fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn job_answer(j: &JobView) -> JobAnswer<'_> {
    // The view keeps the summaries as the text of a JSON object it wrote itself.
    let summaries = j
        .summaries
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    JobAnswer {
        generation: Some(j.rec.info.generation),
        host: Cow::Borrowed(&j.rec.info.host),
        job: Cow::Borrowed(&j.rec.info.job),
        log: j.rec.log.as_deref().map(Cow::Borrowed),
        ready: j.rec.info.ready,
        replica: j.rec.info.replica,
        state: Cow::Owned(j.rec.info.state.to_string()),
        summaries: Cow::Owned(summaries),
    }
}

/// A service's detail, written straight into the answer's text. As one `Value` tree, the
/// answer to the submit of a 10,000-replica service held every job's and slot's object
/// at once, ~1 KB of B-tree nodes and strings per replica (a heap profile found it at
/// the controller's heap peak); here one job's or one slot's answer lives at a time (the
/// typed answer borrows from the view, its key order is the tree's).
pub(crate) type Detail<'a, J, R> = ServiceDetail<'a, Each<J>, Each<R>>;

/// A JSON array of `n` values, each made by `f(i)` when it is written.
pub(crate) struct Each<F>(usize, F);

impl<T: serde::Serialize, F: Fn(usize) -> T> serde::Serialize for Each<F> {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        ser.collect_seq((0..self.0).map(&self.1))
    }
}

pub(crate) fn service_detail<'a>(
    s: &'a ServiceView,
    dns_ttl: Option<std::time::Duration>,
) -> Detail<'a, impl Fn(usize) -> JobAnswer<'a> + 'a, impl Fn(usize) -> ReplicaStatus<'a> + 'a> {
    ServiceDetail {
        generation: s.info.generation,
        index: s.info.rev,
        jobs: Each(s.jobs.len(), |i| job_answer(&s.jobs[i])),
        name: Cow::Borrowed(&s.info.name),
        pending: s
            .pending
            .iter()
            .map(|(r, why)| PendingReplica {
                reason: Some(Cow::Borrowed(why)),
                replica: *r,
            })
            .collect(),
        profile: Cow::Borrowed(&s.info.profile),
        project: Cow::Borrowed(&s.info.project),
        replica_status: Each(s.info.replicas as usize, |r| {
            // `r` < `replicas`, a `u32`.
            replica_status(s, r as u32)
        }),
        replicas: s.info.replicas,
        rollout: Some(rollout(s, dns_ttl)),
        state: Cow::Borrowed(service_state(s.state)),
    }
}

/// One replica slot: how often its jobs ended by themselves and were replaced, the last
/// such end and its cause, and where the output of its newest job (live, or else the last
/// that ended) is on its host.
pub(crate) fn replica_status(s: &ServiceView, replica: u32) -> ReplicaStatus<'_> {
    let slot = s.slots.get(&replica);
    // The newest live job of the slot that has a log (jobs are sorted by replica, then
    // job number).
    let live = s.jobs.of_replica(replica).rfind(|j| j.rec.log.is_some());
    let (log, host) = match live {
        Some(j) => (j.rec.log.as_deref(), Some(j.rec.info.host.as_str())),
        None => (
            slot.and_then(|s| s.log.as_deref()),
            slot.and_then(|s| s.log_host.as_deref()),
        ),
    };
    let last_exit = slot.and_then(|s| s.last_exit.as_ref()).map(|e| LastExit {
        at: Cow::Borrowed(&e.at),
        code: e.cause.code,
        error: e.cause.error.as_deref().map(Cow::Borrowed),
        host: Cow::Borrowed(&e.host),
        job: Cow::Borrowed(&e.job),
        signal: e.cause.signal,
        signal_name: e.cause.signal_name().map(Cow::Borrowed),
        summary: Cow::Owned(e.cause.to_string()),
    });
    ReplicaStatus {
        last_exit,
        log: log.map(Cow::Borrowed),
        log_host: host.map(Cow::Borrowed),
        replica,
        restarts: slot.map_or(0, |s| s.restarts),
    }
}

/// A replica slot's status as a tree (the controller's tests print it).
#[cfg(test)]
pub(crate) fn replica_json(s: &ServiceView, replica: u32) -> Value {
    serde_json::to_value(replica_status(s, replica)).expect("a status always serializes")
}

fn rollout(s: &ServiceView, dns_ttl: Option<std::time::Duration>) -> Rollout<'_> {
    Rollout {
        dns_warning: dns_ttl
            .and_then(|ttl| dns_warning(&s.info.profile, ttl))
            .map(Cow::Owned),
        generation: s.info.generation,
        outdated: s.counts.outdated,
        ready: s.counts.ready,
        reason: s.rollout.reason.as_deref().map(Cow::Borrowed),
        state: rollout_state(s.rollout.state),
        updated: s.counts.updated,
    }
}

/// How long a DNS client may keep an answer, as a multiple of the TTL: one resolver
/// cache in front that honours the TTL, plus the client's own cache that starts the
/// count again (glibc's nscd, HAProxy's `hold valid`, a JVM's address cache set to the
/// TTL). Caches that keep answers longer than the TTL are not covered.
const DNS_CACHE_LAYERS: u32 = 2;

/// The rollout note for a service whose `drain` is shorter than DNS clients may keep an
/// answer naming a replica that just started draining.
fn dns_warning(profile: &serde_json::Value, ttl: std::time::Duration) -> Option<String> {
    let drain = xce_proto::profile::drain_of(profile);
    let needed = ttl * DNS_CACHE_LAYERS;
    (drain < needed).then(|| {
        format!(
            "drain {} is shorter than DNS clients may cache an answer ({} x ttl {}): a \
             client may connect to a replica after its SIGTERM; set drain to at least {}",
            humantime::format_duration(drain),
            DNS_CACHE_LAYERS,
            humantime::format_duration(ttl),
            humantime::format_duration(needed)
        )
    })
}

fn service_summary(s: &ServiceView) -> ServiceSummary<'_> {
    ServiceSummary {
        generation: s.info.generation,
        index: s.info.rev,
        name: Cow::Borrowed(&s.info.name),
        pending: count(s.pending.len()),
        pending_reason: s
            .pending
            .first()
            .map(|(_, why)| Cow::Borrowed(why.as_str())),
        project: Cow::Borrowed(&s.info.project),
        ready: count(s.jobs.iter().filter(|j| j.rec.info.ready).count()),
        replicas: s.info.replicas,
        rollout: Some(rollout_state(s.rollout.state)),
        running: count(
            s.jobs
                .iter()
                .filter(|j| j.rec.info.state == JobState::Running)
                .count(),
        ),
        state: Cow::Borrowed(service_state(s.state)),
    }
}

/// Parses a submitted profile: JSON, or TOML with `Content-Type: application/toml`; at
/// most [`MAX_PROFILE_BYTES`] as sent (413) and as JSON (400), checked before anything
/// reaches the store.
fn parse_profile(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    if body.len() > MAX_PROFILE_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the profile is {} bytes, more than the limit of {MAX_PROFILE_BYTES} bytes \
                 (256 KiB) a profile may have",
                body.len()
            ),
        ));
    }
    let doc = parse_profile_text(headers, body)?;
    let stored = serde_json::to_vec(&doc).map_or(usize::MAX, |v| v.len());
    if stored > MAX_PROFILE_BYTES {
        return Err(ApiError::invalid(
            "invalid profile",
            vec![FieldError::new(
                "profile",
                format!(
                    "is {stored} bytes as JSON (what the store keeps), more than the limit \
                     of {MAX_PROFILE_BYTES} bytes (256 KiB) a profile may have"
                ),
            )],
        ));
    }
    Ok(doc)
}

fn parse_profile_text(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
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
        (status, Json(service_detail(s, st.dns_ttl))).into_response(),
        s.info.rev,
    ))
}

async fn list_services(State(st): State<ApiState>, who: Principal) -> Result<Response, ApiError> {
    user(&who)?;
    let view = st.view()?;
    let services = view
        .services
        .values()
        .filter(|s| who.may(Permission::JobView, &s.info.project))
        .map(|s| service_summary(s))
        .collect();
    Ok(Json(ServiceList { services }).into_response())
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
    // Its place among the watchers, taken when it first parks, held until it answers.
    let mut parked = None;
    loop {
        let view = st.view()?;
        let key = resolve(&view, &name, project, &who)?;
        let Some(s) = view.services.get(&key) else {
            return Err(ApiError::service_not_found(&name));
        };
        if index == 0 || s.info.rev > index {
            return Ok(with_index(
                Json(service_detail(s, st.dns_ttl)).into_response(),
                s.info.rev,
            ));
        }
        if parked.is_none() {
            parked = Some(st.park(&who)?);
        }
        rx.mark_unchanged();
        tokio::select! {
            r = rx.changed() => if r.is_err() { return Err(unavailable()) },
            () = tokio::time::sleep_until(deadline) => {
                return Ok(with_index(Json(service_detail(s, st.dns_ttl)).into_response(), s.info.rev));
            }
            _ = shutdown.wait_for(|s| *s) => {
                return Ok(with_index(Json(service_detail(s, st.dns_ttl)).into_response(), s.info.rev));
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
    let answer = StopAnswer {
        name: Cow::Borrowed(&name),
        stopping: count(n),
    };
    Ok((StatusCode::ACCEPTED, Json(answer)).into_response())
}

// --- /v1/hosts ---

async fn list_hosts(State(st): State<ApiState>, who: Principal) -> Result<Response, ApiError> {
    user(&who)?;
    // Every host's addresses and job counts, across tenants: not every token's.
    xce_serve::auth::require(&who, Permission::HostView, "GET /v1/hosts")?;
    let view = st.view()?;
    let answer = HostList {
        cluster: Some(Cow::Borrowed(&st.cluster_id)),
        hosts: view.hosts.iter().map(|h| host_answer(h)).collect(),
    };
    Ok(Json(answer).into_response())
}

#[cfg(test)]
mod dns_tests {
    use super::dns_warning;
    use std::time::Duration;

    #[test]
    fn a_drain_shorter_than_twice_the_dns_ttl_is_noted() {
        let secs = Duration::from_secs;
        let profile = |drain: &str| serde_json::json!({ "name": "web", "drain": drain });
        assert_eq!(
            dns_warning(&profile("1s"), secs(1)).as_deref(),
            Some(
                "drain 1s is shorter than DNS clients may cache an answer (2 x ttl 1s): a \
                 client may connect to a replica after its SIGTERM; set drain to at least 2s"
            )
        );
        assert_eq!(dns_warning(&profile("2s"), secs(1)), None);
        // No drain in the profile: the default (5s).
        assert_eq!(
            dns_warning(&serde_json::json!({ "name": "web" }), secs(2)),
            None
        );
        assert!(dns_warning(&serde_json::json!({ "name": "web" }), secs(3)).is_some());
    }
}
