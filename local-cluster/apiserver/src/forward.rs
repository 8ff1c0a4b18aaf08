//! Forwarding to the leader controller: every route the apiserver does not serve from its
//! own copy goes to the controller the etcd leader key names. Which one that is comes
//! from the leader watch (`leader.rs`: an etcd watch on the key, not a read per request),
//! and a request that waits for a leader's answer is told as soon as the key names
//! another leader, or none.

use super::leader::Seen;
use super::metrics::Metrics;
use super::parked::{self, is_parked, ParkedPool, Seat};
use axum::body::{Body, Bytes};
use axum::extract::FromRequestParts as _;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use plugin_api::{ApiError, ApiExtension, Parked, Principal, PrincipalKind};
use retry_backoff::Backoff;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use xce_wire::version::{protocol, FORWARDED_PROTOCOL_HEADER, PROTOCOL_HEADER, SKEW_HEADER};

/// Forwards requests to the leader controller.
#[derive(Clone)]
pub(super) struct Forwarder {
    pub(super) http: reqwest::Client,
    /// The leader key, as the leader watch last learned it.
    pub(super) leader: watch::Receiver<Seen>,
    pub(super) metrics: Metrics,
    pub(super) body_limit: usize,
    /// `https` when the controllers serve TLS, else `http`.
    pub(super) scheme: &'static str,
    /// The cluster id, as the store said at start (shown by `/healthz`).
    pub(super) cluster_id: Option<Arc<str>>,
    /// The leader connections of parked requests (`parked.rs`), apart from `http`'s.
    pub(super) parked: ParkedPool,
    /// Whose watcher caps a parked request counts against.
    pub(super) extensions: Vec<Arc<dyn ApiExtension>>,
    /// How fresh this apiserver's copy is (shown by `/healthz`).
    pub(super) fresh: Arc<super::fresh::Freshness>,
}

/// A leader, as the leader key names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `HOST/PID@ADDR`: a new process on the old leader's address is another leader.
    id: String,
    /// Its base URL.
    url: String,
}

/// One request to forward: its head and body (read whole, so that it can be sent again),
/// and when to stop waiting for an answer.
struct Call {
    /// The client it goes over: the ordinary one, or a parked request's seat's.
    http: reqwest::Client,
    parts: http::request::Parts,
    body: Bytes,
    deadline: tokio::time::Instant,
}

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

/// The header a standby controller marks its 503s with (see `controller::standby`).
pub(super) const STANDBY_HEADER: &str = "x-xce-standby";
/// How long the leader may take to answer an ordinary request (and past its `wait`, a
/// blocking query) before the apiserver stops waiting and answers 503 `no_leader`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The first and the longest pause before a standby's address is tried again (see
/// [`Forwarder::deliver`]): an elected controller serves milliseconds after its standby
/// listener last answered.
const STANDBY_RETRY: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));
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
    /// The leader the key names now, marked seen on `leader` (so that its next change
    /// wakes the waits below); the reason for a 503 when there is none to send to.
    fn target(&self, leader: &mut watch::Receiver<Seen>) -> Result<Target, String> {
        match &*leader.borrow_and_update() {
            Seen::Unknown(why) => Err(format!("cannot reach etcd to find the leader: {why}")),
            Seen::Known(None) => Err("no controller leads now".into()),
            Seen::Known(Some(id)) => match leader_url(self.scheme, id) {
                Some(url) => Ok(Target {
                    id: id.clone(),
                    url,
                }),
                None => Err(format!("the leader key holds {id:?}, not HOST/PID@ADDR")),
            },
        }
    }

    async fn send(&self, base: &str, call: &Call) -> reqwest::Result<reqwest::Response> {
        let parts = &call.parts;
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut req = call
            .http
            .request(parts.method.clone(), format!("{base}{path}"))
            .body(call.body.clone());
        for (name, value) in end_to_end(&parts.headers) {
            req = req.header(name, value);
        }
        // Its own protocol, beside the client's (a worker's passes as it is): the leader
        // refuses an apiserver outside the skew (UPGRADING.md).
        req.header(FORWARDED_PROTOCOL_HEADER, protocol())
            .send()
            .await
    }

    /// Takes a parked request's places: among its caller's watchers (authenticated here,
    /// before anything goes to the leader), then on the pool. The refusal otherwise
    /// (401/403, or 429 past a cap or with the pool full), counted.
    async fn park(&self, parts: &mut http::request::Parts) -> Result<Held, Response> {
        let who = Principal::from_request_parts(parts, &())
            .await
            .map_err(IntoResponse::into_response)?;
        // A worker's assignments poll (when workers talk through apiservers) is its
        // host's protocol, one per host: carried by the pool, but no user's watcher.
        let places = if matches!(who.kind, PrincipalKind::Worker { .. }) {
            Vec::new()
        } else {
            self.extensions
                .iter()
                .filter_map(|e| e.park(&who))
                .collect::<Result<Vec<_>, ApiError>>()
                .map_err(|e| {
                    self.metrics.forwarded("over_watcher_cap");
                    e.into_response()
                })?
        };
        let seat = self.parked.seat().ok_or_else(|| {
            self.metrics.forwarded("parked_pool_full");
            tracing::debug!(principal = %who.name, "parked request refused: the pool to the leader is full");
            parked::full()
        })?;
        Ok(Held {
            seat,
            _places: places,
        })
    }
}

