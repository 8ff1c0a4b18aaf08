//! Issue 28, finding 1: a frozen etcd member under an apiserver's watch. etcd HA (3
//! members), 2 controllers, 1 `xced apiserver` watching member `m0`, which is made a
//! follower (leadership moved to `m1`), 3 workers. The rollout test's load client (200
//! requests/s, each on a fresh connection) follows the endpoint stream with the apiserver
//! first in its list of URLs, then the controllers, opening a stream again when it ends
//! and moving on when one cannot be opened or answers 503 (as `xcecli` and a load
//! balancer health-checking `/healthz` do). A rollout v1
//! → v2 starts, and `m0` is stopped (`kill -STOP`) for 40 s, then continued.
//!
//! Before the fix the apiserver stayed at an old revision for 11-20 s, answering 200 on
//! `/healthz`, and its stream listed replicas that had already got SIGTERM: 12-27 % of the
//! requests failed. Now the apiserver learns within a second that the store moved on,
//! fails closed past `max_lag` (2 s: its stream ends, `/healthz` says `stale`), and no
//! replica gets SIGTERM before every live apiserver has applied its removal or is failing
//! closed. Prints `SUMMARY freshness stale_detect_ms=… failed=… listed_after_sigterm=…`.

use crate::daemons::*;
use crate::harness::*;
use crate::rollout::{rollout_is, wait_detail, Follower, Load, Outcome, Seen, Web};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the member under the apiserver stays frozen.
const FREEZE: Duration = Duration::from_secs(40);
const REPLICAS: usize = 3;

/// The etcd member (index in `etcd://m0,m1,m2`) the apiserver's watch is on now
/// (`xce_apiserver_watched_member`; a build without that metric, the one before the fix,
/// watches the first member until a watch of it breaks).
async fn watched_member(api: &Api, etcd_url: &str) -> Option<usize> {
    let (_, _, text) = api.get("/metrics").await.ok()?;
    if !text.contains("xce_apiserver_watched_member") {
        return Some(0);
    }
    let ep = text.lines().find_map(|l| {
        let rest = l.strip_prefix("xce_apiserver_watched_member{endpoint=\"")?;
        let (ep, value) = rest.split_once("\"} ")?;
        (value.trim() == "1").then(|| ep.to_owned())
    })?;
    let members: Vec<&str> = etcd_url.strip_prefix("etcd://")?.split(',').collect();
    members.iter().position(|m| *m == ep)
}

/// Writes a control key under the store's prefix (`/xce/.canary`: no record, every
/// reader of the store skips it) through member `m`; returns when etcd acknowledged it.
async fn canary(etcd_url: &str, m: usize) -> Instant {
    let member = etcd_url
        .trim_start_matches("etcd://")
        .split(',')
        .nth(m)
        .unwrap();
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let r = reqwest::Client::new()
        .post(format!("http://{member}/v3/kv/put"))
        .body(format!(
            r#"{{"key":"{}","value":"{}"}}"#,
            b64("/xce/.canary"),
            b64("freshness")
        ))
        .timeout(patience())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "canary put: {}", r.status());
    Instant::now()
}

