//! No request holds a connection forever, on real sockets: an answer the client does not
//! read (a zero HTTP/2 window, a socket buffer it never drains) drops the connection after
//! `write_timeout`, a body that does not come is answered 408 after `header_timeout`, and
//! HTTP/1.1 takes no more header bytes than HTTP/2. A request waiting for the app (a watch)
//! is cut by none of this.

use super::tests::{closed_within, limits, LONG};
use super::*;
use axum::body::{Body, Bytes};
use axum::routing::{get, post};
use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Bytes of each chunk of `/big`'s answer.
const CHUNK: usize = 64 * 1024;

/// An answer of `chunks` chunks that says on `dropped` when the server lets go of it (sent
/// in full, or its connection dropped).
struct Big {
    chunks: usize,
    dropped: mpsc::UnboundedSender<()>,
}

impl http_body::Body for Big {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if self.chunks == 0 {
            return Poll::Ready(None);
        }
        self.chunks -= 1;
        Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            &[b'x'; CHUNK],
        )))))
    }
}

impl Drop for Big {
    fn drop(&mut self) {
        let _ = self.dropped.send(());
    }
}

/// What a test server tells its test.
struct Seen {
    /// One message per `/big` answer let go of.
    dropped: mpsc::UnboundedReceiver<()>,
    /// One message per `/hold` request the app sees.
    held: mpsc::UnboundedReceiver<()>,
}

/// A server on `limits`: `/` answers "ok", `/big?chunks=N` N × 64 KiB, `/hold` once
/// `release` turns true, `POST /echo` the length of the body it read, `POST /ignore` an
/// answer without reading the body.
async fn server(
    limits: ConnLimits,
) -> (SocketAddr, watch::Sender<bool>, watch::Sender<bool>, Seen) {
    let (dropped_tx, dropped) = mpsc::unbounded_channel();
    let (held_tx, held) = mpsc::unbounded_channel();
    let (release_tx, release) = watch::channel(false);
    let big = move |q: axum::extract::RawQuery| {
        let chunks =
            q.0.and_then(|q| q.strip_prefix("chunks=")?.parse().ok())
                .unwrap_or(1);
        let dropped = dropped_tx.clone();
        async move { Body::new(Big { chunks, dropped }) }
    };
    let hold = move || {
        let mut release = release.clone();
        let _ = held_tx.send(());
        async move {
            let _ = release.wait_for(|r| *r).await;
            "released"
        }
    };
    let app = axum::Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/big", get(big))
        .route("/hold", get(hold))
        .route("/echo", post(|b: Bytes| async move { b.len().to_string() }))
        .route("/ignore", post(|| async { "ignored" }));
    let (stop_tx, stop) = watch::channel(false);
    let (addr, _task) = serve("127.0.0.1:0".parse().unwrap(), app, limits, None, stop).unwrap();
    (addr, stop_tx, release_tx, Seen { dropped, held })
}

/// Limits whose write timeout is short and whose other timeouts are long: only the write
/// timeout can close a connection within a test's patience.
fn write_limits() -> ConnLimits {
    ConnLimits {
        header_timeout: LONG * 6,
        idle_timeout: LONG * 6,
        ..limits(100, 100)
    }
}

