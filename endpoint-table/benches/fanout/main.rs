//! Benchmarks of the endpoint table (issues 5 and 15), against etcd 3.4 through its
//! HTTP/JSON gateway and its native gRPC watch when `etcd` is on PATH (Debian: `apt-get
//! install etcd-server`):
//!
//! 1. the pure table: resync and event apply rates (in process);
//! 2. fan-out: one readiness change, the time until the last of W watchers has it — our
//!    SSE stream and our blocking query, over HTTP/1.1 (one connection each) and HTTP/2
//!    (100 per connection), against etcd watches through the gateway (one connection each)
//!    and over gRPC (100 per stream); module `runs`, HTTP/2 clients in `h2`;
//! 3. memory: server VmRSS per idle watcher at the largest W;
//! 4. reads: requests/s and latency of the endpoint entry of a 3- and a 100-replica
//!    service over 50 keep-alive connections — ours under RBAC against an etcd range read
//!    of the same bytes.
//!
//! The servers (our router, HTTP/1.1 and h2c, and etcd) run in processes of their own, apart
//! from the clients: 10,000 client sockets and 10,000 server sockets do not fit under one
//! process's fd limit. This binary re-executes itself with `--serve` for our side. Every
//! server is fresh per run, so a memory delta is not hidden by memory freed by an earlier
//! run. Children are killed at the end, on a panic, and by a watchdog past [`DEADLINE`];
//! our server also exits when its stdin (a pipe from this process) closes.
//!
//! Run: `cargo bench -p endpoint-table --bench fanout` (or `endpoint-table/bench.sh`);
//! `$ETCD` names another etcd binary. `$FANOUT_KINDS`, `$FANOUT_W` and `$FANOUT_CHANGES` run
//! only some of the fan-out runs, or more changes each (to profile one; see `runs::Only`),
//! and nothing else; `$READS_ONLY` the reads
//! only, `$READ_ROUNDS` rounds of them (default 5); `$XCED_READS=<xced binary>` reads
//! through a real `xced dev` instead, and nothing else (module `xced`).

use endpoint_table::{endpoint_table, Table, TableConfig};
use plugin_api::{
    ApiContext, ApiExtension, AuthError, Authenticator, ClusterEvent, ClusterListener,
    ClusterSnapshot, HostFacts, HostInfo, HostState, JobInfo, JobState, Permission, Principal,
    PrincipalKind, ServiceInfo,
};
use std::hint::black_box;
use std::io::{BufRead, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::http::Conn;
use testkit::{cpu_us, rss_kib};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};

/// The whole run is killed past this (children first).
const DEADLINE: Duration = Duration::from_secs(15 * 60);
/// Watcher counts of the fan-out runs; the last one also gives the memory numbers.
const FANOUT: [(usize, usize); 2] = [(1_000, 30), (10_000, 15)];
/// Read load: connections, warm-up, measured time, rounds (the variants alternate).
const READ_CONNS: usize = 50;
const READ_WARMUP: Duration = Duration::from_millis(300);
const READ_TIME: Duration = Duration::from_millis(1500);
const READ_ROUNDS: usize = 5;
/// The paced read load (all connections together), below both servers' capacity here.
const PACED_RATE: u32 = 2_000;
/// The index of every service after the resync; change k gives index `BASE + k`.
const BASE: u64 = 10;
/// Bearer secrets of the `--serve` process (random-looking, as in a tokens file).
const ADMIN_TOKEN: &str = "5c1d0e4b9a8f7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a3928170605";
const VIEW_TOKEN: &str = "a3f19c0e7b2d4a6f8e1c3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a4c6e8b1d3f5a";

/// Child processes to kill whatever happens.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--serve") {
        serve();
        return;
    }
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        kill_children();
        hook(info);
    }));
    std::thread::spawn(|| {
        std::thread::sleep(DEADLINE);
        eprintln!("bench: past its {DEADLINE:?} deadline, killing it");
        kill_children();
        std::process::exit(2);
    });

    // `$FANOUT_KINDS` / `$FANOUT_W` / `$FANOUT_CHANGES` pick fan-out runs to profile:
    // nothing else runs then.
    let fanout_only = ["FANOUT_KINDS", "FANOUT_W", "FANOUT_CHANGES"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    // `$READS_ONLY`: the reads and nothing else (`bench.sh --runs`: alternated rounds).
    let reads_only = std::env::var_os("READS_ONLY").is_some();
    if !fanout_only && !reads_only {
        table_rates();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let etcd_found = Command::new(etcd_bin())
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !etcd_found {
        println!(
            "etcd: no `{}` (Debian: apt-get install etcd-server, or run bench.sh; or set \
             $ETCD): etcd rows and ratios skipped",
            etcd_bin()
        );
    }
    rt.block_on(async {
        if let Some(bin) = std::env::var_os("XCED_READS") {
            xced_reads(std::path::Path::new(&bin)).await;
            return;
        }
        if reads_only {
            reads_all(etcd_found).await;
            return;
        }
        let memory = fanout_all(etcd_found).await;
        if !fanout_only {
            memory_summary(&memory).await;
            reads_all(etcd_found).await;
        }
    });
    kill_children();
}

fn kill_children() {
    let pids = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|e| e.into_inner()));
    for pid in pids {
        let _ = Command::new("kill")
            .args(["-9", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

fn forget_child(pid: u32) {
    CHILDREN
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|p| *p != pid);
}

/// The soft limit of open files of this process (its children inherit it).
fn fd_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(u64::MAX)
}

#[path = "../common/serve.rs"]
mod common_serve;
mod data;
mod etcd;
mod h2;
mod reads;
mod runs;
mod server;
mod xced;

use data::*;
use etcd::*;
use h2::*;
use reads::*;
use runs::*;
use server::*;
use xced::*;

// === a minimal HTTP/1.1 client ===

/// Where `needle` first occurs in `haystack`: a scan for its first byte, compared only
/// there. The watchers search every chunk they read for their next marker, mostly in
/// vain over the rest of an event; comparing at every offset (`windows`, as the test
/// kit's `find` does) cost the clients 17 % of their CPU in a profile, CPU they share
/// with the server on these cores.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut from = 0;
    while let Some(i) = haystack[from..].iter().position(|&b| b == first) {
        let at = from + i;
        if haystack[at + 1..].starts_with(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

fn get(path: &str, token: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: b\r\nauthorization: Bearer {token}\r\n\r\n")
}

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// One request on a fresh connection (as a change is made); the answer is read in the
/// background, off the clock.
async fn fire(addr: SocketAddr, request: String) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.set_nodelay(true).unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    tokio::spawn(async move {
        let mut sink = [0u8; 4096];
        let _ = conn.read(&mut sink).await;
    });
}
