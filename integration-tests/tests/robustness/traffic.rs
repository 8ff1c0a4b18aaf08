//! The recorded traffic: a writer (submits, updates — some broken, so they revert —,
//! scales, restarts, stops), readers of every kind (endpoint reads in JSON and plain,
//! blocking queries, per-service and all-services streams that break off and resume with
//! `Last-Event-ID`), a load client sending requests to the endpoints it was handed, and a
//! sampler of the service list. Every task runs until `stop` and appends to the recorder.

use crate::harness::{entry_endpoints, monotonic_ns, sse_open, Api};
use crate::history::{
    Assign, Op, PoolSample, Read, ReadKind, Recorder, Request, Sample, SockSample,
};
use crate::replica::Replicas;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What every task shares.
#[derive(Clone)]
pub struct Ctx {
    pub api: Api,
    pub rec: Recorder,
    pub stop: Arc<AtomicBool>,
    conns: Arc<AtomicU64>,
}

impl Ctx {
    pub fn new(api: Api, rec: Recorder) -> Self {
        Self {
            api,
            rec,
            stop: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(AtomicU64::new(1)),
        }
    }
    /// The same context (stop, recorder) on another API.
    pub fn with_api(&self, api: Api) -> Self {
        Self {
            api,
            ..self.clone()
        }
    }
    /// The same context with a stop of its own (the writer stops before the readers).
    pub fn with_own_stop(&self) -> Self {
        Self {
            stop: Arc::new(AtomicBool::new(false)),
            ..self.clone()
        }
    }
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    fn conn(&self) -> u64 {
        self.conns.fetch_add(1, Ordering::Relaxed)
    }
    async fn pause(&self, ms: u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

/// The services of a run and how their replicas behave.
#[derive(Debug, Clone)]
pub struct Service {
    pub name: String,
    pub mode: &'static str,
    pub replicas: u32,
}

/// The writer's view of one service.
struct Written {
    exists: bool,
    generation: u64,
    /// The replicas the last acknowledged write asked for: a broken update keeps them
    /// (its revert restores the old profile's count, which is the same).
    replicas: u32,
}

/// One write, recorded with its call and return times; `None` status: no answer.
async fn write(
    ctx: &Ctx,
    kind: &str,
    service: &str,
    replicas: Option<u32>,
    send: impl std::future::Future<Output = anyhow::Result<u16>>,
) -> bool {
    let call_ns = monotonic_ns();
    let status = send.await.ok();
    let op = Op {
        call_ns,
        ret_ns: monotonic_ns(),
        kind: kind.to_owned(),
        service: service.to_owned(),
        status,
        replicas,
    };
    let acked = op.acked();
    ctx.rec.with(|h| h.ops.push(op));
    acked
}

/// The services' drain: the time between leaving the endpoint and SIGTERM.
pub const DRAIN: &str = "1s";

/// Submits every service, then changes them at random until `stop`.
pub async fn writer(ctx: Ctx, reps: Arc<Replicas>, services: Vec<Service>, mut rng: fastrand::Rng) {
    let mut state: BTreeMap<String, Written> = BTreeMap::new();
    for s in &services {
        let p = reps.profile(&s.name, s.replicas, s.mode, "g1", DRAIN);
        let acked = write(&ctx, "submit", &s.name, Some(s.replicas), async {
            Ok(ctx.api.submit_toml(&p).await?.0)
        })
        .await;
        let w = Written {
            exists: acked,
            generation: 1,
            replicas: s.replicas,
        };
        state.insert(s.name.clone(), w);
    }
    let hosts = host_ids(&ctx.api).await;
    let mut maintained: Option<String> = None;
    while !ctx.stopped() {
        ctx.pause(rng.u64(400..1500)).await;
        if !hosts.is_empty() && rng.u8(..100) < 8 {
            host_op(&ctx, &hosts, &mut maintained, &mut rng).await;
            continue;
        }
        let s = &services[rng.usize(..services.len())];
        let w = state.get_mut(&s.name).expect("every service has a state");
        change(&ctx, &reps, s, w, &mut rng).await;
    }
    // The host under maintenance takes placements again before the cluster is judged
    // (an answer is waited for: the faults have stopped by now).
    if let Some(host) = maintained {
        let deadline = tokio::time::Instant::now() + crate::harness::patience();
        let path = format!("/v1/hosts/{host}/uncordon");
        let op = format!("host:{host}");
        while !write(&ctx, "uncordon", &op, None, post(&ctx.api, &path)).await
            && tokio::time::Instant::now() < deadline
        {
            ctx.pause(200).await;
        }
    }
}

/// The ids of the hosts `GET /v1/hosts` lists (none when it does not answer).
async fn host_ids(api: &Api) -> Vec<String> {
    let Ok(v) = api.get_json("/v1/hosts").await else {
        return Vec::new();
    };
    v["hosts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["id"].as_str().map(str::to_owned))
        .collect()
}

/// Host maintenance, one host at a time: a cordon or a drain of a random host when none
/// is under maintenance, else an uncordon of the one that is. Recorded as writes on
/// `host:<id>` (no service's expected state changes).
async fn host_op(
    ctx: &Ctx,
    hosts: &[String],
    maintained: &mut Option<String>,
    rng: &mut fastrand::Rng,
) {
    let (kind, host) = match maintained.take() {
        Some(h) => ("uncordon", h),
        None => (
            ["cordon", "drain"][rng.usize(..2)],
            hosts[rng.usize(..hosts.len())].clone(),
        ),
    };
    let path = format!("/v1/hosts/{host}/{kind}");
    let acked = write(
        ctx,
        kind,
        &format!("host:{host}"),
        None,
        post(&ctx.api, &path),
    )
    .await;
    // Unless an uncordon was acknowledged, the host may be under maintenance.
    if !(kind == "uncordon" && acked) {
        *maintained = Some(host);
    }
}

/// One random change of `s`: a submit when it is stopped, else an update (35 %), a broken
/// update (10 %, ordinary services), a scale (30 %), a restart (12 %) or a stop (8 %).
async fn change(ctx: &Ctx, reps: &Replicas, s: &Service, w: &mut Written, rng: &mut fastrand::Rng) {
    let api = &ctx.api;
    let name = s.name.as_str();
    if !w.exists {
        let p = reps.profile(
            name,
            w.replicas,
            s.mode,
            &format!("g{}", w.generation),
            DRAIN,
        );
        // Refused (409) while the stopped service is still stopping: tried again later.
        w.exists = write(ctx, "submit", name, Some(w.replicas), async {
            Ok(api.submit_toml(&p).await?.0)
        })
        .await;
        return;
    }
    let replicas = rng.u32(1..=3);
    match rng.u8(..100) {
        0..=34 => {
            w.generation += 1;
            let p = reps.profile(name, replicas, s.mode, &format!("g{}", w.generation), DRAIN);
            if write(ctx, "update", name, Some(replicas), async {
                Ok(api.put_toml(name, &p).await?.0)
            })
            .await
            {
                w.replicas = replicas;
            }
        }
        35..=44 if s.mode == "normal" => {
            let p = reps.profile(name, w.replicas, "broken", "broken", DRAIN);
            let _ = write(ctx, "broken-update", name, Some(w.replicas), async {
                Ok(api.put_toml(name, &p).await?.0)
            })
            .await;
        }
        45..=74 => {
            let scale = async { Ok(api.scale(name, replicas).await?.0) };
            let acked = write(ctx, "scale", name, Some(replicas), scale).await;
            w.replicas = if acked { replicas } else { w.replicas };
        }
        75..=86 => {
            let path = format!("/v1/services/{name}/restart");
            let _ = write(ctx, "restart", name, None, async { post(api, &path).await }).await;
        }
        87..=94 => {
            let path = format!("/v1/services/{name}");
            w.exists = !write(ctx, "stop", name, None, async { api.delete(&path).await }).await;
        }
        _ => {}
    }
}

async fn post(api: &Api, path: &str) -> anyhow::Result<u16> {
    let r = api
        .http
        .post(format!("{}{path}", api.base))
        .bearer_auth(&api.token)
        .send()
        .await?;
    Ok(r.status().as_u16())
}

/// The index an answer carries (`X-Xce-Index`).
fn header_index(headers: &reqwest::header::HeaderMap) -> u64 {
    headers
        .get("x-xce-index")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn addrs(entry: &Value) -> Vec<String> {
    entry_endpoints(entry)
        .into_iter()
        .map(|(_, _, a)| a)
        .collect()
}

/// Reads `service`'s endpoints over and over: plain, JSON, or as a chain of blocking
/// queries (each asking past the last index it got).
pub async fn reader(ctx: Ctx, service: String, kind: ReadKind, mut rng: fastrand::Rng) {
    let reader = format!("{kind:?}-{service}").to_lowercase();
    let mut last = 0u64;
    while !ctx.stopped() {
        let conn = ctx.conn();
        let call_ns = monotonic_ns();
        let asked = last;
        let path = match kind {
            ReadKind::Plain => format!("/v1/services/{service}/endpoints?format=plain"),
            ReadKind::Blocking => format!("/v1/services/{service}/endpoints?index={last}&wait=3s"),
            _ => format!("/v1/services/{service}/endpoints"),
        };
        let Ok((200, headers, body)) = ctx.api.get(&path).await else {
            ctx.pause(200).await;
            continue;
        };
        let index = header_index(&headers);
        let endpoints = if kind == ReadKind::Plain {
            body.lines().map(str::to_owned).collect()
        } else {
            serde_json::from_str(&body)
                .map(|e| addrs(&e))
                .unwrap_or_default()
        };
        last = index;
        let read = Read {
            reader: reader.clone(),
            kind,
            conn,
            call_ns,
            ret_ns: monotonic_ns(),
            service: service.clone(),
            index,
            event_id: None,
            asked: (kind == ReadKind::Blocking).then_some(asked),
            endpoints,
            deleted: false,
            after_reset: false,
        };
        ctx.rec.with(|h| h.reads.push(read));
        if kind != ReadKind::Blocking {
            ctx.pause(rng.u64(50..250)).await;
        }
    }
}

/// One SSE event: its type (`event:`), id and data.
#[derive(Default)]
struct SseEvent {
    kind: Option<String>,
    id: Option<u64>,
    data: String,
}

/// Splits complete SSE events off `buf`.
fn sse_events(buf: &mut String) -> Vec<SseEvent> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let block: String = buf.drain(..end + 2).collect();
        let mut e = SseEvent::default();
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                e.id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("event:") {
                e.kind = Some(v.trim().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                e.data.push_str(v.trim_start());
            }
        }
        if e.id.is_some() || !e.data.is_empty() || e.kind.is_some() {
            out.push(e);
        }
    }
    out
}

/// A stream reader: `service`'s stream, or (`None`) the all-services stream. It breaks
/// the connection off after a few seconds, or when the server ends it, and resumes with
/// `Last-Event-ID` of the last event id it got.
pub async fn streamer(ctx: Ctx, service: Option<String>, mut rng: fastrand::Rng) {
    let (reader, path, kind) = match &service {
        Some(s) => (
            format!("stream-{s}"),
            format!("/v1/services/{s}/endpoints/stream"),
            ReadKind::Stream,
        ),
        None => (
            "all-stream".to_owned(),
            "/v1/endpoints/stream".to_owned(),
            ReadKind::AllStream,
        ),
    };
    let mut last_id: Option<u64> = None;
    while !ctx.stopped() {
        let conn = ctx.conn();
        let call_ns = monotonic_ns();
        let Ok(mut resp) = sse_open(&ctx.api, &path, last_id).await else {
            ctx.pause(200).await;
            continue;
        };
        let until = tokio::time::Instant::now() + Duration::from_millis(rng.u64(2000..8000));
        let mut buf = String::new();
        let mut reset = false;
        loop {
            let chunk = tokio::select! {
                c = resp.chunk() => c,
                () = tokio::time::sleep_until(until) => break,
            };
            let Ok(Some(chunk)) = chunk else { break };
            buf.push_str(&String::from_utf8_lossy(&chunk));
            for e in sse_events(&mut buf) {
                if e.kind.as_deref() == Some("reset") {
                    reset = true;
                    continue;
                }
                if e.kind.is_some() {
                    continue;
                }
                let Ok(entry) = serde_json::from_str::<Value>(&e.data) else {
                    continue;
                };
                let read = Read {
                    reader: reader.clone(),
                    kind,
                    conn,
                    call_ns,
                    ret_ns: monotonic_ns(),
                    service: entry["service"].as_str().unwrap_or_default().to_owned(),
                    index: entry["index"].as_u64().unwrap_or(0),
                    event_id: e.id,
                    asked: last_id,
                    endpoints: addrs(&entry),
                    deleted: entry["deleted"] == true,
                    after_reset: std::mem::take(&mut reset),
                };
                ctx.rec.with(|h| h.reads.push(read));
                last_id = e.id.or(last_id);
            }
            if ctx.stopped() {
                break;
            }
        }
    }
}

/// The load client of `service`: refreshes its endpoint list (plain) every second and
/// sends requests, each on a new connection, to a random endpoint of the list it has.
pub async fn load(ctx: Ctx, service: String, mut rng: fastrand::Rng) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .expect("load client");
    let mut list: Vec<String> = Vec::new();
    let mut list_ns = 0;
    let mut refreshed = tokio::time::Instant::now() - Duration::from_secs(10);
    while !ctx.stopped() {
        if refreshed.elapsed() >= Duration::from_secs(1) {
            refreshed = tokio::time::Instant::now();
            if let Ok(eps) = ctx.api.plain(&service).await {
                list = eps;
                list_ns = monotonic_ns();
            }
        }
        if list.is_empty() {
            ctx.pause(100).await;
            continue;
        }
        let addr = list[rng.usize(..list.len())].clone();
        let call_ns = monotonic_ns();
        let res = http.get(format!("http://{addr}/")).send().await;
        let (ok, error) = match res {
            Ok(r) if r.status() == 200 => (true, String::new()),
            Ok(r) => (false, format!("HTTP {}", r.status())),
            // A timeout is told apart: a replica that is alive but slow on a loaded
            // machine is not an endpoint that should not have been handed out.
            Err(e) if e.is_timeout() => (false, format!("timeout: {e:#}")),
            Err(e) => (false, format!("{e:#}")),
        };
        let q = Request {
            call_ns,
            ret_ns: monotonic_ns(),
            addr,
            list_ns,
            ok,
            error,
        };
        ctx.rec.with(|h| h.requests.push(q));
        ctx.pause(rng.u64(20..80)).await;
    }
}

/// Samples the replicas' liveness on its own, never behind an API call: a process found
/// gone is stamped with the pass before (the last time it was seen alive), so a pass
/// that waited on a paused apiserver for seconds stamped a replica's end seconds early,
/// before its own later `sigterm` line (an etcd-shape run: validator 2 then took the
/// replica for alive until the end of the run).
pub async fn liveness(ctx: Ctx, reps: Arc<Replicas>) {
    while !ctx.stopped() {
        reps.sample_gone(&ctx.rec);
        ctx.pause(100).await;
    }
}

/// Samples the service list (for the rollout validator) and the hosts' port pools.
pub async fn sampler(ctx: Ctx) {
    while !ctx.stopped() {
        let call_ns = monotonic_ns();
        if let Ok(hosts) = ctx.api.get_json("/v1/hosts").await {
            let ret_ns = monotonic_ns();
            let pools = hosts["hosts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|host| {
                    Some(PoolSample {
                        call_ns,
                        ret_ns,
                        ip: host["ip_addr"].as_str()?.to_owned(),
                        used: host["ports"]["used"].as_u64()?,
                    })
                });
            ctx.rec.with(|h| h.pools.extend(pools));
        }
        if let Ok(list) = ctx.api.get_json("/v1/services").await {
            let ns = monotonic_ns();
            let samples =
                summaries(&list)
                    .into_iter()
                    .map(|(service, s)| Sample { ns, service, ..s });
            ctx.rec.with(|h| h.samples.extend(samples));
        }
        ctx.pause(200).await;
    }
}