/// An HTTP/2 connection that grants the server no flow-control window: answers' heads
/// arrive, their bodies never can. The request sender and the connection's task (it ends
/// when the server closes the connection).
async fn zero_window_h2(addr: SocketAddr) -> (http2::SendRequest<Body>, JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

async fn until(rx: &mut mpsc::UnboundedReceiver<()>, what: &str) {
    tokio::time::timeout(LONG, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap();
}

#[tokio::test]
async fn an_answer_behind_a_zero_http2_window_drops_its_connection() {
    let (addr, _stop, _release, mut seen) = server(write_limits()).await;
    let (mut send, conn) = zero_window_h2(addr).await;
    let req = Request::get("http://x/big?chunks=1")
        .body(Body::empty())
        .unwrap();
    // The head is not flow-controlled: it arrives. The body cannot.
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    until(
        &mut seen.dropped,
        "the server let go of the answer the client cannot take",
    )
    .await;
    tokio::time::timeout(LONG, conn)
        .await
        .expect("the server closed the connection")
        .unwrap();
}

#[tokio::test]
async fn an_answer_whose_client_never_reads_drops_its_http1_connection() {
    let (addr, _stop, _release, mut seen) = server(write_limits()).await;
    // A small receive buffer, and an answer far larger than every buffer on the way.
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    let mut s = sock.connect(addr).await.unwrap();
    s.write_all(b"GET /big?chunks=512 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    until(
        &mut seen.dropped,
        "the server let go of the answer the client does not read",
    )
    .await;
    // What was sent before the cut arrives, then the end: never the whole answer.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let read_all = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got += n,
            }
        }
    };
    tokio::time::timeout(LONG, read_all)
        .await
        .expect("the connection ends");
    assert!(got < 512 * CHUNK, "{got} bytes: the whole answer was sent");
}

#[tokio::test]
async fn a_watch_is_not_cut_by_the_write_timeout_while_the_app_has_nothing_to_send() {
    let (addr, _stop, release, mut seen) = server(write_limits()).await;
    let mut watch = TcpStream::connect(addr).await.unwrap();
    watch
        .write_all(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    until(&mut seen.held, "the app has the watch").await;
    // A zero-window client's answer is cut: the write timeout has passed since the watch
    // began, and the watch is still there and gets its answer.
    let (mut send, conn) = zero_window_h2(addr).await;
    let req = Request::get("http://x/big").body(Body::empty()).unwrap();
    let _resp = send.send_request(req).await.unwrap();
    until(&mut seen.dropped, "the zero-window answer is cut").await;
    tokio::time::timeout(LONG, conn).await.unwrap().unwrap();
    release.send(true).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(LONG, watch.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("released"));
}

/// Sends `head` (and no more) and reads the answer until the server closes.
async fn answer_to(addr: SocketAddr, head: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(head).await.unwrap();
    let mut out = Vec::new();
    let read_all = async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(LONG, read_all)
        .await
        .expect("answered and closed");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_body_that_does_not_arrive_is_answered_408() {
    let (addr, _stop, _release, _seen) = server(limits(100, 100)).await;
    let text = answer_to(
        addr,
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 408 "), "{text}");
    assert!(text.contains(r#""code":"body_timeout""#), "{text}");
    assert!(text.contains("connection: close"), "{text}");
    // A body that does arrive is read as before.
    let text = answer_to(
        addr,
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(text.ends_with("\r\n\r\n3"), "{text}");
}

#[tokio::test]
async fn an_answer_given_before_the_body_was_read_closes_the_connection() {
    // hyper closes such a connection rather than read the rest of the body: the client
    // must be told, or it sends its next request on a connection about to close.
    let (addr, _stop, _release, _seen) = server(write_limits()).await;
    let text = answer_to(
        addr,
        b"POST /ignore HTTP/1.1\r\nhost: x\r\ncontent-length: 100000\r\n\r\nabc",
    )
    .await;
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(text.contains("connection: close"), "{text}");
}

#[tokio::test]
async fn http1_takes_the_header_total_of_http2() {
    let (addr, _stop, _release, _seen) = server(write_limits()).await;
    let request = |header_bytes: usize| {
        format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-filler: {}\r\nconnection: close\r\n\r\n",
            "a".repeat(header_bytes)
        )
    };
    let limit = crate::http2::MAX_HEADER_LIST_SIZE as usize;
    let under = answer_to(addr, request(limit - 1024).as_bytes()).await;
    assert!(under.starts_with("HTTP/1.1 200 "), "{under}");
    let over = answer_to(addr, request(limit + 1024).as_bytes()).await;
    assert!(over.starts_with("HTTP/1.1 431 "), "{over}");
}

#[tokio::test]
async fn a_connection_that_never_sent_a_request_is_still_closed_by_its_header_timeout() {
    // The write clock only looks at connections with something to write: a silent one is
    // left to the header timeout, as before.
    let (addr, _stop, _release, _seen) = server(limits(100, 100)).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut silent, LONG).await);
}
