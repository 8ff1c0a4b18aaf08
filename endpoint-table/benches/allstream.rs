//! One all-services stream (`GET /v1/endpoints/stream`) following 1,000 services against
//! 1,000 per-service streams (`GET /v1/services/{name}/endpoints/stream`), side by side in
//! one run (issue 15): the server's RSS for the streams, and the time from a change to
//! its event on the stream that follows it.
//!
//! Each side gets a fresh server process (this binary re-executed with `--serve`, serving as
//! the apiserver does: `common/serve.rs`) holding the same 1,000 services, so a memory delta
//! is not hidden by memory another run freed.
//! Memory: the server's VmRSS once every stream has its first event(s), minus before
//! any stream opened. Latency: [`CHANGES`] changes, each of a service picked at random
//! (seeded), posted to the server's control route; the clock runs from just before the
//! POST until the client reads that service's event. Where that time goes is read from the
//! server's own histograms after the changes: `xce_endpoint_propagation_seconds` (the feed
//! receiving the event → the apiserver side having applied it) and
//! `xce_endpoint_delivery_seconds{kind}` (the feed → the stream's event yielded to hyper),
//! their means; the rest of the client's time is the control POST before the feed and the
//! socket and client after the yield. Printed: one `SUMMARY allstream` line.
//!
//! Run: `cargo bench -p endpoint-table --bench allstream`.

#[path = "common/serve.rs"]
mod common_serve;

use axum::routing::{get, post};
use endpoint_table::{endpoint_table, TableConfig};
use plugin_api::{
    ApiContext, ApiExtension, ClusterEvent, ClusterListener, ClusterSnapshot, HostFacts, HostInfo,
    HostState, JobInfo, JobState, Permission, Principal, PrincipalKind, ServiceInfo,
};
use port_resource::grant::{GrantedPort, PortGrant, Protocol};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

const SERVICES: usize = 1000;
const CHANGES: usize = 40;
const TOKEN: &str = "bench";

fn main() {
    if std::env::args().any(|a| a == "--serve") {
        serve();
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let per = run(false).await;
        let all = run(true).await;
        let ratio = all.rss_bytes as f64 / per.rss_bytes.max(1) as f64 * 100.0;
        let (per50, per99) = (pct(&per.latency, 50), pct(&per.latency, 99));
        let (all50, all99) = (pct(&all.latency, 50), pct(&all.latency, 99));
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        println!(
            "SUMMARY allstream services={SERVICES}: server RSS for the streams one={}KiB \
             per-service x{SERVICES}={}KiB ({ratio:.2}% of it, goal <= 1%: {}); change to \
             event p50 one={all50:.2}ms per-service={per50:.2}ms, p99 one={all99:.2}ms \
             per-service={per99:.2}ms over {CHANGES} changes ({}); means: change to event \
             one={:.3}ms per-service={:.3}ms, of which in the server feed to applied \
             one={:.3}ms per-service={:.3}ms, feed to event yielded one={:.3}ms \
             per-service={:.3}ms ({} and {} observed)",
            all.rss_bytes / 1024,
            per.rss_bytes / 1024,
            if ratio <= 1.0 { "met" } else { "missed" },
            if all50 <= per50 * 1.1 {
                "latency no worse"
            } else {
                "latency worse"
            },
            mean(&all.latency),
            mean(&per.latency),
            all.server.applied_ms,
            per.server.applied_ms,
            all.server.yielded_ms,
            per.server.yielded_ms,
            all.server.observed,
            per.server.observed,
        );
    });
}

struct Run {
    rss_bytes: u64,
    latency: Vec<f64>,
    server: Inside,
}

/// The server's own timing of the changes, from its histograms (means).
struct Inside {
    /// The feed receiving the event → the apiserver side having applied it.
    applied_ms: f64,
    /// The feed receiving the event → the stream's event yielded.
    yielded_ms: f64,
    /// How many deliveries the server observed (one per change it was expected to).
    observed: u64,
}

impl Inside {
    /// From the server's metrics text before and after the changes (the differences: the
    /// startup's resync is not one of the changes); `kind`: the watchers of the run.
    fn parse(before: &str, after: &str, kind: &str) -> Self {
        let read = |text: &str, name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("{name} in the server's metrics"))
        };
        let value = |name: &str| read(after, name) - read(before, name);
        let delivery = |part: &str| {
            value(&format!(
                "xce_endpoint_delivery_seconds_{part}{{kind=\"{kind}\"}}"
            ))
        };
        let applied = value("xce_endpoint_propagation_seconds_sum")
            / value("xce_endpoint_propagation_seconds_count").max(1.0);
        Self {
            applied_ms: applied * 1000.0,
            yielded_ms: delivery("sum") / delivery("count").max(1.0) * 1000.0,
            observed: delivery("count") as u64,
        }
    }
}

