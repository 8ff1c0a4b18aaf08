//! The endpoint routes (DESIGN §5): entry, plain text, blocking queries, the SSE stream,
//! Prometheus service discovery and the filtered list.

use crate::api::{Shared, Slot, WatcherGuard};
use crate::delivery::Recipient;
use crate::entry::Entry;
use crate::wire::{self, EndpointsAnswer, EndpointsList, INDEX_HEADER};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use plugin_api::{ApiContext, ApiError, Permission, Principal, ServiceKey};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// The most jitter added to a blocking query's wait: clients give the server `wait` plus
/// some slack (xcecli: 30s) before they call the connection dead.
const MAX_JITTER: Duration = Duration::from_secs(5);

type Params = Result<Query<RawParams>, QueryRejection>;

/// Builds the routes. Paths: `/v1/services/{name}/endpoints`,
/// `/v1/services/{name}/endpoints/stream`, `/v1/sd/prometheus`, `/v1/endpoints`.
///
/// A service is identified by (project, name): `{name}` and `?service=` resolve among the
/// projects the caller may view, `?project=` picking one (see `Shared::visible`).
pub(crate) fn router(shared: Arc<Shared>, cx: ApiContext) -> Router {
    Router::new()
        .route("/v1/services/{name}/endpoints", get(entry))
        .route("/v1/services/{name}/endpoints/stream", get(stream))
        .route("/v1/sd/prometheus", get(prometheus_sd))
        .route("/v1/endpoints", get(list))
        .with_state(shared)
        // The host installs the context too; installing it here keeps the routes
        // self-contained (and testable without the host).
        .layer(Extension(cx))
}

/// The query parameters, all as text: parsed below so every mistake answers our 400.
#[derive(Debug, Default, serde::Deserialize)]
struct RawParams {
    port: Option<String>,
    include: Option<String>,
    format: Option<String>,
    index: Option<String>,
    wait: Option<String>,
    service: Option<String>,
    project: Option<String>,
}

/// How to render an entry.
#[derive(Debug)]
struct View {
    port: Option<String>,
    all: bool,
    plain: bool,
}

/// `?index=&wait=`.
#[derive(Debug, Clone, Copy)]
struct Blocking {
    index: u64,
    wait: Duration,
}

fn params(query: Params) -> Result<RawParams, ApiError> {
    let p = query
        .map(|Query(p)| p)
        .map_err(|e| ApiError::bad_param("query", e.body_text()))?;
    if p.project.as_deref() == Some("") {
        return Err(ApiError::bad_param("project", "must not be empty"));
    }
    Ok(p)
}

// === impl View ===

impl View {
    fn parse(p: &RawParams, headers: &HeaderMap) -> Result<Self, ApiError> {
        let all = match p.include.as_deref() {
            None => false,
            Some("all") => true,
            Some(_) => return Err(ApiError::bad_param("include", "expected \"all\"")),
        };
        let plain = match p.format.as_deref() {
            None => accepts_plain(headers),
            Some("json") => false,
            Some("plain") => true,
            Some(_) => {
                return Err(ApiError::bad_param(
                    "format",
                    "expected \"json\" or \"plain\"",
                ))
            }
        };
        Ok(Self {
            port: p.port.clone(),
            all,
            plain,
        })
    }

    /// Checks the view against the service (after its visibility was checked, so these
    /// 400s tell nothing to a caller who may not see it).
    fn check(&self, entry: &Entry) -> Result<(), ApiError> {
        if let Some(port) = &self.port {
            if !entry.knows_port(port) {
                return Err(ApiError::bad_param(
                    "port",
                    format!(
                        "service {:?} has no port {port:?} (it declares: {})",
                        entry.service,
                        declared(entry)
                    ),
                ));
            }
        }
        if self.plain {
            plain_port(entry, self.port.as_deref())?;
        }
        Ok(())
    }

    fn render(&self, entry: &Entry) -> Result<Response, ApiError> {
        let mut resp = if self.plain {
            let port = plain_port(entry, self.port.as_deref())?;
            (
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                wire::plain(entry, port),
            )
                .into_response()
        } else if self.port.is_none() && !self.all {
            // The common read: served from the entry's cached rendering.
            let body = entry.rendered.0.get_or_init(|| {
                serde_json::to_vec(&EndpointsAnswer::new(entry, None, false))
                    .expect("an answer always serializes")
                    .into()
            });
            ([(header::CONTENT_TYPE, "application/json")], body.clone()).into_response()
        } else {
            Json(EndpointsAnswer::new(entry, self.port.as_deref(), self.all)).into_response()
        };
        with_index(&mut resp, entry.index);
        Ok(resp)
    }
}

