//! What TLS costs the read path (issue 16): endpoint reads per second over HTTPS with
//! keep-alive against plain HTTP, side by side in one run.
//!
//! Two `xced dev --hosts 1 --demo` processes on loopback, one plain and one `--tls`
//! (its generated CA trusted by the client). C closed-loop keep-alive connections (one
//! reqwest client each, the same client code for both) read
//! `GET /v1/services/web/endpoints?format=plain` for a measured window after a warm-up;
//! the variants alternate for several rounds, and the median round of each is compared.
//! The client runs on the same 2 cores as the server, so the figure includes the client's
//! own TLS work too (both ends of every connection encrypt).
//!
//! Needs `target/release/xced` (`cargo build --release --bin xced`), or `$XCED`. Run:
//! `cargo build --release --bin xced && cargo bench -p integration-tests --bench tls_reads`.
//! Prints a table and one `SUMMARY tls reads_per_s_plain=… reads_per_s_tls=… ratio=…`
//! line (goal: ratio >= 0.8, within 20 %).

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CONNS: usize = 16;
const WARMUP: Duration = Duration::from_millis(500);
const WINDOW: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const GOAL: f64 = 0.8;

fn xced() -> PathBuf {
    testkit::release_xced("run `cargo build --release --bin xced` first")
}

/// One `xced dev` process; killed on drop.
struct Dev {
    child: Child,
    base: String,
    token: String,
    ca_file: Option<PathBuf>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        // SIGTERM (xced dev stops its replicas), then wait.
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

fn start_dev(dir: &Path, name: &str, first_ip: &str, tls: bool) -> Result<Dev> {
    let config = dir.join(format!("{name}.toml"));
    let mut cmd = Command::new(xced());
    cmd.args(["dev", "--hosts", "1", "--demo", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.join(name))
        .args(["--first-host-ip", first_ip])
        .arg("--client-config")
        .arg(&config)
        .env_remove("XCE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if tls {
        cmd.arg("--tls");
    }
    let mut child = cmd.spawn().context("spawning xced dev")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let base = loop {
        let Some(line) = lines.next() else {
            bail!("xced dev ({name}) ended before announcing its listener");
        };
        if let Some(b) = line?.strip_prefix("xced: apiserver listening on ") {
            break b.trim().to_owned();
        }
    };
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let cfg: toml::Table = toml::from_str(&std::fs::read_to_string(&config)?)?;
    Ok(Dev {
        child,
        base,
        token: cfg["token"].as_str().context("token")?.to_owned(),
        ca_file: cfg
            .get("ca_file")
            .and_then(|v| v.as_str())
            .map(PathBuf::from),
    })
}

fn client(dev: &Dev) -> Result<reqwest::Client> {
    let mut b = reqwest::Client::builder().no_proxy();
    if let Some(ca) = &dev.ca_file {
        b = b.tls_backend_preconfigured(control_tls::client::client_config(Some(ca))?);
    }
    Ok(b.build()?)
}

async fn read_once(http: &reqwest::Client, dev: &Dev) -> Result<String> {
    let resp = http
        .get(format!(
            "{}/v1/services/web/endpoints?format=plain",
            dev.base
        ))
        .bearer_auth(&dev.token)
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("HTTP {}", resp.status());
    }
    Ok(resp.text().await?)
}

/// Waits (bounded) until the demo's 3 replicas are endpoints.
async fn ready(dev: &Dev) -> Result<()> {
    let http = client(dev)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(text) = read_once(&http, dev).await {
            if text.lines().filter(|l| !l.is_empty()).count() == 3 {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("service web not ready at {} in time", dev.base);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One round: reads/s, p50 and p99 latency (µs).
async fn round(dev: &Dev) -> Result<(f64, f64, f64)> {
    let start = Instant::now() + WARMUP;
    let end = start + WINDOW;
    let mut tasks = Vec::new();
    for _ in 0..CONNS {
        let http = client(dev)?;
        let dev = Dev2 {
            base: dev.base.clone(),
            token: dev.token.clone(),
        };
        tasks.push(tokio::spawn(async move {
            let url = format!("{}/v1/services/web/endpoints?format=plain", dev.base);
            let mut lat = Vec::new();
            loop {
                let t = Instant::now();
                if t >= end {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let resp = http.get(&url).bearer_auth(&dev.token).send().await?;
                if !resp.status().is_success() {
                    bail!("HTTP {}", resp.status());
                }
                let body = resp.bytes().await?;
                if body.is_empty() {
                    bail!("empty answer");
                }
                let done = Instant::now();
                if t >= start && done <= end {
                    lat.push(done.duration_since(t).as_secs_f64() * 1e6);
                }
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    if all.is_empty() {
        bail!("no read completed in the window");
    }
    all.sort_by(f64::total_cmp);
    let pct = |p: usize| all[(all.len() * p / 100).min(all.len() - 1)];
    Ok((all.len() as f64 / WINDOW.as_secs_f64(), pct(50), pct(99)))
}

/// What a read task needs of a [`Dev`] (which owns the process).
struct Dev2 {
    base: String,
    token: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let block = 150 + (std::process::id() % 50);
    let plain = start_dev(dir.path(), "plain", &format!("127.{block}.1.11"), false)?;
    let tls = start_dev(dir.path(), "tls", &format!("127.{block}.2.11"), true)?;
    if !tls.base.starts_with("https://") || !plain.base.starts_with("http://") {
        bail!("unexpected listeners: {} and {}", plain.base, tls.base);
    }
    ready(&plain).await?;
    ready(&tls).await?;
    println!(
        "endpoint reads, {CONNS} keep-alive connections, {:?} per round after {:?} warm-up",
        WINDOW, WARMUP
    );
    println!(
        "{:<6} {:<6} {:>12} {:>10} {:>10}",
        "round", "proto", "reads/s", "p50 µs", "p99 µs"
    );
    let (mut rp, mut rt) = (Vec::new(), Vec::new());
    for r in 1..=ROUNDS {
        for (name, dev, out) in [("http", &plain, &mut rp), ("https", &tls, &mut rt)] {
            let (rate, p50, p99) = round(dev).await?;
            println!("{r:<6} {name:<6} {rate:>12.0} {p50:>10.0} {p99:>10.0}");
            out.push(rate);
        }
    }
    let (p, t) = (median(rp), median(rt));
    let ratio = t / p;
    let verdict = if ratio >= GOAL { "met" } else { "MISSED" };
    println!(
        "SUMMARY tls reads_per_s_plain={p:.0} reads_per_s_tls={t:.0} ratio={ratio:.3} (goal >= {GOAL}: {verdict})"
    );
    Ok(())
}
