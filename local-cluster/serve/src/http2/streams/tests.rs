use super::*;
use hyper::rt::Executor;
use std::sync::atomic::AtomicUsize;
use tokio::sync::{oneshot, watch};

/// How long a test waits for what happens at once on an idle machine (as the accept
/// loop's tests do: this crate is below testkit).
const LONG: std::time::Duration = std::time::Duration::from_secs(30);

/// Polls `f` once, with the task's waker.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
    std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *f).poll(cx))).await
}

/// Counts the drops of what holds it.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A connection's future for the tests: it ends when `end` fires (or is dropped).
async fn connection(end: oneshot::Receiver<()>) -> &'static str {
    let _ = end.await;
    "ended"
}

/// Hands `n` streams to `exec`, each counting every change of the returned channel in
/// the returned counter; stream `panics` (if any) panics at the first change instead.
fn watchers(
    exec: &StreamExecutor,
    n: usize,
    panics: Option<usize>,
) -> (watch::Sender<u32>, Arc<AtomicUsize>) {
    let (change, rx) = watch::channel(0u32);
    let seen = Arc::new(AtomicUsize::new(0));
    for i in 0..n {
        let (mut rx, seen) = (rx.clone(), seen.clone());
        exec.execute(async move {
            while rx.changed().await.is_ok() {
                assert_ne!(Some(i), panics, "stream {i} panics at the first change");
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    (change, seen)
}

/// Streams handed to the executor run inside the connection's future (no task of their
/// own: the runtime counts none), each woken one is polled, and their results show.
#[tokio::test(flavor = "current_thread")]
async fn streams_run_in_the_connections_future() {
    let streams = ConnStreams::new();
    let exec = streams.executor();
    let (end_tx, end) = oneshot::channel();
    let mut conn = streams.serve(connection(end));
    let (change, seen) = watchers(&exec, 100, None);
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    // One poll takes them all in and parks them on the channel.
    assert!(poll_once(&mut conn).await.is_pending());
    assert_eq!(conn.streams(), 100);
    assert_eq!(
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
        tasks
    );
    // One change: the next poll of the connection runs every stream it woke.
    change.send(1).unwrap();
    assert!(poll_once(&mut conn).await.is_pending());
    assert_eq!(seen.load(Ordering::SeqCst), 100);
    change.send(2).unwrap();
    assert!(poll_once(&mut conn).await.is_pending());
    assert_eq!(seen.load(Ordering::SeqCst), 200);
    // The connection ends: so does the future, with the connection's result.
    end_tx.send(()).unwrap();
    assert_eq!(conn.await, "ended");
}

/// When the connection ends, the streams still running are dropped with it, and what is
/// handed to its executor afterwards is dropped at once (no cycle keeps either alive:
/// every stream holds the executor).
#[tokio::test(flavor = "current_thread")]
async fn streams_end_with_their_connection() {
    let streams = ConnStreams::new();
    let exec = streams.executor();
    let (end_tx, end) = oneshot::channel();
    let conn = streams.serve(connection(end));
    let dropped = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let (guard, exec) = (Dropped(dropped.clone()), exec.clone());
        exec.clone().execute(async move {
            let _guard = guard;
            let _exec = exec; // as hyper's streams hold theirs
            std::future::pending::<()>().await
        });
    }
    let conn = tokio::spawn(conn);
    end_tx.send(()).unwrap();
    assert_eq!(conn.await.unwrap(), "ended");
    assert_eq!(dropped.load(Ordering::SeqCst), 3);
    let guard = Dropped(dropped.clone());
    exec.execute(async move {
        let _guard = guard;
    });
    assert_eq!(dropped.load(Ordering::SeqCst), 4);
}

/// A stream handed over while the connection's future is not being polled (from another
/// task) wakes it; one handed over inside its poll is taken in the same poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_handed_over_from_elsewhere_wakes_the_connection() {
    let streams = ConnStreams::new();
    let exec = streams.executor();
    let (_end_tx, end) = oneshot::channel::<()>();
    let conn = tokio::spawn(streams.serve(connection(end)));
    let (ran_tx, ran) = oneshot::channel();
    let inner = exec.clone();
    let (nested_tx, nested) = oneshot::channel();
    tokio::spawn(async move {
        exec.execute(async move {
            // Handed over from inside a stream (as hyper starts an upgrade's task).
            inner.execute(async move {
                let _ = nested_tx.send(());
            });
            let _ = ran_tx.send(());
        });
    });
    tokio::time::timeout(LONG, ran).await.unwrap().unwrap();
    tokio::time::timeout(LONG, nested).await.unwrap().unwrap();
    conn.abort();
}

/// A stream whose handler panics ends alone: the connection and its other streams go on
/// (as when each stream was a task of its own, whose panic tokio caught).
#[tokio::test(flavor = "current_thread")]
async fn a_panicking_stream_ends_alone() {
    let streams = ConnStreams::new();
    let exec = streams.executor();
    let (end_tx, end) = oneshot::channel();
    let mut conn = streams.serve(connection(end));
    let (change, seen) = watchers(&exec, 3, Some(1));
    assert!(poll_once(&mut conn).await.is_pending());
    change.send(1).unwrap();
    assert!(poll_once(&mut conn).await.is_pending());
    assert_eq!(seen.load(Ordering::SeqCst), 2);
    assert_eq!(
        conn.streams(),
        2,
        "the panicked stream is gone, the others run"
    );
    change.send(2).unwrap();
    assert!(poll_once(&mut conn).await.is_pending());
    assert_eq!(seen.load(Ordering::SeqCst), 4);
    end_tx.send(()).unwrap();
    assert_eq!(conn.await, "ended");
}
