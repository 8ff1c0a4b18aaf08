//! A real Prometheus (Debian's `prometheus`) discovering a dev cluster's replicas through
//! `GET /v1/sd/prometheus`, with the `prometheus.yml` of the README as written there (only
//! the address, the token and the intervals substituted), observed through Prometheus'
//! own API (`/api/v1/targets`): the 3 replicas with their labels, a token's view only, a
//! killed replica's target dropped and its replacement picked up.

use crate::external::{find_program, own, program_version, skipped, token, Daemon, TwoTenants};
use crate::harness::*;
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

const VIEWER: &str = "prom-viewer-5c0e8a2f71d4b963";
const OWNER: &str = "prom-owner-9b3d6e0a4c1f2857";
const OTHER: &str = "prom-other-1e7f4a9c0b6d3825";

fn tokens() -> String {
    token(VIEWER, "prometheus", &[("job.view", "team-a")])
        + &token(OWNER, "alice", &own("team-a"))
        + &token(OTHER, "bob", &own("team-b"))
}

/// The README's `prometheus.yml`, for this cluster: its address and token, and 1 s
/// intervals instead of 15 s. Fails if the README no longer has the pieces substituted.
fn readme_config(base: &str, token: &str) -> Result<String> {
    let readme = std::fs::read_to_string(workspace_root().join("README.md"))?;
    let marker = "<!-- prometheus.yml: run as written";
    let start = readme
        .find(marker)
        .context("the README's prometheus.yml marker")?;
    let rest = &readme[start..];
    let body = rest
        .split_once("```yaml\n")
        .and_then(|(_, b)| b.split_once("\n```"))
        .map(|(b, _)| b)
        .context("the README's prometheus.yml block")?;
    let mut cfg = body.to_owned();
    for (from, to) in [
        ("http://127.0.0.1:7480", base.to_owned()),
        ("credentials: TOKEN", format!("credentials: {token}")),
        ("scrape_interval: 15s", "scrape_interval: 1s".to_owned()),
        ("refresh_interval: 15s", "refresh_interval: 1s".to_owned()),
    ] {
        if cfg.matches(from).count() != 1 {
            bail!("the README's prometheus.yml has no single `{from}`:\n{body}");
        }
        cfg = cfg.replace(from, &to);
    }
    Ok(cfg)
}