/// Each service of a `GET /v1/services` answer as a [`Sample`] (at time 0).
pub fn summaries(list: &Value) -> BTreeMap<String, Sample> {
    let mut out = BTreeMap::new();
    for s in list["services"].as_array().into_iter().flatten() {
        let name = s["name"].as_str().unwrap_or_default().to_owned();
        let rollout = match &s["rollout"] {
            Value::String(st) => st.clone(),
            v => v["state"].as_str().unwrap_or_default().to_owned(),
        };
        let sample = Sample {
            ns: 0,
            service: name.clone(),
            replicas: s["replicas"].as_u64().unwrap_or(0) as u32,
            // Every profile of the suite says 1 (Replicas::profile).
            max_unavailable: 1,
            ready: s["ready"].as_u64().unwrap_or(0) as u32,
            rollout,
            generation: s["generation"].as_u64().unwrap_or(0),
        };
        if s["state"] != "stopping" {
            out.insert(name, sample);
        }
    }
    out
}

/// Follows the all-services stream with `include=all` and records each replica's address
/// the first time it is seen assigned (for validator 2).
pub async fn assignments(ctx: Ctx) {
    let mut seen = std::collections::BTreeSet::<(String, String)>::new();
    while !ctx.stopped() {
        let Ok(mut resp) = sse_open(&ctx.api, "/v1/endpoints/stream?include=all", None).await
        else {
            ctx.pause(200).await;
            continue;
        };
        let mut buf = String::new();
        while !ctx.stopped() {
            let chunk = tokio::select! {
                c = resp.chunk() => c,
                () = tokio::time::sleep(Duration::from_millis(500)) => continue,
            };
            let Ok(Some(chunk)) = chunk else { break };
            let ns = monotonic_ns();
            buf.push_str(&String::from_utf8_lossy(&chunk));
            for e in sse_events(&mut buf) {
                let Ok(entry) = serde_json::from_str::<Value>(&e.data) else {
                    continue;
                };
                let service = entry["service"].as_str().unwrap_or_default();
                for r in entry["endpoints"].as_array().into_iter().flatten() {
                    let job = r["job"].as_str().unwrap_or_default().to_owned();
                    let addr = format!(
                        "{}:{}",
                        r["address"].as_str().unwrap_or_default(),
                        r["ports"]["http"]
                    );
                    if r["ports"]["http"].is_u64() && seen.insert((job.clone(), addr.clone())) {
                        let a = Assign {
                            ns,
                            service: service.to_owned(),
                            job,
                            addr,
                        };
                        ctx.rec.with(|h| h.assigns.push(a));
                    }
                }
            }
        }
    }
}

