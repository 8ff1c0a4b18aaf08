//! The HTTP client of the apiserver's REST API: one place that builds requests, sends the
//! bearer token, and sorts every failure into a [`CliError`].

use crate::error::{CliError, ErrorKind};
use crate::model::{
    EndpointEntry, ErrorBody, ErrorDetail, HostList, ServiceDetail, ServiceList, StopAnswer,
};
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long an ordinary (non-blocking) request may take, connect included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than its `wait` a blocking query may take before the connection is
/// considered dead (the server answers at `wait` at the latest).
const BLOCKING_SLACK: Duration = Duration::from_secs(30);
/// The header carrying the service's change index on every answer (DESIGN §5).
const INDEX_HEADER: &str = "x-xce-index";

/// What the host passes in: where the apiserver is and who we are. The host resolves these
/// from flags, `XCE_API`/`XCE_TOKEN` and the config file; this crate reads none of them.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Base URL, e.g. `http://127.0.0.1:7480`, or several, comma-separated (apiservers of
    /// one cluster: a request that cannot connect to one goes to the next). Only `http`
    /// (no TLS in v1).
    pub api: String,
    /// The bearer token, if any.
    pub token: Option<String>,
    /// The project of the services the commands name when no `--project` is given (the
    /// host fills it from `XCE_PROJECT` or the config file); `None` (or empty) lets the
    /// apiserver resolve a name among all the caller's projects. `service submit` does
    /// not use it: the profile names its project.
    pub project: Option<String>,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        f.debug_struct("ClientConfig")
            .field("api", &self.api)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("project", &self.project)
            .finish()
    }
}

/// A service as a request names it: by name, and by project when one was picked (the
/// `?project=` of every request about it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServiceRef<'a> {
    pub(crate) name: &'a str,
    pub(crate) project: Option<&'a str>,
}

/// A client of the apiserver. Cheap to build: no connection is made until the first call.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The apiservers, in the order given.
    bases: std::sync::Arc<[Url]>,
    /// The one that answered last (tried first).
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    auth: Option<HeaderValue>,
    /// [`ClientConfig::project`], `None` when empty.
    project: Option<String>,
}

/// The query of `GET /v1/services/{name}/endpoints`.
#[derive(Debug, Clone, Default)]
pub(crate) struct EndpointsQuery<'a> {
    /// `?port=`.
    pub(crate) port: Option<&'a str>,
    /// `?include=all`.
    pub(crate) all: bool,
    /// `?index=N&wait=…`: a blocking query.
    pub(crate) block: Option<(u64, Duration)>,
}

/// A parsed answer with the body as sent (for `-o json`).
#[derive(Debug, Clone)]
pub(crate) struct Answer<T> {
    pub(crate) value: T,
    pub(crate) raw: String,
    /// The `X-Xce-Index` header, when the answer had a valid one.
    pub(crate) index: Option<u64>,
}

/// A 2xx answer, unparsed.
#[derive(Debug)]
struct Reply {
    status: StatusCode,
    text: String,
    index: Option<u64>,
    /// `X-Xce-Change` of a `PUT`: `created`, `updated` or `unchanged`.
    change: Option<String>,
}

/// What a `PUT` did, as the server says it.
const CHANGE_HEADER: &str = "x-xce-change";

/// How `PUT /v1/services/{name}` went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Put {
    /// 201: the service did not exist.
    Created,
    /// 200 with `X-Xce-Change: updated`: a new generation, or new settings in place.
    Updated,
    /// 200 with `X-Xce-Change: unchanged`: the same profile.
    Unchanged,
    /// 200 from a server that does not say which.
    Replaced,
}

// === impl Client ===

