//! A fake apiserver on loopback: the REST shapes of docs/api.md with canned but realistic
//! data, real blocking queries on the endpoints and service detail routes, and a restart
//! that keeps its state (as the real one keeps its indexes).
//!
//! Services are identified by (project, name), as on the real apiserver (docs/api.md): a
//! path's name resolves among the projects (the one token sees them all), `?project=`
//! picks one, and a name in several projects without one answers 409 `ambiguous`. The
//! canned services have distinct names; [`Fake::add_copy`] gives a second project the
//! same name.
//!
//! Rollouts are not simulated: `PUT`, `scale` and `restart` start one (a new generation,
//! `progressing`) and the test moves it on with [`Fake::rollout`], so every step a client
//! sees is one the test chose.

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// The token the fake accepts.
pub(crate) const TOKEN: &str = "test-secret";

/// One replica of a fake service.
#[derive(Debug, Clone)]
struct Replica {
    replica: u32,
    job: String,
    host: String,
    address: String,
    ports: BTreeMap<String, u16>,
    ready: bool,
    generation: u64,
}

/// The `rollout` of a service detail.
#[derive(Debug, Clone)]
pub(crate) struct Rollout {
    pub(crate) generation: u64,
    pub(crate) state: &'static str,
    pub(crate) updated: u32,
    pub(crate) ready: u32,
    pub(crate) outdated: u32,
    pub(crate) reason: Option<String>,
}

#[derive(Debug, Clone)]
struct Svc {
    project: String,
    replicas: u32,
    ports: Vec<String>,
    placed: Vec<Replica>,
    pending_reason: Option<String>,
    index: u64,
    state: &'static str,
    generation: u64,
    rollout: Rollout,
    /// The submitted `[service]` table, to tell an update from an unchanged profile.
    profile: Value,
}

/// (project, name).
type Key = (String, String);

#[derive(Debug, Default)]
struct Inner {
    /// Last index handed out (all services share one counter; each keeps its own).
    counter: u64,
    services: BTreeMap<Key, Svc>,
}

// === impl Inner ===

impl Inner {
    /// A path's name (with the request's `?project=`), as the real apiserver resolves it:
    /// `Err` is the 404 or the 409 `ambiguous` answer.
    fn resolve(&self, name: &str, q: &HashMap<String, String>) -> Result<Key, Box<Response>> {
        if let Some(p) = q.get("project") {
            let key = (p.clone(), name.to_owned());
            return match self.services.contains_key(&key) {
                true => Ok(key),
                false => Err(Box::new(not_found(name))),
            };
        }
        let found: Vec<&Key> = self.services.keys().filter(|(_, n)| n == name).collect();
        match found.as_slice() {
            [] => Err(Box::new(not_found(name))),
            [one] => Ok((*one).clone()),
            many => {
                let projects: Vec<&str> = many.iter().map(|(p, _)| p.as_str()).collect();
                let details: Vec<Value> = projects
                    .iter()
                    .map(|p| json!({"field": "project", "reason": format!("{p:?} has a service {name:?}")}))
                    .collect();
                Err(Box::new(api_error(
                    StatusCode::CONFLICT,
                    "ambiguous",
                    &format!(
                        "service {name:?} exists in several of your projects ({}); pick one with ?project=",
                        projects.join(", ")
                    ),
                    Value::Array(details),
                )))
            }
        }
    }

    /// A test's handle on a service: `project/name`, or a name only one project has.
    fn key(&self, service: &str) -> Key {
        if let Some((p, n)) = service.split_once('/') {
            return (p.to_owned(), n.to_owned());
        }
        let found: Vec<&Key> = self.services.keys().filter(|(_, n)| n == service).collect();
        match found.as_slice() {
            [one] => (*one).clone(),
            other => panic!(
                "{service:?} names {} services: say project/name",
                other.len()
            ),
        }
    }

