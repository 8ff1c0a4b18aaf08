//! Token rotation without a restart (issue 16): SIGHUP re-reads the tokens file; a removed
//! token's streams and blocking queries end within a second while every other watcher
//! goes on; a file that no longer loads changes nothing. And the audit log: one
//! `xce::audit` line per write and per refusal, naming the principal, never a secret.

use crate::harness::*;
use futures_util::StreamExt;
use std::time::{Duration, Instant};

const A: &str = "rotation-token-a-0123456789";
const B: &str = "rotation-token-b-0123456789";
/// Watchers per token: half streams, half blocking queries.
const WATCHERS: usize = 100;

/// `base` (the cluster's own entries) with bob's token B and, `with_a`, alice's token A:
/// both may view and submit on project `rot`, and read `/metrics` (the test reads it).
fn tokens_file(base: &str, with_a: bool) -> String {
    let entry = |secret: &str, principal: &str| {
        format!(
            "[[token]]\nsecret = \"{secret}\"\nprincipal = \"{principal}\"\n\
             grants = [ {{ permission = \"job.view\", projects = [\"rot\"] }}, \
             {{ permission = \"job.submit\", projects = [\"rot\"] }}, \
             {{ permission = \"metrics.view\", projects = [\"*\"] }} ]\n"
        )
    };
    let mut text = format!("{base}\n{}", entry(B, "bob"));
    if with_a {
        text += &entry(A, "alice");
    }
    text
}

/// How a watcher ended: when, and with what (the status of a blocking query's answer, or
/// the last `event: error` body of a stream).
#[derive(Debug)]
struct Ended {
    at: Instant,
    how: String,
}

/// Follows an open stream to its end; every event id it saw goes to `ids`.
async fn follow_stream(
    resp: reqwest::Response,
    ids: tokio::sync::mpsc::UnboundedSender<u64>,
) -> Ended {
    let mut body = resp.bytes_stream();
    let mut parser = SseParser::default();
    let mut last = String::new();
    while let Some(chunk) = body.next().await {
        let Ok(chunk) = chunk else { break };
        let text = String::from_utf8_lossy(&chunk).to_string();
        if text.contains("event: error") || text.contains("event:error") {
            last = text.clone();
        }
        for (id, _) in parser.push(&chunk) {
            let _ = ids.send(id);
        }
    }
    Ended {
        at: Instant::now(),
        how: last,
    }
}

/// The process whose tokens are rotated, and how to reach it.
struct Target {
    /// What it is, in the SUMMARY lines.
    name: &'static str,
    /// Its API, without a token.
    api: Api,
    pid: u32,
    /// The tokens file it reads.
    tokens: std::path::PathBuf,
    /// The entries of the file besides A and B (the cluster's own).
    base: String,
    /// Entries it holds that are not in the file (`xced dev`'s own token and workers).
    implicit: usize,
    /// Whether it answers the service detail's blocking query itself (a separate
    /// apiserver forwards it to the leader, which this test does not reload).
    detail: bool,
    log: Box<dyn Fn() -> String>,
}

/// Entries of a tokens file (what `xce_tokens_loaded` sums).
fn entries(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.trim() == "[[token]]" || l.trim() == "[[worker]]")
        .count() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotation_ends_the_removed_tokens_watchers_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, tokens_file("", true)).unwrap();
    let c = DevCluster::start_with(1, false, &["--tokens", path.to_str().unwrap()]).unwrap();
    let log = c.dir.path().join("xced.log");
    rotation(Target {
        name: "xced-dev",
        api: c.api.clone(),
        pid: c.child.id(),
        tokens: path,
        base: String::new(),
        // xced-dev's own token and the dev host's worker credential.
        implicit: 2,
        detail: true,
        log: Box::new(move || std::fs::read_to_string(&log).unwrap_or_default()),
    })
    .await;
}

