//! No request holds a connection forever (docs/design.md#isolation): what the connection's
//! supervision (`lib.rs`) needs to know of the requests in flight.
//!
//! - An answer that cannot be written: [`Exchange`] records since when an answer has been
//!   waiting for the connection to take its next bytes (its head or a frame handed over and
//!   not asked for again), and [`WriteClock`] since when the socket refuses bytes. A peer
//!   that never reads — a zero HTTP/2 flow-control window, a full socket buffer — shows as
//!   one of the two, for as long as it lasts; past `write_timeout` the connection is
//!   dropped. A request waiting for its answer (a blocking query, a stream between events)
//!   is not waiting on the peer, and is never cut by this.
//! - A request body that does not arrive: [`TimedBody`] gives the body `header_timeout` from
//!   the request's headers to arrive whole; past it, the handler's read fails and the answer
//!   is a 408 (`lib.rs`).
//!
//! The timestamps are [`tokio::time::Instant`]s, so tests can run them on paused time.

use axum::body::Bytes;
use hyper::body::Incoming;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// What timed out (the `kind` label of `xce_http_timeouts_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct Kind {
    kind: &'static str,
}

/// An answer not written within `write_timeout`: its connection was dropped.
pub(crate) const WRITE: Kind = Kind { kind: "write" };
/// A request body not received within `header_timeout`: answered 408.
pub(crate) const BODY: Kind = Kind { kind: "body" };
/// A connection closed to make room that did not finish closing within `header_timeout`:
/// dropped.
pub(crate) const CLOSING: Kind = Kind { kind: "closing" };

/// Timeouts of every HTTP listener of the process, by kind.
pub(crate) static TIMEOUTS: LazyLock<Family<Kind, Counter>> = LazyLock::new(Family::default);

/// Adds `xce_http_timeouts_total{kind}` to a server's registry.
pub(crate) fn register_metrics(registry: &mut Registry) {
    registry.register(
        "xce_http_timeouts",
        "Peers cut off for not reading or sending in time: write (an answer not written within connections.write_timeout; connection dropped), body (a request body not received within connections.header_timeout; answered 408), closing (a connection closed to make room that had not finished closing within connections.header_timeout; dropped)",
        TIMEOUTS.clone(),
    );
}

/// A point in time as a word: nanoseconds since an epoch, plus one (0 is "none").
#[derive(Debug)]
struct Stamp(AtomicU64);

impl Stamp {
    const NONE: u64 = 0;

    fn new() -> Self {
        Stamp(AtomicU64::new(Self::NONE))
    }

    fn set(&self, epoch: Instant, at: Instant) {
        let nanos =
            u64::try_from(at.saturating_duration_since(epoch).as_nanos()).unwrap_or(u64::MAX - 1);
        self.0.store(nanos + 1, Ordering::Relaxed);
    }

    fn clear(&self) {
        self.0.store(Self::NONE, Ordering::Relaxed);
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed) != Self::NONE
    }

    fn get(&self, epoch: Instant) -> Option<Instant> {
        match self.0.load(Ordering::Relaxed) {
            Self::NONE => None,
            n => Some(epoch + Duration::from_nanos(n - 1)),
        }
    }
}

/// One request and its answer: shared by its body ([`TimedBody`]), its answer's body (the
/// `Guarded` of `lib.rs`) and, through a weak reference, its connection's [`Writes`].
#[derive(Debug)]
pub(crate) struct Exchange {
    /// Since when the answer has waited for the connection to take its next bytes.
    stalled: Stamp,
    /// The request body did not arrive within its deadline.
    body_expired: AtomicBool,
    /// The request body was read to its end (or there was none).
    body_done: AtomicBool,
}

impl Exchange {
    /// The answer (its head, or a frame) was handed to the connection: it waits for the
    /// connection to take it, from `at`.
    pub(crate) fn handed(&self, writes: &Writes, at: Instant) {
        self.stalled.set(writes.epoch, at);
    }

    /// The connection asked for more of the answer: what was handed over is taken.
    pub(crate) fn taken(&self) {
        self.stalled.clear();
    }

    /// Whether the request body did not arrive in time (the answer is a 408 then).
    pub(crate) fn body_expired(&self) -> bool {
        self.body_expired.load(Ordering::Relaxed)
    }

    /// Whether the request body was read to its end (or there was none).
    pub(crate) fn body_done(&self) -> bool {
        self.body_done.load(Ordering::Relaxed)
    }
}

