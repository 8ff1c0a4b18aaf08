//! The endpoint routes (docs/api.md): the router, and the handlers of the entry (JSON, plain
//! text, blocking queries), Prometheus service discovery and the filtered list. The SSE
//! stream is `crate::stream`; request parsing and rendering, `crate::query`.

use crate::delivery::Recipient;
use crate::entry::Entry;
use crate::metrics::Kind;
use crate::query::{params, plain_port, with_index, Blocking, Params, View};
use crate::shared::{Ended, Shared, Slot};
use crate::stream::stream;
use crate::wire::{self, EndpointsList};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use plugin_api::{ApiContext, ApiError, Permission, Principal};
use std::sync::Arc;
use tokio::sync::watch;

/// Builds the routes. Paths: `/v1/services/{name}/endpoints`,
/// `/v1/services/{name}/endpoints/stream`, `/v1/sd/prometheus`, `/v1/endpoints`,
/// `/v1/endpoints/stream`.
///
/// A service is identified by (project, name): `{name}` and `?service=` resolve among the
/// projects the caller may view, `?project=` picking one (see `Shared::visible`).
pub(crate) fn router(shared: Arc<Shared>, cx: ApiContext) -> Router {
    Router::new()
        .route("/v1/services/{name}/endpoints", get(entry))
        .route("/v1/services/{name}/endpoints/stream", get(stream))
        .route("/v1/sd/prometheus", get(prometheus_sd))
        .route("/v1/endpoints", get(list))
        .route("/v1/endpoints/stream", get(crate::allstream::all_stream))
        .with_state(shared)
        // The host installs the context too; installing it here keeps the routes
        // self-contained (and testable without the host).
        .layer(Extension(cx))
}

// === handlers ===

/// `GET /v1/services/{name}/endpoints`
async fn entry(
    State(shared): State<Arc<Shared>>,
    principal: Principal,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Params,
) -> Result<Response, ApiError> {
    shared.ensure_synced()?;
    let p = params(query)?;
    let view = View::parse(&p, &headers)?;
    let blocking = Blocking::parse(&p, &shared.cfg)?;
    let (mut rx, entry) = match shared.visible(&principal, &name, p.project.as_deref()) {
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            // Absent is index 0: only a caller that saw no entry waits for one; one that
            // saw the service (a higher index) is answered its absence at once.
            let Some(blocking) = blocking.filter(|b| b.index == 0 && !b.wait.is_zero()) else {
                return Err(e);
            };
            let entry =
                wait_for_service(&shared, &principal, &name, p.project.as_deref(), blocking)
                    .await?;
            // The wait may have spanned a freeze that cost the host its authority.
            shared.ensure_authority()?;
            view.check(&entry)?;
            return view.render(&entry);
        }
        found => found?,
    };
    view.check(&entry)?;
    if let Some(blocking) = blocking {
        if entry.index <= blocking.index && !blocking.wait.is_zero() {
            let _watcher = shared.watcher(&principal, Kind::Blocking)?;
            // Parked: one of the watchers the delivery histogram waits for.
            let mut recipient = shared.recipient(&rx, Kind::Blocking);
            let (waited, seq) = wait_for_change(
                &shared,
                &mut rx,
                entry,
                &principal,
                &name,
                blocking,
                &mut recipient,
            )
            .await;
            let answer = waited.and_then(|entry| {
                shared.ensure_authority()?;
                view.check(&entry)?;
                view.render(&entry)
            });
            // The answer is built (whatever it says): the change is sent.
            recipient.handed(seq);
            return answer;
        }
    }
    view.render(&entry)
}

/// Waits until the entry's index passes `blocking.index` or the wait runs out; the latest
/// visible entry either way, or 404 if the service went away (or out of sight). With it,
/// the slot seq the answer reflects; changes taken that do not pass the index are settled
/// on `recipient` as skipped.
async fn wait_for_change(
    shared: &Shared,
    rx: &mut watch::Receiver<Slot>,
    mut entry: Arc<Entry>,
    principal: &Principal,
    name: &str,
    blocking: Blocking,
    recipient: &mut Recipient,
) -> (Result<Arc<Entry>, ApiError>, u64) {
    let deadline = blocking.deadline();
    let mut ending = shared.ending(principal, Some(&entry.project));
    // Nothing taken yet: a seq no change has, so nothing is settled by it.
    let mut seq = 0;
    loop {
        let changed = tokio::select! {
            r = tokio::time::timeout_at(deadline, rx.changed()) => r,
            ended = ending.wait() => return match ended {
                // The host stops serving: answer with what there is.
                Ended::Draining => (Ok(entry), seq),
                // Its token was revoked (or lost the view) by a reload of the host's
                // tokens: what its next request would get.
                Ended::Revoked => (Err(principal.credential.lost_answer(name)), seq),
                // Its entry may be out of date: never answer with it.
                Ended::Stale => (Err(shared.stale_error()), seq),
            },
        };
        match changed {
            Err(_elapsed) => return (Ok(entry), seq),
            // The slot is gone for good: whatever it still had to send is the 404.
            Ok(Err(_closed)) => return (Err(ApiError::service_not_found(name)), u64::MAX),
            Ok(Ok(())) => {
                let slot = rx.borrow_and_update().clone();
                seq = slot.seq;
                match slot.entry {
                    Some(e) if principal.may(Permission::JobView, &e.project) => entry = e,
                    _ => return (Err(ApiError::service_not_found(name)), seq),
                }
                if entry.index > blocking.index {
                    return (Ok(entry), seq);
                }
                recipient.skipped(seq);
            }
        }
    }
}

