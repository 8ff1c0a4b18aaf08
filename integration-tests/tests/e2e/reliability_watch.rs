//! Issue 7, watchers: readiness flapping (scenario 3) and watch load with one client that
//! never reads (scenario 9).

use crate::harness::*;
use futures_util::StreamExt;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the replicas flap: the 30 s.
const FLAP_SECS: u64 = 30;

/// One event as a watcher saw it: index, when (monotonic ns), ready (replica, job, addr).
type Seen = (u64, u64, BTreeSet<(u64, String, String)>);

/// Scenario 3: four of six replicas flap every 100 ms (probe interval 100 ms) for
/// `FLAP_SECS`; a stream and a blocking watcher read the table throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flapping_readiness_converges_and_never_shows_an_unready_replica() {
    const REPLICAS: u32 = 6;
    const FLAPPING: u32 = 4;
    const INTERVAL: &str = "100ms";
    let rd = ReplicaDir::new();
    let c = DevCluster::start(2, false).expect("dev cluster");
    let api = c.api.clone();
    assert_eq!(
        api.submit_toml(&(rd.profile("flappy", REPLICAS, "0", INTERVAL, 0) + UNDER_LOAD_TIMEOUT))
            .await
            .unwrap()
            .0,
        201
    );
    api.wait_ready("flappy", REPLICAS as usize).await;

    let done = Arc::new(AtomicBool::new(false));
    let streamed: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let stream_task = {
        let (api, streamed, done) = (api.clone(), streamed.clone(), done.clone());
        tokio::spawn(async move {
            let resp = sse_open(&api, "/v1/services/flappy/endpoints/stream", None)
                .await
                .unwrap();
            let mut body = resp.bytes_stream();
            let mut parser = SseParser::default();
            while let Some(chunk) = body.next().await {
                let Ok(chunk) = chunk else { break };
                let now = monotonic_ns();
                for (id, data) in parser.push(&chunk) {
                    let entry: Value = serde_json::from_str(&data).unwrap();
                    streamed
                        .lock()
                        .unwrap()
                        .push((id, now, entry_endpoints(&entry)));
                }
                if done.load(Ordering::Relaxed) {
                    break;
                }
            }
        })
    };
    let blocking_task = {
        let (api, done) = (api.clone(), done.clone());
        tokio::spawn(async move {
            let mut seen: Vec<Seen> = Vec::new();
            let mut index = 0;
            while !done.load(Ordering::Relaxed) {
                let (st, h, body) = api
                    .get(&format!(
                        "/v1/services/flappy/endpoints?index={index}&wait=1s"
                    ))
                    .await
                    .unwrap();
                assert_eq!(st, 200, "{body}");
                let i: u64 = h["x-xce-index"].to_str().unwrap().parse().unwrap();
                let entry: Value = serde_json::from_str(&body).unwrap();
                assert_eq!(entry["index"].as_u64(), Some(i), "header and body agree");
                seen.push((i, monotonic_ns(), entry_endpoints(&entry)));
                index = i;
            }
            seen
        })
    };
    // Let the stream deliver its first event before the flapping starts.
    eventually("first stream event", || async {
        Ok((!streamed.lock().unwrap().is_empty()).then_some(()))
    })
    .await;

    for r in 0..FLAPPING {
        set_mode(&rd.ctl, "flappy", r, "flap");
    }
    tokio::time::sleep(Duration::from_secs(FLAP_SECS)).await; // the scenario's length
                                                              // The final truth: 0, 1 ready, 2, 3 not; 4, 5 never flapped.
    for (r, mode) in [(0, "up"), (1, "up"), (2, "down"), (3, "down")] {
        set_mode(&rd.ctl, "flappy", r, mode);
    }
    let stopped = monotonic_ns();
    let jobs = api.get_json("/v1/services/flappy").await.unwrap();
    let job_of: BTreeMap<u64, String> = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["replica"].as_u64().unwrap(),
                j["job"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        job_of.len(),
        REPLICAS as usize,
        "no replica was replaced: {jobs}"
    );
    let truth: BTreeSet<u64> = [0, 1, 4, 5].into();
    let converged = eventually("the table converges to the truth", || async {
        let e = api.get_json("/v1/services/flappy/endpoints").await?;
        let now = monotonic_ns();
        let ready: BTreeSet<u64> = entry_endpoints(&e).into_iter().map(|x| x.0).collect();
        Ok((ready == truth).then_some(now))
    })
    .await;
    // It stays there: five probe intervals go by without a change, and the table is the
    // truth. (A probe answered just before the modes changed may still flip a replica
    // once more; such a late flip is counted, and the table must come back.)
    let late_flips = std::cell::Cell::new(0u32);
    eventually("the table stays at the truth", || {
        let api = api.clone();
        let truth = truth.clone();
        let late_flips = &late_flips;
        async move {
            let (_, h, _) = api.get("/v1/services/flappy/endpoints").await?;
            let at: u64 = h["x-xce-index"].to_str()?.parse()?;
            let (st, h, body) = api
                .get(&format!(
                    "/v1/services/flappy/endpoints?index={at}&wait=500ms"
                ))
                .await?;
            anyhow::ensure!(st == 200, "HTTP {st}");
            let now: u64 = h["x-xce-index"].to_str()?.parse()?;
            let ready: BTreeSet<u64> = entry_endpoints(&serde_json::from_str(&body)?)
                .into_iter()
                .map(|x| x.0)
                .collect();
            if now != at {
                late_flips.set(late_flips.get() + 1);
                return Ok(None);
            }
            Ok((ready == truth).then_some(()))
        }
    })
    .await;
    done.store(true, Ordering::Relaxed);
    // The stream ends at its next event or when the cluster stops; do not wait for it.
    stream_task.abort();
    let blocking = blocking_task.await.unwrap();
    let streamed = streamed.lock().unwrap().clone();

    // 1. Indexes strictly increase on the stream and never decrease for the blocking watcher.
    assert!(
        streamed.windows(2).all(|w| w[0].0 < w[1].0),
        "stream indexes strictly increase"
    );
    assert!(
        blocking.windows(2).all(|w| w[0].0 <= w[1].0),
        "blocking indexes never decrease"
    );
    // 2. One index, one table: both surfaces agree wherever they saw the same index.
    let by_index: BTreeMap<u64, &BTreeSet<_>> = streamed.iter().map(|s| (s.0, &s.2)).collect();
    let mut common = 0;
    let mut disagreements = Vec::new();
    for (i, _, set) in &blocking {
        if let Some(s) = by_index.get(i) {
            common += 1;
            if *s != set {
                disagreements.push(format!("index {i}: stream {s:?}, blocking query {set:?}"));
            }
        }
    }
    // 3. Every time a replica (re)appears as ready, it had answered 200 to a probe before,
    //    and each appearance needs its own, later 200 (no stale "ready" replayed).
    let mut appearances = 0;
    let mut unready_shown = Vec::new();
    let mut probes = 0;
    let mut answers_200 = 0;
    for (&replica, job) in &job_of {
        let log: Vec<(u64, u64)> = replica_log(&rd.ctl, "flappy", job)
            .into_iter()
            .filter(|l| l.0 == "probe")
            .map(|l| (l.1, l.2[0]))
            .collect();
        probes += log.len();
        answers_200 += log.iter().filter(|l| l.1 == 200).count();
        let mut next = 0usize;
        let mut was_ready = false;
        for (i, recv, set) in &streamed {
            let ready = set.iter().any(|e| e.0 == replica && &e.1 == job);
            if ready && !was_ready {
                appearances += 1;
                let m = log[next..]
                    .iter()
                    .position(|l| l.1 == 200)
                    .map(|p| p + next);
                match m {
                    Some(q) if log[q].0 <= *recv => next = q + 1,
                    _ => unready_shown.push(format!(
                        "replica {replica} ready at index {i} without a 200 answer before it"
                    )),
                }
            }
            was_ready = ready;
        }
        // Every endpoint names one of the service's six jobs.
        for (i, _, set) in &streamed {
            for e in set {
                assert_eq!(job_of.get(&e.0), Some(&e.1), "index {i}: unknown job {e:?}");
            }
        }
    }
    let leaked = stop_all_and_count_leaks(&api).await;
    println!(
        "FIGURE scenario 3 readiness flapping: replicas={} flapping={FLAPPING} interval={INTERVAL} flap={FLAP_SECS}s probes={probes} (200s={answers_200}) stream_events={} blocking_answers={} common_indexes={common} disagreements={} unready_shown={} ready_appearances_checked={appearances} converged_after={:?} (probe interval {INTERVAL}) late_flips_after_convergence={} leaked_ports={leaked}",
        job_of.len(),
        streamed.len(),
        blocking.len(),
        disagreements.len(),
        unready_shown.len(),
        Duration::from_nanos(converged.saturating_sub(stopped)),
        late_flips.get(),
    );
    assert!(
        disagreements.is_empty(),
        "stream and blocking query disagree: {disagreements:?}"
    );
    assert!(unready_shown.is_empty(), "{unready_shown:?}");
}

