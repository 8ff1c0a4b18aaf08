//! `App`: the controller's router driven through `oneshot` (no sockets), with the
//! tokens every route test uses.

use super::*;

pub(super) const TOKENS: &str = r#"
[[token]]
secret = "alice-example-secret"
principal = "alice"
grants = [ { permission = "job.view", projects = ["team-a"] },
           { permission = "job.submit", projects = ["team-a"] } ]
[[token]]
secret = "bob-example-secret"
principal = "bob"
grants = [ { permission = "job.view", projects = ["team-a", "team-b"] },
           { permission = "job.submit", projects = ["team-b"] } ]
[[token]]
secret = "admin-example-secret"
principal = "admin"
grants = [ { permission = "admin", projects = ["*"] } ]
[[token]]
secret = "ops-example-secret"
principal = "ops"
grants = [ { permission = "metrics.view", projects = ["*"] },
           { permission = "host.view", projects = ["*"] } ]
[[worker]]
host = "exec-01"
secret = "w1-example-secret"
[[worker]]
host = "exec-02"
secret = "w2-example-secret"
"#;

/// The secrets of [`TOKENS`]' users and workers.
pub(super) const ALICE: &str = "alice-example-secret";
pub(super) const BOB: &str = "bob-example-secret";
pub(super) const ADMIN: &str = "admin-example-secret";
pub(super) const OPS: &str = "ops-example-secret";
pub(super) const W1: &str = "w1-example-secret";
pub(super) const W2: &str = "w2-example-secret";

pub(super) struct App {
    pub(super) ctl: Controller,
    pub(super) app: axum::Router,
    /// The tokens in force (tests replace them as a SIGHUP would).
    pub(super) keyring: xce_serve::keyring::Keyring,
}

pub(super) async fn app_with(
    cfg: ControllerConfig,
    store: Arc<dyn Store>,
    slots: SharedSlots,
) -> App {
    app_tagged(cfg, store, slots, plain_ids).await
}

/// [`app_with`], the job ids of the load tagged by `job_tag`.
pub(super) async fn app_tagged(
    cfg: ControllerConfig,
    store: Arc<dyn Store>,
    slots: SharedSlots,
    job_tag: fn() -> String,
) -> App {
    let plugins = ControllerPlugins {
        resources: vec![Box::new(slots.clone())],
        facts_policies: vec![Arc::new(Policy)],
        listeners: vec![],
        extensions: vec![Arc::new(WhoAmI)],
    };
    let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
    let ctl = controller(&cfg, keyring.clone(), plugins, store, job_tag)
        .await
        .unwrap();
    let app = ctl.router();
    App { ctl, app, keyring }
}

/// [`Controller::new`] with the job ids of the load tagged by `job_tag`.
pub(super) async fn controller(
    cfg: &ControllerConfig,
    tokens: impl Into<Keyring>,
    plugins: ControllerPlugins,
    store: Arc<dyn Store>,
    job_tag: fn() -> String,
) -> anyhow::Result<Controller> {
    let role = standby::Role::default();
    role.serving();
    Controller::with_job_tag(cfg, tokens, plugins, store, &role, job_tag).await
}

/// A store with a fixed cluster id, so answers that name it can be expected.
pub(super) fn store_of_cluster(id: &str) -> Arc<MemStore> {
    let store = MemStore::new();
    store
        .put_if_absent(xce_model::cluster_id_key(), serde_json::to_vec(id).unwrap())
        .unwrap();
    Arc::new(store)
}

/// An app on `store` with the default configuration and a fresh slots plugin.
pub(super) async fn app_on(store: Arc<dyn Store>) -> App {
    app_with(ControllerConfig::default(), store, SharedSlots::new()).await
}

/// An app with `cfg` on an empty in-memory store and a fresh slots plugin.
pub(super) async fn app_configured(cfg: ControllerConfig) -> App {
    app_with(cfg, Arc::new(MemStore::new()), SharedSlots::new()).await
}

pub(super) async fn app() -> App {
    app_with(
        ControllerConfig::default(),
        store_of_cluster("c1c1c1c1c1c1c1c1"),
        SharedSlots::new(),
    )
    .await
}