/// What a parked request holds until its answer is relayed.
struct Held {
    seat: Seat,
    _places: Vec<Parked>,
}

/// The leader refused this apiserver's protocol version: said loudly (the answer, which
/// says the same, goes to the client as it is). Nothing this apiserver forwards goes
/// through until one of them is upgraded; its own reads follow the store as before.
fn log_refused(target: &Target, answer: &reqwest::Response) {
    let theirs = answer
        .headers()
        .get(PROTOCOL_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("?");
    tracing::error!(
        leader = %target.url,
        apiserver_protocol = protocol(),
        leader_protocol = theirs,
        "the leader controller refuses this apiserver: it speaks protocol {}, the leader \
         protocol {theirs}, outside the supported skew; upgrade the older one (UPGRADING.md)",
        protocol()
    );
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
/// leader that cannot be connected to (it died; the key names it until its lease runs
/// out) is tried once more, as the key names it by then: nothing was sent to it, so
/// nothing repeats. A leader that takes the request but does not answer — frozen, or gone
/// in the middle — is given up on as soon as the leader watch learns that another one (or
/// none) leads, or after [`answer_timeout`]: the answer is 503 `no_leader` with
/// `Retry-After` then, never a transport error.
///
/// A parked request (a blocking query) is counted and sent over the parked pool
/// (`parked.rs`), never over the ordinary client.
///
/// The caller is authenticated first (`_caller`: a 401 otherwise, before anything else):
/// a request without a valid token never has its body read or anything forwarded, so an
/// anonymous client that announces a body and never sends it holds nothing here. The
/// leader authenticates and authorizes the request again, as one sent to it directly.
pub(super) async fn forward(
    State(fwd): State<Forwarder>,
    _caller: Principal,
    req: Request,
) -> Response {
    let (mut parts, body) = req.into_parts();
    let held = if is_parked(&parts) {
        match fwd.park(&mut parts).await {
            Ok(held) => Some(held),
            Err(refusal) => return refusal,
        }
    } else {
        None
    };
    let Ok(body) = axum::body::to_bytes(body, fwd.body_limit).await else {
        // Rendered in the error shape, with the limit, by the router's `json_errors`; a
        // body that did not arrive in time is answered 408 by the accept loop instead.
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let deadline = tokio::time::Instant::now() + answer_timeout(&parts);
    let call = Call {
        http: held.as_ref().map_or(&fwd.http, |h| &h.seat.http).clone(),
        parts,
        body,
        deadline,
    };
    match fwd.deliver(&call).await {
        Ok((target, answer)) => {
            fwd.metrics.forwarded("ok");
            fwd.read_your_write(&call.parts, &answer).await;
            relay(&target.url, answer, &call.parts.method).await
        }
        Err(refusal) => refusal,
    }
}

impl Forwarder {
    /// A change the leader answered with success and an index (`X-Xce-Index`, the
    /// revision it committed) is relayed once this apiserver's copy has applied that
    /// revision, so a read sent here after the answer sees the change (read your writes),
    /// the way it does on the controller. Bounded by `max_lag`: past it this apiserver
    /// fails its reads closed anyway. The workers' protocol (`/internal/`) is left out:
    /// nothing they do reads the endpoint table after their reports.
    async fn read_your_write(&self, parts: &http::request::Parts, answer: &reqwest::Response) {
        if parts.method.is_safe()
            || !answer.status().is_success()
            || parts.uri.path().starts_with("/internal/")
        {
            return;
        }
        let Some(index) = answer
            .headers()
            .get("x-xce-index")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        else {
            return;
        };
        let mut applied = self.fresh.applied.subscribe();
        let caught_up = applied.wait_for(|a| *a >= index);
        if tokio::time::timeout(self.fresh.max_lag, caught_up)
            .await
            .is_err()
        {
            tracing::warn!(index, applied = *applied.borrow(), max_lag = ?self.fresh.max_lag, "a forwarded change is answered before this apiserver applied it");
        }
    }

    /// Sends `call` to the leader until one answers it: the leader and its answer's head,
    /// or the 503 to answer instead (counted).
    async fn deliver(&self, call: &Call) -> Result<(Target, reqwest::Response), Response> {
        let mut leader = self.leader.clone();
        let mut retried = false;
        let mut standby_pauses = Backoff::new(STANDBY_RETRY.0, STANDBY_RETRY.1);
        loop {
            let target = self.target(&mut leader).map_err(|msg| {
                self.metrics.forwarded("no_leader");
                no_leader(msg)
            })?;
            match self.wait_answer(&target, call, &mut leader).await {
                // A standby on the address etcd names. Either the leader died and a new
                // process took its port before the old lease ran out, or the key names
                // this very controller, elected a moment ago and still answering from
                // its standby listener until it has stopped it and bound the API. Its
                // answer is a valid 503 that did nothing: relaying it would keep
                // clients on a standby. Try again when the key names another leader,
                // or after a pause (nothing announces the end of the second case; it
                // takes milliseconds), until the deadline.
                Ok(r) if r.headers().contains_key(STANDBY_HEADER) => {
                    self.metrics.forwarded("standby");
                    let again = tokio::time::Instant::now() + standby_pauses.next_pause();
                    let next = other_leader(&mut leader, &target.id);
                    let _ = tokio::time::timeout_at(again.min(call.deadline), next).await;
                    if tokio::time::Instant::now() >= call.deadline {
                        self.metrics.forwarded("no_leader");
                        return Err(no_leader(format!(
                            "the controller at {} is a standby, not the leader; a takeover is under way",
                            target.url
                        )));
                    }
                }
                Ok(r) => {
                    if r.headers()
                        .get(SKEW_HEADER)
                        .is_some_and(|v| v == "apiserver")
                    {
                        log_refused(&target, &r);
                    }
                    return Ok((target, r));
                }
                Err(Silent::Failed(e)) if e.is_connect() && !retried => {
                    tracing::info!(leader = %target.url, error = %e, "leader unreachable: trying once more");
                    retried = true;
                }
                Err(why) => {
                    self.metrics.forwarded("unreachable");
                    let msg = why.explain(&target.url, &call.parts.method);
                    tracing::warn!(uri = %call.parts.uri, "{msg}");
                    return Err(no_leader(msg));
                }
            }
        }
    }

    /// Sends `call` to `target` and waits for the answer's head until the deadline, or
    /// until `leader` names another leader (or none).
    async fn wait_answer(
        &self,
        target: &Target,
        call: &Call,
        leader: &mut watch::Receiver<Seen>,
    ) -> Result<reqwest::Response, Silent> {
        tokio::select! {
            r = self.send(&target.url, call) => r.map_err(Silent::Failed),
            () = tokio::time::sleep_until(call.deadline) => Err(Silent::TooLong),
            () = replaced(leader, &target.id) => Err(Silent::Replaced),
        }
    }
}

/// Resolves once the key names a leader other than `id`, or none. Never while etcd has
/// not been read at all: nothing is known to have changed then.
async fn replaced(leader: &mut watch::Receiver<Seen>, id: &str) {
    loop {
        if let Seen::Known(now) = &*leader.borrow_and_update() {
            if now.as_deref() != Some(id) {
                return;
            }
        }
        if leader.changed().await.is_err() {
            // The watcher is gone (the apiserver stops): nothing changes any more.
            std::future::pending::<()>().await;
        }
    }
}

/// Resolves once the key names a leader other than `id` (none is not enough: a takeover
/// is under way then).
async fn other_leader(leader: &mut watch::Receiver<Seen>, id: &str) {
    loop {
        if let Seen::Known(Some(now)) = &*leader.borrow_and_update() {
            if now != id {
                return;
            }
        }
        if leader.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// The leader's answer as it is (status, end-to-end headers, body); one whose body breaks
/// off is a 503 `no_leader`.
async fn relay(base: &str, answer: reqwest::Response, method: &http::Method) -> Response {
    let mut resp = Response::builder().status(answer.status());
    for (name, value) in end_to_end(answer.headers()) {
        resp = resp.header(name, value);
    }
    let bytes = match answer.bytes().await {
        Ok(b) => b,
        Err(e) => {
            return no_leader(format!(
                "the answer of the leader controller at {base} broke off ({}){}",
                root_cause(&e),
                outcome_note(method)
            ))
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

impl Silent {
    /// What the 503 says of the leader at `base`, and of whether a change may have been
    /// applied.
    fn explain(self, base: &str, method: &http::Method) -> String {
        match self {
            Silent::Failed(e) if e.is_connect() => format!(
                "the leader controller at {base} cannot be reached ({}); a takeover may be under way",
                root_cause(&e)
            ),
            Silent::Failed(e) => format!(
                "the leader controller at {base} did not answer ({}){}",
                root_cause(&e),
                outcome_note(method)
            ),
            Silent::Replaced => format!(
                "the leader controller at {base} stopped answering and no longer leads{}",
                outcome_note(method)
            ),
            Silent::TooLong => format!(
                "the leader controller at {base} did not answer in time{}",
                outcome_note(method)
            ),
        }
    }
}

/// The innermost cause of a transport error ("Connection refused (os error 111)").
fn root_cause(e: &reqwest::Error) -> String {
    xce_stdx::logging::root_cause(e)
}