/// The same on a separate apiserver on etcd: only it is sent SIGHUP (the controller
/// still knows A, so what ends A's watchers is the apiserver's own reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotation_on_a_separate_apiserver() {
    let etcd = crate::daemons::EtcdCluster::start(1).await.expect("etcd");
    let mut fleet = crate::daemons::Fleet::new(etcd, 1, 1).expect("fleet dir");
    let path = fleet.dir.path().join("tokens.toml");
    let base = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, tokens_file(&base, true)).unwrap();
    fleet.start_controller(0).unwrap();
    fleet.start_apiserver(0).unwrap();
    fleet.start_workers(1).unwrap();
    let admin = fleet.apiserver(0);
    eventually("the apiserver serves, with its host ready", || async {
        let h = admin.get_json("/v1/hosts").await?;
        let ready = h["hosts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 1).then_some(()))
    })
    .await;
    let log = fleet.log("apiserver-0");
    let pid = fleet.apiservers[0].as_ref().unwrap().child.id();
    rotation(Target {
        name: "apiserver-on-etcd",
        api: admin,
        pid,
        tokens: path,
        base,
        implicit: 0,
        detail: false,
        log: Box::new(move || std::fs::read_to_string(&log).unwrap_or_default()),
    })
    .await;
}

/// 100 watchers of A and 100 of B; A removed and SIGHUP: all of A's end within 1 s, B's
/// go on and see the next change; then a broken file and SIGHUP: nothing changes.
async fn rotation(t: Target) {
    let path = &t.tokens;
    let a = t.api.with_token(A);
    let b = t.api.with_token(B);
    let (status, v) = b
        .submit_toml(&http_service("web", 1).project("rot").toml())
        .await
        .unwrap();
    assert_eq!(status, 201, "{v}");
    b.wait_settled("web", 1).await;
    let entry = "/v1/services/web/endpoints?project=rot";
    let index: u64 = b.get_json(entry).await.unwrap()["index"].as_u64().unwrap();
    let detail = "/v1/services/web?project=rot";
    let rev: u64 = b.get_json(detail).await.unwrap()["index"].as_u64().unwrap();
    let watchers_before = metric(&b, "xce_endpoint_watchers").await.unwrap();

    // 100 watchers per token: 50 streams and 50 blocking queries, all parked. Where the
    // target answers it, every other blocking query is the service detail's (the
    // controller's own), the others the endpoint entry's; sent first, so they are parked
    // by the time the endpoint watchers are (a 401 that says `revoked` proves it).
    let (tx, mut b_ids) = tokio::sync::mpsc::unbounded_channel();
    let mut a_ended = tokio::task::JoinSet::new();
    let mut b_streams = tokio::task::JoinSet::new();
    let mut b_blocking = tokio::task::JoinSet::new();
    let blocking_path = format!("{entry}&index={index}&wait=600s");
    let detail_path = format!("{detail}&index={rev}&wait=600s");
    let mut order: Vec<usize> = (0..WATCHERS).collect();
    // The detail queries (odd i with i % 4 == 3) first.
    order.sort_by_key(|i| !(t.detail && i % 4 == 3));
    let mut detail_queries = 0;
    for i in order {
        for (api, token) in [(&a, A), (&b, B)] {
            if i % 2 == 0 {
                let resp = sse_open(api, "/v1/services/web/endpoints/stream?project=rot", None)
                    .await
                    .unwrap();
                let ids = if token == A {
                    tokio::sync::mpsc::unbounded_channel().0
                } else {
                    tx.clone()
                };
                let follow = follow_stream(resp, ids);
                if token == A {
                    a_ended.spawn(follow);
                } else {
                    b_streams.spawn(follow);
                }
            } else {
                let api = api.clone();
                let path = if t.detail && i % 4 == 3 {
                    detail_queries += 1;
                    detail_path.clone()
                } else {
                    blocking_path.clone()
                };
                let query = async move {
                    let r = api.get(&path).await;
                    let how = match r {
                        Ok((status, _, body)) => format!("{status} {body}"),
                        Err(e) => format!("error {e:#}"),
                    };
                    Ended {
                        at: Instant::now(),
                        how,
                    }
                };
                if token == A {
                    a_ended.spawn(query);
                } else {
                    b_blocking.spawn(query);
                }
            }
        }
    }
    // The detail queries are not the endpoint table's watchers.
    let want = watchers_before + 2.0 * WATCHERS as f64 - detail_queries as f64;
    eventually("every watcher parked", || async {
        let n = metric(&b, "xce_endpoint_watchers").await?;
        if n < want {
            let now = b.get_json(entry).await?;
            anyhow::bail!("{n} of {want} parked (at index {index}; the entry now: {now})");
        }
        Ok(Some(()))
    })
    .await;

    // Remove A, SIGHUP, and time A's watchers ending.
    let without_a = tokens_file(&t.base, false);
    std::fs::write(path, &without_a).unwrap();
    let hup = Instant::now();
    signal(t.pid, libc::SIGHUP);
    let mut max = Duration::ZERO;
    let mut closed = 0;
    let deadline = tokio::time::Instant::now() + patience();
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, a_ended.join_next()).await {
        let ended = done.unwrap();
        assert!(
            ended.how.contains("unauthenticated") && ended.how.contains("bearer token revoked"),
            "an A watcher ended otherwise: {}",
            ended.how
        );
        max = max.max(ended.at.saturating_duration_since(hup));
        closed += 1;
    }
    println!(
        "SUMMARY rotation target={} closed={closed} of={WATCHERS} max_ms={} (streams {}, blocking queries {}: {} of the service detail)",
        t.name,
        max.as_millis(),
        WATCHERS / 2,
        WATCHERS / 2,
        detail_queries / 2,
    );
    assert_eq!(closed, WATCHERS, "every watcher of the removed token ends");
    assert!(
        max < Duration::from_secs(1),
        "the removed token's watchers ended within 1 s of SIGHUP (slowest {max:?})"
    );
    let (status, _, _) = a.get(entry).await.unwrap();
    assert_eq!(status, 401);
    assert_eq!(
        metric(&b, "xce_tokens_reloads_total").await.unwrap(),
        1.0,
        "one reload, applied"
    );
    // Both kinds summed.
    let loaded = entries(&without_a) + t.implicit as f64;
    assert_eq!(metric(&b, "xce_tokens_loaded").await.unwrap(), loaded);

    // B's watchers are all still there: none ended, and a change made now reaches each.
    assert!(b_streams.try_join_next().is_none() && b_blocking.try_join_next().is_none());
    while b_ids.try_recv().is_ok() {}
    let (status, v) = b
        .put_toml("web", &http_service("web", 2).project("rot").toml())
        .await
        .unwrap();
    assert!(status == 200 || status == 201, "{status} {v}");
    b.wait_ready("web", 2).await;
    let after: u64 = b.get_json(entry).await.unwrap()["index"].as_u64().unwrap();
    assert!(after > index);
    // Every blocking query of B answers the change (200, a higher index).
    let mut answered = 0;
    while let Ok(Some(done)) = tokio::time::timeout_at(
        tokio::time::Instant::now() + patience(),
        b_blocking.join_next(),
    )
    .await
    {
        let ended = done.unwrap();
        assert!(ended.how.starts_with("200 "), "{}", ended.how);
        answered += 1;
    }
    assert_eq!(answered, WATCHERS / 2);
    // Every stream of B receives events up to the new index, with ids that only grow,
    // on the connection it had before the reload.
    let streams = WATCHERS / 2;
    let mut reached = 0;
    let mut seen = 0;
    while reached < streams {
        let id = tokio::time::timeout(patience(), b_ids.recv())
            .await
            .expect("B's streams keep receiving after the reload")
            .unwrap();
        assert!(
            id > index,
            "an event id after the change is past the old index"
        );
        seen += 1;
        if id == after {
            reached += 1;
        }
    }
    assert!(b_streams.try_join_next().is_none(), "no stream of B ended");
    println!(
        "SUMMARY rotation target={} b_streams={streams} b_events_after_reload={seen} b_blocking_answered={answered}",
        t.name
    );

    // A file that no longer loads: refused whole, every problem logged, nothing changes.
    let with_a = tokens_file(&t.base, true);
    // The broken entry is the token after every token of `with_a`.
    let broken_at = count_tokens(&with_a);
    std::fs::write(
        path,
        format!("{with_a}[[token]]\nsecret = \"short\"\nprincipal = \"\"\n"),
    )
    .unwrap();
    signal(t.pid, libc::SIGHUP);
    eventually("the broken file refused", || async {
        let n = metric(&b, "xce_tokens_reloads_total").await?;
        Ok((n >= 2.0).then_some(()))
    })
    .await;
    let log = (t.log)();
    let refusal = log
        .lines()
        .find(|l| l.contains("tokens file refused on reload"))
        .expect("the refusal is logged");
    assert!(
        refusal.contains(&format!("token[{broken_at}].secret: too short"))
            && refusal.contains(&format!("token[{broken_at}].principal")),
        "every problem listed: {refusal}"
    );
    assert_eq!(b.get(entry).await.unwrap().0, 200, "B still works");
    assert_eq!(a.get(entry).await.unwrap().0, 401, "A still refused");
    assert_eq!(metric(&b, "xce_tokens_loaded").await.unwrap(), loaded);
    for secret in [A, B] {
        assert!(!log.contains(secret), "no secret in the log");
    }
}

