//! The worker's side of the `/internal/v1` protocol (see [`crate::proto`]).

use plugin_api::HostFacts;
use reqwest::{StatusCode, Url};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::proto::{Assignments, RegisterRequest, RegisterResponse, WorkerEvent};

/// How long an ordinary call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the controller may hold an assignments query (`wait=30s`).
pub(crate) const ASSIGNMENTS_WAIT: Duration = Duration::from_secs(30);

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    /// No answer (connection refused, timeout, ...).
    #[error("controller unreachable: {0}")]
    Unreachable(reqwest::Error),
    /// An answer other than success.
    #[error("controller answered {status}: {body}")]
    Status {
        /// The status.
        status: StatusCode,
        /// The body, for the log (the controller never echoes secrets).
        body: String,
    },
    /// A success whose body is not what the protocol says.
    #[error("controller answer not understood: {0}")]
    Decode(reqwest::Error),
}

impl CallError {
    pub(crate) fn status(&self) -> Option<StatusCode> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client for one host's routes, on one controller or several (only the leader
/// listens: a refused connection moves on to the next one, and the one that answered is
/// tried first from then on, by every task sharing the client).
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    /// `<base>/internal/v1/hosts/<host>/` of every controller, in the configured order.
    host_bases: Arc<[Url]>,
    /// Which of them answered last.
    current: Arc<AtomicUsize>,
    auth: String,
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
}

