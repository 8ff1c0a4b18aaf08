//! The edge: the zone rebuilt on every change of the endpoint table while a listener
//! runs (at the first query after a change otherwise), the UDP and TCP listeners (a
//! small loop over hickory-proto's wire format each), and the handle the host holds.

use crate::answer::{answer, Apex, Transport};
use crate::cache::{answer_cached, Viewer};
use crate::config::{ConfigError, DnsConfig};
use crate::limit::{Shared, Verdict};
use crate::metrics::Metrics;
use crate::view::View;
use crate::zone::Zone;
use endpoint_table::EndpointApi;
use plugin_api::Principal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// How long a TCP connection may stay without a whole query before it is closed
/// (RFC 7766 suggests seconds, not minutes).
const TCP_IDLE: Duration = Duration::from_secs(10);
/// TCP connections served at once; past it new ones wait in the kernel's backlog.
const TCP_CONNECTIONS: usize = 512;

/// The DNS server of one apiserver: the current zone and what answers from it.
#[derive(Debug)]
pub struct Dns {
    pub(crate) apex: Apex,
    pub(crate) ttl: u32,
    zone: watch::Sender<Arc<Zone>>,
    table: Weak<EndpointApi>,
    pub(crate) metrics: Metrics,
    rebuilding: std::sync::Once,
    /// Set once [`start`](Dns::start) rebuilds the zone on every change. Until then (a
    /// host without `[dns] listen`: only `/dns-query` can ask) the zone is rebuilt when
    /// asked for after a change, so a busy table costs nothing while nobody asks: a
    /// controller placing 50,000 replicas spent 9 % of its CPU on rebuilds nobody read.
    eager: AtomicBool,
    /// The table's changes as the last on-demand rebuild saw them (`None`: never built).
    on_demand: Mutex<Option<watch::Receiver<u64>>>,
    per_source_qps: u32,
    udp_readers: Option<u16>,
    slip: u8,
}

impl Dns {
    /// A DNS server answering from `table` as `cfg` says. The zone is rebuilt on every
    /// change of the table once [`start`](Self::start) ran ([`listen`](Self::listen)
    /// does it), and at the first query after a change before that.
    pub fn new(cfg: &DnsConfig, table: &Arc<EndpointApi>) -> Result<Arc<Self>, ConfigError> {
        cfg.check()?;
        let ttl = cfg.ttl_secs();
        let apex = Apex::new(&cfg.domain, ttl).map_err(|_| ConfigError::Domain {
            domain: cfg.domain.clone(),
            reason: "not a DNS name",
        })?;
        Ok(Arc::new(Self {
            apex,
            ttl,
            zone: watch::Sender::new(Arc::new(Zone::unavailable())),
            table: Arc::downgrade(table),
            metrics: Metrics::new(),
            rebuilding: std::sync::Once::new(),
            eager: AtomicBool::new(false),
            on_demand: Mutex::new(None),
            per_source_qps: cfg.per_source_qps,
            udp_readers: cfg.udp_readers,
            slip: cfg.slip,
        }))
    }

    /// Starts rebuilding the zone on every change of the table (once; later calls do
    /// nothing). Must run inside a tokio runtime.
    pub fn start(self: &Arc<Self>) {
        self.rebuilding.call_once(|| {
            let Some(table) = self.table.upgrade() else {
                return;
            };
            // Subscribed before the build: a change after it wakes the task.
            let changes = table.changes();
            self.install(&table);
            self.eager.store(true, Ordering::Release);
            tokio::spawn(rebuild(Arc::downgrade(self), changes));
        });
    }

    /// The current zone: as built last by the rebuild task once it runs, else built now
    /// if the table changed since the last query.
    pub fn zone(&self) -> Arc<Zone> {
        if !self.eager.load(Ordering::Acquire) {
            self.rebuild_if_changed();
        }
        self.zone.borrow().clone()
    }

    /// The on-demand rebuild: one caller rebuilds, the others wait for it (the lock), and
    /// a query after it sees the new zone.
    fn rebuild_if_changed(&self) {
        let Some(table) = self.table.upgrade() else {
            return;
        };
        let mut seen = self
            .on_demand
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let changed = match seen.as_mut() {
            Some(rx) => rx.has_changed().unwrap_or(false),
            None => true,
        };
        if changed {
            seen.get_or_insert_with(|| table.changes())
                .borrow_and_update();
            self.install(&table);
        }
    }

    /// Builds the zone from the table as it is now and makes it the current one.
    fn install(&self, table: &EndpointApi) {
        let zone = match table.snapshot() {
            Some(entries) => Zone::build(&entries),
            None => Zone::unavailable(),
        };
        self.metrics.rebuilds.inc();
        self.metrics.services.set(zone.services() as i64);
        tracing::debug!(services = zone.services(), "dns: zone rebuilt");
        self.zone.send_replace(Arc::new(zone));
    }

