//! Benchmarks of the endpoint table:
//!
//! 1. the pure table: resync and event apply rates;
//! 2. change fan-out over loopback HTTP: W SSE streams on one service, one change at a
//!    time, the time until every stream has the change — against etcd's watch (its HTTP
//!    gateway, W watch streams on one key, one put at a time) when `etcd` is on PATH.
//!
//! Run: `cargo bench -p endpoint-table --bench fanout` (optionally `-- CHANGES`).

use endpoint_table::{endpoint_table, Table, TableConfig};
use plugin_api::{
    ApiContext, ApiExtension, ClusterEvent, ClusterListener, ClusterSnapshot, HostFacts, HostInfo,
    HostState, JobInfo, JobState, Permission, Principal, PrincipalKind, ServiceInfo,
};
use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

fn main() {
    let changes: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(50);
    table_rates();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let etcd = Etcd::start().await;
        if etcd.is_none() {
            println!("etcd: no `etcd` binary on PATH, etcd runs skipped");
        }
        println!(
            "\nfan-out of one change to W watchers over loopback HTTP ({changes} changes each)"
        );
        println!(
            "{:<12} {:>6} {:>14} {:>14} {:>14}",
            "system", "W", "p50 first(ms)", "p50 all(ms)", "p99 all(ms)"
        );
        for watchers in [1, 100, 1000] {
            let xce = xce_fanout(watchers, changes).await;
            report("xce stream", watchers, &xce);
            if let Some(etcd) = &etcd {
                let got = etcd.fanout(watchers, changes).await;
                report("etcd watch", watchers, &got);
            }
        }
    });
}

// === the pure table ===

fn job(id: usize, service: &str, replica: u32, host: usize, ready: bool, port: u16) -> JobInfo {
    let grant = serde_json::json!({"ports": [{"name": "http", "protocol": "tcp", "port": port}]});
    JobInfo {
        job: format!("j-{id}"),
        service: service.into(),
        project: "default".into(),
        replica,
        host: format!("exec-{host:02}"),
        state: JobState::Running,
        ready,
        grants: BTreeMap::from([(port_resource::PLUGIN_NAME.to_owned(), grant)]),
    }
}

fn snapshot(services: usize, replicas: u32, hosts: usize) -> ClusterSnapshot {
    let mut snap = ClusterSnapshot {
        rev: 10,
        ..ClusterSnapshot::default()
    };
    for h in 0..hosts {
        snap.hosts.push(HostInfo {
            id: format!("exec-{h:02}"),
            state: HostState::Ready,
            facts: HostFacts {
                ip_addr: Some(format!("127.0.0.{}", 11 + h).parse().unwrap()),
                ..HostFacts::default()
            },
        });
    }
    for s in 0..services {
        let name = format!("svc-{s}");
        snap.services.push(ServiceInfo {
            name: name.clone(),
            project: "default".into(),
            replicas,
            profile: serde_json::json!({"name": name, "ports": [{"name": "http"}]}),
            rev: 10,
        });
        for r in 0..replicas {
            let id = s * replicas as usize + r as usize;
            snap.jobs.push(job(
                id,
                &name,
                r,
                id % hosts,
                true,
                20000 + (id % 10000) as u16,
            ));
        }
    }
    snap
}

fn table_rates() {
    let (services, replicas) = (1000, 3);
    let snap = snapshot(services, replicas, 10);
    let mut table = Table::new();
    let t = Instant::now();
    let changed = table.resync(&snap).len();
    let resync = t.elapsed();
    let t = Instant::now();
    black_box(table.resync(&snap));
    let same = t.elapsed();

    let events: Vec<ClusterEvent> = (0..100_000u64)
        .map(|i| {
            // Every job in turn, flipping readiness each pass: every event is a change.
            let n = snap.jobs.len() as u64;
            let mut j = snap.jobs[((i * 7919) % n) as usize].clone();
            j.ready = (i / n) % 2 == 1;
            ClusterEvent::Job {
                rev: 11 + i,
                job: j,
            }
        })
        .collect();
    let t = Instant::now();
    let mut changes = 0;
    for e in &events {
        changes += black_box(table.apply(e)).len();
    }
    let apply = t.elapsed();
    println!("table: {services} services x {replicas} replicas");
    println!("  resync from empty      {resync:>10.2?} ({changed} changes)");
    println!("  resync, same state     {same:>10.2?} (0 changes)");
    println!(
        "  apply readiness events {:>10.0} events/s ({changes} changes from {} events)",
        events.len() as f64 / apply.as_secs_f64(),
        events.len()
    );
}

// === fan-out ===

/// Per change: when it was made, and when each watcher saw it.
type Samples = Vec<(Instant, Vec<Instant>)>;

fn report(system: &str, watchers: usize, samples: &Samples) {
    let mut first: Vec<f64> = Vec::new();
    let mut all: Vec<f64> = Vec::new();
    for (t0, seen) in samples {
        let ms = |t: &Instant| t.duration_since(*t0).as_secs_f64() * 1e3;
        first.push(seen.iter().map(ms).fold(f64::MAX, f64::min));
        all.push(seen.iter().map(ms).fold(0.0, f64::max));
    }
    let pct = |v: &mut Vec<f64>, p: f64| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    println!(
        "{system:<12} {watchers:>6} {:>14.3} {:>14.3} {:>14.3}",
        pct(&mut first, 0.5),
        pct(&mut all, 0.5),
        pct(&mut all, 0.99)
    );
}