/// `Accept: text/plain` (and not JSON) selects the plain format.
fn accepts_plain(headers: &HeaderMap) -> bool {
    let types: Vec<String> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    types.iter().any(|t| t == "text/plain") && !types.iter().any(|t| t == "application/json")
}

fn declared(entry: &Entry) -> String {
    if entry.ports.is_empty() {
        return "none".into();
    }
    let names: Vec<&str> = entry.ports.iter().map(|p| p.name.as_str()).collect();
    names.join(", ")
}

/// The port a one-port-per-line answer is for: `?port=`, or the only declared one.
fn plain_port<'a>(entry: &'a Entry, port: Option<&'a str>) -> Result<&'a str, ApiError> {
    if let Some(port) = port {
        return Ok(port);
    }
    match entry.ports.as_slice() {
        [only] => Ok(&only.name),
        [] => Err(ApiError::bad_param(
            "port",
            format!("service {:?} declares no ports", entry.service),
        )),
        _ => Err(ApiError::bad_param(
            "port",
            format!(
                "required: service {:?} declares several ports ({})",
                entry.service,
                declared(entry)
            ),
        )),
    }
}

fn with_index(resp: &mut Response, index: u64) {
    resp.headers_mut()
        .insert(INDEX_HEADER, HeaderValue::from(index));
}

// === impl Blocking ===

impl Blocking {
    fn parse(p: &RawParams, shared: &Shared) -> Result<Option<Self>, ApiError> {
        let wait = match p.wait.as_deref() {
            None => shared.cfg.default_wait,
            Some(text) => humantime::parse_duration(text)
                .map_err(|_| ApiError::bad_param("wait", "expected a duration such as \"30s\""))?,
        };
        let Some(index) = p.index.as_deref() else {
            return Ok(None);
        };
        let index = index
            .parse()
            .map_err(|_| ApiError::bad_param("index", "expected a non-negative integer"))?;
        Ok(Some(Self {
            index,
            wait: wait.min(shared.cfg.max_wait),
        }))
    }

