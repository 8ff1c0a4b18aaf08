//! The accept loop on real sockets: timeouts close what sends nothing, caps make room by
//! closing never-used connections, and a connection carrying a request is never cut.

use super::*;
use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A server whose `/hold` answers only when `release` turns true (a watch), on limits
/// with short timeouts.
async fn server(limits: ConnLimits) -> (SocketAddr, watch::Sender<bool>, watch::Sender<bool>) {
    let (addr, stop, release, _held) = server_counting(limits).await;
    (addr, stop, release)
}

/// [`server`], and a channel that gets one message per `/hold` request the app sees.
pub(super) async fn server_counting(
    limits: ConnLimits,
) -> (
    SocketAddr,
    watch::Sender<bool>,
    watch::Sender<bool>,
    tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    let (held_tx, held) = tokio::sync::mpsc::unbounded_channel();
    let (release_tx, release) = watch::channel(false);
    let app = axum::Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/hold",
            get(move || {
                let mut release = release.clone();
                let _ = held_tx.send(());
                async move {
                    let _ = release.wait_for(|r| *r).await;
                    "released"
                }
            }),
        );
    let (stop_tx, stop) = watch::channel(false);
    let (addr, _task) = serve("127.0.0.1:0".parse().unwrap(), app, limits, None, stop).unwrap();
    (addr, stop_tx, release_tx, held)
}

pub(super) fn limits(max_total: usize, max_per_client: usize) -> ConnLimits {
    ConnLimits {
        max_total,
        max_per_client,
        header_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(300),
        // As short as the others: the watches below outlive it many times over, and are
        // not cut by it (they wait for the app, not for the peer).
        write_timeout: Duration::from_millis(300),
        drain_timeout: DEFAULT_DRAIN_TIMEOUT,
    }
}

/// Reads until the peer closes (true) or `within` runs out (false).
pub(super) async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read_to_eof = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, read_to_eof).await.is_ok()
}

/// Sends one request on `s` and reads its whole answer (`Connection: keep-alive`).
async fn request(s: &mut TcpStream, path: &str) -> String {
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before the answer was complete: {out:?}");
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out);
        if let Some(head_end) = text.find("\r\n\r\n") {
            let len: usize = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map(|v| v.trim().parse().unwrap())
                .unwrap_or(0);
            if out.len() >= head_end + 4 + len {
                return text[head_end + 4..].to_owned();
            }
        }
    }
}

pub(super) const LONG: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_closed() {
    let (addr, _stop, _release) = server(limits(100, 100)).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET / HT").await.unwrap();
    assert!(
        closed_within(&mut silent, LONG).await,
        "a silent connection stayed open"
    );
    assert!(
        closed_within(&mut half, LONG).await,
        "half a request line stayed open"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_watch_never_is() {
    let (addr, _stop, release) = server(limits(100, 100)).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request(&mut idle, "/").await, "ok");
    let mut watch = TcpStream::connect(addr).await.unwrap();
    watch
        .write_all(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(
        closed_within(&mut idle, LONG).await,
        "an idle connection stayed open"
    );
    // The idle connection is gone, so the idle timeout has passed several times over for
    // the watch too; it is still open and gets its answer.
    release.send(true).unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(LONG, watch.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("released"));
}

#[tokio::test]
async fn at_the_per_client_cap_never_used_connections_make_room() {
    let (addr, _stop, _release) = server(ConnLimits {
        header_timeout: LONG * 6,
        idle_timeout: LONG * 6,
        ..limits(100, 4)
    })
    .await;
    let mut used = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request(&mut used, "/").await, "ok");
    // A flood of connections that send nothing: each new one closes the oldest unused.
    let mut flood = Vec::new();
    for _ in 0..20 {
        flood.push(TcpStream::connect(addr).await.unwrap());
    }
    let mut closed = 0;
    for s in &mut flood[..17] {
        closed += usize::from(closed_within(s, LONG).await);
    }
    assert_eq!(
        closed, 17,
        "all but the newest 3 unused connections were closed"
    );
    // The connection in use kept its place, and a newcomer gets in too.
    assert_eq!(request(&mut used, "/").await, "ok");
    let mut newcomer = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request(&mut newcomer, "/").await, "ok");
}

