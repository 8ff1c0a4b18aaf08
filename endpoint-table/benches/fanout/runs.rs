//! Fan-out: one readiness change, the time until the last of W watchers has it, and the
//! server memory per watcher; ours over HTTP/1.1 and HTTP/2 against etcd (gateway, gRPC).

use super::*;
use std::fmt::Write as _;

/// Per change: when it was made, and when each watcher had it.
pub(crate) type Samples = Vec<(Instant, Vec<Instant>)>;

/// Sends `(k, when)` when a watcher has seen change `k` (0: it is watching).
pub(crate) type Seen = mpsc::UnboundedSender<(usize, Instant)>;

/// Watchers per HTTP/2 connection of ours: 10,000 watchers over 100 connections.
pub(crate) const H2_PER_CONN: usize = 100;
/// etcd gRPC watches per Watch stream, and streams per connection (one etcd client).
pub(crate) const GRPC_PER_STREAM: usize = 100;
pub(crate) const GRPC_STREAMS_PER_CONN: usize = 10;

/// How the watchers watch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    /// Our SSE stream, one HTTP/1.1 connection each.
    Sse,
    /// Our blocking query, one HTTP/1.1 connection each.
    Blocking,
    /// Our SSE stream, [`H2_PER_CONN`] per HTTP/2 connection.
    H2Sse,
    /// Our blocking query, [`H2_PER_CONN`] per HTTP/2 connection.
    H2Blocking,
    /// etcd's watch through its HTTP/JSON gateway, one connection each.
    Etcd,
    /// etcd's native gRPC watch, [`GRPC_PER_STREAM`] per stream.
    EtcdGrpc,
    /// etcd's native gRPC watch, one connection (and stream) per watch: the topology of
    /// `xce sse`, one client connection per watcher.
    EtcdGrpcConn,
}

impl Kind {
    pub(crate) const ALL: [Kind; 7] = [
        Kind::Sse,
        Kind::Blocking,
        Kind::H2Sse,
        Kind::H2Blocking,
        Kind::Etcd,
        Kind::EtcdGrpc,
        Kind::EtcdGrpcConn,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Sse => "xce sse",
            Kind::Blocking => "xce blocking",
            Kind::H2Sse => "xce sse h2",
            Kind::H2Blocking => "xce blocking h2",
            Kind::Etcd => "etcd gateway",
            Kind::EtcdGrpc => "etcd grpc",
            Kind::EtcdGrpcConn => "etcd grpc conn",
        }
    }

    pub(crate) fn etcd(self) -> bool {
        matches!(self, Kind::Etcd | Kind::EtcdGrpc | Kind::EtcdGrpcConn)
    }

    /// Client connections `watchers` watchers of this kind use.
    pub(crate) fn connections(self, watchers: usize) -> usize {
        match self {
            Kind::Sse | Kind::Blocking | Kind::Etcd | Kind::EtcdGrpcConn => watchers,
            Kind::H2Sse | Kind::H2Blocking => watchers.div_ceil(H2_PER_CONN),
            Kind::EtcdGrpc => watchers.div_ceil(GRPC_PER_STREAM * GRPC_STREAMS_PER_CONN),
        }
    }
}

/// A streaming watcher (SSE, etcd watch): sends `request`, then reports each marker as it
/// shows up in the bytes, in order.
pub(crate) async fn stream_watcher(
    addr: SocketAddr,
    request: Arc<String>,
    markers: Arc<Vec<String>>,
    connects: Arc<Semaphore>,
    seen: Seen,
) {
    let permit = connects.acquire().await.unwrap();
    let mut conn = Conn::connect(addr).await.unwrap();
    conn.stream.write_all(request.as_bytes()).await.unwrap();
    drop(permit);
    let mut next = 0;
    while next < markers.len() {
        conn.fill().await.unwrap();
        take_markers(&mut conn.buf, &markers, &mut next, &seen);
    }
}

/// Reports, from `next` on, each marker found in `buf`, in order; keeps only what may
/// hold the start of the next one.
pub(crate) fn take_markers(buf: &mut Vec<u8>, markers: &[String], next: &mut usize, seen: &Seen) {
    while *next < markers.len() {
        let marker = markers[*next].as_bytes();
        let Some(at) = find(buf, marker) else {
            let keep = marker.len().min(buf.len());
            buf.drain(..buf.len() - keep);
            return;
        };
        let _ = seen.send((*next, Instant::now()));
        buf.drain(..at + marker.len());
        *next += 1;
    }
}

