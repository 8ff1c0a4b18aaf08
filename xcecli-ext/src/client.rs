//! The HTTP client of the apiserver's REST API: one place that builds requests, sends the
//! bearer token, and sorts every failure into a [`CliError`].

use crate::error::{CliError, ErrorKind};
use crate::http_error::{
    status_error, transport_error, without_query, NO_LEADER_RETRY, NO_LEADER_RETRY_MAX,
};
use crate::io::{warn, Io};
use crate::model::{EndpointEntry, HostAnswer, HostList, ServiceDetail, ServiceList, StopAnswer};
use plugin_api::ErrorBody;
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, StatusCode, Url};
use std::sync::atomic::Ordering;
use std::time::Duration;
use xce_wire::version::{
    build, parse_protocol, protocol, PROTOCOL_HEADER, UNVERSIONED, VERSION_HEADER,
};

/// How long an ordinary (non-blocking) request may take, connect included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than its `wait` a blocking query may take before the connection is
/// considered dead (the server answers at `wait` at the latest).
const BLOCKING_SLACK: Duration = Duration::from_secs(30);
/// The header carrying the service's change index on every answer (docs/api.md).
const INDEX_HEADER: &str = "x-xce-index";
/// What the host passes in: where the apiserver is and who we are. The host resolves these
/// from flags, `XCE_API`/`XCE_TOKEN` and the config file; this crate reads none of them.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientConfig {
    /// Base URL, e.g. `http://127.0.0.1:7480` or `https://api.example:7480`, or several,
    /// comma-separated (apiservers of one cluster: a request that cannot connect to one
    /// goes to the next).
    pub api: String,
    /// The CA certificate(s) (PEM) an `https://` apiserver's certificate must be signed
    /// by; the system's roots when `None`.
    pub ca_file: Option<std::path::PathBuf>,
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
    /// `Retry-After` in seconds, when the answer had one.
    retry_after: Option<Duration>,
    /// Which build answered.
    server: ServerBuild,
}

/// The build that answered, from its `X-Xce-Version` and `X-Xce-Protocol` (a server from
/// before these headers sends neither: protocol 1, version unknown).
#[derive(Debug, Clone)]
struct ServerBuild {
    version: Option<String>,
    protocol: u32,
}

impl ServerBuild {
    fn of(headers: &reqwest::header::HeaderMap) -> Self {
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
        Self {
            version: header(VERSION_HEADER).map(str::to_owned),
            protocol: parse_protocol(header(PROTOCOL_HEADER)).unwrap_or(UNVERSIONED),
        }
    }

    /// The error for a command an older server cannot do (`what`), naming both versions;
    /// `None` when the server is not older than this client.
    fn too_old(&self, url: &Url, what: &str) -> Option<CliError> {
        if self.protocol >= protocol() {
            return None;
        }
        let theirs = match &self.version {
            Some(v) => format!("xce {v}, protocol {}", self.protocol),
            None => format!(
                "a release from before version headers, protocol {}",
                self.protocol
            ),
        };
        let ours = format!("xcecli {}", build().header());
        Some(
            CliError::new(
                ErrorKind::ServerTooOld,
                format!(
                    "the server at {} is too old to {what}: it runs {theirs}; this is {ours}, \
                     protocol {}",
                    crate::http_error::without_query(url),
                    protocol()
                ),
            )
            .with_hint("upgrade the server (UPGRADING.md), or use the xcecli of its release"),
        )
    }

    /// An answer saying the route does not exist (404 `no such route`, 405) from a server
    /// older than this client: the server is too old, never "service not found".
    fn lacks_route(&self, url: &Url, reply: &Reply) -> Option<CliError> {
        let missing = match reply.status {
            StatusCode::METHOD_NOT_ALLOWED => true,
            StatusCode::NOT_FOUND => ErrorBody::parse(reply.text.as_bytes())
                .is_some_and(|b| b.error.message == "no such route"),
            _ => false,
        };
        if !missing {
            return None;
        }
        self.too_old(url, "answer this command (it has no such route)")
    }
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
    /// Errors ([`ErrorKind::Config`]): the URL does not parse, is not `http` or `https`,
    /// the token cannot travel in an HTTP header, or the CA file is unusable.
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
        let mut http = reqwest::Client::builder()
            // The library never reads the environment: no proxy from HTTP_PROXY & co.
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT);
        // Trust is set up only when it is needed: reading the system's roots costs a
        // one-shot command more than its request to a plain http:// apiserver.
        if config.ca_file.is_some() || bases.iter().any(|b| b.scheme() == "https") {
            let tls =
                control_tls::client::client_config(config.ca_file.as_deref()).map_err(|e| {
                    CliError::new(ErrorKind::Config, e.to_string())
                        .with_hint("check --ca-file, XCE_CA_FILE or the config file's ca_file")
                })?;
            http = http.tls_backend_preconfigured(tls);
        } else {
            // Plain http:// only: a TLS set-up that reads no files (see `trust_nothing`).
            let tls = control_tls::client::trust_nothing()
                .map_err(|e| CliError::new(ErrorKind::Internal, e.to_string()))?;
            http = http.tls_backend_preconfigured(tls);
        }
        let http = http.build().map_err(|e| {
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
        } else if let Some(e) = reply.server.lacks_route(&url, &reply) {
            Err(e)
        } else {
            let mut e = status_error(&url, reply.status, &reply.text);
            if e.no_leader.is_some() {
                e.no_leader = Some(
                    reply
                        .retry_after
                        .unwrap_or(NO_LEADER_RETRY)
                        .min(NO_LEADER_RETRY_MAX),
                );
            }
            Err(e)
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
        loop {
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
                // A standby controller answers only its health: nothing happened there,
                // so the next address is tried as for a refused connection.
                Ok(resp) if k + 1 < n && is_standby(&resp) => {
                    skipped.push(without_query(&url));
                    k += 1;
                }
                Ok(resp) => {
                    let reply = reply_of(&url, resp).await?;
                    // An apiserver failing closed (behind the store by more than its
                    // max_lag): it served nothing; the next one may be fresh.
                    if k + 1 < n && is_stale(&reply) {
                        skipped.push(without_query(&url));
                        k += 1;
                        continue;
                    }
                    self.current.store(at, Ordering::Relaxed);
                    return Ok((url, reply));
                }
                Err(e) if e.is_connect() && k + 1 < n => {
                    skipped.push(without_query(&url));
                    k += 1;
                }
                Err(e) => return Err(transport_error(&url, &e, &skipped)),
            }
        }
    }
}

