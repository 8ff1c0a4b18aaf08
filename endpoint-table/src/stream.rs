//! `GET /v1/services/{name}/endpoints/stream`: the SSE stream of one service's entry, with
//! no queue of its own; its slot cuts off a client that falls behind (`Laggards`).

use crate::entry::Entry;
use crate::lag::{Lag, Place};
use crate::metrics::Kind;
use crate::query::{last_event_id, params, with_index, Params, View};
use crate::render;
use crate::shared::{Ended, EndingFuture, Shared, Slot};
use crate::wire;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use plugin_api::{ApiError, ErrorBody, Principal, ServiceKey};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use tokio::sync::watch;

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
    let last_event_id = last_event_id(&headers)?;
    let (rx, entry) = shared.visible(&principal, &name, p.project.as_deref())?;
    view.check(&entry)?;
    let place = Place {
        counted: shared.watcher(&principal, Kind::Stream)?,
        recipient: Some(shared.recipient(&rx, Kind::Stream)),
    };
    let key = entry.key();
    tracing::debug!(service = %key, index = entry.index, last_event_id, "stream opened");
    let seq = rx.borrow().seq;
    let lag = Lag::new(seq, place, shared.cfg.stream_buffer, key.to_string());
    // Cut off by the slot's changes if it falls behind (`Laggards`): no task of its own.
    rx.borrow().laggards.register(Arc::downgrade(&lag) as _);
    let ending = shared.ending(&principal, Some(&key.project));
    let events = EventStream {
        rx,
        first: true,
        done: false,
        sent: last_event_id,
        name,
        key,
        principal,
        view,
        ending: ending.boxed(),
        lag,
        kept: None,
        shared: shared.clone(),
    };
    let mut resp = render::sse(events);
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
/// Its slot's changes cut a client off even if it never reads (`crate::lag::Laggards`).
struct EventStream {
    rx: watch::Receiver<Slot>,
    first: bool,
    done: bool,
    /// The index of the last entry the client has (sent, or named by `Last-Event-ID`).
    sent: Option<u64>,
    /// The name in the path (the 404 at the end names it, as the 404 of a request does).
    name: String,
    /// The service it follows (its project decides whether a reload of the tokens took
    /// away the view).
    key: ServiceKey,
    principal: Principal,
    view: View,
    lag: Arc<Lag>,
    /// What ends every watcher from outside (see [`Shared::ending`]).
    ending: EndingFuture,
    /// The waker last registered with the slot's `Laggards` (see `Lag::wake_on_change`).
    kept: Option<Waker>,
    /// Asked before each change is sent: a host that lost its authority meanwhile (a
    /// leader frozen past its lease) sends none ([`Shared::ensure_authority`]).
    shared: Arc<Shared>,
}

// === impl EventStream ===

impl futures_util::Stream for EventStream {
    type Item = Bytes;

    /// The next event: the current entry at first, then one per change of the slot (the
    /// newest entry, skipping what the client missed meanwhile), until the service is
    /// gone, the stream is cut off, or the host ends it.
    ///
    /// Woken by the slot's `Laggards` after each change (registered once, see
    /// `Lag::wake_on_change`) and by the ending's channels: a poll that finds neither is a
    /// version compare and a flag test.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        let me = self.get_mut();
        if me.done || me.lag.is_cut() {
            return me.end();
        }
        loop {
            if !me.first {
                // Looked at first, so a service that changes all the time cannot keep a
                // revoked or drained stream going.
                if let Poll::Ready(ended) = Pin::new(&mut me.ending).poll(cx) {
                    return match me.ended(ended) {
                        Some(last) => Poll::Ready(Some(last)),
                        None => me.end(),
                    };
                }
                // Registered before looking: a change after the look wakes the task.
                me.lag.wake_on_change(cx.waker(), &mut me.kept);
                match me.rx.has_changed() {
                    // The change may be this copy's alone: another controller may lead
                    // now. End the stream: its client reconnects and gets 503 `stale`
                    // here, or the entry from where it is current.
                    Ok(true) if me.shared.ensure_authority().is_err() => return me.end(),
                    Ok(true) => {}
                    Ok(false) => return Poll::Pending,
                    Err(_) => {
                        // The slot is gone for good: whatever it still had to send is
                        // this event.
                        me.lag.settle(u64::MAX, true);
                        return Poll::Ready(Some(me.gone()));
                    }
                }
            }
            me.first = false;
            // Cut off by its slot while hyper was not polling: end the body.
            if me.lag.is_cut() {
                return me.end();
            }
            let slot = me.rx.borrow_and_update().clone();
            if me.lag.check(slot.seq) {
                return me.end();
            }
            me.lag.take(slot.seq);
            // The slot is the service's (project, name): its entries are all of the
            // project the stream was allowed to view when it opened, and the principal's
            // grants do not change under it (a reload that takes the view away ends the
            // stream through `ending`), so that check is not repeated per event.
            let Some(entry) = slot.entry else {
                me.lag.settle(slot.seq, true);
                return Poll::Ready(Some(me.gone()));
            };
            if me.sent.is_some_and(|sent| entry.index <= sent) {
                // The client has a newer entry (Last-Event-ID from an apiserver ahead of
                // this one): not sent here.
                me.lag.settle(slot.seq, false);
                continue;
            }
            me.sent = Some(entry.index);
            let event = me.event(&entry);
            me.lag.settle(slot.seq, true);
            return Poll::Ready(Some(event));
        }
    }
}

impl EventStream {
    /// The end of the stream: its place among the watchers is free from now on, not only
    /// once hyper drops the answer.
    fn end(&mut self) -> Poll<Option<Bytes>> {
        self.done = true;
        self.lag.release();
        Poll::Ready(None)
    }

    /// What the stream sends when the host ends it: nothing when it drains or its entries
    /// may be stale (the client resumes elsewhere with `Last-Event-ID`, or gets 503
    /// `stale` until the next resync), the answer a request would get when its token was
    /// revoked (401, or the 404 of a service out of sight).
    fn ended(&mut self, ended: Ended) -> Option<Bytes> {
        match ended {
            Ended::Draining | Ended::Stale => None,
            Ended::Revoked => {
                tracing::info!(
                    service = %self.key,
                    principal = %self.principal.name,
                    "stream ended: its token was revoked"
                );
                let answer = self.principal.credential.lost_answer(&self.name);
                Some(self.last_error(answer))
            }
        }
    }

    /// The event of `entry` in the stream's view: every stream of the service in the
    /// default views shares one rendering.
    fn event(&self, entry: &Entry) -> Bytes {
        match self.view.port.as_deref() {
            None => render::stream_event(entry, self.view.all),
            Some(port) => {
                let answer = wire::answer(entry, Some(port), self.view.all);
                let data = serde_json::to_vec(&answer).expect("an answer always serializes");
                let id = entry.index.to_string();
                render::event(&[("id", id.as_bytes()), ("data", &data)])
            }
        }
    }

    /// The last event when the service went away: the same body as the 404.
    fn gone(&mut self) -> Bytes {
        let not_found = ApiError::service_not_found(&self.name);
        self.last_error(not_found)
    }

    /// The last event: `error`, with the body a request would be answered with.
    fn last_error(&mut self, error: ApiError) -> Bytes {
        self.done = true;
        let body = ErrorBody::from(error);
        let body = serde_json::to_vec(&body).expect("an error body always serializes");
        render::event(&[("event", b"error"), ("data", &body)])
    }
}

impl Drop for EventStream {
    fn drop(&mut self) {
        // Frees the place now, not when the watchdog has noticed the stop.
        self.lag.release();
    }
}