    /// The wait with up to 1/16 (at most [`MAX_JITTER`]) added, so clients that started
    /// together do not all come back together.
    fn deadline(&self) -> tokio::time::Instant {
        let max_jitter = (self.wait / 16).min(MAX_JITTER).as_millis();
        let max_jitter = u64::try_from(max_jitter).unwrap_or(u64::MAX);
        let jitter = Duration::from_millis(fastrand::u64(0..=max_jitter));
        let now = tokio::time::Instant::now();
        // A configured max_wait of centuries must not overflow the clock.
        now.checked_add(self.wait.saturating_add(jitter))
            .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400))
    }
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
    let blocking = Blocking::parse(&p, &shared)?;
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
            view.check(&entry)?;
            return view.render(&entry);
        }
        found => found?,
    };
    view.check(&entry)?;
    if let Some(blocking) = blocking {
        if entry.index <= blocking.index && !blocking.wait.is_zero() {
            let _watcher = shared.watcher(&principal)?;
            // Parked: one of the watchers the delivery histogram waits for.
            let mut recipient = shared.recipient(&rx);
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
    // The host stops serving: answer with what there is (at once if it already does).
    let mut draining = shared.draining.subscribe();
    // Nothing taken yet: a seq no change has, so nothing is settled by it.
    let mut seq = 0;
    loop {
        let changed = tokio::select! {
            r = tokio::time::timeout_at(deadline, rx.changed()) => r,
            _ = draining.wait_for(|d| *d) => return (Ok(entry), seq),
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
    let _watcher = shared.watcher(principal)?;
    let deadline = blocking.deadline();
    let mut draining = shared.draining.subscribe();
    // Subscribed before looking: an appearance after the look below raises it.
    let mut appeared = shared.appeared.subscribe();
    loop {
        match shared.visible(principal, name, project) {
            Err(e) if e.status == StatusCode::NOT_FOUND => {}
            found => return found.map(|(_, entry)| entry),
        }
        let woken = tokio::select! {
            r = tokio::time::timeout_at(deadline, appeared.changed()) => matches!(r, Ok(Ok(()))),
            _ = draining.wait_for(|d| *d) => false,
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
        // scrape job covers the cluster and relabeling picks (DESIGN §5).
        let mut groups = Vec::new();
        for entry in shared.visible_entries(&principal, p.project.as_deref()) {
            let ports: std::collections::BTreeSet<&String> = entry
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
        .map(|e| EndpointsAnswer::new(e, None, all))
        .collect();
    Ok(Json(EndpointsList { services }).into_response())
}

/// `GET /v1/services/{name}/endpoints/stream`
async fn stream(
    State(shared): State<Arc<Shared>>,
    principal: Principal,
    Path(name): Path<String>,
    headers: HeaderMap,
    query: Params,
) -> Result<Response, ApiError> {
    shared.ensure_synced()?;
    let p = params(query)?;
    // The stream is always JSON events; `Accept: text/event-stream` must not matter.
    let view = View::parse(&p, &HeaderMap::new())?;
    if view.plain {
        return Err(ApiError::bad_param("format", "the stream sends json only"));
    }
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_param("Last-Event-ID", "expected a non-negative integer")
                })?,
        ),
    };
    let (rx, entry) = shared.visible(&principal, &name, p.project.as_deref())?;
    view.check(&entry)?;
    let place = Place {
        _counted: shared.watcher(&principal)?,
        recipient: shared.recipient(&rx),
    };
    let key = entry.key();
    tracing::debug!(service = %key, index = entry.index, last_event_id, "stream opened");
    let lag = Arc::new(Lag {
        taken: AtomicU64::new(rx.borrow().seq),
        place: Mutex::new(Some(place)),
    });
    let (stop, stopped) = oneshot::channel();
    tokio::spawn(watchdog(
        rx.clone(),
        lag.clone(),
        stopped,
        shared.clone(),
        key.clone(),
        principal.name.clone(),
    ));
    let events = EventStream {
        rx,
        first: true,
        done: false,
        sent: last_event_id,
        name,
        key,
        principal,
        view,
        shared: shared.clone(),
        lag,
        draining: shared.draining.subscribe(),
        _stop: stop,
    };
    let stream = futures_util::stream::unfold(events, |mut s| async move {
        let event = s.next().await?;
        Some((Ok::<_, Infallible>(event), s))
    });
    let mut resp = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    with_index(&mut resp, entry.index);
    Ok(resp)
}

/// One client's stream: the current entry, then one event per change.
///
/// It holds no queue: the service's watch channel keeps only the newest entry, and every
/// event is the whole entry, so a client that reads slowly skips intermediate states and
/// memory does not grow. A client that falls more than `stream_buffer` changes behind is
/// disconnected instead (it resumes with `Last-Event-ID` and gets the current entry).
///
/// The stream runs only when hyper polls it, and hyper polls it only when it can write,
/// i.e. when the client reads; so the lag is also watched by a [`watchdog`] task that
/// follows the service's changes on its own and cuts a client off even if it never reads.
struct EventStream {
    rx: watch::Receiver<Slot>,
    first: bool,
    done: bool,
    /// The index of the last entry the client has (sent, or named by `Last-Event-ID`).
    sent: Option<u64>,
    /// The name in the path (the 404 at the end names it, as the 404 of a request does).
    name: String,
    /// The service followed.
    key: ServiceKey,
    principal: Principal,
    view: View,
    shared: Arc<Shared>,
    lag: Arc<Lag>,
    /// The host's drain (see [`Shared::draining`]).
    draining: watch::Receiver<bool>,
    /// Dropped with the stream: tells its watchdog to end.
    _stop: oneshot::Sender<()>,
}

/// What a stream shares with its watchdog.
#[derive(Debug)]
struct Lag {
    /// The seq of the last slot the stream took (the slot's seq when it opened, until it
    /// took one): the client is behind by the slot's seq minus this.
    taken: AtomicU64,
    /// The stream's place among the watchers; taken away when the client is cut off (or
    /// the stream is dropped), so a cut-off client stops counting against the caps, and
    /// stops holding up the delivery histogram, at once, even though its connection lives
    /// until hyper polls the stream again.
    place: Mutex<Option<Place>>,
}

/// What an open stream holds: its count against the caps, and its registration as a
/// recipient of its service's changes.
#[derive(Debug)]
struct Place {
    _counted: WatcherGuard,
    recipient: Recipient,
}

// === impl EventStream ===

impl EventStream {
    async fn next(&mut self) -> Option<Event> {
        if self.done || self.lag.is_cut() {
            return None;
        }
        loop {
            if !self.first {
                let changed = tokio::select! {
                    r = self.rx.changed() => r,
                    // The host stops serving: end the stream (the client resumes
                    // elsewhere with Last-Event-ID).
                    _ = self.draining.wait_for(|d| *d) => {
                        self.done = true;
                        return None;
                    }
                };
                if changed.is_err() {
                    // The slot is gone for good: whatever it still had to send is this
                    // event.
                    self.lag.settle(u64::MAX, true);
                    return Some(self.gone());
                }
            }
            self.first = false;
            // Cut off by the watchdog while hyper was not polling: end the body.
            if self.lag.is_cut() {
                self.done = true;
                return None;
            }
            let slot = self.rx.borrow_and_update().clone();
            let behind = slot
                .seq
                .saturating_sub(self.lag.taken.load(Ordering::Acquire));
            if behind > self.shared.cfg.stream_buffer {
                self.lag
                    .cut_off(&self.shared, &self.key, &self.principal.name, behind);
                self.done = true;
                return None;
            }
            self.lag.taken.store(slot.seq, Ordering::Release);
            let entry = match slot.entry {
                Some(e) if self.principal.may(Permission::JobView, &e.project) => e,
                _ => {
                    self.lag.settle(slot.seq, true);
                    return Some(self.gone());
                }
            };
            if self.sent.is_some_and(|sent| entry.index <= sent) {
                // The client has a newer entry (Last-Event-ID from an apiserver ahead of
                // this one): not sent here.
                self.lag.settle(slot.seq, false);
                continue;
            }
            self.sent = Some(entry.index);
            let answer = EndpointsAnswer::new(&entry, self.view.port.as_deref(), self.view.all);
            let data = serde_json::to_string(&answer).expect("an answer always serializes");
            self.lag.settle(slot.seq, true);
            return Some(Event::default().id(entry.index.to_string()).data(data));
        }
    }

    /// The last event when the service went away: the same body as the 404.
    fn gone(&mut self) -> Event {
        self.done = true;
        let e = ApiError::service_not_found(&self.name);
        let body = serde_json::json!({"error": {
            "code": e.code,
            "message": e.message,
            "details": e.details,
        }});
        Event::default().event("error").data(body.to_string())
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        // Frees the place now, not when the watchdog has noticed the stop.
        self.lag.release();
    }
}

// === impl Lag ===

impl Lag {
    fn place(&self) -> std::sync::MutexGuard<'_, Option<Place>> {
        self.place.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn is_cut(&self) -> bool {
        self.place().is_none()
    }

    fn release(&self) -> Option<Place> {
        self.place().take()
    }

    /// The stream took slot seq `seq`: it is sending it now (`sent`), or will not.
    fn settle(&self, seq: u64, sent: bool) {
        if let Some(place) = self.place().as_mut() {
            if sent {
                place.recipient.handed(seq);
            } else {
                place.recipient.skipped(seq);
            }
        }
    }

    /// Cuts the client off (once: the stream and its watchdog may both see the lag).
    fn cut_off(&self, shared: &Shared, service: &ServiceKey, principal: &str, behind: u64) {
        if self.release().is_none() {
            return;
        }
        shared.metrics.streams_lagged.inc();
        tracing::info!(
            %service,
            principal,
            behind,
            "stream client fell behind, disconnecting it"
        );
    }
}

/// Follows a stream's service and cuts the client off as soon as it is more than
/// `stream_buffer` changes behind, whether or not hyper polls the stream. It wakes only on
/// the service's changes (no timer) and ends with the stream (`stopped`), when the service
/// goes away, or once it has cut the client off.
async fn watchdog(
    mut rx: watch::Receiver<Slot>,
    lag: Arc<Lag>,
    mut stopped: oneshot::Receiver<()>,
    shared: Arc<Shared>,
    service: ServiceKey,
    principal: String,
) {
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            changed = rx.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        let seq = rx.borrow_and_update().seq;
        let behind = seq.saturating_sub(lag.taken.load(Ordering::Acquire));
        if behind > shared.cfg.stream_buffer {
            lag.cut_off(&shared, &service, &principal, behind);
            return;
        }
        if lag.is_cut() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
