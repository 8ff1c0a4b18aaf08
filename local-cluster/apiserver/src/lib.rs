//! A separate apiserver (`xced apiserver`): more replicas of the read side, sharing the
//! controller's etcd.
//!
//! It serves `/healthz`, `/metrics` and every extension's routes (the endpoint table's
//! reads, blocking queries and streams) from its own copy of the cluster, fed by an etcd
//! watch on the controller's store (`follow.rs`): the pushed state, with no request to
//! the controller per read or per watcher. Every other route — changes, the controller's
//! own views, the workers' `/internal/v1` protocol — is forwarded to the leader
//! controller (`forward.rs`), which an etcd watch on the election's leader key names
//! (`leader.rs`); so clients and workers may be pointed at any apiserver.
//!
//! Like the controller, it names no plugin: the wiring (the `xced` crate) hands it the
//! listeners that feed its extensions.

mod follow;
mod forward;
mod fresh;
mod leader;
mod metrics;
mod parked;
mod register;

use anyhow::Context;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use forward::{forward, Forwarder};
use plugin_api::{ApiContext, ApiError, ApiExtension, ClusterListener, Principal};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use xce_serve::auth::MetricsConfig;
use xce_serve::keyring::Keyring;
use xce_serve::{json_errors, metrics_response};
use xce_store::{Election, EtcdStore};

/// What an apiserver needs to know.
#[derive(Debug, Clone)]
pub struct ApiserverConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The largest request body accepted (413 beyond), forwarded ones included.
    pub body_limit: usize,
    /// The controller's etcd (`HOST:PORT` each).
    pub etcd: Vec<String>,
    /// The controller's key prefix in etcd.
    pub prefix: String,
    /// What clients may hold of the API port (connection caps and timeouts).
    pub connections: xce_serve::ConnLimits,
    /// Serve over TLS with this certificate (`tls_cert`, `tls_key`); plain HTTP without.
    pub tls: Option<xce_serve::ServerTls>,
    /// The CA that signed the controllers' certificates, for forwarding to an `https://`
    /// leader (`ca_file`); the system's roots without.
    pub ca_file: Option<std::path::PathBuf>,
    /// Whether the controllers serve TLS (`leader_tls`): requests are forwarded to
    /// `https://` then.
    pub leader_tls: bool,
    /// Who may read `/metrics` (`[metrics]`).
    pub metrics: xce_serve::auth::MetricsConfig,
    /// Past this lag behind the store it fails closed (503 `stale`, see `fresh.rs`).
    pub max_lag: Duration,
}

/// `max_lag` unless told otherwise.
pub const DEFAULT_MAX_LAG: Duration = Duration::from_secs(2);

/// The plugins an apiserver hosts: listeners fed from the store's history, and the route
/// extensions they feed.
pub struct ApiserverPlugins {
    /// Fed with a resync from the store, then every committed event, in order.
    pub listeners: Vec<Arc<dyn ClusterListener>>,
    /// Their routes, served here.
    pub extensions: Vec<Arc<dyn ApiExtension>>,
}

impl std::fmt::Debug for ApiserverPlugins {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiserverPlugins")
            .field("listeners", &self.listeners.len())
            .field("extensions", &self.extensions.len())
            .finish()
    }
}

/// An apiserver serving on a socket.
pub struct RunningApiserver {
    /// The bound address (useful with port 0).
    pub addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
    follower: JoinHandle<()>,
    leader: JoinHandle<()>,
    /// The prober, the lag's judge and the registration.
    freshness: Vec<JoinHandle<()>>,
    /// The registration's lease (revoked at shutdown) and the store it is in.
    registered: (Arc<EtcdStore>, Option<i64>),
    extensions: Vec<Arc<dyn ApiExtension>>,
}

