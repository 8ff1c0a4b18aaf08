//! Issue 27 finding 8: profiles are limited to `MAX_PROFILE_BYTES` on every store, refused
//! past it before any store write, and a profile at the limit can be submitted, updated
//! and restarted, on redb and on etcd (whose one request per change was what failed: a
//! 1 MB profile answered 500, a 300 KB one could never be updated or restarted).

use super::app::{app_with, App, ADMIN, W1};
use super::fakes::versioned;
use super::fakes::SharedSlots;
use crate::config::ControllerConfig;
use serde_json::Value;
use std::sync::Arc;
use xce_proto::profile::MAX_PROFILE_BYTES;
use xce_store::testing::TestEtcd;
use xce_store::Store;

/// A profile of exactly `bytes` as JSON (compact, as the requests send it), made of
/// `fill` (a character JSON escapes makes the store's copies the biggest they can be).
fn profile_of(name: &str, bytes: usize, fill: char, replicas: u32) -> Value {
    let mut doc = versioned(replicas, "");
    doc["service"]["name"] = Value::String(name.to_owned());
    let base = doc.to_string().len();
    let one = Value::String(fill.to_string()).to_string().len() - 2;
    let mut arg = fill.to_string().repeat((bytes - base) / one);
    arg.push_str(&"a".repeat((bytes - base) % one));
    doc["service"]["command"][2] = Value::String(arg);
    assert_eq!(doc.to_string().len(), bytes);
    doc
}

/// What a change answered: `status` and, on failure, the error.
async fn change(app: &App, method: &str, path: &str, body: Option<Value>) -> String {
    let (s, b) = app.json(method, path, ADMIN, body).await;
    if s.is_success() {
        s.as_u16().to_string()
    } else {
        format!("{} {}", s.as_u16(), b["error"])
    }
}

/// Submits, updates and restarts a profile at the limit, then refuses one byte more;
/// returns one line per step.
async fn at_the_limit(store: Arc<dyn Store>) -> String {
    // The host registers once and never heartbeats: it stays reachable for the tests'
    // patience, not the default 3 s, which these big requests can outlast on a busy
    // machine (the host then took no job: 0 of 6 placed).
    let cfg = ControllerConfig {
        unreachable_after: testkit::patience(),
        grace_period: 2 * testkit::patience(),
        ..ControllerConfig::default()
    };
    let app = app_with(cfg, store, SharedSlots::new()).await;
    app.register("exec-01", W1, 32).await;
    let mut out = Vec::new();
    for (name, fill) in [("quotes", '"'), ("plain", 'x')] {
        let at = |r| profile_of(name, MAX_PROFILE_BYTES, fill, r);
        let path = format!("/v1/services/{name}");
        let submit = change(&app, "PUT", &path, Some(at(2))).await;
        let update = change(&app, "PUT", &path, Some(at(3))).await;
        let restart = change(&app, "POST", &format!("{path}/restart"), None).await;
        let (_, detail) = app.get(&path, ADMIN).await;
        out.push(format!(
            "{name}: submit {submit}, update {update}, restart {restart}, {} jobs",
            detail["jobs"].as_array().map_or(0, Vec::len)
        ));
    }
    let over = profile_of("big", MAX_PROFILE_BYTES + 1, 'x', 1);
    let (_, list) = app.get("/v1/services", ADMIN).await;
    let before = list.to_string();
    out.push(format!(
        "one byte over: {}",
        change(&app, "PUT", "/v1/services/big", Some(over)).await
    ));
    let (_, list) = app.get("/v1/services", ADMIN).await;
    assert_eq!(
        list.to_string(),
        before,
        "a refused profile changed nothing"
    );
    out.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_at_the_limit_is_submitted_updated_and_restarted_on_redb() {
    let dir = tempfile::tempdir().unwrap();
    let redb = xce_store::RedbStore::open(dir.path().join("limit.redb")).unwrap();
    let out = at_the_limit(Arc::new(redb)).await;
    expected().assert_eq(&out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_at_the_limit_is_submitted_updated_and_restarted_on_etcd() {
    let etcd = TestEtcd::start();
    let out = at_the_limit(Arc::new(etcd.store("/xce/"))).await;
    expected().assert_eq(&out);
}

fn expected() -> expect_test::Expect {
    expect_test::expect![[r#"
        quotes: submit 201, update 200, restart 200, 6 jobs
        plain: submit 201, update 200, restart 200, 6 jobs
        one byte over: 413 {"code":"too_large","details":[],"message":"the profile is 262145 bytes, more than the limit of 262144 bytes (256 KiB) a profile may have"}"#]]
}
