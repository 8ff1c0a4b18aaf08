//! Router tests without sockets: every format, parameter and error of the endpoint routes
//! (and, in `h2`, the routes over HTTP/2 on a real socket).

mod h2;

use crate::testutil::*;
use crate::{endpoint_table, EndpointApi, TableConfig, TableFeed};
use axum::body::{Body, BodyDataStream};
use axum::http::{Request, Response};
use axum::Router;
use expect_test::{expect, Expect};
use futures_util::StreamExt;
use plugin_api::{
    ApiContext, ApiExtension, ClusterEvent, ClusterListener, ClusterSnapshot, JobInfo, JobState,
    Permission, Principal, PrincipalKind, ServiceInfo,
};
use std::fmt::Write;
use std::time::Duration;
use tower::ServiceExt;

/// How long a test waits for something that must happen (a bound, not a timing claim).
const PATIENCE: Duration = Duration::from_secs(10);

fn user(name: &str, grants: &[(Permission, &str)]) -> Principal {
    Principal {
        credential: Default::default(),
        name: name.into(),
        kind: PrincipalKind::User,
        grants: grants
            .iter()
            .map(|(p, project)| (*p, vec![(*project).to_owned()]))
            .collect(),
    }
}

fn context() -> ApiContext {
    ApiContext::for_test(vec![
        (
            "alice".into(),
            user("alice", &[(Permission::JobView, "team-a")]),
        ),
        (
            "bob".into(),
            user("bob", &[(Permission::JobView, "team-b")]),
        ),
        // job.submit alone does not let one see endpoints.
        (
            "carol".into(),
            user("carol", &[(Permission::JobSubmit, "team-a")]),
        ),
        ("root".into(), user("root", &[(Permission::Admin, "*")])),
        (
            "dana".into(),
            user(
                "dana",
                &[
                    (Permission::JobView, "team-a"),
                    (Permission::JobView, "team-b"),
                ],
            ),
        ),
    ])
}

fn web_job(id: &str, replica: u32, host_id: &str, port: u16) -> JobInfo {
    job(id, "web", "team-a", replica, host_id, &[("http", port)])
}

/// The cluster every test starts from, at revision 10.
fn snapshot(with_web: bool) -> ClusterSnapshot {
    let svc = |s: ServiceInfo, rev| ServiceInfo { rev, ..s };
    let mut placed = web_job("j-3", 2, "exec-01", 20419);
    placed.state = JobState::Placed;
    placed.ready = false;
    let mut services = vec![
        svc(service("multi", "team-a", &["http", "metrics"]), 8),
        svc(service("noports", "team-a", &[]), 5),
        svc(service("secret", "team-b", &["http"]), 9),
    ];
    if with_web {
        services.push(svc(service("web", "team-a", &["http"]), 10));
    }
    ClusterSnapshot {
        rev: 10,
        services,
        jobs: vec![
            web_job("j-1", 0, "exec-01", 20417),
            web_job("j-2", 1, "exec-02", 20418),
            placed,
            // Ready, but its host reports no address: not an endpoint.
            web_job("j-4", 3, "exec-03", 20420),
            job(
                "j-5",
                "multi",
                "team-a",
                0,
                "exec-01",
                &[("http", 21000), ("metrics", 21001)],
            ),
            job("j-6", "secret", "team-b", 0, "exec-02", &[("http", 22000)]),
        ],
        hosts: vec![
            host("exec-01", Some("127.0.0.11")),
            host("exec-02", Some("fd00::2")),
            host("exec-03", None),
        ],
    }
}

/// `snapshot(with_web)` plus a `web` of each of `projects`, on other hosts and ports than
/// team-a's: team-b's has two replicas (exec-04, exec-02), team-c's one (exec-01).
fn snapshot_with_webs(with_web: bool, projects: &[&str]) -> ClusterSnapshot {
    let mut snap = snapshot(with_web);
    for project in projects {
        let (rev, jobs) = match *project {
            "team-b" => (
                7,
                vec![
                    job("j-7", "web", "team-b", 0, "exec-04", &[("http", 23000)]),
                    job("j-8", "web", "team-b", 1, "exec-02", &[("http", 23001)]),
                ],
            ),
            "team-c" => (
                6,
                vec![job(
                    "j-9",
                    "web",
                    "team-c",
                    0,
                    "exec-01",
                    &[("http", 24000)],
                )],
            ),
            other => panic!("no web for {other}"),
        };
        snap.services.push(ServiceInfo {
            rev,
            ..service("web", project, &["http"])
        });
        snap.jobs.extend(jobs);
    }
    if projects.contains(&"team-b") {
        snap.hosts.push(host("exec-04", Some("127.0.0.14")));
    }
    snap
}

struct Cluster {
    feed: TableFeed,
    api: EndpointApi,
    router: Router,
}

impl Cluster {
    /// A cluster whose table has not been resynced yet.
    fn empty(cfg: TableConfig) -> Self {
        let (feed, api) = endpoint_table(cfg);
        let router = api.router(context());
        Self { feed, api, router }
    }

    /// A cluster (default config) answering through `ctx`, resynced to `snapshot`.
    async fn with_context(ctx: ApiContext, snapshot: ClusterSnapshot) -> Self {
        let (feed, api) = endpoint_table(TableConfig::default());
        let router = api.router(ctx);
        let cluster = Self { feed, api, router };
        cluster.resync(snapshot).await;
        cluster
    }

    async fn new(cfg: TableConfig) -> Self {
        Self::of(cfg, snapshot(true)).await
    }

    async fn of(cfg: TableConfig, snapshot: ClusterSnapshot) -> Self {
        let cluster = Self::empty(cfg);
        cluster.resync(snapshot).await;
        cluster
    }

    async fn resync(&self, snapshot: ClusterSnapshot) {
        self.feed.resync(&snapshot);
        self.api.flushed().await;
    }

    async fn event(&self, event: ClusterEvent) {
        self.feed.on_event(&event);
        self.api.flushed().await;
    }

    /// `line` is `TOKEN PATH [| header: value]...`; TOKEN `-` sends no Authorization.
    fn request(line: &str) -> Request<Body> {
        let mut parts = line.split(" | ");
        let (token, path) = parts.next().unwrap().split_once(' ').unwrap();
        let mut req = Request::get(path);
        if token != "-" {
            req = req.header("authorization", format!("Bearer {token}"));
        }
        for h in parts {
            let (name, value) = h.split_once(": ").unwrap();
            req = req.header(name, value);
        }
        req.body(Body::empty()).unwrap()
    }

    async fn get(&self, line: &str) -> Response<Body> {
        let call = self.router.clone().oneshot(Self::request(line));
        tokio::time::timeout(PATIENCE, call).await.unwrap().unwrap()
    }

    async fn watchers_reach(&self, n: usize) {
        let shared = self.api.shared().clone();
        let reached = async {
            while shared.watcher_count() != n {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(PATIENCE, reached).await.unwrap();
    }

    fn metrics(&self) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        self.api.register_metrics(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        // Sorted: the series of a labelled family come in no fixed order.
        let mut lines: Vec<_> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.contains("_bucket") && !l.contains("_sum"))
            .collect();
        lines.sort();
        lines.join("\n")
    }
}

/// Status, the headers that matter, and the body.
async fn render(resp: Response<Body>) -> String {
    let mut out = format!("{}", resp.status().as_u16());
    for name in ["content-type", "x-xce-index", "www-authenticate"] {
        if let Some(v) = resp.headers().get(name) {
            let _ = write!(out, " {name}={}", v.to_str().unwrap());
        }
    }
    out.push('\n');
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    out.push_str(std::str::from_utf8(&body).unwrap());
    out
}

/// Everything about a response, for byte-identical comparisons; of a stream (which does
/// not end), its status, headers and first event.
async fn exact(resp: Response<Body>) -> String {
    let mut out = format!("{:?}\n", resp.status());
    let mut headers: Vec<_> = resp.headers().iter().collect();
    headers.sort_by_key(|(k, _)| k.as_str());
    for (k, v) in headers {
        let _ = writeln!(out, "{k}: {v:?}");
    }
    if resp.headers()["content-type"] == "text/event-stream" {
        out.push_str(&Events::new(resp).next().await.unwrap());
        return out;
    }
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    out.push_str(std::str::from_utf8(&body).unwrap());
    out
}

/// Sends each request in turn and compares all answers with `expect`.
async fn check(cluster: &Cluster, requests: &[&str], expect: Expect) {
    let mut out = String::new();
    for line in requests {
        let resp = render(cluster.get(line).await).await;
        let _ = write!(out, "> {line}\n{}\n\n", resp.trim_end());
    }
    expect.assert_eq(&out);
}

/// The events of an SSE body.
struct Events(BodyDataStream, String);

impl Events {
    fn new(resp: Response<Body>) -> Self {
        assert_eq!(resp.status(), 200);
        Self(resp.into_body().into_data_stream(), String::new())
    }

    /// The next event (keep-alive comments skipped), `None` at the end of the stream.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.1.find("\n\n") {
                let event: String = self.1.drain(..end + 2).collect();
                if event.starts_with(':') {
                    continue;
                }
                return Some(event.trim_end().to_owned());
            }
            let chunk = tokio::time::timeout(PATIENCE, self.0.next())
                .await
                .unwrap()?;
            self.1
                .push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    }
}

fn small(f: impl FnOnce(&mut TableConfig)) -> TableConfig {
    let mut cfg = TableConfig::default();
    f(&mut cfg);
    cfg
}

