//! Serving HTTP so that nobody who can reach the port can take it down (docs/design.md#isolation).
//!
//! `axum::serve` keeps every accepted connection for as long as the peer likes: 20,000
//! connections that never send a byte used up the process's file descriptors, and then
//! neither authenticated readers nor `/healthz` got an answer. This accept loop bounds what
//! a client can hold:
//!
//! - a connection that has not sent complete request headers within `header_timeout` is
//!   closed (hyper's header timeout, and our own timer for one that sends nothing);
//! - a keep-alive connection with no request in flight for `idle_timeout` is closed; a
//!   connection carrying a request (a blocking query, an SSE stream: a *watch*) is never
//!   closed by any limit here;
//! - at most `max_total` connections, and `max_per_client` per client address. At a cap, the
//!   oldest connection that has never had a request is closed to make room (a flood of idle
//!   connections cannot lock real clients out); when there is none, the new connection is
//!   closed at once. Either is logged, at most once a second with a count.
//!
//! Every connection speaks HTTP/1.1 or HTTP/2 with prior knowledge (h2c), told apart by
//! the client's first bytes; the HTTP/2 settings are `http2.rs`'s. The limits
//! above hold for both: under HTTP/2 a request in flight is any open stream, a connection
//! that sends the preface but no request is closed after `header_timeout`, and a closing
//! connection whose peer does not finish the shutdown (HTTP/2 waits for a ping's answer)
//! is dropped after `header_timeout` more.
//!
//! Stopping (a SIGTERM) is graceful within a deadline: the listener closes, every
//! connection finishes the requests in flight (the hosts make blocking queries answer and
//! streams end at once) and closes; connections still open after `drain_timeout` are
//! dropped, so a stop never waits on a client.
//!
//! With TLS (a [`ServerTls`]), the accepted stream is wrapped before HTTP sees it
//! (`tls.rs`): the handshake must complete within `header_timeout` like the headers (a
//! slow client holds no slot for longer), a client speaking plain HTTP gets a 400 saying
//! the port speaks TLS and the socket closes at once, and failed handshakes are counted.
//!
//! It is the one home of what every HTTP server here shares (the controller, a standby,
//! a separate apiserver): this accept loop, and the shared answers of `responses.rs`
//! (error answers in the JSON shape, `/metrics`).

pub mod audit;
pub mod auth;
pub mod http2;
pub mod keyring;
pub mod limits;
mod responses;
mod tls;

pub use control_tls::server::{ServerTls, TlsFiles};
pub use responses::{json_errors, metrics_response};
pub use tls::register_metrics as register_tls_metrics;

/// Loads a serving certificate for these listeners (offering the ALPN protocols their
/// connection builder speaks).
pub fn load_tls(files: TlsFiles) -> Result<ServerTls, control_tls::TlsError> {
    ServerTls::load(files, tls::ALPN)
}

use anyhow::Context as _;
use axum::body::Body;
use http::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

/// How many connections clients may hold, and for how long when they do nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnLimits {
    /// Open connections in total. `0`: derived from the open-file limit (see
    /// [`ConnLimits::resolved`]).
    pub max_total: usize,
    /// Open connections per client address.
    pub max_per_client: usize,
    /// Time a client has to send complete request headers.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time a connection may stay open with no request in flight.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// When stopping, the time requests in flight get to finish; connections still open
    /// then are dropped.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_total: 0,
            max_per_client: 2048,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// How long a stopping server lets requests in flight finish (see
/// [`ConnLimits::drain_timeout`]).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// File descriptors kept out of the connection budget, for everything else the process
/// opens (the store, etcd and worker clients, replicas' pidfds and probes in `xced dev`).
const FD_RESERVE_MIN: usize = 1024;

impl ConnLimits {
    /// Every problem with these limits.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.max_per_client == 0 {
            out.push("connections.max_per_client must be at least 1".to_owned());
        }
        if self.header_timeout.is_zero() {
            out.push("connections.header_timeout must be longer than 0s".to_owned());
        }
        if self.idle_timeout.is_zero() {
            out.push("connections.idle_timeout must be longer than 0s".to_owned());
        }
        out
    }

    /// The limits with `max_total` filled in from the open-file limit `nofile`: the
    /// connections may use what is left after a reserve (an eighth, at least 1024), so a
    /// flood runs into this cap, never into "too many open files".
    pub fn resolved(mut self, nofile: u64) -> Self {
        let nofile = usize::try_from(nofile).unwrap_or(usize::MAX);
        let budget = nofile
            .saturating_sub(FD_RESERVE_MIN.max(nofile / 8))
            .max(64);
        self.max_total = match self.max_total {
            0 => budget,
            n => n.min(budget),
        };
        self
    }
}