    fn get_mut(&mut self, service: &str) -> &mut Svc {
        let key = self.key(service);
        self.services.get_mut(&key).expect("known service")
    }
}

/// One logged request: server generation, path, query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Logged {
    pub(crate) generation: u32,
    pub(crate) path: String,
    pub(crate) query: BTreeMap<String, String>,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Bumped on every change: blocking queries wake on it.
    changed: watch::Sender<u64>,
    log: Mutex<Vec<Logged>>,
    /// How many endpoint queries answer 503 before the real answers (a warming apiserver).
    unavailable: Mutex<u32>,
    /// Bumped on every logged request, so tests can wait for a request.
    logged: watch::Sender<usize>,
    /// Answer as an apiserver from before rollouts: no `PUT` (405), no `generation` or
    /// `rollout` in the detail.
    legacy: Mutex<bool>,
}

#[derive(Clone)]
struct AppState {
    shared: Arc<Shared>,
    generation: u32,
    /// Flips to true when this generation shuts down: blocked queries answer at once.
    stopping: watch::Receiver<bool>,
}

/// A running (or stopped) fake apiserver.
pub(crate) struct Fake {
    pub(crate) addr: SocketAddr,
    shared: Arc<Shared>,
    generation: u32,
    running: Option<(oneshot::Sender<()>, watch::Sender<bool>, JoinHandle<()>)>,
}

