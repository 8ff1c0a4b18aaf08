//! Forwarding to the leader controller: every route the apiserver does not serve from its
//! own copy goes to the controller the etcd leader key names, looked up again when that
//! one moves or stops answering.

use super::metrics::Metrics;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use plugin_api::ApiError;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use xce_store::Election;

/// Forwards requests to the leader controller.
#[derive(Clone)]
pub(super) struct Forwarder {
    pub(super) http: reqwest::Client,
    pub(super) election: Election,
    /// The leader's base URL as last found (`None`: look it up).
    pub(super) leader: Arc<Mutex<Option<String>>>,
    /// The last look at the leader key made while requests waited for an answer, and
    /// what it named: shared, so waiting requests cost etcd one read per
    /// [`LEADER_RECHECK`] however many they are.
    pub(super) recheck: Arc<tokio::sync::Mutex<Option<LeaderSeen>>>,
    pub(super) metrics: Metrics,
    pub(super) body_limit: usize,
    /// `https` when the controllers serve TLS, else `http`.
    pub(super) scheme: &'static str,
    /// The cluster id, as the store said at start (shown by `/healthz`).
    pub(super) cluster_id: Option<Arc<str>>,
}

/// When the leader key was read, and the leader's base URL it named (`None`: nobody).
type LeaderSeen = (tokio::time::Instant, Option<String>);

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1), and the
/// ones the client library sets itself.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "upgrade",
    "host",
    "content-length",
];

/// How often a request that waits for the leader's answer checks the leader is still
/// the one it was sent to (a frozen leader keeps its connections open and its key until
/// its lease runs out; then another one takes over).
const LEADER_RECHECK: Duration = Duration::from_secs(1);

/// The header a standby controller marks its 503s with (see `controller::standby`).
pub(super) const STANDBY_HEADER: &str = "x-xce-standby";
/// How long the leader may take to answer an ordinary request (and past its `wait`, a
/// blocking query) before the apiserver stops waiting and answers 503 `no_leader`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest `wait` of a blocking query the controller honours.
const MAX_WAIT: Duration = Duration::from_secs(600);
/// What a 503 `no_leader` tells the client (whole seconds): retry soon, a takeover takes
/// about the leader lease's TTL.
const RETRY_AFTER_SECS: u64 = 1;

fn end_to_end(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &http::HeaderValue)> {
    headers
        .iter()
        .filter(|(name, _)| !HOP_BY_HOP.contains(&name.as_str()))
}

impl Forwarder {
    /// The leader's base URL: cached, or read from etcd.
    async fn leader(&self, fresh: bool) -> Result<String, ApiError> {
        if !fresh {
            if let Some(url) = self.lock().clone() {
                return Ok(url);
            }
        }
        let election = self.election.clone();
        let id = tokio::task::spawn_blocking(move || election.leader())
            .await
            .map_err(|e| unavailable(format!("looking up the leader failed: {e}")))?
            .map_err(|e| unavailable(format!("cannot reach etcd to find the leader: {e}")))?
            .ok_or_else(|| unavailable("no controller leads now".into()))?;
        let url = leader_url(self.scheme, &id).ok_or_else(|| {
            unavailable(format!("the leader key holds {id:?}, not HOST/PID@ADDR"))
        })?;
        *self.lock() = Some(url.clone());
        Ok(url)
    }

