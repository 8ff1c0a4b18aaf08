//! Finding 4 of issue 27, replayed step by step on a real controller and worker: a
//! leaked worker credential no longer makes its holder the host's worker. The live
//! instance id is disclosed by no answer; an instance id without the session secret the
//! controller handed the real worker at registration is refused on every route; and a
//! forged facts or readiness report sent with the whole session (read from the worker's
//! data dir, as a compromised host could) is undone by the real worker's next heartbeat,
//! whose digest no longer matches what the controller holds.

use crate::harness::*;
use anyhow::{Context, Result};
use reqwest::Method;
use serde_json::{json, Value};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

/// exec-01's worker credential, as the attacker stole it.
const STOLEN: &str = "worker-0-example-secret";

/// A worker-protocol call on exec-01's routes with the stolen credential and `headers`:
/// its status and body.
async fn call(
    api: &Api,
    method: Method,
    leaf: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, String) {
    let url = format!("{}/internal/v1/hosts/exec-01/{leaf}", api.base);
    let mut req = api.http.request(method, url).bearer_auth(STOLEN);
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let r = req.send().await.expect("the controller answers");
    let status = r.status().as_u16();
    (status, r.text().await.unwrap_or_default())
}

/// The `error.code` of an error answer.
fn code(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The index of the `web` endpoints entry and its plain endpoints.
async fn endpoints(api: &Api, index: Option<u64>) -> Result<(u64, String)> {
    let path = match index {
        Some(i) => format!("/v1/services/web/endpoints?format=plain&index={i}&wait=20s"),
        None => "/v1/services/web/endpoints?format=plain".to_owned(),
    };
    let (status, h, body) = api.get(&path).await?;
    anyhow::ensure!(status == 200, "endpoints: HTTP {status}: {body}");
    let index = h["x-xce-index"].to_str()?.parse()?;
    Ok((index, body.trim().to_owned()))
}

/// Follows the endpoints from `index` (blocking queries) until they read `want` again:
/// whether another value was seen on the way, and when `want` was seen.
async fn until_endpoints(api: &Api, mut index: u64, want: &str) -> (bool, Instant) {
    let deadline = Instant::now() + patience();
    let mut other = false;
    loop {
        let (next, body) = endpoints(api, Some(index)).await.expect("endpoints");
        if body == want {
            return (other, Instant::now());
        }
        other = true;
        assert!(
            Instant::now() < deadline,
            "endpoints still {body:?} after {:?}, not {want:?}",
            patience()
        );
        index = next;
    }
}

/// `xce_worker_digest_mismatches_total{part="…"}` on the controller.
async fn mismatches(api: &Api, part: &str) -> f64 {
    let (_, _, body) = api.get("/metrics").await.expect("metrics");
    let prefix = format!("xce_worker_digest_mismatches_total{{part=\"{part}\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0.0)
}

/// The heartbeat period exec-01's worker was told at registration (its log says).
fn heartbeat_period(c: &Cluster) -> Duration {
    let log = std::fs::read_to_string(c.dir.path().join("worker-0.log")).unwrap_or_default();
    let ms = log
        .lines()
        .filter(|l| l.contains("registered with the controller"))
        .find_map(|l| {
            let rest = l.split("heartbeat_ms=").nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no heartbeat_ms in the worker's log:\n{log}"));
    Duration::from_millis(ms)
}

/// What the attacker reports as exec-01's facts: another address.
fn forged_facts(ip: &str) -> Value {
    json!({
        "ip_addr": ip,
        "addresses": [{"ip": ip, "interface": "lo"}],
        "sections": {"ports": {"range": [20000, 32000], "reserved": [], "ephemeral": null}}
    })
}

/// The identity headers of a worker of `cluster`, instance `instance`.
fn ids<'a>(cluster: &'a str, instance: &'a str) -> [(&'static str, &'a str); 2] {
    [
        ("x-xce-cluster", cluster),
        ("x-xce-worker-instance", instance),
    ]
}

/// Steps 1–3: without the session secret, every call is refused and changes nothing.
/// Returns the refusals as `step: status code` lines, and every answer's body.
async fn without_session(
    c: &Cluster,
    cluster: &str,
    forged: &Value,
    job: &str,
) -> (Vec<String>, Vec<String>) {
    let real = c.worker_instance(0);
    let register = json!({"facts": forged, "running": [], "wants_session": true});
    let events = json!([{"event": "readiness", "job": job, "ready": false}]);
    let mut steps = Vec::new();
    let mut bodies = Vec::new();
    // Another instance registers while the real one is live: 409, no instance named.
    let (st, body) = call(
        &c.api,
        Method::POST,
        "register",
        &ids(cluster, "attacker-0000001"),
        Some(&register),
    )
    .await;
    assert_eq!((st, code(&body).as_str()), (409, "host_taken"), "{body}");
    assert!(
        !body.contains(&real),
        "the refusal names the live instance: {body}"
    );
    steps.push(format!(
        "register as another instance: {st} {}",
        code(&body)
    ));
    bodies.push(body);
    // The real instance id (say an older answer leaked it) and no session.
    let headers = ids(cluster, &real);
    let (st, body) = call(&c.api, Method::POST, "register", &headers, Some(&register)).await;
    assert_eq!((st, code(&body).as_str()), (409, "host_taken"), "{body}");
    steps.push(format!(
        "register as the live instance, no session: {st} {}",
        code(&body)
    ));
    bodies.push(body);
    let (more, answers) = refused_calls(c, &headers, forged, &events).await;
    steps.extend(more);
    bodies.extend(answers);
    (steps, bodies)
}

/// Step 3: heartbeat, assignments, facts and a readiness event with the live instance's
/// `headers`, without a session and with a guessed one: each refused. Returns the steps
/// and the answers' bodies.
async fn refused_calls(
    c: &Cluster,
    headers: &[(&'static str, &str)],
    forged: &Value,
    events: &Value,
) -> (Vec<String>, Vec<String>) {
    let mut steps = Vec::new();
    let mut bodies = Vec::new();
    let calls: [(&str, Method, &str, Option<&Value>); 4] = [
        ("heartbeat", Method::POST, "heartbeat", None),
        (
            "assignments",
            Method::GET,
            "assignments?index=0&wait=1s",
            None,
        ),
        ("facts", Method::PUT, "facts", Some(forged)),
        ("readiness event", Method::POST, "events", Some(events)),
    ];
    for (what, method, leaf, body) in calls {
        let (st, answer) = call(&c.api, method.clone(), leaf, headers, body).await;
        assert_eq!(
            (st, code(&answer).as_str()),
            (401, "session_required"),
            "{what}: {answer}"
        );
        assert!(
            !answer.contains("command"),
            "{what} disclosed assignments: {answer}"
        );
        steps.push(format!(
            "{what} as the live instance, no session: {st} {}",
            code(&answer)
        ));
        bodies.push(answer);
        let mut wrong = headers.to_vec();
        wrong.push((
            "x-xce-worker-session",
            "0000000000000000000000000000000000000000000000000000000000000000",
        ));
        let (st, answer) = call(&c.api, method, leaf, &wrong, body).await;
        assert_eq!(
            (st, code(&answer).as_str()),
            (401, "session_invalid"),
            "{what}: {answer}"
        );
        steps.push(format!(
            "{what} as the live instance, a guessed session: {st} {}",
            code(&answer)
        ));
        bodies.push(answer);
    }
    (steps, bodies)
}

/// Step 4: with the whole session (the worker's data dir read), a forged report is
/// accepted, then undone by the real worker's next heartbeat. Returns how long it stood,
/// whether it was seen, and the mismatches the controller counted meanwhile.
async fn forged_then_undone(
    c: &Cluster,
    part: &str,
    method: Method,
    leaf: &str,
    body: &Value,
    want: &str,
) -> (Duration, bool, f64) {
    let instance = c.worker_instance(0);
    let session = std::fs::read_to_string(c.dir.path().join("worker-0").join("session"))
        .expect("the worker keeps its session in its data dir");
    let (_, h, _) = c.api.get("/healthz").await.unwrap();
    let cluster = h["x-xce-cluster"].to_str().unwrap().to_owned();
    let headers = [
        ("x-xce-cluster", cluster.as_str()),
        ("x-xce-worker-instance", instance.as_str()),
        ("x-xce-worker-session", session.trim()),
    ];
    let before = mismatches(&c.api, part).await;
    let (index, _) = endpoints(&c.api, None).await.unwrap();
    let (st, answer) = call(&c.api, method, leaf, &headers, Some(body)).await;
    let sent = Instant::now();
    assert_eq!(
        st, 204,
        "a forged {part} report with the whole session: {answer}"
    );
    let (seen, back) = until_endpoints(&c.api, index, want).await;
    let counted = mismatches(&c.api, part).await - before;
    assert!(
        counted >= 1.0,
        "the controller saw no {part} digest mismatch"
    );
    (back - sent, seen, counted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stolen_worker_credential_cannot_hijack_its_host() {
    let c = Cluster::new(1, "30s").expect("cluster");
    let (status, body) = c
        .api
        .submit_toml(&http_service("web", 1).toml())
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let original = c.api.wait_settled("web", 1).await.join("\n");
    let svc = c.api.get_json("/v1/services/web").await.unwrap();
    let job = svc["jobs"][0]["job"]
        .as_str()
        .context("job")
        .unwrap()
        .to_owned();
    let hosts_before = c.api.get_json("/v1/hosts").await.unwrap()["hosts"].clone();
    // The cluster id is public (`/healthz`, no token): not what keeps a host.
    let (_, h, _) = c.api.get("/healthz").await.unwrap();
    let cluster = h["x-xce-cluster"].to_str().unwrap().to_owned();
    let o = c.first_ip.octets();
    let forged_ip = Ipv4Addr::new(o[0], o[1], o[2], o[3] + 99).to_string();
    let forged = forged_facts(&forged_ip);

    let (steps, mut bodies) = without_session(&c, &cluster, &forged, &job).await;
    // What else a client reads about the host: `/healthz`, `/v1/hosts`, the service.
    for path in ["/healthz", "/v1/hosts", "/v1/services/web"] {
        bodies.push(c.api.get(path).await.unwrap().2);
    }
    let real = c.worker_instance(0);
    let disclosed = bodies.iter().filter(|b| b.contains(&real)).count();
    assert_eq!(disclosed, 0, "an answer names the live instance {real}");
    assert_eq!(
        endpoints(&c.api, None).await.unwrap().1,
        original,
        "the endpoint moved"
    );
    let hosts_after = c.api.get_json("/v1/hosts").await.unwrap()["hosts"].clone();
    assert_eq!(hosts_after, hosts_before, "exec-01's record changed");
    for s in &steps {
        eprintln!("STEP refused: {s}");
    }

    let period = heartbeat_period(&c);
    let (facts_for, facts_seen, facts_counted) =
        forged_then_undone(&c, "facts", Method::PUT, "facts", &forged, &original).await;
    let events = json!([{"event": "readiness", "job": job, "ready": false}]);
    let (ready_for, ready_seen, ready_counted) =
        forged_then_undone(&c, "readiness", Method::POST, "events", &events, &original).await;
    for (what, stood) in [("facts", facts_for), ("readiness", ready_for)] {
        // The next heartbeat (at most one period away) finds the mismatch; its
        // correction is one more round trip.
        assert!(
            stood < period * 2,
            "the forged {what} stood {stood:?}, more than the next heartbeat ({period:?}) and its correction"
        );
    }
    eprintln!(
        "FIGURE hijack: {} refused steps without the session (instance id disclosed in {disclosed} of {} answers); with the whole session a forged facts report (ip {forged_ip}, seen {facts_seen}) stood {} ms and a forged readiness report (seen {ready_seen}) {} ms, heartbeat period {} ms; digest mismatches counted: facts {facts_counted}, readiness {ready_counted}",
        steps.len(),
        bodies.len(),
        facts_for.as_millis(),
        ready_for.as_millis(),
        period.as_millis(),
    );
}
