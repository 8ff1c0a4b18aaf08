//! Reads: requests/s and latency of an endpoint entry, ours under RBAC against etcd.

use super::*;

// === reads ===

/// One read load's result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    pub(crate) rps: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Server CPU per request (µs), warm-up included.
    pub(crate) cpu_us: f64,
}

/// `READ_CONNS` keep-alive connections sending `request` back to back (closed loop), or
/// each one every `period` (paced; latency counts from the send, not from when the
/// request was due: tokio's timer is late by up to a millisecond, which is the client's,
/// and at this rate a connection is rarely still waiting when its next request is due);
/// requests sent within the measured window count.
pub(crate) async fn load(
    addr: SocketAddr,
    pid: u32,
    request: &str,
    period: Option<Duration>,
) -> Load {
    let cpu0 = cpu_us(pid);
    let request = Arc::new(request.as_bytes().to_vec());
    let start = Instant::now() + READ_WARMUP;
    let end = start + READ_TIME;
    let tasks: Vec<_> = (0..READ_CONNS)
        .map(|_| {
            let request = request.clone();
            tokio::spawn(async move {
                let mut conn = Conn::connect(addr).await.unwrap();
                let mut lat = Vec::new();
                let mut total = 0;
                let mut ticks = period.map(|p| {
                    let first = tokio::time::Instant::now() + p.mul_f64(fastrand::f64());
                    tokio::time::interval_at(first, p)
                });
                loop {
                    if let Some(ticks) = &mut ticks {
                        ticks.tick().await;
                    }
                    let t = Instant::now();
                    if t >= end {
                        return (lat, total);
                    }
                    let (head, body) = conn.request(&request).await.unwrap();
                    assert_eq!(head.status, 200, "{}", String::from_utf8_lossy(&body));
                    total += 1;
                    if t >= start {
                        lat.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut total = 0;
    for t in tasks {
        let (l, n) = t.await.unwrap();
        lat.extend(l);
        total += n;
    }
    Load {
        rps: lat.len() as f64 / READ_TIME.as_secs_f64(),
        p50_ms: pct(&mut lat, 0.5),
        p99_ms: pct(&mut lat, 0.99),
        cpu_us: (cpu_us(pid) - cpu0) / f64::from(total),
    }
}

/// The median round by requests/s.
pub(crate) fn median(mut loads: Vec<Load>) -> Load {
    loads.sort_by(|a, b| a.rps.partial_cmp(&b.rps).unwrap());
    loads[loads.len() / 2]
}

pub(crate) async fn reads_all(etcd_found: bool) {
    let n_rounds = read_rounds();
    println!(
        "\nreads: the endpoint entry, {READ_CONNS} keep-alive connections, {READ_TIME:?} per \
         round, median of {n_rounds} rounds (variants alternate)"
    );
    // RBAC alone, in this process, for the isolation of its cost below.
    let (tokens, cheapest) = contexts();
    let rbac_view = rbac_ns(&tokens, VIEW_TOKEN).await;
    let rbac_admin = rbac_ns(&tokens, ADMIN_TOKEN).await;
    let rbac_cheap = rbac_ns(&cheapest, "x").await;
    println!(
        "{:<34} {:>8} {:>8} {:>10} {:>9} {:>9} {:>13}",
        "variant", "service", "bytes", "req/s", "p50(ms)", "p99(ms)", "server CPU/req"
    );
    let server = Server::start();
    let etcd = if etcd_found {
        Etcd::start().await
    } else {
        None
    };
    for service in ["svc-3", "svc-100"] {
        let path = format!("/v1/services/{service}/endpoints");
        // The same bytes go into etcd: what our read answers.
        let (_, entry) = Conn::connect(server.addr)
            .await
            .unwrap()
            .request(get(&path, ADMIN_TOKEN).as_bytes())
            .await
            .unwrap();
        let pid = server.pid();
        let mut variants: Vec<(String, SocketAddr, u32, String)> = vec![
            (
                "xce job.view (bearer + RBAC)".into(),
                server.addr,
                pid,
                get(&path, VIEW_TOKEN),
            ),
            (
                "xce admin (bearer + RBAC)".into(),
                server.addr,
                pid,
                get(&path, ADMIN_TOKEN),
            ),
            (
                "xce cheapest auth".into(),
                server.cheap,
                pid,
                get(&path, "x"),
            ),
        ];
        if let Some(etcd) = &etcd {
            let key = b64(service.as_bytes());
            let put = post(
                "/v3/kv/put",
                &format!(r#"{{"key":"{key}","value":"{}"}}"#, b64(&entry)),
            );
            let (head, _) = Conn::connect(etcd.addr)
                .await
                .unwrap()
                .request(put.as_bytes())
                .await
                .unwrap();
            assert_eq!(head.status, 200);
            variants.push((
                "etcd range (linearizable)".into(),
                etcd.addr,
                etcd.pid,
                post("/v3/kv/range", &format!(r#"{{"key":"{key}"}}"#)),
            ));
            variants.push((
                "etcd range (serializable)".into(),
                etcd.addr,
                etcd.pid,
                post(
                    "/v3/kv/range",
                    &format!(r#"{{"key":"{key}","serializable":true}}"#),
                ),
            ));
        }
        let mut rounds: Vec<Vec<Load>> = vec![Vec::new(); variants.len()];
        for _ in 0..n_rounds {
            for (i, (_, addr, pid, request)) in variants.iter().enumerate() {
                rounds[i].push(load(*addr, *pid, request, None).await);
            }
        }
        let results: Vec<Load> = rounds.into_iter().map(median).collect();
        for ((name, ..), r) in variants.iter().zip(&results) {
            println!(
                "{name:<34} {service:>8} {:>8} {:>10.0} {:>9.3} {:>9.3} {:>10.1} µs",
                entry.len(),
                r.rps,
                r.p50_ms,
                r.p99_ms,
                r.cpu_us
            );
        }
        // Latency below saturation: the same reads at a rate both sustain here.
        let period = Duration::from_secs(READ_CONNS as u64) / PACED_RATE;
        let mut paced = Vec::new();
        for (name, addr, pid, request) in [&variants[0]].into_iter().chain(variants.get(3)) {
            let r = load(*addr, *pid, request, Some(period)).await;
            let name = format!("{name} @{PACED_RATE}/s");
            println!(
                "{name:<34} {service:>8} {:>8} {:>10.0} {:>9.3} {:>9.3} {:>10.1} µs",
                entry.len(),
                r.rps,
                r.p50_ms,
                r.p99_ms,
                r.cpu_us
            );
            paced.push(r);
        }
        let etcd_paced = match paced.get(1) {
            Some(e) => format!("etcd linearizable p99={:.3}ms", e.p99_ms),
            None => "etcd=skipped".into(),
        };
        println!(
            "SUMMARY latency {service} job.view paced at {PACED_RATE}/s over {READ_CONNS} \
             connections (informational, below saturation): p99 ours={:.3}ms {etcd_paced}",
            paced[0].p99_ms
        );
        println!(
            "SUMMARY render {service}: building + serializing the JSON answer alone takes {:.1}µs \
             of the job.view read's {:.1}µs server CPU (in process, informational)",
            render_us(service),
            results[0].cpu_us
        );
        let (view, admin, cheap) = (results[0], results[1], results[2]);
        for (who, ours) in [("job.view", view), ("admin", admin)] {
            let p99 = format!(
                "p99 ours={:.3}ms (goal < 2 ms: {})",
                ours.p99_ms,
                verdict(ours.p99_ms < 2.0)
            );
            if results.len() == 5 {
                for (how, e) in [("linearizable", results[3]), ("serializable", results[4])] {
                    println!(
                        "SUMMARY reads {service} {who} vs etcd {how}: ours={:.0}/s etcd={:.0}/s \
                         ratio={:.2} (goal >= 5: {}); {p99} etcd p99={:.3}ms",
                        ours.rps,
                        e.rps,
                        ours.rps / e.rps,
                        verdict(ours.rps / e.rps >= 5.0),
                        e.p99_ms
                    );
                }
            } else {
                println!(
                    "SUMMARY reads {service} {who}: ours={:.0}/s etcd=skipped; {p99}",
                    ours.rps
                );
            }
        }
        // The cost of RBAC two ways: its own CPU (extractor + check, timed alone) against
        // the server's CPU per read, which is robust to the machine's noise; and the
        // throughput of the same route with the cheapest authorization, which is not.
        let share = rbac_view * 1e-3 / view.cpu_us;
        let extra = (rbac_view - rbac_cheap) * 1e-3 / view.cpu_us;
        let ab = 1.0 - view.rps / cheap.rps;
        println!(
            "SUMMARY rbac {service}: job.view authn+authz {rbac_view:.0}ns (admin {rbac_admin:.0}ns, \
             cheapest {rbac_cheap:.0}ns) of {:.1}µs server CPU per read = {:.1}% \
             ({:.1}% more than cheapest) (goal <= 10 %: {}); throughput job.view {:.0}/s vs \
             cheapest {:.0}/s = {:.1}% slower (noisy)",
            view.cpu_us,
            share * 100.0,
            extra * 100.0,
            verdict(share <= 0.10),
            view.rps,
            cheap.rps,
            ab * 100.0
        );
    }
    drop(etcd);
    drop(server);
}

/// Rounds of reads: `$READ_ROUNDS`, or [`READ_ROUNDS`].
pub(crate) fn read_rounds() -> usize {
    std::env::var("READ_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(READ_ROUNDS)
}