/// Prometheus' active targets of job `xce`: `__address__` -> (discovered labels, labels).
async fn targets(prom: &str) -> Result<BTreeMap<String, (Value, Value)>> {
    let v: Value = reqwest::get(format!("{prom}/api/v1/targets?state=active"))
        .await?
        .json()
        .await?;
    let mut out = BTreeMap::new();
    for t in v["data"]["activeTargets"]
        .as_array()
        .context("activeTargets")?
    {
        if t["labels"]["job"] != "xce" {
            continue;
        }
        let addr = t["discoveredLabels"]["__address__"]
            .as_str()
            .context("__address__")?
            .to_owned();
        out.insert(addr, (t["discoveredLabels"].clone(), t["labels"].clone()));
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_discovers_the_replicas_and_follows_a_kill() {
    let Some(prometheus) = find_program(&["prometheus"]) else {
        skipped("prometheus (real Prometheus SD test)", "prometheus");
        return;
    };
    let version = program_version(&prometheus);
    let t = TwoTenants::start(
        &tokens(),
        OWNER,
        OTHER,
        ("[service.meta]\nteam = \"payments\"\n", ""),
    )
    .await;
    let (c, alice, hidden) = (&t.cluster, &t.a, &t.b_endpoint);
    let dir = tempfile::tempdir().unwrap();
    let cfg_path = dir.path().join("prometheus.yml");
    let cfg = readme_config(&c.api.base, VIEWER).unwrap();
    // The README's warning, checked: the same job without `type: Bearer` is refused.
    let (_, job) = cfg.split_once("scrape_configs:\n").unwrap();
    let untyped = job
        .replace("job_name: xce", "job_name: untyped")
        .replace("          type: Bearer\n", "");
    assert!(!untyped.contains("type: Bearer"), "{untyped}");
    std::fs::write(&cfg_path, format!("{cfg}\n{untyped}")).unwrap();
    let port = free_port();
    let prom_url = format!("http://127.0.0.1:{port}");
    let prom = Daemon::spawn(
        Command::new(&prometheus)
            .arg(format!("--config.file={}", cfg_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=info"),
        dir.path().join("prometheus.log"),
    )
    .unwrap();

    // --- the 3 replicas, with their labels, and nothing of team-b ---
    let entry = alice.get_json("/v1/services/web/endpoints").await.unwrap();
    let expected = entry_endpoints(&entry);
    let found = eventually("Prometheus discovers web's 3 replicas", || async {
        let t = targets(&prom_url).await?;
        Ok((t.len() == 3).then_some(t))
    })
    .await;
    for (replica, job, addr) in &expected {
        let (discovered, labels) = found.get(addr).unwrap_or_else(|| {
            panic!("{addr} (replica {replica}) not among Prometheus' targets: {found:?}")
        });
        for (k, v) in [
            ("__meta_xce_service", "web".to_owned()),
            ("__meta_xce_project", "team-a".to_owned()),
            ("__meta_xce_replica", replica.to_string()),
            ("__meta_xce_job", job.clone()),
            ("__meta_xce_port", "http".to_owned()),
            ("__meta_xce_generation", "1".to_owned()),
            ("__meta_xce_meta_team", "payments".to_owned()),
        ] {
            assert_eq!(discovered[k], v, "{k} of {addr}: {discovered}");
        }
        assert!(
            discovered["__meta_xce_host"]
                .as_str()
                .is_some_and(|h| h.starts_with("exec-")),
            "{discovered}"
        );
        // The README's relabelling, as Prometheus applied it.
        assert_eq!(labels["service"], "web", "{labels}");
        assert_eq!(labels["project"], "team-a", "{labels}");
        assert_eq!(labels["replica"], replica.to_string(), "{labels}");
        assert_eq!(labels["host"], discovered["__meta_xce_host"], "{labels}");
        // `labelmap`: the meta label under its own name.
        assert_eq!(labels["team"], "payments", "{labels}");
    }
    assert!(
        !found.contains_key(hidden),
        "team-b's replica discovered with a team-a token: {found:?}"
    );

    eventually("Prometheus logs the untyped job's 401", || async {
        let log = prom.output();
        Ok(log
            .lines()
            .any(|l| l.contains("config=untyped") && l.contains("401 Unauthorized"))
            .then_some(()))
    })
    .await;

    // --- kill replica 1: its target goes, its replacement comes ---
    let (_, victim_job, victim) = expected.iter().find(|e| e.0 == 1).unwrap().clone();
    kill_replica_listening_on(&victim).unwrap();
    let t0 = Instant::now();
    // Polled by hand rather than with `eventually`: the time of the drop is kept on the way.
    let deadline = t0 + patience();
    let mut dropped = None;
    let replacement = loop {
        let t = targets(&prom_url).await.unwrap();
        if dropped.is_none() && !t.contains_key(&victim) {
            dropped = Some(t0.elapsed());
        }
        let new = t.iter().find(|(_, (d, _))| {
            d["__meta_xce_replica"] == "1" && d["__meta_xce_job"] != victim_job.as_str()
        });
        if let (Some(_), Some((addr, (d, _)))) = (dropped, new) {
            if t.len() == 3 && !t.contains_key(&victim) {
                break (
                    addr.clone(),
                    d["__meta_xce_job"].as_str().unwrap_or("").to_owned(),
                );
            }
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus did not drop {victim} and find replica 1's replacement within {:?}: {t:?}",
            patience()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let back = t0.elapsed();
    let dropped = dropped.expect("dropped before replaced");
    let ready = alice.plain("web").await.unwrap();
    assert!(
        ready.contains(&replacement.0),
        "the new target {replacement:?} is a ready endpoint: {ready:?}"
    );
    println!(
        "SUMMARY prometheus http_sd ({version}, refresh 1s): 3 of 3 replicas discovered with labels (the job without `type: Bearer` got 401); killed replica's target dropped after {} ms, replacement {} ({}) found after {} ms",
        dropped.as_millis(),
        replacement.1,
        replacement.0,
        back.as_millis()
    );
}
