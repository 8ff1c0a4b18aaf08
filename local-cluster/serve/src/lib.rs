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
//!   connection carrying a request (a blocking query, an SSE stream: a *watch*) is not
//!   closed for being idle;
//! - no request holds its connection forever (`exchange.rs`): an answer the peer does not
//!   take for `write_timeout` (a zero HTTP/2 flow-control window, a socket buffer that
//!   stays full) drops the connection, and a request body that does not arrive within
//!   `header_timeout` of its headers is answered 408;
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
//! is dropped after `header_timeout` more. One closed to make room is dropped
//! `header_timeout` after it was closed whatever it has in flight (its 503 may never be
//! read), so the accept loop, which waits while [`MAX_CLOSING`] of them are closing, never
//! waits longer than that. HTTP/1.1 accepts at most 64 KiB of request headers, as HTTP/2
//! does ([`http2::MAX_HEADER_LIST_SIZE`]).
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
mod exchange;
pub mod http1;
pub mod http2;
pub mod keyring;
pub mod limits;
mod responses;
mod tls;
pub mod version;

pub use control_tls::server::{ServerTls, TlsFiles};
pub use responses::{json_errors, metrics_response};
pub use tls::register_metrics as register_tls_metrics;

/// Adds the metrics of every listener of the process to a server's registry: failed TLS
/// handshakes (`xce_tls_handshake_failures_total`) and peers cut off for not reading or
/// sending in time (`xce_http_timeouts_total`).
pub fn register_metrics(registry: &mut prometheus_client::registry::Registry) {
    tls::register_metrics(registry);
    exchange::register_metrics(registry);
}

/// Loads a serving certificate for these listeners (offering the ALPN protocols their
/// connection builder speaks).
pub fn load_tls(files: TlsFiles) -> Result<ServerTls, control_tls::TlsError> {
    ServerTls::load(files, tls::ALPN)
}

use anyhow::Context as _;
use axum::body::Body;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use retry_backoff::Backoff;
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Time an answer may wait for the peer to take its next bytes (it does not read: a
    /// zero HTTP/2 window, a full socket buffer); past it the connection is dropped.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
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
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
        }
    }
}