    /// The leader's base URL as etcd names it now, read at most once per
    /// [`LEADER_RECHECK`] for all waiting requests together (`None`: nobody leads).
    async fn recheck(&self) -> Result<Option<String>, ApiError> {
        let mut last = self.recheck.lock().await;
        if let Some((at, leader)) = &*last {
            if at.elapsed() < LEADER_RECHECK {
                return Ok(leader.clone());
            }
        }
        let election = self.election.clone();
        let id = tokio::task::spawn_blocking(move || election.leader())
            .await
            .map_err(|e| unavailable(format!("looking up the leader failed: {e}")))?
            .map_err(|e| unavailable(format!("cannot reach etcd to find the leader: {e}")))?;
        let url = id.as_deref().and_then(|id| leader_url(self.scheme, id));
        *last = Some((tokio::time::Instant::now(), url.clone()));
        Ok(url)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.leader.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn send(
        &self,
        base: &str,
        parts: &http::request::Parts,
        body: &Bytes,
    ) -> reqwest::Result<reqwest::Response> {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = self
            .http
            .request(parts.method.clone(), format!("{base}{path}"))
            .body(body.clone());
        for (name, value) in end_to_end(&parts.headers) {
            req = req.header(name, value);
        }
        req.send().await
    }
}

/// `SCHEME://ADDR` of a leader id `HOST/PID@ADDR`; an unspecified listen address (all
/// interfaces) is reached through the leader's host name.
pub(super) fn leader_url(scheme: &str, id: &str) -> Option<String> {
    let (who, addr) = id.rsplit_once('@')?;
    let addr: SocketAddr = addr.parse().ok()?;
    if addr.ip().is_unspecified() {
        let host = who.split_once('/')?.0;
        return Some(format!("{scheme}://{host}:{}", addr.port()));
    }
    Some(format!("{scheme}://{addr}"))
}

fn unavailable(msg: String) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "no_leader", msg)
}

/// A 503 `no_leader` with `Retry-After`: no leader now, or it did not answer (it died,
/// froze, or a takeover is under way). Clients retry reads after the pause.
fn no_leader(msg: String) -> Response {
    let mut resp = unavailable(msg).into_response();
    resp.headers_mut().insert(
        http::header::RETRY_AFTER,
        http::HeaderValue::from(RETRY_AFTER_SECS),
    );
    resp
}

/// How long the leader may take to answer: [`ANSWER_TIMEOUT`], past the `wait` of a
/// blocking query (`?wait=30s`, `?wait=1500ms`; capped like the controller caps it).
fn answer_timeout(parts: &http::request::Parts) -> Duration {
    let wait = parts.uri.query().and_then(|q| {
        q.split('&')
            .filter_map(|pair| pair.split_once('='))
            .find(|(k, _)| *k == "wait")
            .and_then(|(_, v)| humantime::parse_duration(v).ok())
    });
    wait.map_or(Duration::ZERO, |w| w.min(MAX_WAIT)) + ANSWER_TIMEOUT
}

/// What a client may assume of a request that reached the leader but got no answer.
fn outcome_note(method: &http::Method) -> &'static str {
    if method.is_safe() {
        ""
    } else {
        " (the change may or may not have been applied: check before repeating it)"
    }
}

