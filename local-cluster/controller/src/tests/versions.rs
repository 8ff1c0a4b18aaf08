//! Versions (UPGRADING.md): the skew check on worker routes and forwarded requests, the
//! store format migrated at load or refused when newer.

use super::*;
use xce_wire::version::{
    FORWARDED_PROTOCOL_HEADER, PROTOCOL, PROTOCOL_HEADER, SKEW_HEADER, VERSION_HEADER,
};

/// Sends `GET path` with `headers` through the router: status, the skew header, body.
async fn get(app: &App, path: &str, headers: &[(&str, String)]) -> (u16, String, String) {
    let mut req = Request::builder()
        .uri(path)
        .header("authorization", format!("Bearer {W1}"));
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = app
        .app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let skew = resp
        .headers()
        .get(SKEW_HEADER)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, skew, String::from_utf8_lossy(&body).into_owned())
}

/// The skew rule applied by the controller: for each peer and protocol, the status. A
/// refusal is 400 `version_skew` with the refused peer in its header, and its message
/// names both versions; a request that passes reaches its route (404: the host is not
/// registered; 403: a worker credential on a user route).
#[tokio::test]
async fn peers_outside_the_skew_are_refused_naming_both_versions() {
    let app = app().await;
    let assignments = "/internal/v1/hosts/exec-01/assignments";
    let mut out = String::new();
    let p = PROTOCOL;
    for (what, path, header, theirs) in [
        ("worker, same", assignments, PROTOCOL_HEADER, Some(p)),
        (
            "worker, one older",
            assignments,
            PROTOCOL_HEADER,
            Some(p - 1),
        ),
        ("worker, no header", assignments, PROTOCOL_HEADER, None),
        (
            "worker, one newer",
            assignments,
            PROTOCOL_HEADER,
            Some(p + 1),
        ),
        (
            "worker, two older",
            assignments,
            PROTOCOL_HEADER,
            Some(p - 2),
        ),
        (
            "apiserver, one newer",
            "/v1/services",
            FORWARDED_PROTOCOL_HEADER,
            Some(p + 1),
        ),
        (
            "apiserver, two newer",
            "/v1/services",
            FORWARDED_PROTOCOL_HEADER,
            Some(p + 2),
        ),
    ] {
        let headers: Vec<(&str, String)> = theirs
            .map(|n| (header, n.to_string()))
            .into_iter()
            .collect();
        let (status, skew, body) = get(&app, path, &headers).await;
        out.push_str(&format!("{what}: {status} {skew}\n"));
        if status == 400 {
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["error"]["code"], "version_skew", "{body}");
            let msg = v["error"]["message"].as_str().unwrap();
            let theirs = theirs.unwrap();
            assert!(
                msg.contains(&format!(
                    "speaks protocol {theirs}, the controller speaks protocol {p}"
                )),
                "{msg}"
            );
        }
    }
    expect![[r#"
        worker, same: 404 
        worker, one older: 404 
        worker, no header: 404 
        worker, one newer: 400 worker
        worker, two older: 400 worker
        apiserver, one newer: 403 
        apiserver, two newer: 400 apiserver
    "#]]
    .assert_eq(&out);
}

/// Every answer says which build gave it (refusals included).
#[tokio::test]
async fn every_answer_names_the_build() {
    let app = app().await;
    let router = xce_serve::version::tag(app.app.clone());
    for path in ["/healthz", "/no/such/route"] {
        let resp = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let build = xce_wire::version::build();
        assert_eq!(resp.headers()[VERSION_HEADER], build.header(), "{path}");
        assert_eq!(resp.headers()[PROTOCOL_HEADER], PROTOCOL.to_string());
    }
}

/// A controller on a store of a newer format does not start: it names both formats.
#[tokio::test]
async fn a_store_of_a_newer_format_is_refused_at_load() {
    let store = store_of_cluster("c1c1c1c1c1c1c1c1");
    let mut b = Batch::default();
    b.put(
        xce_model::format_key(),
        (xce_model::FORMAT + 1).to_string().into_bytes(),
    );
    store.commit(b).unwrap();
    let plugins = ControllerPlugins {
        resources: vec![],
        facts_policies: vec![],
        listeners: vec![],
        extensions: vec![],
    };
    let keyring = xce_serve::keyring::Keyring::new(Tokens::parse(TOKENS).unwrap());
    let Err(err) = controller(
        &ControllerConfig::default(),
        keyring,
        plugins,
        store,
        plain_ids,
    )
    .await
    else {
        panic!("a newer format is refused");
    };
    let msg = format!("{err:#}");
    assert!(
        msg.contains(&format!(
            "the store holds records of format {}, newer than this build",
            xce_model::FORMAT + 1
        )),
        "{msg}"
    );
}

/// A store of format 1 (no `meta/format`) is migrated when the controller loads it, to the
/// format a controller writes unless told otherwise (`store_format`).
#[tokio::test]
async fn a_store_of_an_older_format_is_migrated_at_load() {
    let store = store_of_cluster("c1c1c1c1c1c1c1c1");
    let _app = app_on(store.clone()).await;
    let format = store
        .load_all()
        .unwrap()
        .into_iter()
        .find(|(k, _)| *k == xce_model::format_key())
        .map(|(_, v)| xce_model::decode_format(&v).unwrap());
    assert_eq!(format, Some(xce_model::DEFAULT_STORE_FORMAT));
}