/// A whole answer, read.
async fn reply_of(url: &Url, resp: reqwest::Response) -> Result<Reply, CliError> {
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
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let server = ServerBuild::of(resp.headers());
    let text = resp
        .text()
        .await
        .map_err(|e| transport_error(url, &e, &[]))?;
    Ok(Reply {
        status,
        text,
        index,
        change,
        retry_after,
        server,
    })
}

impl Client {
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
}

/// Runs the read `call`, repeating it while the apiserver answers 503 `no_leader` (a
/// controller takeover: a new leader serves within seconds) for at most `patience`,
/// after the pause its `Retry-After` asks for. Each retry and the recovery are noted on
/// stderr. Only for reads: a change that got no answer may have been applied.
pub(crate) async fn read<T, F, Fut>(
    io: &mut Io,
    patience: Duration,
    mut call: F,
) -> Result<T, CliError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, CliError>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    let mut retried = false;
    loop {
        match call().await {
            Err(e) => {
                let Some(pause) = e.no_leader else {
                    return Err(e);
                };
                if tokio::time::Instant::now() + pause >= deadline {
                    return Err(e);
                }
                warn(
                    io,
                    &format!(
                        "{}; retrying in {}",
                        e.message,
                        humantime::format_duration(pause)
                    ),
                )?;
                retried = true;
                tokio::time::sleep(pause).await;
            }
            Ok(v) => {
                if retried {
                    warn(io, "a leader controller answers again")?;
                }
                return Ok(v);
            }
        }
    }
}

impl Client {
    /// The patience of a one-shot read against a takeover: as long as the request
    /// itself may take.
    pub(crate) fn read_patience() -> Duration {
        REQUEST_TIMEOUT
    }

    /// `GET /v1/services/{name}/endpoints`, blocking when `q.block` is set. The entry is
    /// checked ([`check`](crate::model::check)) before it is returned.
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
            // An apiserver from before rollouts has no PUT route; it can still create, but
            // not change a service in place: a service that exists is its version's fault,
            // not the user's (the create's "stop it first" would cause an outage).
            StatusCode::METHOD_NOT_ALLOWED => {
                let too_old = reply.server.too_old(&url, "change a service in place");
                let url = self.url(&["services"]);
                let answer = match self.call(Method::POST, url, REQUEST_TIMEOUT, body).await {
                    Err(e) if e.kind == ErrorKind::Invalid && too_old.is_some() => {
                        return Err(too_old.unwrap_or(e))
                    }
                    r => r?,
                };
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

    /// `POST /v1/hosts/{id}/{action}` (`cordon`, `uncordon`, `drain`): the host as it is
    /// then.
    pub(crate) async fn host_action(
        &self,
        id: &str,
        action: &str,
    ) -> Result<Answer<HostAnswer>, CliError> {
        let url = self.url(&["hosts", id, action]);
        self.call(Method::POST, url, REQUEST_TIMEOUT, None).await
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

/// One apiserver URL of `--api`: `http[s]://HOST[:PORT][/PATH]`.
/// A `503 stale`: the apiserver fails closed (behind the store, or it met what it does not
/// understand) and served nothing.
fn is_stale(reply: &Reply) -> bool {
    reply.status == StatusCode::SERVICE_UNAVAILABLE
        && ErrorBody::parse(reply.text.as_bytes()).is_some_and(|b| b.error.code == "stale")
}

/// A standby controller's `503` (it marks it with `X-Xce-Standby`, so no body is read).
fn is_standby(resp: &reqwest::Response) -> bool {
    resp.status() == StatusCode::SERVICE_UNAVAILABLE && resp.headers().contains_key("x-xce-standby")
}

fn check_base(api: &str) -> Result<Url, String> {
    if !api.contains("://") {
        return Err(format!(
            "invalid apiserver url {api:?}: expected http://HOST:PORT"
        ));
    }
    let base = Url::parse(api).map_err(|e| format!("invalid apiserver url {api:?}: {e}"))?;
    match base.scheme() {
        "http" | "https" => {}
        s => {
            return Err(format!(
                "invalid apiserver url {api:?}: scheme {s:?} is not http or https"
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

#[cfg(test)]
mod tests;
