//! The endpoint table's memory per endpoint (issue 14: goal ≤ 500 bytes), in process.
//!
//! One [`endpoint_table`] (the controller side's `TableFeed` and the apiserver side that
//! serves it, with its journal) is loaded the way a controller feeds it: per service a
//! `Service` event, then its jobs placed, then each one running and ready, in store
//! batches of [`BATCH`] events (`ClusterListener::on_events`). [`ENDPOINTS`] endpoints in
//! all, across services of [`REPLICAS`] replicas and one of [`BIG`], on [`HOSTS`] hosts
//! with addresses, two named ports each. Measured: this process's VmRSS once the apiserver
//! side applied everything, minus before the first service (the runtime, the empty table
//! and the hosts already there), divided by the endpoints it serves (counted, not assumed).
//! The entries' cached JSON answers (filled on a service's first read) are not included in
//! that figure; a second one is taken after every entry was read once through the router
//! (so every entry holds its cached answer), as an apiserver that serves reads holds them.
//!
//! Run: `cargo bench -p endpoint-table --bench rss`. Prints two `SUMMARY scale` lines.
//! With `RSS_BENCH_KEEP=1` the table is left allocated at exit, so that under
//! `valgrind --tool=dhat` the bytes still live at the end are exactly the table's (by
//! allocation site: the breakdown in the crate's README).

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use endpoint_table::{endpoint_table, TableConfig};
use plugin_api::{
    ApiContext, ApiExtension, ClusterEvent, ClusterListener, ClusterSnapshot, HostFacts, HostInfo,
    HostState, JobInfo, JobState, Permission, Principal, PrincipalKind, ServiceInfo, ServiceKey,
};
use port_resource::grant::{GrantedPort, PortGrant, Protocol};
use std::time::Instant;
use tower::ServiceExt;

