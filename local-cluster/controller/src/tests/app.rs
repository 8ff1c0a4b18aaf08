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
[[worker]]
host = "exec-01"
secret = "w1-example-secret"
[[worker]]
host = "exec-02"
secret = "w2-example-secret"
"#;

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
    let plugins = ControllerPlugins {
        resources: vec![Box::new(slots.clone())],
        facts_policies: vec![Arc::new(Policy)],
        listeners: vec![],
        extensions: vec![Arc::new(WhoAmI)],
    };
    let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
    let ctl = Controller::new(&cfg, keyring.clone(), plugins, store)
        .await
        .unwrap();
    let app = ctl.router();
    App { ctl, app, keyring }
}

/// A store with a fixed cluster id, so answers that name it can be expected.
pub(super) fn store_of_cluster(id: &str) -> Arc<MemStore> {
    let store = MemStore::new();
    store
        .put_if_absent(xce_model::cluster_id_key(), serde_json::to_vec(id).unwrap())
        .unwrap();
    Arc::new(store)
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

    /// `POST /v1/services` with `profile` (JSON) as `who`.
    pub(super) async fn submit(&self, who: &str, profile: Value) -> (StatusCode, Value) {
        self.json("POST", "/v1/services", who, Some(profile)).await
    }

    pub(super) async fn register(&self, host: &str, secret: &str, slots: u64) {
        let req = RegisterRequest {
            facts: facts_of(host, slots),
            running: vec![],
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
    app.register("exec-01", "w1-example-secret", 2).await;
    app.register("exec-02", "w2-example-secret", 1).await;
    let (s, created) = app
        .submit("admin-example-secret", web("web", "default", 4))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let body = json!([{"event": "started", "job": "j-1", "pid": 9}, {"event": "readiness", "job": "j-1", "ready": true}]);
    let (s, _) = app
        .json(
            "POST",
            "/internal/v1/hosts/exec-01/events",
            "w1-example-secret",
            Some(body),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    created
}