/// A blocking query from `?index=0` on a name no service the caller may view has (not
/// yet, or no longer): an absent service is at index 0, so this waits until one appears
/// (a service's index is at least 1), or until the wait runs out or the host drains, and
/// then answers the same 404 as without waiting. Only services the caller may
/// view end the wait, so how long it took tells nothing about anyone else's: no existence
/// oracle. This is what lets `xcecli service endpoints --watch` wait for a service that is
/// not there yet, or was stopped, without polling.
async fn wait_for_service(
    shared: &Arc<Shared>,
    principal: &Principal,
    name: &str,
    project: Option<&str>,
    blocking: Blocking,
) -> Result<Arc<Entry>, ApiError> {
    let _watcher = shared.watcher(principal, Kind::Blocking)?;
    let deadline = blocking.deadline();
    // No project yet (nothing visible has the name): only the token's removal ends it.
    let mut ending = shared.ending(principal, None);
    // Subscribed before looking: an appearance after the look below raises it.
    let mut appeared = shared.appeared.subscribe();
    loop {
        match shared.visible(principal, name, project) {
            Err(e) if e.status == StatusCode::NOT_FOUND => {}
            found => return found.map(|(_, entry)| entry),
        }
        let woken = tokio::select! {
            r = tokio::time::timeout_at(deadline, appeared.changed()) => matches!(r, Ok(Ok(()))),
            ended = ending.wait() => match ended {
                Ended::Draining => false,
                // Its token was removed by a reload of the host's tokens.
                Ended::Revoked => return Err(principal.credential.lost_answer(name)),
                Ended::Stale => return Err(shared.stale_error()),
            },
        };
        if !woken {
            return Err(ApiError::service_not_found(name));
        }
    }
}

/// `GET /v1/sd/prometheus[?service=S][&port=P][&project=P]`
async fn prometheus_sd(
    State(shared): State<Arc<Shared>>,
    principal: Principal,
    query: Params,
) -> Result<Response, ApiError> {
    shared.ensure_synced()?;
    let p = params(query)?;
    let Some(service) = p.service.as_deref() else {
        // Without `service=`: every service the caller may view (of `project=`), one
        // target group per ready replica and port (`port=` keeps that port only); one
        // scrape job covers the cluster and relabeling picks (docs/api.md).
        let mut groups = Vec::new();
        for entry in shared.visible_entries(&principal, p.project.as_deref()) {
            let ports: std::collections::BTreeSet<&str> = entry
                .endpoints()
                .flat_map(|r| r.ports.keys())
                .filter(|name| p.port.as_ref().is_none_or(|want| *name == want))
                .collect();
            for port in ports {
                groups.extend(wire::prometheus_sd(&entry, port));
            }
        }
        return Ok(Json(groups).into_response());
    };
    let (_, entry) = shared.visible(&principal, service, p.project.as_deref())?;
    let view = View {
        port: p.port.clone(),
        all: false,
        plain: true,
    };
    view.check(&entry)?;
    let port = plain_port(&entry, p.port.as_deref())?;
    let mut resp = Json(wire::prometheus_sd(&entry, port)).into_response();
    with_index(&mut resp, entry.index);
    Ok(resp)
}

/// `GET /v1/endpoints[?project=P]`: every entry the caller may view (of project P).
async fn list(
    State(shared): State<Arc<Shared>>,
    principal: Principal,
    query: Params,
) -> Result<Response, ApiError> {
    shared.ensure_synced()?;
    let p = params(query)?;
    let all = View::parse(&p, &HeaderMap::new())?.all;
    let services = shared
        .visible_entries(&principal, p.project.as_deref())
        .iter()
        .map(|e| wire::answer(e, None, all))
        .collect();
    Ok(Json(EndpointsList { services }).into_response())
}

#[cfg(test)]
mod tests;