/// The fallback: forwards the request to the leader as it is, and its answer back. A
/// leader that cannot be connected to (it died; the next one is not known here yet) is
/// looked up again in etcd and tried once more: nothing was sent to it, so nothing
/// repeats. A leader that takes the request but does not answer — frozen, or gone in the
/// middle — is checked against etcd every [`LEADER_RECHECK`]: when another one (or none)
/// leads, or after [`answer_timeout`], the answer is 503 `no_leader` with `Retry-After`,
/// never a transport error.
pub(super) async fn forward(State(fwd): State<Forwarder>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, fwd.body_limit).await else {
        // Rendered in the error shape, with the limit, by the router's `json_errors`.
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let deadline = tokio::time::Instant::now() + answer_timeout(&parts);
    let mut fresh = false;
    let (base, answer) = loop {
        let base = match fwd.leader(fresh).await {
            Ok(b) => b,
            Err(e) => {
                fwd.metrics.forwarded("no_leader");
                let mut resp = e.into_response();
                resp.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from(RETRY_AFTER_SECS),
                );
                return resp;
            }
        };
        match fwd.wait_answer(&base, &parts, &body, deadline).await {
            // A standby on the address etcd still names (the leader died, and a new
            // process took its port before the old lease ran out). Its answer is a valid
            // 503 that did nothing: relaying it would keep this apiserver pinned to a
            // standby for good. Look the leader up again (at most once a LEADER_RECHECK)
            // until the deadline.
            Ok(r) if r.headers().contains_key(STANDBY_HEADER) => {
                *fwd.lock() = None;
                fresh = true;
                if tokio::time::Instant::now() + LEADER_RECHECK >= deadline {
                    fwd.metrics.forwarded("no_leader");
                    return no_leader(format!(
                        "the controller at {base} is a standby, not the leader; a takeover is under way"
                    ));
                }
                tokio::time::sleep(LEADER_RECHECK).await;
            }
            Ok(r) => break (base, r),
            Err(Silent::Failed(e)) if e.is_connect() && !fresh => {
                tracing::info!(leader = %base, error = %e, "leader unreachable: looking it up again");
                fresh = true;
            }
            Err(why) => {
                fwd.metrics.forwarded("unreachable");
                // A new leader may be on its way: look it up afresh next time.
                *fwd.lock() = None;
                let msg = match why {
                    Silent::Failed(e) if e.is_connect() => {
                        format!("the leader controller at {base} cannot be reached ({}); a takeover may be under way", root_cause(&e))
                    }
                    Silent::Failed(e) => format!(
                        "the leader controller at {base} did not answer ({}){}",
                        root_cause(&e),
                        outcome_note(&parts.method)
                    ),
                    Silent::Replaced => format!(
                        "the leader controller at {base} stopped answering and no longer leads{}",
                        outcome_note(&parts.method)
                    ),
                    Silent::TooLong => format!(
                        "the leader controller at {base} did not answer in time{}",
                        outcome_note(&parts.method)
                    ),
                };
                tracing::warn!(uri = %parts.uri, "{msg}");
                return no_leader(msg);
            }
        }
    };
    fwd.metrics.forwarded("ok");
    let mut resp = Response::builder().status(answer.status());
    for (name, value) in end_to_end(answer.headers()) {
        resp = resp.header(name, value);
    }
    let bytes = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => {
            *fwd.lock() = None;
            return no_leader(format!(
                "the answer of the leader controller at {base} broke off ({}){}",
                root_cause(&e),
                outcome_note(&parts.method)
            ));
        }
    };
    resp.body(Body::from(bytes))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Why a forwarded request got no answer.
enum Silent {
    /// The transport failed (refused, reset, …).
    Failed(reqwest::Error),
    /// While it waited, etcd came to name another leader, or none.
    Replaced,
    /// The leader did not answer within [`answer_timeout`].
    TooLong,
}

impl Forwarder {
    /// Sends the request to `base` and waits for the answer's head until `deadline`,
    /// checking every [`LEADER_RECHECK`] that `base` still leads.
    async fn wait_answer(
        &self,
        base: &str,
        parts: &http::request::Parts,
        body: &Bytes,
        deadline: tokio::time::Instant,
    ) -> Result<reqwest::Response, Silent> {
        let sent = self.send(base, parts, body);
        tokio::pin!(sent);
        loop {
            let next = (tokio::time::Instant::now() + LEADER_RECHECK).min(deadline);
            tokio::select! {
                r = &mut sent => return r.map_err(Silent::Failed),
                () = tokio::time::sleep_until(next) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Silent::TooLong);
                    }
                    match self.recheck().await {
                        Ok(Some(now)) if now == base => {}
                        Ok(_) => return Err(Silent::Replaced),
                        // etcd unreachable: keep waiting for the leader until the deadline.
                        Err(_) => {}
                    }
                }
            }
        }
    }
}

/// The innermost cause of a transport error ("Connection refused (os error 111)").
fn root_cause(e: &reqwest::Error) -> String {
    xce_stdx::logging::root_cause(e)
}
