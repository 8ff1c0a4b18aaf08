//! The accept loop's limits under HTTP/2 with prior knowledge (h2c), on real sockets with
//! a real HTTP/2 client (hyper's): one connection carries many requests, and the cut-offs
//! and caps that hold for HTTP/1.1 hold for it too.

use super::tests::{closed_within, limits, server_counting, LONG};
use super::*;
use axum::body::Body;
use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The HTTP/2 connection preface and an empty SETTINGS frame: what a client sends before
/// its first request.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// One HTTP/2 connection: the request sender, and the connection's task, which ends when
/// the server closes the connection.
async fn h2(addr: SocketAddr) -> (http2::SendRequest<Body>, JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, task)
}

/// `GET path` on the connection; the answer's status and body.
async fn get(send: &mut http2::SendRequest<Body>, path: &str) -> Result<(u16, String), String> {
    let req = Request::get(format!("http://x{path}"))
        .body(Body::empty())
        .unwrap();
    let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 20)
        .await
        .map_err(|e| e.to_string())?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn one_connection_carries_many_watches_and_reads_at_once() {
    // One connection per client: a second one would be refused, so everything below
    // shares the first.
    let (addr, _stop, release, mut held) = server_counting(ConnLimits {
        header_timeout: LONG * 6,
        idle_timeout: LONG * 6,
        ..limits(100, 1)
    })
    .await;
    let (send, _conn) = h2(addr).await;
    let watches: Vec<_> = (0..100)
        .map(|_| {
            let mut send = send.clone();
            tokio::spawn(async move { get(&mut send, "/hold").await })
        })
        .collect();
    for _ in 0..100 {
        tokio::time::timeout(LONG, held.recv())
            .await
            .expect("the app has all 100 watches")
            .unwrap();
    }
    // Reads are answered while the 100 watches wait on the same connection.
    for _ in 0..20 {
        assert_eq!(get(&mut send.clone(), "/").await, Ok((200, "ok".into())));
    }
    release.send(true).unwrap();
    for w in watches {
        let answer = tokio::time::timeout(LONG, w).await.unwrap().unwrap();
        assert_eq!(answer, Ok((200, "released".into())));
    }
}

#[tokio::test]
async fn a_preface_without_a_request_is_closed() {
    // It sends the preface and its settings, then nothing; it never answers a ping either,
    // so a graceful shutdown that waited for the ping's answer would keep it open.
    let (addr, _stop, _release, _held) = server_counting(limits(100, 100)).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    silent.write_all(PREFACE).await.unwrap();
    assert!(
        closed_within(&mut silent, LONG).await,
        "an HTTP/2 connection without a request stayed open"
    );
}

#[tokio::test]
async fn an_idle_h2_connection_is_closed_but_one_carrying_a_watch_never_is() {
    let (addr, _stop, release, mut held) = server_counting(limits(100, 100)).await;
    let (mut idle, idle_conn) = h2(addr).await;
    assert_eq!(get(&mut idle, "/").await, Ok((200, "ok".into())));
    let (mut watching, watching_conn) = h2(addr).await;
    let watch = tokio::spawn(async move { get(&mut watching, "/hold").await });
    tokio::time::timeout(LONG, held.recv())
        .await
        .unwrap()
        .unwrap();
    tokio::time::timeout(LONG, idle_conn)
        .await
        .expect("an idle HTTP/2 connection stayed open")
        .unwrap();
    // The idle timeout has passed for the watching connection too: it is still open.
    assert!(!watching_conn.is_finished(), "a watch was cut");
    release.send(true).unwrap();
    let answer = tokio::time::timeout(LONG, watch).await.unwrap().unwrap();
    assert_eq!(answer, Ok((200, "released".into())));
    // Now it is idle, and closed like any other.
    tokio::time::timeout(LONG, watching_conn)
        .await
        .expect("the connection, idle after its watch, stayed open")
        .unwrap();
}