impl std::fmt::Debug for RunningApiserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningApiserver")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// Loads the state from etcd into the listeners, starts following it, binds and serves.
/// Returns once it serves: the extensions never answer from an empty copy.
pub async fn start(
    cfg: ApiserverConfig,
    tokens: impl Into<Keyring>,
    plugins: ApiserverPlugins,
) -> anyhow::Result<RunningApiserver> {
    let store = Arc::new(
        EtcdStore::new(cfg.etcd.clone())
            .and_then(|s| s.with_prefix(&cfg.prefix))
            .context("invalid etcd store")?,
    );
    let metrics = metrics::Metrics::default();
    let keyring: Keyring = tokens.into();
    let registry = registry(&metrics, &keyring, &plugins.extensions);
    let (leader_watch, leader) =
        leader::LeaderWatch::new(store.clone(), &leader_key(&cfg)?, metrics.clone());
    let fresh = Arc::new(fresh::Freshness::new(cfg.max_lag, metrics.clone()));
    let mut follower = follow::Follower::new(
        store.clone(),
        plugins.listeners.clone(),
        metrics.clone(),
        fresh.clone(),
    );
    follower
        .load()
        .await
        .context("cannot load the state from etcd")?;
    let cluster_id = follower.cluster_id().map(Arc::from);
    let follower = tokio::spawn(follower.run());
    let mut freshness = vec![
        tokio::spawn(fresh::probe(fresh.clone(), store.clone())),
        tokio::spawn(fresh::judge(fresh.clone(), plugins.listeners)),
    ];
    let state = Forwarder {
        http: forwarding_client(&cfg)?,
        leader,
        metrics: metrics.clone(),
        body_limit: cfg.body_limit,
        scheme: if cfg.leader_tls { "https" } else { "http" },
        cluster_id,
        parked: parked::ParkedPool::new(|| parked_client(&cfg))?,
        extensions: plugins.extensions.clone(),
        fresh: fresh.clone(),
    };
    let ctx = ApiContext {
        auth: Arc::new(keyring),
    };
    let app = router(
        state,
        Arc::new(registry),
        &plugins.extensions,
        ctx,
        cfg.body_limit,
        cfg.metrics,
    );
    let leader = follow_leader(leader_watch).await;
    let (shutdown, stop) = watch::channel(false);
    let served = xce_serve::serve(cfg.listen, app, cfg.connections, cfg.tls, stop);
    let (addr, server) = match served {
        Ok(s) => s,
        Err(e) => {
            // Not left running behind an apiserver that never served.
            follower.abort();
            leader.abort();
            freshness.iter().for_each(JoinHandle::abort);
            return Err(e);
        }
    };
    let (registration, lease) = register(&store, fresh, metrics, addr, cfg.max_lag).await;
    freshness.push(registration);
    Ok(RunningApiserver {
        addr,
        shutdown,
        server,
        follower,
        leader,
        freshness,
        registered: (store, lease),
        extensions: plugins.extensions,
    })
}

/// Registers this apiserver in the store (`register.rs`) and keeps the registration up to
/// date on a task of its own; returns the task and the first lease, if one was granted.
async fn register(
    store: &Arc<EtcdStore>,
    fresh: Arc<fresh::Freshness>,
    metrics: metrics::Metrics,
    addr: SocketAddr,
    max_lag: Duration,
) -> (JoinHandle<()>, Option<i64>) {
    let mut registrar = register::Registrar {
        store: store.clone(),
        fresh,
        metrics,
        me: xce_store::etcd::fleet::Registration {
            id: apiserver_id(addr),
            addr: addr.to_string(),
            version: xce_wire::version::build().version.to_string(),
            applied: 0,
            max_lag_ms: max_lag.as_millis() as u64,
        },
    };
    let lease = registrar.first().await;
    (tokio::spawn(registrar.run(lease)), lease)
}

/// Names this apiserver in the fleet: `<hostname>/<pid>@<addr>`.
fn apiserver_id(addr: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}/{}@{addr}", std::process::id())
}

/// The election's leader key under the store's prefix (`<prefix>.leader`), named by the
/// election itself: this apiserver never campaigns (the id and TTL are unused).
fn leader_key(cfg: &ApiserverConfig) -> anyhow::Result<String> {
    let election = Election::new(
        cfg.etcd.clone(),
        &cfg.prefix,
        "apiserver",
        Duration::from_secs(3),
    )
    .context("invalid etcd endpoints")?;
    Ok(election.key().to_owned())
}

/// The metrics of `/metrics`: this apiserver's own, the tokens', TLS handshakes' and the
/// extensions'.
fn registry(
    metrics: &metrics::Metrics,
    keyring: &Keyring,
    extensions: &[Arc<dyn ApiExtension>],
) -> Registry {
    let mut registry = Registry::default();
    metrics.register(&mut registry);
    keyring.register(&mut registry);
    xce_serve::register_metrics(&mut registry);
    xce_serve::version::register_build_info(&mut registry);
    for e in extensions {
        e.register_metrics(&mut registry);
    }
    registry
}