#[tokio::test]
async fn formats_and_parameters() {
    let c = Cluster::new(TableConfig::default()).await;
    check(
        &c,
        &[
            "alice /v1/services/web/endpoints",
            "alice /v1/services/web/endpoints?include=all",
            "alice /v1/services/multi/endpoints?port=metrics",
            "alice /v1/services/multi/endpoints?port=nope",
            "alice /v1/services/web/endpoints?format=plain",
            "alice /v1/services/web/endpoints | accept: text/plain",
            "alice /v1/services/web/endpoints | accept: application/json, text/plain;q=0.5",
            "alice /v1/services/web/endpoints?format=json | accept: text/plain",
            "alice /v1/services/multi/endpoints?format=plain",
            "alice /v1/services/multi/endpoints?format=plain&port=metrics",
            "alice /v1/services/noports/endpoints?format=plain",
            "alice /v1/services/noports/endpoints",
            "alice /v1/services/web/endpoints?include=ready",
            "alice /v1/services/web/endpoints?format=xml",
            "alice /v1/services/web/endpoints?index=-1",
            "alice /v1/services/web/endpoints?index=3&wait=soon",
            "alice /v1/services/web/endpoints?index=3&wait=1s",
            "alice /v1/services/web/endpoints?wait=1s",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > alice /v1/services/web/endpoints?include=all
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417},"ready":true,"state":"running"},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418},"ready":true,"state":"running"},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419},"ready":false,"state":"placed"},{"replica":3,"job":"j-4","host":"exec-03","generation":1,"ports":{"http":20420},"ready":false,"state":"running"}]}

            > alice /v1/services/multi/endpoints?port=metrics
            200 content-type=application/json x-xce-index=8
            {"service":"multi","project":"team-a","index":8,"endpoints":[{"replica":0,"job":"j-5","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"metrics":21001}}]}

            > alice /v1/services/multi/endpoints?port=nope
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"service \"multi\" has no port \"nope\" (it declares: http, metrics)"}],"message":"port: service \"multi\" has no port \"nope\" (it declares: http, metrics)"}}

            > alice /v1/services/web/endpoints?format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

            > alice /v1/services/web/endpoints | accept: text/plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

            > alice /v1/services/web/endpoints | accept: application/json, text/plain;q=0.5
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > alice /v1/services/web/endpoints?format=json | accept: text/plain
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > alice /v1/services/multi/endpoints?format=plain
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"required: service \"multi\" declares several ports (http, metrics)"}],"message":"port: required: service \"multi\" declares several ports (http, metrics)"}}

            > alice /v1/services/multi/endpoints?format=plain&port=metrics
            200 content-type=text/plain; charset=utf-8 x-xce-index=8
            127.0.0.11:21001

            > alice /v1/services/noports/endpoints?format=plain
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"service \"noports\" declares no ports"}],"message":"port: service \"noports\" declares no ports"}}

            > alice /v1/services/noports/endpoints
            200 content-type=application/json x-xce-index=5
            {"service":"noports","project":"team-a","index":5,"endpoints":[]}

            > alice /v1/services/web/endpoints?include=ready
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"include","reason":"expected \"all\""}],"message":"include: expected \"all\""}}

            > alice /v1/services/web/endpoints?format=xml
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"format","reason":"expected \"json\" or \"plain\""}],"message":"format: expected \"json\" or \"plain\""}}

            > alice /v1/services/web/endpoints?index=-1
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"index","reason":"expected a non-negative integer"}],"message":"index: expected a non-negative integer"}}

            > alice /v1/services/web/endpoints?index=3&wait=soon
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"wait","reason":"expected a duration such as \"30s\""}],"message":"wait: expected a duration such as \"30s\""}}

            > alice /v1/services/web/endpoints?index=3&wait=1s
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > alice /v1/services/web/endpoints?wait=1s
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

        "#]],
    )
    .await;
}