/// A blocking-query watcher: `?index=N&wait=60s`, re-issued with the answer's index after
/// each answer, for `changes` changes.
pub(crate) async fn blocking_watcher(
    addr: SocketAddr,
    changes: usize,
    connects: Arc<Semaphore>,
    seen: Seen,
) {
    let permit = connects.acquire().await.unwrap();
    let mut conn = Conn::connect(addr).await.unwrap();
    drop(permit);
    let mut index = 0;
    for k in 0..=changes {
        let path = format!("/v1/services/svc-0/endpoints?index={index}&wait=60s");
        let (head, _) = conn
            .request(get(&path, VIEW_TOKEN).as_bytes())
            .await
            .unwrap();
        assert_eq!(head.status, 200);
        index = head.index.expect("an X-Xce-Index header");
        assert_eq!(index, BASE + k as u64, "blocking query answer");
        let _ = seen.send((k, Instant::now()));
    }
}

/// One fan-out run: what it measured, the server's RSS before and after the watchers
/// connected (KiB), and the CPU time (µs) the server and this process (the clients) used
/// from each change to its last delivery, summed over the changes.
pub(crate) struct Run {
    samples: Samples,
    rss: (u64, u64),
    cpu: (f64, f64),
    /// TCP segments sent on this machine (both ends, ACKs included) over the same
    /// windows as `cpu`: how well events, answers and requests are batched.
    segments: u64,
}

