//! The replica program the suite's services run: it binds its port, serves HTTP, and
//! writes its own `start`, `sigterm`, `exit` (and `bindfail`) lines with CLOCK_MONOTONIC
//! to one shared log, so the history knows each process's life from the process itself.
//! Modes (argv[3]): `normal` (on SIGTERM: serves `term_delay` more seconds, then exits),
//! `ignore-term` (logs the SIGTERM and keeps serving: the worker's SIGKILL ends it),
//! `crash` (exits by itself 1–3 s after it starts: a crash loop), `broken` (exits at once,
//! never ready: the broken update).

use crate::history::{Gone, Recorder};
use std::path::PathBuf;

const REPLICA_PY: &str = r#"
import http.server, os, random, signal, sys, threading, time
log_path, term_delay, mode = sys.argv[1], float(sys.argv[2]), sys.argv[3]
ip = os.environ['XCE_HOST_IP']
port = int(os.environ['XCE_PORT_HTTP'])
svc = os.environ['XCE_SERVICE']
job = os.environ['XCE_JOB_ID']
addr = '%s:%d' % (ip, port)
def note(kind):
    # One write of a short line to an O_APPEND file: lines of replicas never interleave.
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, ('%s %d %s %s %s %d\n' % (kind, time.monotonic_ns(), svc, job, addr, os.getpid())).encode())
    os.close(fd)
if mode == 'broken':
    note('exit')
    os._exit(3)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.0'
    def log_message(self, *a):
        pass
    def do_GET(self):
        body = addr.encode()
        self.send_response(200)
        self.send_header('content-length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
class S(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
def term(*_):
    note('sigterm')
    if mode == 'ignore-term':
        return
    def later():
        time.sleep(term_delay)
        note('exit')
        os._exit(0)
    threading.Thread(target=later, daemon=True).start()
signal.signal(signal.SIGTERM, term)
try:
    srv = S((ip, port), H)
except OSError:
    note('bindfail')
    os._exit(4)
note('start')
if mode == 'crash':
    def crash():
        note('exit')
        os._exit(5)
    threading.Timer(1.0 + 2.0 * random.random(), crash).start()
srv.serve_forever()
"#;

/// Whether `pid` runs: it has a `/proc` entry and is no zombie (a SIGKILLed replica whose
/// worker died is reaped by whoever adopted it, maybe later; its port is free already).
fn alive(pid: u32) -> bool {
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        // Only a missing entry means gone: any other error tells nothing, and a process
        // once recorded gone is never sampled again.
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    // `pid (comm) S ...`: the state follows the last ')'.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !state.is_some_and(|s| s.starts_with('Z') || s.starts_with('X'))
}

/// The script, and the log every replica of a run appends to.
pub struct Replicas {
    dir: tempfile::TempDir,
    /// When [`Replicas::sample_gone`] last looked.
    last_pass: std::sync::Mutex<u64>,
    pub script: PathBuf,
    pub log: PathBuf,
}

impl Replicas {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("replica dir");
        let script = dir.path().join("replica.py");
        std::fs::write(&script, REPLICA_PY).expect("replica script");
        let log = dir.path().join("replicas.log");
        Self {
            dir,
            last_pass: std::sync::Mutex::new(crate::harness::monotonic_ns()),
            script,
            log,
        }
    }

    /// A profile of `replicas` replicas of the script in `mode`, `env` making each
    /// generation differ. `drain` is the service's drain; the replica serves 0.3 s past its
    /// SIGTERM.
    pub fn profile(&self, name: &str, replicas: u32, mode: &str, env: &str, drain: &str) -> String {
        format!(
            "[service]\nname = \"{name}\"\nreplicas = {replicas}\ndrain = \"{drain}\"\ncommand = [\"python3\", \"{}\", \"{}\", \"0.3\", \"{mode}\"]\n[[service.ports]]\nname = \"http\"\n[service.env]\nGEN = \"{env}\"\n[service.readiness]\nhttp = {{ port = \"http\", path = \"/\" }}\ninterval = \"200ms\"\ntimeout = \"1s\"\n[service.update]\nmax_surge = 1\nmax_unavailable = 1\nmin_ready = \"1s\"\ndeadline = \"30s\"\n",
            self.script.display(),
            self.log.display(),
        )
    }

    pub fn read_log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Records, once, every replica process of the log that is gone (no `/proc/<pid>`)
    /// without an exit line of its own: the end of a SIGKILLed replica. Call it often: the
    /// time recorded is the previous call's, when it was last seen alive (an end that is
    /// never late: a port is not judged held past it).
    pub fn sample_gone(&self, rec: &Recorder) {
        let now = crate::harness::monotonic_ns();
        let alive_at = std::mem::replace(&mut *self.last_pass.lock().expect("pass lock"), now);
        let text = self.read_log();
        let mut pids = std::collections::BTreeMap::<u32, bool>::new();
        for l in text.lines() {
            let w: Vec<&str> = l.split_whitespace().collect();
            if let (Some(kind), Some(Ok(pid))) = (w.first(), w.get(5).map(|p| p.parse::<u32>())) {
                let ended = matches!(*kind, "exit" | "bindfail");
                *pids.entry(pid).or_default() |= ended;
            }
        }
        rec.with(|h| {
            for (pid, ended) in pids {
                if ended || h.gone.iter().any(|g| g.pid == pid) {
                    continue;
                }
                if !alive(pid) {
                    h.gone.push(Gone {
                        pid,
                        ns: alive_at.max(1),
                    });
                }
            }
        });
    }

    /// Kills every replica still running this run's script.
    pub fn kill_all(&self) {
        for pid in crate::harness::pids_with_cmdline(&self.script.to_string_lossy()) {
            crate::harness::signal(pid, libc::SIGKILL);
        }
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        self.kill_all();
    }
}