#[tokio::test]
async fn prometheus_sd_and_list() {
    let c = Cluster::new(TableConfig::default()).await;
    check(
        &c,
        &[
            "alice /v1/sd/prometheus?service=web",
            "alice /v1/sd/prometheus?service=web&port=http",
            "alice /v1/sd/prometheus?service=multi",
            "alice /v1/sd/prometheus?service=multi&port=metrics",
            "alice /v1/sd/prometheus?service=multi&port=nope",
            "alice /v1/sd/prometheus",
            "alice /v1/sd/prometheus?port=metrics",
            "bob /v1/sd/prometheus",
            "alice /v1/endpoints",
            "bob /v1/endpoints",
            "carol /v1/endpoints",
            "root /v1/endpoints?include=all",
        ],
        expect![[r#"
            > alice /v1/sd/prometheus?service=web
            200 content-type=application/json x-xce-index=10
            [{"targets":["127.0.0.11:20417"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-1","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:20418"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-2","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

            > alice /v1/sd/prometheus?service=web&port=http
            200 content-type=application/json x-xce-index=10
            [{"targets":["127.0.0.11:20417"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-1","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:20418"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-2","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

            > alice /v1/sd/prometheus?service=multi
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"required: service \"multi\" declares several ports (http, metrics)"}],"message":"port: required: service \"multi\" declares several ports (http, metrics)"}}

            > alice /v1/sd/prometheus?service=multi&port=metrics
            200 content-type=application/json x-xce-index=8
            [{"targets":["127.0.0.11:21001"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-5","__meta_xce_port":"metrics","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"multi"}}]

            > alice /v1/sd/prometheus?service=multi&port=nope
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"service \"multi\" has no port \"nope\" (it declares: http, metrics)"}],"message":"port: service \"multi\" has no port \"nope\" (it declares: http, metrics)"}}

            > alice /v1/sd/prometheus
            200 content-type=application/json
            [{"targets":["127.0.0.11:21000"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-5","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"multi"}},{"targets":["127.0.0.11:21001"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-5","__meta_xce_port":"metrics","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"multi"}},{"targets":["127.0.0.11:20417"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-1","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:20418"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-2","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

            > alice /v1/sd/prometheus?port=metrics
            200 content-type=application/json
            [{"targets":["127.0.0.11:21001"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-5","__meta_xce_port":"metrics","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"multi"}}]

            > bob /v1/sd/prometheus
            200 content-type=application/json
            [{"targets":["[fd00::2]:22000"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-6","__meta_xce_port":"http","__meta_xce_project":"team-b","__meta_xce_replica":"0","__meta_xce_service":"secret"}}]

            > alice /v1/endpoints
            200 content-type=application/json
            {"services":[{"service":"multi","project":"team-a","index":8,"endpoints":[{"replica":0,"job":"j-5","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":21000,"metrics":21001}}]},{"service":"noports","project":"team-a","index":5,"endpoints":[]},{"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}]}

            > bob /v1/endpoints
            200 content-type=application/json
            {"services":[{"service":"secret","project":"team-b","index":9,"endpoints":[{"replica":0,"job":"j-6","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":22000}}]}]}

            > carol /v1/endpoints
            200 content-type=application/json
            {"services":[]}

            > root /v1/endpoints?include=all
            200 content-type=application/json
            {"services":[{"service":"multi","project":"team-a","index":8,"endpoints":[{"replica":0,"job":"j-5","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":21000,"metrics":21001},"ready":true,"state":"running"}]},{"service":"noports","project":"team-a","index":5,"endpoints":[]},{"service":"secret","project":"team-b","index":9,"endpoints":[{"replica":0,"job":"j-6","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":22000},"ready":true,"state":"running"}]},{"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417},"ready":true,"state":"running"},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418},"ready":true,"state":"running"},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419},"ready":false,"state":"placed"},{"replica":3,"job":"j-4","host":"exec-03","generation":1,"ports":{"http":20420},"ready":false,"state":"running"}]}]}

        "#]],
    )
    .await;
}

/// A rollout of `web` that adds a port, then one that removes it: every endpoint carries
/// its generation, a draining replica shows only under `?include=all`, and `?port=P` (JSON,
/// plain and SD) lists only the replicas that have P.
#[tokio::test]
async fn rollouts_generations_draining_and_ports() {
    let c = Cluster::new(TableConfig::default()).await;
    let profile = |generation, ports: &[&str]| ServiceInfo {
        generation,
        ..service("web", "team-a", ports)
    };
    c.event(ev_service(11, profile(2, &["http", "metrics"])))
        .await;
    let v2 = |id: &str, replica, http, metrics| JobInfo {
        generation: 2,
        ..job(
            id,
            "web",
            "team-a",
            replica,
            "exec-02",
            &[("http", http), ("metrics", metrics)],
        )
    };
    c.event(ev_job(12, v2("j-7", 0, 20500, 20501))).await;
    // Draining: out of the endpoint whatever readiness the controller still reports.
    let mut j1 = web_job("j-1", 0, "exec-01", 20417);
    j1.state = JobState::Draining;
    c.event(ev_job(13, j1.clone())).await;
    check(
        &c,
        &[
            "alice /v1/services/web/endpoints",
            "alice /v1/services/web/endpoints?include=all",
            "alice /v1/services/web/endpoints?port=metrics",
            "alice /v1/services/web/endpoints?port=metrics&include=all",
            "alice /v1/services/web/endpoints?port=http",
            "alice /v1/services/web/endpoints?format=plain&port=metrics",
            "alice /v1/services/web/endpoints?format=plain&port=http",
            "alice /v1/services/web/endpoints?format=plain",
            "alice /v1/sd/prometheus?service=web&port=metrics",
            "alice /v1/sd/prometheus?service=web&port=http",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints
            200 content-type=application/json x-xce-index=13
            {"service":"web","project":"team-a","index":13,"endpoints":[{"replica":0,"job":"j-7","host":"exec-02","generation":2,"address":"fd00::2","ports":{"http":20500,"metrics":20501}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > alice /v1/services/web/endpoints?include=all
            200 content-type=application/json x-xce-index=13
            {"service":"web","project":"team-a","index":13,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417},"ready":false,"state":"draining"},{"replica":0,"job":"j-7","host":"exec-02","generation":2,"address":"fd00::2","ports":{"http":20500,"metrics":20501},"ready":true,"state":"running"},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418},"ready":true,"state":"running"},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419},"ready":false,"state":"placed"},{"replica":3,"job":"j-4","host":"exec-03","generation":1,"ports":{"http":20420},"ready":false,"state":"running"}]}

            > alice /v1/services/web/endpoints?port=metrics
            200 content-type=application/json x-xce-index=13
            {"service":"web","project":"team-a","index":13,"endpoints":[{"replica":0,"job":"j-7","host":"exec-02","generation":2,"address":"fd00::2","ports":{"metrics":20501}}]}

            > alice /v1/services/web/endpoints?port=metrics&include=all
            200 content-type=application/json x-xce-index=13
            {"service":"web","project":"team-a","index":13,"endpoints":[{"replica":0,"job":"j-7","host":"exec-02","generation":2,"address":"fd00::2","ports":{"metrics":20501},"ready":true,"state":"running"}]}

            > alice /v1/services/web/endpoints?port=http
            200 content-type=application/json x-xce-index=13
            {"service":"web","project":"team-a","index":13,"endpoints":[{"replica":0,"job":"j-7","host":"exec-02","generation":2,"address":"fd00::2","ports":{"http":20500}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > alice /v1/services/web/endpoints?format=plain&port=metrics
            200 content-type=text/plain; charset=utf-8 x-xce-index=13
            [fd00::2]:20501

            > alice /v1/services/web/endpoints?format=plain&port=http
            200 content-type=text/plain; charset=utf-8 x-xce-index=13
            [fd00::2]:20500
            [fd00::2]:20418

            > alice /v1/services/web/endpoints?format=plain
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"required: service \"web\" declares several ports (http, metrics)"}],"message":"port: required: service \"web\" declares several ports (http, metrics)"}}

            > alice /v1/sd/prometheus?service=web&port=metrics
            200 content-type=application/json x-xce-index=13
            [{"targets":["[fd00::2]:20501"],"labels":{"__meta_xce_generation":"2","__meta_xce_host":"exec-02","__meta_xce_job":"j-7","__meta_xce_port":"metrics","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"web"}}]

            > alice /v1/sd/prometheus?service=web&port=http
            200 content-type=application/json x-xce-index=13
            [{"targets":["[fd00::2]:20500"],"labels":{"__meta_xce_generation":"2","__meta_xce_host":"exec-02","__meta_xce_job":"j-7","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:20418"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-2","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

        "#]],
    )
    .await;

    // A rollout that removes the port: asking for it still works while a replica has it.
    c.event(ev_service(14, profile(3, &["http"]))).await;
    c.event(ev_ended(15, j1)).await;
    let lines = [
        "alice /v1/services/web/endpoints?port=metrics",
        "alice /v1/services/web/endpoints?format=plain",
    ];
    check(&c, &lines, expect![[r#"
        > alice /v1/services/web/endpoints?port=metrics
        200 content-type=application/json x-xce-index=15
        {"service":"web","project":"team-a","index":15,"endpoints":[{"replica":0,"job":"j-7","host":"exec-02","generation":2,"address":"fd00::2","ports":{"metrics":20501}}]}

        > alice /v1/services/web/endpoints?format=plain
        200 content-type=text/plain; charset=utf-8 x-xce-index=15
        [fd00::2]:20500
        [fd00::2]:20418

    "#]]).await;
    c.event(ev_ended(16, v2("j-7", 0, 20500, 20501))).await;
    check(&c, &lines, expect![[r#"
        > alice /v1/services/web/endpoints?port=metrics
        400 content-type=application/json
        {"error":{"code":"invalid","details":[{"field":"port","reason":"service \"web\" has no port \"metrics\" (it declares: http)"}],"message":"port: service \"web\" has no port \"metrics\" (it declares: http)"}}

        > alice /v1/services/web/endpoints?format=plain
        200 content-type=text/plain; charset=utf-8 x-xce-index=16
        [fd00::2]:20418

    "#]]).await;
}

/// Every surface answers 401 without a valid token, and the same 404 for a service that
/// does not exist and one the caller may not view.
#[tokio::test]
async fn unauthenticated_and_invisible() {
    let with_web = Cluster::new(TableConfig::default()).await;
    let without_web = Cluster::empty(TableConfig::default());
    without_web.resync(snapshot(false)).await;
    let surfaces = [
        "/v1/services/web/endpoints",
        "/v1/services/web/endpoints?format=plain",
        "/v1/services/web/endpoints?index=10&wait=10m",
        "/v1/services/web/endpoints?index=0&wait=20ms",
        "/v1/services/web/endpoints/stream",
        "/v1/sd/prometheus?service=web",
    ];
    let mut requests = Vec::new();
    for surface in surfaces {
        for who in ["-", "wrong-token"] {
            requests.push(format!("{who} {surface}"));
        }
        // Whoever may not view team-a, and whatever else they ask, gets the same 404 as
        // for a service that does not exist (`index=0`: after the same wait, spent
        // waiting for a service of that name to appear).
        let sep = if surface.contains('?') { '&' } else { '?' };
        let asked = format!("{surface}{sep}port=nope");
        for line in [
            format!("bob {surface}"),
            format!("carol {surface}"),
            format!("bob {asked}"),
        ] {
            let invisible = exact(with_web.get(&line).await).await;
            let unknown = exact(without_web.get(&format!("alice {surface}")).await).await;
            assert_eq!(invisible, unknown, "{line}");
            assert!(invisible.starts_with("404"), "{invisible}");
        }
    }
    requests.push("- /v1/endpoints".into());
    requests.push("alice /v1/services/ghost/endpoints".into());
    let resp = with_web
        .get("- /v1/services/web/endpoints | authorization: Basic YWxpY2U6")
        .await;
    assert_eq!(resp.status(), 401);
    let requests: Vec<&str> = requests.iter().map(|s| s.as_str()).collect();
    check(
        &with_web,
        &requests,
        expect![[r#"
        > - /v1/services/web/endpoints
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > wrong-token /v1/services/web/endpoints
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        > - /v1/services/web/endpoints?format=plain
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > wrong-token /v1/services/web/endpoints?format=plain
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        > - /v1/services/web/endpoints?index=10&wait=10m
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > wrong-token /v1/services/web/endpoints?index=10&wait=10m
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        > - /v1/services/web/endpoints?index=0&wait=20ms
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > wrong-token /v1/services/web/endpoints?index=0&wait=20ms
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        > - /v1/services/web/endpoints/stream
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > wrong-token /v1/services/web/endpoints/stream
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        > - /v1/sd/prometheus?service=web
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > wrong-token /v1/sd/prometheus?service=web
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}

        > - /v1/endpoints
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > alice /v1/services/ghost/endpoints
        404 content-type=application/json
        {"error":{"code":"not_found","details":[],"message":"service \"ghost\" not found"}}

    "#]],
    )
    .await;
}

/// Two projects each with a `web` (and a third in team-c): a caller who sees one of them
/// gets exactly the answer, byte for byte, it would get if no other project had a `web`,
/// on every surface, before and after the other project's `web` changes or goes away.
#[tokio::test]
async fn another_projects_service_of_the_same_name_changes_nothing() {
    let cfg = TableConfig::default;
    let all = Cluster::of(cfg(), snapshot_with_webs(true, &["team-b", "team-c"])).await;
    let alone_a = Cluster::of(cfg(), snapshot(true)).await;
    let alone_b = Cluster::of(cfg(), snapshot_with_webs(false, &["team-b"])).await;
    let surfaces = |mine: &str, other: &str| {
        [
            "/v1/services/web/endpoints".to_owned(),
            "/v1/services/web/endpoints?include=all".to_owned(),
            "/v1/services/web/endpoints?format=plain".to_owned(),
            "/v1/services/web/endpoints | accept: text/plain".to_owned(),
            "/v1/services/web/endpoints?port=http".to_owned(),
            "/v1/services/web/endpoints?port=nope".to_owned(),
            "/v1/services/web/endpoints?index=1&wait=10m".to_owned(),
            "/v1/services/web/endpoints?index=1000&wait=20ms&format=plain".to_owned(),
            "/v1/services/web/endpoints/stream".to_owned(),
            "/v1/services/web/endpoints/stream?include=all | last-event-id: 1".to_owned(),
            "/v1/sd/prometheus?service=web".to_owned(),
            "/v1/endpoints".to_owned(),
            "/v1/endpoints?include=all".to_owned(),
            format!("/v1/services/web/endpoints?project={mine}"),
            format!("/v1/services/web/endpoints/stream?project={mine}"),
            format!("/v1/sd/prometheus?service=web&project={mine}"),
            format!("/v1/endpoints?project={mine}"),
            // Another project, visible or not, with or without a `web`: the one 404.
            format!("/v1/services/web/endpoints?project={other}"),
            format!("/v1/services/web/endpoints?project={other}&format=plain"),
            format!("/v1/services/web/endpoints?project={other}&index=1&wait=10m"),
            format!("/v1/services/web/endpoints/stream?project={other}"),
            format!("/v1/sd/prometheus?service=web&project={other}"),
            format!("/v1/endpoints?project={other}"),
            "/v1/services/web/endpoints?project=team-c".to_owned(),
            "/v1/services/web/endpoints?project=team-z".to_owned(),
        ]
    };
    let compare = async |all: &Cluster| {
        for (who, alone, mine, other) in [
            ("alice", &alone_a, "team-a", "team-b"),
            ("bob", &alone_b, "team-b", "team-a"),
            // Sees neither: every answer is the 404 (or the empty list) of a world without.
            ("carol", &alone_a, "team-a", "team-b"),
        ] {
            for surface in surfaces(mine, other) {
                let line = format!("{who} {surface}");
                let with = exact(all.get(&line).await).await;
                let without = exact(alone.get(&line).await).await;
                assert_eq!(with, without, "{line}");
            }
        }
    };
    compare(&all).await;

    // Each gets its own, and only its own.
    let lines = [
        "alice /v1/services/web/endpoints?format=plain",
        "bob /v1/services/web/endpoints?format=plain",
        "alice /v1/sd/prometheus?service=web",
        "bob /v1/sd/prometheus?service=web",
        "bob /v1/endpoints",
        "alice /v1/services/web/endpoints?project=team-b",
        "bob /v1/services/web/endpoints?project=team-c",
    ];
    check(&all, &lines, expect![[r#"
        > alice /v1/services/web/endpoints?format=plain
        200 content-type=text/plain; charset=utf-8 x-xce-index=10
        127.0.0.11:20417
        [fd00::2]:20418

        > bob /v1/services/web/endpoints?format=plain
        200 content-type=text/plain; charset=utf-8 x-xce-index=7
        127.0.0.14:23000
        [fd00::2]:23001

        > alice /v1/sd/prometheus?service=web
        200 content-type=application/json x-xce-index=10
        [{"targets":["127.0.0.11:20417"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-01","__meta_xce_job":"j-1","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:20418"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-2","__meta_xce_port":"http","__meta_xce_project":"team-a","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

        > bob /v1/sd/prometheus?service=web
        200 content-type=application/json x-xce-index=7
        [{"targets":["127.0.0.14:23000"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-04","__meta_xce_job":"j-7","__meta_xce_port":"http","__meta_xce_project":"team-b","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:23001"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-8","__meta_xce_port":"http","__meta_xce_project":"team-b","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

        > bob /v1/endpoints
        200 content-type=application/json
        {"services":[{"service":"secret","project":"team-b","index":9,"endpoints":[{"replica":0,"job":"j-6","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":22000}}]},{"service":"web","project":"team-b","index":7,"endpoints":[{"replica":0,"job":"j-7","host":"exec-04","generation":1,"address":"127.0.0.14","ports":{"http":23000}},{"replica":1,"job":"j-8","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":23001}}]}]}

        > alice /v1/services/web/endpoints?project=team-b
        404 content-type=application/json
        {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

        > bob /v1/services/web/endpoints?project=team-c
        404 content-type=application/json
        {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

    "#]]).await;

    // team-b's `web` changes: team-a's watchers do not wake, and nothing alice sees moved.
    let mut web_a = all.api.shared().subscribe(&key("team-a", "web")).unwrap();
    web_a.mark_unchanged();
    let mut j7 = job("j-7", "web", "team-b", 0, "exec-04", &[("http", 23000)]);
    j7.ready = false;
    all.event(ev_job(11, j7)).await;
    all.event(ev_host(
        12,
        host("exec-04", Some("127.0.0.24")),
        &[("team-b", "web")],
    ))
    .await;
    assert!(!web_a.has_changed().unwrap());
    let mut j7 = job("j-7", "web", "team-b", 0, "exec-04", &[("http", 23000)]);
    j7.ready = false;
    alone_b.event(ev_job(11, j7)).await;
    alone_b
        .event(ev_host(
            12,
            host("exec-04", Some("127.0.0.24")),
            &[("team-b", "web")],
        ))
        .await;
    compare(&all).await;

    // team-c's `web` goes away: only it.
    all.event(ev_removed(13, "web", "team-c")).await;
    assert!(!web_a.has_changed().unwrap());
    compare(&all).await;
    let lines = ["root /v1/services/web/endpoints?project=team-c"];
    check(
        &all,
        &lines,
        expect![[r#"
        > root /v1/services/web/endpoints?project=team-c
        404 content-type=application/json
        {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

    "#]],
    )
    .await;
}

/// A caller who sees both `web`s must pick one: 409 listing only its own projects
/// without `?project=`, the right one with it, on every surface; the list shows both.
#[tokio::test]
async fn a_caller_who_sees_both_picks_one() {
    let c = Cluster::of(
        TableConfig::default(),
        snapshot_with_webs(true, &["team-b", "team-c"]),
    )
    .await;
    check(
        &c,
        &[
            "dana /v1/services/web/endpoints",
            "dana /v1/services/web/endpoints?format=plain",
            "dana /v1/services/web/endpoints?index=1&wait=10m",
            "dana /v1/services/web/endpoints/stream",
            "dana /v1/sd/prometheus?service=web",
            "root /v1/services/web/endpoints?port=nope",
            "dana /v1/services/web/endpoints?project=team-a",
            "dana /v1/services/web/endpoints?project=team-b&include=all",
            "dana /v1/services/web/endpoints?project=team-b&format=plain",
            "dana /v1/services/web/endpoints?project=team-b&index=1&wait=10m",
            "dana /v1/sd/prometheus?service=web&project=team-b",
            "dana /v1/services/web/endpoints?project=team-c",
            "root /v1/services/web/endpoints?project=team-c&format=plain",
            "dana /v1/services/multi/endpoints",
            "dana /v1/services/multi/endpoints?project=team-b",
            "dana /v1/services/web/endpoints?project=",
            "dana /v1/endpoints",
            "dana /v1/endpoints?project=team-b",
            "dana /v1/endpoints?project=team-c",
        ],
        expect![[r#"
            > dana /v1/services/web/endpoints
            409 content-type=application/json
            {"error":{"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}}

            > dana /v1/services/web/endpoints?format=plain
            409 content-type=application/json
            {"error":{"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}}

            > dana /v1/services/web/endpoints?index=1&wait=10m
            409 content-type=application/json
            {"error":{"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}}

            > dana /v1/services/web/endpoints/stream
            409 content-type=application/json
            {"error":{"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}}

            > dana /v1/sd/prometheus?service=web
            409 content-type=application/json
            {"error":{"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}}

            > root /v1/services/web/endpoints?port=nope
            409 content-type=application/json
            {"error":{"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""},{"field":"project","reason":"\"team-c\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b, team-c); pick one with ?project="}}

            > dana /v1/services/web/endpoints?project=team-a
            200 content-type=application/json x-xce-index=10
            {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}

            > dana /v1/services/web/endpoints?project=team-b&include=all
            200 content-type=application/json x-xce-index=7
            {"service":"web","project":"team-b","index":7,"endpoints":[{"replica":0,"job":"j-7","host":"exec-04","generation":1,"address":"127.0.0.14","ports":{"http":23000},"ready":true,"state":"running"},{"replica":1,"job":"j-8","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":23001},"ready":true,"state":"running"}]}

            > dana /v1/services/web/endpoints?project=team-b&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=7
            127.0.0.14:23000
            [fd00::2]:23001

            > dana /v1/services/web/endpoints?project=team-b&index=1&wait=10m
            200 content-type=application/json x-xce-index=7
            {"service":"web","project":"team-b","index":7,"endpoints":[{"replica":0,"job":"j-7","host":"exec-04","generation":1,"address":"127.0.0.14","ports":{"http":23000}},{"replica":1,"job":"j-8","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":23001}}]}

            > dana /v1/sd/prometheus?service=web&project=team-b
            200 content-type=application/json x-xce-index=7
            [{"targets":["127.0.0.14:23000"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-04","__meta_xce_job":"j-7","__meta_xce_port":"http","__meta_xce_project":"team-b","__meta_xce_replica":"0","__meta_xce_service":"web"}},{"targets":["[fd00::2]:23001"],"labels":{"__meta_xce_generation":"1","__meta_xce_host":"exec-02","__meta_xce_job":"j-8","__meta_xce_port":"http","__meta_xce_project":"team-b","__meta_xce_replica":"1","__meta_xce_service":"web"}}]

            > dana /v1/services/web/endpoints?project=team-c
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

            > root /v1/services/web/endpoints?project=team-c&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=6
            127.0.0.11:24000

            > dana /v1/services/multi/endpoints
            200 content-type=application/json x-xce-index=8
            {"service":"multi","project":"team-a","index":8,"endpoints":[{"replica":0,"job":"j-5","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":21000,"metrics":21001}}]}

            > dana /v1/services/multi/endpoints?project=team-b
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"multi\" not found"}}

            > dana /v1/services/web/endpoints?project=
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"project","reason":"must not be empty"}],"message":"project: must not be empty"}}

            > dana /v1/endpoints
            200 content-type=application/json
            {"services":[{"service":"multi","project":"team-a","index":8,"endpoints":[{"replica":0,"job":"j-5","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":21000,"metrics":21001}}]},{"service":"noports","project":"team-a","index":5,"endpoints":[]},{"service":"secret","project":"team-b","index":9,"endpoints":[{"replica":0,"job":"j-6","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":22000}}]},{"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]},{"service":"web","project":"team-b","index":7,"endpoints":[{"replica":0,"job":"j-7","host":"exec-04","generation":1,"address":"127.0.0.14","ports":{"http":23000}},{"replica":1,"job":"j-8","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":23001}}]}]}

            > dana /v1/endpoints?project=team-b
            200 content-type=application/json
            {"services":[{"service":"secret","project":"team-b","index":9,"endpoints":[{"replica":0,"job":"j-6","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":22000}}]},{"service":"web","project":"team-b","index":7,"endpoints":[{"replica":0,"job":"j-7","host":"exec-04","generation":1,"address":"127.0.0.14","ports":{"http":23000}},{"replica":1,"job":"j-8","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":23001}}]}]}

            > dana /v1/endpoints?project=team-c
            200 content-type=application/json
            {"services":[]}

        "#]],
    )
    .await;

    // The stream of the one picked: its entries, then its removal, nothing of the other.
    let mut b = Events::new(
        c.get("dana /v1/services/web/endpoints/stream?project=team-b")
            .await,
    );
    let mut a = Events::new(
        c.get("dana /v1/services/web/endpoints/stream?project=team-a")
            .await,
    );
    let mut out = String::new();
    let _ = writeln!(out, "b: {}", b.next().await.unwrap());
    let _ = writeln!(out, "a: {}", a.next().await.unwrap());
    c.event(ev_removed(11, "web", "team-b")).await;
    let _ = writeln!(out, "b: {}", b.next().await.unwrap());
    let _ = writeln!(out, "b then: {:?}", b.next().await);
    let mut ready = web_job("j-3", 2, "exec-01", 20419);
    ready.ready = true;
    c.event(ev_job(12, ready)).await;
    let _ = writeln!(out, "a: {}", a.next().await.unwrap());
    expect![[r#"
        b: id: 7
        data: {"service":"web","project":"team-b","index":7,"endpoints":[{"replica":0,"job":"j-7","host":"exec-04","generation":1,"address":"127.0.0.14","ports":{"http":23000}},{"replica":1,"job":"j-8","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":23001}}]}
        a: id: 10
        data: {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}
        b: event: error
        data: {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}
        b then: None
        a: id: 12
        data: {"service":"web","project":"team-a","index":12,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419}}]}
    "#]].assert_eq(&out);
    drop(a);
    c.watchers_reach(0).await;

    // team-b's gone: the name is dana's team-a one again, without `?project=`.
    let lines = [
        "dana /v1/services/web/endpoints?format=plain",
        "dana /v1/services/web/endpoints?project=team-b",
    ];
    check(
        &c,
        &lines,
        expect![[r#"
        > dana /v1/services/web/endpoints?format=plain
        200 content-type=text/plain; charset=utf-8 x-xce-index=12
        127.0.0.11:20417
        [fd00::2]:20418
        127.0.0.11:20419

        > dana /v1/services/web/endpoints?project=team-b
        404 content-type=application/json
        {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

    "#]],
    )
    .await;
}

#[tokio::test]
async fn unavailable_until_the_first_resync() {
    let c = Cluster::empty(TableConfig::default());
    let lines = [
        "- /v1/services/web/endpoints",
        "alice /v1/services/web/endpoints",
        "alice /v1/services/web/endpoints/stream",
        "alice /v1/sd/prometheus?service=web",
        "alice /v1/endpoints",
    ];
    check(&c, &lines, expect![[r#"
        > - /v1/services/web/endpoints
        401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}

        > alice /v1/services/web/endpoints
        503 content-type=application/json
        {"error":{"code":"unavailable","details":[],"message":"the endpoint table is catching up, retry shortly"}}

        > alice /v1/services/web/endpoints/stream
        503 content-type=application/json
        {"error":{"code":"unavailable","details":[],"message":"the endpoint table is catching up, retry shortly"}}

        > alice /v1/sd/prometheus?service=web
        503 content-type=application/json
        {"error":{"code":"unavailable","details":[],"message":"the endpoint table is catching up, retry shortly"}}

        > alice /v1/endpoints
        503 content-type=application/json
        {"error":{"code":"unavailable","details":[],"message":"the endpoint table is catching up, retry shortly"}}

    "#]]).await;
    // The first request after the resync gets the table, whether or not the pump has
    // carried it over yet.
    c.feed.resync(&snapshot(true));
    let resp = c.get("alice /v1/services/web/endpoints").await;
    assert_eq!(resp.status(), 200);
}

/// Read your writes: the controller answers a change once its feed has queued it, so a
/// read sent after that answer sees it, whether or not the pump has carried it over yet
/// (a create answered 201 then read at once used to get a 404 on a busy machine). The
/// pump cannot run here between the push and the read: this runtime has one thread, and
/// nothing below yields before the read is answered.
#[tokio::test]
async fn a_read_after_the_feed_queued_a_change_sees_it() {
    let c = Cluster::new(TableConfig::default()).await;
    c.feed
        .on_event(&ev_service(20, service("api", "team-a", &["http"])));
    let resp = c.get("alice /v1/services/api/endpoints").await;
    assert_eq!(resp.status(), 200, "{}", render(resp).await);
    c.feed.on_event(&ev_removed(21, "api", "team-a"));
    let resp = c.get("alice /v1/services/api/endpoints").await;
    assert_eq!(resp.status(), 404, "{}", render(resp).await);
}

/// A host whose authority ends (a controller frozen past its leadership lease) answers no
/// read from its copy: 503 `stale` with the reason, and a blocking query parked before
/// it ends answers that too when its wait ends, never the entry it would have had; open
/// streams of both kinds end at the next change instead of sending it.
#[tokio::test]
async fn reads_stop_when_the_hosts_authority_ends() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let c = Cluster::new(TableConfig::default()).await;
    let leads = Arc::new(AtomicBool::new(true));
    let flag = leads.clone();
    c.api.answer_while(Arc::new(move || {
        if flag.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err("its lease ran out".into())
        }
    }));
    let resp = c.get("alice /v1/services/web/endpoints").await;
    assert_eq!(resp.status(), 200);
    let waiting = tokio::spawn(c.router.clone().oneshot(Cluster::request(
        "alice /v1/services/web/endpoints?index=10&wait=10m",
    )));
    // Streams of both kinds, opened while it leads: each has its first event(s).
    let mut stream = Events::new(c.get("alice /v1/services/web/endpoints/stream").await);
    assert!(stream.next().await.unwrap().starts_with("id: 10"));
    let mut all = Events::new(c.get("alice /v1/endpoints/stream").await);
    let mut snapshot = Vec::new();
    while snapshot
        .last()
        .is_none_or(|e: &String| !e.contains("\nid: "))
    {
        snapshot.push(all.next().await.unwrap());
    }
    c.watchers_reach(3).await;
    leads.store(false, Ordering::SeqCst);
    let mut ready = web_job("j-3", 2, "exec-01", 20419);
    ready.ready = true;
    c.event(ev_job(11, ready)).await;
    let parked = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    // The change after the authority ended is sent on no stream: both end.
    assert_eq!(stream.next().await, None, "a per-service stream ends");
    assert_eq!(all.next().await, None, "an all-services stream ends");
    let now = c.get("alice /v1/services/web/endpoints").await;
    let texts = [render(parked).await, render(now).await];
    for text in texts {
        assert!(
            text.starts_with("503")
                && text.contains("its lease ran out")
                && text.contains(r#""code":"stale""#),
            "{text}"
        );
    }
}

#[tokio::test]
async fn blocking_queries() {
    let c = Cluster::new(TableConfig::default()).await;
    // Already past the index: at once. Not yet: the wait runs out, the index is unchanged.
    check(
        &c,
        &[
            "alice /v1/services/web/endpoints?index=9&wait=10m&format=plain",
            "alice /v1/services/web/endpoints?index=10&wait=50ms&format=plain",
            "alice /v1/services/web/endpoints?index=10&wait=0s&format=plain",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints?index=9&wait=10m&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

            > alice /v1/services/web/endpoints?index=10&wait=50ms&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

            > alice /v1/services/web/endpoints?index=10&wait=0s&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

        "#]],
    )
    .await;

    // A change of the service wakes a waiting query.
    let waiting = tokio::spawn(c.router.clone().oneshot(Cluster::request(
        "alice /v1/services/web/endpoints?index=10&wait=10m",
    )));
    c.watchers_reach(1).await;
    let mut ready = web_job("j-3", 2, "exec-01", 20419);
    ready.ready = true;
    c.event(ev_job(11, ready)).await;
    let resp = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();
    let got = render(resp.unwrap()).await;
    expect![[r#"
        200 content-type=application/json x-xce-index=11
        {"service":"web","project":"team-a","index":11,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419}}]}"#]].assert_eq(&got);
    c.watchers_reach(0).await;

    // The service going away while a query waits answers 404.
    let waiting = tokio::spawn(c.router.clone().oneshot(Cluster::request(
        "alice /v1/services/web/endpoints?index=11&wait=10m",
    )));
    c.watchers_reach(1).await;
    c.event(ev_removed(12, "web", "team-a")).await;
    let resp = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();
    expect![[r#"
        404 content-type=application/json
        {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}"#]]
    .assert_eq(&render(resp.unwrap()).await);
    c.watchers_reach(0).await;

    // A name no visible service has is at index 0: a blocking query from index 0 waits
    // for a service to appear (how a watch outlives its service's absence without
    // polling); without a wait, or when the wait runs out, the 404. From a higher index
    // (the caller saw the service) the absence is the change: the 404 at once.
    check(
        &c,
        &[
            "alice /v1/services/web/endpoints",
            "alice /v1/services/web/endpoints?index=0&wait=0s",
            "alice /v1/services/web/endpoints?index=0&wait=20ms",
            "alice /v1/services/web/endpoints?index=11&wait=10m",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

            > alice /v1/services/web/endpoints?index=0&wait=0s
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

            > alice /v1/services/web/endpoints?index=0&wait=20ms
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

            > alice /v1/services/web/endpoints?index=11&wait=10m
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}

        "#]],
    )
    .await;
    let waiting = tokio::spawn(c.router.clone().oneshot(Cluster::request(
        "alice /v1/services/web/endpoints?index=0&wait=10m&format=plain",
    )));
    c.watchers_reach(1).await;
    // A `web` alice may not view appears: she keeps waiting (no existence oracle).
    c.event(ev_service(13, service("web", "team-b", &["http"])))
        .await;
    c.event(ev_job(
        14,
        job("j-7", "web", "team-b", 0, "exec-02", &[("http", 23000)]),
    ))
    .await;
    assert!(
        !waiting.is_finished(),
        "woken by a service alice cannot view"
    );
    c.watchers_reach(1).await;
    // Hers comes back: answered at once.
    c.event(ev_service(15, service("web", "team-a", &["http"])))
        .await;
    let resp = tokio::time::timeout(PATIENCE, waiting)
        .await
        .unwrap()
        .unwrap();
    expect![[r#"
        200 content-type=text/plain; charset=utf-8 x-xce-index=15
        127.0.0.11:20417
        [fd00::2]:20418
        127.0.0.11:20419
    "#]]
    .assert_eq(&render(resp.unwrap()).await);
    c.watchers_reach(0).await;
}

#[tokio::test]
async fn wait_is_capped() {
    let c = Cluster::new(small(|c| {
        c.max_wait = Duration::from_millis(20);
        c.default_wait = Duration::from_millis(20);
    }))
    .await;
    // Both would wait for minutes uncapped; the test's patience bounds them.
    check(
        &c,
        &[
            "alice /v1/services/web/endpoints?index=10&wait=10m&format=plain",
            "alice /v1/services/web/endpoints?index=10&format=plain",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints?index=10&wait=10m&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

            > alice /v1/services/web/endpoints?index=10&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

        "#]],
    )
    .await;
}

/// A watcher wakes only when its own service was touched: not for other services, not
/// for a resync with the state the table holds. An event that touches the service raises
/// its index to the event's revision even when the entry reads the same (the index is the
/// service's stored revision, identical on every apiserver).
#[tokio::test]
async fn watchers_wake_only_for_their_service() {
    let c = Cluster::new(TableConfig::default()).await;
    let mut web = c.api.shared().subscribe(&key("team-a", "web")).unwrap();
    web.mark_unchanged();
    let mut multi = job(
        "j-5",
        "multi",
        "team-a",
        0,
        "exec-01",
        &[("http", 21000), ("metrics", 21001)],
    );
    multi.ready = false;
    c.event(ev_job(11, multi)).await;
    c.resync(snapshot(true)).await;
    assert!(!web.has_changed().unwrap());
    // The first resync's 4 entries, multi's change, and the second resync's undoing it.
    let metrics = c.metrics();
    assert!(
        metrics.contains("xce_endpoint_table_changes_total 6\n"),
        "{metrics}"
    );
    c.event(ev_job(12, web_job("j-1", 0, "exec-01", 20417)))
        .await;
    assert!(web.has_changed().unwrap(), "touched: index raised");
    web.mark_unchanged();
    assert_eq!(c.api.entry(&key("team-a", "web")).unwrap().index, 12);
    c.event(ev_host(
        14,
        host("exec-02", Some("fd00::3")),
        &[("team-a", "web")],
    ))
    .await;
    assert!(web.has_changed().unwrap());
    let plain = render(c.get("alice /v1/services/web/endpoints?format=plain").await).await;
    expect![[r#"
        200 content-type=text/plain; charset=utf-8 x-xce-index=14
        127.0.0.11:20417
        [fd00::3]:20418
    "#]]
    .assert_eq(&plain);
}

#[tokio::test]
async fn stream_events_and_resume() {
    let c = Cluster::new(TableConfig::default()).await;
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    let mut out = String::new();

    // The first event is the current entry; then one per change.
    let resp = c.get("alice /v1/services/web/endpoints/stream").await;
    let _ = writeln!(
        out,
        "headers: {:?} {:?}",
        resp.headers()["content-type"],
        resp.headers()["x-xce-index"]
    );
    let mut events = Events::new(resp);
    let _ = writeln!(out, "{}", events.next().await.unwrap());
    c.event(ev_job(11, j3.clone())).await;
    let _ = writeln!(out, "{}", events.next().await.unwrap());

    // Resuming behind the current index: the current entry at once.
    let resp = c
        .get("alice /v1/services/web/endpoints/stream?port=http | last-event-id: 10")
        .await;
    let mut behind = Events::new(resp);
    let _ = writeln!(out, "resumed at 10: {}", behind.next().await.unwrap());

    // Resuming at the current index: nothing until the next change.
    let resp = c
        .get("alice /v1/services/web/endpoints/stream?include=all | last-event-id: 11")
        .await;
    let mut current = Events::new(resp);
    j3.state = JobState::Stopping;
    c.event(ev_job(12, j3.clone())).await;
    let _ = writeln!(out, "resumed at 11: {}", current.next().await.unwrap());
    let _ = writeln!(out, "first stream: {}", events.next().await.unwrap());

    // Removal ends every stream with the 404 body.
    c.event(ev_removed(13, "web", "team-a")).await;
    for mut stream in [events, behind, current] {
        let _ = writeln!(out, "{}", stream.next().await.unwrap());
        let _ = writeln!(out, "then: {:?}", stream.next().await);
    }
    c.watchers_reach(0).await;
    expect![[r#"
        headers: "text/event-stream" "10"
        id: 10
        data: {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}
        id: 11
        data: {"service":"web","project":"team-a","index":11,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419}}]}
        resumed at 10: id: 11
        data: {"service":"web","project":"team-a","index":11,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419}}]}
        resumed at 11: id: 12
        data: {"service":"web","project":"team-a","index":12,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417},"ready":true,"state":"running"},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418},"ready":true,"state":"running"},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419},"ready":false,"state":"stopping"},{"replica":3,"job":"j-4","host":"exec-03","generation":1,"ports":{"http":20420},"ready":false,"state":"running"}]}
        first stream: id: 12
        data: {"service":"web","project":"team-a","index":12,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}
        event: error
        data: {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}
        then: None
        event: error
        data: {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}
        then: None
        event: error
        data: {"error":{"code":"not_found","details":[],"message":"service \"web\" not found"}}
        then: None
    "#]].assert_eq(&out);

    check(
        &c,
        &[
            "alice /v1/services/multi/endpoints/stream | last-event-id: soon",
            "alice /v1/services/multi/endpoints/stream?format=plain",
            "alice /v1/services/multi/endpoints/stream?port=nope",
        ],
        expect![[r#"
            > alice /v1/services/multi/endpoints/stream | last-event-id: soon
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"Last-Event-ID","reason":"expected a non-negative integer"}],"message":"Last-Event-ID: expected a non-negative integer"}}

            > alice /v1/services/multi/endpoints/stream?format=plain
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"format","reason":"the stream sends json only"}],"message":"format: the stream sends json only"}}

            > alice /v1/services/multi/endpoints/stream?port=nope
            400 content-type=application/json
            {"error":{"code":"invalid","details":[{"field":"port","reason":"service \"multi\" has no port \"nope\" (it declares: http, metrics)"}],"message":"port: service \"multi\" has no port \"nope\" (it declares: http, metrics)"}}

        "#]],
    )
    .await;
}

/// A stream client more than `stream_buffer` changes behind is disconnected; one within it
/// gets the newest entry.
#[tokio::test]
async fn stream_client_falling_behind_is_disconnected() {
    let c = Cluster::new(small(|c| c.stream_buffer = 2)).await;
    let mut events = Events::new(c.get("alice /v1/services/web/endpoints/stream").await);
    let mut out = String::new();
    let _ = writeln!(out, "{}", events.next().await.unwrap());
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    let mut rev = 10;
    let mut toggle = async |n: usize| {
        for _ in 0..n {
            rev += 1;
            j3.ready = !j3.ready;
            c.event(ev_job(rev, j3.clone())).await;
        }
    };
    toggle(2).await;
    let _ = writeln!(out, "2 behind: {}", events.next().await.unwrap());
    toggle(3).await;
    let _ = writeln!(out, "3 behind: {:?}", events.next().await);
    c.watchers_reach(0).await;
    let _ = writeln!(out, "{}", c.metrics());
    expect![[r#"
        id: 10
        data: {"service":"web","project":"team-a","index":10,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}}]}
        2 behind: id: 12
        data: {"service":"web","project":"team-a","index":12,"endpoints":[{"replica":0,"job":"j-1","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20417}},{"replica":1,"job":"j-2","host":"exec-02","generation":1,"address":"fd00::2","ports":{"http":20418}},{"replica":2,"job":"j-3","host":"exec-01","generation":1,"address":"127.0.0.11","ports":{"http":20419}}]}
        3 behind: None
        xce_endpoint_delivery_seconds_count{kind="all_services"} 0
        xce_endpoint_delivery_seconds_count{kind="blocking"} 0
        xce_endpoint_delivery_seconds_count{kind="stream"} 2
        xce_endpoint_propagation_seconds_count 6
        xce_endpoint_streams_lagged_total{kind="all_services"} 0
        xce_endpoint_streams_lagged_total{kind="stream"} 1
        xce_endpoint_table_changes_total 9
        xce_endpoint_watchers_rejected_total{kind="all_services"} 0
        xce_endpoint_watchers_rejected_total{kind="blocking"} 0
        xce_endpoint_watchers_rejected_total{kind="stream"} 0
        xce_endpoint_watchers{kind="all_services"} 0
        xce_endpoint_watchers{kind="blocking"} 0
        xce_endpoint_watchers{kind="stream"} 0
    "#]].assert_eq(&out);
}

/// A per-service stream costs no task of its own (issue 31): its slot's changes cut it off
/// when it falls behind, instead of a watchdog task per stream that woke on every change
/// (20 streams were 20 more tasks on the old code). Silent streams are still cut off.
#[tokio::test]
async fn per_service_streams_spawn_no_task_and_are_still_cut_off() {
    let c = Cluster::new(small(|c| c.stream_buffer = 2)).await;
    let runtime = tokio::runtime::Handle::current().metrics();
    let before = runtime.num_alive_tasks();
    let mut silent = Vec::new();
    for _ in 0..20 {
        let mut s = Events::new(c.get("alice /v1/services/web/endpoints/stream").await);
        assert_eq!(first_line(s.next().await).as_deref(), Some("id: 10"));
        silent.push(s);
    }
    assert_eq!(runtime.num_alive_tasks(), before, "tasks per stream");
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    for rev in 11..=13 {
        j3.ready = !j3.ready;
        c.event(ev_job(rev, j3.clone())).await;
    }
    c.watchers_reach(0).await;
    for mut s in silent {
        assert_eq!(s.next().await, None);
    }
}

/// A client that never reads (its stream is never polled, as when its socket is full) is
/// cut off all the same once it is more than `stream_buffer` changes behind: its place is
/// freed at once and its body ends at the next poll. A reader that keeps up stays.
#[tokio::test]
async fn stream_client_that_never_reads_is_cut_off() {
    let c = Cluster::new(small(|c| c.stream_buffer = 2)).await;
    let silent = c.get("alice /v1/services/web/endpoints/stream").await;
    assert_eq!(silent.status(), 200);
    let mut reader = Events::new(c.get("root /v1/services/web/endpoints/stream").await);
    let mut out = String::new();
    let _ = writeln!(out, "reader: {:?}", first_line(reader.next().await));
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    let mut rev = 10;
    for n in 1..=3 {
        rev += 1;
        j3.ready = !j3.ready;
        c.event(ev_job(rev, j3.clone())).await;
        let _ = writeln!(
            out,
            "change {n}: reader {:?}",
            first_line(reader.next().await)
        );
        if n == 2 {
            // Two behind is within the buffer: the silent client keeps its place.
            c.watchers_reach(2).await;
        }
    }
    // Three behind: cut off without its stream ever being polled.
    c.watchers_reach(1).await;
    let _ = writeln!(out, "{}", c.metrics());
    let mut silent = Events::new(silent);
    let _ = writeln!(
        out,
        "silent client reads at last: {:?}",
        silent.next().await
    );
    drop(reader);
    c.watchers_reach(0).await;
    expect![[r#"
        reader: Some("id: 10")
        change 1: reader Some("id: 11")
        change 2: reader Some("id: 12")
        change 3: reader Some("id: 13")
        xce_endpoint_delivery_seconds_count{kind="all_services"} 0
        xce_endpoint_delivery_seconds_count{kind="blocking"} 0
        xce_endpoint_delivery_seconds_count{kind="stream"} 3
        xce_endpoint_propagation_seconds_count 4
        xce_endpoint_streams_lagged_total{kind="all_services"} 0
        xce_endpoint_streams_lagged_total{kind="stream"} 1
        xce_endpoint_table_changes_total 7
        xce_endpoint_watchers_rejected_total{kind="all_services"} 0
        xce_endpoint_watchers_rejected_total{kind="blocking"} 0
        xce_endpoint_watchers_rejected_total{kind="stream"} 0
        xce_endpoint_watchers{kind="all_services"} 0
        xce_endpoint_watchers{kind="blocking"} 0
        xce_endpoint_watchers{kind="stream"} 1
        silent client reads at last: None
    "#]]
    .assert_eq(&out);
}

fn first_line(event: Option<String>) -> Option<String> {
    event.map(|e| e.lines().next().unwrap_or_default().to_owned())
}

/// `xce_endpoint_delivery_seconds`: each change is observed once, when the last watcher of
/// its service that was connected when it arrived has been sent it; a watcher that leaves
/// or will not be sent it (a blocking query waiting for a later index) does not hold it
/// open; a change nobody was sent is not observed. Streams are sent an event only when
/// they are read, which orders the steps; no timing is asserted.
#[tokio::test]
async fn delivery_histogram_waits_for_the_last_watcher() {
    let c = Cluster::new(TableConfig::default()).await;
    let mut out = String::new();
    let delivered = |c: &Cluster| {
        let metrics = c.metrics();
        let count = metrics
            .lines()
            .find_map(|l| l.strip_prefix("xce_endpoint_delivery_seconds_count{kind=\"stream\"} "))
            .unwrap()
            .to_owned();
        let pending = c
            .api
            .shared()
            .subscribe(&key("team-a", "web"))
            .unwrap()
            .borrow()
            .streams
            .pending();
        format!("observed {count}, pending {pending}")
    };
    let stream = async || Events::new(c.get("alice /v1/services/web/endpoints/stream").await);
    let (mut s1, mut s2, mut s3) = (stream().await, stream().await, stream().await);
    for s in [&mut s1, &mut s2, &mut s3] {
        s.next().await.unwrap();
    }
    let mut j3 = web_job("j-3", 2, "exec-01", 20419);
    let mut rev = 10;
    let mut toggle = async || {
        rev += 1;
        j3.ready = !j3.ready;
        c.event(ev_job(rev, j3.clone())).await;
    };

    // Three streams: observed once, after the third was sent the change.
    toggle().await;
    let _ = writeln!(out, "change 11, 3 streams: {}", delivered(&c));
    for (name, s) in [("s1", &mut s1), ("s2", &mut s2), ("s3", &mut s3)] {
        let event = first_line(s.next().await).unwrap();
        let _ = writeln!(out, "{name} read {event:?}: {}", delivered(&c));
    }

    // A parked blocking query and three streams, one of which disconnects unread.
    let blocking = tokio::spawn(c.router.clone().oneshot(Cluster::request(
        "alice /v1/services/web/endpoints?index=11&wait=10m",
    )));
    c.watchers_reach(4).await;
    toggle().await;
    let resp = tokio::time::timeout(PATIENCE, blocking).await.unwrap();
    let _ = writeln!(
        out,
        "change 12, blocking answered {}: {}",
        resp.unwrap().unwrap().status(),
        delivered(&c)
    );
    for (name, s) in [("s1", &mut s1), ("s2", &mut s2)] {
        let event = first_line(s.next().await).unwrap();
        let _ = writeln!(out, "{name} read {event:?}: {}", delivered(&c));
    }
    drop(s3);
    c.watchers_reach(2).await;
    let _ = writeln!(out, "s3 gone unread: {}", delivered(&c));

    // A blocking query waiting for a later index is not sent this change: once it has
    // seen the change (on its own task, so when is not ordered here) and both streams
    // were sent it, it is observed, while that query is still parked.
    let ahead = tokio::spawn(c.router.clone().oneshot(Cluster::request(
        "alice /v1/services/web/endpoints?index=1000&wait=10m",
    )));
    c.watchers_reach(3).await;
    toggle().await;
    for (name, s) in [("s1", &mut s1), ("s2", &mut s2)] {
        let event = first_line(s.next().await).unwrap();
        let _ = writeln!(out, "change 13, {name} read {event:?}");
    }
    let observed = async {
        while !delivered(&c).starts_with("observed 3,") {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(PATIENCE, observed).await.unwrap();
    let _ = writeln!(
        out,
        "then {}, watchers {}",
        delivered(&c),
        c.api.shared().watcher_count()
    );
    ahead.abort();
    c.watchers_reach(2).await;

    // Every watcher leaves before it is sent the change: nothing to observe.
    toggle().await;
    drop((s1, s2));
    c.watchers_reach(0).await;
    let _ = writeln!(
        out,
        "change 14, both streams gone unread: {}",
        delivered(&c)
    );
    // No watcher at all.
    toggle().await;
    let _ = writeln!(out, "change 15, no watcher: {}", delivered(&c));
    expect![[r#"
        change 11, 3 streams: observed 0, pending 1
        s1 read "id: 11": observed 0, pending 1
        s2 read "id: 11": observed 0, pending 1
        s3 read "id: 11": observed 1, pending 0
        change 12, blocking answered 200 OK: observed 1, pending 1
        s1 read "id: 12": observed 1, pending 1
        s2 read "id: 12": observed 1, pending 1
        s3 gone unread: observed 2, pending 0
        change 13, s1 read "id: 13"
        change 13, s2 read "id: 13"
        then observed 3, pending 0, watchers 3
        change 14, both streams gone unread: observed 3, pending 0
        change 15, no watcher: observed 3, pending 0
    "#]]
    .assert_eq(&out);
}

#[tokio::test]
async fn watcher_caps() {
    let c = Cluster::new(small(|c| {
        c.max_watchers = 3;
        c.max_watchers_per_principal = 2;
    }))
    .await;
    let stream = "/v1/services/web/endpoints/stream";
    let a1 = c.get(&format!("alice {stream}")).await;
    let a2 = c.get(&format!("alice {stream}")).await;
    assert_eq!((a1.status().as_u16(), a2.status().as_u16()), (200, 200));
    check(
        &c,
        &[
            &format!("alice {stream}"),
            "alice /v1/services/web/endpoints?index=10&wait=10m",
            // Not a watcher: it answers at once.
            "alice /v1/services/web/endpoints?index=9&wait=10m&format=plain",
            "alice /v1/services/web/endpoints?format=plain",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints/stream
            429 content-type=application/json
            {"error":{"code":"too_many_watchers","details":[],"message":"too many watchers for \"alice\" (at most 2), retry later"}}

            > alice /v1/services/web/endpoints?index=10&wait=10m
            429 content-type=application/json
            {"error":{"code":"too_many_watchers","details":[],"message":"too many watchers for \"alice\" (at most 2), retry later"}}

            > alice /v1/services/web/endpoints?index=9&wait=10m&format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

            > alice /v1/services/web/endpoints?format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=10
            127.0.0.11:20417
            [fd00::2]:20418

        "#]],
    )
    .await;
    let b1 = c.get("bob /v1/services/secret/endpoints/stream").await;
    assert_eq!(b1.status(), 200);
    check(&c, &[&format!("root {stream}")], expect![[r#"
        > root /v1/services/web/endpoints/stream
        429 content-type=application/json
        {"error":{"code":"too_many_watchers","details":[],"message":"too many watchers on this apiserver, retry later"}}

    "#]]).await;
    // A closed stream frees its place.
    drop(a1);
    c.watchers_reach(2).await;
    let root = c.get(&format!("root {stream}")).await;
    assert_eq!(root.status(), 200);
    expect![[r#"
        xce_endpoint_delivery_seconds_count{kind="all_services"} 0
        xce_endpoint_delivery_seconds_count{kind="blocking"} 0
        xce_endpoint_delivery_seconds_count{kind="stream"} 0
        xce_endpoint_propagation_seconds_count 1
        xce_endpoint_streams_lagged_total{kind="all_services"} 0
        xce_endpoint_streams_lagged_total{kind="stream"} 0
        xce_endpoint_table_changes_total 4
        xce_endpoint_watchers_rejected_total{kind="all_services"} 0
        xce_endpoint_watchers_rejected_total{kind="blocking"} 1
        xce_endpoint_watchers_rejected_total{kind="stream"} 2
        xce_endpoint_watchers{kind="all_services"} 0
        xce_endpoint_watchers{kind="blocking"} 0
        xce_endpoint_watchers{kind="stream"} 3"#]]
    .assert_eq(&c.metrics());
    drop((a2, b1, root));
    c.watchers_reach(0).await;
}

/// One test over a real loopback socket: the stream's events are flushed one by one.
#[tokio::test]
async fn stream_over_a_real_socket() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = Cluster::new(TableConfig::default()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = c.router.clone();
    let server = tokio::spawn(async move { axum::serve(listener, router).await });

    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = "GET /v1/services/web/endpoints/stream?port=http HTTP/1.1\r\n\
                   host: test\r\nauthorization: Bearer alice\r\n\r\n";
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut seen = String::new();
    let mut read_until = async |needle: &str| {
        let mut buf = [0u8; 4096];
        while !seen.contains(needle) {
            let read = tokio::time::timeout(PATIENCE, conn.read(&mut buf));
            let n = read.await.unwrap().unwrap();
            assert!(n > 0, "connection closed before {needle:?}: {seen}");
            seen.push_str(std::str::from_utf8(&buf[..n]).unwrap());
        }
    };
    read_until("id: 10\n").await;
    let mut ready = web_job("j-3", 2, "exec-01", 20419);
    ready.ready = true;
    c.event(ev_job(11, ready)).await;
    read_until("id: 11\n").await;
    assert!(seen.starts_with("HTTP/1.1 200 OK\r\n"), "{seen}");
    assert!(seen.contains("x-xce-index: 10\r\n"), "{seen}");
    assert!(
        seen.contains("127.0.0.11\",\"ports\":{\"http\":20419}"),
        "{seen}"
    );
    server.abort();
}

/// The seam: a standalone apiserver side fed with serialized updates, as a remote feed
/// would send them.
#[tokio::test]
async fn standalone_api_fed_through_serialized_updates() {
    use crate::{Table, Update};
    let api = EndpointApi::standalone(TableConfig::default());
    let router = api.router(context());
    let c = Cluster {
        feed: endpoint_table(TableConfig::default()).0,
        api,
        router,
    };
    let unsynced = c.get("alice /v1/services/web/endpoints").await;
    assert_eq!(unsynced.status(), 503);

    let send = |update: Update| {
        let json = serde_json::to_string(&update).unwrap();
        c.api.apply(serde_json::from_str(&json).unwrap());
    };
    let mut table = Table::new();
    table.resync(&snapshot(true));
    send(Update::Resync {
        entries: table.entries().cloned().collect(),
        rev: 10,
    });
    let mut ready = web_job("j-3", 2, "exec-01", 20419);
    ready.ready = true;
    for change in table.apply(&ev_job(11, ready)) {
        send(Update::Change { change });
    }
    for change in table.apply(&ev_removed(12, "multi", "team-a")) {
        send(Update::Change { change });
    }
    check(
        &c,
        &[
            "alice /v1/services/web/endpoints?format=plain",
            "alice /v1/services/multi/endpoints",
        ],
        expect![[r#"
            > alice /v1/services/web/endpoints?format=plain
            200 content-type=text/plain; charset=utf-8 x-xce-index=11
            127.0.0.11:20417
            [fd00::2]:20418
            127.0.0.11:20419

            > alice /v1/services/multi/endpoints
            404 content-type=application/json
            {"error":{"code":"not_found","details":[],"message":"service \"multi\" not found"}}

        "#]],
    )
    .await;
}

/// A host that builds the router outside a runtime still gets its feed applied.
#[test]
fn router_built_outside_a_runtime() {
    let (feed, api) = endpoint_table(TableConfig::default());
    let _router = api.router(context());
    feed.resync(&snapshot(true));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(PATIENCE, api.flushed()).await.unwrap();
    });
    assert_eq!(api.entry(&key("team-a", "web")).map(|e| e.index), Some(10));
}

/// A token removed by the host's reload ends its streams (a last `event: error` with the
/// 401 body) and blocking queries (401) at once; one whose grants no longer cover the
/// service gets its 404; everyone else's watchers go on.
#[tokio::test]
async fn revoked_credentials_end_their_watchers_only() {
    use plugin_api::{AuthError, Authenticator, Credential, LiveGrants};
    use std::sync::Arc;
    use tokio::sync::watch;

    /// Each token's grants on a channel, as the host's keyring publishes them.
    struct Live(Vec<(&'static str, watch::Sender<LiveGrants>)>);
    impl Authenticator for Live {
        fn authenticate(&self, token: Option<&str>) -> Result<Principal, AuthError> {
            let (name, tx) = self
                .0
                .iter()
                .find(|(n, _)| Some(*n) == token)
                .ok_or(AuthError::Invalid)?;
            let grants = tx.borrow().as_ref().ok_or(AuthError::Invalid)?.to_vec();
            Ok(Principal {
                name: (*name).into(),
                kind: PrincipalKind::User,
                grants,
                credential: Credential::following(tx.subscribe()),
            })
        }
    }
    let view = |projects: &[&str]| -> LiveGrants {
        Some(Arc::new(
            projects
                .iter()
                .map(|p| (Permission::JobView, vec![(*p).to_owned()]))
                .collect(),
        ))
    };
    let tokens = Arc::new(Live(vec![
        ("alice", watch::channel(view(&["team-a"])).0),
        ("dana", watch::channel(view(&["team-a", "team-b"])).0),
        ("bob", watch::channel(view(&["team-b"])).0),
    ]));
    let (feed, api) = endpoint_table(TableConfig::default());
    let router = api.router(ApiContext {
        auth: tokens.clone(),
    });
    let c = Cluster { feed, api, router };
    c.resync(snapshot(true)).await;

    let mut alice = Events::new(c.get("alice /v1/services/web/endpoints/stream").await);
    let mut dana = Events::new(c.get("dana /v1/services/web/endpoints/stream").await);
    let mut bob = Events::new(c.get("bob /v1/services/secret/endpoints/stream").await);
    let mut out = String::new();
    for (who, s) in [
        ("alice", &mut alice),
        ("dana", &mut dana),
        ("bob", &mut bob),
    ] {
        let _ = writeln!(out, "{who}: {:?}", first_line(s.next().await));
    }
    let parked = |line: &'static str| {
        let call = c.router.clone().oneshot(Cluster::request(line));
        tokio::spawn(async move { render(call.await.unwrap()).await })
    };
    let mut all = Events::new(c.get("alice /v1/endpoints/stream?service=web").await);
    let _ = writeln!(out, "alice all: {:?}", first_line(all.next().await));
    let blocking = parked("alice /v1/services/web/endpoints?index=10&wait=60s");
    let absent = parked("alice /v1/services/nope/endpoints?index=0&wait=60s");
    c.watchers_reach(6).await;

    // dana may no longer view team-a; alice is removed.
    tokens.0[1].1.send_replace(view(&["team-b"]));
    tokens.0[0].1.send_replace(None);
    let _ = writeln!(out, "dana: {:?}", dana.next().await);
    let _ = writeln!(out, "dana then: {:?}", dana.next().await);
    let _ = writeln!(out, "alice: {:?}", alice.next().await);
    let _ = writeln!(out, "alice then: {:?}", alice.next().await);
    // The all-services stream ends at once too, though nothing changed in the table.
    let _ = writeln!(out, "alice all: {:?}", all.next().await);
    let _ = writeln!(out, "alice all then: {:?}", all.next().await);
    let _ = writeln!(out, "blocking: {}", blocking.await.unwrap());
    let _ = writeln!(out, "absent: {}", absent.await.unwrap());
    c.watchers_reach(1).await;
    // bob's stream was never touched: it sees the next change of its service.
    let mut j6 = job("j-6", "secret", "team-b", 0, "exec-02", &[("http", 22000)]);
    j6.ready = false;
    c.event(ev_job(11, j6)).await;
    let _ = writeln!(out, "bob: {:?}", first_line(bob.next().await));
    expect![[r#"
        alice: Some("id: 10")
        dana: Some("id: 10")
        bob: Some("id: 9")
        alice all: Some("data: {\"service\":\"web\",\"project\":\"team-a\",\"index\":10,\"endpoints\":[{\"replica\":0,\"job\":\"j-1\",\"host\":\"exec-01\",\"generation\":1,\"address\":\"127.0.0.11\",\"ports\":{\"http\":20417}},{\"replica\":1,\"job\":\"j-2\",\"host\":\"exec-02\",\"generation\":1,\"address\":\"fd00::2\",\"ports\":{\"http\":20418}}]}")
        dana: Some("event: error\ndata: {\"error\":{\"code\":\"not_found\",\"details\":[],\"message\":\"service \\\"web\\\" not found\"}}")
        dana then: None
        alice: Some("event: error\ndata: {\"error\":{\"code\":\"unauthenticated\",\"details\":[],\"message\":\"bearer token revoked\"}}")
        alice then: None
        alice all: Some("event: error\ndata: {\"error\":{\"code\":\"unauthenticated\",\"details\":[],\"message\":\"bearer token revoked\"}}")
        alice all then: None
        blocking: 401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"bearer token revoked"}}
        absent: 401 content-type=application/json www-authenticate=Bearer
        {"error":{"code":"unauthenticated","details":[],"message":"bearer token revoked"}}
        bob: Some("id: 11")
    "#]].assert_eq(&out);
}

/// A source that can no longer follow the controller marks the table stale
/// (`ClusterListener::stale`): reads, new blocking queries and streams answer 503 `stale`
/// naming the reason, a blocking query already parked answers it too (never the entry it
/// held), an open stream ends; the next resync serves again.
#[tokio::test]
async fn a_stale_table_answers_503_and_never_the_entries_it_held_until_a_resync() {
    let c = Cluster::new(TableConfig::default()).await;
    let parked = tokio::spawn({
        let router = c.router.clone();
        async move {
            let req = Cluster::request("alice /v1/services/web/endpoints?index=10&wait=10m");
            router.oneshot(req).await.unwrap()
        }
    });
    c.watchers_reach(1).await;
    let stream = c.get("alice /v1/services/web/endpoints/stream").await;
    let mut events = Events::new(stream);
    events.next().await.unwrap();

    c.feed
        .stale("an event this apiserver does not understand: unknown variant `hibernating`");
    c.api.flushed().await;
    let mut out = String::new();
    let parked = tokio::time::timeout(PATIENCE, parked)
        .await
        .unwrap()
        .unwrap();
    out.push_str(&format!("parked: {}\n", render(parked).await));
    let ended = tokio::time::timeout(PATIENCE, events.next()).await.unwrap();
    out.push_str(&format!("stream: {ended:?}\n"));
    for line in [
        "alice /v1/services/web/endpoints",
        "alice /v1/services/web/endpoints?index=10&wait=10m",
        "alice /v1/endpoints",
    ] {
        out.push_str(&format!("{line}: {}\n", render(c.get(line).await).await));
    }
    c.resync(snapshot(true)).await;
    let again = render(c.get("alice /v1/services/web/endpoints").await).await;
    out.push_str(&format!(
        "after the resync: {}\n",
        again.lines().next().unwrap()
    ));
    expect![[r#"
        parked: 503 content-type=application/json
        {"error":{"code":"stale","details":[],"message":"this apiserver's endpoints may be out of date (an event this apiserver does not understand: unknown variant `hibernating`); it is reloading them: retry shortly or ask another apiserver"}}
        stream: None
        alice /v1/services/web/endpoints: 503 content-type=application/json
        {"error":{"code":"stale","details":[],"message":"this apiserver's endpoints may be out of date (an event this apiserver does not understand: unknown variant `hibernating`); it is reloading them: retry shortly or ask another apiserver"}}
        alice /v1/services/web/endpoints?index=10&wait=10m: 503 content-type=application/json
        {"error":{"code":"stale","details":[],"message":"this apiserver's endpoints may be out of date (an event this apiserver does not understand: unknown variant `hibernating`); it is reloading them: retry shortly or ask another apiserver"}}
        alice /v1/endpoints: 503 content-type=application/json
        {"error":{"code":"stale","details":[],"message":"this apiserver's endpoints may be out of date (an event this apiserver does not understand: unknown variant `hibernating`); it is reloading them: retry shortly or ask another apiserver"}}
        after the resync: 200 content-type=application/json x-xce-index=10
    "#]].assert_eq(&out);
}

mod allstream;