impl Fake {
    /// Starts on 127.0.0.1 on a free port, with the canned services.
    pub(crate) async fn start() -> Fake {
        let (changed, _) = watch::channel(0);
        let (logged, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            inner: Mutex::new(canned()),
            changed,
            log: Mutex::new(Vec::new()),
            unavailable: Mutex::new(0),
            logged,
            legacy: Mutex::new(false),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut fake = Fake {
            addr,
            shared,
            generation: 0,
            running: None,
        };
        fake.serve(listener);
        fake
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        self.generation += 1;
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (stopping_tx, stopping_rx) = watch::channel(false);
        let state = AppState {
            shared: self.shared.clone(),
            generation: self.generation,
            stopping: stopping_rx,
        };
        let app = router(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.await;
                })
                .await
                .unwrap();
        });
        self.running = Some((stop_tx, stopping_tx, task));
    }

    /// Stops serving: blocked queries answer, the listener closes, connections end.
    pub(crate) async fn stop(&mut self) {
        let (stop, stopping, task) = self.running.take().expect("fake is running");
        stopping.send_replace(true);
        let _ = stop.send(());
        task.await.unwrap();
    }

    /// Serves again on the same address with the same state.
    pub(crate) async fn restart(&mut self) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_reuseaddr(true).unwrap();
        socket.bind(self.addr).unwrap();
        let listener = socket.listen(64).unwrap();
        self.serve(listener);
    }

    /// Marks replica `replica` of `service` ready or not; bumps the service's index.
    pub(crate) fn set_ready(&self, service: &str, replica: u32, ready: bool) -> u64 {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.counter += 1;
        let index = inner.counter;
        let svc = inner.get_mut(service);
        let r = svc
            .placed
            .iter_mut()
            .find(|r| r.replica == replica)
            .expect("placed replica");
        r.ready = ready;
        svc.index = index;
        drop(inner);
        self.shared.changed.send_replace(index);
        index
    }

    /// Moves the rollout of `service` to `rollout` (the service's generation follows it);
    /// bumps the index and wakes blocked queries.
    pub(crate) fn rollout(&self, service: &str, rollout: Rollout) -> u64 {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.counter += 1;
        let index = inner.counter;
        let svc = inner.get_mut(service);
        svc.generation = svc.generation.max(rollout.generation);
        svc.rollout = rollout;
        svc.index = index;
        drop(inner);
        self.shared.changed.send_replace(index);
        index
    }

    /// Removes a service at once (its stop has finished); blocked queries answer 404.
    pub(crate) fn remove(&self, service: &str) {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.counter += 1;
        let index = inner.counter;
        let key = inner.key(service);
        inner.services.remove(&key).expect("known service");
        drop(inner);
        self.shared.changed.send_replace(index);
    }

    /// Answers as an apiserver from before rollouts.
    pub(crate) fn legacy(&self) {
        *self.shared.legacy.lock().unwrap() = true;
    }

    /// Makes the next `n` endpoint queries answer 503, as an apiserver that has not caught
    /// up yet does.
    pub(crate) fn unavailable_for(&self, n: u32) {
        *self.shared.unavailable.lock().unwrap() = n;
    }

    /// Bumps a service's index without changing anything visible.
    pub(crate) fn touch(&self, service: &str) -> u64 {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.counter += 1;
        let index = inner.counter;
        inner.get_mut(service).index = index;
        drop(inner);
        self.shared.changed.send_replace(index);
        index
    }

    /// The index of a service now.
    pub(crate) fn index(&self, service: &str) -> u64 {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.get_mut(service).index
    }

    /// Gives `project` a service named like `service`, a copy of it on other ports
    /// (`+1000`) with other jobs (`+100`), at a fresh index; blocked queries wake (and see
    /// nothing new unless they asked by the bare name). Returns its index.
    pub(crate) fn add_copy(&self, service: &str, project: &str) -> u64 {
        let mut inner = self.shared.inner.lock().unwrap();
        inner.counter += 1;
        let index = inner.counter;
        let key = inner.key(service);
        let mut svc = inner.services[&key].clone();
        svc.project = project.to_owned();
        svc.index = index;
        for r in &mut svc.placed {
            let n: u32 = r.job.trim_start_matches("j-").parse().unwrap();
            r.job = format!("j-{}", n + 100);
            r.ports.values_mut().for_each(|p| *p += 1000);
        }
        let new = (project.to_owned(), key.1);
        assert!(inner.services.insert(new, svc).is_none(), "already there");
        drop(inner);
        self.shared.changed.send_replace(index);
        index
    }

    /// All requests so far.
    pub(crate) fn log(&self) -> Vec<Logged> {
        self.shared.log.lock().unwrap().clone()
    }

    /// Waits until a logged request matches `pred` (bounded by the test's timeout).
    pub(crate) async fn wait_request(&self, pred: impl Fn(&Logged) -> bool) -> Logged {
        let mut rx = self.shared.logged.subscribe();
        loop {
            if let Some(l) = self.log().into_iter().find(|l| pred(l)) {
                return l;
            }
            rx.changed().await.unwrap();
        }
    }

    /// Waits until the client asks for index `index` (it has seen everything before it and
    /// is parked in the blocking query), on `path`, or on any path.
    pub(crate) async fn wait_index(&self, path: Option<&str>, index: u64) -> Logged {
        let index = index.to_string();
        self.wait_request(|l| {
            path.is_none_or(|p| l.path == p) && l.query.get("index") == Some(&index)
        })
        .await
    }

    /// Waits until the client is parked in a blocking query on `path` for the current
    /// index of `service` (`name` or `project/name`).
    pub(crate) async fn parked(&self, service: &str, path: &str) -> Logged {
        self.wait_index(Some(path), self.index(service)).await
    }

    /// Waits until `n` requests are logged (bounded by the test's timeout).
    pub(crate) async fn wait_log_len(&self, n: usize) {
        let mut rx = self.shared.logged.subscribe();
        while self.shared.log.lock().unwrap().len() < n {
            rx.changed().await.unwrap();
        }
    }

    pub(crate) fn generation(&self) -> u32 {
        self.generation
    }
}

fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/services", get(list_services).post(submit))
        .route(
            "/v1/services/{name}",
            get(detail).put(put_service).delete(stop),
        )
        .route("/v1/services/{name}/scale", post(scale))
        .route("/v1/services/{name}/restart", post(restart))
        .route("/v1/services/{name}/endpoints", get(endpoints))
        .route("/v1/hosts", get(hosts))
        .with_state(state)
}

