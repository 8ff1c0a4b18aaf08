//! `GET /v1/services/{name}/endpoints/stream`: the SSE stream of one service's entry, with
//! no queue of its own, and the watchdog that cuts off a client that falls behind.

use crate::delivery::Recipient;
use crate::query::{params, with_index, Params, View};
use crate::shared::{Shared, Slot, WatcherGuard};
use crate::wire::EndpointsAnswer;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use plugin_api::{ApiError, ErrorBody, Permission, Principal, ServiceKey};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{oneshot, watch};

/// `GET /v1/services/{name}/endpoints/stream`
pub(crate) async fn stream(
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
                    r = self.rx.changed() => Some(r),
                    // The host stops serving: end the stream (the client resumes
                    // elsewhere with Last-Event-ID).
                    _ = self.draining.wait_for(|d| *d) => {
                        self.done = true;
                        return None;
                    }
                    // The token was removed (or may no longer view the service) when
                    // the host re-read its tokens.
                    () = self.principal.credential.lost(Permission::JobView, &self.key.project) => None,
                };
                let Some(changed) = changed else {
                    tracing::info!(
                        service = %self.key,
                        principal = %self.principal.name,
                        "stream ended: its token was revoked"
                    );
                    // The last event says so, as the next request would be answered
                    // (401, or the 404 of a service out of sight).
                    let answer = self.principal.credential.lost_answer(&self.name);
                    return Some(self.last_error(answer));
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
        let not_found = ApiError::service_not_found(&self.name);
        self.last_error(not_found)
    }

    /// The last event: `error`, with the body a request would be answered with.
    fn last_error(&mut self, error: ApiError) -> Event {
        self.done = true;
        let body = ErrorBody::from(error);
        let body = serde_json::to_string(&body).expect("an error body always serializes");
        Event::default().event("error").data(body)
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