/// Watches `path` and reports (watcher, index, when) for every event.
fn spawn_watcher(
    api: Api,
    path: String,
    w: usize,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, u64, Instant)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(resp) = sse_open(&api, &path, None).await else {
            return;
        };
        let mut body = resp.bytes_stream();
        let mut parser = SseParser::default();
        while let Some(Ok(chunk)) = body.next().await {
            let now = Instant::now();
            for (id, _) in parser.push(&chunk) {
                if tx.send((w, id, now)).is_err() {
                    return;
                }
            }
        }
    })
}

/// Turns the calm replica's readiness to the opposite of what the endpoint table shows.
///
/// Not a blind alternation: under load a probe can time out, so the replica may flip by
/// itself, and a write equal to its state would change nothing and leave the watchers
/// waiting for an event that never comes. Writing the opposite of the table always yields
/// an event: either this write changes the state, or a change the table has not shown yet
/// is on its way.
async fn flip_calm(api: &Api, ctl: &std::path::Path) {
    let (st, _, body) = api
        .get("/v1/services/calm/endpoints?format=plain")
        .await
        .expect("calm endpoints");
    assert_eq!(st, 200, "calm endpoints: {body}");
    let ready = body.lines().count() > 0;
    set_mode(ctl, "calm", 0, if ready { "down" } else { "up" });
}