impl App {
    /// Sends one request; returns status and body (JSON compacted).
    pub(super) async fn call(
        &self,
        method: &str,
        path: &str,
        who: Option<&str>,
        body: Option<(&str, String)>,
    ) -> (StatusCode, String) {
        let mut req = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).unwrap())
            .uri(path);
        if let Some(t) = who {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = match body {
            Some((ctype, b)) => {
                req = req.header("content-type", ctype);
                Body::from(b)
            }
            None => Body::empty(),
        };
        let resp = self
            .app
            .clone()
            .oneshot(req.body(body).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    pub(super) async fn json(
        &self,
        method: &str,
        path: &str,
        who: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let (s, b) = self
            .call(
                method,
                path,
                Some(who),
                body.map(|v| ("application/json", v.to_string())),
            )
            .await;
        (s, serde_json::from_str(&b).unwrap_or(Value::String(b)))
    }

    /// `GET path` as `who`.
    pub(super) async fn get(&self, path: &str, who: &str) -> (StatusCode, Value) {
        self.json("GET", path, who, None).await
    }

    /// `GET path` as `who` on a task of its own (a blocking query that waits): its
    /// status and body once it is answered.
    pub(super) fn spawn_get(
        &self,
        path: String,
        who: &str,
    ) -> tokio::task::JoinHandle<(StatusCode, String)> {
        let router = self.app.clone();
        let req = Request::get(path)
            .header("authorization", format!("Bearer {who}"))
            .body(Body::empty())
            .unwrap();
        tokio::spawn(async move {
            let resp = router.oneshot(req).await.unwrap();
            let status = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap();
            (status, String::from_utf8_lossy(&body).into_owned())
        })
    }

    /// Why the controller stopped, once it says so (within the tests' patience).
    pub(super) async fn failure(&self) -> String {
        tokio::time::timeout(testkit::patience(), self.ctl.failed())
            .await
            .expect("the controller reports that it stopped")
    }

    /// `POST /v1/services` with `profile` (JSON) as `who`.
    pub(super) async fn submit(&self, who: &str, profile: Value) -> (StatusCode, Value) {
        self.json("POST", "/v1/services", who, Some(profile)).await
    }

    pub(super) async fn register(&self, host: &str, secret: &str, slots: u64) {
        let req = RegisterRequest {
            facts: facts_of(host, slots),
            running: vec![],
            wants_session: false,
        };
        let (s, b) = self
            .json(
                "POST",
                &format!("/internal/v1/hosts/{host}/register"),
                secret,
                Some(serde_json::to_value(req).unwrap()),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
}

/// Runs each `(method, path, token, body)` and prints `status body` per line.
pub(super) async fn check_calls(
    app: &App,
    calls: &[(&str, &str, Option<&str>, Option<Value>)],
    expect: Expect,
) {
    let mut out = Vec::new();
    for (m, p, who, body) in calls {
        let (s, b) = app
            .call(
                m,
                p,
                *who,
                body.as_ref().map(|v| ("application/json", v.to_string())),
            )
            .await;
        out.push(format!(
            "{m} {p} as {}: {} {b}",
            who.unwrap_or("-"),
            s.as_u16()
        ));
    }
    expect.assert_eq(&out.join("\n"));
}

/// Two hosts (2 and 1 slots), `web` of 4 replicas submitted (3 placed), and `j-1`
/// reported started and ready. Returns the submit's answer.
pub(super) async fn web_of_4_on_2_hosts_one_ready(app: &App) -> Value {
    app.register("exec-01", W1, 2).await;
    app.register("exec-02", W2, 1).await;
    let (s, created) = app.submit(ADMIN, web("web", "default", 4)).await;
    assert_eq!(s, StatusCode::CREATED);
    let body = json!([{"event": "started", "job": "j-1", "pid": 9}, {"event": "readiness", "job": "j-1", "ready": true}]);
    let (s, _) = app
        .json("POST", "/internal/v1/hosts/exec-01/events", W1, Some(body))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    created
}
