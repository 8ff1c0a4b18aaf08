//! The worker's side of the `/internal/v1` protocol (see [`xce_proto::worker`]).

use plugin_api::ErrorBody;
use plugin_api::HostFacts;
use reqwest::{StatusCode, Url};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

use super::identity::Identity;
use xce_proto::worker::{
    Assignments, Heartbeat, HeartbeatAnswer, LeaveAnswer, RegisterRequest, RegisterResponse,
    WorkerEvent, CLUSTER_HEADER, INSTANCE_HEADER, SESSION_HEADER,
};
use xce_wire::version::{protocol, PROTOCOL_HEADER, SKEW_CODE};

/// How long an ordinary call (registration, facts, events) may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The bounds of a heartbeat's deadline (see [`heartbeat_timeout`]).
const HEARTBEAT_TIMEOUT_MIN: Duration = Duration::from_secs(1);

/// How long a heartbeat may wait for its answer: two heartbeat periods, at least 1 s and
/// at most [`CALL_TIMEOUT`]. A controller answers a heartbeat at once; one that accepted
/// the connection but says nothing for two periods is frozen (SIGSTOP, a stalled VM) or
/// cut off, and the worker moves on to the next controller instead of waiting on it while
/// a standby takes over. With the default 1 s period: 2 s.
pub(crate) fn heartbeat_timeout(period: Duration) -> Duration {
    (period * 2).clamp(HEARTBEAT_TIMEOUT_MIN, CALL_TIMEOUT)
}
/// How long the controller may hold an assignments query (`wait=30s`).
pub(crate) const ASSIGNMENTS_WAIT: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// No answer (connection refused, timeout, ...). Shown with its root cause
    /// ("connection refused"), not only reqwest's "error sending request".
    #[error("{}", unreachable(.0))]
    Unreachable(reqwest::Error),
    /// An answer other than success.
    #[error("controller answered {status}: {}", error_message(body))]
    Status {
        /// The status.
        status: StatusCode,
        /// The body, for the log (the controller never echoes secrets).
        body: String,
    },
    /// A success whose body is not what the protocol says.
    #[error("controller answer not understood: {0}")]
    Decode(reqwest::Error),
    /// The controller serves another cluster than the one this worker joined: its answer
    /// is not taken (whatever it says).
    #[error("controller {controller} serves cluster {}, but this worker belongs to cluster {ours}; it takes no orders from it (pointed at the wrong controller?)", theirs.as_deref().unwrap_or("(none announced)"))]
    WrongCluster {
        /// The controller's address.
        controller: String,
        /// The cluster its answer named (`None`: it named none).
        theirs: Option<String>,
        /// The cluster this worker joined.
        ours: String,
    },
}

fn unreachable(e: &reqwest::Error) -> String {
    let at = e
        .url()
        .map(|u| format!(" at {}", u.origin().ascii_serialization()))
        .unwrap_or_default();
    if e.is_timeout() {
        format!("no answer from the controller{at} in time")
    } else if let Some(tls) = control_tls::client::explain(e, "ca_file") {
        format!("controller unreachable{at}: {tls}")
    } else {
        format!(
            "controller unreachable{at}: {}",
            xce_stdx::logging::root_cause(e)
        )
    }
}

impl CallError {
    pub(crate) fn status(&self) -> Option<StatusCode> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The controller refused the worker's credential (401, 403): retrying does not help
    /// until the tokens file or the worker's `credential` changes.
    pub(crate) fn refused(&self) -> bool {
        matches!(self.status().map(|s| s.as_u16()), Some(401 | 403))
    }

    /// The controller refused this worker's protocol version (400 `version_skew`):
    /// retrying does not help until one of them is upgraded.
    pub(crate) fn version_skew(&self) -> bool {
        self.code().as_deref() == Some(SKEW_CODE)
    }

    /// The `error.code` of an error answer's JSON body (`host_taken`, `unauthenticated`,
    /// `no_worker_entry`, ...).
    pub(crate) fn code(&self) -> Option<String> {
        let CallError::Status { body, .. } = self else {
            return None;
        };
        ErrorBody::parse(body.as_bytes())
            .map(|b| b.error.code)
            .filter(|c| !c.is_empty())
    }

