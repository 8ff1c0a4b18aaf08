//! The HTTP/2 settings of every listener that serves [`ApiExtension`](plugin_api::ApiExtension)
//! routers (docs/api.md, HTTP/2: many blocking queries and streams share one connection).
//!
//! One place, so the host's accept loop (`lib.rs`) and the endpoint table's bench
//! serve with the same settings, and the bench's per-watcher figures are the product's.
//! Each value is chosen, not left to hyper's default, for the reason given at it.

mod batch;
mod streams;

pub use batch::{BatchedWrites, BATCH_BYTES};
use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto::Http2Builder;
use std::time::Duration;
pub use streams::{ConnStreams, StreamExecutor, WithStreams};

/// Streams (requests) one connection may have open at once. A watcher (blocking query,
/// SSE stream) holds one for as long as it watches, so this is how many watches one
/// connection can carry: 256, a little above Go's and hyper's defaults (250, 200), enough
/// for a proxy that watches a few hundred services over one connection; a client that
/// needs more opens another connection. The watcher limits (per principal and in total)
/// count requests, not connections, so this never raises them.
pub const MAX_CONCURRENT_STREAMS: u32 = 256;

/// A connection with no frame from the peer for this long is pinged...
pub const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// ...and closed when the ping is not answered within this. A connection carrying a watch
/// is never closed for being idle (its request is in flight), so without pings a peer
/// that vanished (a killed VM, a dropped NAT entry) would hold its watchers' slots for as
/// long as TCP lets it; with them, within about 50 s.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// The largest frame we accept: the protocol's minimum, 16 KiB. Our requests are small,
/// and a larger frame only lets one stream's data hold up the others on the connection.
pub const MAX_FRAME_SIZE: u32 = 16 * 1024;

/// The largest header list (decoded, with the path) a request may have: 64 KiB. hyper's
/// default of 16 KiB would reset a `?service=` list of a few hundred names before our
/// handler could answer it with a clear 400 naming the parameter. HTTP/1.1 has the same
/// limit ([`crate::http1::MAX_BUF_SIZE`]).
pub const MAX_HEADER_LIST_SIZE: u32 = 64 * 1024;

/// Request-body bytes a client may send on one stream before we read them, and on the
/// whole connection: the connection window bounds what an unread body can make us buffer
/// per connection to 1 MiB, whatever the number of streams (request bodies are small:
/// profiles and bench controls; the apiserver's body limit applies on top).
pub const STREAM_WINDOW: u32 = 256 * 1024;
/// See [`STREAM_WINDOW`].
pub const CONNECTION_WINDOW: u32 = 1024 * 1024;

/// Answer bytes queued per stream while the peer's flow-control window is closed: 64 KiB
/// (hyper: 400 KiB). A watcher that does not read then backs up into our own bounded
/// stream buffer, where the slow-reader cut-off sees it, instead of into hyper's; with
/// [`MAX_CONCURRENT_STREAMS`] streams that is at most 16 MiB per connection, not 100.
pub const MAX_SEND_BUF_SIZE: usize = 64 * 1024;

/// Applies the settings above to an auto (HTTP/1.1 + HTTP/2) connection builder's HTTP/2
/// side. Data frames are written as soon as a body yields them (hyper does not wait for a
/// frame to fill), so SSE events and blocking-query answers go out at once; build the
/// connection with a [`ConnStreams`] executor and serve its stream through
/// [`BatchedWrites`], so that the streams one change wakes run in one pass of the
/// connection's task and their frames share one write.
pub fn configure<E>(h2: &mut Http2Builder<'_, E>) {
    // The timer drives the keep-alive pings.
    h2.timer(TokioTimer::new())
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
        .max_frame_size(MAX_FRAME_SIZE)
        .max_header_list_size(MAX_HEADER_LIST_SIZE)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buf_size(MAX_SEND_BUF_SIZE);
}
