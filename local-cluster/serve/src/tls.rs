//! TLS on an accepted connection, before HTTP sees it: the handshake (bounded in time, and
//! cut short when the connection is closed to make room or the server stops), a plain-HTTP
//! client told at once that the port speaks TLS, and the failures counted by reason.

use control_tls::server::ServerTls;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::TcpStream;
use tracing::{debug, warn};

/// The ALPN protocols offered, most preferred first: the connection builder (hyper-util's
/// auto builder) tells HTTP/2 from HTTP/1.1 by the preface, so a client that picks `h2`
/// gets HTTP/2 and one that offers only `http/1.1` (or no ALPN) gets HTTP/1.1.
pub(crate) const ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// A connection's byte stream: the TCP socket, or TLS over it.
#[derive(Debug)]
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// Why a handshake failed (the `reason` label of `xce_tls_handshake_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The client spoke plain HTTP (or something else that is not TLS).
    PlainHttp,
    /// The handshake was not complete within the header timeout.
    Timeout,
    /// The client refused our certificate (an alert: unknown CA, bad or expired
    /// certificate).
    CertificateRefused,
    /// Closed before or during the handshake.
    Closed,
    /// Any other TLS protocol error.
    Protocol,
}

impl Failure {
    fn label(self) -> &'static str {
        match self {
            Failure::PlainHttp => "plain_http",
            Failure::Timeout => "timeout",
            Failure::CertificateRefused => "certificate_refused",
            Failure::Closed => "closed",
            Failure::Protocol => "protocol",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

/// Failed handshakes of every TLS listener of the process, by reason.
static FAILURES: LazyLock<Family<Reason, Counter>> = LazyLock::new(Family::default);

/// Adds `xce_tls_handshake_failures_total{reason}` to a server's registry.
pub fn register_metrics(registry: &mut Registry) {
    registry.register(
        "xce_tls_handshake_failures",
        "TLS handshakes that failed on the API port, by reason (plain_http, timeout, certificate_refused, closed, protocol)",
        FAILURES.clone(),
    );
}

/// The first byte of a TLS record carrying a handshake (the ClientHello).
const TLS_HANDSHAKE: u8 = 0x16;

/// Completes the TLS handshake on `stream` within `timeout` (or passes it through without
/// `tls`). A client that speaks plain HTTP gets a 400 naming the problem and the socket
/// closes; every failure is counted and logged with the peer.
pub(crate) async fn handshake(
    tls: Option<&ServerTls>,
    stream: TcpStream,
    peer: SocketAddr,
    timeout: Duration,
) -> Result<Stream, Failure> {
    let Some(tls) = tls else {
        return Ok(Stream::Plain(stream));
    };
    let result = tokio::time::timeout(timeout, accept(tls, stream, peer))
        .await
        .unwrap_or(Err(Failure::Timeout));
    if let Err(f) = result {
        FAILURES.get_or_create(&Reason { reason: f.label() }).inc();
        match f {
            Failure::PlainHttp => log_limited(
                &PLAIN_LOGGED,
                |n| warn!(%peer, since_last_line = n, "plain HTTP on a TLS port from {peer}: answered 400 (use https://)"),
            ),
            Failure::CertificateRefused => log_limited(
                &REFUSED_LOGGED,
                |n| warn!(%peer, since_last_line = n, "TLS client {peer} refused this server's certificate (does it trust the CA?)"),
            ),
            Failure::Timeout => {
                debug!(%peer, ?timeout, "TLS handshake not complete in time: closed")
            }
            Failure::Closed | Failure::Protocol => {
                debug!(%peer, reason = f.label(), "TLS handshake failed")
            }
        }
    }
    result
}

async fn accept(tls: &ServerTls, stream: TcpStream, peer: SocketAddr) -> Result<Stream, Failure> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(0) | Err(_) => return Err(Failure::Closed),
        Ok(_) => {}
    }
    if first[0] != TLS_HANDSHAKE {
        refuse_plain(stream).await;
        return Err(Failure::PlainHttp);
    }
    match tls.acceptor().accept(stream).await {
        Ok(s) => Ok(Stream::Tls(Box::new(s))),
        Err(e) => {
            let refused = e
                .get_ref()
                .and_then(|i| i.downcast_ref::<rustls::Error>())
                .is_some_and(
                    |r| matches!(r, rustls::Error::AlertReceived(a) if is_certificate_alert(*a)),
                );
            debug!(%peer, error = %e, "TLS handshake error");
            Err(if refused {
                Failure::CertificateRefused
            } else if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Failure::Closed
            } else {
                Failure::Protocol
            })
        }
    }
}

fn is_certificate_alert(a: rustls::AlertDescription) -> bool {
    use rustls::AlertDescription as A;
    matches!(
        a,
        A::UnknownCA
            | A::BadCertificate
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateRevoked
    )
}

/// Answers a plain-HTTP client with one 400 in the API's error shape and closes: it
/// learns what is wrong at once, instead of waiting for a handshake that never comes.
async fn refuse_plain(mut stream: TcpStream) {
    let body = serde_json::to_string(&plugin_api::ErrorBody {
        error: plugin_api::ErrorInfo {
            code: "tls_required".into(),
            details: Vec::new(),
            message: "this port speaks TLS: use https://".into(),
        },
    })
    .expect("an error body serializes");
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    // Best effort, and never waiting on the client: the caller's timeout bounds this.
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

static PLAIN_LOGGED: LogLimit = LogLimit::new();
static REFUSED_LOGGED: LogLimit = LogLimit::new();

/// At most one line a second per kind, with how many were not logged since: a flood of
/// bad clients must not flood the log.
pub(crate) struct LogLimit {
    last_second: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimit {
    pub(crate) const fn new() -> Self {
        LogLimit {
            last_second: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

pub(crate) fn log_limited(limit: &LogLimit, log: impl FnOnce(u64)) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = limit.last_second.load(Ordering::Relaxed);
    if last != now
        && limit
            .last_second
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        log(limit.suppressed.swap(0, Ordering::Relaxed) + 1);
    } else {
        limit.suppressed.fetch_add(1, Ordering::Relaxed);
    }
}

// === impl Stream ===

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}
