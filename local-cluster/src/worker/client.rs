//! The worker's side of the `/internal/v1` protocol (see [`crate::proto`]).

use plugin_api::HostFacts;
use reqwest::{StatusCode, Url};
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
    Unreachable(#[source] reqwest::Error),
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
    Decode(#[source] reqwest::Error),
}

impl CallError {
    pub(crate) fn status(&self) -> Option<StatusCode> {
        match self {
            CallError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client for one host's routes.
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    host_base: Url,
    auth: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("host_base", &self.host_base.as_str())
            .finish_non_exhaustive()
    }
}

/// Why the controller URL is unusable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("controller url {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("building the http client: {0}")]
    Build(#[source] reqwest::Error),
}

impl Client {
    pub(crate) fn new(controller: &str, host: &str, credential: &str) -> Result<Self, ClientError> {
        let bad = |reason: String| ClientError::BadUrl {
            url: controller.to_owned(),
            reason,
        };
        let mut url = Url::parse(controller).map_err(|e| bad(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(bad("must be an http:// or https:// url".into()));
        }
        url.path_segments_mut()
            .map_err(|()| bad("cannot be a base url".into()))?
            .pop_if_empty()
            .extend(["internal", "v1", "hosts", host, ""]);
        let http = reqwest::Client::builder()
            // The controller address is explicit config; a proxy from the environment
            // must not reroute it.
            .no_proxy()
            .connect_timeout(CALL_TIMEOUT)
            .build()
            .map_err(ClientError::Build)?;
        Ok(Self {
            http,
            host_base: url,
            auth: format!("Bearer {credential}"),
        })
    }

    fn url(&self, leaf: &str) -> Url {
        // `host_base` ends with '/', so joining a relative leaf stays under it.
        self.host_base
            .join(leaf)
            .expect("a plain relative path joins")
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response, CallError> {
        let resp = req
            .header(reqwest::header::AUTHORIZATION, &self.auth)
            .send()
            .await
            .map_err(CallError::Unreachable)?;
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
            .send(
                self.http
                    .post(self.url("register"))
                    .timeout(CALL_TIMEOUT)
                    .json(req),
            )
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    pub(crate) async fn heartbeat(&self) -> Result<(), CallError> {
        self.send(self.http.post(self.url("heartbeat")).timeout(CALL_TIMEOUT))
            .await
            .map(drop)
    }

    pub(crate) async fn put_facts(&self, facts: &HostFacts) -> Result<(), CallError> {
        self.send(
            self.http
                .put(self.url("facts"))
                .timeout(CALL_TIMEOUT)
                .json(facts),
        )
        .await
        .map(drop)
    }

    /// The blocking query: answers when the host's index passes `index`, or after the
    /// wait with the same index.
    pub(crate) async fn assignments(&self, index: u64) -> Result<Assignments, CallError> {
        let mut url = self.url("assignments");
        url.query_pairs_mut()
            .append_pair("index", &index.to_string())
            .append_pair("wait", &format!("{}s", ASSIGNMENTS_WAIT.as_secs()));
        let resp = self
            .send(self.http.get(url).timeout(ASSIGNMENTS_WAIT + CALL_TIMEOUT))
            .await?;
        resp.json().await.map_err(CallError::Decode)
    }

    pub(crate) async fn events(&self, events: &[WorkerEvent]) -> Result<(), CallError> {
        self.send(
            self.http
                .post(self.url("events"))
                .timeout(CALL_TIMEOUT)
                .json(events),
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(base: &str, expect: expect_test::Expect) {
        let out = match Client::new(base, "exec-01", "s3cret") {
            Ok(c) => format!("{} {}", c.url("register"), c.url("assignments")),
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
    }
}