fn api_error(status: StatusCode, code: &str, message: &str, details: Value) -> Response {
    let body = json!({"error": {"code": code, "message": message, "details": details}});
    let mut resp = (status, Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, "Bearer".parse().unwrap());
    }
    resp
}

fn not_found(name: &str) -> Response {
    api_error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!("service {name:?} not found"),
        json!([]),
    )
}

/// Logs the request and checks the bearer token: `Some` is the rejection.
fn admit(
    state: &AppState,
    headers: &HeaderMap,
    path: String,
    query: &HashMap<String, String>,
) -> Option<Response> {
    state.shared.log.lock().unwrap().push(Logged {
        generation: state.generation,
        path,
        query: query.clone().into_iter().collect(),
    });
    state.shared.logged.send_modify(|n| *n += 1);
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match token {
        Some(TOKEN) => None,
        None => Some(api_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "missing bearer token",
            json!([]),
        )),
        Some(_) => Some(api_error(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "invalid bearer token",
            json!([]),
        )),
    }
}

async fn list_services(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = admit(&state, &headers, "/v1/services".into(), &q) {
        return r;
    }
    let inner = state.shared.inner.lock().unwrap();
    // By name, then project: two services of one name side by side.
    let mut sorted: Vec<(&Key, &Svc)> = inner.services.iter().collect();
    sorted.sort_by_key(|((project, name), _)| (name, project));
    let services: Vec<Value> = sorted
        .into_iter()
        .map(|((_, name), s)| {
            let ready = s.placed.iter().filter(|r| r.ready).count();
            let pending = s.replicas as usize - s.placed.len();
            json!({"name": name, "project": s.project, "replicas": s.replicas,
                   "running": s.placed.len(), "ready": ready, "pending": pending,
                   "pending_reason": s.pending_reason, "state": s.state, "index": s.index})
        })
        .collect();
    Json(json!({ "services": services })).into_response()
}

fn detail_json(name: &str, s: &Svc, legacy: bool) -> Value {
    let jobs: Vec<Value> = s
        .placed
        .iter()
        .map(|r| {
            let mut j = json!({"job": r.job, "replica": r.replica, "host": r.host,
                               "state": "running", "ready": r.ready, "ports": r.ports});
            if !legacy {
                j["generation"] = json!(r.generation);
            }
            j
        })
        .collect();
    let pending: Vec<Value> = (s.placed.len() as u32..s.replicas)
        .map(|i| json!({"replica": i, "reason": s.pending_reason}))
        .collect();
    let ports: Vec<Value> = s
        .ports
        .iter()
        .map(|p| json!({"name": p, "protocol": "tcp"}))
        .collect();
    let mut detail = json!({"name": name, "project": s.project, "replicas": s.replicas,
           "state": s.state, "index": s.index,
           "profile": {"name": name, "project": s.project, "replicas": s.replicas,
                       "command": ["sh", "-c", "exec server"], "ports": ports},
           "pending": pending, "jobs": jobs});
    if !legacy {
        let r = &s.rollout;
        detail["generation"] = json!(s.generation);
        detail["rollout"] = json!({"generation": r.generation, "state": r.state,
            "updated": r.updated, "ready": r.ready, "outdated": r.outdated, "reason": r.reason});
    }
    detail
}

async fn detail(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = admit(&state, &headers, format!("/v1/services/{name}"), &q) {
        return r;
    }
    let key = match state.shared.inner.lock().unwrap().resolve(&name, &q) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    block(&state, &key, &q).await;
    let legacy = *state.shared.legacy.lock().unwrap();
    let inner = state.shared.inner.lock().unwrap();
    match inner.services.get(&key) {
        Some(s) => (
            [("x-xce-index", s.index.to_string())],
            Json(detail_json(&name, s, legacy)),
        )
            .into_response(),
        None => not_found(&name),
    }
}