/// One side: a fresh server, the streams, memory, then the changes.
async fn run(all: bool) -> Run {
    let mut server = Server::start();
    let before = testkit::rss_kib(server.pid()) * 1024;
    // Every stream's events go to one channel: (service index, when read).
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Instant)>();
    let paths: Vec<String> = if all {
        vec!["/v1/endpoints/stream".to_owned()]
    } else {
        (0..SERVICES)
            .map(|i| format!("/v1/services/svc-{i}/endpoints/stream"))
            .collect()
    };
    for path in paths {
        let tx = tx.clone();
        tokio::spawn(follow(server.addr, path, tx));
    }
    // The first events: one per service either way (the snapshot, or each first entry).
    for _ in 0..SERVICES {
        tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .expect("first events")
            .unwrap();
    }
    let after = testkit::rss_kib(server.pid()) * 1024;
    let metrics_before = fetch(server.addr, "/bench/metrics").await;
    let mut rng = testkit::seeded_rng("allstream bench");
    let mut latency = Vec::new();
    for _ in 0..CHANGES {
        let i = rng.usize(0..SERVICES);
        let at = Instant::now();
        control(server.addr, &format!("/bench/flip/{i}")).await;
        loop {
            let (got, when) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .expect("the change's event")
                .unwrap();
            if got == i {
                latency.push(when.duration_since(at).as_secs_f64() * 1000.0);
                break;
            }
        }
    }
    let metrics = fetch(server.addr, "/bench/metrics").await;
    server.stop();
    Run {
        rss_bytes: after.saturating_sub(before),
        latency,
        server: Inside::parse(
            &metrics_before,
            &metrics,
            if all { "all_services" } else { "stream" },
        ),
    }
}

/// Opens `path` and sends `(service index, now)` for every event read.
async fn follow(addr: SocketAddr, path: String, tx: mpsc::UnboundedSender<(usize, Instant)>) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: bench\r\nauthorization: Bearer {TOKEN}\r\naccept: text/event-stream\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let Ok(n) = conn.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        // Events are `data: {"service":"svc-N",...}` lines.
        while let Some(at) = find(&buf, b"\"service\":\"svc-") {
            let rest = &buf[at + 15..];
            let Some(end) = rest.iter().position(|b| *b == b'"') else {
                break;
            };
            let i: usize = std::str::from_utf8(&rest[..end]).unwrap().parse().unwrap();
            let _ = tx.send((i, Instant::now()));
            buf.drain(..at + 15 + end);
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn control(addr: SocketAddr, path: &str) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    conn.read_to_end(&mut out).await.unwrap();
    assert!(
        out.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&out)
    );
}

/// The body of `GET path`.
async fn fetch(addr: SocketAddr, path: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    conn.read_to_end(&mut out).await.unwrap();
    let out = String::from_utf8(out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

fn pct(v: &[f64], p: usize) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get((v.len().saturating_sub(1)) * p / 100)
        .copied()
        .unwrap_or(0.0)
}

// === the server ===

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start() -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
        Self { child, addr }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

fn job(i: usize) -> JobInfo {
    let grant = PortGrant {
        ports: vec![GrantedPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 20000 + (i % 10000) as u16,
        }],
    };
    JobInfo {
        job: format!("j-{i}"),
        service: format!("svc-{i}"),
        project: "default".into(),
        replica: 0,
        host: "h-0".into(),
        state: JobState::Running,
        ready: true,
        grants: plugin_api::Grants::from([(port_resource::PLUGIN_NAME, grant.to_grant())]),
        generation: 1,
    }
}

fn serve() {
    common_serve::log_as_xced();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = TableConfig {
            max_watchers: 25_000,
            max_watchers_per_principal: 25_000,
            ..TableConfig::default()
        };
        let (feed, api) = endpoint_table(cfg);
        let services = (0..SERVICES)
            .map(|i| ServiceInfo {
                name: format!("svc-{i}"),
                project: "default".into(),
                replicas: 1,
                profile: serde_json::json!({"ports": [{"name": "http", "protocol": "tcp"}],
                                            "meta": {"team": "bench"}}),
                rev: 1,
                generation: 1,
            })
            .collect();
        feed.resync(&ClusterSnapshot {
            rev: 1,
            services,
            jobs: (0..SERVICES).map(job).collect(),
            hosts: vec![HostInfo {
                id: "h-0".into(),
                state: HostState::Ready,
                facts: HostFacts {
                    ip_addr: Some("127.0.0.1".parse().unwrap()),
                    ..HostFacts::default()
                },
            }],
        });
        let viewer = Principal {
            credential: Default::default(),
            name: "bench".into(),
            kind: PrincipalKind::User,
            grants: vec![(Permission::JobView, vec!["*".into()])],
        };
        let routes = api.router(ApiContext::for_test(vec![(TOKEN.into(), viewer)]));
        // The table's own histograms, for where the time goes.
        let mut registry = prometheus_client::registry::Registry::default();
        api.register_metrics(&mut registry);
        let registry = Arc::new(registry);
        api.flushed().await;
        let state = Arc::new(Mutex::new((feed, 1u64, vec![true; SERVICES])));
        let control = axum::Router::new()
            .route(
                "/bench/flip/{i}",
                post(move |axum::extract::Path(i): axum::extract::Path<usize>| {
                    let state = state.clone();
                    async move {
                        let mut s = state.lock().unwrap();
                        let (feed, rev, ready) = &mut *s;
                        *rev += 1;
                        ready[i] = !ready[i];
                        let mut j = job(i);
                        j.ready = ready[i];
                        feed.on_event(&ClusterEvent::Job { rev: *rev, job: j });
                        rev.to_string()
                    }
                }),
            )
            .route(
                "/bench/metrics",
                get(move || {
                    let registry = registry.clone();
                    async move {
                        let mut text = String::new();
                        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
                        text
                    }
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("ready {}", listener.local_addr().unwrap());
        std::io::stdout().flush().unwrap();
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        common_serve::http_serve(listener, routes.merge(control)).await;
    });
}