/// How many times the apiserver failed closed because it fell behind
/// (`xce_apiserver_lagging_total`; 0 from a build without the counter).
async fn times_failed_closed(api: &Api) -> u64 {
    let (_, _, text) = api.get("/metrics").await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("xce_apiserver_lagging_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The old replicas the load client's list still named when they got SIGTERM or later:
/// for each, how long after its SIGTERM the list named it (until the next list without
/// it, or the end of the run), and from which URL.
fn listed_after_sigterm(seen: &[Seen], terms: &BTreeMap<String, u64>, end: u64) -> Vec<String> {
    let mut out = Vec::new();
    for (job, &t) in terms {
        let names = |s: &Seen| s.eps.iter().any(|e| e.job == *job);
        // The list current at its SIGTERM is the last one received before it.
        let current = seen.iter().rposition(|s| s.at <= t);
        let first = match current {
            Some(k) if names(&seen[k]) => Some(k),
            _ => seen.iter().position(|s| s.at > t && names(s)),
        };
        let Some(first) = first else { continue };
        let until = seen[first + 1..]
            .iter()
            .find(|s| s.at > t && !names(s))
            .map_or(end, |s| s.at);
        out.push(format!(
            "{job} listed by {} for {:.3}s after its SIGTERM",
            seen[first].from,
            until.saturating_sub(t) as f64 / 1e9
        ));
    }
    out
}

/// Waits until the apiserver on `port` answers `/healthz` 200.
async fn apiserver_serves(port: u16) {
    eventually("the apiserver serves", || async move {
        let h = tokio::task::spawn_blocking(move || healthz(port)).await?;
        Ok(h.filter(|(s, _)| *s == 200).map(|_| ()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_member_under_the_apiserver_fails_it_closed_and_no_endpoint_outlives_its_sigterm()
{
    let web = Web::new();
    let etcd = EtcdCluster::start(3).await.unwrap();
    let etcd_url = etcd.url();
    let mut fleet = Fleet::new(etcd, 3, 1).unwrap();
    fleet.start_leader_and_standby().await;
    fleet.start_apiserver(0).unwrap();
    let port = fleet.apiserver_ports[0];
    apiserver_serves(port).await;
    fleet.start_workers(3).unwrap();
    let api = fleet.apiserver(0);
    wait_for_hosts_of(&api, 3).unwrap();
    let (st, body) = api.submit_toml(&web.profile("v1", REPLICAS)).await.unwrap();
    assert_eq!(st, 201, "{body}");
    wait_detail(&api, "v1 ready", |d| {
        rollout_is(d, "complete", REPLICAS as u64)
    })
    .await;

    let apis = vec![
        api.clone(),
        fleet.controller_api(0),
        fleet.controller_api(1),
    ];
    let follower = Follower::start_any(&apis).await;
    follower
        .wait_for("the load client's first list", |l| l.len() == REPLICAS)
        .await;
    let load = Load::start(follower.list.clone());

    // The member under the apiserver's watch (m0 at first; another if it has moved on
    // meanwhile) is made a follower, then frozen; then the rollout starts (a write the
    // apiserver's watch cannot deliver now).
    let etcd = fleet.etcd.as_ref().unwrap();
    let m = eventually("the apiserver says which member it watches", || async {
        Ok(watched_member(&api, &etcd_url).await)
    })
    .await;
    etcd.make_leader((m + 1) % 3).await;
    let pid = etcd.pid(m).expect("the watched member runs");
    assert_eq!(
        watched_member(&api, &etcd_url).await,
        Some(m),
        "the apiserver still watches m{m}"
    );
    signal(pid, libc::SIGSTOP);
    let frozen = Instant::now();
    // A write the apiserver cannot get from its watch now: the moment its lag starts.
    let written = canary(&etcd_url, (m + 1) % 3).await;
    let leader = fleet.serving_controller().unwrap();
    let ctl = fleet.controller_api(leader);
    let (st, body) = ctl
        .put_toml("web", &web.profile("v2", REPLICAS))
        .await
        .unwrap();
    assert!(st == 200 || st == 201, "{st} {body}");

    // The rollout runs meanwhile; the freeze lasts its full length.
    tokio::time::sleep(FREEZE.saturating_sub(frozen.elapsed())).await;
    // The apiserver failed closed when it ended its stream to the load client: counted
    // from the canary's write (the first one after the freeze, unless the apiserver's
    // own registration came first: then it failed closed earlier still).
    let stale_detect = follower
        .ended
        .lock()
        .unwrap()
        .iter()
        .find(|(from, t)| *from == api.base && *t >= frozen)
        .map(|(_, t)| t.saturating_duration_since(written));
    signal(pid, libc::SIGCONT);
    // The leadership may have moved during the freeze (a leader whose lease keepalives
    // went to the frozen member loses its term): ask whichever controller serves now.
    eventually("v2 complete on the serving controller", || async {
        let Ok(c) = fleet.serving_controller() else {
            return Ok(None);
        };
        let d = fleet.controller_api(c).get_json("/v1/services/web").await?;
        Ok(rollout_is(&d, "complete", REPLICAS as u64).then_some(()))
    })
    .await;
    eventually("the apiserver serves again", || async move {
        let h = tokio::task::spawn_blocking(move || healthz(port)).await?;
        Ok(h.filter(|(s, _)| *s == 200).map(|_| ()))
    })
    .await;

    let failed_closed = times_failed_closed(&api).await;
    let shots = load.finish().await;
    let failed: Vec<_> = shots
        .iter()
        .filter(|s| !matches!(s.outcome, Outcome::Ok(_)))
        .collect();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for s in &failed {
        *kinds.entry(s.outcome.kind()).or_default() += 1;
    }
    let terms = web.term_times();
    let late = listed_after_sigterm(&follower.history(), &terms, monotonic_ns());
    println!(
        "freshness: {} requests, {} failed {kinds:?}; apiserver failed closed {failed_closed} \
         times; {} old replicas got SIGTERM; {}",
        shots.len(),
        failed.len(),
        terms.len(),
        late.join("; ")
    );
    println!(
        "SUMMARY freshness stale_detect_ms={} failed={} listed_after_sigterm={}",
        stale_detect.map_or("never".to_owned(), |d| d.as_millis().to_string()),
        failed.len(),
        late.len()
    );
    assert!(
        stale_detect.is_some() && failed_closed >= 1,
        "the apiserver never failed closed while the member under it was frozen"
    );
    assert!(
        terms.len() >= REPLICAS,
        "the rollout stopped the old replicas"
    );
    assert!(late.is_empty(), "listed after SIGTERM: {late:?}");
    assert!(
        failed.is_empty(),
        "{} requests failed: {kinds:?}",
        failed.len()
    );
    drop(fleet);
}

/// Read your writes, on the leader and on an apiserver: a service whose creation was
/// answered 201 is there for the next read of its endpoints at the same address. Both used
/// to race: the controller's endpoint routes took changes from an in-process queue after
/// the answer had gone, and the apiserver relayed the leader's answer before its etcd
/// watch had brought the change (a 404 right after the 201; CI saw it on the redb
/// controller's shutdown test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_answered_is_seen_by_the_next_read_on_the_leader_and_an_apiserver() {
    const ROUNDS: usize = 20;
    let etcd = EtcdCluster::start(1).await.unwrap();
    let mut fleet = Fleet::new(etcd, 0, 1).unwrap();
    fleet.start_leader(0).await;
    fleet.start_apiserver(0).unwrap();
    let port = fleet.apiserver_ports[0];
    apiserver_serves(port).await;
    let mut missed = Vec::new();
    for (at, api) in [
        ("leader", fleet.controller_api(0)),
        ("apiserver", fleet.apiserver(0)),
    ] {
        for i in 0..ROUNDS {
            let name = format!("ryw-{at}-{i}");
            // No hosts: the replica stays pending, the entry exists (without endpoints).
            let (status, body) = api
                .submit_toml(&http_service(&name, 1).toml())
                .await
                .unwrap();
            assert_eq!(status, 201, "{body}");
            let (status, _, text) = api
                .get(&format!("/v1/services/{name}/endpoints"))
                .await
                .unwrap();
            if status != 200 {
                missed.push(format!("{at}: {name}: {status} {text}"));
            }
        }
    }
    assert!(
        missed.is_empty(),
        "reads right after a 201 that did not see the service ({} of {}):\n{}",
        missed.len(),
        2 * ROUNDS,
        missed.join("\n")
    );
}
