//! The one client of etcd, and the one place that knows its endpoints and how to fail
//! over between them: unary calls tried on each endpoint in turn, either through etcd's
//! native gRPC API ([`Gateway::unary`]: the store's ([`EtcdStore`](super::EtcdStore))
//! commits and loads, the apiserver's follower, freshness probe and leader-key reads, the
//! fleet's reads;
//! HTTP/2 in [`grpc`](super::grpc), messages in [`pb`](super::pb)) or through its JSON
//! gateway (grpc-gateway, `POST /v3/...`, keys and values in base64; [`Gateway::call`]:
//! the election's and the fleet's leases and writes),
//! and watches, all over gRPC ([`Gateway::watch_stream`]: etcd's `Watch/Watch` stream, on
//! the endpoint the caller picks; the follower, the leader watch, the election's standbys
//! and the fleet).
//!
//! The gateway side speaks `reqwest` (async). The store and the election are synchronous (the store
//! trait is, and the election runs on threads of its own): they go through [`wait`],
//! which borrows the caller's multi-thread runtime under `block_in_place`, or else runs
//! the call on a small runtime of this module's own (plain threads, tests, and
//! `current_thread` runtimes, where `block_in_place` is not allowed).
//!
//! Every request carries [`REQUIRE_LEADER`]; connections are kept alive between calls.
//!
//! ## Measured (issue 13)
//!
//! `cargo test -p xce-apiserver --release --lib follow::bench -- --ignored --nocapture`
//! (`apiserver/follow/bench.rs`): 500 sequential one-event commits to a 1-member etcd on
//! tmpfs, each waited for at an apiserver follower. Run five times alternately with the
//! hand-written clients this module replaced (commit `c5d12f8`), release builds, same
//! machine, which was shared and loaded (load average 6–8 on 2 cores): medians of the five
//! runs, and their ratio. Only the ratios mean much; the p99s moved by ±50 % between runs.
//!
//! | figure | before p50 | after p50 | ratio | before p99 | after p99 | ratio |
//! |---|---|---|---|---|---|---|
//! | commit latency | 1.24 ms | 0.83 ms | 0.67 | 6.66 ms | 5.28 ms | 0.79 |
//! | commit start → follower applied | 1.11 ms | 0.81 ms | 0.73 | 6.08 ms | 4.49 ms | 0.74 |
//!
//! Kept-alive connections (the old client opened one per request) are the likely gain.
//!
//! The `etcd-client` crate (tonic) was not used: it needs `protoc` at build time, which a
//! fresh machine with only Rust does not have. The gRPC side is therefore this crate's own:
//! the few `etcdserverpb` messages it needs, derived with `prost` (no build script), over
//! hyper's HTTP/2 client. Through the gateway etcd spent 6.7-7.5 ms of CPU per
//! transaction of 120 puts of 600 B, through gRPC 1.2-1.4 ms (`etcd.rs`'s module docs).

use super::grpc::{Channel, Stream};
use super::outcome::{describe, Failure, MAX_ANSWER, NO_LEADER};
use super::pb;
use base64::Engine as _;
use prost::Message as _;
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A request header (gRPC metadata `hasleader`, through the JSON gateway; the gRPC calls
/// send the metadata itself) that makes a
/// member without a raft leader refuse at once ("etcdserver: no leader") instead of holding
/// the request until etcd's own timeout (7 s by default): a member cut off from the others,
/// or one waiting for an election, is then skipped for the next endpoint, and watches on it
/// are cancelled rather than left silent.
pub const REQUIRE_LEADER: &str = "grpc-metadata-hasleader";
/// The largest watch answer (one gRPC message) accepted. The follower asks etcd to split
/// bigger answers (`fragment`), whose parts stay under etcd's request limit (1.5 MiB by
/// default).
pub const MAX_MESSAGE: usize = 16 << 20;

/// Parses `etcd://HOST:PORT[,HOST:PORT…]` into its endpoints (`HOST:PORT` each).
pub fn parse_url(url: &str) -> Result<Vec<String>, String> {
    let bad = |reason: String| format!("store url {url:?}: {reason}");
    let list = url
        .strip_prefix("etcd://")
        .ok_or_else(|| bad("must look like etcd://HOST:PORT[,HOST:PORT...]".into()))?;
    let mut out = Vec::new();
    for ep in list.split(',') {
        let ep = ep.trim();
        if ep.is_empty() {
            return Err(bad("an endpoint is empty".into()));
        }
        check_endpoint(ep).map_err(|r| bad(format!("endpoint {ep:?} {r}")))?;
        out.push(ep.to_owned());
    }
    Ok(out)
}

/// `HOST:PORT` (`[v6]:PORT` for IPv6) with a non-zero port and a plain host name.
pub fn check_endpoint(ep: &str) -> Result<(), String> {
    let (host, port) = ep
        .rsplit_once(':')
        .ok_or_else(|| "has no :PORT".to_owned())?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("has an invalid port {port:?}")),
    }
    let plain = |h: &str| {
        !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
    };
    let ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => plain(host),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("has an invalid host {host:?}"))
    }
}