/// A blocking query (`?index=N&wait=D`): returns once the service's index is past `N`,
/// the service is gone, `wait` ran out, or this server generation stops.
async fn block(state: &AppState, key: &Key, q: &HashMap<String, String>) {
    let Some(index) = q.get("index").and_then(|i| i.parse::<u64>().ok()) else {
        return;
    };
    let current = || {
        let inner = state.shared.inner.lock().unwrap();
        inner.services.get(key).map(|s| s.index)
    };
    let wait = q
        .get("wait")
        .map(|w| humantime::parse_duration(w).unwrap())
        .unwrap_or(Duration::from_secs(300));
    // Subscribed before the check: a change in between is seen by the check.
    let mut changed = state.shared.changed.subscribe();
    let mut stopping = state.stopping.clone();
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    while current().is_some_and(|i| i <= index) && !*stopping.borrow() {
        tokio::select! {
            _ = changed.changed() => {}
            _ = stopping.changed() => {}
            _ = &mut deadline => break,
        }
    }
}

/// A validated profile: the name, the `[service]` table, replicas and port names.
struct Profile {
    name: String,
    table: Value,
    project: String,
    replicas: u32,
    ports: Vec<String>,
}

/// A few of the real checks, every problem listed; `Err` is the 400 (or 415) answer.
fn validate(headers: &HeaderMap, body: &str) -> Result<Profile, Box<Response>> {
    if headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        != Some("application/toml")
    {
        return Err(Box::new(api_error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported",
            "expected application/json or application/toml",
            json!([]),
        )));
    }
    let invalid = |details: Value| {
        Box::new(api_error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "invalid service profile",
            details,
        ))
    };
    let doc: toml::Table =
        toml::from_str(body).map_err(|e| invalid(json!([{"field": "", "reason": e.message()}])))?;
    let Some(svc) = doc.get("service").and_then(|s| s.as_table()) else {
        return Err(invalid(
            json!([{"field": "service", "reason": "missing table"}]),
        ));
    };
    let mut details = Vec::new();
    let name = svc.get("name").and_then(|v| v.as_str()).unwrap_or("");
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
        details.push(json!({"field": "service.name", "reason": "must be 1-63 chars of [a-z0-9-], starting with a letter"}));
    }
    let replicas = svc
        .get("replicas")
        .and_then(|v| v.as_integer())
        .unwrap_or(1);
    if replicas < 1 {
        details.push(json!({"field": "service.replicas", "reason": "must be at least 1"}));
    }
    let mut ports = Vec::new();
    for (i, p) in svc
        .get("ports")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let pname = p
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_owned();
        if ports.contains(&pname) {
            details.push(json!({"field": format!("service.ports[{i}].name"), "reason": format!("duplicate port name {pname:?}")}));
        }
        if let Some(n) = p.get("port").and_then(|v| v.as_integer()) {
            if !(1..=65535).contains(&n) {
                details.push(json!({"field": format!("service.ports[{i}].port"), "reason": "must be 1-65535"}));
            }
        }
        ports.push(pname);
    }
    if !details.is_empty() {
        return Err(invalid(Value::Array(details)));
    }
    Ok(Profile {
        name: name.to_owned(),
        table: serde_json::to_value(svc).unwrap(),
        project: svc
            .get("project")
            .and_then(|v| v.as_str())
            .unwrap_or("default")
            .to_owned(),
        replicas: replicas as u32,
        ports,
    })
}

