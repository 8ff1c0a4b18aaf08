//! Parked requests forwarded to the leader: blocking queries on a service's detail
//! (`GET /v1/services/{name}?index=N&wait=…`), which the leader holds until the service
//! changes or `wait` runs out.
//!
//! Forwarded over the ordinary client, each would hold one leader connection for its whole
//! wait (HTTP/1.1 carries one request at a time): a few hundred parked clients made an
//! apiserver open a few hundred connections to the leader, past the leader's per-client
//! cap, and every other forwarded request was refused. So a parked request here
//!
//! - first takes its place among the caller's watchers (the extensions' caps,
//!   [`plugin_api::ApiExtension::park`]: the same budget as endpoint queries and streams;
//!   429 past it), and
//! - then goes over a [`ParkedPool`]: at most [`CONNECTIONS`] HTTP/2 connections to the
//!   leader, each carrying at most [`STREAMS`] parked requests at once (below the leader's
//!   256 streams per connection). When the pool is full, the request is refused at once
//!   (429 `too_many_watchers`, `Retry-After`): it never waits for a place, and it never
//!   takes a connection of the ordinary client, which stays free for everything else.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use plugin_api::ApiError;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// HTTP/2 connections to the leader that parked requests share, at most.
pub(super) const CONNECTIONS: usize = 4;
/// Parked requests one of those connections carries at once, at most: below the leader's
/// `MAX_CONCURRENT_STREAMS` (256), so the leader never makes one wait for a stream.
pub(super) const STREAMS: usize = 200;

/// The leader connections of parked requests (see the module's doc).
#[derive(Clone)]
pub(super) struct ParkedPool {
    lanes: Arc<[Lane]>,
}

/// One HTTP/2 connection (a client of its own: reqwest keeps one connection per host
/// for HTTP/2) and the room left on it.
struct Lane {
    http: reqwest::Client,
    room: Arc<Semaphore>,
}

/// A place on one lane, held while the request is forwarded and its answer relayed.
pub(super) struct Seat {
    pub(super) http: reqwest::Client,
    _place: OwnedSemaphorePermit,
}

impl ParkedPool {
    /// [`CONNECTIONS`] lanes, each client built by `client` (HTTP/2 only).
    pub(super) fn new(
        mut client: impl FnMut() -> anyhow::Result<reqwest::Client>,
    ) -> anyhow::Result<Self> {
        let lanes = (0..CONNECTIONS)
            .map(|_| {
                Ok(Lane {
                    http: client()?,
                    room: Arc::new(Semaphore::new(STREAMS)),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Self {
            lanes: lanes.into(),
        })
    }

    /// A place on the first lane with room (so few connections are opened while few
    /// requests park); `None` when every lane is full (answer [`full`]).
    pub(super) fn seat(&self) -> Option<Seat> {
        self.lanes.iter().find_map(|lane| {
            let place = lane.room.clone().try_acquire_owned().ok()?;
            Some(Seat {
                http: lane.http.clone(),
                _place: place,
            })
        })
    }

    /// Parked requests forwarded now.
    #[cfg(test)]
    fn in_use(&self) -> usize {
        self.lanes
            .iter()
            .map(|l| STREAMS - l.room.available_permits())
            .sum()
    }
}

/// 429 `too_many_watchers` with `Retry-After`: every place of the pool is taken.
pub(super) fn full() -> Response {
    let mut resp = ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too_many_watchers",
        format!(
            "too many blocking queries forwarded to the leader from this apiserver (at most {}), retry later",
            CONNECTIONS * STREAMS
        ),
    )
    .into_response();
    resp.headers_mut()
        .insert(http::header::RETRY_AFTER, http::HeaderValue::from(1u64));
    resp
}

/// Whether a forwarded request parks at the leader: a `GET` with `index=N`, N > 0 (a
/// blocking query; `index=0` answers at once).
pub(super) fn is_parked(parts: &http::request::Parts) -> bool {
    parts.method == http::Method::GET
        && parts.uri.query().is_some_and(|q| {
            q.split('&')
                .filter_map(|pair| pair.split_once('='))
                .any(|(k, v)| k == "index" && v.parse::<u64>().is_ok_and(|n| n > 0))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: &str, uri: &str) -> http::request::Parts {
        http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn only_a_get_with_a_nonzero_index_parks() {
        let cases = [
            ("GET", "/v1/services/web?index=7&wait=30s", true),
            ("GET", "/v1/services/web?wait=30s&index=1", true),
            ("GET", "/v1/services/web?index=0", false),
            ("GET", "/v1/services/web?index=x", false),
            ("GET", "/v1/services/web", false),
            ("POST", "/v1/services/web?index=7", false),
        ];
        for (m, uri, want) in cases {
            assert_eq!(is_parked(&parts(m, uri)), want, "{m} {uri}");
        }
    }

    #[test]
    fn a_full_pool_refuses_at_once_and_a_freed_place_is_reused() {
        let pool = ParkedPool::new(|| Ok(reqwest::Client::new())).unwrap();
        let seats: Vec<Seat> = (0..CONNECTIONS * STREAMS)
            .map(|_| pool.seat().expect("room"))
            .collect();
        assert_eq!(pool.in_use(), CONNECTIONS * STREAMS);
        assert!(pool.seat().is_none(), "full");
        assert_eq!(full().status(), StatusCode::TOO_MANY_REQUESTS);
        drop(seats);
        assert_eq!(pool.in_use(), 0);
        assert!(pool.seat().is_some());
    }
}