/// The client requests are forwarded to the leader with (over TLS, trusting `ca_file`,
/// when the controllers serve it).
fn forwarding_client(cfg: &ApiserverConfig) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .tls_backend_preconfigured(
            control_tls::client::client_config(cfg.ca_file.as_deref())
                .context("cannot set up TLS for forwarding to the leader")?,
        )
        .build()
        .context("building the HTTP client")
}

/// A client of the parked pool (`parked.rs`): HTTP/2 only (prior knowledge on `http://`,
/// ALPN `h2` on `https://`), so that all its requests share one leader connection.
fn parked_client(cfg: &ApiserverConfig) -> anyhow::Result<reqwest::Client> {
    let mut tls = control_tls::client::client_config(cfg.ca_file.as_deref())
        .context("cannot set up TLS for forwarding to the leader")?;
    tls.alpn_protocols = vec![b"h2".to_vec()];
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .http2_prior_knowledge()
        .tls_backend_preconfigured(tls)
        .build()
        .context("building the HTTP/2 client of parked requests")
}

/// Reads the leader key once, so the first request finds the leader known, then follows
/// it with a watch on a task of its own.
async fn follow_leader(watch: leader::LeaderWatch) -> JoinHandle<()> {
    let read = watch.read().await;
    if let Err(e) = &read {
        tracing::warn!(error = %e, "cannot read the leader key yet: forwarded requests answer 503 until it is read");
    }
    tokio::spawn(watch.run(read.ok()))
}

impl RunningApiserver {
    /// Stops serving and following the store: the listener closes, blocking queries
    /// answer at once with the current state, streams end, other requests in flight
    /// (forwarded ones) get up to `connections.drain_timeout` before their connections are
    /// dropped.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        for e in &self.extensions {
            e.drain();
        }
        let _ = self.server.await;
        self.follower.abort();
        self.leader.abort();
        self.freshness.iter().for_each(JoinHandle::abort);
        // Leaving the fleet at once: the controller stops waiting for this apiserver now
        // rather than when the lease runs out. The registration task may have renewed
        // another lease meanwhile; that one runs out by itself.
        if let (store, Some(lease)) = &self.registered {
            let _ = store.fleet_leave(*lease).await;
        }
    }
}

/// The routes: health, metrics, the extensions, and everything else forwarded.
fn router(
    fwd: Forwarder,
    registry: Arc<Registry>,
    extensions: &[Arc<dyn ApiExtension>],
    ctx: ApiContext,
    limit: usize,
    access: MetricsConfig,
) -> Router {
    // Its labels name every tenant's projects and services: `metrics.view` (or `admin`)
    // unless `[metrics] public = true`.
    let metrics = move |who: Result<Principal, ApiError>| async move {
        match access.admit(who) {
            Ok(()) => metrics_response(&registry),
            Err(e) => e.into_response(),
        }
    };
    let mut app = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(forward)
        .with_state(fwd);
    for ext in extensions {
        // Audited here: what this apiserver answers itself. What it forwards is audited by
        // the leader, which answers it.
        let audited = axum::middleware::from_fn_with_state(ctx.clone(), xce_serve::audit::layer);
        app = app.merge(ext.router(ctx.clone()).layer(audited));
    }
    app.layer(axum::middleware::map_response(
        move |r: Response| async move { json_errors(r, limit) },
    ))
    .layer(DefaultBodyLimit::max(limit))
    .layer(Extension(ctx))
}

