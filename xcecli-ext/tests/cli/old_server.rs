//! A new xcecli against a server of an older release (before version headers): a route
//! the server lacks is "the server is too old", naming both versions (exit 7), never
//! "service not found" (exit 4) or a create's "stop it first".

use super::*;
use axum::http::StatusCode;
use axum::response::IntoResponse;

/// A server as the release before version headers answered: `POST /v1/services` says the
/// service exists, `/v1/services/{name}` has no `PUT` (405), every other route is its
/// fallback's 404 `no such route`; no
/// `X-Xce-Version`, no `X-Xce-Protocol`.
async fn old_server() -> String {
    let exists = || async {
        (
            StatusCode::CONFLICT,
            [("content-type", "application/json")],
            r#"{"error":{"code":"already_exists","message":"service \"web\" already exists","details":[]}}"#,
        )
            .into_response()
    };
    let app = axum::Router::new()
        .route("/v1/services", axum::routing::post(exists))
        .route(
            "/v1/services/{name}",
            axum::routing::get(|| async { StatusCode::OK }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                [("content-type", "application/json")],
                r#"{"error":{"code":"not_found","message":"no such route","details":[]}}"#,
            )
        });
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

#[tokio::test]
async fn a_route_an_old_server_lacks_says_the_server_is_too_old() {
    bounded(async {
        let url = old_server().await;
        let (cfg, args) = setup(&url, "service scale web 4");
        let (code, stdout, stderr) = spawn(cfg, args).finish().await;
        assert_eq!((code, stdout.as_str()), (7, ""), "{stderr}");
        let ours = xce_wire::version::build().header();
        let want = format!(
            "error: the server at {url}/v1/services/web/scale is too old to answer this \
             command (it has no such route): it runs a release from before version headers, \
             protocol 1; this is xcecli {ours}, protocol {}\nhint: upgrade the server \
             (UPGRADING.md), or use the xcecli of its release\n",
            xce_wire::version::PROTOCOL
        );
        assert_eq!(stderr, want);

        // Submitting a profile of a service that exists: an update in place the old
        // server cannot do (no PUT; its create says "already exists"): too old, not
        // "stop it first".
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("web.toml");
        std::fs::write(
            &profile,
            "[service]\nname = \"web\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
        let (cfg, args) = setup(&url, &format!("service submit {}", profile.display()));
        let (code, _, stderr) = spawn(cfg, args).finish().await;
        assert_eq!(code, 7, "{stderr}");
        assert!(
            stderr.starts_with(&format!(
                "error: the server at {url}/v1/services/web is too old to change a service \
                 in place: it runs a release from before version headers, protocol 1; this is \
                 xcecli {ours}"
            )) && !stderr.contains("stop it first"),
            "{stderr}"
        );
    })
    .await;
}