/// One watcher: sends `request`, then reports when each marker shows up, in order.
async fn watcher(
    addr: SocketAddr,
    request: String,
    markers: Vec<String>,
    seen: mpsc::UnboundedSender<(usize, Instant)>,
) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let mut next = 0;
    while next < markers.len() {
        let n = conn.read(&mut chunk).await.unwrap();
        assert!(n > 0, "watch connection closed");
        buf.extend_from_slice(&chunk[..n]);
        while next < markers.len() {
            let text = String::from_utf8_lossy(&buf);
            let Some(at) = text.find(&markers[next]) else {
                break;
            };
            let end = at + markers[next].len();
            let _ = seen.send((next, Instant::now()));
            buf.drain(..end.min(buf.len()));
            next += 1;
        }
    }
}

/// Starts `watchers` watchers, waits for their marker 0, then makes each change in turn
/// and waits until every watcher saw it.
async fn fanout(
    watchers: usize,
    changes: usize,
    addr: SocketAddr,
    request: String,
    markers: Vec<String>,
    mut change: impl AsyncFnMut(usize),
) -> Samples {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let tasks: Vec<_> = (0..watchers)
        .map(|_| tokio::spawn(watcher(addr, request.clone(), markers.clone(), tx.clone())))
        .collect();
    for _ in 0..watchers {
        assert_eq!(rx.recv().await.unwrap().0, 0);
    }
    let mut samples = Vec::new();
    for k in 1..=changes {
        let t0 = Instant::now();
        change(k).await;
        let mut seen = Vec::with_capacity(watchers);
        while seen.len() < watchers {
            let (got, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .expect("every watcher sees the change")
                .unwrap();
            assert_eq!(got, k);
            seen.push(at);
        }
        samples.push((t0, seen));
    }
    for t in tasks {
        t.await.unwrap();
    }
    samples
}

async fn xce_fanout(watchers: usize, changes: usize) -> Samples {
    let cfg = TableConfig {
        max_watchers: watchers + 10,
        max_watchers_per_principal: watchers + 10,
        ..TableConfig::default()
    };
    let (feed, api) = endpoint_table(cfg);
    let principal = Principal {
        name: "bench".into(),
        kind: PrincipalKind::User,
        grants: vec![(Permission::JobView, vec!["*".into()])],
    };
    let router = api.router(ApiContext::for_test(vec![("t".into(), principal)]));
    let snap = snapshot(1, 3, 3);
    feed.resync(&snap);
    api.flushed().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let request = "GET /v1/services/svc-0/endpoints/stream HTTP/1.1\r\nhost: b\r\n\
                   authorization: Bearer t\r\n\r\n"
        .to_owned();
    let markers = (0..=changes).map(|k| format!("id: {}\n", 10 + k)).collect();
    let mut j = snap.jobs[0].clone();
    let samples = fanout(watchers, changes, addr, request, markers, async |k| {
        j.ready = !j.ready;
        feed.on_event(&ClusterEvent::Job {
            rev: 10 + k as u64,
            job: j.clone(),
        });
    })
    .await;
    server.abort();
    samples
}

// === etcd ===

struct Etcd {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn b64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

impl Etcd {
    async fn start() -> Option<Self> {
        // On tmpfs when there is one: the comparison is about fan-out, not the disk.
        let dir = tempfile::Builder::new()
            .prefix("bench-etcd")
            .tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let (client, peer) = (free_port(), free_port());
        let child = std::process::Command::new("etcd")
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.path())
            .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
            ))
            .arg(format!("--initial-cluster=bench=http://127.0.0.1:{peer}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let etcd = Etcd {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], client)),
            _dir: dir,
        };
        for _ in 0..200 {
            if let Ok(mut c) = TcpStream::connect(etcd.addr).await {
                let req = "GET /health HTTP/1.1\r\nhost: b\r\nconnection: close\r\n\r\n";
                let mut resp = String::new();
                if c.write_all(req.as_bytes()).await.is_ok()
                    && c.read_to_string(&mut resp).await.is_ok()
                    && resp.contains("\"true\"")
                {
                    return Some(etcd);
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("etcd did not become healthy");
    }

    async fn fanout(&self, watchers: usize, changes: usize) -> Samples {
        let key = b64(format!("svc-w{watchers}").as_bytes());
        let value = |k: usize| b64(format!("value-{watchers:05}-{k:05}").as_bytes());
        let request = post(
            "/v3/watch",
            &format!(r#"{{"create_request":{{"key":"{key}"}}}}"#),
        );
        let mut markers = vec!["\"created\":true".to_owned()];
        markers.extend((1..=changes).map(|k| format!("\"value\":\"{}\"", value(k))));
        let addr = self.addr;
        fanout(watchers, changes, addr, request, markers, async |k| {
            let put = post(
                "/v3/kv/put",
                &format!(r#"{{"key":"{key}","value":"{}"}}"#, value(k)),
            );
            let mut conn = TcpStream::connect(addr).await.unwrap();
            conn.write_all(put.as_bytes()).await.unwrap();
            // The answer is read off the clock, in the background.
            tokio::spawn(async move {
                let mut sink = [0u8; 4096];
                let _ = conn.read(&mut sink).await;
            });
        })
        .await
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