/// Runs `fut` to its end from synchronous code (see the module documentation).
pub fn wait<F>(fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(|| h.block_on(fut))
        }
        // Inside a `current_thread` runtime no runtime may be started on this thread:
        // another thread waits instead (blocking this one, as a synchronous call does).
        Ok(_) => std::thread::scope(|s| {
            s.spawn(|| own_runtime().block_on(fut))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        }),
        Err(_) => own_runtime().block_on(fut),
    }
}

/// The runtime of calls made outside any multi-thread runtime: one worker drives their
/// connections; each call runs on its caller's thread.
fn own_runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("xce-etcd-client")
            .enable_all()
            .build()
            .expect("a tokio runtime builds")
    })
}

/// Why a call failed on every endpoint (or was refused by one).
#[derive(Debug)]
pub struct CallError {
    /// Whether some endpoint may have applied the request.
    pub unknown: bool,
    /// `PATH: ENDPOINT: why[; ENDPOINT: why…]`.
    pub message: String,
}

/// How long a call may take.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// At most this per endpoint (connect, send and answer).
    pub per_endpoint: Duration,
    /// The whole call gives up here: endpoints not reached by then are not tried.
    pub deadline: Option<Instant>,
}

impl Limits {
    /// `per_endpoint` for each endpoint, no overall deadline.
    pub fn each(per_endpoint: Duration) -> Self {
        Self {
            per_endpoint,
            deadline: None,
        }
    }
}

/// The endpoints of one etcd cluster and connections to them: a pool of HTTP/1.1 ones
/// for the JSON gateway, and one HTTP/2 connection per endpoint for gRPC.
#[derive(Debug)]
pub struct Gateway {
    endpoints: Vec<String>,
    /// The endpoint that answered last; tried first.
    current: AtomicUsize,
    http: reqwest::Client,
    /// `endpoints[i]`'s gRPC connection.
    grpc: Vec<Channel>,
    connect: Duration,
}

impl Gateway {
    /// A client of `endpoints` (checked by the caller), connecting within `connect`.
    pub fn new(endpoints: Vec<String>, connect: Duration) -> Self {
        Self {
            grpc: endpoints.iter().cloned().map(Channel::new).collect(),
            connect,
            endpoints,
            current: AtomicUsize::new(0),
            // No overall timeout here: each call sets its own, and a watch is one long
            // answer.
            http: reqwest::Client::builder()
                .connect_timeout(connect)
                .tcp_nodelay(true)
                .build()
                .expect("a plain HTTP client builds"),
        }
    }

    /// The endpoints, in the order they are tried.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The endpoint tried first.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Makes `at` the endpoint tried first.
    pub fn set_current(&self, at: usize) {
        self.current.store(at, Ordering::Relaxed);
    }

    /// Sends `body` to `path` on each endpoint in turn (from the last good one) until one
    /// answers. A refusal is authoritative (another member would say the same): no other
    /// endpoint is asked.
    pub async fn call(&self, path: &str, body: &Value, limits: Limits) -> Result<Value, CallError> {
        let body = body.to_string();
        self.failover(path, limits, |at, timeout| {
            self.post(&self.endpoints[at], path, body.clone(), timeout)
        })
        .await
    }

