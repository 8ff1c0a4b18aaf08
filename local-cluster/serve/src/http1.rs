//! The HTTP/1.1 side of the host's connections, apart from the per-connection clocks:
//! [`configure`] is what a bench serving the same routes applies to serve as the product
//! does.

use hyper_util::rt::TokioTimer;
use hyper_util::server::conn::auto::Http1Builder;

/// hyper's read and write buffer limit per connection: 64 KiB, as HTTP/2's header list
/// ([`crate::http2::MAX_HEADER_LIST_SIZE`]). It bounds the request headers (hyper's default
/// of ~400 KiB let 2,000 connections of unfinished headers take half a GiB; longer headers
/// are answered 431), and the answer bytes hyper queues before it writes: an answer the
/// peer does not read backs up into the socket, where the write clock sees it, and an
/// all-services stream's snapshot goes out in 64 KiB writes instead of collecting ~400 KiB
/// of events first.
pub const MAX_BUF_SIZE: usize = crate::http2::MAX_HEADER_LIST_SIZE as usize;

/// Applies the settings above to an auto (HTTP/1.1 + HTTP/2) connection builder's
/// HTTP/1.1 side.
pub fn configure<E>(h1: &mut Http1Builder<'_, E>) {
    h1.timer(TokioTimer::new()).max_buf_size(MAX_BUF_SIZE);
}
