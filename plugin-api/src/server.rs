//! The parts of the contract that live in an HTTP server (feature `server`): extensions
//! that add routes to the apiserver, the [`Principal`] extractor and the error answer.
//! Behind a feature so that a plugin that serves nothing (a resource plugin, a facts
//! provider) and a client that reads the answers (the CLI) link no server code.

use crate::auth::{ApiContext, ApiError, AuthError, Principal};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

/// Adds routes to the apiserver.
///
/// **Who calls it**: the host, once at apiserver start; the returned router is merged into
/// the host's (its paths must not clash with the host's or other extensions'). Handlers
/// authenticate with the [`Principal`] extractor and authorize with [`Principal::may`] on
/// the object's own project; they answer errors with [`ApiError`].
pub trait ApiExtension: Send + Sync + 'static {
    /// Builds the extension's routes.
    fn router(&self, cx: ApiContext) -> axum::Router;

    /// Registers the extension's metrics in the host's registry (served on `/metrics`).
    /// Called once, before [`router`](Self::router).
    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        let _ = registry;
    }

    /// Called by the host when it stops serving (a SIGTERM), after it stopped accepting
    /// connections and before it waits for the requests in flight, which it cuts off after
    /// a deadline: the extension ends its long requests now — a blocking query answers
    /// with the current state, a stream ends — and answers later ones without waiting.
    /// May be called more than once; the default does nothing.
    fn drain(&self) {}

    /// Counts a request the host parks itself — a blocking query on a service's detail,
    /// answered by the host or forwarded to the leader — against the extension's
    /// per-principal and total watcher caps, for as long as the returned [`Parked`] lives,
    /// so that every kind of parked request shares one budget. `None`: the extension keeps
    /// no watcher caps. `Some(Err(_))`: past a cap, the refusal to answer (429).
    fn park(&self, principal: &Principal) -> Option<Result<Parked, ApiError>> {
        let _ = principal;
        None
    }
}

/// A parked request's place among an extension's watchers ([`ApiExtension::park`]);
/// dropping it gives the place back.
pub type Parked = Box<dyn std::any::Any + Send + Sync>;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status;
        let mut resp =
            (status, axum::Json(crate::error_body::ErrorBody::from(self))).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        // Every 503 (`stale`, `no_leader`, `unavailable`) is a moment's state: clients and
        // load balancers retry after a second, or ask another apiserver.
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        resp
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let auth = parts
            .extensions
            .get::<ApiContext>()
            .cloned()
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "authenticator not installed",
                )
            })?;
        let token = match parts.headers.get(axum::http::header::AUTHORIZATION) {
            None => None,
            Some(v) => {
                let v = v
                    .to_str()
                    .map_err(|_| ApiError::unauthenticated(AuthError::Invalid))?;
                match v
                    .strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
                {
                    Some(t) => Some(t.trim()),
                    None => return Err(ApiError::unauthenticated(AuthError::Invalid)),
                }
            }
        };
        auth.auth
            .authenticate(token)
            .map_err(ApiError::unauthenticated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_503_says_when_to_retry_and_a_401_how_to_authenticate() {
        let stale = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "stale", "reloading");
        let resp = stale.into_response();
        assert_eq!(resp.headers()[axum::http::header::RETRY_AFTER], "1");
        let unauth = ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", "no token");
        let resp = unauth.into_response();
        assert_eq!(
            resp.headers()[axum::http::header::WWW_AUTHENTICATE],
            "Bearer"
        );
        assert!(resp
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .is_none());
    }
}
