//! HTTP/2 clients of the fan-out (prior knowledge, all on the `h2` crate, see [`RawH2`]):
//! our blocking queries and SSE streams multiplexed on few connections, and etcd's native
//! gRPC watch.
//!
//! The gRPC watch client is written here on the same HTTP/2 client rather than taken
//! from the `etcd-client` crate: that crate needs `protoc` and tonic at build time, and the
//! two messages a watch needs (a create request out, watch responses in) are a few lines of
//! protobuf. On the wire it is what etcd's own Go client sends: `POST
//! /etcdserverpb.Watch/Watch`, one bidirectional stream carrying many watches (clientv3
//! puts every watch of one context on one stream), each event a length-prefixed
//! `WatchResponse`.

use super::*;
use axum::body::Bytes;
use futures_util::StreamExt;

/// One HTTP/2 connection of the watchers, on the `h2` crate directly.
///
/// Not hyper's client, whose every request hops through its dispatch task and a task of
/// its own before the caller sees the answer: in a profile of this bench those hops made
/// the client cost a third more CPU per answer than the raw HTTP/1.1 client (27 vs 35-45
/// µs), CPU taken from the server on these two shared cores, so hyper's client timed
/// itself as much as our server. The HTTP/1.1 watchers are a minimal client too; this
/// keeps the runs comparable. Our watchers and etcd's use the same client.
pub(crate) type RawH2 = ::h2::client::SendRequest<Bytes>;

/// Opens an HTTP/2 connection with prior knowledge to `addr`; it lives as long as a clone
/// of the sender does.
pub(crate) async fn raw_h2_connect(addr: SocketAddr) -> RawH2 {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let (send, conn) = ::h2::client::Builder::new()
        // Room for every stream's events without waiting for window updates: the client's
        // reading speed is not what is measured.
        .initial_connection_window_size(16 << 20)
        // Requests batched as the server batches its answers: the watchers that had an
        // answer together ask again together.
        .handshake(xce_serve::http2::BatchedWrites::http2(tcp))
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    send
}

/// A blocking-query watcher on a shared HTTP/2 connection: as [`blocking_watcher`], each
/// query one stream.
pub(crate) async fn h2_blocking_watcher(mut send: RawH2, changes: usize, seen: Seen) {
    let mut index = 0;
    for k in 0..=changes {
        let req = axum::http::Request::get(format!(
            "http://b/v1/services/svc-0/endpoints?index={index}&wait=60s"
        ))
        .header("authorization", format!("Bearer {VIEW_TOKEN}"))
        .body(())
        .unwrap();
        send = send.ready().await.unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200, "blocking query over HTTP/2");
        index = resp.headers()["x-xce-index"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let mut body = resp.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            body.flow_control().release_capacity(chunk.len()).unwrap();
        }
        assert_eq!(index, BASE + k as u64, "blocking query answer");
        let _ = seen.send((k, Instant::now()));
    }
}

/// `n` SSE watchers on one HTTP/2 connection, a stream each, all read by one task (as a
/// client following many services over one connection reads them, and as etcd's client
/// reads the watches of a Watch stream): reports each marker as it shows up in a stream's
/// data, in order.
pub(crate) async fn h2_stream_watchers(
    mut send: RawH2,
    n: usize,
    markers: Arc<Vec<String>>,
    seen: Seen,
) {
    let mut answers = Vec::with_capacity(n);
    for _ in 0..n {
        let req = axum::http::Request::get("http://b/v1/services/svc-0/endpoints/stream")
            .header("authorization", format!("Bearer {VIEW_TOKEN}"))
            .body(())
            .unwrap();
        send = send.ready().await.unwrap();
        answers.push(send.send_request(req, true).unwrap().0);
    }
    let mut bodies = Vec::with_capacity(n);
    for (i, answer) in answers.into_iter().enumerate() {
        let resp = answer.await.unwrap();
        assert_eq!(resp.status(), 200, "an SSE stream over HTTP/2");
        // Each stream yields `(its watcher, a chunk of its data)`.
        let chunks = futures_util::stream::unfold(resp.into_body(), move |mut body| async move {
            let chunk = body.data().await?.unwrap();
            body.flow_control().release_capacity(chunk.len()).unwrap();
            Some(((i, chunk), body))
        });
        bodies.push(Box::pin(chunks));
    }
    // One poll per woken stream, not per stream.
    let mut all = futures_util::stream::select_all(bodies);
    let mut watchers = vec![(Vec::new(), 0); n];
    let mut done = 0;
    while done < n {
        let (i, chunk) = all.next().await.expect("the streams go on");
        let (buf, next) = &mut watchers[i];
        buf.extend_from_slice(&chunk);
        take_markers(buf, &markers, next, &seen);
        if *next == markers.len() {
            done += 1;
        }
    }
}