/// How long a stopping server lets requests in flight finish (see
/// [`ConnLimits::drain_timeout`]).
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an answer may wait for a peer that does not read (see
/// [`ConnLimits::write_timeout`]): Go's `http.Server` users commonly pick 30 s too, long
/// enough for a slow but live link to take a large answer.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

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
        if self.write_timeout.is_zero() {
            out.push("connections.write_timeout must be longer than 0s".to_owned());
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

/// Binds `addr` (see `listen`) and serves `app` on it within `limits`, over TLS when
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
          write_timeout = ?limits.write_timeout, tls = tls.is_some(), "apiserver listening");
    let app = version::tag(app);
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
    /// Those connections by key, oldest first.
    closing_conns: BTreeMap<u64, Arc<Conn>>,
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

    /// Admits a new connection from `ip`, making room at a cap ([`Registry::make_room`]):
    /// its key and state, or `None` when the caps leave no room (it is closed then).
    fn admit(&mut self, ip: IpAddr, limits: &ConnLimits) -> Option<(u64, Arc<Conn>)> {
        let room = self.make_room(ip, limits);
        self.log_pressure(limits);
        if !room {
            return None;
        }
        self.next += 1;
        let id = self.next;
        self.total += 1;
        *self.per_client.entry(ip).or_default() += 1;
        let conn = Arc::new(Conn::default());
        self.unserved.insert(id, (ip, conn.clone()));
        self.unserved_of.entry(ip).or_default().insert(id);
        Some((id, conn))
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
            self.closing_conns.insert(id, conn);
        }
    }

    /// At [`MAX_CLOSING`]: tells the oldest closing connections to drop their sockets now
    /// rather than wait out their polite close (a 503 a zero-window peer never reads would
    /// hold one for `header_timeout`, and the accept loop with it), until fewer than
    /// [`MAX_CLOSING`] close politely; the ones told leave `closing` as soon as their
    /// tasks run.
    fn hurry_closing(&mut self) {
        while self.closing_conns.len() >= MAX_CLOSING {
            let Some((_, conn)) = self.closing_conns.pop_first() else {
                break;
            };
            conn.dropped.store(true, Ordering::SeqCst);
            conn.wake.notify_one();
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
    /// Evicted and told to drop its socket now ([`Registry::hurry_closing`]).
    dropped: AtomicBool,
    /// A request started or ended (unless `quiet`), or the registry evicted it.
    wake: Notify,
    /// The supervision need not be told when a request starts or ends: it looks at the
    /// connection again by itself before that could change what it does (see
    /// [`Clocks::quiet`]). Spares a keep-alive connection two wake-ups of its task per
    /// request, each of which re-armed its timers.
    quiet: AtomicBool,
    /// When the last request ended ([`since_epoch`]; 0: none yet), read by the supervision
    /// when it next looks (a quiet end does not wake it).
    ended: AtomicU64,
    /// What stops its answers from being written, and since when (`exchange.rs`).
    writes: Arc<exchange::Writes>,
}

/// At most this many evicted connections may be waiting for their sockets to close: at a
/// cap, a flood can otherwise be accepted faster than the evicted sockets close, and the
/// process runs out of descriptors after all. Past it, the oldest are dropped at once
/// (no polite 503 and GOAWAY) and the accept loop waits only for their tasks to run, never
/// for a peer.
const MAX_CLOSING: usize = 64;

/// The first and the longest pause after a failed `accept`.
const ACCEPT_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// What every connection of one server shares with its accept loop.
#[derive(Clone)]
struct Shared {
    app: axum::Router,
    limits: ConnLimits,
    tls: Option<ServerTls>,
    registry: Arc<Mutex<Registry>>,
    /// Told when an evicted connection's socket is closed (see [`MAX_CLOSING`]).
    closed: Arc<Notify>,
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: ConnLimits,
    tls: Option<ServerTls>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let shared = Shared {
        app,
        limits,
        tls,
        registry: Arc::default(),
        closed: Arc::default(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    // EMFILE and friends: a pause instead of spinning (connections that end free
    // descriptors), longer while it lasts.
    let mut failing = Backoff::new(ACCEPT_RETRY.0, ACCEPT_RETRY.1);
    loop {
        shared.room_to_accept(&mut tasks).await;
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                let pause = failing.next_pause();
                warn!(error = %e, retry_in = ?pause, "accept failed");
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        failing.reset();
        let admitted = shared.registry.lock().unwrap().admit(peer.ip(), &limits);
        let Some((id, conn)) = admitted else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let ctx = ConnCtx {
            shared: shared.clone(),
            conn,
            id,
            peer,
            stop: stop.clone(),
        };
        tasks.spawn(connection(ctx, stream));
    }
    drop(listener);
    drain(tasks, limits.drain_timeout).await;
    Ok(())
}

impl Shared {
    /// Returns once fewer than [`MAX_CLOSING`] evicted sockets are still open, reaping
    /// ended connection tasks (which close them) while it waits.
    async fn room_to_accept(&self, tasks: &mut tokio::task::JoinSet<()>) {
        loop {
            let wait = self.closed.notified();
            {
                let mut r = self.registry.lock().unwrap();
                if r.closing < MAX_CLOSING {
                    return;
                }
                r.hurry_closing();
            }
            tokio::select! {
                () = wait => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            }
        }
    }
}

/// Graceful: every connection finishes its in-flight requests (blocking queries and
/// streams answer at once on shutdown) and ends, within `drain_timeout`; the
/// connections still open then are dropped.
async fn drain(mut tasks: tokio::task::JoinSet<()>, drain_timeout: Duration) {
    let drained = tokio::time::timeout(drain_timeout, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            connections = tasks.len(),
            drain_timeout = ?drain_timeout,
            "drain deadline reached: dropping the connections still open"
        );
        tasks.shutdown().await;
    }
}

/// The peer address of a request's connection (a request extension), for logs that
/// must say who sent something.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub IpAddr);

/// One accepted connection: everything its task needs besides the socket.
struct ConnCtx {
    shared: Shared,
    conn: Arc<Conn>,
    /// The connection's key in the registry.
    id: u64,
    peer: SocketAddr,
    stop: watch::Receiver<bool>,
}

/// One connection's task: the TLS handshake (when the server speaks TLS), then HTTP until
/// the connection ends, a limit closes it or the server stops; then the registry learns
/// that its socket is closed.
async fn connection(mut ctx: ConnCtx, stream: tokio::net::TcpStream) {
    if let Some(stream) = ctx.handshake(stream).await {
        ctx.serve_http(stream).await;
    }
    ctx.account_closed();
}

/// What a connection's supervision does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing: wait for the next wake-up.
    Wait,
    /// Start a graceful shutdown (requests in flight finish).
    Shutdown,
    /// Drop the connection now (its socket closes).
    Drop,
}

/// The clocks of one connection's supervision.
#[derive(Debug)]
struct Clocks {
    /// The last time a request started or ended (or the connection was accepted).
    idle_since: Instant,
    /// When a graceful shutdown began.
    closing: Option<Instant>,
    /// When to look next at whether an answer has waited on the peer for `write_timeout`
    /// (`None`: nothing in flight and nothing to write, so nothing to look at). Never later
    /// than the oldest wait's end: armed at the oldest wait's start (or now) plus
    /// `write_timeout`, and every wait that starts later ends later.
    write_check: Option<Instant>,
}

impl ConnCtx {
    /// The TLS handshake, bounded by the header timeout, and given up when the
    /// connection is closed to make room or the server stops (`None` then).
    async fn handshake(&mut self, stream: tokio::net::TcpStream) -> Option<tls::Stream> {
        let limits = &self.shared.limits;
        let handshake = tls::handshake(
            self.shared.tls.as_ref(),
            stream,
            self.peer,
            limits.header_timeout,
        );
        tokio::select! {
            r = handshake => r.ok(),
            () = evicted(&self.conn) => None,
            _ = self.stop.wait_for(|s| *s) => None,
        }
    }

    /// Serves HTTP on `stream` and watches the connection's clocks ([`Clocks`]) until it
    /// ends; the connection (and its socket) is dropped on return.
    async fn serve_http(&mut self, stream: tls::Stream) {
        let ip = self.peer.ip();
        // Closed to make room before its task first ran (a flood is accepted faster than
        // its tasks run): dropped before hyper reads a request off it, which would be
        // answered 503 and then take up to `header_timeout` to close, while the accept
        // loop counts it as closing (see [`MAX_CLOSING`]).
        if self.conn.evicted.load(Ordering::SeqCst) {
            return;
        }
        // The connection's streams run in this task (`ConnStreams`: one change's events
        // of all its streams in one pass and one write).
        let streams = crate::http2::ConnStreams::new();
        let builder = http_builder(&self.shared.limits, streams.executor());
        // HTTP/2 writes batched across streams (`BatchedWrites`: a fan-out's answers
        // share system calls); HTTP/1.1 passes through.
        // The write clock sits under the batching, on the socket itself: it sees the
        // socket refuse bytes, not the batch buffer take them.
        let stream = exchange::WriteClock::new(stream, self.conn.writes.clone());
        let io = TokioIo::new(crate::http2::BatchedWrites::new(stream));
        // Dropped (its socket closed, its streams ended) before the accounting.
        let mut c = streams.serve(builder.serve_connection_with_upgrades(io, self.service()));
        let mut clocks = Clocks {
            idle_since: Instant::now(),
            closing: None,
            write_check: None,
        };
        let limits = self.shared.limits;
        // One timer for the connection's life, moved only when its deadline moves (a new
        // timer per wake-up took the runtime's timer lock twice per request).
        let mut timer = Box::pin(tokio::time::sleep(Duration::ZERO));
        let mut armed = None;
        loop {
            clocks.look(&self.conn, &limits);
            let deadline = clocks.deadline(&self.conn, &limits);
            if deadline != armed {
                if let Some(at) = deadline {
                    timer.as_mut().reset(at);
                }
                armed = deadline;
            }
            let step = tokio::select! {
                () = self.conn.wake.notified() => clocks.woken(&self.conn),
                () = self.conn.writes.blocked.notified() => Step::Wait,
                r = &mut c => {
                    if let Err(e) = r {
                        debug!(client = %ip, error = %e, "connection ended with an error");
                    }
                    Step::Drop
                }
                () = &mut timer, if armed.is_some() => {
                    armed = None; // fired: armed again below, whatever the deadline
                    clocks.expired(&self.conn, &limits, ip)
                }
                _ = self.stop.wait_for(|s| *s), if clocks.closing.is_none() => Step::Shutdown,
            };
            match step {
                Step::Wait => {}
                Step::Shutdown => {
                    clocks.closing = Some(Instant::now());
                    // Every request's end matters now (the closing deadline runs from it).
                    self.conn.quiet.store(false, Ordering::SeqCst);
                    c.connection().graceful_shutdown();
                }
                Step::Drop => return,
            }
        }
    }

    /// The connection's request service: each request is in flight until its answer's
    /// body is done ([`InFlight`]), carries the [`Peer`], and is answered by the app,
    /// unless the registry closed the connection before its first request.
    fn service(
        &self,
    ) -> impl hyper::service::Service<
        Request<Incoming>,
        Response = Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send + 'static,
    > {
        let (app, conn) = (self.shared.app.clone(), self.conn.clone());
        let (registry, id, ip) = (self.shared.registry.clone(), self.id, self.peer.ip());
        let body_timeout = self.shared.limits.header_timeout;
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let guard = InFlight::start(&conn);
            let evicted = first_request_evicted(&conn, &registry, id);
            let exchange = guard.exchange.clone();
            let mut req =
                req.map(|b| Body::new(exchange::TimedBody::new(b, body_timeout, exchange)));
            req.extensions_mut().insert(Peer(ip));
            answer(app.clone(), req, guard, evicted, body_timeout)
        })
    }

    /// Tells the registry the connection's socket is closed.
    fn account_closed(&self) {
        let mut r = self.shared.registry.lock().unwrap();
        if self.conn.evicted.load(Ordering::SeqCst) {
            r.closing_conns.remove(&self.id);
            r.closing -= 1;
            self.shared.closed.notify_one();
        } else {
            r.closed(self.id, self.peer.ip());
        }
    }
}

