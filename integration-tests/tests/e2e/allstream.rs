//! `GET /v1/endpoints/stream` on real binaries: one stream of every service a token may
//! view (two tenants on a dev cluster), meta labels in it, a killed replica showing up in
//! it, Last-Event-ID resume after a disconnect, bad input; and the same stream on a
//! separate apiserver on etcd, with the same event ids as the controller's.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::BTreeMap;
use tokio::time::timeout;

/// One SSE event: type, id, data.
#[derive(Debug, Clone)]
struct Ev {
    event: Option<String>,
    id: Option<u64>,
    data: Value,
}

/// An open all-services stream and what it rebuilt: `(project, service)` → entry.
struct Stream {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: String,
    table: BTreeMap<(String, String), Value>,
    last_id: Option<u64>,
    seen: Vec<Ev>,
}

impl Stream {
    async fn open(api: &Api, path: &str, last_event_id: Option<u64>) -> Result<Self> {
        let r = sse_open(api, path, last_event_id).await?;
        Ok(Self {
            body: r.bytes_stream().map(|c| c.map(|b| b.to_vec())).boxed(),
            buf: String::new(),
            table: BTreeMap::new(),
            last_id: last_event_id,
            seen: Vec::new(),
        })
    }

    /// The next event, applied to the table (bounded by the patience).
    async fn next(&mut self) -> Result<Ev> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    event: None,
                    id: None,
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        ev.event = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("id:") {
                        ev.id = Some(v.trim().parse()?);
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() && ev.event.is_none() {
                    continue; // a keep-alive comment
                }
                ev.data = serde_json::from_str(&data).unwrap_or(Value::Null);
                self.apply(&ev)?;
                self.seen.push(ev.clone());
                return Ok(ev);
            }
            let chunk = timeout(patience(), self.body.next())
                .await
                .context("no event within the patience")?
                .context("the stream ended")??;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    fn apply(&mut self, ev: &Ev) -> Result<()> {
        if let Some(id) = ev.id {
            if self.last_id.is_some_and(|last| id < last) {
                bail!("event id went backwards: {id} after {:?}", self.last_id);
            }
            self.last_id = Some(id);
        }
        if ev.event.as_deref() == Some("reset") {
            self.table.clear();
            return Ok(());
        }
        let key = (
            ev.data["project"].as_str().unwrap_or("").to_owned(),
            ev.data["service"].as_str().unwrap_or("").to_owned(),
        );
        if ev.data["deleted"] == true {
            self.table.remove(&key);
        } else {
            self.table.insert(key, ev.data.clone());
        }
        Ok(())
    }

    /// Reads until `done(table)` holds.
    async fn until(
        &mut self,
        what: &str,
        done: impl Fn(&BTreeMap<(String, String), Value>) -> bool,
    ) {
        while !done(&self.table) {
            if let Err(e) = self.next().await {
                panic!(
                    "waiting for {what}: {e:#}; rebuilt: {:?}",
                    self.table.keys()
                );
            }
        }
    }
}

fn ready_count(table: &BTreeMap<(String, String), Value>, project: &str, service: &str) -> usize {
    table
        .get(&(project.to_owned(), service.to_owned()))
        .map_or(0, |e| entry_endpoints(e).len())
}

/// The entries `api` may view, as `GET /v1/endpoints` lists them.
async fn listed(api: &Api) -> BTreeMap<(String, String), Value> {
    let list = api.get_json("/v1/endpoints").await.unwrap();
    list["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                (
                    e["project"].as_str().unwrap().to_owned(),
                    e["service"].as_str().unwrap().to_owned(),
                ),
                e.clone(),
            )
        })
        .collect()
}

