//! A canned apiserver answering `GET /v1/services/web/endpoints` (3 ready replicas), for
//! timing the client without a cluster: `fake_endpoints 127.0.0.1:7499`.
use axum::routing::get;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7499".to_owned());
    let body = r#"{"service":"web","index":42,"endpoints":[
        {"replica":0,"job":"j-17","host":"exec-01","address":"127.0.0.11","ports":{"http":20417}},
        {"replica":1,"job":"j-18","host":"exec-02","address":"127.0.0.12","ports":{"http":20533}},
        {"replica":2,"job":"j-19","host":"exec-03","address":"127.0.0.13","ports":{"http":20101}}]}"#;
    let app = axum::Router::new().route(
        "/v1/services/web/endpoints",
        get(move || async move {
            (
                [("content-type", "application/json"), ("x-xce-index", "42")],
                body,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind(&addr).await.expect("bind");
    axum::serve(listener, app).await.expect("serve");
}