/// Samples the listening sockets on the cluster's host addresses once a second
/// (`ss -ltnHp` and `ss -lunHp`: TCP and UDP, with the processes holding them), for
/// validator 2. Without `ss` it prints a `SKIPPED:` line and samples nothing.
pub async fn sockets(ctx: Ctx) {
    let mut ips: Vec<String> = Vec::new();
    while !ctx.stopped() {
        if ips.is_empty() {
            if let Ok(hosts) = ctx.api.get_json("/v1/hosts").await {
                ips = hosts["hosts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|h| h["ip_addr"].as_str().map(|ip| format!("{ip}:")))
                    .collect();
            }
        }
        for (proto, flags) in [("tcp", "-ltnHp"), ("udp", "-lunHp")] {
            let out = match tokio::process::Command::new("ss").arg(flags).output().await {
                Ok(o) if o.status.success() => o,
                other => {
                    println!("SKIPPED: ss samples of listening sockets: `ss {flags}`: {other:?}");
                    return;
                }
            };
            let ns = monotonic_ns();
            let text = String::from_utf8_lossy(&out.stdout);
            let socks: Vec<SockSample> = parse_ss(&text)
                .into_iter()
                .filter(|(addr, _)| ips.iter().any(|ip| addr.starts_with(ip.as_str())))
                .map(|(addr, pids)| SockSample {
                    ns,
                    proto,
                    addr,
                    pids,
                })
                .collect();
            ctx.rec.with(|h| h.socks.extend(socks));
        }
        ctx.pause(1000).await;
    }
}

/// `(local address, pids)` of each line of `ss -l…Hp` output.
pub fn parse_ss(text: &str) -> Vec<(String, Vec<u32>)> {
    text.lines()
        .filter_map(|l| {
            let local = l.split_whitespace().nth(3)?;
            let pids = l
                .split("pid=")
                .skip(1)
                .filter_map(|rest| {
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().ok()
                })
                .collect();
            Some((local.to_owned(), pids))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ss_lines_give_the_address_and_every_holding_pid() {
        let text = "LISTEN 0      4096   127.1.2.3:20001 0.0.0.0:* users:((\"python3\",pid=15253,fd=3),(\"python3\",pid=77,fd=3))\nUNCONN 0 0 127.1.2.3:20002 0.0.0.0:* users:((\"x\",pid=9,fd=5))\n";
        assert_eq!(
            super::parse_ss(text),
            vec![
                ("127.1.2.3:20001".to_owned(), vec![15253, 77]),
                ("127.1.2.3:20002".to_owned(), vec![9]),
            ]
        );
    }
}