fn labelled(name: &str, project: &str, replicas: u32) -> String {
    let mut toml = http_service(name, replicas)
        .project(project)
        .interval("300ms")
        .toml();
    toml += "[service.meta]\nteam = \"payments\"\ntier = \"1\"\n";
    toml
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stream_of_every_visible_service_with_resume() {
    let (_tokens, c) = DevCluster::two_tenants(2);
    let alice = c.api.with_token("alice-example-secret");
    let bob = c.api.with_token("bob-example-secret");

    // Bad meta: 400 naming every field, nothing placed.
    let bad = labelled("web", "team-a", 3)
        .replace("team = \"payments\"", "Team = \"x\"\ncost-center = \"y\"")
        + &format!("big = \"{}\"\n", "v".repeat(257));
    let (status, body) = alice.submit_toml(&bad).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let fields: Vec<&str> = body["error"]["details"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["field"].as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "service.meta.Team",
            "service.meta.big",
            "service.meta.cost-center"
        ],
        "{body}"
    );

    assert_eq!(
        alice
            .submit_toml(&labelled("web", "team-a", 3))
            .await
            .unwrap()
            .0,
        201
    );
    let api_svc = http_service("api", 1)
        .project("team-b")
        .interval("300ms")
        .toml();
    assert_eq!(bob.submit_toml(&api_svc).await.unwrap().0, 201);

    let mut bobs = Stream::open(&bob, "/v1/endpoints/stream", None)
        .await
        .unwrap();
    let mut alices = Stream::open(&alice, "/v1/endpoints/stream", None)
        .await
        .unwrap();
    alices
        .until("web with 3 endpoints", |t| {
            ready_count(t, "team-a", "web") == 3
        })
        .await;
    bobs.until("api with 1 endpoint", |t| {
        ready_count(t, "team-b", "api") == 1
    })
    .await;
    let web = &alices.table[&("team-a".to_owned(), "web".to_owned())];
    assert_eq!(
        web["meta"],
        serde_json::json!({"team": "payments", "tier": "1"})
    );
    // Prometheus SD carries the labels.
    let sd = alice
        .get_json("/v1/sd/prometheus?service=web")
        .await
        .unwrap();
    for group in sd.as_array().unwrap() {
        assert_eq!(
            group["labels"]["__meta_xce_meta_team"], "payments",
            "{group}"
        );
        for label in [
            "service",
            "project",
            "replica",
            "host",
            "generation",
            "port",
        ] {
            assert!(
                group["labels"].get(format!("__meta_xce_{label}")).is_some(),
                "{label} in {group}"
            );
        }
    }

    // A killed replica: its entry changes on the stream, then the replacement comes.
    let victim = entry_endpoints(web).into_iter().next().unwrap().2;
    kill_replica_listening_on(&victim).unwrap();
    alices
        .until("web without the killed replica", |t| {
            t.get(&("team-a".to_owned(), "web".to_owned()))
                .is_some_and(|e| !entry_endpoints(e).iter().any(|(_, _, a)| *a == victim))
        })
        .await;
    alices
        .until("web back to 3 endpoints", |t| {
            ready_count(t, "team-a", "web") == 3
        })
        .await;

    // Disconnect; while away, another replica dies and comes back, and web's labels
    // change in place (no new generation). Resuming gets what was missed and no reset.
    let last = alices.last_id.expect("an id after the snapshot");
    let before = alices.table.clone();
    drop(alices);
    let second = entry_endpoints(&before[&("team-a".to_owned(), "web".to_owned())])
        .into_iter()
        .nth(1)
        .unwrap()
        .2;
    kill_replica_listening_on(&second).unwrap();
    let relabelled = labelled("web", "team-a", 3).replace("tier = \"1\"", "tier = \"2\"");
    assert_eq!(alice.put_toml("web", &relabelled).await.unwrap().0, 200);
    eventually("web relabelled and 3 ready again, over REST", || async {
        let e = alice.get_json("/v1/services/web/endpoints").await?;
        Ok((e["meta"]["tier"] == "2"
            && entry_endpoints(&e).len() == 3
            && !entry_endpoints(&e).iter().any(|(_, _, a)| *a == second))
        .then_some(()))
    })
    .await;
    let want = listed(&alice).await;
    let mut resumed = Stream::open(&alice, "/v1/endpoints/stream", Some(last))
        .await
        .unwrap();
    resumed.table = before;
    resumed
        .until("the resumed stream to match /v1/endpoints", |t| *t == want)
        .await;
    assert!(
        resumed.seen.iter().all(|e| e.event.is_none()),
        "no reset on a resume: {:?}",
        resumed.seen
    );
    assert!(
        resumed.seen.iter().all(|e| e.id.is_none_or(|id| id > last)),
        "only what came after {last}: {:?}",
        resumed.seen
    );
    let generations: Vec<u64> = want[&("team-a".to_owned(), "web".to_owned())]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["generation"].as_u64().unwrap())
        .collect();
    assert_eq!(generations, [1, 1, 1], "a meta change rolls nothing");

    // Team-a's service goes; then a change of bob's own: bob's stream shows only that.
    assert_eq!(alice.delete("/v1/services/web").await.unwrap(), 202);
    eventually("web gone", || async {
        Ok((alice.get("/v1/services/web/endpoints").await?.0 == 404).then_some(()))
    })
    .await;
    let bobs_api = entry_endpoints(&bobs.table[&("team-b".to_owned(), "api".to_owned())])
        .into_iter()
        .next()
        .unwrap()
        .2;
    kill_replica_listening_on(&bobs_api).unwrap();
    bobs.until("bob's api replica to go", |t| {
        ready_count(t, "team-b", "api") == 0
    })
    .await;
    for ev in &bobs.seen {
        assert_eq!(ev.data["project"], "team-b", "bob saw {ev:?}");
    }

    // Bad input: clear 400s, and unknown or invisible names are simply absent.
    let many: Vec<String> = (0..1001).map(|i| format!("s{i}")).collect();
    for (path, last_id, field) in [
        (
            format!("/v1/endpoints/stream?service={}", many.join(",")),
            None,
            "service",
        ),
        (
            "/v1/endpoints/stream".to_owned(),
            Some("x1"),
            "Last-Event-ID",
        ),
    ] {
        let mut req = bob
            .http
            .get(format!("{}{path}", bob.base))
            .bearer_auth(&bob.token);
        if let Some(id) = last_id {
            req = req.header("last-event-id", id);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["details"][0]["field"], field, "{body}");
    }
    let five_hundred: Vec<String> = (0..500).map(|i| format!("s{i}")).collect();
    let mut named = Stream::open(
        &bob,
        &format!(
            "/v1/endpoints/stream?service=web,api,{}",
            five_hundred.join(",")
        ),
        None,
    )
    .await
    .unwrap();
    named.until("api", |t| t.len() == 1).await;
    assert_eq!(
        named.table.keys().collect::<Vec<_>>(),
        [&("team-b".to_owned(), "api".to_owned())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_stream_on_a_separate_apiserver_on_etcd() {
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut ha = Fleet::new(etcd, 2, 1).expect("fleet dir");
    ha.start_leader_and_standby().await;
    ha.start_apiserver(0).unwrap();
    ha.start_workers(2).unwrap();
    let api = ha.apiserver(0);
    let controller = ha.controller_api(0);
    eventually("2 ready hosts through the apiserver", || async {
        let h = api.get_json("/v1/hosts").await?;
        Ok((h["hosts"].as_array().map_or(0, |a| a.len()) == 2).then_some(()))
    })
    .await;
    assert_eq!(
        api.submit_toml(&labelled("web", "default", 2))
            .await
            .unwrap()
            .0,
        201
    );
    let mut on_apiserver = Stream::open(&api, "/v1/endpoints/stream", None)
        .await
        .unwrap();
    on_apiserver
        .until("web with 2 endpoints on the apiserver", |t| {
            ready_count(t, "default", "web") == 2
        })
        .await;
    let web = on_apiserver.table[&("default".to_owned(), "web".to_owned())].clone();
    assert_eq!(web["meta"]["team"], "payments");

    // The controller's own stream, resumed from the apiserver's id: the ids are the same
    // cluster revisions there, so nothing is missing and nothing resets.
    let last = on_apiserver.last_id.unwrap();
    let victim = entry_endpoints(&web).into_iter().next().unwrap().2;
    kill_replica_listening_on(&victim).unwrap();
    let mut on_controller = Stream::open(&controller, "/v1/endpoints/stream", Some(last))
        .await
        .unwrap();
    on_controller.table = on_apiserver.table.clone();
    for s in [&mut on_apiserver, &mut on_controller] {
        s.until("the killed replica gone", |t| {
            t.get(&("default".to_owned(), "web".to_owned()))
                .is_some_and(|e| !entry_endpoints(e).iter().any(|(_, _, a)| *a == victim))
        })
        .await;
        s.until("web back to 2", |t| ready_count(t, "default", "web") == 2)
            .await;
    }
    assert!(
        on_controller.seen.iter().all(|e| e.event.is_none()),
        "no reset: {:?}",
        on_controller.seen
    );
    // Both reach the same state at the same revision.
    let want = listed(&api).await;
    on_apiserver.until("apiserver = list", |t| *t == want).await;
    on_controller
        .until("controller = list", |t| *t == want)
        .await;
    assert_eq!(
        want[&("default".to_owned(), "web".to_owned())]["index"],
        listed(&controller).await[&("default".to_owned(), "web".to_owned())]["index"]
    );
}