impl Clocks {
    /// When the connection is closed unless something happens: `idle_timeout` (before
    /// its first request, `header_timeout`) after the last request ended (none while a
    /// request is in flight); when closing, see [`Clocks::closing_deadline`]; and the next
    /// [write check](Self::write_check).
    fn deadline(&self, conn: &Conn, limits: &ConnLimits) -> Option<Instant> {
        let idle = conn.in_flight.load(Ordering::SeqCst) == 0;
        let timeout = if conn.served.load(Ordering::SeqCst) {
            limits.idle_timeout
        } else {
            limits.header_timeout
        };
        let own = match self.closing {
            None => idle.then_some(self.idle_since + timeout),
            Some(since) => self.closing_deadline(since, idle, conn, limits),
        };
        match (own, self.write_check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When a closing connection is dropped. Closed to make room: `header_timeout` after
    /// that, whatever is in flight (its answer may never be read, and the accept loop waits
    /// for it, see [`MAX_CLOSING`]). Otherwise, once nothing is in flight, the peer gets
    /// `header_timeout` (from the later of the shutdown and the last answer, whose bytes
    /// may still be on their way out) to let the shutdown finish, then the socket is
    /// dropped: HTTP/2's graceful shutdown waits for the answer to a ping after its GOAWAY,
    /// which a client that sent only the preface never gives.
    fn closing_deadline(
        &self,
        since: Instant,
        idle: bool,
        conn: &Conn,
        limits: &ConnLimits,
    ) -> Option<Instant> {
        if conn.evicted.load(Ordering::SeqCst) {
            return Some(since + limits.header_timeout);
        }
        idle.then_some(since.max(self.idle_since) + limits.header_timeout)
    }

    /// What the supervision does each time it looks at the connection: takes in the end
    /// of the last request (a quiet one did not wake it), arms the write check, and tells
    /// the requests whether they need to wake it.
    fn look(&mut self, conn: &Conn, limits: &ConnLimits) {
        self.take_ended(conn);
        self.arm_write_check(conn, limits);
        conn.quiet.store(self.quiet(conn, limits), Ordering::SeqCst);
    }

    /// Takes in the end of the last request: the connection is idle since then at least.
    fn take_ended(&mut self, conn: &Conn) {
        if let Some(ended) = from_epoch(conn.ended.load(Ordering::SeqCst)) {
            self.idle_since = self.idle_since.max(ended);
        }
    }

    /// Whether a request's start or end may go untold: the write check is armed, so the
    /// supervision looks again within `write_timeout` by itself and arms the next one from
    /// the oldest stalled answer (a start untold changes nothing before then); an end
    /// untold moves the idle deadline to at least `idle_timeout` from it, no earlier than
    /// that look when `idle_timeout >= write_timeout`, and the look takes it in. Never
    /// while closing (the closing deadline runs from the last answer) or before the first
    /// request (which ends the header timeout).
    fn quiet(&self, conn: &Conn, limits: &ConnLimits) -> bool {
        self.write_check.is_some()
            && self.closing.is_none()
            && limits.idle_timeout >= limits.write_timeout
            && conn.served.load(Ordering::SeqCst)
            && !conn.evicted.load(Ordering::SeqCst)
    }

    /// Arms the write check when there is something to write and it is not armed.
    fn arm_write_check(&mut self, conn: &Conn, limits: &ConnLimits) {
        if self.write_check.is_none() && busy(conn) {
            let from = conn.writes.stalled_since().unwrap_or_else(Instant::now);
            self.write_check = Some(from + limits.write_timeout);
        }
    }

    /// The write check: whether an answer (or the socket) has waited on the peer for
    /// `write_timeout`; if not, when to look again.
    fn write_check(&mut self, conn: &Conn, limits: &ConnLimits, ip: IpAddr) -> Step {
        let now = Instant::now();
        match conn.writes.stalled_since() {
            Some(since) if now.saturating_duration_since(since) >= limits.write_timeout => {
                exchange::TIMEOUTS.get_or_create(&exchange::WRITE).inc();
                tls::log_limited(&WRITE_TIMEOUT_LOGGED, |n| {
                    info!(client = %ip, write_timeout = ?limits.write_timeout, since_last_line = n,
                          "a client did not read its answer within write_timeout: connection dropped")
                });
                return Step::Drop;
            }
            Some(since) => self.write_check = Some(since + limits.write_timeout),
            None => self.write_check = busy(conn).then_some(now + limits.write_timeout),
        }
        Step::Wait
    }

    /// A request started or ended, or the registry evicted the connection.
    fn woken(&mut self, conn: &Conn) -> Step {
        self.idle_since = Instant::now();
        if conn.dropped.load(Ordering::SeqCst) {
            return Step::Drop; // the accept loop needs its descriptor back
        }
        if !conn.evicted.load(Ordering::SeqCst) || self.closing.is_some() {
            return Step::Wait;
        }
        if conn.served.load(Ordering::SeqCst) {
            Step::Shutdown
        } else {
            Step::Drop // never used: close the socket now
        }
    }

    /// The [`deadline`](Self::deadline) passed: the write check's, the idle one's or the
    /// closing one's.
    fn expired(&mut self, conn: &Conn, limits: &ConnLimits, ip: IpAddr) -> Step {
        // A request may have ended untold since the last look.
        self.take_ended(conn);
        let now = Instant::now();
        if self.write_check.is_some_and(|at| at <= now)
            && self.write_check(conn, limits, ip) == Step::Drop
        {
            return Step::Drop;
        }
        let idle = conn.in_flight.load(Ordering::SeqCst) == 0;
        if let Some(since) = self.closing {
            if self
                .closing_deadline(since, idle, conn, limits)
                .is_some_and(|at| at <= now)
            {
                if conn.evicted.load(Ordering::SeqCst) {
                    exchange::TIMEOUTS.get_or_create(&exchange::CLOSING).inc();
                }
                debug!(client = %ip, "connection did not finish closing: dropped");
                return Step::Drop;
            }
            return Step::Wait;
        }
        let timeout = if conn.served.load(Ordering::SeqCst) {
            limits.idle_timeout
        } else {
            limits.header_timeout
        };
        if !idle || self.idle_since + timeout > now {
            return Step::Wait;
        }
        debug!(client = %ip, "idle connection closed");
        Step::Shutdown
    }
}

/// Whether the connection has something to write: a request in flight, or bytes the
/// socket has not taken.
fn busy(conn: &Conn) -> bool {
    conn.in_flight.load(Ordering::SeqCst) != 0 || conn.writes.socket_blocked()
}

/// The log line of a write timeout: at most one a second, with a count.
static WRITE_TIMEOUT_LOGGED: tls::LogLimit = tls::LogLimit::new();

/// The connection builder: HTTP/1.1 or HTTP/2 with prior knowledge (h2c), told apart by
/// the client's first bytes (the HTTP/2 preface). Every limit here holds for both: the
/// clocks watch requests in flight, which under HTTP/2 are the connection's open streams.
fn http_builder(
    limits: &ConnLimits,
    exec: crate::http2::StreamExecutor,
) -> auto::Builder<crate::http2::StreamExecutor> {
    let mut builder = auto::Builder::new(exec);
    crate::http1::configure(&mut builder.http1());
    builder.http1().header_read_timeout(limits.header_timeout);
    crate::http2::configure(&mut builder.http2());
    builder
}

/// Marks the connection served at its first request; whether the registry had closed it
/// to make room before that. Under the registry's lock, so a connection is either closed
/// to make room before its first request, or served: never both.
fn first_request_evicted(conn: &Conn, registry: &Mutex<Registry>, id: u64) -> bool {
    !conn.served.swap(true, Ordering::SeqCst) && {
        let mut r = registry.lock().unwrap();
        r.served(id);
        conn.evicted.load(Ordering::SeqCst)
    }
}

/// Answers one request: by the app, or a 503 when its connection was `evicted`, or a 408
/// when its body did not arrive within `body_timeout` (whatever the handler made of the
/// failed read). The answer's body keeps the request in flight (`guard`).
async fn answer(
    mut app: axum::Router,
    req: Request<Body>,
    guard: InFlight,
    evicted: bool,
    body_timeout: Duration,
) -> Result<Response<Body>, Infallible> {
    let version = req.version();
    if evicted {
        return Ok(guarded(too_many_connections(version), guard));
    }
    use tower::Service as _;
    let Ok(mut resp) = app.call(req).await;
    if guard.exchange.body_expired() {
        return Ok(guarded(body_too_slow(version, body_timeout), guard));
    }
    if version < http::Version::HTTP_2 && !guard.exchange.body_done() {
        // Answered before the body was read to its end (a 413, a refusal): hyper closes
        // the connection after the answer rather than read the rest, so the client is told
        // not to send another request on it.
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    Ok(guarded(resp, guard))
}

/// The answer to a request whose body did not arrive within `timeout`: 408, and the
/// connection closes (the rest of the body will not be read).
fn body_too_slow(version: http::Version, timeout: Duration) -> Response<Body> {
    let resp = plugin_api::ApiError::new(
        http::StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        format!(
            "the request body did not arrive within {} (connections.header_timeout)",
            humantime::format_duration(timeout)
        ),
    );
    let mut resp = axum::response::IntoResponse::into_response(resp);
    if version < http::Version::HTTP_2 {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// The answer on a connection closed to make room before its first request.
fn too_many_connections(version: http::Version) -> Response<Body> {
    let resp = plugin_api::ApiError::new(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "too many connections; try again",
    );
    let mut resp = axum::response::IntoResponse::into_response(resp);
    // HTTP/2 has no `Connection` header (it is a protocol error there): its connection is
    // closed by the GOAWAY of the shutdown that follows the eviction.
    if version < http::Version::HTTP_2 {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    resp
}

/// `resp`, its body keeping the request in flight until it is done or dropped. Handed to
/// the connection now: it waits for the connection to take it (see [`Guarded`]).
fn guarded(resp: Response<Body>, guard: InFlight) -> Response<Body> {
    guard.exchange.handed(&guard.conn.writes, Instant::now());
    resp.map(|b| Body::new(Guarded { inner: b, guard }))
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

/// `at` as nanoseconds (at least 1) since a process-wide epoch, for an atomic.
fn since_epoch(at: Instant) -> u64 {
    let nanos = at.saturating_duration_since(*epoch()).as_nanos();
    u64::try_from(nanos).unwrap_or(u64::MAX).max(1)
}

/// The inverse of [`since_epoch`]; `None` for 0.
fn from_epoch(nanos: u64) -> Option<Instant> {
    (nanos != 0).then(|| *epoch() + Duration::from_nanos(nanos))
}

fn epoch() -> &'static Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now)
}

/// A request in flight on a connection: from its headers to the end of its answer's body
/// (a stream's body ends when the stream does).
#[derive(Debug)]
struct InFlight {
    conn: Arc<Conn>,
    exchange: Arc<exchange::Exchange>,
}

impl InFlight {
    fn start(conn: &Arc<Conn>) -> Self {
        let n = conn.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let exchange = conn.writes.exchange(n);
        if !conn.quiet.load(Ordering::SeqCst) {
            conn.wake.notify_one();
        }
        InFlight {
            conn: conn.clone(),
            exchange,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.ended
            .store(since_epoch(Instant::now()), Ordering::SeqCst);
        conn.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !conn.quiet.load(Ordering::SeqCst) {
            conn.wake.notify_one();
        }
    }
}

/// An answer's body that keeps its request [`InFlight`] until it is done or dropped, and
/// tells its exchange when it waits on the connection: from the moment a frame is handed
/// over until the connection asks for the next one (hyper asks once it has room for it:
/// flow-control window, write buffer). While the app has nothing to send (a stream between
/// events) nothing waits on the peer.
struct Guarded {
    inner: Body,
    guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.guard.exchange.taken();
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &frame {
            let g = &self.guard;
            g.exchange.handed(&g.conn.writes, Instant::now());
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_h2;
#[cfg(test)]
mod tests_timeouts;