impl Client {
    /// `controller`: one base URL, or several separated by commas (tried in order).
    pub(crate) fn new(controller: &str, host: &str, credential: &str) -> Result<Self, ClientError> {
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
            if !matches!(url.scheme(), "http" | "https") {
                return Err(bad("must be an http:// or https:// url".into()));
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
            .build()
            .map_err(ClientError::Build)?;
        Ok(Self {
            http,
            host_bases: host_bases.into(),
            current: Arc::new(AtomicUsize::new(0)),
            auth: format!("Bearer {credential}"),
        })
    }

    fn url_at(&self, at: usize, leaf: &str) -> Url {
        // A host base ends with '/', so joining a relative leaf stays under it.
        self.host_bases[at % self.host_bases.len()]
            .join(leaf)
            .expect("a plain relative path joins")
    }

    /// Sends the request `build` makes for the URL of `leaf`, to the controller that
    /// answered last; with several, a connection failure moves on to the next one (each
    /// is tried once per call).
    async fn send(
        &self,
        leaf: &str,
        build: impl Fn(Url) -> reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, CallError> {
        let n = self.host_bases.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut k = 0;
        let resp = loop {
            let at = (start + k) % n;
            let sent = build(self.url_at(at, leaf))
                .header(reqwest::header::AUTHORIZATION, &self.auth)
                .send()
                .await;
            match sent {
                Ok(resp) => {
                    if at != start {
                        self.current.store(at, Ordering::Relaxed);
                        tracing::info!(
                            controller = %self.host_bases[at].origin().ascii_serialization(),
                            "switched to the controller that answers"
                        );
                    }
                    break resp;
                }
                Err(e) if e.is_connect() && k + 1 < n => k += 1,
                Err(e) => return Err(CallError::Unreachable(e)),
            }
        };
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        let body = resp.text().await.unwrap_or_default();
        Err(CallError::Status { status, body })
    }

    pub(crate) async fn register(
        &self,
        req: &RegisterRequest,
    ) -> Result<RegisterResponse, CallError> {
        let resp = self
            .send("register", |url| {
                self.http.post(url).timeout(CALL_TIMEOUT).json(req)
            })
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    pub(crate) async fn heartbeat(&self) -> Result<(), CallError> {
        self.send("heartbeat", |url| self.http.post(url).timeout(CALL_TIMEOUT))
            .await
            .map(drop)
    }

    pub(crate) async fn put_facts(&self, facts: &HostFacts) -> Result<(), CallError> {
        self.send("facts", |url| {
            self.http.put(url).timeout(CALL_TIMEOUT).json(facts)
        })
        .await
        .map(drop)
    }

    /// The blocking query: answers when the host's index passes `index`, or after the
    /// wait with the same index.
    pub(crate) async fn assignments(&self, index: u64) -> Result<Assignments, CallError> {
        let resp = self
            .send("assignments", |mut url| {
                url.query_pairs_mut()
                    .append_pair("index", &index.to_string())
                    .append_pair("wait", &format!("{}s", ASSIGNMENTS_WAIT.as_secs()));
                self.http.get(url).timeout(ASSIGNMENTS_WAIT + CALL_TIMEOUT)
            })
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    pub(crate) async fn events(&self, events: &[WorkerEvent]) -> Result<(), CallError> {
        self.send("events", |url| {
            self.http.post(url).timeout(CALL_TIMEOUT).json(events)
        })
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(base: &str, expect: expect_test::Expect) {
        let out = match Client::new(base, "exec-01", "s3cret") {
            Ok(c) => (0..c.host_bases.len())
                .map(|i| format!("{} {}", c.url_at(i, "register"), c.url_at(i, "assignments")))
                .collect::<Vec<_>>()
                .join("\n"),
            Err(e) => e.to_string(),
        };
        assert!(!format!("{:?}", Client::new(base, "exec-01", "s3cret")).contains("s3cret"));
        expect.assert_eq(&out);
    }

    #[test]
    fn builds_host_urls() {
        check(
            "http://127.0.0.1:7480",
            expect_test::expect!["http://127.0.0.1:7480/internal/v1/hosts/exec-01/register http://127.0.0.1:7480/internal/v1/hosts/exec-01/assignments"],
        );
        check(
            "http://ctl.example:80/xce/",
            expect_test::expect!["http://ctl.example/xce/internal/v1/hosts/exec-01/register http://ctl.example/xce/internal/v1/hosts/exec-01/assignments"],
        );
        check(
            "127.0.0.1:7480",
            expect_test::expect![[
                r#"controller url "127.0.0.1:7480": relative URL without a base"#
            ]],
        );
        check(
            "http://127.0.0.1:7480, http://127.0.0.1:7481/",
            expect_test::expect![[r#"
                http://127.0.0.1:7480/internal/v1/hosts/exec-01/register http://127.0.0.1:7480/internal/v1/hosts/exec-01/assignments
                http://127.0.0.1:7481/internal/v1/hosts/exec-01/register http://127.0.0.1:7481/internal/v1/hosts/exec-01/assignments"#]],
        );
        check(
            "http://127.0.0.1:7480,,http://127.0.0.1:7481",
            expect_test::expect![[
                r#"controller url "http://127.0.0.1:7480,,http://127.0.0.1:7481": a url in the list is empty"#
            ]],
        );
        check(
            "http://127.0.0.1:7480,ftp://x",
            expect_test::expect![[
                r#"controller url "ftp://x": must be an http:// or https:// url"#
            ]],
        );
    }

    /// A controller that answers heartbeats and counts them.
    async fn answering() -> (String, Arc<AtomicUsize>) {
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let app = axum::Router::new().route(
            "/internal/v1/hosts/{host}/heartbeat",
            axum::routing::post(move || {
                counted.fetch_add(1, Ordering::Relaxed);
                async { StatusCode::NO_CONTENT }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), hits)
    }

    /// A base URL nothing listens on (a standby, or a dead controller).
    fn refusing() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }

    #[tokio::test]
    async fn moves_on_to_the_controller_that_answers_and_stays_there() {
        let (live, hits) = answering().await;
        let dead = refusing();
        let mut log = Vec::new();
        let one = Client::new(&dead, "exec-01", "s").unwrap();
        log.push(format!("dead alone: {}", one.heartbeat().await.is_ok()));
        let c = Client::new(&format!("{dead},{live}"), "exec-01", "s").unwrap();
        for _ in 0..2 {
            c.heartbeat().await.unwrap();
            log.push(format!(
                "dead,live: current {} hits {}",
                c.current.load(Ordering::Relaxed),
                hits.load(Ordering::Relaxed)
            ));
        }
        // The answering one first: the refusing one is not tried while it answers.
        let c = Client::new(&format!("{live},{dead}"), "exec-01", "s").unwrap();
        c.heartbeat().await.unwrap();
        log.push(format!(
            "live,dead: current {} hits {}",
            c.current.load(Ordering::Relaxed),
            hits.load(Ordering::Relaxed)
        ));
        expect_test::expect![[r#"
            dead alone: false
            dead,live: current 1 hits 1
            dead,live: current 1 hits 2
            live,dead: current 0 hits 3"#]]
        .assert_eq(&log.join("\n"));
    }
}
