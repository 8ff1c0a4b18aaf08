//! `GET /ui`: the live web view (README.md), three static files compiled into the binary
//! (no build step, no external assets, works offline).
//!
//! The files hold no data, so they are served without a token; the page then calls the
//! `/v1` routes with the token the user gives it, as a Bearer header, and shows only what
//! that token may view. The data never passes through this module.
//!
//! Every answer carries a strict `Content-Security-Policy` (only this origin's script,
//! style and `fetch`; no inline script, no frames, no forms posting elsewhere), so even a
//! service name that slipped into markup could not run, and `Cache-Control: no-cache`
//! with an `ETag`: a browser revalidates (a cheap 304) and never runs a page older than
//! the binary serving it.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The policy of every `/ui` answer. `connect-src 'self'`: the page talks to the server it
/// came from and nowhere else; `frame-ancestors 'none'`: no clickjacking frame.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// One embedded file.
struct Asset {
    body: &'static [u8],
    content_type: &'static str,
}

const INDEX: Asset = Asset {
    body: include_bytes!("../ui/index.html"),
    content_type: "text/html; charset=utf-8",
};
const SCRIPT: Asset = Asset {
    body: include_bytes!("../ui/app.js"),
    content_type: "text/javascript; charset=utf-8",
};
const STYLE: Asset = Asset {
    body: include_bytes!("../ui/app.css"),
    content_type: "text/css; charset=utf-8",
};

/// The `/ui` routes: the page at `/ui` (and `/ui/`), its script and style next to it.
pub(crate) fn router() -> Router {
    Router::new()
        .route("/ui", get(|h: HeaderMap| async move { serve(&INDEX, &h) }))
        .route("/ui/", get(|h: HeaderMap| async move { serve(&INDEX, &h) }))
        .route(
            "/ui/app.js",
            get(|h: HeaderMap| async move { serve(&SCRIPT, &h) }),
        )
        .route(
            "/ui/app.css",
            get(|h: HeaderMap| async move { serve(&STYLE, &h) }),
        )
}

fn serve(asset: &Asset, request: &HeaderMap) -> Response {
    let etag = etag(asset.body);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let headers = [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        // The token travels in the URL fragment at most, which no Referer carries; this
        // keeps even the path to ourselves.
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (
            header::ETAG,
            HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\"")),
        ),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, headers).into_response();
    }
    (
        headers,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response()
}

/// A strong validator: FNV-1a over the bytes (stable across builds and processes, so
/// several apiservers behind one balancer agree on it).
fn etag(body: &[u8]) -> String {
    let hash = body.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("\"{hash:016x}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get(path: &str, if_none_match: Option<&str>) -> Response {
        let mut req = Request::get(path);
        if let Some(tag) = if_none_match {
            req = req.header(header::IF_NONE_MATCH, tag);
        }
        router()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    fn header_of(r: &Response, name: header::HeaderName) -> &str {
        r.headers().get(name).unwrap().to_str().unwrap()
    }

    #[tokio::test]
    async fn every_file_has_its_type_the_policy_and_no_cache() {
        for (path, ctype) in [
            ("/ui", "text/html; charset=utf-8"),
            ("/ui/", "text/html; charset=utf-8"),
            ("/ui/app.js", "text/javascript; charset=utf-8"),
            ("/ui/app.css", "text/css; charset=utf-8"),
        ] {
            let r = get(path, None).await;
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(header_of(&r, header::CONTENT_TYPE), ctype, "{path}");
            assert_eq!(
                header_of(&r, header::CONTENT_SECURITY_POLICY),
                CSP,
                "{path}"
            );
            assert_eq!(header_of(&r, header::CACHE_CONTROL), "no-cache", "{path}");
            assert_eq!(header_of(&r, header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        }
    }

    #[tokio::test]
    async fn the_page_loads_only_its_own_files() {
        let r = get("/ui", None).await;
        let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
        let html = String::from_utf8(body.to_vec()).unwrap();
        // No inline script or style (the policy would block them) and nothing from
        // elsewhere (the page works offline).
        assert!(html.contains(r#"<script src="/ui/app.js" defer></script>"#));
        assert!(html.contains(r#"<link rel="stylesheet" href="/ui/app.css">"#));
        assert!(!html.contains("<script>"), "inline script");
        assert!(!html.contains("style="), "inline style");
        assert!(!html.contains("http://") && !html.contains("https://"));
        let js = String::from_utf8(SCRIPT.body.to_vec()).unwrap();
        // Data goes into the page as text only.
        assert!(
            !js.contains("innerHTML"),
            "the script must not build markup from data"
        );
        assert!(!js.contains("http://") && !js.contains("https://"));
    }

    #[tokio::test]
    async fn a_matching_etag_answers_304_and_another_the_file() {
        let r = get("/ui/app.js", None).await;
        let tag = header_of(&r, header::ETAG).to_owned();
        let r = get("/ui/app.js", Some(&tag)).await;
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(header_of(&r, header::CONTENT_SECURITY_POLICY), CSP);
        let r = get("/ui/app.js", Some(&format!("\"x\", {tag}"))).await;
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        let r = get("/ui/app.js", Some("\"0000000000000000\"")).await;
        assert_eq!(r.status(), StatusCode::OK);
        // Each file has its own tag.
        let other = get("/ui/app.css", None).await;
        assert_ne!(header_of(&other, header::ETAG), tag);
    }

    #[tokio::test]
    async fn no_token_is_needed_and_other_paths_are_not_served() {
        // The router has no authentication layer: the files carry no data.
        assert_eq!(get("/ui", None).await.status(), StatusCode::OK);
        assert_eq!(get("/ui/x.js", None).await.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            get("/ui/../Cargo.toml", None).await.status(),
            StatusCode::NOT_FOUND
        );
    }
}