/// What one connection's supervision knows of its writes: since when the socket refuses
/// bytes, and the exchanges in flight.
#[derive(Debug)]
pub(crate) struct Writes {
    epoch: Instant,
    /// Since when a write (or flush) to the socket has been pending.
    socket_blocked: Stamp,
    /// The connection's exchanges; dead ones are pruned as new ones come.
    exchanges: Mutex<Vec<Weak<Exchange>>>,
    /// Told when the socket starts refusing bytes.
    pub(crate) blocked: Notify,
}

impl Default for Writes {
    fn default() -> Self {
        Writes {
            epoch: Instant::now(),
            socket_blocked: Stamp::new(),
            exchanges: Mutex::default(),
            blocked: Notify::new(),
        }
    }
}

impl Writes {
    /// A new exchange on this connection (a request arrived). `in_flight` is how many
    /// requests are in flight, to prune the dead entries before they pile up (a
    /// keep-alive connection may carry any number of requests, one after the other).
    pub(crate) fn exchange(&self, in_flight: usize) -> Arc<Exchange> {
        let x = Arc::new(Exchange {
            stalled: Stamp::new(),
            body_expired: AtomicBool::new(false),
            body_done: AtomicBool::new(false),
        });
        let mut all = self.exchanges.lock().unwrap();
        if all.len() >= 16 && all.len() >= 2 * in_flight {
            all.retain(|w| w.strong_count() > 0);
        }
        all.push(Arc::downgrade(&x));
        x
    }

    /// Since when the connection has been unable to write: the oldest answer waiting for
    /// it to take bytes, or the socket refusing them; `None` when nothing waits.
    pub(crate) fn stalled_since(&self) -> Option<Instant> {
        let mut all = self.exchanges.lock().unwrap();
        all.retain(|w| w.strong_count() > 0);
        let answers = all
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|x| x.stalled.get(self.epoch));
        answers.chain(self.socket_blocked.get(self.epoch)).min()
    }

    /// Whether a write to the socket is pending now.
    pub(crate) fn socket_blocked(&self) -> bool {
        self.socket_blocked.is_set()
    }

    fn socket_pending(&self) {
        if !self.socket_blocked.is_set() {
            self.socket_blocked.set(self.epoch, Instant::now());
            self.blocked.notify_one();
        }
    }

    fn socket_ready(&self) {
        if self.socket_blocked.is_set() {
            self.socket_blocked.clear();
        }
    }
}

// === impl WriteClock ===

/// A connection's stream that tells its [`Writes`] when the socket refuses bytes (a write
/// or flush pending: the peer does not read, its receive window and our send buffer are
/// full) and when it takes them again.
#[derive(Debug)]
pub(crate) struct WriteClock<S> {
    inner: S,
    writes: Arc<Writes>,
}

impl<S> WriteClock<S> {
    pub(crate) fn new(inner: S, writes: Arc<Writes>) -> Self {
        WriteClock { inner, writes }
    }

    fn track<T>(&self, p: Poll<T>) -> Poll<T> {
        match p {
            Poll::Pending => self.writes.socket_pending(),
            Poll::Ready(_) => self.writes.socket_ready(),
        }
        p
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteClock<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteClock<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.track(p)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let p = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.track(p)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_flush(cx);
        self.track(p)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let p = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.track(p)
    }
}

// === impl TimedBody ===

/// The request body did not arrive whole within `header_timeout` of the request's headers.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub(crate) struct BodyTimeout(Duration);

/// A request body that must arrive whole by a deadline: past it, reading it fails with
/// [`BodyTimeout`] and its [`Exchange`] says so. The timer starts only when the body is
/// read and not all there (most requests have none, or all of it at once).
pub(crate) struct TimedBody {
    inner: Incoming,
    deadline: Instant,
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    exchange: Arc<Exchange>,
}

impl TimedBody {
    /// `inner`, due within `timeout` from now.
    pub(crate) fn new(inner: Incoming, timeout: Duration, exchange: Arc<Exchange>) -> Self {
        if http_body::Body::is_end_stream(&inner) {
            exchange.body_done.store(true, Ordering::Relaxed);
        }
        TimedBody {
            inner,
            deadline: Instant::now() + timeout,
            timeout,
            timer: None,
            exchange,
        }
    }
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.exchange.body_expired() {
            return Poll::Ready(Some(Err(BodyTimeout(self.timeout).into())));
        }
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if frame.is_none() || self.inner.is_end_stream() {
                self.exchange.body_done.store(true, Ordering::Relaxed);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.exchange.body_expired.store(true, Ordering::Relaxed);
        TIMEOUTS.get_or_create(&BODY).inc();
        Poll::Ready(Some(Err(BodyTimeout(self.timeout).into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