    /// The zone, and a wake-up on each rebuild (tests and measurements wait on it).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Zone>> {
        self.zone.subscribe()
    }

    /// Answers `bytes` as `view` sees the zone, counting it in the metrics. Computed for
    /// every query (DNS over HTTPS: each caller is its own principal).
    pub fn answer(&self, view: &dyn View, bytes: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let started = Instant::now();
        let zone = self.zone();
        let answered = answer(&self.apex, &zone, view, bytes, transport);
        self.count(answered, transport, started)
    }

    /// Answers `bytes` for a listener, from the zone's cache of encoded answers when it
    /// holds this one (the same bytes as [`answer`](Self::answer)).
    pub(crate) fn answer_listener(
        &self,
        viewer: &Viewer,
        bytes: &[u8],
        transport: Transport,
    ) -> Option<Vec<u8>> {
        let started = Instant::now();
        let zone = self.zone();
        let (answered, outcome) = answer_cached(&self.apex, &zone, viewer, bytes, transport);
        self.metrics.cache(outcome);
        self.count(answered, transport, started)
    }

    /// FORMERR for a datagram a listener could not read whole (longer than its buffer),
    /// counted like any answer; nothing if its header is no query's.
    pub(crate) fn formerr_listener(&self, bytes: &[u8], transport: Transport) -> Option<Vec<u8>> {
        let started = Instant::now();
        self.count(crate::answer::formerr(bytes), transport, started)
    }

    fn count(
        &self,
        answered: Option<crate::answer::Answered>,
        transport: Transport,
        started: Instant,
    ) -> Option<Vec<u8>> {
        match answered {
            Some(a) => {
                self.metrics
                    .answered(transport, &a, started.elapsed().as_secs_f64());
                Some(a.bytes)
            }
            None => {
                self.metrics.dropped(transport, "not_a_query");
                None
            }
        }
    }

    /// Binds UDP and TCP on `addr` and answers there as `principal`, until the returned
    /// [`Listener`] is dropped. UDP is read by `udp_readers` tasks (default: one per
    /// worker thread of the current runtime), each on its own socket of the address.
    pub async fn listen(
        self: &Arc<Self>,
        addr: SocketAddr,
        principal: Principal,
    ) -> std::io::Result<Listener> {
        let readers = self.udp_readers.map_or_else(
            || tokio::runtime::Handle::current().metrics().num_workers(),
            usize::from,
        );
        let (udp, tcp) = bind_both(addr, readers > 1).await?;
        self.start();
        let addr = udp.local_addr()?;
        let mut sockets = vec![udp];
        for _ in 1..readers {
            sockets.push(udp_socket(addr, true)?);
        }
        let principal = Arc::new(Viewer::new(principal));
        let limiter = Arc::new(Shared::new(self.per_source_qps, self.slip));
        let mut tasks = JoinSet::new();
        for socket in sockets {
            let (dns, principal, limiter) = (self.clone(), principal.clone(), limiter.clone());
            tasks.spawn(serve_udp(dns, socket, principal, limiter));
        }
        tasks.spawn(serve_tcp(self.clone(), tcp, principal.clone()));
        tracing::info!(%addr, principal = %principal.principal.name, domain = %self.apex_name(), udp_readers = readers, "dns: listening on UDP and TCP");
        Ok(Listener {
            addr,
            udp_readers: readers,
            _tasks: tasks,
        })
    }

    fn apex_name(&self) -> String {
        self.apex.domain().to_ascii()
    }
}

/// UDP and TCP sockets on the same address and port. With port 0 the port is picked for
/// UDP first; if TCP has that port taken, another is picked (a few times). `reuse_port`:
/// the UDP socket lets more join its port (see [`udp_socket`]).
async fn bind_both(
    addr: SocketAddr,
    reuse_port: bool,
) -> std::io::Result<(UdpSocket, TcpListener)> {
    let mut attempts = if addr.port() == 0 { 16 } else { 1 };
    loop {
        let udp = udp_socket(addr, reuse_port)?;
        match TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            Err(e) if attempts > 1 && e.kind() == std::io::ErrorKind::AddrInUse => attempts -= 1,
            Err(e) => return Err(e),
        }
    }
}

/// A UDP socket bound to `addr`. With `reuse_port`, `SO_REUSEPORT`: several sockets of
/// this process share the port and the kernel hands each source's packets to one of
/// them, so each reader has its own receive queue (no lock shared by every packet, no
/// reader woken for a packet another takes). Linux lets only sockets of the same user
/// join a port this way.
fn udp_socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

/// The UDP and TCP listeners of a [`Dns`]; dropping it stops them.
#[derive(Debug)]
pub struct Listener {
    addr: SocketAddr,
    udp_readers: usize,
    _tasks: JoinSet<()>,
}

impl Listener {
    /// The address both listen on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How many tasks (and sockets) receive UDP queries.
    pub fn udp_readers(&self) -> usize {
        self.udp_readers
    }
}

/// Rebuilds the zone after every change of the table, until the table or the server is
/// gone. Wakes only on changes (a watch channel), so an idle cluster costs nothing.
async fn rebuild(dns: Weak<Dns>, mut changes: watch::Receiver<u64>) {
    while changes.changed().await.is_ok() {
        changes.borrow_and_update();
        let Some(dns) = dns.upgrade() else { return };
        let Some(table) = dns.table.upgrade() else {
            return;
        };
        dns.install(&table);
    }
}

