//! [`ConnStreams`]: the streams of one HTTP/2 connection run in the connection's own task.
//!
//! Why: hyper's HTTP/2 server hands each stream (a request's handler, then its answer's
//! body) to the executor, and with tokio's that is a task per stream. One change followed
//! by 100 SSE streams of one connection then woke 100 tasks, each scheduled on its own,
//! each taking the connection's lock to queue its DATA frame and waking the connection
//! task, which tokio ran right after it (a task woken by the running one runs next): the
//! change left in up to 100 writes, and the stream tasks of one connection ran on both
//! cores, contending for that lock. etcd's 100 watches on one gRPC stream leave in one.
//!
//! How: this executor keeps the streams of its connection in a `FuturesUnordered` that
//! [`WithStreams`] polls together with the connection itself, in the connection's task.
//! A change wakes the streams it concerns (a wake-up is a queue push, not a task
//! schedule), the connection's task polls them all in one pass (each queues its frame),
//! then polls the connection, which writes every queued frame in one go
//! ([`BatchedWrites`](super::BatchedWrites) holds the write until the pass is done).
//! The cost: one connection's streams share one core at a time; connections still spread
//! over the runtime's threads.

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::task::{ArcWake, AtomicWaker};
use futures_util::FutureExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Rounds of "connection, streams" one poll makes before it yields: a client that keeps
/// opening streams (each round reads requests, and their streams run in the next) gives
/// the runtime back its thread now and then.
const ROUNDS: usize = 4;

/// Streams handed over by hyper and not yet taken by the connection's task.
#[derive(Default)]
struct Spawned {
    new: Mutex<Vec<StreamFuture>>,
    /// The connection's task, told when a stream is handed over while it is not being
    /// polled (hyper hands streams over from inside the connection's poll, which takes
    /// them right after: waking the task there would only poll it once more for nothing).
    task: AtomicWaker,
    /// The connection's task is in [`WithStreams::poll`].
    polling: AtomicBool,
}

/// The executor of one connection (`hyper_util::server::conn::auto::Builder::new`): it
/// runs what hyper starts for the connection (its streams) in the connection's task, see
/// the module docs. Build one per connection with [`ConnStreams::new`], and poll the
/// connection's future through [`ConnStreams::serve`].
#[derive(Clone)]
pub struct StreamExecutor {
    /// Weak: the streams hold the executor (hyper keeps it in each stream), and the
    /// connection's future holds the streams; a strong reference would be a cycle. Once
    /// the connection is gone, what is handed over is dropped.
    spawned: Weak<Spawned>,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        if let Some(spawned) = self.spawned.upgrade() {
            // Outside tokio's per-poll budget: a pass polls every stream one change woke,
            // up to the connection's 256, which would otherwise split at the budget's 128
            // into two passes (and two writes). Each stream still hands over at most its
            // send buffer per pass (it waits for the connection to write it out).
            // A panic in one stream ends that stream only, as it did when each stream
            // was a task of its own (tokio caught it there): not its connection's other
            // streams.
            let fut = std::panic::AssertUnwindSafe(fut).catch_unwind().map(|ended| {
                if ended.is_err() {
                    tracing::error!("an HTTP/2 stream's handler panicked; the stream ends, its connection serves on");
                }
            });
            let fut = tokio::task::unconstrained(fut);
            spawned.new.lock().unwrap().push(Box::pin(fut));
            if !spawned.polling.load(Ordering::SeqCst) {
                spawned.task.wake();
            }
        }
    }
}

/// One connection's streams: the executor to build its connection with, then the
/// connection's future to run them with.
pub struct ConnStreams {
    spawned: Arc<Spawned>,
}

impl ConnStreams {
    /// For one connection.
    #[allow(clippy::new_without_default)] // one per connection, never a default value
    pub fn new() -> Self {
        Self {
            spawned: Arc::default(),
        }
    }

    /// The executor to build the connection with.
    pub fn executor(&self) -> StreamExecutor {
        StreamExecutor {
            spawned: Arc::downgrade(&self.spawned),
        }
    }

    /// `conn` (the connection's future, from a builder made with [`Self::executor`]),
    /// polled together with its streams. When the connection ends, the streams still
    /// running end with it (their connection cannot carry a frame any more).
    pub fn serve<C: Future>(self, conn: C) -> WithStreams<C> {
        let pass = Arc::new(Pass::default());
        WithStreams {
            conn: Box::pin(conn),
            streams: FuturesUnordered::new(),
            spawned: self.spawned,
            pass_waker: futures_util::task::waker(pass.clone()),
            pass,
        }
    }
}