/// The listen backlog: thousands of watchers reconnecting at once (an apiserver restart)
/// must not overflow the accept queue (tokio's default of 1,024 did in the scale bench:
/// thousands of SYN retransmits, seconds of delay). The kernel caps it at `somaxconn`.
const BACKLOG: u32 = 8192;

/// Binds `addr` for an HTTP server, with address reuse (a restarted daemon gets its port
/// back at once) and a deep accept queue.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// Binds `addr` (see [`listen`]) and serves `app` on it within `limits`, over TLS when
/// `tls` is given, until `stop` turns true; then the listener closes and every connection shuts down gracefully
/// (in-flight requests finish), for at most `limits.drain_timeout`: the connections
/// still open then are dropped. The task ends when every connection has.
pub fn serve(
    addr: SocketAddr,
    app: axum::Router,
    limits: ConnLimits,
    tls: Option<ServerTls>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, JoinHandle<std::io::Result<()>>)> {
    let listener = listen(addr).with_context(|| format!("cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    let limits = if limits.max_total == 0 {
        limits.resolved(crate::limits::nofile().0)
    } else {
        limits
    };
    info!(%addr, max_connections = limits.max_total, max_per_client = limits.max_per_client,
          header_timeout = ?limits.header_timeout, idle_timeout = ?limits.idle_timeout,
          tls = tls.is_some(), "apiserver listening");
    let server = tokio::spawn(accept_loop(listener, app, limits, tls, stop));
    Ok((addr, server))
}

/// What the accept loop knows of the open connections.
#[derive(Debug, Default)]
struct Registry {
    next: u64,
    total: usize,
    per_client: HashMap<IpAddr, usize>,
    /// Connections that have not had a request yet, oldest first: the ones closed to
    /// make room at a cap.
    unserved: BTreeMap<u64, (IpAddr, Arc<Conn>)>,
    unserved_of: HashMap<IpAddr, BTreeSet<u64>>,
    /// Evicted connections whose sockets are not closed yet (see [`MAX_CLOSING`]).
    closing: usize,
    /// Refusals and evictions since the last log line, and when that was.
    refused: u64,
    evicted: u64,
    logged: Option<Instant>,
}

impl Registry {
    fn served(&mut self, id: u64) {
        if let Some((ip, _)) = self.unserved.remove(&id) {
            if let Some(s) = self.unserved_of.get_mut(&ip) {
                s.remove(&id);
                if s.is_empty() {
                    self.unserved_of.remove(&ip);
                }
            }
        }
    }

    fn closed(&mut self, id: u64, ip: IpAddr) {
        self.served(id);
        self.total -= 1;
        if let Some(n) = self.per_client.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_client.remove(&ip);
            }
        }
    }

    /// Makes room for one more connection from `ip` by closing never-served ones;
    /// false when the caps leave no room.
    fn make_room(&mut self, ip: IpAddr, limits: &ConnLimits) -> bool {
        if self.per_client.get(&ip).copied().unwrap_or(0) >= limits.max_per_client {
            let Some(victim) = self.unserved_of.get(&ip).and_then(|s| s.first().copied()) else {
                self.refused += 1;
                return false;
            };
            self.evict(victim);
        }
        if self.total >= limits.max_total {
            let Some(victim) = self.unserved.keys().next().copied() else {
                self.refused += 1;
                return false;
            };
            self.evict(victim);
        }
        true
    }

    /// Closes a never-served connection now; it counts as closed at once (its task ends
    /// soon after) so the caps hold.
    fn evict(&mut self, id: u64) {
        if let Some((ip, conn)) = self.unserved.get(&id).cloned() {
            conn.evicted.store(true, Ordering::SeqCst);
            conn.wake.notify_one();
            self.closed(id, ip);
            self.evicted += 1;
            // Its socket stays open until its task runs and drops it: counted here until
            // then, so the accept loop cannot outrun the closing (descriptors stay bounded).
            self.closing += 1;
        }
    }

    fn log_pressure(&mut self, limits: &ConnLimits) {
        if self.refused == 0 && self.evicted == 0 {
            return;
        }
        let now = Instant::now();
        if self
            .logged
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            return;
        }
        warn!(
            open = self.total,
            max_connections = limits.max_total,
            max_per_client = limits.max_per_client,
            refused = self.refused,
            closed_idle = self.evicted,
            "connection cap reached: new connections refused, or never-used ones closed to make room"
        );
        self.refused = 0;
        self.evicted = 0;
        self.logged = Some(now);
    }
}

