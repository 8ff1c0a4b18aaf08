//! Reads through a real `xced dev` (`$XCED_READS=<path to a release xced>`): the host's
//! whole read path, which the `--serve` process leaves out (the accept loop, connection
//! accounting, HTTP/1.1-or-HTTP/2 detection, the audit layer, the credential watch, the
//! apiserver's router), so that `bench.sh --runs N --xced-base BIN` can A/B it against
//! another build (the previous release's) run by run.
//!
//! One `xced dev --hosts 1 --demo` (service `web`, 3 replicas: the size of `svc-3`), its
//! generated admin token; `READ_CONNS` keep-alive connections read
//! `GET /v1/services/web/endpoints` closed loop ([`load`]), `$READ_ROUNDS` rounds, each
//! round's row printed (`xced web <label> ...`).

use super::*;
use std::path::Path;

/// A running `xced dev`; stopped (SIGTERM, then waited for) and its data removed on drop.
struct Dev {
    child: Child,
    addr: SocketAddr,
    token: String,
    dir: tempfile::TempDir,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        forget_child(self.child.id());
        let _ = std::fs::remove_dir_all(self.dir.path());
    }
}

/// Starts `bin dev` and waits until its listener is announced.
fn start(bin: &Path) -> Dev {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("client.toml");
    let mut child = Command::new(bin)
        .args(["dev", "--hosts", "1", "--demo", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--first-host-ip", "127.0.0.61"])
        .arg("--client-config")
        .arg(&config)
        .env_remove("XCE_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {} dev: {e}", bin.display()));
    CHILDREN.lock().unwrap().push(child.id());
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("xced dev ended before announcing its listener")
            .unwrap();
        if let Some(b) = line.strip_prefix("xced: apiserver listening on ") {
            break b.trim().to_owned();
        }
    };
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let cfg = std::fs::read_to_string(&config).unwrap();
    let token = cfg
        .lines()
        .find_map(|l| l.strip_prefix("token = "))
        .expect("a token in the client config")
        .trim()
        .trim_matches('"')
        .to_owned();
    let addr = base.trim_start_matches("http://").parse().unwrap();
    Dev {
        child,
        addr,
        token,
        dir,
    }
}

/// Waits (bounded) until `web`'s 3 replicas are endpoints.
async fn ready(dev: &Dev) {
    let req = get("/v1/services/web/endpoints?format=plain", &dev.token);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(mut conn) = Conn::connect(dev.addr).await {
            if let Ok((head, body)) = conn.request(req.as_bytes()).await {
                let lines = body.split(|b| *b == b'\n').filter(|l| !l.is_empty());
                if head.status == 200 && lines.count() == 3 {
                    return;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "web not ready on xced dev in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The reads of `$XCED_READS` (labelled `$XCED_LABEL`), one row per round.
pub(crate) async fn xced_reads(bin: &Path) {
    let label = std::env::var("XCED_LABEL").unwrap_or_else(|_| "xced".into());
    let dev = start(bin);
    ready(&dev).await;
    let path = "/v1/services/web/endpoints";
    let request = get(path, &dev.token);
    let (_, entry) = Conn::connect(dev.addr)
        .await
        .unwrap()
        .request(request.as_bytes())
        .await
        .unwrap();
    println!(
        "{:<34} {:>8} {:>8} {:>10} {:>9} {:>9} {:>13}",
        "variant", "service", "bytes", "req/s", "p50(ms)", "p99(ms)", "server CPU/req"
    );
    for _ in 0..read_rounds() {
        let r = load(dev.addr, dev.child.id(), &request, None).await;
        println!(
            "{:<34} {:>8} {:>8} {:>10.0} {:>9.3} {:>9.3} {:>10.1} µs",
            format!("xced {label}"),
            "web",
            entry.len(),
            r.rps,
            r.p50_ms,
            r.p99_ms,
            r.cpu_us
        );
    }
}