/// `[[token]]` entries of a tokens file.
fn count_tokens(text: &str) -> usize {
    text.lines().filter(|l| l.trim() == "[[token]]").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_and_a_refusal_each_leave_one_audit_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokens.toml");
    std::fs::write(&path, tokens_file("", true)).unwrap();
    let c = DevCluster::start_with(1, false, &["--tokens", path.to_str().unwrap()]).unwrap();
    let b = c.api.with_token(B);
    let (status, v) = b
        .submit_toml(&http_service("audited", 1).project("rot").toml())
        .await
        .unwrap();
    assert_eq!(status, 201, "{v}");
    let wrong = "not-a-token-of-this-cluster-0123";
    let (status, _, _) = c
        .api
        .with_token(wrong)
        .get("/v1/services/audited?project=rot")
        .await
        .unwrap();
    assert_eq!(status, 401);
    // A worker-protocol call with a user token (not this host's credential): 403.
    let worker_call = b
        .http
        .post(format!("{}/internal/v1/hosts/exec-01/heartbeat", b.base))
        .bearer_auth(B)
        .send()
        .await
        .unwrap();
    assert_eq!(worker_call.status(), 403);
    let lines = eventually("three audit lines", || async {
        let log = c.log();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("xce::audit"))
            .map(str::to_owned)
            .collect();
        Ok((lines.len() >= 3).then_some(lines))
    })
    .await;
    let submits: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("action=\"submit\""))
        .collect();
    assert_eq!(submits.len(), 1, "{lines:#?}");
    let s = submits[0];
    for want in [
        "principal=\"bob\"",
        "project=\"rot\"",
        "service=\"audited\"",
        "outcome=\"ok\"",
        "status=201",
        "peer=127.0.0.1",
    ] {
        assert!(s.contains(want), "{want} in {s}");
    }
    let refused: Vec<&String> = lines.iter().filter(|l| l.contains("status=401")).collect();
    assert_eq!(refused.len(), 1, "{lines:#?}");
    for want in [
        "outcome=\"refused\"",
        "action=\"read\"",
        "service=\"audited\"",
        "code=\"unauthenticated\"",
    ] {
        assert!(refused[0].contains(want), "{want} in {}", refused[0]);
    }
    let workers: Vec<&String> = lines.iter().filter(|l| l.contains("worker.")).collect();
    assert_eq!(workers.len(), 1, "{lines:#?}");
    for want in [
        "action=\"worker.heartbeat\"",
        "principal=\"bob\"",
        "host=\"exec-01\"",
        "outcome=\"refused\"",
        "status=403",
    ] {
        assert!(workers[0].contains(want), "{want} in {}", workers[0]);
    }
    assert_eq!(lines.len(), 3, "nothing else audited: {lines:#?}");
    let log = c.log();
    for secret in [A, B, wrong] {
        assert!(!log.contains(secret), "no secret anywhere in the log");
    }
}
