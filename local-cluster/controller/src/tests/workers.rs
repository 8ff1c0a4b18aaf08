//! The worker routes: facts refused, blocking assignment queries (answered, ended by a
//! revoked credential or a shutdown), and one real socket with a fake worker over HTTP.

use super::*;

#[tokio::test]
async fn a_worker_cannot_advertise_another_live_hosts_address() {
    let app = app().await;
    app.register("exec-01", W1, 2).await;
    app.register("exec-02", W2, 2).await;
    // exec-01's credential reports exec-02's address.
    let stolen = serde_json::to_value(facts_at("127.0.0.12", 2)).unwrap();
    let (s, v) = app
        .json("PUT", "/internal/v1/hosts/exec-01/facts", W1, Some(stolen))
        .await;
    let (_, hosts) = app.get("/v1/hosts", ADMIN).await;
    let ips: Vec<&Value> = hosts["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| &h["ip_addr"])
        .collect();
    expect![[r#"
        409 {"code":"address_in_use","details":[{"field":"ip_addr","reason":"address 127.0.0.12 is advertised by live host exec-02"}],"message":"host facts refused"}
        [String("127.0.0.11"), String("127.0.0.12")]"#]]
    .assert_eq(&format!("{} {}\n{ips:?}", s.as_u16(), v["error"]));
    // A registration with it is refused the same way.
    let req = RegisterRequest {
        facts: facts_at("127.0.0.11", 2),
        running: vec![],
        wants_session: false,
    };
    let (s, _) = app
        .json(
            "POST",
            "/internal/v1/hosts/exec-02/register",
            W2,
            Some(serde_json::to_value(req).unwrap()),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn worker_routes_refuse_bad_facts_and_blocking_queries_end() {
    let app = app().await;
    // Registration with facts the policy refuses: 400 with every problem, nothing kept.
    let bad = json!({"facts": {"ip_addr": "0.0.0.0"}, "running": []});
    let (s, b) = app
        .json("POST", "/internal/v1/hosts/exec-01/register", W1, Some(bad))
        .await;
    expect![[r#"400 {"error":{"code":"invalid","details":[{"field":"ip_addr","reason":"must not be unspecified"},{"field":"sections.slots","reason":"missing"}],"message":"host facts refused"}}"#]]
        .assert_eq(&format!("{} {b}", s.as_u16()));
    let (s, _) = app.get("/internal/v1/hosts/exec-01/assignments", W1).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    app.register("exec-01", W1, 1).await;
    let (s, b) = app
        .json(
            "PUT",
            "/internal/v1/hosts/exec-01/facts",
            W1,
            Some(json!({"nope": 1})),
        )
        .await;
    assert_eq!(
        (s, &b["error"]["code"]),
        (StatusCode::BAD_REQUEST, &json!("invalid"))
    );

    // Index 0 answers at once; the current index waits until `wait` runs out and answers
    // unchanged; a pending query ends when the controller shuts down.
    let (_, a) = app
        .get("/internal/v1/hosts/exec-01/assignments?index=0", W1)
        .await;
    let index = a["index"].as_u64().unwrap();
    assert!(index >= 1);
    let (s, a) = app
        .get(
            &format!("/internal/v1/hosts/exec-01/assignments?index={index}&wait=50ms"),
            W1,
        )
        .await;
    assert_eq!((s, a["index"].as_u64()), (StatusCode::OK, Some(index)));
    let (s, b) = app
        .get("/internal/v1/hosts/exec-01/assignments?wait=soon", W1)
        .await;
    assert_eq!(
        (s, &b["error"]["details"][0]["field"]),
        (StatusCode::BAD_REQUEST, &json!("wait"))
    );
    let pending = app.spawn_get(
        format!("/internal/v1/hosts/exec-01/assignments?index={index}&wait=10m"),
        W1,
    );
    tokio::task::yield_now().await;
    app.ctl.shutdown().await;
    let (status, _) = tokio::time::timeout(testkit::patience(), pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE,
        "{status}"
    );
}

/// A reload that removes a worker's credential and a user's token ends their blocking
/// queries (assignments, a service's detail) at once with 401 `bearer token revoked`;
/// another user's goes on and answers the next change.
#[tokio::test]
async fn revoked_credentials_end_their_blocking_queries() {
    let app = app().await;
    app.register("exec-01", W1, 4).await;
    let (s, _) = app.submit(ALICE, web("web", "team-a", 1)).await;
    assert_eq!(s, StatusCode::CREATED);
    let (_, a) = app
        .get("/internal/v1/hosts/exec-01/assignments?index=0", W1)
        .await;
    let host_index = a["index"].as_u64().unwrap();
    let (_, d) = app.get("/v1/services/web", ALICE).await;
    let rev = d["index"].as_u64().unwrap();
    let parked = |path: String, who: &str| app.spawn_get(path, who);
    let answer = |(status, body): (StatusCode, String)| format!("{} {body}", status.as_u16());
    let worker = parked(
        format!("/internal/v1/hosts/exec-01/assignments?index={host_index}&wait=60s"),
        W1,
    );
    let alice = parked(format!("/v1/services/web?index={rev}&wait=60s"), ALICE);
    let bob = parked(
        format!("/v1/services/web?project=team-a&index={rev}&wait=60s"),
        BOB,
    );
    // Let the three reach their wait. The runtime has one thread and nothing here does
    // I/O, so each yield runs every ready task a step: no clock involved. A query that
    // had not parked yet would be refused at authentication ("invalid bearer token"),
    // not end as revoked, so the expectation below tells.
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let without = TOKENS
        .replace(
            "[[token]]\nsecret = \"alice-example-secret\"",
            "[[token]]\nsecret = \"alice-gone-example-secret\"",
        )
        .replace(
            "secret = \"w1-example-secret\"",
            "secret = \"w1-gone-example-secret\"",
        );
    let done = app.keyring.replace(Tokens::parse(&without).unwrap());
    assert_eq!((done.added, done.removed), (2, 2));
    let worker = answer(worker.await.unwrap());
    let alice = answer(alice.await.unwrap());
    assert!(!bob.is_finished());
    let (s, _) = app
        .json(
            "POST",
            "/v1/services/web/scale",
            ADMIN,
            Some(json!({"replicas": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    let bob = answer(bob.await.unwrap());
    let bob_index =
        serde_json::from_str::<Value>(bob.split_once(' ').unwrap().1).unwrap()["index"].as_u64();
    expect![[r#"
        worker: 401 {"error":{"code":"unauthenticated","details":[],"message":"bearer token revoked"}}
        alice: 401 {"error":{"code":"unauthenticated","details":[],"message":"bearer token revoked"}}
        bob: 200 index>3: true
    "#]].assert_eq(&format!(
        "worker: {worker}\nalice: {alice}\nbob: {} index>{rev}: {}\n",
        &bob[..3],
        bob_index.is_some_and(|i| i > rev)
    ));
}

#[tokio::test]
async fn fake_worker_over_http_sees_assignments_and_replacements() {
    let slots = SharedSlots::new();
    let plugins = ControllerPlugins {
        resources: vec![Box::new(slots.clone())],
        facts_policies: vec![Arc::new(Policy)],
        listeners: vec![],
        extensions: vec![],
    };
    let cfg = ControllerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..ControllerConfig::default()
    };
    let run = start(
        cfg,
        Tokens::parse(TOKENS).unwrap(),
        plugins,
        Arc::new(MemStore::new()),
    )
    .await
    .unwrap();
    let base = format!("http://{}", run.addr);
    let http = reqwest::Client::new();
    let bounded = Duration::from_secs(20);
    let worker = |m: reqwest::Method, p: &str| {
        http.request(m, format!("{base}/internal/v1/hosts/exec-01/{p}"))
            .bearer_auth(W1)
    };

    let r = worker(reqwest::Method::POST, "register")
        .json(&RegisterRequest {
            facts: facts(2),
            running: vec![],
            wants_session: false,
        })
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<xce_proto::worker::RegisterResponse>()
            .await
            .unwrap()
            .heartbeat_ms,
        1000
    );

    // Nothing assigned yet: the blocking query waits for the submit.
    let (_, index0) = get_assignments(&worker, 0).await;
    let waiter = {
        let w = worker(
            reqwest::Method::GET,
            &format!("assignments?index={index0}&wait=15s"),
        );
        tokio::spawn(async move { w.send().await.unwrap().json::<Assignments>().await.unwrap() })
    };
    let r = http
        .post(format!("{base}/v1/services"))
        .bearer_auth(ALICE)
        .header("content-type", "application/toml")
        .body("[service]\nname = \"web\"\nproject = \"team-a\"\ncommand = [\"sleep\", \"100\"]\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let a = tokio::time::timeout(bounded, waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(a.index > index0);
    let jobs: Vec<(&str, u32, xce_proto::worker::Desired)> = a
        .jobs
        .iter()
        .map(|j| (j.job.as_str(), j.replica, j.desired))
        .collect();
    // A real controller tags the ids of its load (`j-<n>-<tag>`): the first job is
    // number 1, and its replacement below number 2 of the same load.
    let first = a.jobs[0].job.clone();
    let tag = first.rsplit_once('-').map(|(_, t)| t.to_owned());
    assert_eq!(xce_model::job_number(&first), Some(1), "{first}");
    assert!(
        tag.as_ref().is_some_and(|t| !t.is_empty() && t != "1"),
        "{first}"
    );
    assert_eq!(
        jobs,
        vec![(first.as_str(), 0, xce_proto::worker::Desired::Run)]
    );
    assert_eq!(*a.jobs[0].command, vec!["sleep", "100"]);
    assert_eq!(a.jobs[0].grants["slots"], json!(0));

    let events = vec![started(&first), ready(&first, true)];
    let r = worker(reqwest::Method::POST, "events")
        .json(&events)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let detail: Value = http
        .get(format!("{base}/v1/services/web"))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            detail["jobs"][0]["state"].as_str(),
            detail["jobs"][0]["ready"].as_bool()
        ),
        (Some("running"), Some(true))
    );

    // The replica exits; after its backoff a replacement appears in the assignments.
    let r = worker(reqwest::Method::POST, "events")
        .json(&vec![exited(&first)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let replacement = tokio::time::timeout(bounded, async {
        let mut index = a.index;
        loop {
            let (a, i) = get_assignments(&worker, index).await;
            if let Some(j) = a.jobs.first() {
                break j.clone();
            }
            index = i;
        }
    })
    .await
    .unwrap();
    let second = replacement.job.clone();
    assert_eq!(
        (xce_model::job_number(&second), replacement.replica),
        (Some(2), 0)
    );
    assert_eq!(second.rsplit_once('-').map(|(_, t)| t.to_owned()), tag);
    assert_eq!(slots.used(), vec![format!("exec-01:0={second}")]);
    tokio::time::timeout(bounded, run.shutdown()).await.unwrap();
}

async fn get_assignments(
    worker: &impl Fn(reqwest::Method, &str) -> reqwest::RequestBuilder,
    index: u64,
) -> (Assignments, u64) {
    let r = worker(
        reqwest::Method::GET,
        &format!("assignments?index={index}&wait=10s"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let a: Assignments = r.json().await.unwrap();
    let i = a.index;
    (a, i)
}