/// A connection's future and its streams, polled together (see the module docs).
pub struct WithStreams<C> {
    conn: Pin<Box<C>>,
    streams: FuturesUnordered<StreamFuture>,
    spawned: Arc<Spawned>,
    /// The streams are polled with this waker (see [`Pass`]).
    pass: Arc<Pass>,
    pass_waker: Waker,
}

/// The waker of the streams of one connection: it notes that a stream was woken before it
/// wakes the connection's task.
///
/// Why: `FuturesUnordered` ends a pass (it wakes the task and returns pending) once two of
/// the futures it polled woke themselves while polled, and an HTTP/2 stream does that each
/// time it queues a DATA frame (h2 gives it send capacity at once, and tells it so through
/// its waker). So a pass polled two streams, not every stream a change woke, and 100
/// events of one connection left in 50 writes. With the note, a round goes on with
/// another pass while one was woken.
#[derive(Default)]
struct Pass {
    /// A stream was woken (or the set yielded) since the note was last taken.
    woken: AtomicBool,
    /// The connection's task.
    task: AtomicWaker,
}

impl ArcWake for Pass {
    fn wake_by_ref(pass: &Arc<Self>) {
        pass.woken.store(true, Ordering::SeqCst);
        pass.task.wake();
    }
}

impl<C> WithStreams<C> {
    /// The connection's future (for a graceful shutdown).
    pub fn connection(&mut self) -> Pin<&mut C> {
        self.conn.as_mut()
    }

    /// Streams running now.
    pub fn streams(&self) -> usize {
        self.streams.len()
    }

    /// Takes the streams handed over since the last call; whether there were any.
    fn take_new(&mut self) -> bool {
        let mut new = self.spawned.new.lock().unwrap();
        let any = !new.is_empty();
        self.streams.extend(new.drain(..));
        any
    }
}

impl<C: Future> Future for WithStreams<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let me = self.get_mut();
        me.spawned.task.register(cx.waker());
        me.spawned.polling.store(true, Ordering::SeqCst);
        let polled = me.poll_rounds(cx);
        me.spawned.polling.store(false, Ordering::SeqCst);
        // Handed over from another thread as the rounds ended: poll again for it.
        if polled.is_pending() && !me.spawned.new.lock().unwrap().is_empty() {
            cx.waker().wake_by_ref();
        }
        polled
    }
}

impl<C: Future> WithStreams<C> {
    fn poll_rounds(&mut self, cx: &mut Context<'_>) -> Poll<C::Output> {
        let me = self;
        for round in 0..ROUNDS {
            // The connection: reads requests (handing their streams over) and writes the
            // frames the streams queued in the pass before.
            if let Poll::Ready(out) = me.conn.as_mut().poll(cx) {
                return Poll::Ready(out);
            }
            if !me.take_new() && round > 0 {
                // Nothing new since the streams' pass: the frames it queued are written.
                return Poll::Pending;
            }
            // Every stream that was woken (or is new), at least once; their frames go
            // out with the connection's next poll, at the top of the next round.
            me.poll_streams(cx);
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Polls the streams that are woken until none is, or until each had a pass of its
    /// own (a pass polls one at least, so every stream woken at the start is polled; a
    /// stream that keeps waking itself cannot hold the connection's task).
    fn poll_streams(&mut self, cx: &mut Context<'_>) {
        let mut passes = self.streams.len() + 1;
        loop {
            self.pass.task.register(cx.waker());
            self.pass.woken.store(false, Ordering::SeqCst);
            let mut pass = Context::from_waker(&self.pass_waker);
            while let Poll::Ready(Some(())) = self.streams.poll_next_unpin(&mut pass) {}
            passes -= 1;
            if !self.pass.woken.load(Ordering::SeqCst) || passes == 0 {
                break;
            }
        }
        // A stream woken from another thread after the last pass woke the task through
        // `task` (registered again before each pass), or set `woken` and is polled in
        // the next round or the next poll: `WithStreams::poll` leaves the task woken.
        if self.pass.woken.load(Ordering::SeqCst) {
            cx.waker().wake_by_ref();
        }
    }
}

impl std::fmt::Debug for StreamExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamExecutor").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for ConnStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnStreams").finish_non_exhaustive()
    }
}

impl<C> std::fmt::Debug for WithStreams<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WithStreams")
            .field("streams", &self.streams.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
