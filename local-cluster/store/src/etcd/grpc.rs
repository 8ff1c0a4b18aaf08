//! gRPC calls to one etcd member: HTTP/2 (hyper's client connection, one per endpoint,
//! shared by every call and opened again when it breaks), messages in gRPC's
//! length-prefixed framing, the outcome in `grpc-status` / `grpc-message` (in the trailers,
//! or in the headers of a trailers-only answer). A call is unary (one message each way) or
//! a stream (etcd's watch: one request message, then answers as they come, for as long as
//! the caller reads). [`Gateway`](super::gateway::Gateway) tries the endpoints in turn;
//! this module only classifies what happened on one.

use super::outcome::{describe, Failure, MAX_ANSWER, NO_LEADER};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, SizeHint};
use hyper::client::conn::http2::SendRequest;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// The gRPC metadata that makes a member without a raft leader refuse at once (what the
/// gateway's [`REQUIRE_LEADER`](super::gateway::REQUIRE_LEADER) header becomes).
const HASLEADER: &str = "hasleader";

/// One endpoint's HTTP/2 connection, opened on first use.
#[derive(Debug)]
pub(super) struct Channel {
    ep: String,
    sender: Mutex<Option<SendRequest<Outgoing>>>,
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
    ) -> Result<SendRequest<Outgoing>, Failure> {
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
        let exchange = async {
            let mut answer = self
                .open(path, message, false, MAX_ANSWER, connect, deadline)
                .await?;
            let one = answer
                .next()
                .await?
                .ok_or_else(|| Failure::Unknown("answer ended without a message".into()))?;
            match answer.next().await? {
                None => Ok(one),
                Some(_) => Err(Failure::Unknown(
                    "a unary answer of more than one message".into(),
                )),
            }
        };
        let out = tokio::time::timeout_at(deadline, exchange)
            .await
            .unwrap_or_else(|_| Err(Failure::Unknown(format!("no answer within {timeout:?}"))));
        self.forget_if_unknown(&out);
        out
    }

    /// Opens the streaming call `path` with `message` as its first (and only) request
    /// message (connecting by `deadline` at the latest): its messages, each of at most
    /// `max` bytes, are read from the [`Stream`], whose dropping ends the call. The caller
    /// bounds the wait for the answer to begin, and calls [`forget`](Self::forget) when
    /// it did not.
    pub(super) async fn stream(
        &self,
        path: &str,
        message: &[u8],
        max: usize,
        deadline: Instant,
        connect: Duration,
    ) -> Result<Stream, Failure> {
        let out = self.open(path, message, true, max, connect, deadline).await;
        self.forget_if_unknown(&out);
        out
    }

    /// Drops the connection (the next call connects again): it may be half-open.
    pub(super) fn forget(&self) {
        *self.sender.lock().unwrap() = None;
    }

    /// After a failure that leaves the outcome open the connection may be half-open (a
    /// frozen or vanished member): the next call connects again, and fails fast as
    /// unreachable if nothing listens there. (Also after an error status that leaves the
    /// outcome open: rare, and a new connection is cheap.) A refusal came over a working
    /// connection: it is kept.
    fn forget_if_unknown<T>(&self, out: &Result<T, Failure>) {
        if matches!(out, Err(Failure::Unknown(_))) {
            self.forget();
        }
    }

    /// Sends a call (its request stays open after `message` when `streaming`) and waits
    /// for its answer's headers: its messages, as they come.
    async fn open(
        &self,
        path: &str,
        message: &[u8],
        streaming: bool,
        max: usize,
        connect: Duration,
        deadline: Instant,
    ) -> Result<Stream, Failure> {
        let mut sender = self.sender(deadline, connect).await?;
        let (body, open) = Outgoing::new(message, streaming);
        let req = http::Request::post(format!("http://{}{path}", self.ep))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .header(HASLEADER, "true")
            .body(body)
            .map_err(|e| Failure::Unreachable(format!("bad request: {e}")))?;
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
        let (parts, body) = resp.into_parts();
        if parts.status != http::StatusCode::OK {
            return Err(Failure::Unknown(format!("http {}", parts.status.as_u16())));
        }
        // A trailers-only answer (an error before any message) has it in its headers.
        if let Some(err) = status_of(&parts.headers) {
            return Err(err);
        }
        Ok(Stream {
            body,
            buf: BytesMut::new(),
            max,
            _open: open,
        })
    }
}