/// Waits until every one of `n` watchers has seen an index above `above`; returns the
/// highest such index and each watcher's latency from `since`.
async fn all_saw(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(usize, u64, Instant)>,
    last: &mut [u64],
    above: u64,
    since: Instant,
) -> (u64, Vec<Duration>, Vec<Duration>) {
    let mut lat = vec![None; last.len()];
    for (w, l) in last.iter().enumerate() {
        if *l > above {
            lat[w] = Some(Duration::ZERO);
        }
    }
    let mut missing = lat.iter().filter(|l| l.is_none()).count();
    let deadline = tokio::time::Instant::now() + patience();
    while missing > 0 {
        let (w, id, at) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{missing} watchers never saw an index above {above}"))
            .expect("watchers alive");
        assert!(
            id > last[w] || last[w] == 0,
            "watcher {w}: index {id} after {}",
            last[w]
        );
        last[w] = last[w].max(id);
        if id > above && lat[w].is_none() {
            lat[w] = Some(at.saturating_duration_since(since));
            missing -= 1;
        }
    }
    let mut lat: Vec<Duration> = lat.into_iter().map(Option::unwrap).collect();
    lat.sort();
    // The fan-out spread: how much later than the first watcher each one got the change
    // (free of the probe's delay, which every watcher shares).
    let spread = lat.iter().map(|l| *l - lat[0]).collect();
    (last.iter().copied().min().unwrap(), lat, spread)
}

