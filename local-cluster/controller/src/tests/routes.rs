//! The users' routes through `oneshot`: RBAC, every validation problem, the REST
//! answers and their shapes, quotas, projects that do not see each other.

use super::*;

#[tokio::test]
async fn rbac_matrix_across_two_projects() {
    let app = app().await;
    app.register("exec-01", W1, 4).await;
    let unknown_before = app
        .call("GET", "/v1/services/web-b", Some(ALICE), None)
        .await;
    let (s, _) = app.submit(ALICE, web("web-a", "team-a", 1)).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, _) = app.submit(BOB, web("web-b", "team-b", 1)).await;
    assert_eq!(s, StatusCode::CREATED);
    // Invisible and unknown answer byte-identically.
    let invisible = app
        .call("GET", "/v1/services/web-b", Some(ALICE), None)
        .await;
    assert_eq!(unknown_before, invisible);
    let delete_invisible = app
        .call("DELETE", "/v1/services/web-b", Some(ALICE), None)
        .await;
    assert_eq!(unknown_before, delete_invisible);

    check_calls(
        &app,
        &[
            ("GET", "/healthz", None, None),
            ("GET", "/v1/services", None, None),
            ("GET", "/v1/services", Some("nope"), None),
            ("GET", "/v1/services/web-b", Some(ALICE), None),
            ("DELETE", "/v1/services/web-b", Some(ALICE), None),
            (
                "POST",
                "/v1/services",
                Some(ALICE),
                Some(web("x", "team-b", 1)),
            ),
            (
                "POST",
                "/v1/services",
                Some(BOB),
                Some(web("x", "team-a", 1)),
            ),
            ("DELETE", "/v1/services/web-a", Some(BOB), None),
            (
                "POST",
                "/v1/services",
                Some(W1),
                Some(web("x", "team-a", 1)),
            ),
            ("GET", "/v1/services/web-a", Some(W1), None),
            ("GET", "/v1/services", Some(W1), None),
            ("GET", "/v1/hosts", Some(W1), None),
            (
                "POST",
                "/internal/v1/hosts/exec-01/heartbeat",
                Some(ADMIN),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-01/heartbeat",
                Some(W2),
                None,
            ),
            (
                "GET",
                "/internal/v1/hosts/exec-01/assignments?index=999",
                Some(W2),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-01/heartbeat",
                Some(W1),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-02/heartbeat",
                Some(W2),
                None,
            ),
            // A refused worker is told what is wrong: its secret, or its host's entry.
            (
                "POST",
                "/internal/v1/hosts/exec-01/register",
                Some("wrong"),
                None,
            ),
            ("POST", "/internal/v1/hosts/exec-01/heartbeat", None, None),
            (
                "POST",
                "/internal/v1/hosts/exec-09/register",
                Some("wrong"),
                None,
            ),
            (
                "POST",
                "/internal/v1/hosts/exec-09/register",
                Some(W2),
                None,
            ),
            ("GET", "/v1/nothing", Some(ALICE), None),
            ("GET", "/v1/whoami", Some(BOB), None),
            ("GET", "/v1/whoami", None, None),
        ],
        expect![[r#"
            GET /healthz as -: 200 ok
            cluster: c1c1c1c1c1c1c1c1
            version: 0.1.0
            commit: unknown

            GET /v1/services as -: 401 {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}
            GET /v1/services as nope: 401 {"error":{"code":"unauthenticated","details":[],"message":"invalid bearer token"}}
            GET /v1/services/web-b as alice-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"service \"web-b\" not found"}}
            DELETE /v1/services/web-b as alice-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"service \"web-b\" not found"}}
            POST /v1/services as alice-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-b\""}}
            POST /v1/services as bob-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-a\""}}
            DELETE /v1/services/web-a as bob-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-a\""}}
            POST /v1/services as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            GET /v1/services/web-a as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            GET /v1/services as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            GET /v1/hosts as w1-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"worker credentials may only call the worker api of their host"}}
            POST /internal/v1/hosts/exec-01/heartbeat as admin-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"the worker api needs a worker credential (a [[worker]] secret), not a user token"}}
            POST /internal/v1/hosts/exec-01/heartbeat as w2-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"a worker may act for its own host only: this credential is host \"exec-02\"'s, not host \"exec-01\"'s"}}
            GET /internal/v1/hosts/exec-01/assignments?index=999 as w2-example-secret: 403 {"error":{"code":"forbidden","details":[],"message":"a worker may act for its own host only: this credential is host \"exec-02\"'s, not host \"exec-01\"'s"}}
            POST /internal/v1/hosts/exec-01/heartbeat as w1-example-secret: 204 
            POST /internal/v1/hosts/exec-02/heartbeat as w2-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"host \"exec-02\" is not registered"}}
            POST /internal/v1/hosts/exec-01/register as wrong: 401 {"error":{"code":"unauthenticated","details":[],"message":"wrong or missing secret for the worker of host \"exec-01\" (invalid bearer token)"}}
            POST /internal/v1/hosts/exec-01/heartbeat as -: 401 {"error":{"code":"unauthenticated","details":[],"message":"wrong or missing secret for the worker of host \"exec-01\" (missing bearer token)"}}
            POST /internal/v1/hosts/exec-09/register as wrong: 401 {"error":{"code":"no_worker_entry","details":[],"message":"no [[worker]] entry for host \"exec-09\" in the controller's tokens file (invalid bearer token)"}}
            POST /internal/v1/hosts/exec-09/register as w2-example-secret: 403 {"error":{"code":"no_worker_entry","details":[],"message":"no [[worker]] entry for host \"exec-09\" in the controller's tokens file (this credential is host \"exec-02\"'s)"}}
            GET /v1/nothing as alice-example-secret: 404 {"error":{"code":"not_found","details":[],"message":"no such route"}}
            GET /v1/whoami as bob-example-secret: 200 bob
            GET /v1/whoami as -: 401 {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}"#]],
    )
    .await;

    // Lists are filtered.
    let names = |v: &Value| -> Vec<String> {
        v["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, a) = app.get("/v1/services", ALICE).await;
    let (_, b) = app.get("/v1/services", BOB).await;
    assert_eq!(
        (names(&a), names(&b)),
        (
            vec!["web-a".to_owned()],
            vec!["web-a".to_owned(), "web-b".to_owned()]
        )
    );
    // The hosts (every tenant's addresses and job counts) need host.view, or admin.
    let (s, b) = app.get("/v1/hosts", ALICE).await;
    expect![[r#"403 {"error":{"code":"forbidden","details":[],"message":"GET /v1/hosts needs the permission host.view (or admin), which \"alice\" does not hold"}}"#]].assert_eq(&format!("{} {b}", s.as_u16()));
    for who in [OPS, ADMIN] {
        assert_eq!(app.get("/v1/hosts", who).await.0, StatusCode::OK);
    }
    // So does /metrics (metrics.view): its labels name every tenant's services.
    let mut out = Vec::new();
    for who in [None, Some(ALICE), Some(W1), Some(OPS), Some(ADMIN)] {
        let (s, b) = app.call("GET", "/metrics", who, None).await;
        let first = b.lines().next().unwrap_or("");
        out.push(format!(
            "{who:?}: {} {}",
            s.as_u16(),
            &first[..first.len().min(100)]
        ));
    }
    expect![[r#"
        None: 401 {"error":{"code":"unauthenticated","details":[],"message":"missing bearer token"}}
        Some("alice-example-secret"): 403 {"error":{"code":"forbidden","details":[],"message":"/metrics needs the permission metrics.view (or 
        Some("w1-example-secret"): 403 {"error":{"code":"forbidden","details":[],"message":"/metrics needs the permission metrics.view (or 
        Some("ops-example-secret"): 200 # HELP xce_jobs Live jobs by state.
        Some("admin-example-secret"): 200 # HELP xce_jobs Live jobs by state."#]].assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn submit_errors_list_every_problem() {
    let app = app().await;
    let bad = json!({"service": {"name": "Bad_", "project": "team-a", "replicas": 0, "command": [], "slots": 3, "what": 1}});
    let toml_ok =
        "[service]\nname = \"web\"\nproject = \"team-a\"\ncommand = [\"true\"]\n".to_owned();
    let mut out = Vec::new();
    for (ctype, body) in [
        ("application/json", bad.to_string()),
        ("application/json", "{not json".to_owned()),
        ("application/toml", "[service\n".to_owned()),
        ("text/plain", "x".to_owned()),
        ("application/toml", toml_ok.clone()),
        ("application/toml", toml_ok),
    ] {
        let (s, b) = app
            .call("POST", "/v1/services", Some(ALICE), Some((ctype, body)))
            .await;
        let v: Value = serde_json::from_str(&b).unwrap();
        out.push(format!(
            "{} {}",
            s.as_u16(),
            v.get("error").unwrap_or(&v["name"])
        ));
    }
    expect![[r#"
        400 {"code":"invalid","details":[{"field":"service.what","reason":"unknown field"},{"field":"service.name","reason":"may contain only a-z, 0-9 and '-'"},{"field":"service.replicas","reason":"must be between 1 and 10000"},{"field":"service.command","reason":"must not be empty"},{"field":"service.slots","reason":"must be a table"}],"message":"invalid profile"}
        400 {"code":"invalid","details":[{"field":"profile","reason":"not valid JSON: key must be a string at line 1 column 2"}],"message":"invalid profile"}
        400 {"code":"invalid","details":[{"field":"profile","reason":"not valid TOML: unclosed table, expected `]`"}],"message":"invalid profile"}
        415 {"code":"unsupported_media_type","details":[],"message":"content type \"text/plain\" is not supported; send application/json or application/toml"}
        201 "web"
        409 {"code":"conflict","details":[],"message":"service \"web\" already exists"}"#]]
    .assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn put_scale_restart_and_stop_answer_and_refuse_bad_input_whole() {
    let app = app().await;
    let web = |cmd: &str| json!({"service": {"name": "web", "project": "team-a", "replicas": 2, "command": [cmd]}});
    let bad = json!({"service": {"name": "other", "project": "team-a", "command": ["x"],
        "drain": "-1s",
        "update": {"max_surge": 0, "max_unavailable": 0, "min_ready": "2h", "deadline": "0s",
                   "auto_revert": "yes", "surge": 1}}});
    let mut out = Vec::new();
    for (method, path, body) in [
        ("PUT", "/v1/services/web", Some(web("v1"))),
        ("PUT", "/v1/services/web", Some(web("v1"))),
        ("PUT", "/v1/services/web", Some(web("v2"))),
        ("PUT", "/v1/services/web", Some(bad)),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 0})),
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 10001})),
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": "three"})),
        ),
        (
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 3})),
        ),
        ("POST", "/v1/services/web/restart", None),
        ("POST", "/v1/services/nope/restart", None),
        ("DELETE", "/v1/services/web?now=true", None),
        ("PUT", "/v1/services/web", Some(web("v3"))),
    ] {
        let (s, v) = app.json(method, path, ALICE, body).await;
        let what = match v.get("error") {
            Some(e) => e.to_string(),
            None if v.get("rollout").is_some() => format!(
                "generation={} replicas={} rollout={}",
                v["generation"], v["replicas"], v["rollout"]["state"]
            ),
            None => v.to_string(),
        };
        out.push(format!("{method} {path} -> {} {what}", s.as_u16()));
    }
    expect![[r#"
        PUT /v1/services/web -> 201 generation=1 replicas=2 rollout="progressing"
        PUT /v1/services/web -> 200 generation=1 replicas=2 rollout="progressing"
        PUT /v1/services/web -> 200 generation=2 replicas=2 rollout="progressing"
        PUT /v1/services/web -> 400 {"code":"invalid","details":[{"field":"service.name","reason":"is \"other\", but the request is for service \"web\""},{"field":"service.drain","reason":"must not be negative"},{"field":"service.update.surge","reason":"unknown field"},{"field":"service.update","reason":"max_surge and max_unavailable must not both be 0 (a rollout could never replace a replica)"},{"field":"service.update.min_ready","reason":"must be between 0s and 1h"},{"field":"service.update.deadline","reason":"must be between 1s and 1h"},{"field":"service.update.auto_revert","reason":"must be true or false"}],"message":"invalid profile"}
        POST /v1/services/web/scale -> 400 {"code":"invalid","details":[{"field":"replicas","reason":"must be between 1 and 10000 (to stop the service, delete it)"}],"message":"invalid scale request"}
        POST /v1/services/web/scale -> 400 {"code":"invalid","details":[{"field":"replicas","reason":"must be between 1 and 10000 (to stop the service, delete it)"}],"message":"invalid scale request"}
        POST /v1/services/web/scale -> 400 {"code":"invalid","details":[{"field":"replicas","reason":"send {\"replicas\": N} with N between 1 and 10000 (invalid type: string \"three\", expected i64 at line 1 column 19)"}],"message":"invalid scale request"}
        POST /v1/services/web/scale -> 200 generation=2 replicas=3 rollout="progressing"
        POST /v1/services/web/restart -> 200 generation=3 replicas=3 rollout="progressing"
        POST /v1/services/nope/restart -> 404 {"code":"not_found","details":[],"message":"service \"nope\" not found"}
        DELETE /v1/services/web?now=true -> 202 {"name":"web","stopping":0}
        PUT /v1/services/web -> 201 generation=1 replicas=2 rollout="progressing""#]]
    .assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn a_project_at_its_quota_is_refused_while_another_still_places() {
    let quotas = quota::Quotas::parse(
        &json!({"default": {"replicas": 3, "slots": 3}, "team-b": {"services": 1}}),
        &["slots"],
    )
    .unwrap();
    let cfg = ControllerConfig {
        quotas,
        ..ControllerConfig::default()
    };
    let app = app_configured(cfg).await;
    app.register("exec-01", W1, 10).await;
    let mut out = Vec::new();
    for (who, method, path, body) in [
        (ALICE, "POST", "/v1/services", Some(web("a1", "team-a", 2))),
        (ALICE, "POST", "/v1/services", Some(web("a2", "team-a", 2))),
        (
            ALICE,
            "POST",
            "/v1/services/a1/scale",
            Some(json!({"replicas": 4})),
        ),
        (
            ALICE,
            "PUT",
            "/v1/services/a2",
            Some(web("a2", "team-a", 1)),
        ),
        (
            ALICE,
            "POST",
            "/v1/services/a1/scale",
            Some(json!({"replicas": 1})),
        ),
        (BOB, "POST", "/v1/services", Some(web("b1", "team-b", 5))),
        (BOB, "POST", "/v1/services", Some(web("b2", "team-b", 1))),
    ] {
        let (s, v) = app.json(method, path, who, body).await;
        let what = match v.get("error") {
            Some(e) => e.to_string(),
            None => format!(
                "{} ready-or-placed={}",
                v["name"],
                v["jobs"].as_array().map_or(0, Vec::len)
            ),
        };
        out.push(format!("{method} {path} -> {} {what}", s.as_u16()));
    }
    expect![[r#"
        POST /v1/services -> 201 "a1" ready-or-placed=2
        POST /v1/services -> 403 {"code":"quota_exceeded","details":[{"field":"quotas.team-a.replicas","reason":"limit 3, in use 2, this change needs 4"}],"message":"project \"team-a\" would use 4 replicas of its quota of 3 (2 in use)"}
        POST /v1/services/a1/scale -> 403 {"code":"quota_exceeded","details":[{"field":"quotas.team-a.replicas","reason":"limit 3, in use 2, this change needs 4"}],"message":"project \"team-a\" would use 4 replicas of its quota of 3 (2 in use)"}
        PUT /v1/services/a2 -> 201 "a2" ready-or-placed=1
        POST /v1/services/a1/scale -> 200 "a1" ready-or-placed=2
        POST /v1/services -> 201 "b1" ready-or-placed=5
        POST /v1/services -> 403 {"code":"quota_exceeded","details":[{"field":"quotas.team-b.services","reason":"limit 1, in use 1, this change needs 2"}],"message":"project \"team-b\" would use 2 services of its quota of 1 (1 in use)"}"#]]
    .assert_eq(&out.join("\n"));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn oversized_bodies_answer_413_in_the_error_shape() {
    let cfg = ControllerConfig {
        body_limit: 64,
        ..ControllerConfig::default()
    };
    let app = app_configured(cfg).await;
    let big = web("web", "team-a", 1).to_string() + &" ".repeat(100);
    let (s, b) = app
        .call(
            "POST",
            "/v1/services",
            Some(ALICE),
            Some(("application/json", big)),
        )
        .await;
    expect![[r#"413 {"error":{"code":"too_large","details":[],"message":"request body is larger than the limit of 64 bytes"}}"#]]
        .assert_eq(&format!("{} {b}", s.as_u16()));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn service_and_host_answers_have_the_rest_shapes() {
    let app = app().await;
    let created = web_of_4_on_2_hosts_one_ready(&app).await;
    let (_, detail) = app.get("/v1/services/web", ADMIN).await;
    let (_, list) = app.get("/v1/services", ADMIN).await;
    let (_, hosts) = app.get("/v1/hosts", ADMIN).await;
    let (_, metrics) = app.call("GET", "/metrics", Some(OPS), None).await;
    let mut metrics: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("xce_jobs{")
                || l.starts_with("test_")
                || l.starts_with("xce_pending")
                || l.starts_with("xce_placements")
        })
        .collect();
    // Label sets of a family come out in hash order.
    metrics.sort_unstable();
    expect![[r#"
        {"generation":1,"index":6,"jobs":[{"generation":1,"host":"exec-01","job":"j-1","log":null,"ready":false,"replica":0,"slots":{"slot":0},"state":"placed"},{"generation":1,"host":"exec-02","job":"j-2","log":null,"ready":false,"replica":1,"slots":{"slot":0},"state":"placed"},{"generation":1,"host":"exec-01","job":"j-3","log":null,"ready":false,"replica":2,"slots":{"slot":1},"state":"placed"}],"name":"web","pending":[{"reason":"slots is full on all 2 hosts (exec-01, exec-02)","replica":3}],"profile":{"command":["sleep","1000"],"name":"web","project":"default","replicas":4,"update":{"min_ready":"0s"}},"project":"default","replica_status":[{"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":1,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":2,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":3,"restarts":0}],"replicas":4,"rollout":{"generation":1,"outdated":0,"ready":0,"reason":"replica 0 (j-1 on exec-01) has not started yet","state":"progressing","updated":3},"state":"active"}
        {"generation":1,"index":8,"jobs":[{"generation":1,"host":"exec-01","job":"j-1","log":null,"ready":true,"replica":0,"slots":{"slot":0},"state":"running"},{"generation":1,"host":"exec-02","job":"j-2","log":null,"ready":false,"replica":1,"slots":{"slot":0},"state":"placed"},{"generation":1,"host":"exec-01","job":"j-3","log":null,"ready":false,"replica":2,"slots":{"slot":1},"state":"placed"}],"name":"web","pending":[{"reason":"slots is full on all 2 hosts (exec-01, exec-02)","replica":3}],"profile":{"command":["sleep","1000"],"name":"web","project":"default","replicas":4,"update":{"min_ready":"0s"}},"project":"default","replica_status":[{"last_exit":null,"log":null,"log_host":null,"replica":0,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":1,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":2,"restarts":0},{"last_exit":null,"log":null,"log_host":null,"replica":3,"restarts":0}],"replicas":4,"rollout":{"generation":1,"outdated":0,"ready":1,"reason":"replica 1 (j-2 on exec-02) has not started yet","state":"progressing","updated":3},"state":"active"}
        {"services":[{"generation":1,"index":8,"name":"web","pending":1,"pending_reason":"slots is full on all 2 hosts (exec-01, exec-02)","project":"default","ready":1,"replicas":4,"rollout":"progressing","running":1,"state":"active"}]}
        {"cluster":"c1c1c1c1c1c1c1c1","hosts":[{"addresses":[{"interface":"lo","ip":"127.0.0.11"}],"id":"exec-01","ip_addr":"127.0.0.11","jobs":2,"maintenance":null,"slots":{"capacity":2,"used":2},"state":"ready"},{"addresses":[{"interface":"lo","ip":"127.0.0.12"}],"id":"exec-02","ip_addr":"127.0.0.12","jobs":1,"maintenance":null,"slots":{"capacity":1,"used":1},"state":"ready"}]}
        test_ext_total 1
        test_slots 42
        xce_jobs{state="draining"} 0
        xce_jobs{state="placed"} 2
        xce_jobs{state="running"} 1
        xce_jobs{state="stopping"} 0
        xce_jobs{state="unknown"} 0
        xce_pending_replicas 1
        xce_placements_total 3"#]]
    .assert_eq(&format!("{created}\n{detail}\n{list}\n{hosts}\n{}", metrics.join("\n")));
    app.ctl.shutdown().await;
}

#[tokio::test]
async fn two_projects_each_have_a_web_and_nobody_learns_of_the_other() {
    let app = app().await;
    app.register("exec-01", W1, 10).await;
    // What alice sees before bob's web exists, to compare bytes with after.
    let (_, before) = app
        .call("GET", "/v1/services/nope", Some(ALICE), None)
        .await;
    let mut out = Vec::new();
    for (who, method, path, body) in [
        (ALICE, "POST", "/v1/services", Some(web("web", "team-a", 1))),
        (BOB, "POST", "/v1/services", Some(web("web", "team-b", 1))),
        (
            BOB,
            "PUT",
            "/v1/services/web",
            Some(web("web", "team-b", 1)),
        ),
        (ALICE, "GET", "/v1/services/web", None),
        (ALICE, "GET", "/v1/services/web?project=team-b", None),
        (BOB, "GET", "/v1/services/web", None),
        (BOB, "GET", "/v1/services/web?project=team-b", None),
        (BOB, "POST", "/v1/services/web/restart", None),
        (BOB, "POST", "/v1/services/web/restart?project=team-a", None),
        (
            BOB,
            "DELETE",
            "/v1/services/web?project=team-b&now=true",
            None,
        ),
        (
            ALICE,
            "POST",
            "/v1/services/web/scale",
            Some(json!({"replicas": 2})),
        ),
    ] {
        let (s, v) = app.json(method, path, who, body).await;
        let what = match v.get("error") {
            Some(e) => e.to_string(),
            None if v.get("project").is_some() => format!(
                "{}/{} replicas={} generation={}",
                v["project"].as_str().unwrap(),
                v["name"].as_str().unwrap(),
                v["replicas"],
                v["generation"]
            ),
            None => v.to_string(),
        };
        out.push(format!(
            "{} {method} {path} -> {} {what}",
            who.trim_end_matches("-example-secret"),
            s.as_u16()
        ));
    }
    expect![[r#"
        alice POST /v1/services -> 201 team-a/web replicas=1 generation=1
        bob POST /v1/services -> 201 team-b/web replicas=1 generation=1
        bob PUT /v1/services/web -> 200 team-b/web replicas=1 generation=1
        alice GET /v1/services/web -> 200 team-a/web replicas=1 generation=1
        alice GET /v1/services/web?project=team-b -> 404 {"code":"not_found","details":[],"message":"service \"web\" not found"}
        bob GET /v1/services/web -> 409 {"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}
        bob GET /v1/services/web?project=team-b -> 200 team-b/web replicas=1 generation=1
        bob POST /v1/services/web/restart -> 409 {"code":"ambiguous","details":[{"field":"project","reason":"\"team-a\" has a service \"web\""},{"field":"project","reason":"\"team-b\" has a service \"web\""}],"message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project="}
        bob POST /v1/services/web/restart?project=team-a -> 403 {"code":"forbidden","details":[],"message":"no job.submit permission on project \"team-a\""}
        bob DELETE /v1/services/web?project=team-b&now=true -> 202 {"name":"web","stopping":1}
        alice POST /v1/services/web/scale -> 200 team-a/web replicas=2 generation=1"#]]
    .assert_eq(&out.join("\n"));
    // A project alice cannot view answers exactly as a name nobody uses.
    let (_, invisible) = app
        .call("GET", "/v1/services/nope?project=team-b", Some(ALICE), None)
        .await;
    assert_eq!(invisible, before);
    app.ctl.shutdown().await;
}
