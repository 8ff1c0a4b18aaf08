//! TLS on the control plane (issue 16): `xced dev --tls` and the tour over HTTPS with no
//! flags; a controller and a separate worker over TLS; the failures a user meets (a wrong
//! CA, an expired certificate, plain HTTP to the TLS port), each a clear message and exit 1
//! from `xcecli`; and a certificate renewed by SIGHUP while a watch stays open. Real
//! binaries, loopback only.

use crate::harness::*;
use anyhow::{bail, Context, Result};
use control_tls::dev::{generate, DevCertSpec, DevCerts};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Instant;

/// Runs `f` and how long it took, in ms (process spawn included for `xcecli`).
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let v = f();
    (v, t.elapsed().as_secs_f64() * 1e3)
}

fn spec(valid_years: std::ops::Range<i32>) -> DevCertSpec {
    DevCertSpec {
        ips: vec!["127.0.0.1".parse().unwrap()],
        dns: vec!["localhost".to_owned()],
        valid_years,
    }
}

/// `xcecli ARGS` with a cleared environment and no config file.
fn xcecli(home: &Path, args: &[&str]) -> Output {
    Command::new(bin("xcecli"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running xcecli")
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_tls_serves_the_tour_over_https_with_no_flags() {
    let dev = DevCluster::start_with(2, true, &["--tls"]).unwrap();
    // The announce line, the client config and the harness's client all say https; the
    // two dev workers registered through it (the harness waited for both hosts).
    assert!(
        dev.api.base.starts_with("https://127.0.0.1:"),
        "{}",
        dev.api.base
    );
    let cfg: toml::Table =
        toml::from_str(&std::fs::read_to_string(&dev.client_config).unwrap()).unwrap();
    assert_eq!(cfg["api"].as_str(), Some(dev.api.base.as_str()));
    let ca = PathBuf::from(
        cfg["ca_file"]
            .as_str()
            .expect("ca_file in the client config"),
    );
    assert!(std::fs::read_to_string(&ca)
        .unwrap()
        .contains("BEGIN CERTIFICATE"));

    // The README tour, unchanged: xcecli finds the api and the CA in its config.
    let o = dev.xcecli(&[
        "service",
        "endpoints",
        "web",
        "--wait-ready",
        "3",
        "--timeout",
        "60s",
        "-o",
        "plain",
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let eps: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert_eq!(eps.len(), 3, "{eps:?}");
    // The endpoints really answer (the replicas' own HTTP, not TLS).
    for ep in &eps {
        assert!(http_ok(ep).await.unwrap(), "{ep} does not answer");
    }
    let o = dev.xcecli(&["host", "list"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("exec-01") && stdout(&o).contains("exec-02"));

    // The TLS port spoken to in plain HTTP: told at once, exit 1, and the server logs the
    // peer and counts it.
    let plain = dev.api.base.replacen("https://", "http://", 1);
    let o = xcecli_with(
        &dev.client_config,
        &["--api", &plain, "service", "list"],
        &[],
    );
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("this port speaks TLS: use https://"),
        "{}",
        stderr(&o)
    );
    eventually("the plain-HTTP log line", || async {
        Ok(dev
            .log()
            .contains("plain HTTP on a TLS port from 127.0.0.1:")
            .then_some(()))
    })
    .await;
    let n = metric(
        &dev.api,
        "xce_tls_handshake_failures_total{reason=\"plain_http\"}",
    )
    .await
    .unwrap();
    assert!(n >= 1.0, "plain_http failures counted: {n}");
    println!(
        "FIGURE tls dev: xced dev --tls, 2 hosts registered over TLS, the tour with no flags \
         ({} endpoints, each answering), plain HTTP to the TLS port: exit 1, logged, \
         xce_tls_handshake_failures_total{{reason=\"plain_http\"}}={n}",
        eps.len()
    );
}

/// A controller and a separate worker, both `xced` processes, over TLS.
struct TlsCluster {
    dir: tempfile::TempDir,
    base: String,
    controller: Child,
    worker: Option<Child>,
    /// Held until the cluster's processes are dead (fields drop after `drop`).
    _block: IpBlock,
    owner: Owner,
}

impl TlsCluster {
    /// Serves `served` (cert and key); the worker trusts `worker_ca`.
    fn start(dir: tempfile::TempDir, served: &DevCerts, worker_ca: &Path) -> Result<Self> {
        let port = free_port();
        let d = dir.path();
        std::fs::write(d.join("tokens.toml"), admin_and_worker_tokens(1))?;
        std::fs::write(
            d.join("controller.toml"),
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\ntls_cert = \"{}\"\ntls_key = \"{}\"\n\n[address]\nallow_loopback_hosts = [\"*\"]\n",
                d.join("controller").display(),
                d.join("tokens.toml").display(),
                served.cert.display(),
                served.key.display(),
            ),
        )?;
        let owner = Owner::within(d);
        let mut controller = owner
            .mark(&mut Command::new(bin("xced")))
            .arg("controller")
            .arg("--config")
            .arg(d.join("controller.toml"))
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(
                d.join("controller.log"),
            )?))
            .spawn()?;
        let lines = lines_of(&mut controller);
        let base = format!("https://127.0.0.1:{port}");
        let announced = lines
            .recv_timeout(patience())
            .context("controller did not announce its listener")
            .and_then(|announced| {
                if announced != format!("xced: apiserver listening on {base}") {
                    bail!("announced {announced:?}");
                }
                Ok(())
            });
        if let Err(e) = announced {
            teardown([&mut controller], &owner);
            return Err(e);
        }
        let block = IpBlock::claim();
        let ip = block.first().to_string();
        std::fs::write(
            d.join("worker.toml"),
            format!(
                "host = \"exec-01\"\ncontroller = \"{base}\"\ncredential = \"worker-0-example-secret\"\nca_file = \"{}\"\ndata_dir = \"{}\"\nstop_timeout = \"3s\"\n\n[address]\nadvertise = \"{ip}\"\nallow_loopback = true\n",
                worker_ca.display(),
                d.join("worker").display(),
            ),
        )?;
        let worker = owner
            .mark(&mut Command::new(bin("xced")))
            .arg("worker")
            .arg("--config")
            .arg(d.join("worker.toml"))
            .env("XCE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(std::fs::File::create(d.join("worker.log"))?))
            .spawn()?;
        Ok(Self {
            dir,
            base,
            controller,
            worker: Some(worker),
            _block: block,
            owner,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("controller.log")).unwrap_or_default()
    }

    /// `xcecli --api BASE --token ADMIN --ca-file CA ARGS`.
    fn xcecli(&self, ca: &Path, args: &[&str]) -> Output {
        let mut all = vec!["--api", &self.base, "--token", ADMIN, "--ca-file"];
        let ca = ca.to_str().unwrap();
        all.push(ca);
        all.extend_from_slice(args);
        xcecli(self.dir.path(), &all)
    }

    fn hup(&self) {
        signal(self.controller.id(), libc::SIGHUP);
    }
}

impl Drop for TlsCluster {
    fn drop(&mut self) {
        let daemons = self.worker.iter_mut().chain([&mut self.controller]);
        teardown(daemons, &self.owner);
    }
}

fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}

/// The next whole `-o plain` list of a watch (lists end with a blank line).
fn next_list(lines: &mpsc::Receiver<String>) -> Result<Vec<String>> {
    let mut list = Vec::new();
    loop {
        let line = lines
            .recv_timeout(patience())
            .context("no watch output in time")?;
        if line.is_empty() {
            return Ok(list);
        }
        list.push(line);
    }
}

/// Copies a generated certificate and key over the served files (a renewal).
fn replace_served(served: &DevCerts, with: &DevCerts) {
    std::fs::copy(&with.cert, &served.cert).unwrap();
    std::fs::copy(&with.key, &served.key).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_controller_and_worker_refusals_and_certificate_reload() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let served = generate(&d.join("served"), &spec(2020..2100)).unwrap();
    let renewed = generate(&d.join("renewed"), &spec(2020..2100)).unwrap();
    let expired = generate(&d.join("expired"), &spec(2000..2001)).unwrap();
    let first_ca = d.join("first-ca.pem");
    std::fs::copy(&served.ca, &first_ca).unwrap();
    // The worker trusts both the first and the renewed CA, as a fleet does during a CA
    // rotation, so it keeps working across the reload.
    let bundle = d.join("bundle.pem");
    std::fs::write(
        &bundle,
        std::fs::read_to_string(&served.ca).unwrap()
            + &std::fs::read_to_string(&renewed.ca).unwrap(),
    )
    .unwrap();
    let c = TlsCluster::start(dir, &served, &bundle).unwrap();

    // The separate worker registers over TLS.
    let api = Api::with_ca(&c.base, ADMIN, Some(&first_ca));
    wait_for_hosts_of(&api, 1).unwrap();

    // A blocking read and a watch, over TLS.
    let (status, _) = api
        .submit_toml(&http_service("web", 1).toml())
        .await
        .unwrap();
    assert_eq!(status, 201);
    let o = c.xcecli(
        &first_ca,
        &[
            "service",
            "endpoints",
            "web",
            "--wait-ready",
            "1",
            "--timeout",
            "60s",
            "-o",
            "plain",
        ],
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "{}", stdout(&o));
    let mut watch = Command::new(bin("xcecli"))
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &d)
        .env("XCE_CA_FILE", &first_ca)
        .args(["--api", &c.base, "--token", ADMIN])
        .args(["service", "endpoints", "web", "-o", "plain", "--watch"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let watched = lines_of(&mut watch);
    assert_eq!(next_list(&watched).unwrap().len(), 1);

    // A CA that did not sign the certificate.
    let (o, wrong_ca_ms) = timed(|| c.xcecli(&renewed.ca, &["service", "list"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("certificate not trusted (is --ca-file right?)"),
        "{}",
        stderr(&o)
    );

    // Plain HTTP to the TLS port.
    let plain = c.base.replacen("https://", "http://", 1);
    let (o, plain_ms) =
        timed(|| xcecli(&d, &["--api", &plain, "--token", ADMIN, "service", "list"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("this port speaks TLS: use https://"),
        "{}",
        stderr(&o)
    );
    let (o, ok_ms) = timed(|| c.xcecli(&first_ca, &["service", "list"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // Renewal: new files, SIGHUP. New connections see the new certificate (the old CA no
    // longer verifies it); the watch opened before keeps its connection and its changes.
    replace_served(&served, &renewed);
    let hup_at = Instant::now();
    c.hup();
    eventually("the renewed certificate served", || async {
        let o = c.xcecli(&renewed.ca, &["service", "list"]);
        Ok((code(&o) == 0).then_some(()))
    })
    .await;
    let renewed_ms = hup_at.elapsed().as_secs_f64() * 1e3;
    let o = c.xcecli(&first_ca, &["service", "list"]);
    assert!(
        stderr(&o).contains("certificate not trusted"),
        "{}",
        stderr(&o)
    );
    let o = c.xcecli(&renewed.ca, &["service", "scale", "web", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut seen = Vec::new();
    loop {
        let list = next_list(&watched).unwrap();
        seen.push(list.len());
        if list.len() == 2 {
            break;
        }
    }
    assert!(
        watch.try_wait().unwrap().is_none(),
        "the watch ended: {seen:?}"
    );
    terminate(&mut watch);
    let lists_after_reload = seen.len();

    // An expired certificate, served after another SIGHUP: said so, exit 1.
    replace_served(&served, &expired);
    c.hup();
    let (o, expired_ms) = eventually("the expired certificate served", || async {
        let (o, ms) = timed(|| c.xcecli(&expired.ca, &["service", "list"]));
        Ok(stderr(&o).contains("expired").then_some((o, ms)))
    })
    .await;
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the server's certificate has expired"),
        "{}",
        stderr(&o)
    );

    // A key file that does not parse: refused, logged, the last good certificate stays.
    std::fs::write(&served.key, "-----BEGIN PRIVATE KEY-----\ngarbage\n").unwrap();
    c.hup();
    eventually("the refused reload logged", || async {
        Ok(c.log()
            .contains("TLS certificate not re-read, the old one stays in use")
            .then_some(()))
    })
    .await;
    let o = c.xcecli(&expired.ca, &["service", "list"]);
    assert!(stderr(&o).contains("has expired"), "{}", stderr(&o));
    println!(
        "FIGURE tls: xcecli over TLS ok in {ok_ms:.0} ms; exit 1 with the clear message in: \
         wrong CA {wrong_ca_ms:.0} ms, plain HTTP to the TLS port {plain_ms:.0} ms, expired \
         certificate {expired_ms:.0} ms (process spawn included); renewal: new certificate \
         served {renewed_ms:.0} ms after SIGHUP (polled every 100 ms), the watch opened before \
         it (trusting only the old CA, so it could not have reconnected) stayed open and \
         printed {lists_after_reload} list(s) after it, the last with 2 endpoints; a broken \
         key file on SIGHUP kept the last good certificate"
    );
}