    /// Calls the gRPC method `method` (`KV/Txn`: service of package `etcdserverpb`, then
    /// method) with `req` on each endpoint in turn, as [`call`](Self::call) does.
    pub async fn unary<Req, Resp>(
        &self,
        method: &str,
        req: &Req,
        limits: Limits,
    ) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let path = format!("/etcdserverpb.{method}");
        let message = req.encode_to_vec();
        self.failover(method, limits, |at, timeout| {
            self.unary_at(at, &path, &message, timeout)
        })
        .await
    }

    /// The gRPC method `method` (as in [`unary`](Self::unary)) with `req` on endpoint `at`
    /// only, within `timeout`.
    pub async fn unary_one<Resp: prost::Message + Default>(
        &self,
        at: usize,
        method: &str,
        req: &impl prost::Message,
        timeout: Duration,
    ) -> Result<Resp, String> {
        let at = at % self.endpoints.len();
        let path = format!("/etcdserverpb.{method}");
        let message = req.encode_to_vec();
        self.unary_at(at, &path, &message, timeout)
            .await
            .map_err(|f| failure_text(method, &self.endpoints[at], f))
    }

    /// One gRPC call of `path` with the encoded `message` to endpoint `at`: its decoded
    /// answer.
    async fn unary_at<Resp: prost::Message + Default>(
        &self,
        at: usize,
        path: &str,
        message: &[u8],
        timeout: Duration,
    ) -> Result<Resp, Failure> {
        let answer = self.grpc[at]
            .unary(path, message, timeout, self.connect)
            .await?;
        Resp::decode(answer).map_err(|e| Failure::Unknown(format!("unreadable answer: {e}")))
    }

    /// Opens a watch (etcd's gRPC stream `Watch/Watch`, created by `create`) on endpoint
    /// `at`: its answers, as they come. `timeout` bounds the wait for the first one.
    pub async fn watch_stream(
        &self,
        at: usize,
        create: pb::WatchCreateRequest,
        timeout: Duration,
    ) -> Result<WatchStream, WatchError> {
        let at = at % self.endpoints.len();
        let ep = &self.endpoints[at];
        let message = pb::WatchRequest {
            create_request: Some(create),
        }
        .encode_to_vec();
        let deadline = tokio::time::Instant::now() + timeout;
        let path = "/etcdserverpb.Watch/Watch";
        let opened = self.grpc[at].stream(path, &message, MAX_MESSAGE, deadline, self.connect);
        match tokio::time::timeout_at(deadline, opened).await {
            Ok(Ok(stream)) => Ok(WatchStream {
                stream,
                ep: ep.clone(),
            }),
            Ok(Err(f)) => Err(WatchError {
                silent: false,
                message: failure_text("watch", ep, f),
            }),
            Err(_) => {
                // A frozen member's connection stays open: the next call connects again.
                self.grpc[at].forget();
                Err(WatchError {
                    silent: true,
                    message: format!("watch: {ep}: no answer began within {timeout:?}"),
                })
            }
        }
    }

    /// Runs `one` (an exchange with endpoint `at` within `timeout`) on each endpoint in
    /// turn from the last good one, until one answers or refuses; `what` names the call in
    /// errors.
    async fn failover<T, F, Fut>(
        &self,
        what: &str,
        limits: Limits,
        mut one: F,
    ) -> Result<T, CallError>
    where
        F: FnMut(usize, Duration) -> Fut,
        Fut: Future<Output = Result<T, Failure>>,
    {
        let n = self.endpoints.len();
        let start = self.current();
        let mut errors = Vec::new();
        let mut unknown = false;
        for k in 0..n {
            let at = (start + k) % n;
            let ep = &self.endpoints[at];
            let mut timeout = limits.per_endpoint;
            if let Some(deadline) = limits.deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    errors.push(format!("{ep}: not tried, out of time"));
                    continue;
                }
                timeout = timeout.min(left);
            }
            match one(at, timeout).await {
                Ok(v) => {
                    self.set_current(at);
                    return Ok(v);
                }
                Err(Failure::Refused(m)) => {
                    errors.push(format!("{ep}: {m}"));
                    return Err(CallError {
                        unknown,
                        message: format!("{what}: {}", errors.join("; ")),
                    });
                }
                Err(Failure::Unreachable(m)) => errors.push(format!("{ep}: {m}")),
                Err(Failure::Unknown(m)) => {
                    unknown = true;
                    errors.push(format!("{ep}: {m}"));
                }
            }
        }
        Err(CallError {
            unknown,
            message: format!("{what}: no endpoint answered: {}", errors.join("; ")),
        })
    }

    /// One `POST` to one endpoint; the JSON answer of a 200.
    async fn post(
        &self,
        ep: &str,
        path: &str,
        body: String,
        timeout: Duration,
    ) -> Result<Value, Failure> {
        let exchange = async {
            let mut resp = self
                .request(ep, path, body)
                .send()
                .await
                .map_err(|e| sent_error(&e))?;
            let status = resp.status().as_u16();
            let mut answer = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| Failure::Unknown(format!("cannot receive: {}", describe(&e))))?
            {
                answer.extend_from_slice(&chunk);
                if answer.len() > MAX_ANSWER {
                    return Err(Failure::Unknown(format!(
                        "answer larger than {MAX_ANSWER} bytes"
                    )));
                }
            }
            Ok((status, answer))
        };
        let (status, answer) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| Failure::Unknown(format!("no answer within {timeout:?}")))??;
        let json: Option<Value> = serde_json::from_slice(&answer).ok();
        match (status, json) {
            (200, Some(v)) => Ok(v),
            (200, None) => Err(Failure::Unknown("answer is not JSON".into())),
            (status, v) => {
                let msg = v
                    .as_ref()
                    .and_then(|v| v["error"].as_str().or(v["message"].as_str()))
                    .map(str::to_owned)
                    .unwrap_or_else(|| {
                        String::from_utf8_lossy(&answer).chars().take(200).collect()
                    });
                let msg = format!("http {status}: {msg}");
                if msg.contains(NO_LEADER) {
                    // Refused before anything was proposed (see REQUIRE_LEADER): another
                    // member may have a leader.
                    Err(Failure::Unreachable(msg))
                } else if status >= 500 {
                    // "request timed out" and leader changes: it may still commit.
                    Err(Failure::Unknown(msg))
                } else {
                    Err(Failure::Refused(msg))
                }
            }
        }
    }

    fn request(&self, ep: &str, path: &str, body: String) -> reqwest::RequestBuilder {
        self.http
            .post(format!("http://{ep}{path}"))
            .header(REQUIRE_LEADER, "true")
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
    }
}

