//! Our side: the `--serve` child process and its handle.

use super::*;
use common_serve::http_serve;

// === our server (`--serve`) ===

/// Authentication and authorization as cheap as the routes allow: no token lookup, and a
/// principal whose first grant matches every project. Isolates the RBAC cost of a read.
pub(crate) struct Cheapest(Principal);

impl Authenticator for Cheapest {
    fn authenticate(&self, _token: Option<&str>) -> Result<Principal, AuthError> {
        Ok(self.0.clone())
    }
}

/// The services of the `--serve` process: `svc-0` (3 replicas, the one the fan-out
/// flips), `svc-3` and `svc-100`, on 100 hosts.
pub(crate) fn serve_snapshot() -> ClusterSnapshot {
    snapshot(
        &[
            ("svc-0".into(), 3),
            ("svc-3".into(), 3),
            ("svc-100".into(), 100),
        ],
        100,
    )
}

/// Server CPU to build and serialize the JSON answer of `service` (µs), alone.
pub(crate) fn render_us(service: &str) -> f64 {
    let mut table = Table::new();
    table.resync(&serve_snapshot());
    let entry = table
        .entry(&plugin_api::ServiceKey::new("default", service))
        .unwrap();
    let n = 2_000;
    let t = Instant::now();
    for _ in 0..n {
        let answer = endpoint_table::wire::answer(black_box(entry), None, false);
        black_box(serde_json::to_vec(&answer).unwrap());
    }
    t.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

/// The two ways of authenticating of the `--serve` process: bearer tokens through
/// `ApiContext::for_test` (an admin and a job.view principal), and [`Cheapest`].
pub(crate) fn contexts() -> (ApiContext, ApiContext) {
    let admin = Principal {
        credential: Default::default(),
        name: "alice".into(),
        kind: PrincipalKind::User,
        grants: vec![(Permission::Admin, vec!["*".into()])],
    };
    let viewer = Principal {
        credential: Default::default(),
        name: "ci-dashboard".into(),
        kind: PrincipalKind::User,
        grants: vec![
            (Permission::JobSubmit, vec!["staging".into()]),
            (
                Permission::JobView,
                vec!["staging".into(), "default".into()],
            ),
        ],
    };
    let tokens = ApiContext::for_test(vec![
        (ADMIN_TOKEN.into(), admin),
        (VIEW_TOKEN.into(), viewer),
    ]);
    let cheapest = ApiContext {
        auth: Arc::new(Cheapest(Principal {
            credential: Default::default(),
            name: String::new(),
            kind: PrincipalKind::User,
            grants: vec![(Permission::JobView, vec!["*".into()])],
        })),
    };
    (tokens, cheapest)
}

/// CPU time (ns) of what RBAC adds to one read, alone: the `Principal` extractor the
/// routes use (bearer header -> authenticator -> principal, dropped at the end) and the
/// one `may` check of the service's project.
pub(crate) async fn rbac_ns(cx: &ApiContext, token: &str) -> f64 {
    use axum::extract::FromRequestParts;
    let (mut parts, ()) = axum::http::Request::builder()
        .uri("/v1/services/svc-3/endpoints")
        .header("authorization", format!("Bearer {token}"))
        .extension(cx.clone())
        .body(())
        .unwrap()
        .into_parts();
    let n = 200_000;
    let t = Instant::now();
    for _ in 0..n {
        let principal = Principal::from_request_parts(&mut parts, &())
            .await
            .unwrap();
        assert!(black_box(&principal).may(Permission::JobView, "default"));
    }
    t.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The `--serve` process: the endpoint table with services `svc-0` (3 replicas, the one
/// the fan-out flips), `svc-3` and `svc-100`, served on two loopback ports (HTTP/1.1 and h2c, see [`http_serve`]): the
/// first with a bearer token authenticator (`ApiContext::for_test`) and the bench's
/// control routes, the second with [`Cheapest`]. Prints `ready <first> <second>`, exits
/// when stdin closes.
pub(crate) fn serve() {
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
        let mut registry = prometheus_client::registry::Registry::default();
        api.register_metrics(&mut registry);
        let (tokens, cheapest) = contexts();
        let snap = serve_snapshot();
        feed.resync(&snap);
        let routes = api.router(tokens);
        let cheap_routes = api.router(cheapest);
        api.flushed().await;

        // Control routes: flip svc-0's first replica, and the watcher gauge.
        let flipped = Arc::new(Mutex::new((feed, snap.jobs[0].clone(), BASE)));
        let registry = Arc::new(registry);
        let control = axum::Router::new()
            .route(
                "/bench/flip",
                axum::routing::post(move || {
                    let flipped = flipped.clone();
                    async move {
                        let mut f = flipped.lock().unwrap();
                        let (feed, job, rev) = &mut *f;
                        *rev += 1;
                        job.ready = !job.ready;
                        feed.on_event(&ClusterEvent::Job {
                            rev: *rev,
                            job: job.clone(),
                        });
                        rev.to_string()
                    }
                }),
            )
            .route(
                "/bench/watchers",
                axum::routing::get(move || {
                    let registry = registry.clone();
                    async move {
                        let mut text = String::new();
                        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
                        // Every kind of watcher (`{kind="..."}`), summed.
                        text.lines()
                            .filter(|l| l.starts_with("xce_endpoint_watchers{"))
                            .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
                            .sum::<i64>()
                            .to_string()
                    }
                }),
            );
        let main = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let cheap = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!(
            "ready {} {}",
            main.local_addr().unwrap(),
            cheap.local_addr().unwrap()
        );
        std::io::stdout().flush().unwrap();
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        let cheap = tokio::spawn(http_serve(cheap, cheap_routes));
        http_serve(main, routes.merge(control)).await;
        cheap.await.unwrap();
    });
}

/// A `--serve` child of this bench.
pub(crate) struct Server {
    pub(crate) child: Child,
    /// Bearer tokens + control routes.
    pub(crate) addr: SocketAddr,
    /// [`Cheapest`] authorization.
    pub(crate) cheap: SocketAddr,
}

impl Server {
    pub(crate) fn start() -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("--serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        CHILDREN.lock().unwrap().push(child.id());
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("ready"), "--serve said {line:?}");
        let addr = words.next().unwrap().parse().unwrap();
        let cheap = words.next().unwrap().parse().unwrap();
        Self { child, addr, cheap }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the server counts exactly `n` watchers.
    pub(crate) async fn watchers(&self, n: usize) {
        let mut conn = Conn::connect(self.addr).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (head, body) = conn
                .request(b"GET /bench/watchers HTTP/1.1\r\nhost: b\r\n\r\n")
                .await
                .unwrap();
            assert_eq!(head.status, 200);
            if String::from_utf8_lossy(&body).trim() == n.to_string() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "server never counted {n} watchers"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
        forget_child(self.child.id());
    }
}
