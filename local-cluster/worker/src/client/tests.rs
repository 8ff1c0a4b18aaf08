use super::*;

/// What the tests' heartbeats assert: no facts, nothing running.
fn beat() -> Heartbeat {
    Heartbeat::of(&HostFacts::default(), [])
}

fn id() -> Arc<Identity> {
    Arc::new(Identity::for_test("i-1", None))
}

fn check(base: &str, expect: expect_test::Expect) {
    let out = match Client::new(base, "exec-01", "s3cret", id()) {
        Ok(c) => (0..c.host_bases.len())
            .map(|i| format!("{} {}", c.url_at(i, "register"), c.url_at(i, "assignments")))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => e.to_string(),
    };
    assert!(!format!("{:?}", Client::new(base, "exec-01", "s3cret", id())).contains("s3cret"));
    expect.assert_eq(&out);
}

#[test]
fn builds_host_urls() {
    check(
        "http://127.0.0.1:7480",
        expect_test::expect!["http://127.0.0.1:7480/internal/v1/hosts/exec-01/register http://127.0.0.1:7480/internal/v1/hosts/exec-01/assignments"],
    );
    check(
        "http://ctl.example:80/xce/",
        expect_test::expect!["http://ctl.example/xce/internal/v1/hosts/exec-01/register http://ctl.example/xce/internal/v1/hosts/exec-01/assignments"],
    );
    check(
        "127.0.0.1:7480",
        expect_test::expect![[r#"controller url "127.0.0.1:7480": relative URL without a base"#]],
    );
    check(
        "http://127.0.0.1:7480, http://127.0.0.1:7481/",
        expect_test::expect![[r#"
            http://127.0.0.1:7480/internal/v1/hosts/exec-01/register http://127.0.0.1:7480/internal/v1/hosts/exec-01/assignments
            http://127.0.0.1:7481/internal/v1/hosts/exec-01/register http://127.0.0.1:7481/internal/v1/hosts/exec-01/assignments"#]],
    );
    check(
        "http://127.0.0.1:7480,,http://127.0.0.1:7481",
        expect_test::expect![[
            r#"controller url "http://127.0.0.1:7480,,http://127.0.0.1:7481": a url in the list is empty"#
        ]],
    );
    check(
        "http://127.0.0.1:7480,ftp://x",
        expect_test::expect![[r#"controller url "ftp://x": must be an http:// or https:// url"#]],
    );
    check(
        "https://10.0.0.1:7480",
        expect_test::expect![[r#"
            https://10.0.0.1:7480/internal/v1/hosts/exec-01/register https://10.0.0.1:7480/internal/v1/hosts/exec-01/assignments"#]],
    );
}

/// A controller that answers heartbeats and counts them.
async fn answering() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let app = axum::Router::new().route(
        "/internal/v1/hosts/{host}/heartbeat",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            async { StatusCode::NO_CONTENT }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), hits)
}

/// A base URL nothing listens on (a standby, or a dead controller).
fn refusing() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}", l.local_addr().unwrap())
}

#[tokio::test]
async fn moves_on_to_the_controller_that_answers_and_stays_there() {
    let (live, hits) = answering().await;
    let dead = refusing();
    let mut log = Vec::new();
    let one = Client::new(&dead, "exec-01", "s", id()).unwrap();
    log.push(format!(
        "dead alone: {}",
        one.heartbeat(CALL_TIMEOUT, &beat()).await.is_ok()
    ));
    let c = Client::new(&format!("{dead},{live}"), "exec-01", "s", id()).unwrap();
    for _ in 0..2 {
        c.heartbeat(CALL_TIMEOUT, &beat()).await.unwrap();
        log.push(format!(
            "dead,live: current {} hits {}",
            c.current.load(Ordering::Relaxed),
            hits.load(Ordering::Relaxed)
        ));
    }
    // The answering one first: the refusing one is not tried while it answers.
    let c = Client::new(&format!("{live},{dead}"), "exec-01", "s", id()).unwrap();
    c.heartbeat(CALL_TIMEOUT, &beat()).await.unwrap();
    log.push(format!(
        "live,dead: current {} hits {}",
        c.current.load(Ordering::Relaxed),
        hits.load(Ordering::Relaxed)
    ));
    expect_test::expect![[r#"
        dead alone: false
        dead,live: current 1 hits 1
        dead,live: current 1 hits 2
        live,dead: current 0 hits 3"#]]
    .assert_eq(&log.join("\n"));
}

/// A controller that accepts connections and never answers (SIGSTOPped: the kernel
/// still completes the handshake). Keep the listener alive.
fn frozen() -> (String, std::net::TcpListener) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (format!("http://{}", l.local_addr().unwrap()), l)
}

/// A controller answering heartbeats and (at once) assignment queries.
async fn leader() -> String {
    let app = axum::Router::new()
        .route(
            "/internal/v1/hosts/{host}/heartbeat",
            axum::routing::post(|| async { StatusCode::NO_CONTENT }),
        )
        .route(
            "/internal/v1/hosts/{host}/assignments",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({"index": 7, "jobs": []}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test]
async fn a_silent_controller_is_left_like_a_refusing_one() {
    let (stopped, _held) = frozen();
    let live = leader().await;
    let c = Client::new(&format!("{stopped},{live}"), "exec-01", "s", id()).unwrap();
    let timeout = Duration::from_millis(300);
    let mut log = Vec::new();
    // The long-poll parked on the frozen controller...
    let parked = tokio::spawn({
        let c = c.clone();
        async move {
            let t = std::time::Instant::now();
            (c.assignments(0).await.map(|a| a.index).ok(), t.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // ...the heartbeat times out there and moves on...
    let t = std::time::Instant::now();
    c.heartbeat(timeout, &beat()).await.unwrap();
    let first = t.elapsed();
    log.push(format!(
        "first beat ok, waited the timeout: {}, current {}",
        first >= timeout && first < timeout * 3,
        c.current.load(Ordering::Relaxed)
    ));
    // ...and the parked query follows it instead of waiting out its 40 s.
    let (index, took) = parked.await.unwrap();
    log.push(format!(
        "parked query answered by the live one: {index:?} within 2s: {}",
        took < Duration::from_secs(2)
    ));
    // Later calls start at the live one: no timeout again.
    let t = std::time::Instant::now();
    c.heartbeat(timeout, &beat()).await.unwrap();
    log.push(format!("second beat fast: {}", t.elapsed() < timeout));
    expect_test::expect![[r#"
        first beat ok, waited the timeout: true, current 1
        parked query answered by the live one: Some(7) within 2s: true
        second beat fast: true"#]]
    .assert_eq(&log.join("\n"));
}

#[tokio::test]
async fn after_a_timeout_calls_start_past_the_silent_controller() {
    let (stopped, _held) = frozen();
    let dead = refusing();
    let c = Client::new(&format!("{stopped},{dead}"), "exec-01", "s", id()).unwrap();
    let timeout = Duration::from_millis(200);
    let mut answers = c.answers();
    answers.borrow_and_update();
    assert!(c.heartbeat(timeout, &beat()).await.is_err());
    // The refusing one is tried first now (cheap); the silent one last.
    assert_eq!(c.current.load(Ordering::Relaxed), 1);
    assert!(c.heartbeat(timeout, &beat()).await.is_err());
    assert_eq!(c.current.load(Ordering::Relaxed), 1);
    assert!(!answers.has_changed().unwrap(), "no answer, no wake-up");
}

/// A controller of cluster `cluster` answering assignment queries with one job; it
/// records the identity headers it was sent.
async fn of_cluster(cluster: &'static str) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = axum::Router::new()
        .route(
            "/internal/v1/hosts/{host}/heartbeat",
            axum::routing::post(move || async move {
                ([(CLUSTER_HEADER, cluster)], StatusCode::NO_CONTENT)
            }),
        )
        .route(
            "/internal/v1/hosts/{host}/assignments",
            axum::routing::get(move |h: axum::http::HeaderMap| {
                let header = |n: &str| {
                    h.get(n)
                        .map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned())
                };
                log.lock().unwrap().push(format!(
                    "instance={} cluster={}",
                    header(INSTANCE_HEADER),
                    header(CLUSTER_HEADER)
                ));
                async move {
                    (
                        [(CLUSTER_HEADER, cluster)],
                        axum::Json(serde_json::json!({"index": 3, "jobs": []})),
                    )
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), seen)
}

#[tokio::test]
async fn answers_of_another_cluster_are_refused() {
    let (b, seen) = of_cluster("cluster-b").await;
    let mut log = Vec::new();
    for (ours, what) in [
        (None, "no cluster joined yet"),
        (Some("cluster-b"), "joined b"),
        (Some("cluster-a"), "joined a"),
    ] {
        let c = Client::new(
            &b,
            "exec-01",
            "s",
            Arc::new(Identity::for_test("i-1", ours)),
        )
        .unwrap();
        let got = match c.assignments(0).await {
            Ok(a) => format!("index {}", a.index),
            Err(e) => e.to_string().replace(&b, "B"),
        };
        log.push(format!("{what}: {got}"));
    }
    log.extend(seen.lock().unwrap().iter().cloned());
    expect_test::expect![[r#"
        no cluster joined yet: index 3
        joined b: index 3
        joined a: controller B serves cluster cluster-b, but this worker belongs to cluster cluster-a; it takes no orders from it (pointed at the wrong controller?)
        instance=i-1 cluster=-
        instance=i-1 cluster=cluster-b
        instance=i-1 cluster=cluster-a"#]]
    .assert_eq(&log.join("\n"));
}

#[tokio::test]
async fn a_worker_without_a_cluster_joins_the_one_its_heartbeats_name() {
    let (b, _) = of_cluster("cluster-b").await;
    let dir = tempfile::tempdir().unwrap();
    let id = Arc::new(Identity::load(dir.path()).unwrap());
    let c = Client::new(&b, "exec-01", "s", id.clone()).unwrap();
    c.heartbeat(CALL_TIMEOUT, &beat()).await.unwrap();
    assert_eq!(id.cluster().as_deref(), Some("cluster-b"));
    let again = Identity::load(dir.path()).unwrap();
    assert_eq!(
        again.cluster().as_deref(),
        Some("cluster-b"),
        "remembered on disk"
    );
}

#[test]
fn heartbeat_deadlines_follow_the_period() {
    let t = |ms| heartbeat_timeout(Duration::from_millis(ms)).as_millis();
    assert_eq!(
        (t(100), t(1000), t(3000), t(30_000)),
        (1000, 2000, 6000, 10_000)
    );
}