/// `/healthz`: 200 (`ok`, then `cluster: <id>`, `version:` and `commit:`) while this
/// apiserver serves its copy, 503 `stale` while it fails closed (`fresh.rs`: behind the
/// store by more than `max_lag`, or nothing heard from etcd for that long, or a record it
/// does not understand), so that a load balancer sends readers elsewhere meanwhile. A
/// watch being re-established, or a quorum loss (no member has a leader, so nothing can
/// be written that it could miss), is no reason to pull it: it answers correctly then.
async fn healthz(State(fwd): State<Forwarder>) -> Response {
    if let Some(why) = fwd.fresh.stale() {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stale", why).into_response();
    }
    // Like the controller's: `ok`, then the cluster it serves.
    match &fwd.cluster_id {
        Some(id) => (
            [(xce_proto::worker::CLUSTER_HEADER, id.to_string())],
            format!("ok\ncluster: {id}\n{}", xce_serve::version::health_lines()),
        )
            .into_response(),
        None => format!("ok\n{}", xce_serve::version::health_lines()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use axum::http::HeaderMap;
    use axum::routing::post;
    use xce_serve::auth::Tokens;
    use xce_store::testing::TestEtcd;

    /// A stand-in for a controller: answers every forwarded route with what it got, and
    /// says who it is.
    async fn fake_controller(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let app = Router::new().route(
            "/v1/services",
            post(move |headers: HeaderMap, body: Bytes| async move {
                let header = |n: &str| {
                    headers
                        .get(n)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned()
                };
                let (auth, instance) = (header("authorization"), header("x-xce-worker-instance"));
                (
                    StatusCode::CREATED,
                    [
                        // The revision an empty store is at: a change's answer is relayed
                        // once the follower has applied its index (read your writes).
                        ("x-xce-index", "0"),
                        ("x-xce-cluster", "c-1"),
                        ("content-type", "application/json"),
                    ],
                    format!(
                        r#"{{"by":"{name}","auth":"{auth}","instance":"{instance}","body":{:?}}}"#,
                        String::from_utf8_lossy(&body)
                    ),
                )
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(l, app).await.unwrap();
        });
        (addr, task)
    }

    /// Puts the leader key as a controller `HOST/PID@ADDR` would, and waits (bounded)
    /// until the apiserver at `base` has learned it from its leader watch: the watch
    /// delivers the change a moment after etcd answers the put.
    async fn set_leader(etcd: &TestEtcd, base: &str, id: &str) {
        let changes = |line: String| -> u64 { line.rsplit(' ').next().unwrap().parse().unwrap() };
        let before = changes(metric(base, "xce_apiserver_leader_changes_total").await);
        let b64 = |s: &str| xce_store::etcd::gateway::b64(s.as_bytes());
        let r = reqwest::Client::new()
            .post(format!("http://{}/v3/kv/put", etcd.endpoint))
            .body(format!(
                r#"{{"key":"{}","value":"{}"}}"#,
                b64("/xce/.leader"),
                b64(id)
            ))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        let deadline = std::time::Instant::now() + testkit::patience();
        while std::time::Instant::now() < deadline {
            if changes(metric(base, "xce_apiserver_leader_changes_total").await) > before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the apiserver at {base} never learned that {id} leads");
    }

    /// An apiserver without plugins on `etcd`, on a free port, with a 64-byte body limit.
    async fn start_on(etcd: &TestEtcd, tokens: Tokens) -> RunningApiserver {
        let cfg = ApiserverConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            body_limit: 64,
            etcd: vec![etcd.endpoint.clone()],
            prefix: "/xce/".into(),
            connections: Default::default(),
            tls: None,
            ca_file: None,
            leader_tls: false,
            // These tests read /metrics without a token; the gate is the e2e tests'.
            metrics: xce_serve::auth::MetricsConfig { public: true },
            max_lag: DEFAULT_MAX_LAG,
        };
        let plugins = ApiserverPlugins {
            listeners: vec![],
            extensions: vec![],
        };
        start(cfg, tokens, plugins).await.unwrap()
    }

    /// Polls `url` until it answers `status` (bounded).
    async fn until_status(url: &str, status: u16) {
        let deadline = std::time::Instant::now() + testkit::patience();
        while std::time::Instant::now() < deadline {
            if let Ok(r) = reqwest::get(url).await {
                if r.status() == status {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{url} never answered {status}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn healthz_says_whether_it_hears_from_etcd() {
        let etcd = TestEtcd::start();
        // The id a controller creates with the store.
        use xce_store::Store as _;
        etcd.store("/xce/")
            .put_if_absent(
                xce_model::cluster_id_key(),
                b"\"0123456789abcdef\"".to_vec(),
            )
            .unwrap();
        let running = start_on(&etcd, Tokens::parse("").unwrap()).await;
        let url = format!("http://{}/healthz", running.addr);
        until_status(&url, 200).await;
        let r = reqwest::get(&url).await.unwrap();
        assert_eq!(r.headers()["x-xce-cluster"], "0123456789abcdef");
        assert_eq!(
            r.text().await.unwrap(),
            format!(
                "ok\ncluster: 0123456789abcdef\n{}",
                xce_serve::version::health_lines()
            )
        );
        // Cut off from every member: after max_lag of silence it fails closed.
        drop(etcd);
        until_status(&url, 503).await;
        let text = reqwest::get(&url).await.unwrap().text().await.unwrap();
        assert!(
            text.contains(r#""code":"stale""#) && text.contains("heard nothing from etcd"),
            "{text}"
        );
        running.shutdown().await;
    }

    /// The secret of the admin token of [`admin_tokens`].
    const ADMIN: &str = "s3cret-admin-example";

    /// A tokens file with one admin token, [`ADMIN`].
    fn admin_tokens() -> Tokens {
        Tokens::parse(&format!(
            "[[token]]\nsecret = \"{ADMIN}\"\nprincipal = \"admin\"\ngrants = [ {{ permission = \"admin\", projects = [\"*\"] }} ]\n",
        ))
        .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forwards_to_the_leader_and_follows_it_when_it_moves() {
        let etcd = TestEtcd::start();
        let running = start_on(&etcd, admin_tokens()).await;
        let base = format!("http://{}", running.addr);
        let http = reqwest::Client::new();
        // The identity headers of the worker protocol pass both ways too.
        let submit = |body: &'static str| {
            http.post(format!("{base}/v1/services"))
                .bearer_auth("s3cret-admin-example")
                .header("x-xce-worker-instance", "i-1")
                .body(body)
                .send()
        };

        // Nobody leads yet.
        let r = submit("{}").await.unwrap();
        assert_eq!(r.status(), 503);
        let text = r.text().await.unwrap();
        assert!(text.contains(r#""code":"no_leader""#), "{text}");

        // A leader: the request goes there as it is, and its answer comes back as it is.
        let (a, a_task) = fake_controller("a").await;
        set_leader(&etcd, &base, &format!("node-a/1@{a}")).await;
        let r = submit("one").await.unwrap();
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["x-xce-index"], "0");
        assert_eq!(r.headers()["x-xce-cluster"], "c-1");
        assert_eq!(
            r.text().await.unwrap(),
            r#"{"by":"a","auth":"Bearer s3cret-admin-example","instance":"i-1","body":"one"}"#
        );

        // The leader dies and another takes over: the next request finds the new one.
        a_task.abort();
        let _ = a_task.await;
        let (b, _b_task) = fake_controller("b").await;
        set_leader(&etcd, &base, &format!("node-b/2@{b}")).await;
        let r = submit("two").await.unwrap();
        assert_eq!(r.status(), 201);
        assert!(r.text().await.unwrap().starts_with(r#"{"by":"b""#));

        // The body limit holds for forwarded requests too.
        let r = http
            .post(format!("{base}/v1/services"))
            .bearer_auth(ADMIN)
            .body(vec![b'x'; 65])
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 413);
        let text = r.text().await.unwrap();
        assert!(
            text.contains(r#""code":"too_large""#) && text.contains("64 bytes"),
            "{text}"
        );
        running.shutdown().await;
    }

    /// A standby on the address etcd still names (a restarted process on the dead
    /// leader's port, before the old lease ran out) answers 503 `standby`: the apiserver
    /// does not relay that as the answer, it looks the leader up again until one answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_standby_on_the_leaders_address_is_not_taken_for_the_leader() {
        use super::forward::STANDBY_HEADER;
        let etcd = TestEtcd::start();
        let running = start_on(&etcd, admin_tokens()).await;
        let base = format!("http://{}", running.addr);
        let hit = Arc::new(tokio::sync::Notify::new());
        let standby = axum::Router::new().fallback({
            let hit = hit.clone();
            move || async move {
                hit.notify_one();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(STANDBY_HEADER, "1")],
                    r#"{"error":{"code":"standby","message":"a standby","details":[]}}"#,
                )
            }
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, standby).await.unwrap() });
        set_leader(&etcd, &base, &format!("node-s/1@{s}")).await;
        // The request waits; meanwhile the real leader is elected.
        let (a, _a_task) = fake_controller("a").await;
        let req = tokio::spawn({
            let url = format!("{base}/v1/services");
            async move {
                reqwest::Client::new()
                    .post(url)
                    .bearer_auth(ADMIN)
                    .header("x-xce-worker-instance", "i-1")
                    .body("{}")
                    .send()
                    .await
                    .unwrap()
            }
        });
        // The standby got the request; now the real leader is elected.
        hit.notified().await;
        set_leader(&etcd, &base, &format!("node-a/2@{a}")).await;
        let r = req.await.unwrap();
        assert_eq!(r.status(), 201);
        assert!(r.text().await.unwrap().starts_with(r#"{"by":"a""#));
        running.shutdown().await;
    }

    /// An elected controller answers from its standby listener until it has stopped it
    /// and bound the API (the key already names it): a request that hits it then is
    /// tried again, and gets the controller's answer once it serves, however long the
    /// request's deadline. (The apiserver used to wait for the key to name another
    /// leader, which never came: a blocking query got a 503 after its whole wait plus
    /// ten seconds, and the e2e rollout-faults observer missed a whole rollout.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_elected_controller_still_on_its_standby_listener_is_tried_again() {
        use super::forward::STANDBY_HEADER;
        use std::sync::atomic::{AtomicBool, Ordering};
        let etcd = TestEtcd::start();
        let running = start_on(&etcd, admin_tokens()).await;
        let base = format!("http://{}", running.addr);
        let hit = Arc::new(tokio::sync::Notify::new());
        let serving = Arc::new(AtomicBool::new(false));
        let me = axum::Router::new().fallback({
            let (hit, serving) = (hit.clone(), serving.clone());
            move || async move {
                if serving.load(Ordering::SeqCst) {
                    return (StatusCode::CREATED, "served").into_response();
                }
                hit.notify_one();
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [(STANDBY_HEADER, "1")],
                    r#"{"error":{"code":"standby","message":"a standby","details":[]}}"#,
                )
                    .into_response()
            }
        });
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, me).await.unwrap() });
        set_leader(&etcd, &base, &format!("node-s/1@{s}")).await;
        let req = tokio::spawn({
            let url = format!("{base}/v1/services");
            async move {
                let r = reqwest::Client::new()
                    .post(url)
                    .bearer_auth(ADMIN)
                    .body("{}")
                    .send()
                    .await
                    .unwrap();
                (r.status(), r.text().await.unwrap())
            }
        });
        hit.notified().await;
        // It serves now, on the same address, and the key does not change.
        serving.store(true, Ordering::SeqCst);
        let (status, text) = tokio::time::timeout(testkit::patience(), req)
            .await
            .expect("the request is answered once the elected controller serves")
            .unwrap();
        assert_eq!((status.as_u16(), text.as_str()), (201, "served"));
        running.shutdown().await;
    }

    /// Asserts a 503 `no_leader` with `Retry-After`; returns its message.
    async fn assert_no_leader(r: reqwest::Response) -> String {
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["retry-after"], "1");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_leader", "{v}");
        v["error"]["message"].as_str().unwrap().to_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_or_frozen_leader_is_a_503_no_leader_with_retry_after_never_a_502() {
        let etcd = TestEtcd::start();
        let running = start_on(&etcd, admin_tokens()).await;
        let base = format!("http://{}", running.addr);
        let http = reqwest::Client::new();
        let mut log = Vec::new();

        // Killed: its key lives on until its lease runs out, nothing listens.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        set_leader(&etcd, &base, &format!("node-a/1@{dead_addr}")).await;
        let r = http
            .get(format!("{base}/v1/hosts"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        let msg = assert_no_leader(r).await;
        log.push(format!(
            "killed: {}",
            msg.replace(&dead_addr.to_string(), "ADDR")
        ));

        // Frozen (SIGSTOP): takes the connection, never answers; then another leads.
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let frozen_addr = frozen.local_addr().unwrap();
        set_leader(&etcd, &base, &format!("node-a/1@{frozen_addr}")).await;
        let waiting = tokio::spawn({
            let (http, base) = (http.clone(), base.clone());
            async move {
                let t = std::time::Instant::now();
                let r = http
                    .post(format!("{base}/v1/services"))
                    .bearer_auth(ADMIN)
                    .body("x")
                    .send()
                    .await;
                (r, t.elapsed())
            }
        });
        // The request has reached the frozen leader: its connection is there and the
        // request's head read off it (kept open, never answered, as a stopped process's).
        frozen.set_nonblocking(true).unwrap();
        let frozen = tokio::net::TcpListener::from_std(frozen).unwrap();
        let (mut held, _) = tokio::time::timeout(testkit::patience(), frozen.accept())
            .await
            .expect("the request is forwarded to the frozen leader")
            .unwrap();
        let mut head = Vec::new();
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let mut buf = [0u8; 1024];
            let n = tokio::io::AsyncReadExt::read(&mut held, &mut buf)
                .await
                .unwrap();
            assert!(n > 0, "the forwarded request's head");
            head.extend_from_slice(&buf[..n]);
        }
        let (b, _b_task) = fake_controller("b").await;
        set_leader(&etcd, &base, &format!("node-b/2@{b}")).await;
        // The answer's text says which path ended the wait: "no longer leads" is the
        // leader change (Silent::Replaced), never the forwarder's own answer timeout, so
        // no wall-clock bound is asserted here beyond the test's patience.
        let (r, _took) = tokio::time::timeout(testkit::patience(), waiting)
            .await
            .expect("a frozen leader must not hold the request")
            .unwrap();
        let msg = assert_no_leader(r.unwrap()).await;
        log.push(format!(
            "frozen, then replaced: {}",
            msg.replace(&frozen_addr.to_string(), "ADDR"),
        ));
        // The next request goes to the new leader.
        let r = http
            .post(format!("{base}/v1/services"))
            .bearer_auth(ADMIN)
            .body("y")
            .send()
            .await
            .unwrap();
        log.push(format!("then: {}", r.status()));
        drop((held, frozen));
        // The waiting request learned of the takeover from the leader watch: the key was
        // read once, at start, however long the request waited.
        log.push(metric(&base, "xce_apiserver_leader_reads_total").await);
        expect_test::expect![[r#"
            killed: the leader controller at http://ADDR cannot be reached (Connection refused (os error 111)); a takeover may be under way
            frozen, then replaced: the leader controller at http://ADDR stopped answering and no longer leads (the change may or may not have been applied: check before repeating it)
            then: 201 Created
            xce_apiserver_leader_reads_total 1"#]]
        .assert_eq(&log.join("\n"));
        running.shutdown().await;
    }

    /// A request without a valid token is refused before its body is read: one that
    /// announces a body and never sends it gets its 401 at once (it used to be read first,
    /// and the connection was held for as long as the client liked), and nothing reaches
    /// the leader.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_is_authenticated_before_its_body_is_read() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let etcd = TestEtcd::start();
        let running = start_on(&etcd, admin_tokens()).await;
        let base = format!("http://{}", running.addr);
        let (a, _a_task) = fake_controller("a").await;
        set_leader(&etcd, &base, &format!("node-a/1@{a}")).await;
        let mut log = Vec::new();
        for auth in ["", "authorization: Bearer not-a-valid-token-at-all\r\n"] {
            let mut s = tokio::net::TcpStream::connect(running.addr).await.unwrap();
            let head = format!(
                "POST /v1/services HTTP/1.1\r\nhost: x\r\n{auth}content-length: 100000\r\n\r\n"
            );
            s.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let read = tokio::time::timeout(testkit::patience(), async {
                let mut buf = [0u8; 4096];
                while !String::from_utf8_lossy(&answer).contains("\"code\"") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            assert!(read.is_ok(), "no answer without the body");
            let text = String::from_utf8_lossy(&answer).into_owned();
            let status = text.lines().next().unwrap_or("").to_owned();
            let code = text
                .split("\"code\":")
                .nth(1)
                .and_then(|c| c.split('"').nth(1));
            log.push(format!("{status} {}", code.unwrap_or("-")));
        }
        expect_test::expect![[r#"
            HTTP/1.1 401 Unauthorized unauthenticated
            HTTP/1.1 401 Unauthorized unauthenticated"#]]
        .assert_eq(&log.join("\n"));
        running.shutdown().await;
    }

    /// The line of `/metrics` that starts with `name`.
    async fn metric(base: &str, name: &str) -> String {
        let text = reqwest::get(format!("{base}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .to_owned()
    }

    #[test]
    fn leader_ids_become_urls() {
        assert_eq!(
            forward::leader_url("http", "node-1/42@127.0.0.1:7480").as_deref(),
            Some("http://127.0.0.1:7480")
        );
        assert_eq!(
            forward::leader_url("http", "node-1/42@[::1]:7480").as_deref(),
            Some("http://[::1]:7480")
        );
        assert_eq!(
            forward::leader_url("http", "node-1/42@0.0.0.0:7480").as_deref(),
            Some("http://node-1:7480")
        );
        assert_eq!(
            forward::leader_url("https", "node-1/42@127.0.0.1:7480").as_deref(),
            Some("https://127.0.0.1:7480")
        );
        assert_eq!(forward::leader_url("http", "garbage"), None);
        assert_eq!(forward::leader_url("http", "h/1@not-an-addr"), None);
    }
}