/// A new service: nothing placed yet, generation 1, its first rollout progressing.
fn create(inner: &mut Inner, p: Profile, legacy: bool) -> Value {
    inner.counter += 1;
    let svc = Svc {
        project: p.project,
        replicas: p.replicas,
        ports: p.ports,
        placed: Vec::new(),
        pending_reason: Some("waiting for the scheduler".into()),
        index: inner.counter,
        state: "active",
        generation: 1,
        rollout: Rollout {
            generation: 1,
            state: "progressing",
            updated: 0,
            ready: 0,
            outdated: 0,
            reason: None,
        },
        profile: p.table,
    };
    let body = detail_json(&p.name, &svc, legacy);
    inner.services.insert((svc.project.clone(), p.name), svc);
    body
}

/// A new generation of `svc` starts rolling out: every placed replica is outdated.
fn new_generation(svc: &mut Svc, index: u64) {
    svc.generation += 1;
    svc.index = index;
    svc.rollout = Rollout {
        generation: svc.generation,
        state: "progressing",
        updated: 0,
        ready: svc.placed.iter().filter(|r| r.ready).count() as u32,
        outdated: svc.placed.len() as u32,
        reason: None,
    };
}

async fn submit(State(state): State<AppState>, headers: HeaderMap, body: String) -> Response {
    if let Some(r) = admit(
        &state,
        &headers,
        "POST /v1/services".into(),
        &HashMap::new(),
    ) {
        return r;
    }
    let p = match validate(&headers, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let legacy = *state.shared.legacy.lock().unwrap();
    let mut inner = state.shared.inner.lock().unwrap();
    if inner
        .services
        .contains_key(&(p.project.clone(), p.name.clone()))
    {
        return api_error(
            StatusCode::CONFLICT,
            "conflict",
            &format!("service {:?} exists", p.name),
            json!([]),
        );
    }
    (StatusCode::CREATED, Json(create(&mut inner, p, legacy))).into_response()
}

/// `PUT /v1/services/{name}`: 201 created, 200 updated (a new generation) or unchanged.
async fn put_service(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: String,
) -> Response {
    if let Some(r) = admit(&state, &headers, format!("PUT /v1/services/{name}"), &q) {
        return r;
    }
    if *state.shared.legacy.lock().unwrap() {
        return api_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "method not allowed on this route",
            json!([]),
        );
    }
    let p = match validate(&headers, &body) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    if p.name != name {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_profile",
            "invalid service profile",
            json!([{"field": "service.name", "reason": format!("must be {name:?}, the name in the path")}]),
        );
    }
    // The profile names the project; a `?project=` must agree with it.
    if let Some(qp) = q.get("project").filter(|qp| **qp != p.project) {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid_profile",
            "invalid service profile",
            json!([{"field": "service.project", "reason": format!("must be {qp:?}, the project in the query")}]),
        );
    }
    let mut inner = state.shared.inner.lock().unwrap();
    inner.counter += 1;
    let index = inner.counter;
    let Some(svc) = inner.services.get_mut(&(p.project.clone(), name.clone())) else {
        return (StatusCode::CREATED, Json(create(&mut inner, p, false))).into_response();
    };
    let change = if svc.profile != p.table {
        svc.profile = p.table;
        svc.replicas = p.replicas;
        svc.ports = p.ports;
        new_generation(svc, index);
        "updated"
    } else {
        "unchanged"
    };
    let body = detail_json(&name, svc, false);
    drop(inner);
    state.shared.changed.send_replace(index);
    (StatusCode::OK, [("x-xce-change", change)], Json(body)).into_response()
}

