//! The answers every router shares, the controller's, a standby's and a separate
//! apiserver's alike: errors in the one JSON shape, and `/metrics`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use plugin_api::ApiError;
use prometheus_client::registry::Registry;

/// Rewrites error answers that are not JSON yet (axum's own rejections: 413 body too
/// large, 405, bad paths) into the [`ApiError`] shape.
pub fn json_errors(r: Response, limit: usize) -> Response {
    let status = r.status();
    let is_json = r
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return r;
    }
    let e = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            status,
            "too_large",
            format!("request body is larger than the limit of {limit} bytes"),
        ),
        StatusCode::METHOD_NOT_ALLOWED => ApiError::new(
            status,
            "method_not_allowed",
            "method not allowed on this route",
        ),
        StatusCode::NOT_FOUND => ApiError::new(status, "not_found", "no such route"),
        s if s.is_client_error() => ApiError::new(status, "invalid", "invalid request"),
        _ => ApiError::new(status, "internal", "internal error"),
    };
    e.into_response()
}

/// `/metrics`: the registry in the OpenMetrics text format.
pub fn metrics_response(registry: &Registry) -> Response {
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, registry).is_err() {
        return ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "metrics encoding failed",
        )
        .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
        )],
        out,
    )
        .into_response()
}