#[tokio::test]
async fn at_the_per_client_cap_never_used_h2_connections_make_room() {
    let (addr, _stop, _release, _held) = server_counting(ConnLimits {
        header_timeout: LONG * 6,
        idle_timeout: LONG * 6,
        ..limits(100, 3)
    })
    .await;
    let (mut used, _used_conn) = h2(addr).await;
    assert_eq!(get(&mut used, "/").await, Ok((200, "ok".into())));
    let mut flood = Vec::new();
    for _ in 0..10 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(PREFACE).await.unwrap();
        flood.push(s);
    }
    let mut closed = 0;
    // Room for 3: the used one and the newest 2 of the flood.
    for s in &mut flood[..8] {
        closed += usize::from(closed_within(s, LONG).await);
    }
    assert_eq!(
        closed, 8,
        "all but the newest 2 unused connections were closed"
    );
    assert_eq!(get(&mut used, "/").await, Ok((200, "ok".into())));
    let (mut newcomer, _newcomer_conn) = h2(addr).await;
    assert_eq!(get(&mut newcomer, "/").await, Ok((200, "ok".into())));
}

#[tokio::test]
async fn stopping_ends_the_connection_after_its_streams_finish_and_refuses_new_ones() {
    let (addr, stop, release, mut held) = server_counting(limits(100, 100)).await;
    let (send, conn) = h2(addr).await;
    let watch = {
        let mut send = send.clone();
        tokio::spawn(async move { get(&mut send, "/hold").await })
    };
    tokio::time::timeout(LONG, held.recv())
        .await
        .unwrap()
        .unwrap();
    stop.send(true).unwrap();
    // The GOAWAY reaches the client: a new stream is refused rather than served.
    let deadline = Instant::now() + LONG;
    loop {
        match get(&mut send.clone(), "/").await {
            Err(_) => break,
            Ok(_) => assert!(Instant::now() < deadline, "new streams kept being served"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!watch.is_finished(), "the stream in flight was cut");
    release.send(true).unwrap();
    let answer = tokio::time::timeout(LONG, watch).await.unwrap().unwrap();
    assert_eq!(answer, Ok((200, "released".into())));
    tokio::time::timeout(LONG, conn)
        .await
        .expect("the connection ended once its stream did")
        .unwrap();
}

/// Under TLS the protocol is chosen by ALPN: a client offering `h2` gets HTTP/2 on the
/// same port where one offering only `http/1.1` gets HTTP/1.1.
#[tokio::test]
async fn alpn_picks_h2_under_tls_and_http1_still_works() {
    use tokio_rustls::TlsConnector;
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca, _stop) = super::tests::tls_server(dir.path()).await;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    for (offer, want) in [
        (vec![b"h2".to_vec(), b"http/1.1".to_vec()], &b"h2"[..]),
        (vec![b"http/1.1".to_vec()], &b"http/1.1"[..]),
    ] {
        let mut config = control_tls::client::client_config(Some(&ca)).unwrap();
        config.alpn_protocols = offer;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let tls = TlsConnector::from(Arc::new(config))
            .connect(name.clone(), tcp)
            .await
            .unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(want));
        let io = TokioIo::new(tls);
        let (status, version, body) = if want == b"h2" {
            let (mut send, conn) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
            tokio::spawn(conn);
            let resp = send
                .send_request(Request::get("https://x/").body(Body::empty()).unwrap())
                .await
                .unwrap();
            (resp.status(), resp.version(), resp.into_body())
        } else {
            let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            let resp = send
                .send_request(
                    Request::get("/")
                        .header("host", "x")
                        .body(Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            (resp.status(), resp.version(), resp.into_body())
        };
        let body = axum::body::to_bytes(Body::new(body), 1 << 20)
            .await
            .unwrap();
        assert_eq!((status.as_u16(), &body[..]), (200, &b"ok"[..]));
        let expected = if want == b"h2" {
            http::Version::HTTP_2
        } else {
            http::Version::HTTP_11
        };
        assert_eq!(version, expected);
    }
}

/// The streams of an HTTP/2 connection run in the connection's task (`ConnStreams`), not
/// in a task each: 100 watches held on one connection add no task to the server's
/// runtime, and they all answer when released. (With a task per stream, as hyper's
/// default executor runs them, the server's runtime counted 100 more.)
#[test]
fn the_streams_of_a_connection_run_in_its_task() {
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (addr, _stop, release, mut held) = server_rt.block_on(server_counting(ConnLimits {
        header_timeout: LONG * 6,
        idle_timeout: LONG * 6,
        ..limits(100, 1)
    }));
    let idle_tasks = server_rt.metrics().num_alive_tasks();
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    client_rt.block_on(async {
        let (send, _conn) = h2(addr).await;
        let watches: Vec<_> = (0..100)
            .map(|_| {
                let mut send = send.clone();
                tokio::spawn(async move { get(&mut send, "/hold").await })
            })
            .collect();
        for _ in 0..100 {
            tokio::time::timeout(LONG, held.recv())
                .await
                .expect("the app has all 100 watches")
                .unwrap();
        }
        // The accept loop and the connection's task: one more than before it connected.
        let tasks = server_rt.metrics().num_alive_tasks();
        assert!(
            tasks <= idle_tasks + 1,
            "100 streams on one connection: {tasks} tasks, {idle_tasks} before it"
        );
        release.send(true).unwrap();
        for w in watches {
            let answer = tokio::time::timeout(LONG, w).await.unwrap().unwrap();
            assert_eq!(answer, Ok((200, "released".into())));
        }
    });
}

/// Counts the writes that reach it: the socket's system calls, under the batching.
struct CountWrites<T> {
    inner: T,
    writes: Arc<AtomicUsize>,
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CountWrites<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for CountWrites<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(_)) = r {
            self.writes.fetch_add(1, Ordering::SeqCst);
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// One change that gives each of 100 streams of a connection an event of 400 bytes (an
/// SSE event of a 3-replica service is about that) leaves in one or two writes, as the
/// host serves HTTP/2 (`ConnStreams`, `BatchedWrites`, its settings). They left in 50
/// (two frames a write) before both of these were fixed: a pass of the connection's
/// streams ended after two of them had queued a frame (`Pass`), and h2 flushes before
/// each data frame of 256 bytes or more, where the batching wrote at the second flush.
#[tokio::test(flavor = "current_thread")]
async fn one_change_of_100_streams_leaves_in_one_write() {
    const STREAMS: usize = 100;
    const EVENT: usize = 400;
    let (client_io, server_io) = tokio::io::duplex(4 << 20);
    let writes = Arc::new(AtomicUsize::new(0));
    let (change, changes) = watch::channel(0u32);
    // Each request: an answer whose body yields one event per change.
    let app = hyper::service::service_fn(move |_: Request<Incoming>| {
        let events = futures_util::stream::unfold(changes.clone(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some((Ok::<_, Infallible>(vec![b'e'; EVENT]), rx))
        });
        async move { Ok::<_, Infallible>(Response::new(Body::from_stream(events))) }
    });
    let server_writes = writes.clone();
    tokio::spawn(async move {
        let streams = crate::http2::ConnStreams::new();
        let mut builder = auto::Builder::new(streams.executor());
        crate::http2::configure(&mut builder.http2());
        let io = CountWrites {
            inner: server_io,
            writes: server_writes,
        };
        let io = TokioIo::new(crate::http2::BatchedWrites::new(io));
        let _ = streams.serve(builder.serve_connection(io, app)).await;
    });
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .initial_connection_window_size(16 << 20)
        .handshake(TokioIo::new(client_io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let received = Arc::new(AtomicUsize::new(0));
    let arrived = Arc::new(Notify::new());
    let mut answers = Vec::new();
    for _ in 0..STREAMS {
        let req = Request::get("http://x/events").body(Body::empty()).unwrap();
        answers.push(send.clone().send_request(req));
    }
    for answer in answers {
        let mut body = Body::new(answer.await.unwrap().into_body()).into_data_stream();
        let (received, arrived) = (received.clone(), arrived.clone());
        tokio::spawn(async move {
            use futures_util::StreamExt as _;
            while let Some(Ok(data)) = body.next().await {
                received.fetch_add(data.len(), Ordering::SeqCst);
                arrived.notify_one();
            }
        });
    }
    // Every answer's head arrived: what the server wrote so far is out.
    let before = writes.load(Ordering::SeqCst);
    change.send(1).unwrap();
    tokio::time::timeout(LONG, async {
        while received.load(Ordering::SeqCst) < STREAMS * EVENT {
            arrived.notified().await;
        }
    })
    .await
    .expect("every stream has its event");
    let took = writes.load(Ordering::SeqCst) - before;
    assert!(
        (1..=2).contains(&took),
        "{STREAMS} events of {EVENT} bytes on one connection left in {took} writes"
    );
}