/// What a UDP reader sends back for one datagram from `peer`: the limiter decides, then
/// the answer (FORMERR for a datagram longer than the reader's buffer, `truncated`), a
/// slip, or nothing.
fn udp_reply(
    dns: &Dns,
    principal: &Viewer,
    limiter: &Shared,
    bytes: &[u8],
    truncated: bool,
    peer: SocketAddr,
    now: Instant,
) -> Option<Vec<u8>> {
    match limiter.admit(peer.ip(), now) {
        Verdict::Answer if truncated => dns.formerr_listener(bytes, Transport::Udp),
        Verdict::Answer => dns.answer_listener(principal, bytes, Transport::Udp),
        Verdict::Slip => {
            dns.metrics.slipped.inc();
            crate::answer::slip(bytes)
        }
        Verdict::Drop => {
            dns.metrics.dropped(Transport::Udp, "rate_limited");
            None
        }
    }
}

/// One UDP reader: receives up to [`BATCH`](crate::mmsg::BATCH) datagrams with one
/// `recvmmsg`, answers them (the answer is synchronous and short; other readers take the
/// other sockets' queries) and sends the replies with one `sendmmsg`. Under load that is
/// two system calls for many queries instead of two per query; idle, the task sleeps on
/// the socket's readiness like any other.
#[cfg(target_os = "linux")]
async fn serve_udp(dns: Arc<Dns>, socket: UdpSocket, principal: Arc<Viewer>, limiter: Arc<Shared>) {
    let mut batch = crate::mmsg::RecvBatch::new();
    let mut replies = Vec::with_capacity(crate::mmsg::BATCH);
    loop {
        if let Err(error) = batch.recv(&socket).await {
            // ICMP errors queued from an earlier send, and the like: not fatal.
            tracing::debug!(%error, "dns: udp receive");
            continue;
        }
        dns.metrics.udp_batch(batch.len());
        let now = Instant::now();
        for (bytes, datagram) in batch.datagrams() {
            let reply = udp_reply(
                &dns,
                &principal,
                &limiter,
                bytes,
                datagram.truncated,
                datagram.peer,
                now,
            );
            if let Some(reply) = reply {
                replies.push((reply, datagram.peer));
            }
        }
        crate::mmsg::send_all(&socket, &replies).await;
        replies.clear();
    }
}

/// One UDP reader where there is no `recvmmsg`: receives, answers and sends one query at
/// a time.
#[cfg(not(target_os = "linux"))]
async fn serve_udp(dns: Arc<Dns>, socket: UdpSocket, principal: Arc<Viewer>, limiter: Arc<Shared>) {
    // Bigger than any query we answer (a query is one question: well under 1 KiB); a
    // datagram that fills it may have been longer (cut): answered FORMERR.
    let mut buf = vec![0u8; 4097];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(got) => got,
            Err(error) => {
                // ICMP port unreachable from an earlier send, and the like: not fatal.
                tracing::debug!(%error, "dns: udp receive");
                continue;
            }
        };
        let truncated = n == buf.len();
        let reply = udp_reply(
            &dns,
            &principal,
            &limiter,
            &buf[..n],
            truncated,
            peer,
            Instant::now(),
        );
        if let Some(reply) = reply {
            if let Err(error) = socket.send_to(&reply, peer).await {
                tracing::debug!(%error, %peer, "dns: udp send");
            }
        }
    }
}

async fn serve_tcp(dns: Arc<Dns>, listener: TcpListener, principal: Arc<Viewer>) {
    let slots = Arc::new(Semaphore::new(TCP_CONNECTIONS));
    let mut conns = JoinSet::new();
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(got) => got,
            Err(error) => {
                tracing::warn!(%error, "dns: tcp accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (dns, principal) = (dns.clone(), principal.clone());
        conns.spawn(async move {
            if let Err(error) = serve_conn(&dns, stream, &principal).await {
                tracing::debug!(%error, %peer, "dns: tcp connection ended");
            }
            drop(permit);
        });
        // Reap finished connections so the set does not grow.
        while conns.try_join_next().is_some() {}
    }
}

/// One TCP connection: length-prefixed queries (RFC 1035 4.2.2), answered in order, until
/// the client closes, idles past [`TCP_IDLE`], or sends a frame that is no query.
async fn serve_conn(dns: &Dns, mut stream: TcpStream, principal: &Viewer) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut buf = Vec::new();
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Err(_) => return Ok(()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(r) => r?,
        };
        let len = usize::from(u16::from_be_bytes(len));
        buf.resize(len, 0);
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "query frame"))??;
        let Some(reply) = dns.answer_listener(principal, &buf, Transport::Tcp) else {
            dns.metrics.dropped(Transport::Tcp, "bad_frame");
            return Ok(());
        };
        let mut out = Vec::with_capacity(reply.len() + 2);
        out.extend_from_slice(&u16::try_from(reply.len()).unwrap_or(u16::MAX).to_be_bytes());
        out.extend_from_slice(&reply);
        stream.write_all(&out).await?;
    }
}
