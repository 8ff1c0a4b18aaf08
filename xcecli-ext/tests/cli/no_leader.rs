//! A controller takeover behind the apiserver: reads answered 503 `no_leader` are retried
//! (after `Retry-After`, noted on stderr) until a leader answers; changes are not.

use super::*;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use std::sync::atomic::{AtomicUsize, Ordering};

/// An apiserver whose leader is away for the first `away` requests.
async fn taking_over(away: usize) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    let answer = move || {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < away {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "1"), ("content-type", "application/json")],
                    r#"{"error":{"code":"no_leader","message":"the leader controller at http://10.0.0.1:7480 stopped answering and no longer leads","details":[]}}"#,
                )
                    .into_response()
            } else {
                ([("content-type", "application/json")], r#"{"hosts":[]}"#).into_response()
            }
        }
    };
    let app = axum::Router::new()
        .route("/v1/hosts", axum::routing::get(answer.clone()))
        .route("/v1/services/web/scale", axum::routing::post(answer));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, hits)
}

#[tokio::test]
async fn reads_wait_for_a_new_leader_changes_do_not() {
    bounded(async {
        let (url, hits) = taking_over(2).await;
        let t = std::time::Instant::now();
        check(
            &url,
            "host list -o json",
            expect![[r#"
                exit 0
                {"hosts":[]}
                --- stderr
                warning: no leader controller answers: the leader controller at http://10.0.0.1:7480 stopped answering and no longer leads; retrying in 1s
                warning: no leader controller answers: the leader controller at http://10.0.0.1:7480 stopped answering and no longer leads; retrying in 1s
                warning: a leader controller answers again
            "#]],
        )
        .await;
        assert_eq!(hits.load(Ordering::SeqCst), 3);
        assert!(t.elapsed() >= Duration::from_secs(2), "Retry-After honoured");

        // A change that got no answer may have been applied: reported, not repeated.
        let (url, hits) = taking_over(1).await;
        check(
            &url,
            "service scale web 3",
            expect![[r#"
                exit 1
                --- stderr
                error: no leader controller answers: the leader controller at http://10.0.0.1:7480 stopped answering and no longer leads
                hint: a controller takeover is under way, or no controller runs
            "#]],
        )
        .await;
        assert_eq!(hits.load(Ordering::SeqCst), 1);
    })
    .await;
}