/// `POST /v1/services/{name}/scale`: the same generation, progressing again.
async fn scale(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    body: String,
) -> Response {
    if let Some(r) = admit(
        &state,
        &headers,
        format!("POST /v1/services/{name}/scale"),
        &q,
    ) {
        return r;
    }
    let replicas = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v.get("replicas")?.as_u64())
        .filter(|n| (1..=1000).contains(n));
    let Some(replicas) = replicas else {
        return api_error(
            StatusCode::BAD_REQUEST,
            "invalid",
            "invalid scale request",
            json!([{"field": "replicas", "reason": "must be between 1 and 10000"}]),
        );
    };
    let mut inner = state.shared.inner.lock().unwrap();
    let key = match inner.resolve(&name, &q) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    inner.counter += 1;
    let index = inner.counter;
    let svc = inner.services.get_mut(&key).unwrap();
    svc.index = index;
    if svc.replicas != replicas as u32 {
        svc.replicas = replicas as u32;
        svc.rollout.state = "progressing";
        svc.rollout.reason = None;
        if svc.placed.len() < svc.replicas as usize && svc.pending_reason.is_none() {
            svc.pending_reason = Some("waiting for the scheduler".into());
        }
    }
    let body = detail_json(&name, svc, false);
    drop(inner);
    state.shared.changed.send_replace(index);
    Json(body).into_response()
}

/// `POST /v1/services/{name}/restart`: a new generation of the same profile.
async fn restart(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = admit(
        &state,
        &headers,
        format!("POST /v1/services/{name}/restart"),
        &q,
    ) {
        return r;
    }
    let mut inner = state.shared.inner.lock().unwrap();
    let key = match inner.resolve(&name, &q) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    inner.counter += 1;
    let index = inner.counter;
    let svc = inner.services.get_mut(&key).unwrap();
    new_generation(svc, index);
    let body = detail_json(&name, svc, false);
    drop(inner);
    state.shared.changed.send_replace(index);
    Json(body).into_response()
}

async fn stop(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = admit(&state, &headers, format!("DELETE /v1/services/{name}"), &q) {
        return r;
    }
    let mut inner = state.shared.inner.lock().unwrap();
    let key = match inner.resolve(&name, &q) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    inner.counter += 1;
    let counter = inner.counter;
    let s = inner.services.get_mut(&key).unwrap();
    s.state = "stopping";
    s.index = counter;
    (
        StatusCode::ACCEPTED,
        Json(json!({"name": name, "project": key.0, "stopping": s.placed.len()})),
    )
        .into_response()
}

async fn endpoints(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = admit(
        &state,
        &headers,
        format!("/v1/services/{name}/endpoints"),
        &q,
    ) {
        return r;
    }
    let key = match state.shared.inner.lock().unwrap().resolve(&name, &q) {
        Ok(k) => k,
        Err(r) => return *r,
    };
    {
        let mut unavailable = state.shared.unavailable.lock().unwrap();
        if *unavailable > 0 {
            *unavailable -= 1;
            return api_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the endpoint table is catching up",
                json!([]),
            );
        }
    }
    block(&state, &key, &q).await;
    let inner = state.shared.inner.lock().unwrap();
    let Some(s) = inner.services.get(&key) else {
        return not_found(&name);
    };
    if let Some(p) = q.get("port") {
        if !s.ports.contains(p) {
            return api_error(
                StatusCode::BAD_REQUEST,
                "invalid",
                &format!("port: service {name:?} has no port {p:?}"),
                json!([{"field": "port", "reason": format!("service {name:?} has no port {p:?}")}]),
            );
        }
    }
    let all = q.get("include").map(String::as_str) == Some("all");
    let endpoints: Vec<Value> = s
        .placed
        .iter()
        .filter(|r| r.ready || all)
        .map(|r| {
            let ports: BTreeMap<&String, &u16> = r
                .ports
                .iter()
                .filter(|(n, _)| q.get("port").is_none_or(|p| p == *n))
                .collect();
            let mut e = json!({"replica": r.replica, "job": r.job, "host": r.host,
                               "address": r.address, "ports": ports});
            if !r.ready {
                e["ready"] = json!(false);
                e["state"] = json!("running");
            }
            e
        })
        .collect();
    let body = json!({"service": name, "project": s.project, "index": s.index,
                      "endpoints": endpoints});
    ([("x-xce-index", s.index.to_string())], Json(body)).into_response()
}