/// Scenario 9: 1,000 stream watchers of a quiet service, one client that never reads a
/// busy service's stream; the slow one is cut off with a resumable position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_watcher_is_cut_off_and_a_thousand_others_keep_up() {
    const WATCHERS: usize = 1000;
    const TOGGLES: usize = 8;
    let rd = ReplicaDir::new();
    let c = DevCluster::start(1, false).expect("dev cluster");
    let api = c.api.clone();
    let pid = c.child.id();
    // churn: 8 replicas with 31 ports each (a fat entry), readiness toggling every probe.
    assert_eq!(
        api.submit_toml(&(rd.profile("calm", 1, "0", "100ms", 0) + UNDER_LOAD_TIMEOUT))
            .await
            .unwrap()
            .0,
        201
    );
    assert_eq!(
        api.submit_toml(&(rd.profile("churn", 8, "0", "100ms", 30) + UNDER_LOAD_TIMEOUT))
            .await
            .unwrap()
            .0,
        201
    );
    api.wait_ready("calm", 1).await;
    eventually("8 ready churn replicas", || async {
        let (st, _, body) = api
            .get("/v1/services/churn/endpoints?format=plain&port=http")
            .await?;
        Ok((st == 200 && body.lines().count() == 8).then_some(()))
    })
    .await;
    let rss_start = rss_kib(pid);

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watchers: Vec<_> = (0..WATCHERS)
        .map(|w| {
            spawn_watcher(
                api.clone(),
                "/v1/services/calm/endpoints/stream".into(),
                w,
                tx.clone(),
            )
        })
        .collect();
    drop(tx);
    let mut last = vec![0u64; WATCHERS];
    let (mut index, _, _) = all_saw(&mut rx, &mut last, 0, Instant::now()).await;
    let rss_watchers = rss_kib(pid);
    for r in 0..8 {
        set_mode(&rd.ctl, "churn", r, "toggle");
    }

    // Phase A: churn running, no slow client.
    let mut lat_a = Vec::new();
    let mut spread_a = Vec::new();
    for _ in 0..TOGGLES {
        flip_calm(&api, &rd.ctl).await;
        let (i, lat, spread) = all_saw(&mut rx, &mut last, index, Instant::now()).await;
        index = i;
        lat_a.extend(lat);
        spread_a.extend(spread);
    }

    // Phase B: a client that asks for the churn stream and never reads.
    let slots_before = metric(&api, "xce_endpoint_watchers").await.unwrap();
    // A fast reader of churn counts its updates (one event each): how far behind the slow
    // client is, in the unit `stream_buffer` counts (the index is a global revision and
    // moves with other services too).
    let churn_updates = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = {
        let (api, n) = (api.clone(), churn_updates.clone());
        tokio::spawn(async move {
            let resp = sse_open(&api, "/v1/services/churn/endpoints/stream", None)
                .await
                .unwrap();
            let mut body = resp.bytes_stream();
            let mut parser = SseParser::default();
            while let Some(Ok(chunk)) = body.next().await {
                n.fetch_add(parser.push(&chunk).len() as u64, Ordering::Relaxed);
            }
        })
    };
    let addr: std::net::SocketAddrV4 = api.base.trim_start_matches("http://").parse().unwrap();
    let mut slow = small_window_connect(addr).unwrap();
    write!(
        slow,
        "GET /v1/services/churn/endpoints/stream?include=all HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\n\r\n",
        api.token
    )
    .unwrap();
    let lagged_before = metric(&api, "xce_endpoint_streams_lagged").await.unwrap();
    let connected_at = churn_index_now(&api).await;
    let mut lat_b = Vec::new();
    let mut spread_b = Vec::new();
    for _ in 0..TOGGLES {
        flip_calm(&api, &rd.ctl).await;
        let (i, lat, spread) = all_saw(&mut rx, &mut last, index, Instant::now()).await;
        index = i;
        lat_b.extend(lat);
        spread_b.extend(spread);
    }
    // The server's socket to the slow client fills up (its send queue stops growing while
    // churn goes on); then churn goes on for well over `stream_buffer` (64) more changes.
    let server_port = addr.port();
    let client_port = slow.local_addr().unwrap().port();
    let churn_index = || async {
        let (_, h, _) = api.get("/v1/services/churn/endpoints").await?;
        Ok::<u64, anyhow::Error>(h["x-xce-index"].to_str()?.parse()?)
    };
    let samples: std::cell::RefCell<Vec<(u64, u64)>> = Default::default();
    let (stalled_at, queued) = eventually("the slow client's socket is full", || {
        let sample = tx_queue(server_port, client_port);
        let fut = churn_index();
        let samples = &samples;
        async move {
            let i = fut.await?;
            let q = sample.unwrap_or(0);
            samples.borrow_mut().push((i, q));
            // Stalled: the queue has not moved while 20 changes went by.
            let first_same = samples
                .borrow()
                .iter()
                .find(|s| s.1 == q)
                .map_or(i, |s| s.0);
            if q > 0 && i >= first_same + 20 {
                return Ok(Some((first_same, q)));
            }
            anyhow::bail!("send queue {q} bytes at churn index {i} (same since {first_same})")
        }
    })
    .await;
    let mut lat_b2 = Vec::new();
    let mut spread_b2 = Vec::new();
    // Updates the stream had no chance to send: the stall, plus what hyper may still have
    // pulled into its own write buffer (a few dozen events), plus `stream_buffer` (64).
    const MARGIN: u64 = 200;
    let updates_at_stall = churn_updates.load(Ordering::Relaxed);
    let churn_deadline = Instant::now() + patience();
    // How many churn updates after the stall the server had cut the slow client off by
    // (its stream's watchdog follows the service, not the socket).
    let mut cut_within = None;
    loop {
        let ci = churn_index().await.unwrap();
        let updates = churn_updates.load(Ordering::Relaxed) - updates_at_stall;
        if cut_within.is_none()
            && metric(&api, "xce_endpoint_streams_lagged").await.unwrap() > lagged_before
        {
            cut_within = Some(updates);
        }
        if updates >= MARGIN {
            break;
        }
        assert!(
            Instant::now() < churn_deadline,
            "churn stopped at index {ci}"
        );
        flip_calm(&api, &rd.ctl).await;
        let (i, lat, spread) = all_saw(&mut rx, &mut last, index, Instant::now()).await;
        index = i;
        lat_b2.extend(lat);
        spread_b2.extend(spread);
    }
    lat_b.extend(lat_b2);
    spread_b.extend(spread_b2);
    let churn_at_cut = churn_index().await.unwrap();
    let lagged_while_not_reading =
        metric(&api, "xce_endpoint_streams_lagged").await.unwrap() - lagged_before;
    let rss_cut = rss_kib(pid);
    let slots_stalled = metric(&api, "xce_endpoint_watchers").await.unwrap();
    // Cut off while it still does not read: counted once, and its place is free (the
    // 1,000 watchers and the counting stream remain).
    assert_eq!(
        lagged_while_not_reading, 1.0,
        "the slow client, {MARGIN}+ updates behind and not reading, was cut off"
    );
    assert_eq!(
        slots_stalled,
        slots_before + 1.0,
        "the cut-off client's watcher place was freed while it did not read"
    );
    let cut_within = cut_within.unwrap_or(MARGIN);

    // The slow client reads at last: a whole number of events (what the kernel and hyper
    // still held), then the end of the stream (the stream, cut off already, ends the body
    // at hyper's next poll).
    let _ = rustix::net::sockopt::set_socket_recv_buffer_size(&slow, 1 << 20);
    slow.set_read_timeout(Some(patience())).unwrap();
    // The end of the stream is its last chunk (the connection itself may stay open for
    // another request, HTTP/1.1 keep-alive). Catching up with the current index instead
    // would mean the server let it lag.
    let target = churn_index_now(&api).await;
    let mut raw = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut max_id = 0u64;
    let read_deadline = Instant::now() + patience();
    slow.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let cut_on_read = loop {
        assert!(
            Instant::now() < read_deadline,
            "the slow client neither caught up nor was cut off"
        );
        match slow.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => {
                let from = raw.len().saturating_sub(32);
                raw.extend_from_slice(&buf[..n]);
                if raw.ends_with(b"\r\n0\r\n\r\n") {
                    break true;
                }
                let text = String::from_utf8_lossy(&raw[from..]);
                for line in text.split('\n') {
                    if let Some(id) = line
                        .strip_prefix("id: ")
                        .and_then(|v| v.trim().parse::<u64>().ok())
                    {
                        max_id = max_id.max(id);
                    }
                }
                if max_id >= target {
                    break false;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => {}
        }
    };
    drop(slow);
    counter.abort();
    assert!(
        cut_on_read,
        "the slow client, {MARGIN}+ updates behind, was cut off when it read again"
    );
    let lagged = metric(&api, "xce_endpoint_streams_lagged").await.unwrap() - lagged_before;
    assert!(
        lagged <= 1.0,
        "no normal watcher was cut off: {lagged} lagged streams"
    );
    let (head, body) = http_body(&raw);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let got = SseParser::default().push(&body);
    let resume_from = got
        .last()
        .map(|e| e.0)
        .expect("the slow client got some events");
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
    // It resumes from its last event id and gets the current entry at once.
    let resp = sse_open(
        &api,
        "/v1/services/churn/endpoints/stream?include=all",
        Some(resume_from),
    )
    .await
    .unwrap();
    let mut resumed = resp.bytes_stream();
    let mut parser = SseParser::default();
    let first = loop {
        let chunk = resumed.next().await.expect("resumed stream event").unwrap();
        if let Some(e) = parser.push(&chunk).into_iter().next() {
            break e;
        }
    };
    assert!(
        first.0 > resume_from,
        "resumed at {} after {resume_from}",
        first.0
    );
    drop(resumed);

    // Phase C: after the cut-off.
    let mut lat_c = Vec::new();
    let mut spread_c = Vec::new();
    for _ in 0..TOGGLES {
        flip_calm(&api, &rd.ctl).await;
        let (i, lat, spread) = all_saw(&mut rx, &mut last, index, Instant::now()).await;
        index = i;
        lat_c.extend(lat);
        spread_c.extend(spread);
    }
    for r in 0..8 {
        set_mode(&rd.ctl, "churn", r, "up");
    }

    // Nobody else was cut off: all 1,000 watchers are still there and get the next change.
    flip_calm(&api, &rd.ctl).await;
    let (_final_index, _, _) = all_saw(&mut rx, &mut last, index, Instant::now()).await;
    let lagged = metric(&api, "xce_endpoint_streams_lagged").await.unwrap() - lagged_before;
    assert!(lagged <= 1.0, "only the slow client may have been cut off");
    let rss_end = rss_kib(pid);
    for w in watchers {
        w.abort();
    }
    assert!(
        rss_end < rss_start + 256 * 1024,
        "server memory bounded: {rss_start} KiB → {rss_end} KiB"
    );
    let leaked = stop_all_and_count_leaks(&api).await;
    for v in [
        &mut lat_a,
        &mut lat_b,
        &mut lat_c,
        &mut spread_a,
        &mut spread_b,
        &mut spread_c,
    ] {
        v.sort();
    }
    let f = |l: &[Duration]| {
        format!(
            "p50={:?} p99={:?} max={:?}",
            pct(l, 50),
            pct(l, 99),
            pct(l, 100)
        )
    };
    println!(
        "FIGURE scenario 9 watch load: watchers={WATCHERS} final_index={} all_got_every_change=yes slow_client: connected at churn index {connected_at}, socket full at {stalled_at} with {queued} bytes queued, cut_off_while_not_reading={} (within {cut_within} updates after the stall, stream_buffer=64; churn index {churn_at_cut}), cut_off_when_it_read_again={} ({MARGIN}+ updates behind) after {} events (last id {resume_from}), resumed_at={} lagged_streams={lagged} watcher_slots before_slow={slots_before} while_slow_stalled={slots_stalled} (watchers + counting stream; the cut-off slow client's place freed) latency(toggle→all watchers, includes the ≤100ms probe) before_slow: {} with_slow: {} after_slow_gone: {}; fan-out spread (first→each watcher) before_slow: {} with_slow: {} after_slow_gone: {}; rss_kib start={rss_start} 1000_watchers={rss_watchers} at_cut={rss_cut} end={rss_end} leaked_ports={leaked}",
        index,
        if lagged_while_not_reading > 0.0 { "yes" } else { "NO" },
        if cut_on_read { "yes" } else { "NO" },
        got.len(),
        first.0,
        f(&lat_a),
        f(&lat_b),
        f(&lat_c),
        f(&spread_a),
        f(&spread_b),
        f(&spread_c),
    );
}

