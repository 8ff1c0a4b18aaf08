//! The audit log: one structured line under the tracing target `xce::audit` for every
//! write (submit, update, scale, restart, stop) and every refused request (401, 403, and
//! the 404 a service out of the caller's sight answers), with who (the principal, never
//! the secret), what (the action), on what (project, service or host), how it ended
//! (status, error code) and from where (the peer's address).
//!
//! An operator routes it apart with the target: `RUST_LOG=info,xce::audit=info` keeps it
//! with the rest, `RUST_LOG=warn,xce::audit=info` keeps it nearly alone, and since every
//! line starts with its level and target (`INFO xce::audit: ...`) a `grep xce::audit`
//! of the log (or of `xced dev`'s log file) separates it.
//!
//! It is a middleware, so it sees the answers the extractors give too (a 401 never reaches
//! a handler). It authenticates the request's token again only for the requests it logs
//! (writes and refusals, never the reads that make up nearly all traffic).

use crate::Peer;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Body as _;
use plugin_api::ApiContext;
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The largest answer read to name the object of a write (a service's detail). A larger
/// one passes through whole, unread: the line names the object by the path and query.
const BODY_MAX: usize = 1 << 20;

/// The middleware: `axum::middleware::from_fn_with_state(ctx, audit::layer)`.
pub async fn layer(State(ctx): State<ApiContext>, req: Request, next: Next) -> Response {
    let asked = Asked::of(&req);
    let resp = next.run(req).await;
    let status = resp.status();
    let refused = asked.refused(status);
    if !asked.is_write() && !refused {
        return resp;
    }
    // Authenticated again only now: the reads that make up nearly all traffic never pay
    // for it.
    let principal = match ctx.auth.authenticate(asked.token().as_deref()) {
        Ok(p) => p.name,
        Err(e) => format!("-({e})"),
    };
    let mut object = Object::named_by(asked.path(), asked.project());
    let (resp, code) = read_answer(resp, &mut object).await;
    let outcome = if status.is_success() {
        "ok"
    } else if refused {
        "refused"
    } else {
        "failed"
    };
    Line {
        asked: &asked,
        principal,
        object,
        status,
        code,
        outcome,
    }
    .emit();
    resp
}

/// What the log keeps of a request, taken before the request is handed on: shared
/// copies of its target and its `Authorization` header (reference counts), read only when
/// a line is written, so the reads that make up nearly all traffic allocate nothing here.
struct Asked {
    method: Method,
    uri: axum::http::Uri,
    /// The `Authorization` header: the bearer token names the principal (never logged).
    authorization: Option<axum::http::HeaderValue>,
    peer: Option<IpAddr>,
}

impl Asked {
    fn of(req: &Request) -> Self {
        Self {
            method: req.method().clone(),
            uri: req.uri().clone(),
            authorization: req
                .headers()
                .get(axum::http::header::AUTHORIZATION)
                .cloned(),
            peer: req.extensions().get::<Peer>().map(|p| p.0),
        }
    }

    fn path(&self) -> &str {
        self.uri.path()
    }

    /// The query's `project=`.
    fn project(&self) -> Option<String> {
        self.uri.query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("project="))
                .map(str::to_owned)
        })
    }

    /// The bearer token.
    fn token(&self) -> Option<String> {
        let v = self.authorization.as_ref()?.to_str().ok()?;
        let t = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))?;
        Some(t.trim().to_owned())
    }

    /// A change: any method of the `/v1/` API but a read.
    fn is_write(&self) -> bool {
        !matches!(self.method, Method::GET | Method::HEAD) && self.path().starts_with("/v1/")
    }

    /// Whether `status` refused the request: 401, 403, or the 404 a service out of the
    /// caller's sight answers.
    fn refused(&self, status: StatusCode) -> bool {
        status == StatusCode::UNAUTHORIZED
            || status == StatusCode::FORBIDDEN
            || (status == StatusCode::NOT_FOUND && self.path().starts_with("/v1/services/"))
    }
}