impl Client {
    /// Checks the config and builds the client.
    ///
    /// Errors ([`ErrorKind::Config`]): the URL does not parse, is not `http`, or the token
    /// cannot travel in an HTTP header.
    pub fn new(config: ClientConfig) -> Result<Client, CliError> {
        let config_err = |msg: String| {
            CliError::new(ErrorKind::Config, msg).with_hint(
                "pass --api http://HOST:PORT or set XCE_API (default http://127.0.0.1:7480)",
            )
        };
        let bases = config
            .api
            .split(',')
            .map(|api| check_base(api.trim()).map_err(&config_err))
            .collect::<Result<Vec<Url>, CliError>>()?;
        let auth = match config.token.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                    CliError::new(
                        ErrorKind::Config,
                        "the token contains characters that cannot be sent in an http header",
                    )
                    .with_hint("check XCE_TOKEN, --token or the config file")
                })?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        let http = reqwest::Client::builder()
            // The library never reads the environment: no proxy from HTTP_PROXY & co.
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| {
                CliError::new(
                    ErrorKind::Internal,
                    format!("cannot build the http client: {e}"),
                )
            })?;
        let project = config
            .project
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty());
        Ok(Client {
            http,
            bases: bases.into(),
            current: Default::default(),
            auth,
            project,
        })
    }

    /// The default project of the commands that name a service (see
    /// [`ClientConfig::project`]).
    pub(crate) fn project(&self) -> Option<&str> {
        self.project.as_deref()
    }

    /// The base URL of the apiserver in use (the one that answered last).
    pub fn api(&self) -> &Url {
        &self.bases[self.current.load(Ordering::Relaxed) % self.bases.len()]
    }

    /// The first base + `/v1/<segments…>`, each segment percent-encoded ([`send`] moves it
    /// to the apiserver it tries).
    ///
    /// [`send`]: Self::send
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.bases[0].clone();
        url.set_query(None);
        url.set_fragment(None);
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().push("v1").extend(segments);
        }
        url
    }

    /// `/v1/services/{name}/<rest…>`, with `?project=` when the service's project is known.
    fn service_url(&self, svc: ServiceRef<'_>, rest: &[&str]) -> Url {
        let mut url = self.url(&[&["services", svc.name][..], rest].concat());
        if let Some(p) = svc.project {
            url.query_pairs_mut().append_pair("project", p);
        }
        url
    }

    /// Sends a request and returns a 2xx answer; everything else is sorted into a
    /// [`CliError`].
    async fn send(
        &self,
        method: Method,
        url: Url,
        timeout: Duration,
        body: Option<(&'static str, String)>,
    ) -> Result<Reply, CliError> {
        let (url, reply) = self.exchange(method, url, timeout, body).await?;
        if reply.status.is_success() {
            Ok(reply)
        } else {
            Err(status_error(&url, reply.status, &reply.text))
        }
    }

    /// Sends a request and returns whatever HTTP answer came back, with the URL it went to;
    /// only the lack of an answer is an error here.
    async fn exchange(
        &self,
        method: Method,
        url: Url,
        timeout: Duration,
        body: Option<(&'static str, String)>,
    ) -> Result<(Url, Reply), CliError> {
        // From the apiserver that answered last; one that cannot be connected to is
        // skipped for the next (nothing was sent to it), each tried once.
        let n = self.bases.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut k = 0;
        let mut skipped = Vec::new();
        let (url, resp) = loop {
            let at = (start + k) % n;
            let url = self.on_base(&url, at);
            let mut req = self
                .http
                .request(method.clone(), url.clone())
                .timeout(timeout);
            if let Some(auth) = &self.auth {
                req = req.header(AUTHORIZATION, auth.clone());
            }
            if let Some((content_type, body)) = &body {
                req = req.header(CONTENT_TYPE, *content_type).body(body.clone());
            }
            match req.send().await {
                Ok(resp) => {
                    self.current.store(at, Ordering::Relaxed);
                    break (url, resp);
                }
                Err(e) if e.is_connect() && k + 1 < n => {
                    skipped.push(without_query(&url));
                    k += 1;
                }
                Err(e) => return Err(transport_error(&url, &e, &skipped)),
            }
        };
        let status = resp.status();
        let index = resp
            .headers()
            .get(INDEX_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let change = resp
            .headers()
            .get(CHANGE_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let text = resp
            .text()
            .await
            .map_err(|e| transport_error(&url, &e, &[]))?;
        let reply = Reply {
            status,
            text,
            index,
            change,
        };
        Ok((url, reply))
    }

    /// [`send`](Self::send), then parses the body as `T`.
    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        timeout: Duration,
        body: Option<(&'static str, String)>,
    ) -> Result<Answer<T>, CliError> {
        let reply = self.send(method, url.clone(), timeout, body).await?;
        answer(&url, reply)
    }

    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        url: Url,
        timeout: Duration,
    ) -> Result<Answer<T>, CliError> {
        self.call(Method::GET, url, timeout, None).await
    }

    /// `GET /v1/services/{name}/endpoints`, blocking when `q.block` is set. The entry is
    /// checked ([`EndpointEntry::check`]) before it is returned.
    pub(crate) async fn endpoints(
        &self,
        svc: ServiceRef<'_>,
        q: &EndpointsQuery<'_>,
    ) -> Result<Answer<EndpointEntry>, CliError> {
        let mut url = self.service_url(svc, &["endpoints"]);
        let mut timeout = REQUEST_TIMEOUT;
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(p) = q.port {
                pairs.append_pair("port", p);
            }
            if q.all {
                pairs.append_pair("include", "all");
            }
            if let Some((index, wait)) = q.block {
                pairs.append_pair("index", &index.to_string());
                pairs.append_pair("wait", &format!("{}ms", wait.as_millis()));
                timeout = wait + BLOCKING_SLACK;
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        let answer = self.get::<EndpointEntry>(url, timeout).await?;
        crate::model::check(&answer.value)?;
        Ok(answer)
    }

    /// `GET /v1/services`.
    pub(crate) async fn services(&self) -> Result<Answer<ServiceList>, CliError> {
        let url = self.url(&["services"]);
        self.get(url, REQUEST_TIMEOUT).await
    }

    /// `GET /v1/services/{name}`, a blocking query when `block` (`?index=N&wait=…`) is
    /// set.
    pub(crate) async fn service(
        &self,
        svc: ServiceRef<'_>,
        block: Option<(u64, Duration)>,
    ) -> Result<Answer<ServiceDetail>, CliError> {
        let mut url = self.service_url(svc, &[]);
        let mut timeout = REQUEST_TIMEOUT;
        if let Some((index, wait)) = block {
            url.query_pairs_mut()
                .append_pair("index", &index.to_string())
                .append_pair("wait", &format!("{}ms", wait.as_millis()));
            timeout = wait + BLOCKING_SLACK;
        }
        self.get(url, timeout).await
    }

    /// `POST /v1/services` with a TOML profile: create only.
    pub(crate) async fn submit(&self, toml: String) -> Result<Answer<ServiceDetail>, CliError> {
        let url = self.url(&["services"]);
        let body = Some(("application/toml", toml));
        self.call(Method::POST, url, REQUEST_TIMEOUT, body).await
    }

    /// `PUT /v1/services/{name}[?project=P]` with a TOML profile: create or update. `P`
    /// is the profile's own project, when it names one.
    pub(crate) async fn put(
        &self,
        svc: ServiceRef<'_>,
        toml: String,
    ) -> Result<(Put, Answer<ServiceDetail>), CliError> {
        let url = self.service_url(svc, &[]);
        let body = Some(("application/toml", toml));
        let (url, reply) = self
            .exchange(Method::PUT, url, REQUEST_TIMEOUT, body.clone())
            .await?;
        let put = match reply.status {
            StatusCode::CREATED => Put::Created,
            s if s.is_success() => match reply.change.as_deref() {
                Some("updated") => Put::Updated,
                Some("unchanged") => Put::Unchanged,
                _ => Put::Replaced,
            },
            // An apiserver from before rollouts has no PUT route; it can still create.
            StatusCode::METHOD_NOT_ALLOWED => {
                let url = self.url(&["services"]);
                let answer = self.call(Method::POST, url, REQUEST_TIMEOUT, body).await?;
                return Ok((Put::Created, answer));
            }
            s => return Err(status_error(&url, s, &reply.text)),
        };
        Ok((put, answer(&url, reply)?))
    }

    /// `POST /v1/services/{name}/scale` with `{"replicas": N}`.
    pub(crate) async fn scale(
        &self,
        svc: ServiceRef<'_>,
        replicas: u32,
    ) -> Result<Answer<ServiceDetail>, CliError> {
        let url = self.service_url(svc, &["scale"]);
        let body = Some((
            "application/json",
            serde_json::json!({ "replicas": replicas }).to_string(),
        ));
        self.call(Method::POST, url, REQUEST_TIMEOUT, body).await
    }

    /// `POST /v1/services/{name}/restart`.
    pub(crate) async fn restart(
        &self,
        svc: ServiceRef<'_>,
    ) -> Result<Answer<ServiceDetail>, CliError> {
        let url = self.service_url(svc, &["restart"]);
        self.call(Method::POST, url, REQUEST_TIMEOUT, None).await
    }

    /// `DELETE /v1/services/{name}`, with `?now=true` (no drain) when `now`.
    pub(crate) async fn stop(
        &self,
        svc: ServiceRef<'_>,
        now: bool,
    ) -> Result<Answer<StopAnswer>, CliError> {
        let mut url = self.service_url(svc, &[]);
        if now {
            url.query_pairs_mut().append_pair("now", "true");
        }
        self.call(Method::DELETE, url, REQUEST_TIMEOUT, None).await
    }

    /// `GET /v1/hosts`.
    pub(crate) async fn hosts(&self) -> Result<Answer<HostList>, CliError> {
        let url = self.url(&["hosts"]);
        self.get(url, REQUEST_TIMEOUT).await
    }
}

impl Client {
    /// `url` (built on the first base) moved to base `at`: its path below the first base's
    /// path, below base `at`'s.
    fn on_base(&self, url: &Url, at: usize) -> Url {
        if at == 0 {
            return url.clone();
        }
        let first = self.bases[0].path().trim_end_matches('/');
        let rest = url.path().strip_prefix(first).unwrap_or(url.path());
        let mut moved = self.bases[at].clone();
        let prefix = moved.path().trim_end_matches('/').to_owned();
        moved.set_path(&format!("{prefix}{rest}"));
        moved.set_query(url.query());
        moved
    }
}

/// One apiserver URL of `--api`: `http://HOST[:PORT][/PATH]`.
fn check_base(api: &str) -> Result<Url, String> {
    if !api.contains("://") {
        return Err(format!(
            "invalid apiserver url {api:?}: expected http://HOST:PORT"
        ));
    }
    let base = Url::parse(api).map_err(|e| format!("invalid apiserver url {api:?}: {e}"))?;
    match base.scheme() {
        "http" => {}
        "https" => {
            return Err(format!(
                "cannot use {api}: https is not supported (no tls in v1)"
            ))
        }
        s => {
            return Err(format!(
                "invalid apiserver url {api:?}: scheme {s:?} is not http"
            ))
        }
    }
    if base.host().is_none() || base.cannot_be_a_base() {
        return Err(format!("invalid apiserver url {api:?}: no host"));
    }
    Ok(base)
}

/// Parses a 2xx answer's body.
fn answer<T: serde::de::DeserializeOwned>(url: &Url, reply: Reply) -> Result<Answer<T>, CliError> {
    Ok(Answer {
        value: parse(url, &reply.text)?,
        raw: reply.text,
        index: reply.index,
    })
}

fn parse<T: serde::de::DeserializeOwned>(url: &Url, raw: &str) -> Result<T, CliError> {
    serde_json::from_str(raw).map_err(|e| {
        CliError::new(
            ErrorKind::Server,
            format!("cannot read the answer of {}: {e}", without_query(url)),
        )
        .with_hint("the apiserver may be a different version than this xcecli")
    })
}

fn without_query(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.to_string()
}

/// A request that got no HTTP answer (`skipped`: other apiservers that could not be
/// connected to first).
fn transport_error(url: &Url, err: &reqwest::Error, skipped: &[String]) -> CliError {
    // reqwest's own text is generic ("error sending request"); the innermost cause says
    // what happened ("Connection refused (os error 111)").
    let mut cause: &dyn std::error::Error = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let url = without_query(url);
    let message = if err.is_timeout() {
        format!("no answer from the apiserver at {url} in time")
    } else if err.is_connect() {
        format!("cannot reach the apiserver at {url}: {cause}")
    } else {
        format!("lost the connection to the apiserver at {url}: {cause}")
    };
    let message = if skipped.is_empty() {
        message
    } else {
        format!(
            "{message} (could not connect to {} either)",
            skipped.join(", ")
        )
    };
    CliError::new(ErrorKind::Unreachable, message).with_hint(
        "is the apiserver running (e.g. `xced dev`)? pass --api or set XCE_API to its url",
    )
}

/// A non-2xx answer.
fn status_error(url: &Url, status: StatusCode, body: &str) -> CliError {
    let parsed = serde_json::from_str::<ErrorBody>(body)
        .ok()
        .map(|b| b.error);
    let server_message = parsed
        .as_ref()
        .map(|e| e.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| {
            status
                .canonical_reason()
                .unwrap_or("unknown status")
                .to_lowercase()
        });
    let details: Vec<String> = parsed
        .as_ref()
        .map(|e| {
            e.details
                .iter()
                .map(|d| match (d.field.is_empty(), d.reason.is_empty()) {
                    (false, _) => format!("{}: {}", d.field, d.reason),
                    (true, _) => d.reason.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    // A one-problem error often repeats its only detail as its message.
    let details: Vec<String> = details
        .into_iter()
        .filter(|d| *d != server_message)
        .collect();
    let code = parsed.as_ref().map(|e| e.code.as_str()).unwrap_or("");
    match status {
        StatusCode::UNAUTHORIZED => CliError::new(
            ErrorKind::Auth,
            format!("not authenticated: {server_message}"),
        )
        .with_hint("set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config"),
        StatusCode::FORBIDDEN => {
            CliError::new(ErrorKind::Forbidden, format!("forbidden: {server_message}")).with_hint(
                "your token lacks the permission on this project (e.g. job.submit); ask an admin",
            )
        }
        StatusCode::NOT_FOUND => {
            let hint = match query_project(url) {
                Some(p) => format!(
                    "looked in project {p} only; `xcecli service list` shows the services you may view and their projects"
                ),
                None => "`xcecli service list` shows the services you may view".to_owned(),
            };
            CliError::new(ErrorKind::NotFound, server_message).with_hint(hint)
        }
        StatusCode::CONFLICT if code == "ambiguous" => ambiguous(
            &server_message,
            parsed.map(|e| e.details).unwrap_or_default(),
        ),
        StatusCode::BAD_REQUEST
        | StatusCode::CONFLICT
        | StatusCode::PAYLOAD_TOO_LARGE
        | StatusCode::UNPROCESSABLE_ENTITY => {
            let err = CliError::new(ErrorKind::Invalid, server_message).with_details(details);
            match (status, code) {
                (StatusCode::CONFLICT, _) => err.with_hint(
                    "a service with this name exists: stop it first or choose another name",
                ),
                (StatusCode::PAYLOAD_TOO_LARGE, _) => {
                    err.with_hint("the request is larger than the apiserver accepts")
                }
                _ => err,
            }
        }
        s if s.is_server_error() => CliError::new(
            ErrorKind::Server,
            format!(
                "the apiserver failed ({}) on {}: {server_message}",
                s.as_u16(),
                without_query(url)
            ),
        )
        .with_details(details),
        s => CliError::new(
            ErrorKind::Server,
            format!(
                "unexpected answer {} from {}: {server_message}",
                s.as_u16(),
                without_query(url)
            ),
        )
        .with_details(details),
    }
}

/// The `?project=` a request carried.
fn query_project(url: &Url) -> Option<String> {
    url.query_pairs()
        .find(|(k, _)| k == "project")
        .map(|(_, v)| v.into_owned())
}

/// 409 `ambiguous`: the name exists in several of the caller's projects. The server's
/// message lists them and names its query parameter (`pick one with ?project=`); the
/// client says `--project` instead. A detail (`"team-a" has a service "web"`) is shown
/// only when the message does not already list its project.
fn ambiguous(server_message: &str, details: Vec<ErrorDetail>) -> CliError {
    let message = match server_message.find("; pick one with") {
        Some(at) => &server_message[..at],
        None => server_message,
    };
    let listed: Vec<&str> = message
        .rsplit_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(list, _)| list.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let mut projects = Vec::new();
    let mut lines = Vec::new();
    for d in details {
        let project = (d.field == "project")
            .then(|| leading_quoted(&d.reason))
            .flatten();
        match project {
            Some(p) => {
                if !listed.contains(&p.as_str()) {
                    lines.push(format!("{}: {}", d.field, d.reason));
                }
                projects.push(p);
            }
            None if d.field.is_empty() => lines.push(d.reason),
            None => lines.push(format!("{}: {}", d.field, d.reason)),
        }
    }
    let example = projects
        .first()
        .map(String::as_str)
        .or(listed.first().copied())
        .filter(|p| !p.is_empty())
        .map(|p| format!(", e.g. --project {p}"))
        .unwrap_or_default();
    CliError::new(ErrorKind::Ambiguous, message)
        .with_details(lines)
        .with_hint(format!(
            "pick one with --project P (or set XCE_PROJECT){example}"
        ))
}

/// `team-a` of `"team-a" has a service "web"`.
fn leading_quoted(s: &str) -> Option<String> {
    let rest = s.strip_prefix('"')?;
    let (quoted, _) = rest.split_once('"')?;
    (!quoted.is_empty() && !quoted.contains('\\')).then(|| quoted.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    fn check_config(api: &str, token: Option<&str>, expect: Expect) {
        let actual = match Client::new(ClientConfig {
            api: api.to_owned(),
            token: token.map(str::to_owned),
            project: None,
        }) {
            Ok(c) => format!(
                "ok {} auth={}",
                c.url(&["services", "a b/c", "endpoints"]),
                c.auth.is_some()
            ),
            Err(e) => format!("exit {}: {e}", e.exit_code()),
        };
        expect.assert_eq(&actual);
    }

    #[test]
    fn several_apiservers_share_one_path() {
        let c = Client::new(ClientConfig {
            api: "http://a:1/x, http://b:2/y/,http://c:3".into(),
            token: None,
            project: None,
        })
        .unwrap();
        let mut url = c.url(&["services", "web", "endpoints"]);
        url.set_query(Some("index=4&wait=1000ms"));
        let moved: Vec<String> = (0..3).map(|i| c.on_base(&url, i).to_string()).collect();
        expect![[r#"
            [
                "http://a:1/x/v1/services/web/endpoints?index=4&wait=1000ms",
                "http://b:2/y/v1/services/web/endpoints?index=4&wait=1000ms",
                "http://c:3/v1/services/web/endpoints?index=4&wait=1000ms",
            ]
        "#]]
        .assert_debug_eq(&moved);
        check_config(
            "http://a:1,not-a-url",
            None,
            expect![[r#"
                exit 1: error: invalid apiserver url "not-a-url": expected http://HOST:PORT
                hint: pass --api http://HOST:PORT or set XCE_API (default http://127.0.0.1:7480)"#]],
        );
    }

    #[test]
    fn config() {
        check_config(
            "http://127.0.0.1:7480",
            Some("t"),
            expect!["ok http://127.0.0.1:7480/v1/services/a%20b%2Fc/endpoints auth=true"],
        );
        check_config(
            "http://h:1/prefix/?x=1",
            None,
            expect!["ok http://h:1/prefix/v1/services/a%20b%2Fc/endpoints auth=false"],
        );
        check_config(
            "https://h",
            None,
            expect![[r#"
                exit 1: error: cannot use https://h: https is not supported (no tls in v1)
                hint: pass --api http://HOST:PORT or set XCE_API (default http://127.0.0.1:7480)"#]],
        );
        check_config(
            "127.0.0.1:7480",
            None,
            expect![[r#"
                exit 1: error: invalid apiserver url "127.0.0.1:7480": expected http://HOST:PORT
                hint: pass --api http://HOST:PORT or set XCE_API (default http://127.0.0.1:7480)"#]],
        );
        check_config(
            "http://h",
            Some("a\nb"),
            expect![[r#"
                exit 1: error: the token contains characters that cannot be sent in an http header
                hint: check XCE_TOKEN, --token or the config file"#]],
        );
    }

    #[test]
    fn project_in_the_query() {
        let c = Client::new(ClientConfig {
            api: "http://h:1".into(),
            token: None,
            project: Some("  ".into()),
        })
        .unwrap();
        assert_eq!(c.project(), None, "an empty default project is none");
        let svc = |project| ServiceRef {
            name: "web",
            project,
        };
        let mut blocking = c.service_url(svc(Some("team-a")), &[]);
        blocking
            .query_pairs_mut()
            .append_pair("index", "4")
            .append_pair("wait", "1000ms");
        let urls = [
            c.service_url(svc(None), &["endpoints"]),
            c.service_url(svc(Some("team-a")), &["scale"]),
            c.service_url(svc(Some("a b&c=d/é")), &[]),
            blocking,
        ]
        .map(|u| u.to_string());
        expect![[r#"
            [
                "http://h:1/v1/services/web/endpoints",
                "http://h:1/v1/services/web/scale?project=team-a",
                "http://h:1/v1/services/web?project=a+b%26c%3Dd%2F%C3%A9",
                "http://h:1/v1/services/web?project=team-a&index=4&wait=1000ms",
            ]
        "#]]
        .assert_debug_eq(&urls);
    }

    fn check_status(status: u16, body: &str, expect: Expect) {
        check_status_at(
            "http://127.0.0.1:7480/v1/services?x=1",
            status,
            body,
            expect,
        );
    }

    fn check_status_at(url: &str, status: u16, body: &str, expect: Expect) {
        let url = Url::parse(url).unwrap();
        let err = status_error(&url, StatusCode::from_u16(status).unwrap(), body);
        expect.assert_eq(&format!("exit {}: {err}", err.exit_code()));
    }

    #[test]
    fn statuses() {
        check_status(
            401,
            r#"{"error":{"code":"unauthenticated","message":"invalid bearer token","details":[]}}"#,
            expect![[r#"
                exit 5: error: not authenticated: invalid bearer token
                hint: set XCE_TOKEN, pass --token, or run `xced dev` which writes the client config"#]],
        );
        check_status(
            404,
            r#"{"error":{"code":"not_found","message":"service \"web\" not found","details":[]}}"#,
            expect![[r#"
                exit 4: error: service "web" not found
                hint: `xcecli service list` shows the services you may view"#]],
        );
        check_status(
            400,
            r#"{"error":{"code":"invalid","message":"invalid service profile","details":[
                {"field":"service.ports[1].name","reason":"duplicate port name \"http\""},
                {"field":"service.ports[0].port","reason":"must be 1-65535"}]}}"#,
            expect![[r#"
                exit 1: error: invalid service profile
                  service.ports[1].name: duplicate port name "http"
                  service.ports[0].port: must be 1-65535"#]],
        );
        check_status(
            403,
            r#"{"error":{"code":"forbidden","message":"job.submit on project team-a required","details":[]}}"#,
            expect![[r#"
                exit 1: error: forbidden: job.submit on project team-a required
                hint: your token lacks the permission on this project (e.g. job.submit); ask an admin"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"conflict","message":"service \"web\" exists","details":[]}}"#,
            expect![[r#"
                exit 1: error: service "web" exists
                hint: a service with this name exists: stop it first or choose another name"#]],
        );
        check_status_at(
            "http://127.0.0.1:7480/v1/services/web?project=team-a",
            404,
            r#"{"error":{"code":"not_found","message":"service \"web\" not found","details":[]}}"#,
            expect![[r#"
                exit 4: error: service "web" not found
                hint: looked in project team-a only; `xcecli service list` shows the services you may view and their projects"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"ambiguous","message":"service \"web\" exists in several of your projects (team-a, team-b); pick one with ?project=","details":[
                {"field":"project","reason":"\"team-a\" has a service \"web\""},
                {"field":"project","reason":"\"team-b\" has a service \"web\""}]}}"#,
            expect![[r#"
                exit 1: error: service "web" exists in several of your projects (team-a, team-b)
                hint: pick one with --project P (or set XCE_PROJECT), e.g. --project team-a"#]],
        );
        // Worded otherwise: the details carry the projects, the hint still an example.
        check_status(
            409,
            r#"{"error":{"code":"ambiguous","message":"service \"web\" is ambiguous","details":[
                {"field":"project","reason":"\"team-b\" has a service \"web\""},
                {"field":"project","reason":"\"team-c\" has a service \"web\""}]}}"#,
            expect![[r#"
                exit 1: error: service "web" is ambiguous
                  project: "team-b" has a service "web"
                  project: "team-c" has a service "web"
                hint: pick one with --project P (or set XCE_PROJECT), e.g. --project team-b"#]],
        );
        check_status(
            409,
            r#"{"error":{"code":"ambiguous","message":"service \"web\" exists in several of your projects","details":[]}}"#,
            expect![[r#"
                exit 1: error: service "web" exists in several of your projects
                hint: pick one with --project P (or set XCE_PROJECT)"#]],
        );
        check_status(
            502,
            "<html>bad gateway</html>",
            expect!["exit 1: error: the apiserver failed (502) on http://127.0.0.1:7480/v1/services: bad gateway"],
        );
    }
}
