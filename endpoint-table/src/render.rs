//! Each entry's answers and events, rendered once per version of the entry and shared by
//! every reader and watcher as reference-counted bytes (issue 31: one encoding per change).
//!
//! An entry is immutable once published (a change publishes a new one), so what it renders
//! to never changes: the first reader or watcher that needs a rendering builds it into the
//! entry's [`Rendered`] cache and everyone after it clones the `Bytes` (a reference count,
//! no copy). A thousand streams following a service serialize its entry once per change,
//! not a thousand times; a read is a lookup plus a write. Views that are not cached (a
//! `?port=` JSON answer) are rendered per request, as before.
//!
//! The server-sent events are written here too, byte for byte as axum's `Sse` wrote them
//! (fields in the order given, one `\n` after each, one more at the end; `data` never holds
//! a line break: compact JSON has none), and served by [`SseBody`], which hands each event's
//! bytes to hyper as they are, with axum's keep-alive comment (`:`) after 15 s of silence.

use crate::entry::{Entry, Rendered};
use crate::wire;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use http_body::Frame;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::time::{Instant, Sleep};

/// Silence after which a stream sends a keep-alive comment (axum's `KeepAlive` default).
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The keep-alive comment (axum's `Event::DEFAULT_KEEP_ALIVE`).
const KEEP_ALIVE_EVENT: &[u8] = b":\n\n";

/// The JSON answer of `entry`, all replicas with `ready` and `state` when `all`
/// (`?include=all`), without a `?port=` filter.
pub(crate) fn json(entry: &Entry, all: bool) -> Bytes {
    cached(&entry.rendered.json[usize::from(all)], || {
        serde_json::to_vec(&wire::answer(entry, None, all)).expect("an answer always serializes")
    })
}

/// A per-service stream's event for `entry`: `id: <index>`, `data: <json>`.
pub(crate) fn stream_event(entry: &Entry, all: bool) -> Bytes {
    cached(&entry.rendered.stream[usize::from(all)], || {
        let id = entry.index.to_string();
        event_vec(&[("id", id.as_bytes()), ("data", &json(entry, all))])
    })
}

/// An all-services stream's event for `entry`: `data: <json>`, then `id: <id>` when
/// `id` is given. The JSON is the entry's cached one when a read or a per-service stream
/// rendered it; otherwise it is rendered here and not kept: a stream starts with a
/// snapshot of every service, and keeping what one snapshot rendered would make each
/// all-services client cost the server a copy of the whole table's JSON (the issue 15
/// memory goal: one such stream within 1 % of 1,000 per-service streams).
pub(crate) fn all_event(entry: &Entry, all: bool, id: Option<u64>) -> Bytes {
    let data = match entry.rendered.json[usize::from(all)].get() {
        Some(json) => json.clone(),
        None => serde_json::to_vec(&wire::answer(entry, None, all))
            .expect("an answer always serializes")
            .into(),
    };
    match id.map(|id| id.to_string()) {
        Some(id) => event(&[("data", &data), ("id", id.as_bytes())]),
        None => event(&[("data", &data)]),
    }
}

/// The plain answer of `entry` for port `port` (one `address:port` line per ready replica
/// that has it), cached per port the service declares.
pub(crate) fn plain(entry: &Entry, port: &str) -> Bytes {
    let per_port = entry.rendered.plain.get_or_init(|| {
        entry
            .ports
            .iter()
            .map(|p| {
                (
                    p.name.clone().into_boxed_str(),
                    wire::plain(entry, &p.name).into(),
                )
            })
            .collect()
    });
    match per_port.iter().find(|(name, _)| **name == *port) {
        Some((_, body)) => body.clone(),
        // A port only old replicas still have (a rollout that removes it): not cached.
        None => wire::plain(entry, port).into(),
    }
}

/// One event's bytes: `name: value\n` per field, then `\n`. Values hold no line break.
pub(crate) fn event(fields: &[(&str, &[u8])]) -> Bytes {
    event_vec(fields).into()
}

fn event_vec(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let len = fields
        .iter()
        .map(|(name, value)| name.len() + value.len() + 3)
        .sum::<usize>();
    let mut out = Vec::with_capacity(len + 1);
    for (name, value) in fields {
        debug_assert!(!value.iter().any(|b| matches!(b, b'\n' | b'\r')));
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.push(b'\n');
    }
    out.push(b'\n');
    out
}

/// Fills `slot` once with what `render` builds, without the serializer's growth slack
/// (kept as long as the entry: it held 173 bytes per endpoint for 128 of JSON).
fn cached(slot: &OnceLock<Bytes>, render: impl FnOnce() -> Vec<u8>) -> Bytes {
    slot.get_or_init(|| {
        let mut bytes = render();
        bytes.shrink_to_fit();
        bytes.into()
    })
    .clone()
}

/// An SSE answer whose events are `events`' bytes (`text/event-stream`, `no-cache`, as
/// axum's `Sse` answers).
pub(crate) fn sse<S>(events: S) -> Response
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let body = SseBody {
        events: Box::pin(events),
        keep_alive: Box::pin(tokio::time::sleep(KEEP_ALIVE)),
        last_sent: Instant::now(),
    };
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::new(body),
    )
        .into_response()
}

