//! Unary gRPC calls to one etcd member: HTTP/2 (hyper's client connection, one per
//! endpoint, reused by every call and opened again when it breaks), messages in gRPC's
//! length-prefixed framing, the outcome in `grpc-status` / `grpc-message` (in the trailers,
//! or in the headers of a trailers-only answer). [`Gateway`](super::gateway::Gateway)
//! tries the endpoints in turn; this module only classifies what happened on one.

use super::outcome::{describe, Failure, MAX_ANSWER, NO_LEADER};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http2::SendRequest;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// The gRPC metadata that makes a member without a raft leader refuse at once (what the
/// gateway's [`REQUIRE_LEADER`](super::gateway::REQUIRE_LEADER) header becomes).
const HASLEADER: &str = "hasleader";

/// One endpoint's HTTP/2 connection, opened on first use.
#[derive(Debug)]
pub(super) struct Channel {
    ep: String,
    sender: Mutex<Option<SendRequest<Full<Bytes>>>>,
}

impl Channel {
    pub(super) fn new(ep: String) -> Self {
        Self {
            ep,
            sender: Mutex::new(None),
        }
    }

    /// The open connection, or a new one (within `deadline`).
    async fn sender(
        &self,
        deadline: Instant,
        connect: Duration,
    ) -> Result<SendRequest<Full<Bytes>>, Failure> {
        if let Some(s) = &*self.sender.lock().unwrap() {
            if !s.is_closed() {
                return Ok(s.clone());
            }
        }
        let now = Instant::now();
        let until = deadline.min(now + connect);
        let limit = until.saturating_duration_since(now);
        let open = async {
            let tcp = tokio::net::TcpStream::connect(&self.ep)
                .await
                .map_err(|e| describe(&e))?;
            // Requests are small and answered at once: no Nagle delay on either side.
            let _ = tcp.set_nodelay(true);
            let (sender, conn) =
                hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .handshake(hyper_util::rt::TokioIo::new(tcp))
                    .await
                    .map_err(|e| describe(&e))?;
            tokio::spawn(async move {
                // Ends when the connection breaks or every sender is dropped; the next
                // call then sees the sender closed and connects again.
                let _ = conn.await;
            });
            Ok::<_, String>(sender)
        };
        let sender = match tokio::time::timeout_at(until, open).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Failure::Unreachable(format!("cannot connect: {e}"))),
            Err(_) => {
                return Err(Failure::Unreachable(format!(
                    "cannot connect: no connection within {limit:?}"
                )))
            }
        };
        *self.sender.lock().unwrap() = Some(sender.clone());
        Ok(sender)
    }

    /// Calls `path` (`/package.Service/Method`) with the encoded request `message`; the
    /// encoded answer. `timeout` bounds the whole exchange; `connect` a new connection.
    pub(super) async fn unary(
        &self,
        path: &str,
        message: &[u8],
        timeout: Duration,
        connect: Duration,
    ) -> Result<Bytes, Failure> {
        let deadline = Instant::now() + timeout;
        let mut sender = self.sender(deadline, connect).await?;
        let req = self.request(path, message)?;
        let exchange = async {
            let resp = sender.send_request(req).await.map_err(|e| {
                if e.is_canceled() {
                    // Never handed to the connection (it closed first): not sent.
                    Failure::Unreachable(format!("cannot send: {}", describe(&e)))
                } else if refused_stream(&e) {
                    // HTTP/2 says the server did not process the stream.
                    Failure::Unreachable(describe(&e))
                } else {
                    Failure::Unknown(describe(&e))
                }
            })?;
            read_answer(resp).await
        };
        let out = tokio::time::timeout_at(deadline, exchange)
            .await
            .unwrap_or_else(|_| Err(Failure::Unknown(format!("no answer within {timeout:?}"))));
        if matches!(out, Err(Failure::Unknown(_))) {
            // The connection may be half-open (a frozen or vanished member): the next call
            // connects again, and fails fast as unreachable if nothing listens there.
            // (Also after an error status that leaves the outcome open: rare, and a new
            // connection is cheap.) A refusal came over a working connection: it is kept.
            *self.sender.lock().unwrap() = None;
        }
        out
    }

    /// The HTTP/2 request of a call: `message` in gRPC's framing, with `hasleader`.
    fn request(&self, path: &str, message: &[u8]) -> Result<http::Request<Full<Bytes>>, Failure> {
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0); // not compressed
        framed.put_u32(message.len() as u32);
        framed.put_slice(message);
        http::Request::post(format!("http://{}{path}", self.ep))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(HASLEADER, "true")
            .body(Full::new(framed.freeze()))
            .map_err(|e| Failure::Unreachable(format!("bad request: {e}")))
    }
}