/// TCP segments sent so far on this machine's network namespace (`OutSegs` of
/// `/proc/net/snmp`); 0 when it cannot be read.
///
/// Not `/proc/<pid>/io`'s `syscw`, which this bench counted first: it counts `write` and
/// `writev`, not the `send` that Rust's (and tokio's) sockets use, so our side showed no
/// writes at all where it made one per two events (`xce_serve::http2`, `BatchedWrites`).
/// A segment is counted whatever call sent it, for etcd (Go uses `write`) as for us. Other
/// traffic on the machine counts too: read it on a quiet machine.
fn tcp_segments() -> u64 {
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap_or_default();
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (Some(names), Some(values)) = (tcp.next(), tcp.next()) else {
        return 0;
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "OutSegs")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Connects `watchers` watchers of `kind`, then makes `changes` changes one at a time,
/// each once every watcher had the previous one and watches again.
pub(crate) async fn fanout(kind: Kind, watchers: usize, changes: usize) -> Option<Run> {
    // Either side stays alive until the end of the run.
    let (server, etcd) = if kind.etcd() {
        (None, Some(Etcd::start().await?))
    } else {
        (Some(Server::start()), None)
    };
    let (addr, pid) = match (&server, &etcd) {
        (Some(s), _) => (s.addr, s.pid()),
        (_, Some(e)) => (e.addr, e.pid),
        _ => unreachable!(),
    };
    let key = b64(b"svc-0");
    // The value put at change k: as long as our answer for svc-0 after change k, so that
    // etcd's watchers get the bytes ours get (a cluster keeping endpoints in etcd would
    // store the endpoint list), numbered for the watchers.
    let lens = svc0_json_lens();
    let value = |k: usize| {
        let mut v = format!("value-{k:05}");
        let len = lens[k % 2];
        v.extend(std::iter::repeat_n('.', len.saturating_sub(v.len())));
        b64(v.as_bytes())
    };
    let rss_before = rss_kib(pid);

    let (tx, mut rx) = mpsc::unbounded_channel();
    // Bounded concurrent connects: a burst of 10,000 SYNs overflows the accept backlog
    // and the retransmits would time the backlog, not the server.
    let connects = Arc::new(Semaphore::new(256));
    let request = Arc::new(match kind {
        Kind::Sse => get("/v1/services/svc-0/endpoints/stream", VIEW_TOKEN),
        Kind::Etcd => post(
            "/v3/watch",
            &format!(r#"{{"create_request":{{"key":"{key}"}}}}"#),
        ),
        _ => String::new(),
    });
    let markers = Arc::new(match kind {
        Kind::Sse | Kind::H2Sse => (0..=changes)
            .map(|k| format!("id: {}\n", BASE + k as u64))
            .collect(),
        Kind::Etcd => std::iter::once("\"created\":true".to_owned())
            .chain((1..=changes).map(|k| format!("\"value\":\"{}\"", value(k))))
            .collect(),
        _ => Vec::new(),
    });
    let mut h2 = Vec::new();
    for _ in 0..kind.connections(watchers) {
        match kind {
            Kind::H2Sse | Kind::H2Blocking | Kind::EtcdGrpc | Kind::EtcdGrpcConn => {
                h2.push(raw_h2_connect(addr).await)
            }
            _ => break,
        }
    }
    let tasks: Vec<_> = (0..watchers)
        // A task per watcher, but one per connection of SSE over HTTP/2 and one per Watch
        // stream of etcd's gRPC: each reads many streams (watches).
        .filter(|i| match kind {
            Kind::EtcdGrpc => i % GRPC_PER_STREAM == 0,
            Kind::H2Sse => i % H2_PER_CONN == 0,
            _ => true,
        })
        .map(|i| match kind {
            Kind::H2Blocking => tokio::spawn(h2_blocking_watcher(
                h2[i / H2_PER_CONN].clone(),
                changes,
                tx.clone(),
            )),
            Kind::H2Sse => tokio::spawn(h2_stream_watchers(
                h2[i / H2_PER_CONN].clone(),
                H2_PER_CONN.min(watchers - i),
                markers.clone(),
                tx.clone(),
            )),
            Kind::EtcdGrpc => tokio::spawn(grpc_watch_stream(
                h2[i / (GRPC_PER_STREAM * GRPC_STREAMS_PER_CONN)].clone(),
                b"svc-0",
                GRPC_PER_STREAM.min(watchers - i),
                changes,
                tx.clone(),
            )),
            Kind::EtcdGrpcConn => tokio::spawn(grpc_watch_stream(
                h2[i].clone(),
                b"svc-0",
                1,
                changes,
                tx.clone(),
            )),
            Kind::Blocking => tokio::spawn(blocking_watcher(
                addr,
                changes,
                connects.clone(),
                tx.clone(),
            )),
            Kind::Sse | Kind::Etcd => tokio::spawn(stream_watcher(
                addr,
                request.clone(),
                markers.clone(),
                connects.clone(),
                tx.clone(),
            )),
        })
        .collect();
    for _ in 0..watchers {
        let (k, _) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("every watcher starts watching")
            .unwrap();
        assert_eq!(k, 0);
    }
    if let Some(server) = &server {
        server.watchers(watchers).await;
    }
    let rss_after = rss_kib(pid);

    let mut samples = Vec::new();
    let mut cpu = (0.0, 0.0);
    let mut segments = 0;
    let me = std::process::id();
    for k in 1..=changes {
        if let Some(server) = &server {
            // Blocking queries re-issue after each answer: change again once all wait.
            server.watchers(watchers).await;
        }
        let change = if kind.etcd() {
            post(
                "/v3/kv/put",
                &format!(r#"{{"key":"{key}","value":"{}"}}"#, value(k)),
            )
        } else {
            post("/bench/flip", "")
        };
        let cpu0 = (cpu_us(pid), cpu_us(me));
        let segments0 = tcp_segments();
        let t0 = Instant::now();
        fire(addr, change).await;
        let mut seen = Vec::with_capacity(watchers);
        while seen.len() < watchers {
            let (got, at) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
                .await
                .expect("every watcher sees the change")
                .unwrap();
            assert_eq!(got, k);
            seen.push(at);
        }
        cpu.0 += cpu_us(pid) - cpu0.0;
        cpu.1 += cpu_us(me) - cpu0.1;
        segments += tcp_segments() - segments0;
        samples.push((t0, seen));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Some(Run {
        samples,
        rss: (rss_before, rss_after),
        cpu,
        segments,
    })
}

/// One run's figures, in ms: of the first and the last watcher to have a change (p50
/// over the changes), the last's p99, and the delivery spread (last minus first, p50).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stats {
    first: f64,
    last: f64,
    p99: f64,
    spread: f64,
}

pub(crate) fn fanout_stats(samples: &Samples) -> Stats {
    let (mut first, mut last, mut spread) = (Vec::new(), Vec::new(), Vec::new());
    for (t0, seen) in samples {
        let ms = |t: &Instant| t.duration_since(*t0).as_secs_f64() * 1e3;
        let f = seen.iter().map(ms).fold(f64::MAX, f64::min);
        let l = seen.iter().map(ms).fold(0.0, f64::max);
        first.push(f);
        last.push(l);
        spread.push(l - f);
    }
    Stats {
        first: pct(&mut first, 0.5),
        last: pct(&mut last, 0.5),
        p99: pct(&mut last, 0.99),
        spread: pct(&mut spread, 0.5),
    }
}

pub(crate) fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub(crate) fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "MISSED"
    }
}

/// Memory per idle watcher at the largest W: `(kind, ours or etcd's bytes per watcher)`.
pub(crate) type Memory = Vec<(Kind, f64)>;

pub(crate) async fn fanout_all(etcd: bool) -> (usize, Memory) {
    println!(
        "\nfan-out: one readiness change -> the last of W watchers has it (servers and clients \
         in separate processes; HTTP/1.1: one connection per watcher; h2: {H2_PER_CONN} \
         watchers per connection; etcd grpc: {GRPC_PER_STREAM} watches per stream, \
         {GRPC_STREAMS_PER_CONN} streams per connection; each change puts into etcd a value as \
         long as our answer after it: {:?} bytes)",
        svc0_json_lens()
    );
    println!(
        "{:<16} {:>6} {:>6} {:>8} {:>13} {:>13} {:>13} {:>13} {:>12} {:>9} {:>9} {:>10}",
        "system",
        "W",
        "conns",
        "changes",
        "p50 first ms",
        "p50 last ms",
        "p99 last ms",
        "spread ms",
        "RSS/watcher",
        "srv µs/w",
        "cli µs/w",
        "TCP segs/w"
    );
    let mut memory = (0, Memory::new());
    let limit = fd_limit();
    let only = Only::from_env();
    for (watchers, changes) in FANOUT {
        if !only.watchers(watchers) {
            continue;
        }
        if watchers > memory.0 {
            memory = (watchers, Memory::new());
        }
        let mut results: Vec<(Kind, Stats, f64)> = Vec::new();
        for kind in Kind::ALL {
            if (kind.etcd() && !etcd) || !only.kind(kind) {
                continue;
            }
            let conns = kind.connections(watchers);
            if conns as u64 + 200 > limit {
                println!(
                    "{:<16} {watchers:>6} skipped: `ulimit -n` is {limit}, {conns} connections \
                     need {} (raise it, or run bench.sh)",
                    kind.name(),
                    conns + 200
                );
                continue;
            }
            let changes = only.changes.unwrap_or(changes);
            let Some(run) = fanout(kind, watchers, changes).await else {
                continue;
            };
            let s = fanout_stats(&run.samples);
            let per = (run.rss.1 as f64 - run.rss.0 as f64) * 1024.0 / watchers as f64;
            // CPU per delivery (change x watcher), between a change and its last delivery.
            let deliveries = (watchers * changes) as f64;
            println!(
                "{:<16} {watchers:>6} {conns:>6} {changes:>8} {:>13.3} {:>13.3} {:>13.3} {:>13.3} {per:>10.0} B {:>9.1} {:>9.1} {:>10.3}",
                kind.name(), s.first, s.last, s.p99, s.spread,
                run.cpu.0 / deliveries, run.cpu.1 / deliveries,
                run.segments as f64 / deliveries,
            );
            results.push((kind, s, per));
            if watchers == memory.0 {
                memory.1.push((kind, per));
            }
        }
        summaries(watchers, limit, &results);
    }
    memory
}

/// A part of the fan-out runs, chosen for profiling one of them: `$FANOUT_KINDS` (names as
/// in the table, comma-separated, e.g. `xce blocking,xce blocking h2`) and `$FANOUT_W`
/// (e.g. `10000`). Unset: everything. `$FANOUT_CHANGES` changes per run instead of the
/// default (more, so that a profile of the run is mostly deliveries, not connecting).
struct Only {
    kinds: Option<Vec<String>>,
    watchers: Option<usize>,
    changes: Option<usize>,
}

impl Only {
    fn from_env() -> Self {
        let kinds = std::env::var("FANOUT_KINDS").ok().map(|v| {
            v.split(',')
                .map(|k| k.trim().to_owned())
                .collect::<Vec<_>>()
        });
        if let Some(kinds) = &kinds {
            for k in kinds {
                assert!(
                    Kind::ALL.iter().any(|kind| kind.name() == k),
                    "$FANOUT_KINDS: no kind {k:?} (kinds: {:?})",
                    Kind::ALL.map(Kind::name)
                );
            }
        }
        let watchers = std::env::var("FANOUT_W").ok().map(|w| {
            w.parse()
                .ok()
                .filter(|w| FANOUT.iter().any(|(n, _)| n == w))
                .unwrap_or_else(|| {
                    panic!("$FANOUT_W: {w:?} is not one of the watcher counts {FANOUT:?}")
                })
        });
        let changes = std::env::var("FANOUT_CHANGES").ok().map(|c| {
            c.parse()
                .ok()
                .filter(|c| *c > 0)
                .unwrap_or_else(|| panic!("$FANOUT_CHANGES: {c:?} is not a positive count"))
        });
        Self {
            kinds,
            watchers,
            changes,
        }
    }

    fn kind(&self, kind: Kind) -> bool {
        self.kinds
            .as_ref()
            .is_none_or(|ks| ks.iter().any(|k| k == kind.name()))
    }

    fn watchers(&self, watchers: usize) -> bool {
        self.watchers.is_none_or(|w| w == watchers)
    }
}

/// The `SUMMARY` lines of one watcher count: ours against etcd's gateway (HTTP/1.1),
/// HTTP/2 against HTTP/1.1, and everything against etcd's native gRPC watch.
fn summaries(watchers: usize, limit: u64, results: &[(Kind, Stats, f64)]) {
    let of = |kind: Kind| results.iter().find(|r| r.0 == kind).map(|r| (r.1, r.2));
    let gateway = of(Kind::Etcd);
    for (kind, what) in [(Kind::Sse, "sse"), (Kind::Blocking, "blocking")] {
        let Some((ours, _)) = of(kind) else { continue };
        let ours = ours.last;
        match gateway {
            Some((etcd, _)) => println!(
                "SUMMARY fanout {what} W={watchers}: p50 last ours={ours:.2}ms etcd={:.2}ms \
                 ratio={:.3} (goal <= 0.5: {})",
                etcd.last,
                ours / etcd.last,
                verdict(ours / etcd.last <= 0.5)
            ),
            None => println!(
                "SUMMARY fanout {what} W={watchers}: p50 last ours={ours:.2}ms etcd=skipped"
            ),
        }
    }
    if let Some((h2, h2_rss)) = of(Kind::H2Blocking) {
        let h1 = match of(Kind::Blocking) {
            Some((h1, h1_rss)) => format!(
                "p50 last h2={:.2}ms h1={:.2}ms ratio={:.3} (goal <= 1: {}); \
                 server RSS per watcher h2={h2_rss:.0}B h1={h1_rss:.0}B ratio={:.3}",
                h2.last,
                h1.last,
                h2.last / h1.last,
                verdict(h2.last <= h1.last),
                h2_rss / h1_rss
            ),
            None => format!(
                "p50 last h2={:.2}ms h1=skipped (`ulimit -n` {limit}); server RSS per \
                 watcher h2={h2_rss:.0}B",
                h2.last
            ),
        };
        println!(
            "SUMMARY h2 blocking W={watchers} over {} HTTP/2 connections vs {watchers} HTTP/1.1 \
             connections: {h1}; goal RSS <= 10 KB: {}",
            Kind::H2Blocking.connections(watchers),
            verdict(h2_rss <= 10_240.0)
        );
    }
    // The issue's first topology: one client connection per watcher on both sides.
    if let (Some((sse, _)), Some((conn, _))) = (of(Kind::Sse), of(Kind::EtcdGrpcConn)) {
        println!(
            "SUMMARY etcd-grpc-conn W={watchers} one connection per watcher: p50 last \
             sse-h1={:.2}ms etcd-grpc-conn={:.2}ms ratio={:.3} (goal <= 0.5: {}); spread \
             sse-h1={:.2}ms etcd-grpc-conn={:.2}ms (goal <= 5 ms: {})",
            sse.last,
            conn.last,
            sse.last / conn.last,
            verdict(sse.last <= 0.5 * conn.last),
            sse.spread,
            conn.spread,
            verdict(sse.spread <= 5.0)
        );
    }
    let Some((grpc, grpc_rss)) = of(Kind::EtcdGrpc) else {
        println!("SUMMARY etcd-grpc W={watchers}: etcd=skipped");
        return;
    };
    let mut line = format!(
        "SUMMARY etcd-grpc W={watchers}: delivery spread p50 etcd-grpc={:.2}ms, last p50 \
         etcd-grpc={:.2}ms, RSS/watcher etcd-grpc={grpc_rss:.0}B;",
        grpc.spread, grpc.last
    );
    for (kind, what) in [
        (Kind::Sse, "sse-h1"),
        (Kind::H2Sse, "sse-h2"),
        (Kind::H2Blocking, "blocking-h2"),
        (Kind::Etcd, "etcd-gateway"),
    ] {
        if let Some((s, rss)) = of(kind) {
            let _ = write!(
                line,
                " {what}: spread={:.2}ms ({:.2}x) last={:.2}ms ({:.2}x) RSS={rss:.0}B ({:.2}x);",
                s.spread,
                s.spread / grpc.spread,
                s.last,
                s.last / grpc.last,
                rss / grpc_rss
            );
        }
    }
    println!("{line} (ratios: to etcd-grpc)");
}

/// Server RSS per idle HTTP keep-alive connection that answered one plain read and does
/// not watch: the share of a watcher's memory that is the HTTP server's, not the table's.
pub(crate) async fn idle_connections(conns: usize) -> f64 {
    let server = Server::start();
    let addr = server.addr;
    let before = rss_kib(server.pid());
    let connects = Arc::new(Semaphore::new(256));
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let (connects, tx, mut stop) = (connects.clone(), tx.clone(), stop.clone());
            tokio::spawn(async move {
                let permit = connects.acquire().await.unwrap();
                let mut conn = Conn::connect(addr).await.unwrap();
                drop(permit);
                let read = get("/v1/services/svc-0/endpoints", VIEW_TOKEN);
                let (head, _) = conn.request(read.as_bytes()).await.unwrap();
                assert_eq!(head.status, 200);
                let _ = tx.send(());
                // Idle, connection open, until every connection was counted.
                let _ = stop.wait_for(|s| *s).await;
                drop(conn);
            })
        })
        .collect();
    for _ in 0..conns {
        tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("every connection is served")
            .unwrap();
    }
    let after = rss_kib(server.pid());
    stop_tx.send_replace(true);
    for t in tasks {
        t.await.unwrap();
    }
    (after as f64 - before as f64) * 1024.0 / conns as f64
}

pub(crate) async fn memory_summary((watchers, memory): &(usize, Memory)) {
    let watchers = *watchers;
    if watchers == 0 {
        return;
    }
    let idle = idle_connections(watchers).await;
    println!(
        "\nserver RSS per idle HTTP/1.1 keep-alive connection, no watch (W={watchers}): {idle:.0} B"
    );
    let etcd = memory.iter().find(|(k, _)| *k == Kind::Etcd).map(|m| m.1);
    for (kind, ours) in memory {
        let what = match kind {
            Kind::Sse => "sse",
            Kind::Blocking => "blocking",
            _ => continue,
        };
        let etcd = match etcd {
            Some(e) => format!("etcd={:.0}B ratio={:.3}", e, ours / e),
            None => "etcd=skipped".into(),
        };
        println!(
            "SUMMARY memory {what} W={watchers}: server RSS per idle watcher ours={ours:.0}B {etcd} \
             (goal <= 10 KB: {}); of ours, an idle keep-alive connection without a watch={idle:.0}B",
            verdict(*ours <= 10_240.0)
        );
    }
}