#[tokio::test]
async fn at_the_total_cap_watches_stay_and_a_newcomer_is_refused() {
    let (addr, _stop, release, mut held) = server_counting(ConnLimits {
        header_timeout: LONG * 6,
        idle_timeout: LONG * 6,
        ..limits(3, 100)
    })
    .await;
    let mut watches = Vec::new();
    for _ in 0..3 {
        let mut w = TcpStream::connect(addr).await.unwrap();
        w.write_all(b"GET /hold HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        watches.push(w);
    }
    // Once the app has all three requests, none of them can be taken for unused: a
    // fourth connection is closed at once.
    for _ in 0..3 {
        tokio::time::timeout(LONG, held.recv())
            .await
            .unwrap()
            .unwrap();
    }
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(
        closed_within(&mut extra, LONG).await,
        "a fourth connection was kept beyond the cap of 3"
    );
    release.send(true).unwrap();
    for w in &mut watches {
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(LONG, w.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("released"));
    }
}

#[tokio::test]
async fn stopping_lets_requests_finish_within_the_drain_deadline_then_drops_the_rest() {
    let (release_tx, release) = watch::channel(false);
    let app = axum::Router::new()
        .route(
            "/hold",
            get(move || {
                let mut release = release.clone();
                async move {
                    let _ = release.wait_for(|r| *r).await;
                    "released"
                }
            }),
        )
        .route("/forever", get(std::future::pending::<&'static str>));
    let drain = Duration::from_millis(600);
    let (stop_tx, stop) = watch::channel(false);
    let (addr, task) = serve(
        "127.0.0.1:0".parse().unwrap(),
        app,
        ConnLimits {
            drain_timeout: drain,
            ..limits(100, 100)
        },
        None,
        stop,
    )
    .unwrap();
    let mut finishing = TcpStream::connect(addr).await.unwrap();
    let mut stuck = TcpStream::connect(addr).await.unwrap();
    for (s, path) in [(&mut finishing, "/hold"), (&mut stuck, "/forever")] {
        let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
    }
    // Both requests reach their handlers.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let stopped = Instant::now();
    stop_tx.send(true).unwrap();
    tokio::time::sleep(drain / 3).await;
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "a stopping server accepts no connection"
    );
    release_tx.send(true).unwrap();
    let mut buf = vec![0u8; 1024];
    let n = finishing.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("released"));
    assert!(
        closed_within(&mut stuck, drain * 10).await,
        "dropped at the deadline"
    );
    tokio::time::timeout(drain * 10, task)
        .await
        .expect("the server task ends after the deadline")
        .unwrap()
        .unwrap();
    assert!(
        stopped.elapsed() >= drain,
        "the stuck request had until the deadline"
    );
}

#[test]
fn the_budget_leaves_room_for_everything_else() {
    let l = ConnLimits::default();
    assert_eq!(l.resolved(1024).max_total, 64, "never below 64");
    assert_eq!(l.resolved(65536).max_total, 65536 - 8192);
    assert_eq!(l.resolved(8192).max_total, 8192 - 1024);
    let fixed = ConnLimits {
        max_total: 100,
        ..l
    };
    assert_eq!(fixed.resolved(65536).max_total, 100);
    assert_eq!(
        ConnLimits {
            max_per_client: 0,
            header_timeout: Duration::ZERO,
            write_timeout: Duration::ZERO,
            ..l
        }
        .problems(),
        vec![
            "connections.max_per_client must be at least 1".to_owned(),
            "connections.header_timeout must be longer than 0s".to_owned(),
            "connections.write_timeout must be longer than 0s".to_owned()
        ]
    );
}

/// A TLS listener with the short limits, serving `/` ("ok"); and the CA file to trust.
pub(super) async fn tls_server(
    dir: &std::path::Path,
) -> (SocketAddr, std::path::PathBuf, watch::Sender<bool>) {
    let certs = control_tls::dev::generate(
        dir,
        &control_tls::dev::DevCertSpec {
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns: vec![],
            valid_years: 2020..2100,
        },
    )
    .unwrap();
    let tls = load_tls(TlsFiles {
        cert: certs.cert,
        key: certs.key,
    })
    .unwrap();
    let app = axum::Router::new().route("/", get(|| async { "ok" }));
    let (stop_tx, stop) = watch::channel(false);
    let (addr, _task) = serve(
        "127.0.0.1:0".parse().unwrap(),
        app,
        limits(100, 100),
        Some(tls),
        stop,
    )
    .unwrap();
    (addr, certs.ca, stop_tx)
}

#[tokio::test]
async fn a_tls_port_serves_tls_and_tells_a_plain_http_client_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, ca, _stop) = tls_server(dir.path()).await;

    // Over TLS: served.
    let config = control_tls::client::client_config(Some(&ca)).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    tls.write_all(b"GET / HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
        "{answer}"
    );

    // Plain HTTP: a 400 in the API's error shape, then the socket closes (no hang).
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer}"
    );
    assert!(
        answer.ends_with(r#"{"error":{"code":"tls_required","details":[],"message":"this port speaks TLS: use https://"}}"#),
        "{answer}"
    );
}

#[tokio::test]
async fn a_stalled_handshake_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, _ca, _stop) = tls_server(dir.path()).await;
    // Nothing at all, and the first byte of a ClientHello then nothing: both closed by the
    // header timeout (300 ms here; the bound below only keeps the test from hanging).
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut started = TcpStream::connect(addr).await.unwrap();
    started.write_all(&[0x16, 0x03, 0x01]).await.unwrap();
    assert!(closed_within(&mut silent, Duration::from_secs(10)).await);
    assert!(closed_within(&mut started, Duration::from_secs(10)).await);
}

/// At `MAX_CLOSING` the oldest evicted connections are told to drop their sockets at once
/// (the accept loop must never wait on a peer that does not read its 503), and only as
/// many as it takes to bring the polite closes under the limit.
#[test]
fn at_the_closing_limit_the_oldest_evicted_connections_are_dropped_at_once() {
    let limits = ConnLimits {
        max_total: 1_000,
        max_per_client: MAX_CLOSING + 10,
        ..ConnLimits::default()
    };
    let ip: IpAddr = "127.0.0.7".parse().unwrap();
    let mut r = Registry::default();
    let conns: Vec<_> = (0..MAX_CLOSING + 10)
        .map(|_| r.admit(ip, &limits).expect("room"))
        .collect();
    // Every new one from the same address evicts the oldest never-served one.
    for _ in 0..MAX_CLOSING + 2 {
        r.admit(ip, &limits).expect("room made");
    }
    assert_eq!(r.closing, MAX_CLOSING + 2);
    r.hurry_closing();
    let dropped: Vec<bool> = conns
        .iter()
        .map(|(_, c)| c.dropped.load(Ordering::SeqCst))
        .collect();
    let told = dropped.iter().filter(|d| **d).count();
    assert_eq!(told, 3, "{dropped:?}");
    assert!(
        dropped[..3].iter().all(|d| *d),
        "the oldest first: {dropped:?}"
    );
    assert_eq!(r.closing_conns.len(), MAX_CLOSING - 1);
    // Told ones still count as closing until their tasks close their sockets.
    assert_eq!(r.closing, MAX_CLOSING + 2);
}
