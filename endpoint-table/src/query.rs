//! What an endpoint request asks for and how an entry is answered: the query parameters
//! (parsed here, so every mistake answers our 400), the view (`?port=`, `?include=all`,
//! the plain format) and the blocking query (`?index=&wait=`).

use crate::config::TableConfig;
use crate::entry::Entry;
use crate::render;
use crate::wire::{self, INDEX_HEADER};
use axum::extract::rejection::QueryRejection;
use axum::extract::Query;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use plugin_api::ApiError;
use std::time::Duration;

/// The most jitter added to a blocking query's wait: clients give the server `wait` plus
/// some slack (xcecli: 30s) before they call the connection dead.
const MAX_JITTER: Duration = Duration::from_secs(5);

/// The query string of every endpoint route, as axum hands it over.
pub(crate) type Params = Result<Query<RawParams>, QueryRejection>;

/// The query parameters, all as text: parsed below so every mistake answers our 400.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct RawParams {
    pub(crate) port: Option<String>,
    pub(crate) include: Option<String>,
    pub(crate) format: Option<String>,
    pub(crate) index: Option<String>,
    pub(crate) wait: Option<String>,
    pub(crate) service: Option<String>,
    pub(crate) project: Option<String>,
}

/// How to render an entry.
#[derive(Debug)]
pub(crate) struct View {
    pub(crate) port: Option<String>,
    pub(crate) all: bool,
    pub(crate) plain: bool,
}

/// `?index=&wait=`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocking {
    pub(crate) index: u64,
    pub(crate) wait: Duration,
}

pub(crate) fn params(query: Params) -> Result<RawParams, ApiError> {
    let p = query
        .map(|Query(p)| p)
        .map_err(|e| ApiError::bad_param("query", e.body_text()))?;
    if p.project.as_deref() == Some("") {
        return Err(ApiError::bad_param("project", "must not be empty"));
    }
    Ok(p)
}

// === impl View ===

impl View {
    pub(crate) fn parse(p: &RawParams, headers: &HeaderMap) -> Result<Self, ApiError> {
        let all = match p.include.as_deref() {
            None => false,
            Some("all") => true,
            Some(_) => return Err(ApiError::bad_param("include", "expected \"all\"")),
        };
        let plain = match p.format.as_deref() {
            None => accepts_plain(headers),
            Some("json") => false,
            Some("plain") => true,
            Some(_) => {
                return Err(ApiError::bad_param(
                    "format",
                    "expected \"json\" or \"plain\"",
                ))
            }
        };
        Ok(Self {
            port: p.port.clone(),
            all,
            plain,
        })
    }

    /// Checks the view against the service (after its visibility was checked, so these
    /// 400s tell nothing to a caller who may not see it).
    pub(crate) fn check(&self, entry: &Entry) -> Result<(), ApiError> {
        if let Some(port) = &self.port {
            if !entry.knows_port(port) {
                return Err(ApiError::bad_param(
                    "port",
                    format!(
                        "service {:?} has no port {port:?} (it declares: {})",
                        entry.service,
                        declared(entry)
                    ),
                ));
            }
        }
        if self.plain {
            plain_port(entry, self.port.as_deref())?;
        }
        Ok(())
    }

    pub(crate) fn render(&self, entry: &Entry) -> Result<Response, ApiError> {
        let mut resp = if self.plain {
            let port = plain_port(entry, self.port.as_deref())?;
            (
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                render::plain(entry, port),
            )
                .into_response()
        } else if self.port.is_none() {
            // The common reads: served from the entry's cached rendering.
            let body = render::json(entry, self.all);
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        } else {
            Json(wire::answer(entry, self.port.as_deref(), self.all)).into_response()
        };
        with_index(&mut resp, entry.index);
        Ok(resp)
    }
}

/// `Accept: text/plain` (and not JSON) selects the plain format.
fn accepts_plain(headers: &HeaderMap) -> bool {
    let types: Vec<String> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| {
            t.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .collect();
    types.iter().any(|t| t == "text/plain") && !types.iter().any(|t| t == "application/json")
}

fn declared(entry: &Entry) -> String {
    if entry.ports.is_empty() {
        return "none".into();
    }
    let names: Vec<&str> = entry.ports.iter().map(|p| p.name.as_str()).collect();
    names.join(", ")
}

/// The port a one-port-per-line answer is for: `?port=`, or the only declared one.
pub(crate) fn plain_port<'a>(entry: &'a Entry, port: Option<&'a str>) -> Result<&'a str, ApiError> {
    if let Some(port) = port {
        return Ok(port);
    }
    match entry.ports.as_slice() {
        [only] => Ok(&only.name),
        [] => Err(ApiError::bad_param(
            "port",
            format!("service {:?} declares no ports", entry.service),
        )),
        _ => Err(ApiError::bad_param(
            "port",
            format!(
                "required: service {:?} declares several ports ({})",
                entry.service,
                declared(entry)
            ),
        )),
    }
}

/// The `Last-Event-ID` header of a stream request, if any; a value that is not an event
/// id of ours is a 400.
pub(crate) fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(v) = headers.get("last-event-id") else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| ApiError::bad_param("Last-Event-ID", "expected a non-negative integer"))
}

pub(crate) fn with_index(resp: &mut Response, index: u64) {
    resp.headers_mut()
        .insert(INDEX_HEADER, HeaderValue::from(index));
}

// === impl Blocking ===

impl Blocking {
    pub(crate) fn parse(p: &RawParams, cfg: &TableConfig) -> Result<Option<Self>, ApiError> {
        let wait = match p.wait.as_deref() {
            None => cfg.default_wait,
            Some(text) => humantime::parse_duration(text)
                .map_err(|_| ApiError::bad_param("wait", "expected a duration such as \"30s\""))?,
        };
        let Some(index) = p.index.as_deref() else {
            return Ok(None);
        };
        let index = index
            .parse()
            .map_err(|_| ApiError::bad_param("index", "expected a non-negative integer"))?;
        Ok(Some(Self {
            index,
            wait: wait.min(cfg.max_wait),
        }))
    }

    /// The wait with up to 1/16 (at most [`MAX_JITTER`]) added, so clients that started
    /// together do not all come back together.
    pub(crate) fn deadline(&self) -> tokio::time::Instant {
        let max_jitter = (self.wait / 16).min(MAX_JITTER).as_millis();
        let max_jitter = u64::try_from(max_jitter).unwrap_or(u64::MAX);
        let jitter = Duration::from_millis(fastrand::u64(0..=max_jitter));
        let now = tokio::time::Instant::now();
        // A configured max_wait of centuries must not overflow the clock.
        now.checked_add(self.wait.saturating_add(jitter))
            .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400))
    }
}