/// What a request is on.
struct Object {
    project: Option<String>,
    service: Option<String>,
    host: Option<String>,
}

impl Object {
    /// What `path` names (the project comes from the query).
    fn named_by(path: &str, project: Option<String>) -> Self {
        let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        Self {
            project,
            service: match segments.as_slice() {
                ["v1", "services", name, ..] => Some((*name).to_owned()),
                _ => None,
            },
            host: match segments.as_slice() {
                ["internal", "v1", "hosts", host, ..] | ["v1", "hosts", host, ..] => {
                    Some((*host).to_owned())
                }
                _ => None,
            },
        }
    }
}

/// Reads the answer (up to [`BODY_MAX`]) for what a write changed (a submit's project and
/// name are in the profile, not the path), filled into `object`, or why the request was
/// refused: the answer, rebuilt whole, and its error code (empty when none). An answer
/// larger than [`BODY_MAX`] is passed on as it comes, what was read first ahead of the
/// rest, and names nothing.
async fn read_answer(resp: Response, object: &mut Object) -> (Response, String) {
    let status = resp.status();
    let mut code = String::new();
    let (parts, body) = resp.into_parts();
    if body.size_hint().lower() > BODY_MAX as u64 {
        return (Response::from_parts(parts, body), code);
    }
    let bytes = match read_up_to(body, BODY_MAX).await {
        Read::Whole(bytes) => bytes,
        Read::Longer(first, rest) => {
            let body = Body::new(Prefixed {
                first: Some(first),
                rest,
            });
            return (Response::from_parts(parts, body), code);
        }
    };
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        let field = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        if status.is_success() {
            object.project = field("project").or(object.project.take());
            object.service = field("name").or(object.service.take());
        } else if let Some(c) = v.pointer("/error/code").and_then(|c| c.as_str()) {
            c.clone_into(&mut code);
        }
    }
    (Response::from_parts(parts, Body::from(bytes)), code)
}

/// What [`read_up_to`] read of a body.
enum Read {
    /// All of it.
    Whole(Bytes),
    /// More than the limit: what was read, and the body with the rest (or its error).
    Longer(Bytes, Body),
}

/// Reads `body` until it ends or more than `limit` bytes are read. A body that fails is
/// treated as longer: its error comes after what was read, as it would have.
async fn read_up_to(mut body: Body, limit: usize) -> Read {
    let mut read = Vec::new();
    loop {
        let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await;
        match frame {
            None => return Read::Whole(Bytes::from(read)),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    read.extend_from_slice(&data);
                }
                if read.len() > limit {
                    return Read::Longer(Bytes::from(read), body);
                }
            }
            Some(Err(e)) => return Read::Longer(Bytes::from(read), Body::new(Failed(Some(e)))),
        }
    }
}

/// A body whose first bytes were read already: those, then the rest.
struct Prefixed {
    first: Option<Bytes>,
    rest: Body,
}

impl http_body::Body for Prefixed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(first))));
        }
        Pin::new(&mut self.rest).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.rest.is_end_stream()
    }
}

/// A body that fails with the error another body failed with.
struct Failed(Option<axum::Error>);

impl http_body::Body for Failed {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.take().map(Err))
    }
}

/// One line of the audit log.
struct Line<'a> {
    asked: &'a Asked,
    principal: String,
    object: Object,
    status: StatusCode,
    code: String,
    outcome: &'static str,
}

impl Line<'_> {
    fn emit(&self) {
        let Self {
            asked,
            principal,
            object,
            status,
            code,
            outcome,
        } = self;
        tracing::info!(
            target: "xce::audit",
            principal,
            action = action(&asked.method, asked.path(), *status),
            project = object.project.as_deref().unwrap_or("-"),
            service = object.service.as_deref().unwrap_or("-"),
            host = object.host.as_deref().unwrap_or("-"),
            outcome,
            status = status.as_u16(),
            code,
            peer = %asked.peer.map_or_else(|| "-".to_owned(), |p| p.to_string()),
            method = %asked.method,
            path = asked.path(),
            "audit"
        );
    }
}