/// A request's body: one message in gRPC's framing, then either its end (a unary call)
/// or, for a streaming call, nothing more until the caller drops the call's [`Stream`]
/// (etcd keeps a watch whose client half-closed; only the stream's reset, which HTTP/2
/// sends once both sides of it are dropped, cancels it).
#[derive(Debug)]
pub(super) struct Outgoing {
    message: Option<Bytes>,
    /// `Some` while a streaming call's request stays open: it ends when the sender is
    /// dropped.
    open: Option<oneshot::Receiver<()>>,
}

impl Outgoing {
    /// The body of `message`, and what keeps it open when `streaming`.
    fn new(message: &[u8], streaming: bool) -> (Self, Option<oneshot::Sender<()>>) {
        let mut framed = BytesMut::with_capacity(5 + message.len());
        framed.put_u8(0); // not compressed
        framed.put_u32(message.len() as u32);
        framed.put_slice(message);
        let (keep, open) = if streaming {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let body = Self {
            message: Some(framed.freeze()),
            open,
        };
        (body, keep)
    }
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(m) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(m))));
        }
        match &mut this.open {
            // Nothing is ever sent on it: it only ends.
            Some(rx) => match Pin::new(rx).poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(_) => {
                    this.open = None;
                    Poll::Ready(None)
                }
            },
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.open.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match (&self.message, &self.open) {
            (Some(m), None) => SizeHint::with_exact(m.len() as u64),
            (None, None) => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

/// The messages of an answer, as they arrive.
#[derive(Debug)]
pub(super) struct Stream {
    body: hyper::body::Incoming,
    /// Bytes not yet a whole message.
    buf: BytesMut,
    /// The largest message accepted.
    max: usize,
    /// Keeps a streaming call's request open (see [`Outgoing`]).
    _open: Option<oneshot::Sender<()>>,
}

impl Stream {
    /// The next message; `None` when the answer ended with status OK.
    pub(super) async fn next(&mut self) -> Result<Option<Bytes>, Failure> {
        loop {
            if let Some(m) = self.whole_message()? {
                return Ok(Some(m));
            }
            let frame = match self.body.frame().await {
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    return Err(Failure::Unknown(format!(
                        "cannot receive: {}",
                        describe(&e)
                    )))
                }
                None => {
                    return Err(Failure::Unknown(
                        "answer ended without a grpc-status".into(),
                    ))
                }
            };
            let trailers = match frame.into_data() {
                Ok(data) => {
                    self.buf.extend_from_slice(&data);
                    continue;
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(t) => t,
                    Err(_) => continue,
                },
            };
            if let Some(err) = status_of(&trailers) {
                return Err(err);
            }
            if !trailers.contains_key("grpc-status") {
                return Err(Failure::Unknown(
                    "answer ended without a grpc-status".into(),
                ));
            }
            if !self.buf.is_empty() {
                return Err(Failure::Unknown(format!(
                    "answer ended inside a message ({} bytes of it)",
                    self.buf.len()
                )));
            }
            return Ok(None);
        }
    }

    /// The first message of the bytes received, if they hold it whole.
    fn whole_message(&mut self) -> Result<Option<Bytes>, Failure> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        if self.buf[0] != 0 {
            return Err(Failure::Unknown(
                "a compressed message (none was asked for)".into(),
            ));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = len as usize;
        if len > self.max {
            return Err(Failure::Unknown(format!(
                "a message of {len} bytes, more than the {} accepted",
                self.max
            )));
        }
        if self.buf.len() < 5 + len {
            // Room for the rest at once, not by doubling.
            self.buf.reserve(5 + len - self.buf.len());
            return Ok(None);
        }
        self.buf.advance(5);
        Ok(Some(self.buf.split_to(len).freeze()))
    }
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

    /// A fake member that answers one call with `body` in DATA frames of `piece` bytes
    /// (so that messages and their length prefixes are split at odd places), then
    /// `trailers`. Its `HOST:PORT`.
    async fn answering(body: Vec<u8>, piece: usize, trailers: http::HeaderMap) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ep = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            let (_, mut respond) = conn.accept().await.unwrap().unwrap();
            tokio::spawn(async move { while conn.accept().await.is_some() {} });
            let head = http::Response::builder()
                .header("content-type", "application/grpc")
                .body(())
                .unwrap();
            let mut send = respond.send_response(head, false).unwrap();
            for chunk in body.chunks(piece) {
                send.send_data(Bytes::copy_from_slice(chunk), false)
                    .unwrap();
                tokio::task::yield_now().await;
            }
            send.send_trailers(trailers).unwrap();
            // Held until the client is done with it.
            std::future::pending::<()>().await;
        });
        ep
    }

    /// Messages in gRPC's framing, one after the other.
    fn framed(messages: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for m in messages {
            out.push(0);
            out.extend_from_slice(&(m.len() as u32).to_be_bytes());
            out.extend_from_slice(m);
        }
        out
    }

    fn status(code: &str, message: &str) -> http::HeaderMap {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", code.parse().unwrap());
        if !message.is_empty() {
            t.insert("grpc-message", message.parse().unwrap());
        }
        t
    }

    /// Everything a streaming call to `ep` yields, one line each, and how it ended.
    async fn read_all(ep: String) -> String {
        let ch = Channel::new(ep);
        let long = Duration::from_secs(30);
        let mut stream = ch
            .stream("/x.Y/Z", b"ask", 1 << 10, Instant::now() + long, long)
            .await
            .unwrap();
        let mut log = Vec::new();
        loop {
            match stream.next().await {
                Ok(Some(m)) => log.push(String::from_utf8_lossy(&m).into_owned()),
                Ok(None) => break log.push("ended".into()),
                Err(e) => break log.push(format!("{e:?}")),
            }
        }
        log.join("\n")
    }

    /// A stream's messages split across DATA frames at every place (inside the length
    /// prefix too) come out whole, one by one, and the end is seen; an error status in
    /// the trailers is classified as the unary calls' is; a message over the limit is
    /// refused, not buffered.
    #[tokio::test]
    async fn stream_messages_are_reassembled_and_their_end_classified() {
        let two = framed(&[b"first answer", b"", b"second, a little longer"]);
        for piece in [1, 3, 7, two.len()] {
            let ep = answering(two.clone(), piece, status("0", "")).await;
            expect_test::expect![[r#"
                first answer

                second, a little longer
                ended"#]]
            .assert_eq(&read_all(ep).await);
        }
        let ep = answering(framed(&[b"one"]), 2, status("14", "etcdserver: no leader")).await;
        expect_test::expect![[r#"
            one
            Unreachable("Unavailable: etcdserver: no leader")"#]]
        .assert_eq(&read_all(ep).await);
        let ep = answering(framed(&[b"one"]), 2, status("4", "request timed out")).await;
        expect_test::expect![[r#"
            one
            Unknown("DeadlineExceeded: request timed out")"#]]
        .assert_eq(&read_all(ep).await);
        let ep = answering(framed(&[&[b'x'; 2000]]), 100, status("0", "")).await;
        expect_test::expect![[
            r#"Unknown("a message of 2000 bytes, more than the 1024 accepted")"#
        ]]
        .assert_eq(&read_all(ep).await);
        let mut cut = framed(&[b"whole", b"cut short"]);
        cut.truncate(cut.len() - 3);
        let ep = answering(cut, 4, status("0", "")).await;
        expect_test::expect![[r#"
            whole
            Unknown("answer ended inside a message (11 bytes of it)")"#]]
        .assert_eq(&read_all(ep).await);
    }

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(
            percent_decode(b"etcdserver: too many%20ops %E2%9C%93 50%"),
            "etcdserver: too many ops \u{2713} 50%"
        );
    }
}