    /// The `error.message` of an error answer's JSON body, or the body itself.
    pub(crate) fn message(&self) -> String {
        match self {
            CallError::Status { body, .. } => error_message(body),
            _ => self.to_string(),
        }
    }
}

/// The message of an `ApiError` body (`{"error": {"message": ...}}`), else the body.
fn error_message(body: &str) -> String {
    ErrorBody::parse(body.as_bytes())
        .map(|b| b.error.message)
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| body.trim().to_owned())
}

/// A client for one host's routes, on one controller or several (only the leader
/// serves). A controller that cannot serve now — the connection is refused, the call
/// times out (a frozen process still accepts connections), or it answers 503 — is
/// skipped for the next one; the one that answered is tried first from then on, by every
/// task sharing the client, and a call still waiting on another controller is abandoned
/// and sent there (so a long-poll parked on a frozen leader follows the heartbeats).
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    /// `<base>/internal/v1/hosts/<host>/` of every controller, in the configured order.
    host_bases: Arc<[Url]>,
    /// Which of them a call tries first: the one that answered last, or the one after a
    /// controller that timed out.
    current: Arc<AtomicUsize>,
    /// The controller that answered, sent when it differs from the last one that did or
    /// when calls had failed meanwhile: calls waiting elsewhere move there, and loops
    /// backing off retry at once.
    answered: Arc<watch::Sender<(u64, usize)>>,
    /// Whether the last call that ended (any task) found no controller.
    failing: Arc<AtomicBool>,
    auth: String,
    /// Sent with every request; answers of another cluster are refused.
    identity: Arc<Identity>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field(
                "host_bases",
                &self.host_bases.iter().map(Url::as_str).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Why the controller URL is unusable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("controller url {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("building the http client: {0}")]
    Build(reqwest::Error),
    #[error(transparent)]
    Tls(#[from] control_tls::TlsError),
}

impl Client {
    /// `controller`: one base URL, or several separated by commas (tried in order); an
    /// `https://` one trusts the system's roots.
    #[cfg(test)]
    pub(crate) fn new(
        controller: &str,
        host: &str,
        credential: &str,
        identity: Arc<Identity>,
    ) -> Result<Self, ClientError> {
        Self::with_ca_file(controller, host, credential, identity, None)
    }

    /// Like `new`; `https://` controllers must have a certificate signed by a CA in
    /// `ca_file` (PEM), or by one of the system's roots without it.
    pub(crate) fn with_ca_file(
        controller: &str,
        host: &str,
        credential: &str,
        identity: Arc<Identity>,
        ca_file: Option<&std::path::Path>,
    ) -> Result<Self, ClientError> {
        let mut host_bases = Vec::new();
        for base in controller.split(',') {
            let base = base.trim();
            let bad = |reason: String| ClientError::BadUrl {
                url: base.to_owned(),
                reason,
            };
            if base.is_empty() {
                return Err(ClientError::BadUrl {
                    url: controller.to_owned(),
                    reason: "a url in the list is empty".into(),
                });
            }
            let mut url = Url::parse(base).map_err(|e| bad(e.to_string()))?;
            match url.scheme() {
                "http" | "https" => {}
                _ => return Err(bad("must be an http:// or https:// url".into())),
            }
            url.path_segments_mut()
                .map_err(|()| bad("cannot be a base url".into()))?
                .pop_if_empty()
                .extend(["internal", "v1", "hosts", host, ""]);
            host_bases.push(url);
        }
        let http = reqwest::Client::builder()
            // The controller address is explicit config; a proxy from the environment
            // must not reroute it.
            .no_proxy()
            .connect_timeout(CALL_TIMEOUT)
            .tls_backend_preconfigured(control_tls::client::client_config(ca_file)?)
            .build()
            .map_err(ClientError::Build)?;
        Ok(Self {
            http,
            host_bases: host_bases.into(),
            current: Arc::new(AtomicUsize::new(0)),
            answered: Arc::new(watch::Sender::new((0, 0))),
            failing: Arc::new(AtomicBool::new(false)),
            auth: format!("Bearer {credential}"),
            identity,
        })
    }

    /// The controller of `at`, for logs.
    fn origin(&self, at: usize) -> String {
        self.host_bases[at % self.host_bases.len()]
            .origin()
            .ascii_serialization()
    }

    /// A worker that registered before its controller announced a cluster (a controller
    /// upgraded after the worker) joins the one its accepted heartbeats name: the
    /// controller knows this worker as its host's holder, so it is its cluster.
    fn join_from(&self, resp: &reqwest::Response) {
        if self.identity.cluster().is_some() {
            return;
        }
        let Some(cluster) = resp
            .headers()
            .get(CLUSTER_HEADER)
            .and_then(|v| v.to_str().ok())
        else {
            return;
        };
        match self.identity.join(cluster) {
            Ok(true) => {
                tracing::info!(cluster = %cluster, "joined the cluster (named by the controller's heartbeat answer); this worker serves it from now on")
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(cluster = %cluster, error = %e, "cannot remember the cluster joined")
            }
        }
    }

    /// An answer from another cluster's controller (or one that names no cluster, once
    /// this worker has joined one) is refused: see [`CallError::WrongCluster`].
    fn check_cluster(&self, at: usize, resp: &reqwest::Response) -> Result<(), CallError> {
        let Some(ours) = self.identity.cluster() else {
            return Ok(());
        };
        let theirs = resp
            .headers()
            .get(CLUSTER_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        if theirs.as_deref() == Some(ours.as_str()) {
            return Ok(());
        }
        Err(CallError::WrongCluster {
            controller: self.origin(at),
            theirs,
            ours,
        })
    }

    fn url_at(&self, at: usize, leaf: &str) -> Url {
        // A host base ends with '/', so joining a relative leaf stays under it.
        self.host_bases[at % self.host_bases.len()]
            .join(leaf)
            .expect("a plain relative path joins")
    }

    /// Wakes up when a controller answers after calls failed (or a different controller
    /// answers): a loop backing off after a failure selects on this to retry at once.
    pub(crate) fn answers(&self) -> watch::Receiver<(u64, usize)> {
        self.answered.subscribe()
    }

    /// Sends the request `build` makes for the URL of `leaf`, with `timeout`, to the
    /// controller that answered last. With several: a refused connection, a timeout or a
    /// 503 moves on to the next one (each is tried once per call); a call whose controller
    /// stays silent while another task hears from a different one is abandoned and sent
    /// there. After a timeout, later calls start after the silent controller.
    async fn send(
        &self,
        leaf: &str,
        timeout: Duration,
        build: impl Fn(Url) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, CallError> {
        let n = self.host_bases.len();
        let mut answers = self.answered.subscribe();
        answers.borrow_and_update();
        let mut at = self.current.load(Ordering::Relaxed) % n;
        let mut tried = 0;
        // Moves to an answering controller, at most one per controller (no ping-pong).
        let mut moves = 0;
        let mut silent = None;
        let resp = loop {
            let mut req = build(self.url_at(at, leaf))
                .timeout(timeout)
                .header(reqwest::header::AUTHORIZATION, &self.auth)
                .header(INSTANCE_HEADER, self.identity.instance())
                // The controller refuses a worker outside the version skew (UPGRADING.md).
                .header(PROTOCOL_HEADER, protocol());
            if let Some(cluster) = self.identity.cluster() {
                req = req.header(CLUSTER_HEADER, cluster);
            }
            if let Some(session) = self.identity.session() {
                req = req.header(SESSION_HEADER, session);
            }
            let sent = req.send();
            let outcome = tokio::select! {
                r = sent => Some(r),
                to = answered_elsewhere(&mut answers, at), if n > 1 && moves < n => {
                    moves += 1;
                    at = to;
                    tried = 0;
                    None
                }
            };
            let Some(sent) = outcome else { continue };
            let skip = match &sent {
                Ok(resp) => resp.status() == StatusCode::SERVICE_UNAVAILABLE,
                Err(e) => e.is_connect() || e.is_timeout(),
            };
            if sent.as_ref().is_err_and(reqwest::Error::is_timeout) {
                silent = Some(at);
            }
            if skip && tried + 1 < n {
                tried += 1;
                at = (at + 1) % n;
                continue;
            }
            match sent {
                Ok(resp) if resp.status() != StatusCode::SERVICE_UNAVAILABLE => break resp,
                Ok(resp) => {
                    self.failed(silent);
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    return Err(CallError::Status { status, body });
                }
                Err(e) => {
                    self.failed(silent);
                    return Err(CallError::Unreachable(e));
                }
            }
        };
        if let Err(e) = self.check_cluster(at, &resp) {
            self.failed(None);
            return Err(e);
        }
        self.succeeded(at);
        let status = resp.status();
        if status.is_success() && leaf == "heartbeat" {
            self.join_from(&resp);
        }
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        Err(CallError::Status { status, body })
    }

    /// No controller could serve the call: the next call starts after the one that timed
    /// out (a frozen controller costs a timeout once, not on every call).
    fn failed(&self, silent: Option<usize>) {
        self.failing.store(true, Ordering::Relaxed);
        if let Some(s) = silent {
            let n = self.host_bases.len();
            let _ =
                self.current
                    .compare_exchange(s, (s + 1) % n, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Controller `at` answered: calls start there, and the others hear of it when it is
    /// news (another controller, or the first answer after failures).
    fn succeeded(&self, at: usize) {
        let was_failing = self.failing.swap(false, Ordering::Relaxed);
        let last = self.answered.borrow().1;
        let previous = self.current.swap(at, Ordering::Relaxed);
        if previous != at || last != at {
            tracing::info!(
                controller = %self.origin(at),
                "switched to the controller that answers"
            );
        }
        if was_failing || last != at {
            self.answered.send_modify(|(generation, who)| {
                *generation += 1;
                *who = at;
            });
        }
    }

    pub(crate) async fn register(
        &self,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, CallError> {
        let resp = self
            .send("register", CALL_TIMEOUT, |url| {
                self.http.post(url).json(req)
            })
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    /// A heartbeat asserting `beat`, answered within `timeout` (see
    /// [`heartbeat_timeout`]): `None` when the controller holds the same state (204),
    /// else what differs. Without a session (a controller that handed none) it sends no
    /// body, as the protocol was before sessions.
    pub(crate) async fn heartbeat(
        &self,
        timeout: Duration,
        beat: &Heartbeat,
    ) -> Result<Option<HeartbeatAnswer>, CallError> {
        let with_body = self.identity.session().is_some();
        let resp = self
            .send("heartbeat", timeout, |url| {
                let req = self.http.post(url);
                if with_body {
                    req.json(beat)
                } else {
                    req
                }
            })
            .await?;
        if resp.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        resp.json().await.map(Some).map_err(CallError::Decode)
    }

    pub(crate) async fn put_facts(&self, facts: &HostFacts) -> Result<(), CallError> {
        self.send("facts", CALL_TIMEOUT, |url| self.http.put(url).json(facts))
            .await
            .map(drop)
    }

    /// The blocking query: answers when the host's index passes `index`, or after the
    /// wait with the same index.
    pub(crate) async fn assignments(&self, index: u64) -> Result<Assignments, CallError> {
        let resp = self
            .send("assignments", ASSIGNMENTS_WAIT + CALL_TIMEOUT, |mut url| {
                url.query_pairs_mut()
                    .append_pair("index", &index.to_string())
                    .append_pair("wait", &format!("{}s", ASSIGNMENTS_WAIT.as_secs()));
                self.http.get(url)
            })
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    /// `--leave`: asks the controller to drain this host; the answer says how many live
    /// replicas are still on it (asked again until none is).
    pub(crate) async fn leave(&self) -> Result<LeaveAnswer, CallError> {
        let resp = self
            .send("leave", CALL_TIMEOUT, |url| self.http.post(url))
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    pub(crate) async fn events(&self, events: &[WorkerEvent]) -> Result<(), CallError> {
        self.send("events", CALL_TIMEOUT, |url| {
            self.http.post(url).json(events)
        })
        .await
        .map(drop)
    }
}

/// Resolves with the controller another call heard from, once it is not `at`.
async fn answered_elsewhere(answers: &mut watch::Receiver<(u64, usize)>, at: usize) -> usize {
    loop {
        if answers.changed().await.is_err() {
            // The sender lives as long as the client: never.
            std::future::pending::<()>().await;
        }
        let who = answers.borrow_and_update().1;
        if who != at {
            return who;
        }
    }
}

/// Sleeps `wait`, or less when a controller answers meanwhile (`true` then).
pub(crate) async fn sleep_or_answer(
    wait: Duration,
    answers: &mut watch::Receiver<(u64, usize)>,
) -> bool {
    tokio::select! {
        () = tokio::time::sleep(wait) => false,
        changed = answers.changed() => changed.is_ok(),
    }
}

#[cfg(test)]
mod tests;