/// The one message of a unary answer, or why there is none (its status, from the headers of
/// a trailers-only answer or from the trailers).
async fn read_answer(resp: http::Response<hyper::body::Incoming>) -> Result<Bytes, Failure> {
    let (parts, body) = resp.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(Failure::Unknown(format!("http {}", parts.status.as_u16())));
    }
    // A trailers-only answer (an error before any message) has it in its headers.
    if let Some(err) = status_of(&parts.headers) {
        return Err(err);
    }
    let collected = Limited::new(body, MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| Failure::Unknown(format!("cannot receive: {}", describe(&*e))))?;
    let trailers = collected.trailers().cloned();
    let mut data = collected.to_bytes();
    match trailers.as_ref().and_then(status_of) {
        Some(err) => return Err(err),
        None if trailers.is_none() => {
            return Err(Failure::Unknown(
                "answer ended without a grpc-status".into(),
            ))
        }
        None => {}
    }
    if data.len() < 5 || data[0] != 0 {
        return Err(Failure::Unknown(
            "answer is not one uncompressed gRPC message".into(),
        ));
    }
    data.advance(1);
    let len = data.get_u32() as usize;
    if data.len() != len {
        return Err(Failure::Unknown(format!(
            "answer of {} bytes says it holds {len}",
            data.len()
        )));
    }
    Ok(data)
}

/// Whether hyper's error is the server's `REFUSED_STREAM` (a request it did not process).
fn refused_stream(e: &hyper::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(err) = cur {
        if let Some(h2) = err.downcast_ref::<h2::Error>() {
            return h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        cur = err.source();
    }
    false
}

/// The failure a `grpc-status` other than 0 says, classified like the gateway's HTTP
/// statuses (grpc-gateway maps these codes to 5xx): `None` for OK or no status.
fn status_of(headers: &http::HeaderMap) -> Option<Failure> {
    let code: u32 = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    if code == 0 {
        return None;
    }
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    let msg = format!("{}: {message}", code_name(code));
    Some(if message.contains(NO_LEADER) {
        // Refused before anything was proposed (see HASLEADER): another member may have
        // a leader.
        Failure::Unreachable(msg)
    } else if matches!(code, 2 | 4 | 13 | 14 | 15) {
        // Unknown, DeadlineExceeded ("request timed out"), Internal, Unavailable (leader
        // changes), DataLoss: it may still commit.
        Failure::Unknown(msg)
    } else {
        Failure::Refused(msg)
    })
}

/// gRPC's name of a status code.
fn code_name(code: u32) -> String {
    const NAMES: [&str; 17] = [
        "OK",
        "Canceled",
        "Unknown",
        "InvalidArgument",
        "DeadlineExceeded",
        "NotFound",
        "AlreadyExists",
        "PermissionDenied",
        "ResourceExhausted",
        "FailedPrecondition",
        "Aborted",
        "OutOfRange",
        "Unimplemented",
        "Internal",
        "Unavailable",
        "DataLoss",
        "Unauthenticated",
    ];
    NAMES
        .get(code as usize)
        .map_or_else(|| format!("grpc status {code}"), |n| (*n).to_owned())
}

/// `grpc-message` is percent-encoded (`%XX`) UTF-8.
fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if raw[i] == b'%' && i + 2 < raw.len() {
            if let (Some(h), Some(l)) = (hex(raw[i + 1]), hex(raw[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            percent_decode(b"etcdserver: too many%20ops %E2%9C%93 50%"),
            "etcdserver: too many ops \u{2713} 50%"
        );
    }
}