/// `WHAT: ENDPOINT: why`.
fn failure_text(what: &str, ep: &str, f: Failure) -> String {
    let (Failure::Unreachable(m) | Failure::Unknown(m) | Failure::Refused(m)) = f;
    format!("{what}: {ep}: {m}")
}

/// Why a watch was not opened.
#[derive(Debug)]
pub struct WatchError {
    /// Nothing answered within the time given (the member may be frozen, or cut off and
    /// holding the request): not a refusal.
    pub silent: bool,
    /// `watch: ENDPOINT: why`.
    pub message: String,
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// An open gRPC watch (see [`Gateway::watch_stream`]); dropping it cancels the watch.
#[derive(Debug)]
pub struct WatchStream {
    stream: Stream,
    ep: String,
}

impl WatchStream {
    /// The next answer; `None` when etcd ended the stream.
    pub async fn next(&mut self) -> Result<Option<pb::WatchResponse>, String> {
        let Some(message) = self
            .stream
            .next()
            .await
            .map_err(|f| failure_text("watch", &self.ep, f))?
        else {
            return Ok(None);
        };
        pb::WatchResponse::decode(message)
            .map(Some)
            .map_err(|e| format!("watch: {}: unreadable answer: {e}", self.ep))
    }

    /// The endpoint watched.
    pub fn endpoint(&self) -> &str {
        &self.ep
    }
}

/// A reqwest error before an answer: unreachable when no connection was made.
fn sent_error(e: &reqwest::Error) -> Failure {
    if e.is_connect() {
        Failure::Unreachable(format!("cannot connect: {}", describe(e)))
    } else {
        Failure::Unknown(describe(e))
    }
}

// === encoding ===

/// An int64 of the gateway's JSON: a string or a number; absent is 0 (proto3 default).
pub fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// Bytes as the gateway takes them (standard alphabet, padded).
pub fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Decodes a base64 JSON string; absent or null is empty (proto3 omits empty bytes).
pub fn unb64(v: &Value) -> Result<Vec<u8>, String> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|_| "etcd sent invalid base64".into()),
        other => Err(format!("etcd sent {other} where base64 was expected")),
    }
}