/// One connection's state, shared by its task, its requests and the registry.
#[derive(Debug, Default)]
struct Conn {
    in_flight: AtomicUsize,
    /// Whether a request was ever made on it.
    served: AtomicBool,
    /// Closed by the registry to make room.
    evicted: AtomicBool,
    /// A request started or ended, or the registry evicted it.
    wake: Notify,
}

/// At most this many evicted connections may be waiting for their sockets to close before
/// the accept loop waits for them: at a cap, a flood can otherwise be accepted faster than
/// the evicted sockets close, and the process runs out of descriptors after all.
const MAX_CLOSING: usize = 64;

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    tls: Option<ServerTls>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let registry = Arc::new(Mutex::new(Registry::default()));
    let closed = Arc::new(Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        // Wait while too many evicted sockets are still open.
        loop {
            let wait = closed.notified();
            if registry.lock().unwrap().closing < MAX_CLOSING {
                break;
            }
            tokio::select! {
                () = wait => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // EMFILE and friends: wait a little instead of spinning; connections that
                // end free descriptors.
                warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let ip = peer.ip();
        let (id, conn) = {
            let mut r = registry.lock().unwrap();
            let room = r.make_room(ip, &limits);
            r.log_pressure(&limits);
            if !room {
                drop(stream);
                continue;
            }
            r.next += 1;
            let id = r.next;
            r.total += 1;
            *r.per_client.entry(ip).or_default() += 1;
            let conn = Arc::new(Conn::default());
            r.unserved.insert(id, (ip, conn.clone()));
            r.unserved_of.entry(ip).or_default().insert(id);
            (id, conn)
        };
        let _ = stream.set_nodelay(true);
        tasks.spawn(connection(
            (stream, peer, tls.clone()),
            app.clone(),
            limits,
            conn,
            (id, ip),
            (registry.clone(), closed.clone()),
            stop.clone(),
        ));
    }
    // Graceful: every connection finishes its in-flight requests (blocking queries and
    // streams answer at once on shutdown) and ends; within the drain deadline.
    drop(listener);
    let drained = tokio::time::timeout(limits.drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            connections = tasks.len(),
            drain_timeout = ?limits.drain_timeout,
            "drain deadline reached: dropping the connections still open"
        );
        tasks.shutdown().await;
    }
    Ok(())
}

/// The peer address of a request's connection (a request extension), for logs that
/// must say who sent something.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub IpAddr);

