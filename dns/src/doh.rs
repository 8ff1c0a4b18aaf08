//! `GET|POST /dns-query` (RFC 8484): the same answers over HTTP (1.1 and 2, as the host
//! serves), as the caller's bearer token.

use crate::answer::Transport;
use crate::server::Dns;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use plugin_api::{ApiContext, ApiError, ApiExtension, Principal};
use std::sync::Arc;

/// The media type of a DNS message (RFC 8484 section 6).
pub const DNS_MESSAGE: &str = "application/dns-message";

/// The DNS server as an apiserver extension: `/dns-query` and the metrics. Without a
/// listener, the zone is rebuilt at the first query after a change (see `Dns::zone`).
#[derive(Debug, Clone)]
pub struct DnsApi(pub Arc<Dns>);

impl ApiExtension for DnsApi {
    fn router(&self, _cx: ApiContext) -> axum::Router {
        axum::Router::new()
            .route("/dns-query", get(doh_get).post(doh_post))
            .with_state(self.0.clone())
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.0.metrics.register(registry);
    }
}

#[derive(Debug, serde::Deserialize)]
struct DohParams {
    dns: Option<String>,
}

async fn doh_get(
    State(dns): State<Arc<Dns>>,
    principal: Principal,
    Query(params): Query<DohParams>,
) -> Result<Response, ApiError> {
    let Some(text) = params.dns else {
        return Err(bad_request("dns", "required: the query, base64url-encoded"));
    };
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let query = engine
        .decode(text.trim_end_matches('='))
        .map_err(|_| bad_request("dns", "not base64url (RFC 4648 section 5)"))?;
    reply(&dns, &principal, &query)
}

async fn doh_post(
    State(dns): State<Arc<Dns>>,
    principal: Principal,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        });
    if media.as_deref() != Some(DNS_MESSAGE) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("Content-Type must be {DNS_MESSAGE}"),
        ));
    }
    reply(&dns, &principal, &body)
}

fn reply(dns: &Dns, principal: &Principal, query: &[u8]) -> Result<Response, ApiError> {
    let Some(answer) = dns.answer(principal, query, Transport::Https) else {
        return Err(bad_request("dns", "not a DNS query message"));
    };
    let mut resp = (StatusCode::OK, answer).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(DNS_MESSAGE));
    // The records' own TTL (RFC 8484 section 5.1): an HTTP cache keeps it no longer.
    if let Ok(v) = HeaderValue::from_str(&format!("max-age={}", dns.ttl)) {
        h.insert(header::CACHE_CONTROL, v);
    }
    Ok(resp)
}

fn bad_request(field: &str, reason: &str) -> ApiError {
    ApiError::bad_param(field, reason)
}