/// `watches` watches of `key` on one etcd gRPC Watch stream (over `send`'s connection):
/// reports `0` per watch when etcd confirms it, and `k` per watch when it delivers the
/// put of `value(k)` (the value starts with `value-` and the change's number in 5 digits).
pub(crate) async fn grpc_watch_stream(
    send: RawH2,
    key: &'static [u8],
    watches: usize,
    changes: usize,
    seen: Seen,
) {
    let req = axum::http::Request::post("http://b/etcdserverpb.Watch/Watch")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
    let (resp, mut requests) = send
        .ready()
        .await
        .unwrap()
        .send_request(req, false)
        .unwrap();
    // WatchRequest { create_request (1): WatchCreateRequest { key (1) } }, gRPC-framed.
    let create = Bytes::from(grpc_frame(&pb_field(1, &pb_field(1, key))));
    for _ in 0..watches {
        // The request side stays open (`requests` lives to the end): a client that
        // half-closes ends its watches.
        requests.send_data(create.clone(), false).unwrap();
    }
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200, "etcd gRPC watch");
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut reported = 0;
    while reported < watches * (changes + 1) {
        let chunk = body
            .data()
            .await
            .expect("the watch stream goes on")
            .unwrap();
        body.flow_control().release_capacity(chunk.len()).unwrap();
        buf.extend_from_slice(&chunk);
        while let Some(msg) = grpc_message(&mut buf) {
            let now = Instant::now();
            let (created, values) = watch_response(&msg);
            if created {
                let _ = seen.send((0, now));
                reported += 1;
            }
            for v in values {
                let k = std::str::from_utf8(&v)
                    .ok()
                    .and_then(|v| v.strip_prefix("value-")?.get(..5))
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("an unexpected value {v:?}"));
                let _ = seen.send((k, now));
                reported += 1;
            }
        }
    }
}

// === the protobuf and gRPC framing a watch needs ===

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited protobuf field.
fn pb_field(field: u64, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    varint(field << 3 | 2, &mut out);
    varint(data.len() as u64, &mut out);
    out.extend_from_slice(data);
    out
}

fn grpc_frame(msg: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&u32::try_from(msg.len()).unwrap().to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// Takes one complete gRPC message off the front of `buf`.
fn grpc_message(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let len = u32::from_be_bytes(buf.get(1..5)?.try_into().unwrap()) as usize;
    assert_eq!(buf[0], 0, "a compressed gRPC message");
    if buf.len() < 5 + len {
        return None;
    }
    let msg = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Some(msg)
}

/// The fields of a protobuf message: `(field, varint value, bytes)`, one of the two set
/// by the wire type (fixed-width fields come as bytes).
fn pb_fields(mut msg: &[u8]) -> Vec<(u64, u64, &[u8])> {
    fn read_varint(msg: &mut &[u8]) -> u64 {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let b = msg[0];
            *msg = &msg[1..];
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !msg.is_empty() {
        let tag = read_varint(&mut msg);
        let len = match tag & 7 {
            0 => {
                out.push((tag >> 3, read_varint(&mut msg), &[][..]));
                continue;
            }
            1 => 8,
            2 => read_varint(&mut msg) as usize,
            5 => 4,
            w => panic!("protobuf wire type {w}"),
        };
        out.push((tag >> 3, 0, &msg[..len]));
        msg = &msg[len..];
    }
    out
}

/// Of a `WatchResponse`: whether it confirms a new watch (`created`, 3), and the values of
/// its events (`events`, 11: `Event.kv` 2, `KeyValue.value` 5). A cancelled watch (4) is
/// a failed run.
fn watch_response(msg: &[u8]) -> (bool, Vec<Vec<u8>>) {
    let mut created = false;
    let mut values = Vec::new();
    for (field, v, bytes) in pb_fields(msg) {
        match field {
            3 => created = v != 0,
            4 if v != 0 => panic!("etcd cancelled a watch: {msg:?}"),
            11 => {
                for (f, _, kv) in pb_fields(bytes) {
                    if f == 2 {
                        values.extend(
                            pb_fields(kv)
                                .into_iter()
                                .filter(|(f, _, _)| *f == 5)
                                .map(|(_, _, value)| value.to_vec()),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    (created, values)
}