async fn churn_index_now(api: &Api) -> u64 {
    let (_, h, _) = api.get("/v1/services/churn/endpoints").await.unwrap();
    h["x-xce-index"].to_str().unwrap().parse().unwrap()
}

/// The server-side send queue (bytes not yet acknowledged) of a loopback connection,
/// from /proc/net/tcp.
fn tx_queue(server_port: u16, client_port: u16) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/tcp").ok()?;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let port = |a: &str| {
            a.rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok())
        };
        if f.len() > 4 && port(f[1]) == Some(server_port) && port(f[2]) == Some(client_port) {
            let (tx, _) = f[4].split_once(':')?;
            return u64::from_str_radix(tx, 16).ok();
        }
    }
    None
}

/// Probe thresholds: a replica whose probe answers 200 and 503 by turns stays in its
/// endpoint with `failure_threshold = 3` (never three failures in a row), and never enters
/// it with `success_threshold = 2` (never two successes in a row). With the default of
/// one probe, the same replica would flip at every probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_thresholds_keep_a_flickering_replica_steady_or_out() {
    const ANSWERS: usize = 24;
    let rd = ReplicaDir::new();
    // Toggling from the first probe on.
    set_mode(&rd.ctl, "steady", 0, "toggle");
    set_mode(&rd.ctl, "shy", 0, "toggle");
    let c = DevCluster::start(1, false).expect("dev cluster");
    let api = c.api.clone();
    // A generous timeout: only the replica's answers count, not a loaded machine's delays.
    let steady =
        rd.profile("steady", 1, "0", "100ms", 0) + "timeout = \"3s\"\nfailure_threshold = 3\n";
    let shy = rd.profile("shy", 1, "0", "100ms", 0) + "timeout = \"3s\"\nsuccess_threshold = 2\n";
    assert_eq!(api.submit_toml(&steady).await.unwrap().0, 201);
    assert_eq!(api.submit_toml(&shy).await.unwrap().0, 201);
    api.wait_ready("steady", 1).await;

    // From here on, every change of steady's entry is on this stream.
    let events = Arc::new(Mutex::new(Vec::<(u64, usize)>::new()));
    let stream = {
        let (api, events) = (api.clone(), events.clone());
        let resp = sse_open(&api, "/v1/services/steady/endpoints/stream", None)
            .await
            .unwrap();
        tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut parser = SseParser::default();
            while let Some(Ok(chunk)) = body.next().await {
                for (id, data) in parser.push(&chunk) {
                    let entry: Value = serde_json::from_str(&data).unwrap_or_default();
                    events
                        .lock()
                        .unwrap()
                        .push((id, entry_endpoints(&entry).len()));
                }
            }
        })
    };
    // The replicas' own logs: both answered ANSWERS probes since, half of them 503.
    let answers = |svc: &str| -> Vec<u64> {
        let job = std::fs::read_dir(&rd.ctl)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find_map(|f| {
                f.strip_prefix(&format!("{svc}-"))?
                    .strip_suffix(".log")
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        replica_log(&rd.ctl, svc, &job)
            .into_iter()
            .filter(|l| l.0 == "probe")
            .filter_map(|l| l.2.first().copied())
            .collect()
    };
    let steady_before = answers("steady").len();
    let shy_before = answers("shy").len();
    eventually("both replicas answered enough probes", || async {
        let s = answers("steady").len() - steady_before;
        let h = answers("shy").len() - shy_before;
        Ok((s >= ANSWERS && h >= ANSWERS).then_some(()))
    })
    .await;
    let steady_answers = &answers("steady")[steady_before..];
    let shy_answers = answers("shy");
    let steady_503 = steady_answers.iter().filter(|&&a| a == 503).count();
    let shy_200 = shy_answers.iter().filter(|&&a| a == 200).count();
    // The replicas did flicker: what follows is the thresholds' doing.
    assert!(
        steady_503 >= ANSWERS / 2 - 1,
        "steady answered {steady_answers:?}"
    );
    assert!(shy_200 >= ANSWERS / 2 - 1, "shy answered {shy_answers:?}");

    // steady never left its endpoint.
    let (st, _, body) = api
        .get("/v1/services/steady/endpoints?format=plain")
        .await
        .unwrap();
    assert_eq!((st, body.lines().count()), (200, 1), "steady: {body}");
    stream.abort();
    let events = events.lock().unwrap().clone();
    assert!(!events.is_empty(), "the stream's snapshot arrived");
    assert!(
        events.iter().all(|e| e.1 == 1),
        "steady left its endpoint: {events:?}"
    );
    // shy never entered its endpoint.
    let shy_entry = api.get_json("/v1/services/shy/endpoints").await.unwrap();
    assert!(
        entry_endpoints(&shy_entry).is_empty(),
        "shy is ready: {shy_entry}"
    );
    println!(
        "FIGURE probe thresholds: steady (failure_threshold=3) answered {} probes, {steady_503} of them 503, and stayed in its endpoint ({} stream events, all with it); shy (success_threshold=2) answered {} probes, {shy_200} of them 200, and never entered",
        steady_answers.len(),
        events.len(),
        shy_answers.len(),
    );
}