/// The body of an SSE answer: each event is one data frame of shared bytes.
///
/// The keep-alive timer is not re-armed per event (a timer-wheel update per event and
/// watcher): when it fires, it is moved to 15 s after the last event if one was sent
/// since, and the comment goes out only after 15 s of real silence, as axum's does.
struct SseBody {
    events: Pin<Box<dyn Stream<Item = Bytes> + Send>>,
    keep_alive: Pin<Box<Sleep>>,
    last_sent: Instant,
}

impl http_body::Body for SseBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Poll::Ready(event) = self.events.as_mut().poll_next(cx) {
            self.last_sent = Instant::now();
            return Poll::Ready(event.map(|e| Ok(Frame::data(e))));
        }
        loop {
            ready!(self.keep_alive.as_mut().poll(cx));
            let due = self.last_sent + KEEP_ALIVE;
            if due > Instant::now() {
                // Events went out since it was armed: wait for 15 s after the last one.
                self.keep_alive.as_mut().reset(due);
                continue;
            }
            self.last_sent = Instant::now();
            let next = self.last_sent + KEEP_ALIVE;
            self.keep_alive.as_mut().reset(next);
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(KEEP_ALIVE_EVENT)))));
        }
    }
}

impl Rendered {
    /// Whether the default JSON answer was rendered (for the entry's `Debug`).
    pub(crate) fn has_json(&self) -> bool {
        self.json[0].get().is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Table;
    use crate::testutil::*;
    use axum::response::sse::{Event, Sse};

    /// A service with two ready replicas (one on an IPv6 host) and a declared port.
    fn entry() -> std::sync::Arc<Entry> {
        let mut t = Table::new();
        t.apply(&ev_host(1, host("h1", Some("127.0.0.11")), &[]));
        t.apply(&ev_host(2, host("h2", Some("fd00::2")), &[]));
        t.apply(&ev_service(3, service("web", "team-a", &["http", "admin"])));
        t.apply(&ev_job(
            4,
            job("j-1", "web", "team-a", 0, "h1", &[("http", 20417)]),
        ));
        let ports = [("http", 20418), ("admin", 9000)];
        t.apply(&ev_job(5, job("j-2", "web", "team-a", 1, "h2", &ports)));
        t.entry(&key("team-a", "web")).unwrap().clone()
    }

    /// What axum's `Sse` writes for `event` (the format these bytes must keep).
    async fn axum_bytes(event: Event) -> Bytes {
        let stream = futures_util::stream::iter([Ok::<_, Infallible>(event)]);
        let body = Sse::new(stream).into_response().into_body();
        axum::body::to_bytes(body, usize::MAX).await.unwrap()
    }

    /// Every event is byte for byte what axum's `Sse` wrote before, and every later call
    /// for an answer or a per-service stream's event hands out the same bytes (one
    /// rendering shared, not a copy).
    #[tokio::test]
    async fn events_are_axums_bytes_rendered_once() {
        let e = entry();
        for all in [false, true] {
            let data = serde_json::to_string(&wire::answer(&e, None, all)).unwrap();
            let id = e.index.to_string();
            let axum_stream = axum_bytes(Event::default().id(&id).data(&data)).await;
            let axum_all = axum_bytes(Event::default().data(&data).id(&id)).await;
            let axum_no_id = axum_bytes(Event::default().data(&data)).await;
            let axum_other = axum_bytes(Event::default().data(&data).id("99")).await;
            assert_eq!(json(&e, all), data.as_bytes());
            assert_eq!(stream_event(&e, all), axum_stream);
            assert_eq!(all_event(&e, all, Some(e.index)), axum_all);
            assert_eq!(all_event(&e, all, None), axum_no_id);
            assert_eq!(all_event(&e, all, Some(99)), axum_other);
            let shared = |a: Bytes, b: Bytes| a.as_ptr() == b.as_ptr();
            assert!(shared(json(&e, all), json(&e, all)));
            assert!(shared(stream_event(&e, all), stream_event(&e, all)));
        }
        let error = br#"{"error":{}}"#;
        assert_eq!(
            event(&[("event", b"error"), ("data", error)]),
            axum_bytes(Event::default().event("error").data(r#"{"error":{}}"#)).await
        );
        // A clone (an entry copied to be changed) starts with nothing rendered.
        assert!(!Entry::clone(&e).rendered.has_json());
    }

    /// Plain answers are cached per declared port; a port only old replicas have is
    /// rendered on demand; each equals `wire::plain`.
    #[test]
    fn plain_answers_are_rendered_once_per_port() {
        let e = entry();
        for port in ["http", "admin", "gone"] {
            assert_eq!(plain(&e, port), wire::plain(&e, port).as_bytes(), "{port}");
        }
        assert_eq!(plain(&e, "http"), "127.0.0.11:20417\n[fd00::2]:20418\n");
        assert_eq!(plain(&e, "http").as_ptr(), plain(&e, "http").as_ptr());
    }
}
