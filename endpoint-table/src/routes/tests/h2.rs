//! The endpoint routes over HTTP/2 with prior knowledge, on a real socket, served with the
//! apiserver's HTTP/2 settings (`xce_serve::http2`) and read by a real HTTP/2 client
//! (hyper's): reads, blocking queries and SSE streams share one connection, many at once;
//! every change reaches them all at once (an event is not held back until a frame fills);
//! and the watcher limits count requests (streams), not connections.

use super::*;
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use std::net::SocketAddr;

/// Serves `router` on a loopback port, HTTP/1.1 and h2c, as the apiserver does.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let router = router.clone();
            tokio::spawn(async move {
                let mut builder = auto::Builder::new(TokioExecutor::new());
                xce_serve::http2::configure(&mut builder.http2());
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    router.clone().oneshot(req.map(Body::new))
                });
                let _ = builder.serve_connection(TokioIo::new(tcp), svc).await;
            });
        }
    });
    addr
}

/// One HTTP/2 connection to `addr`.
async fn connect(addr: SocketAddr) -> http2::SendRequest<Body> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// Sends `line` (see [`Cluster::request`]) on the connection.
async fn h2_get(send: &http2::SendRequest<Body>, line: &str) -> Response<Body> {
    let mut req = Cluster::request(line);
    *req.uri_mut() = format!("http://x{}", req.uri()).parse().unwrap();
    let call = send.clone().send_request(req);
    let resp = tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap();
    assert_eq!(resp.version(), axum::http::Version::HTTP_2);
    resp.map(Body::new)
}

#[tokio::test]
async fn reads_blocking_queries_and_streams_share_one_connection() {
    let c = Cluster::new(TableConfig::default()).await;
    let send = connect(serve(c.router.clone()).await).await;
    const BLOCKING: usize = 60;
    const STREAMS: usize = 40;
    let blocking: Vec<_> = (0..BLOCKING)
        .map(|_| {
            let send = send.clone();
            tokio::spawn(async move {
                let line = "alice /v1/services/web/endpoints?index=10&wait=60s";
                render(h2_get(&send, line).await).await
            })
        })
        .collect();
    let mut streams = Vec::new();
    for _ in 0..STREAMS {
        let resp = h2_get(&send, "alice /v1/services/web/endpoints/stream").await;
        let mut events = Events::new(resp);
        let first = events.next().await.unwrap();
        assert!(first.starts_with("id: 10\n"), "{first}");
        streams.push(events);
    }
    c.watchers_reach(BLOCKING + STREAMS).await;
    // Reads on the same connection are answered while the watches wait.
    for _ in 0..20 {
        let read = render(h2_get(&send, "alice /v1/services/web/endpoints?format=plain").await);
        assert_eq!(
            read.await,
            "200 content-type=text/plain; charset=utf-8 x-xce-index=10\n\
             127.0.0.11:20417\n[fd00::2]:20418\n"
        );
    }
    assert!(
        blocking.iter().all(|b| !b.is_finished()),
        "a blocking query answered early"
    );

    // One change: every blocking query answers, every stream has the event.
    let mut j2 = web_job("j-2", 1, "exec-02", 20418);
    j2.ready = false;
    c.event(ev_job(11, j2)).await;
    for b in blocking {
        let answer = tokio::time::timeout(PATIENCE, b).await.unwrap().unwrap();
        assert!(
            answer.starts_with("200 content-type=application/json x-xce-index=11\n"),
            "{answer}"
        );
        assert!(!answer.contains("20418"), "{answer}");
    }
    for s in &mut streams {
        let event = s.next().await.unwrap();
        assert!(event.starts_with("id: 11\n"), "{event}");
        assert!(!event.contains("20418"), "{event}");
    }
    drop(streams);
    c.watchers_reach(0).await;
}

#[tokio::test]
async fn watcher_limits_count_streams_not_connections() {
    let c = Cluster::new(small(|c| {
        c.max_watchers = 4;
        c.max_watchers_per_principal = 3;
    }))
    .await;
    let send = connect(serve(c.router.clone()).await).await;
    let stream = "/v1/services/web/endpoints/stream";
    let mut alice = Vec::new();
    for _ in 0..3 {
        let resp = h2_get(&send, &format!("alice {stream}")).await;
        alice.push(Events::new(resp));
    }
    // A fourth of alice's on the same connection is over her limit...
    let over = render(h2_get(&send, &format!("alice {stream}")).await).await;
    assert!(over.starts_with("429 "), "{over}");
    assert!(
        over.contains(r#"too many watchers for \"alice\" (at most 3)"#),
        "{over}"
    );
    let blocking = "alice /v1/services/web/endpoints?index=10&wait=60s";
    assert!(render(h2_get(&send, blocking).await)
        .await
        .starts_with("429 "));
    // ...dana's first is not, and the next one is over the total of 4.
    let dana = Events::new(h2_get(&send, &format!("dana {stream}")).await);
    let total = render(h2_get(&send, &format!("dana {stream}")).await).await;
    assert!(
        total.contains("too many watchers on this apiserver"),
        "{total}"
    );
    // Ending one of alice's streams (a stream reset, the connection stays) frees her slot.
    alice.pop();
    c.watchers_reach(3).await;
    let again = h2_get(&send, &format!("alice {stream}")).await;
    assert_eq!(again.status(), 200);
    drop((alice, dana, again));
    c.watchers_reach(0).await;
}

#[tokio::test]
async fn a_stream_that_is_not_read_is_cut_off_and_its_connection_carries_on() {
    let c = Cluster::new(small(|c| c.stream_buffer = 2)).await;
    let addr = serve(c.router.clone()).await;
    // A client whose streams get 1 KiB of window: an unread stream stalls after a few
    // events, as a reader that stopped reading does.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(1024)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let stream = "alice /v1/services/web/endpoints/stream";
    let unread = h2_get(&send, stream).await;
    assert_eq!(unread.status(), 200);
    let mut reader = Events::new(h2_get(&send, stream).await);
    assert!(reader.next().await.unwrap().starts_with("id: 10\n"));
    c.watchers_reach(2).await;
    // Each change is an event of about 400 bytes; the reader reads every one.
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    let mut rev = 10;
    while c.api.shared().watcher_count() == 2 {
        assert!(rev < 100, "the unread stream was never cut off");
        rev += 1;
        j3.ready = !j3.ready;
        c.event(ev_job(rev, j3.clone())).await;
        let event = reader.next().await.unwrap();
        assert!(event.starts_with(&format!("id: {rev}\n")), "{event}");
    }
    // The unread stream was cut off; the reader on the same connection goes on.
    c.watchers_reach(1).await;
    assert!(c
        .metrics()
        .contains("xce_endpoint_streams_lagged_total{kind=\"stream\"} 1\n"));
    rev += 1;
    j3.ready = !j3.ready;
    c.event(ev_job(rev, j3)).await;
    let event = reader.next().await.unwrap();
    assert!(event.starts_with(&format!("id: {rev}\n")), "{event}");
    drop(unread);
}