async fn hosts(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = admit(&state, &headers, "/v1/hosts".into(), &q) {
        return r;
    }
    let inner = state.shared.inner.lock().unwrap();
    let hosts: Vec<Value> = (1..=3)
        .map(|i| {
            let id = format!("exec-{i:02}");
            let ip = format!("127.0.0.{}", 10 + i);
            let jobs = inner
                .services
                .values()
                .flat_map(|s| &s.placed)
                .filter(|r| r.host == id)
                .count();
            json!({"id": id, "state": "ready", "ip_addr": ip,
                   "addresses": [{"ip": ip, "interface": "lo"}], "jobs": jobs,
                   "ports": {"range": "20000-32000", "capacity": 12001, "used": jobs,
                             "unavailable": if i == 3 { 1 } else { 0 }}})
        })
        .collect();
    Json(json!({ "cluster": "5e1f0c0ffee0a11d", "hosts": hosts })).into_response()
}

/// The profile the canned `web` runs, as a file would hold it.
pub(crate) const WEB_TOML: &str = "[service]\nname = \"web\"\nreplicas = 3\n\
    command = [\"sh\", \"-c\", \"exec server\"]\n\n[[service.ports]]\nname = \"http\"\n";

/// The canned cluster: `web` (one port, 2 of 3 ready), `api` (two ports, both ready),
/// `batch` (one replica pending, nothing ready).
fn canned() -> Inner {
    let replica = |i: u32, job: u32, ports: &[(&str, u16)], ready: bool| Replica {
        replica: i,
        job: format!("j-{job}"),
        host: format!("exec-{:02}", i + 1),
        address: format!("127.0.0.{}", 11 + i),
        ports: ports.iter().map(|(n, p)| (n.to_string(), *p)).collect(),
        ready,
        generation: 1,
    };
    let rollout = |state: &'static str, updated: u32, ready: u32, reason: Option<&str>| Rollout {
        generation: 1,
        state,
        updated,
        ready,
        outdated: 0,
        reason: reason.map(str::to_owned),
    };
    let mut services = BTreeMap::new();
    services.insert(
        ("default".to_owned(), "web".to_owned()),
        Svc {
            project: "default".into(),
            replicas: 3,
            ports: vec!["http".into()],
            placed: vec![
                replica(0, 17, &[("http", 20417)], true),
                replica(1, 18, &[("http", 20533)], true),
                replica(2, 19, &[("http", 20101)], false),
            ],
            pending_reason: None,
            index: 40,
            state: "active",
            generation: 1,
            rollout: rollout("progressing", 3, 2, None),
            // As `WEB_TOML` parses.
            profile: json!({"name": "web", "replicas": 3,
                            "command": ["sh", "-c", "exec server"], "ports": [{"name": "http"}]}),
        },
    );
    services.insert(
        ("team-a".to_owned(), "api".to_owned()),
        Svc {
            project: "team-a".into(),
            replicas: 2,
            ports: vec!["http".into(), "metrics".into()],
            placed: vec![
                replica(0, 21, &[("http", 20001), ("metrics", 9100)], true),
                replica(1, 22, &[("http", 20002), ("metrics", 9100)], true),
            ],
            pending_reason: None,
            index: 41,
            state: "active",
            generation: 1,
            rollout: rollout("complete", 2, 2, None),
            profile: json!({"name": "api"}),
        },
    );
    services.insert(
        ("default".to_owned(), "batch".to_owned()),
        Svc {
            project: "default".into(),
            replicas: 1,
            ports: vec!["grpc".into(), "admin-api".into()],
            placed: Vec::new(),
            pending_reason: Some("port admin-api/tcp 8080 is taken on all 3 hosts".into()),
            index: 42,
            state: "active",
            generation: 1,
            rollout: rollout(
                "progressing",
                0,
                0,
                Some("replica 0: port admin-api/tcp 8080 is taken on all 3 hosts"),
            ),
            profile: json!({"name": "batch"}),
        },
    );
    Inner {
        counter: 42,
        services,
    }
}
