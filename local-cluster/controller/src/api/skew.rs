//! The skew check (UPGRADING.md): a worker (`/internal/v1`, its `X-Xce-Protocol`) may be
//! one protocol version older than this controller, never newer; an apiserver forwarding
//! a request (its `X-Xce-Apiserver-Protocol`) may be one older or one newer. A peer
//! outside is refused before its request does anything, with 400 `version_skew` naming
//! both versions, and the `X-Xce-Skew-Refused` header naming the peer. A peer that sends
//! no header is a release from before protocol versions (protocol 1).

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use plugin_api::ApiError;
use xce_wire::version::{
    check_skew, parse_protocol, protocol, Peer, FORWARDED_PROTOCOL_HEADER, PROTOCOL_HEADER,
    SKEW_CODE, SKEW_HEADER,
};

/// The middleware: checks the forwarding apiserver, then (worker routes) the worker.
pub(super) async fn check(req: Request, next: Next) -> Response {
    let headers = req.headers();
    if headers.contains_key(FORWARDED_PROTOCOL_HEADER) {
        if let Some(refusal) = refusal(headers, FORWARDED_PROTOCOL_HEADER, Peer::Apiserver) {
            return refusal;
        }
    }
    if req.uri().path().starts_with("/internal/") {
        if let Some(refusal) = refusal(headers, PROTOCOL_HEADER, Peer::Worker) {
            return refusal;
        }
    }
    next.run(req).await
}

/// The answer refusing a `kind` peer for the protocol in `header`; `None`: it may pass.
fn refusal(headers: &HeaderMap, header: &str, kind: Peer) -> Option<Response> {
    let raw = headers.get(header).map(|v| v.to_str().unwrap_or("?"));
    let Some(theirs) = parse_protocol(raw) else {
        return Some(
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("header {header}: {raw:?} is not a protocol version (a number)"),
            )
            .into_response(),
        );
    };
    let Err(e) = check_skew(kind, protocol(), theirs) else {
        return None;
    };
    tracing::warn!(peer = %kind, peer_protocol = theirs, protocol = protocol(), "refused a peer outside the supported version skew: {e}");
    let mut resp = ApiError::new(StatusCode::BAD_REQUEST, SKEW_CODE, e.to_string()).into_response();
    resp.headers_mut()
        .insert(SKEW_HEADER, HeaderValue::from_static(kind.name()));
    Some(resp)
}