/// The action a request is, as the audit log names it. A `PUT` of a service that did not
/// exist (answered 201 Created: `xcecli service submit`) is a `submit`, like a `POST`.
fn action(method: &Method, path: &str, status: StatusCode) -> String {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let named = match (method, segments.as_slice()) {
        (&Method::POST, ["v1", "services"]) => "submit",
        (&Method::PUT, ["v1", "services", _]) if status == StatusCode::CREATED => "submit",
        (&Method::PUT, ["v1", "services", _]) => "update",
        (&Method::POST, ["v1", "services", _, "scale"]) => "scale",
        (&Method::POST, ["v1", "services", _, "restart"]) => "restart",
        (&Method::DELETE, ["v1", "services", _]) => "stop",
        (_, ["internal", "v1", "hosts", _, call]) => return format!("worker.{call}"),
        (&Method::GET | &Method::HEAD, _) => "read",
        _ => return method.as_str().to_lowercase(),
    };
    named.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer of `POST /v1/services/web/scale` through the audit layer: `body` as
    /// it is, or as a stream of 64 KiB chunks with no size known before.
    async fn through_the_layer(body: Vec<u8>, streamed: bool) -> Vec<u8> {
        use axum::routing::post;
        use tower::ServiceExt as _;
        let handler = move || async move {
            if !streamed {
                return Body::from(body);
            }
            let chunks: Vec<Bytes> = body.chunks(64 * 1024).map(Bytes::copy_from_slice).collect();
            Body::new(Chunks(chunks.into()))
        };
        let ctx = ApiContext::for_test(vec![]);
        let app = axum::Router::new()
            .route("/v1/services/web/scale", post(handler))
            .layer(axum::middleware::from_fn_with_state(ctx, layer));
        let req = axum::http::Request::post("/v1/services/web/scale")
            .body(Body::empty())
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap()
            .to_vec()
    }

    /// A body of chunks, its length unknown until it ends.
    struct Chunks(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(http_body::Frame::data(c))))
        }
    }

    /// Answers above the 1 MiB the layer reads pass whole (they were cut to nothing, and
    /// `xcecli service scale` failed on an empty 200), with a known size or streamed;
    /// smaller ones are read and passed on too.
    #[tokio::test]
    async fn answers_of_any_size_pass_whole() {
        let mut sizes = Vec::new();
        for len in [100, BODY_MAX + 1, 3 * BODY_MAX] {
            for streamed in [false, true] {
                let body: Vec<u8> = (0..len).map(|i| b"0123456789"[i % 10]).collect();
                let got = through_the_layer(body.clone(), streamed).await;
                assert!(got == body, "{len} bytes, streamed: {streamed}");
                sizes.push(got.len());
            }
        }
        assert_eq!(
            sizes,
            [
                100,
                100,
                BODY_MAX + 1,
                BODY_MAX + 1,
                3 * BODY_MAX,
                3 * BODY_MAX
            ]
        );
    }

    #[test]
    fn actions_are_named_from_method_and_path() {
        let cases = [
            (Method::POST, "/v1/services", "submit"),
            (Method::PUT, "/v1/services/web", "update"),
            (Method::PUT, "/v1/services/new", "submit"),
            (Method::POST, "/v1/services/web/scale", "scale"),
            (Method::POST, "/v1/services/web/restart", "restart"),
            (Method::DELETE, "/v1/services/web", "stop"),
            (
                Method::POST,
                "/internal/v1/hosts/exec-01/register",
                "worker.register",
            ),
            (Method::GET, "/v1/services/web/endpoints/stream", "read"),
            (Method::PATCH, "/v1/hosts/exec-01", "patch"),
        ];
        for (m, path, want) in cases {
            // A PUT that created its service is answered 201.
            let status = if path.ends_with("/new") {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            assert_eq!(action(&m, path, status), want, "{m} {path}");
        }
    }
}