#[allow(clippy::too_many_arguments)]
async fn connection(
    (stream, peer, tls): (tokio::net::TcpStream, SocketAddr, Option<ServerTls>),
    app: axum::Router,
    limits: ConnLimits,
    conn: Arc<Conn>,
    (id, ip): (u64, IpAddr),
    (registry, closed): (Arc<Mutex<Registry>>, Arc<Notify>),
    mut stop: watch::Receiver<bool>,
) {
    // TLS first: the handshake is bounded by the header timeout, and given up when the
    // connection is closed to make room or the server stops.
    let handshake = tls::handshake(tls.as_ref(), stream, peer, limits.header_timeout);
    let stream = tokio::select! {
        r = handshake => r.ok(),
        () = evicted(&conn) => None,
        _ = stop.wait_for(|s| *s) => None,
    };
    let Some(stream) = stream else {
        account_closed(&conn, (id, ip), &registry, &closed);
        return;
    };
    let svc = {
        let conn = conn.clone();
        let registry = registry.clone();
        hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let guard = InFlight::start(&conn);
            // Under the registry's lock, so a connection is either closed to make room
            // before its first request, or served: never both.
            let evicted = !conn.served.swap(true, Ordering::SeqCst) && {
                let mut r = registry.lock().unwrap();
                r.served(id);
                conn.evicted.load(Ordering::SeqCst)
            };
            let mut app = app.clone();
            let version = req.version();
            let mut req = req;
            req.extensions_mut().insert(Peer(ip));
            async move {
                if evicted {
                    let resp = plugin_api::ApiError::new(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable",
                        "too many connections; try again",
                    );
                    let mut resp = axum::response::IntoResponse::into_response(resp);
                    // HTTP/2 has no `Connection` header (it is a protocol error there):
                    // its connection is closed by the GOAWAY of the shutdown below.
                    if version < http::Version::HTTP_2 {
                        resp.headers_mut().insert(
                            http::header::CONNECTION,
                            http::HeaderValue::from_static("close"),
                        );
                    }
                    return Ok(resp.map(|b| {
                        Body::new(Guarded {
                            inner: b,
                            _guard: guard,
                        })
                    }));
                }
                use tower::Service as _;
                let resp = app.call(req.map(Body::new)).await;
                resp.map(|r| {
                    r.map(|b| {
                        Body::new(Guarded {
                            inner: b,
                            _guard: guard,
                        })
                    })
                })
            }
        })
    };
    // HTTP/1.1 or HTTP/2 with prior knowledge (h2c), told apart by the client's first
    // bytes (the HTTP/2 preface). Every limit here holds for both: the timers below watch
    // requests in flight, which under HTTP/2 are the connection's open streams.
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    crate::http2::configure(&mut builder.http2());
    // Boxed so it can be dropped (its socket closed) before the accounting below.
    // HTTP/2 writes batched across streams (`BatchedWrites`: a fan-out's answers share
    // system calls); HTTP/1.1 passes through.
    let io = TokioIo::new(crate::http2::BatchedWrites::new(stream));
    let mut c = Box::pin(builder.serve_connection_with_upgrades(io, svc));
    let mut idle_since = Instant::now();
    // When a graceful shutdown began.
    let mut closing: Option<Instant> = None;
    loop {
        let idle = conn.in_flight.load(Ordering::SeqCst) == 0;
        let timeout = if conn.served.load(Ordering::SeqCst) {
            limits.idle_timeout
        } else {
            limits.header_timeout
        };
        let deadline = match closing {
            None => idle.then_some(idle_since + timeout),
            // Closing with nothing in flight: the peer gets `header_timeout` (from the
            // later of the shutdown and the last answer, whose bytes may still be on their
            // way out) to let the shutdown finish, then the socket is dropped. HTTP/2's
            // graceful shutdown waits for the answer to a ping after its GOAWAY, which a
            // client that sent only the preface never gives.
            Some(since) => idle.then_some(since.max(idle_since) + limits.header_timeout),
        };
        tokio::select! {
            r = c.as_mut() => {
                if let Err(e) = r {
                    debug!(client = %ip, error = %e, "connection ended with an error");
                }
                break;
            }
            () = conn.wake.notified() => {
                idle_since = Instant::now();
                if conn.evicted.load(Ordering::SeqCst) && closing.is_none() {
                    if !conn.served.load(Ordering::SeqCst) {
                        break; // never used: close the socket now
                    }
                    closing = Some(Instant::now());
                    c.as_mut().graceful_shutdown();
                }
            }
            () = sleep_until(deadline) => {
                if conn.in_flight.load(Ordering::SeqCst) == 0 {
                    if closing.is_some() {
                        debug!(client = %ip, "connection did not finish closing: dropped");
                        break;
                    }
                    debug!(client = %ip, "idle connection closed");
                    closing = Some(Instant::now());
                    c.as_mut().graceful_shutdown();
                }
            }
            _ = stop.wait_for(|s| *s), if closing.is_none() => {
                closing = Some(Instant::now());
                c.as_mut().graceful_shutdown();
            }
        }
    }
    drop(c);
    account_closed(&conn, (id, ip), &registry, &closed);
}

/// Resolves once the registry has closed the connection to make room.
async fn evicted(conn: &Conn) {
    loop {
        let woken = conn.wake.notified();
        if conn.evicted.load(Ordering::SeqCst) {
            return;
        }
        woken.await;
    }
}

/// Tells the registry a connection's socket is closed.
fn account_closed(
    conn: &Conn,
    (id, ip): (u64, IpAddr),
    registry: &Mutex<Registry>,
    closed: &Notify,
) {
    let mut r = registry.lock().unwrap();
    if conn.evicted.load(Ordering::SeqCst) {
        r.closing -= 1;
        closed.notify_one();
    } else {
        r.closed(id, ip);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A request in flight on a connection: from its headers to the end of its answer's body
/// (a stream's body ends when the stream does).
#[derive(Debug)]
struct InFlight(Arc<Conn>);

impl InFlight {
    fn start(conn: &Arc<Conn>) -> Self {
        conn.in_flight.fetch_add(1, Ordering::SeqCst);
        conn.wake.notify_one();
        InFlight(conn.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.wake.notify_one();
    }
}

/// An answer's body that keeps its request [`InFlight`] until it is done or dropped.
struct Guarded {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[allow(dead_code)]
fn _assert_types(_: Response<Body>) {}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_h2;