const ENDPOINTS: usize = 50_000;
/// The one large service.
const BIG: usize = 10_000;
/// Every other service's replicas.
const REPLICAS: usize = 100;
const HOSTS: usize = 1_000;
/// Events per store batch.
const BATCH: usize = 500;
/// The bench reader's bearer token.
const TOKEN: &str = "rss-bench-token";

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (feed, api) = endpoint_table(TableConfig::default());
        // Starts the pump that carries the feed's changes to the apiserver side.
        let viewer = Principal {
            credential: Default::default(),
            name: "bench".into(),
            kind: PrincipalKind::User,
            grants: vec![(Permission::JobView, vec!["*".into()])],
        };
        let routes = api.router(ApiContext::for_test(vec![(TOKEN.into(), viewer)]));
        let mut rev = 1;
        feed.resync(&ClusterSnapshot {
            rev,
            services: vec![],
            jobs: vec![],
            hosts: (0..HOSTS).map(host).collect(),
        });
        api.flushed().await;
        let pid = std::process::id();
        let before = testkit::rss_kib(pid);
        let at = Instant::now();

        let mut sizes = vec![BIG];
        sizes.extend(std::iter::repeat_n(REPLICAS, (ENDPOINTS - BIG) / REPLICAS));
        let mut next_job = 0;
        let mut events = 0;
        for (s, &size) in sizes.iter().enumerate() {
            rev += 1;
            feed.on_event(&ClusterEvent::Service {
                rev,
                service: service(s, size),
            });
            // Placed, then running and ready: two events per job, as a controller sends.
            // Each batch's events are built just before it is applied and dropped after:
            // a controller's own copies of its jobs are not the table's memory (holding
            // the 10,000-replica service's `JobInfo`s at once, their grants as JSON, put
            // ~27 MB of the bench's own data into the process's high-water mark).
            for (state, ready) in [(JobState::Placed, false), (JobState::Running, true)] {
                for start in (0..size).step_by(BATCH) {
                    let batch: Vec<ClusterEvent> = (start..size.min(start + BATCH))
                        .map(|r| {
                            rev += 1;
                            let job = job(s, r, next_job + r, state, ready);
                            ClusterEvent::Job { rev, job }
                        })
                        .collect();
                    events += batch.len();
                    feed.on_events(&batch);
                }
            }
            next_job += size;
        }
        api.flushed().await;
        let took = at.elapsed();
        let after = testkit::rss_kib(pid);

        let served: usize = (0..sizes.len())
            .map(|s| {
                let entry = api.entry(&key(s)).expect("every service is served");
                entry.endpoints().count()
            })
            .sum();
        assert_eq!(served, ENDPOINTS, "every replica is an endpoint");
        let bytes = (after.saturating_sub(before) * 1024) as f64 / served as f64;
        println!(
            "SUMMARY scale table_rss_per_endpoint_bytes={bytes:.0} endpoints={served} \
             services={} largest={BIG} hosts={HOSTS} rss_before_kib={before} \
             rss_after_kib={after} events={events} load_s={:.2} goal_bytes=500 ({})",
            sizes.len(),
            took.as_secs_f64(),
            if bytes <= 500.0 { "met" } else { "missed" },
        );

        // Then every entry read once, as a client would: the default JSON answer is
        // rendered and cached in the entry (later reads send the cached bytes).
        let mut answer_bytes = 0;
        for s in 0..sizes.len() {
            let request = Request::get(format!("/v1/services/svc-{s}/endpoints?project=default"))
                .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                .body(Body::empty())
                .expect("a valid request");
            let response = routes.clone().oneshot(request).await.expect("infallible");
            assert_eq!(response.status(), StatusCode::OK, "svc-{s}");
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("an answer");
            answer_bytes += body.len();
        }
        let cached = testkit::rss_kib(pid);
        let with_cache = (cached.saturating_sub(before) * 1024) as f64 / served as f64;
        println!(
            "SUMMARY scale table_rss_per_endpoint_cached_bytes={with_cache:.0} endpoints={served} \
             answers_cached_bytes={answer_bytes} ({:.0} B/endpoint) rss_after_reads_kib={cached} \
             goal_bytes=500 ({})",
            answer_bytes as f64 / served as f64,
            if with_cache <= 500.0 { "met" } else { "missed" },
        );
        if std::env::var_os("RSS_BENCH_KEEP").is_some() {
            // For a heap profiler (`valgrind --tool=dhat`): what is still allocated at exit
            // is then exactly what the table holds (see the README).
            std::mem::forget((feed, api, routes));
        }
    });
}

fn key(s: usize) -> ServiceKey {
    ServiceKey::new("default", format!("svc-{s}"))
}

fn service(s: usize, replicas: usize) -> ServiceInfo {
    ServiceInfo {
        name: format!("svc-{s}"),
        project: "default".into(),
        replicas: replicas as u32,
        profile: serde_json::json!({"ports": [
            {"name": "http", "protocol": "tcp"},
            {"name": "metrics", "protocol": "tcp"},
        ]}),
        rev: 0,
        generation: 1,
    }
}

fn host(h: usize) -> HostInfo {
    HostInfo {
        id: format!("host-{h:05}"),
        state: HostState::Ready,
        facts: HostFacts {
            ip_addr: Some(std::net::IpAddr::from([
                10,
                1,
                (h / 256) as u8,
                (h % 256) as u8,
            ])),
            ..HostFacts::default()
        },
    }
}

/// Replica `r` of service `s`, job number `n`, on a host picked by its number.
fn job(s: usize, r: usize, n: usize, state: JobState, ready: bool) -> JobInfo {
    let port = |i: usize| GrantedPort {
        name: ["http", "metrics"][i].into(),
        protocol: Protocol::Tcp,
        port: 20_000 + ((n * 2 + i) % 30_000) as u16,
    };
    let grant = PortGrant {
        ports: vec![port(0), port(1)],
    };
    JobInfo {
        job: format!("j-{n}"),
        service: format!("svc-{s}"),
        project: "default".into(),
        replica: r as u32,
        host: format!("host-{:05}", n % HOSTS),
        state,
        ready,
        grants: plugin_api::Grants::from([(port_resource::PLUGIN_NAME, grant.to_grant())]),
        generation: 1,
    }
}
