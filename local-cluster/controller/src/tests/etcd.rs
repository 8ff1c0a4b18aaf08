//! The controller on an etcd store: what one controller process committed, the next one
//! over the same prefix loads and continues from.

use super::app::{ADMIN, TOKENS, W1};
use super::fakes::web;
use super::{controller, plain_ids};
use crate::{ControllerConfig, ControllerPlugins};
use expect_test::{expect, Expect};
use serde_json::{json, Value};
use std::sync::Arc;
use xce_serve::auth::Tokens;
use xce_store::testing::TestEtcd;
use xce_store::Store;

fn check(actual: &str, expect: Expect) {
    expect.assert_eq(actual);
}

async fn request(
    app: &axum::Router,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Value {
    use tower::ServiceExt;
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        ))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    assert!(status.is_success(), "{method} {path}: {status} {bytes:?}");
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// `name`: its jobs `job@host replica state` and its index.
fn jobs(service: &Value) -> String {
    let mut out = format!("index {}:", service["index"]);
    for j in service["jobs"].as_array().unwrap() {
        out += &format!(
            " {}@{} r{} {}",
            j["job"], j["host"], j["replica"], j["state"]
        )
        .replace('"', "");
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_restores_from_etcd() {
    let etcd = TestEtcd::start();
    let open = || -> Arc<dyn Store> { Arc::new(etcd.store("/xce/")) };
    let cfg = ControllerConfig::default();
    let tokens = || Tokens::parse(TOKENS).unwrap();

    let ctl = controller(
        &cfg,
        tokens(),
        ControllerPlugins::default(),
        open(),
        plain_ids,
    )
    .await
    .unwrap();
    let app = ctl.router();
    let facts =
        json!({"facts": {"ip_addr": "127.0.0.11", "addresses": [], "sections": {}}, "running": []});
    request(
        &app,
        "POST",
        "/internal/v1/hosts/exec-01/register",
        W1,
        Some(facts.clone()),
    )
    .await;
    let doc = web("web", "default", 2);
    request(&app, "POST", "/v1/services", ADMIN, Some(doc)).await;
    let before = request(&app, "GET", "/v1/services/web", ADMIN, None).await;
    drop(app);
    ctl.shutdown().await;

    // A new controller process over the same etcd prefix.
    let ctl = controller(
        &cfg,
        tokens(),
        ControllerPlugins::default(),
        open(),
        plain_ids,
    )
    .await
    .unwrap();
    let app = ctl.router();
    let after = request(&app, "GET", "/v1/services/web", ADMIN, None).await;
    let api = web("api", "default", 1);
    request(&app, "POST", "/v1/services", ADMIN, Some(api)).await;
    let api = request(&app, "GET", "/v1/services/api", ADMIN, None).await;
    check(
        &format!("{}\n{}\n{}", jobs(&before), jobs(&after), jobs(&api)),
        expect![[r#"
            index 4: j-1@exec-01 r0 placed j-2@exec-01 r1 placed
            index 4: j-1@exec-01 r0 placed j-2@exec-01 r1 placed
            index 6: j-3@exec-01 r0 placed"#]],
    );
    drop(app);
    ctl.shutdown().await;
}
