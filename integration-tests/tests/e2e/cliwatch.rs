//! `xcecli service endpoints --watch` as a reload hook (issue 12, usability 6) and the
//! smaller client items (usability 11): `--wait-ready` above the replica count, ports in
//! declaration order, blank lines between `-o plain` lists, and a worker whose credential
//! the controller refuses. Real daemons, real `xcecli` processes, loopback HTTP.

use crate::harness::*;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A long-running `xcecli` (a watch): its stdout read line by line in a thread, its
/// stderr in a file. Terminated on drop.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: std::path::PathBuf,
}

impl Watch {
    /// Starts `xcecli ARGS` against `api` (admin token), hermetically.
    fn start(api: &Api, dir: &Path, name: &str, args: &[&str]) -> Result<Self> {
        let stderr = dir.join(format!("{name}.stderr"));
        let mut child = xcecli_command(api, dir, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&stderr)?))
            .spawn()
            .context("spawning xcecli")?;
        let stdout = child.stdout.take().context("piped stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            stderr,
        })
    }

    /// The next stdout line, waiting at most `patience()`.
    fn line(&self) -> Result<String> {
        self.lines
            .recv_timeout(patience())
            .with_context(|| format!("no line in time; stderr: {}", self.stderr_text()))
    }

    /// The next whole `-o plain` list: a watch ends each one with a blank line.
    fn list(&self) -> Result<Vec<String>> {
        let mut list = Vec::new();
        loop {
            let line = self.line()?;
            if line.is_empty() {
                return Ok(list);
            }
            list.push(line);
        }
    }

    /// Reads lists until one of `n` endpoints; returns it and the lists before it.
    fn list_of(&self, n: usize) -> Result<(Vec<String>, Vec<Vec<String>>)> {
        let mut before = Vec::new();
        loop {
            let list = self.list()?;
            if list.len() == n {
                return Ok((list, before));
            }
            before.push(list);
        }
    }

    /// Reads lists until an empty one; returns the lists before it.
    fn empty_list(&self) -> Result<Vec<Vec<String>>> {
        let mut before = Vec::new();
        loop {
            let list = self.list()?;
            if list.is_empty() {
                return Ok(before);
            }
            before.push(list);
        }
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, then how it exited and how long that took (bounded).
    fn terminate(&mut self) -> Result<(Option<i32>, Duration)> {
        let t = Instant::now();
        signal(self.child.id(), libc::SIGTERM);
        while t.elapsed() < patience() {
            if let Some(status) = self.child.try_wait()? {
                return Ok((status.code(), t.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("xcecli did not exit within {:?} of SIGTERM", patience())
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        terminate(&mut self.child);
    }
}

/// `xcecli ARGS` against `api` (admin token), hermetically: only PATH, HOME (`dir`),
/// `XCE_API` and `XCE_TOKEN` in its environment, no stdin.
fn xcecli_command(api: &Api, dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin("xcecli"));
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("XCE_API", &api.base)
        .env("XCE_TOKEN", &api.token)
        .args(args)
        .stdin(Stdio::null());
    cmd
}

/// `xcecli ARGS` to completion against `api` (admin token).
fn xcecli_run(api: &Api, dir: &Path, args: &[&str]) -> std::process::Output {
    xcecli_command(api, dir, args)
        .output()
        .expect("running xcecli")
}

async fn scale(api: &Api, service: &str, n: u32) -> Result<()> {
    let (status, body) = api.scale(service, n).await?;
    if !(200..300).contains(&status) {
        bail!("scale {service}: HTTP {status}: {body}");
    }
    Ok(())
}

/// The runs of the `--exec` hook recorded in `file`: each run's stdin.
fn hook_runs(file: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let mut runs = Vec::new();
    for line in text.lines() {
        if line == "--- run" {
            runs.push(Vec::new());
        } else if let Some(run) = runs.last_mut() {
            run.push(line.to_owned());
        }
    }
    runs
}

/// One `xcecli --watch -o plain` and one `--watch --exec` started before the service
/// exists: nothing is printed (a note on stderr), then the list once the replicas are
/// ready, a blank line and the changed list on scale, an empty list when the service is
/// stopped, and the list again when it is resubmitted — all from the same processes,
/// which SIGTERM ends with exit 0. Before usability 6 both exited 4 at once.
#[tokio::test]
async fn watch_outlives_the_service() -> Result<()> {
    let cluster = Cluster::new(2, "30s")?;
    let api = cluster.api.clone();
    let dir = cluster.dir.path();
    let runs = dir.join("hook-runs");
    let hook = format!("{{ echo '--- run'; cat; }} >> '{}'", runs.display());
    let mut plain = Watch::start(
        &api,
        dir,
        "plain",
        &["service", "endpoints", "web", "-o", "plain", "--watch"],
    )?;
    let mut exec = Watch::start(
        &api,
        dir,
        "exec",
        &["service", "endpoints", "web", "--watch", "--exec", &hook],
    )?;
    for w in [&plain, &exec] {
        eventually("the watch to say it waits for the service", || async {
            Ok(w.stderr_text()
                .contains("waiting for service web to exist")
                .then_some(()))
        })
        .await;
    }
    assert!(
        plain.lines.try_recv().is_err(),
        "nothing on stdout before the service exists"
    );
    assert!(plain.child.try_wait()?.is_none(), "still watching");

    let t = Instant::now();
    let (status, _) = api.submit_toml(&http_service("web", 2).toml()).await?;
    assert_eq!(status, 201);
    let (two, before) = plain.list_of(2)?;
    println!(
        "FIGURE watch: submitted -> list of 2 printed in {} ms ({} shorter lists before it: {before:?})",
        t.elapsed().as_millis(),
        before.len()
    );

    let t = Instant::now();
    scale(&api, "web", 3).await?;
    let (three, _) = plain.list_of(3)?;
    println!(
        "FIGURE watch: scaled to 3 -> list of 3 printed in {} ms",
        t.elapsed().as_millis()
    );
    assert!(two.iter().all(|e| three.contains(e)), "{two:?} {three:?}");

    let t = Instant::now();
    assert_eq!(api.delete("/v1/services/web").await?, 202);
    let read = plain.empty_list()?;
    println!(
        "FIGURE watch: stopped -> empty list printed in {} ms (lists before it: {read:?})",
        t.elapsed().as_millis()
    );
    // The service is gone for good, not just empty: a one-shot read says so (exit 4).
    eventually("the service to be gone", || async {
        let (code, ..) = api.get("/v1/services/web/endpoints").await?;
        Ok((code == 404).then_some(()))
    })
    .await;
    assert!(plain.child.try_wait()?.is_none(), "still watching");
    assert!(exec.child.try_wait()?.is_none(), "still watching");

    let t = Instant::now();
    let (status, _) = api.submit_toml(&http_service("web", 2).toml()).await?;
    assert_eq!(status, 201);
    let (again, _) = plain.list_of(2)?;
    println!(
        "FIGURE watch: resubmitted -> list of 2 printed in {} ms: {again:?}",
        t.elapsed().as_millis()
    );

    // The hook ran for each list, the empty one included, and last with the current one.
    let runs_seen = eventually("the hook to run with the resubmitted list", || async {
        let runs = hook_runs(&runs);
        let last_is_again = runs.last().is_some_and(|r| *r == again);
        Ok(last_is_again.then_some(runs))
    })
    .await;
    println!(
        "FIGURE watch --exec: {} hook runs, inputs of {:?} endpoints",
        runs_seen.len(),
        runs_seen.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert!(runs_seen.contains(&three), "{runs_seen:?}");
    let after_three = runs_seen.iter().position(|r| *r == three).unwrap();
    assert!(
        runs_seen[after_three..].iter().any(Vec::is_empty),
        "an empty run after the service was stopped: {runs_seen:?}"
    );
    for w in [&plain, &exec] {
        assert_eq!(
            w.stderr_text()
                .matches("waiting for service web to exist")
                .count(),
            1,
            "said once: {}",
            w.stderr_text()
        );
    }

    for (name, w) in [("plain", &mut plain), ("exec", &mut exec)] {
        let (code, took) = w.terminate()?;
        println!(
            "FIGURE watch {name}: SIGTERM -> exit {code:?} in {} ms",
            took.as_millis()
        );
        assert_eq!(code, Some(0), "a watch ends cleanly on SIGTERM");
    }
    Ok(())
}

/// `--wait-ready N` above the replica count fails at once with the usage code (2) and a
/// message naming both numbers; an unknown service still exits 4 for the one-shot
/// commands (with and without `--wait-ready`).
#[tokio::test]
async fn wait_ready_above_the_replica_count_is_a_usage_error() -> Result<()> {
    let cluster = Cluster::new(1, "30s")?;
    let api = cluster.api.clone();
    let dir = cluster.dir.path();
    let (status, _) = api.submit_toml(&http_service("web", 2).toml()).await?;
    assert_eq!(status, 201);
    let t = Instant::now();
    let out = xcecli_run(
        &api,
        dir,
        &[
            "service",
            "endpoints",
            "web",
            "--wait-ready",
            "3",
            // Bounds the test when it fails (a client that waits would exit 3 then).
            "--timeout",
            "30s",
        ],
    );
    let took = t.elapsed();
    let err = stderr(&out);
    println!(
        "FIGURE --wait-ready 3 on 2 replicas: exit {:?} in {} ms: {err}",
        out.status.code(),
        took.as_millis()
    );
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--wait-ready 3") && err.contains("has 2 replicas"),
        "{err}"
    );
    // Within the replica count it waits and prints as before.
    let out = xcecli_run(
        &api,
        dir,
        &[
            "service",
            "endpoints",
            "web",
            "--wait-ready",
            "2",
            "-o",
            "plain",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
    for args in [
        &["service", "endpoints", "ghost"][..],
        &["service", "endpoints", "ghost", "--wait-ready", "1"][..],
    ] {
        let out = xcecli_run(&api, dir, args);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {}", stderr(&out));
    }
    Ok(())
}

/// Tables list a service's ports in declaration order (the order of `XCE_PORTS`), not by
/// name: `service endpoints` and `service status` alike.
#[tokio::test]
async fn tables_list_ports_in_declaration_order() -> Result<()> {
    let cluster = Cluster::new(1, "30s")?;
    let api = cluster.api.clone();
    let dir = cluster.dir.path();
    let env_file = dir.join("ports-env");
    let profile = format!(
        "[service]\nname = \"multi\"\nreplicas = 1\ncommand = [\"sh\", \"-c\", \"echo $XCE_PORTS > '{}'; exec python3 -m http.server $XCE_PORT_ZETA --bind $XCE_HOST_IP\"]\n[[service.ports]]\nname = \"zeta\"\n[[service.ports]]\nname = \"alpha\"\n[service.readiness]\ntcp = \"zeta\"\n",
        env_file.display()
    );
    let (status, body) = api.submit_toml(&profile).await?;
    assert_eq!(status, 201, "{body}");
    eventually("multi ready", || async {
        let (code, _, body) = api.get("/v1/services/multi/endpoints").await?;
        Ok((code == 200 && body.contains("\"zeta\"")).then_some(()))
    })
    .await;
    let xce_ports = std::fs::read_to_string(&env_file)?;
    let table = stdout(&xcecli_run(
        &api,
        dir,
        &["service", "endpoints", "multi", "-o", "table"],
    ));
    let status_out = stdout(&xcecli_run(&api, dir, &["service", "status", "multi"]));
    println!("FIGURE XCE_PORTS={}", xce_ports.trim());
    println!("FIGURE endpoints table:\n{table}");
    println!("FIGURE status:\n{status_out}");
    assert!(xce_ports.trim().starts_with("zeta"), "{xce_ports}");
    for out in [&table, &status_out] {
        let (zeta, alpha) = (out.find("zeta="), out.find("alpha="));
        assert!(
            zeta.is_some() && alpha.is_some() && zeta < alpha,
            "zeta before alpha: {out}"
        );
    }
    Ok(())
}

/// The refusal lines of a worker log and the delays they state (`retry_in=1.1s`).
fn refusals(log: &str) -> Vec<(String, f64)> {
    log.lines()
        .filter(|l| l.contains("controller refused the worker credential"))
        .map(|l| {
            let delay = l
                .split("retry_in=")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|d| d.trim_end_matches('s').parse::<f64>().ok())
                .unwrap_or(f64::NAN);
            (l.to_owned(), delay)
        })
        .collect()
}

/// A worker whose credential the controller refuses logs one clear line per attempt —
/// what is wrong (a wrong secret for its host, or no `[[worker]]` entry for it) and what
/// to fix — and backs off exponentially instead of retrying at full speed.
#[tokio::test]
async fn a_refused_worker_says_why_and_backs_off() -> Result<()> {
    let cluster = Cluster::new(1, "30s")?;
    let dir = cluster.dir.path();
    let port = cluster
        .api
        .base
        .rsplit(':')
        .next()
        .context("controller port")?
        .to_owned();
    // exec-01 has an entry (its real worker runs): a wrong secret. exec-09 has none.
    let cases = [
        ("exec-01", "not-the-secret", "wrong or missing secret"),
        (
            "exec-09",
            "worker-0-example-secret",
            "no [[worker]] entry for host",
        ),
    ];
    let mut workers = Vec::new();
    for (i, (host, credential, _)) in cases.iter().enumerate() {
        let config = dir.join(format!("refused-{i}.toml"));
        std::fs::write(
            &config,
            format!(
                "host = \"{host}\"\ncontroller = \"http://127.0.0.1:{port}\"\ncredential = \"{credential}\"\ndata_dir = \"{}\"\n[address]\nadvertise = \"{}\"\nallow_loopback = true\n",
                dir.join(format!("refused-{i}")).display(),
                cluster.host_ip(5 + i)
            ),
        )?;
        let log = dir.join(format!("refused-{i}.log"));
        let child = cluster
            .owner
            .mark(&mut Command::new(bin("xced")))
            .arg("worker")
            .arg("--config")
            .arg(&config)
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(&log)?))
            .spawn()?;
        workers.push((child, log));
    }
    let started = Instant::now();
    // Four refusals: three pauses (about 1 s, 2 s, 4 s) between them.
    for (_, log) in &workers {
        eventually("four refusals in the worker log", || async {
            let text = std::fs::read_to_string(log)?;
            Ok((refusals(&text).len() >= 4).then_some(()))
        })
        .await;
    }
    let window = started.elapsed();
    for (child, _) in &mut workers {
        terminate(child);
    }
    for ((host, _, what), (_, log)) in cases.iter().zip(&workers) {
        let text = std::fs::read_to_string(log)?;
        let seen = refusals(&text);
        let delays: Vec<f64> = seen.iter().map(|(_, d)| *d).collect();
        println!(
            "FIGURE refused worker {host}: {} refusal lines in {} ms, stated delays {delays:?} s",
            seen.len(),
            window.as_millis()
        );
        println!("FIGURE refused worker {host} line: {}", seen[0].0);
        for (line, _) in &seen {
            assert!(line.contains(what), "{host}: {line}");
            assert!(line.contains("fix="), "{host}: {line}");
        }
        // Exponential: each stated delay at least 1.5 times the one before (doubling, up
        // to 20% jitter), from about a second.
        assert!(delays[0] >= 0.9, "{delays:?}");
        for pair in delays.windows(2) {
            assert!(pair[1] >= pair[0] * 1.5, "{host}: {delays:?}");
        }
        // One line per refused attempt: no other warning or error while refused.
        let others: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .filter(|l| !l.contains("controller refused the worker credential"))
            .collect();
        assert!(others.is_empty(), "{host}: {others:?}");
    }
    Ok(())
}
