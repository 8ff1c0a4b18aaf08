//! Batched UDP on Linux: `recvmmsg(2)` takes every queued datagram up to [`BATCH`] in one
//! system call and `sendmmsg(2)` sends the replies in one, where a reader otherwise pays a
//! `recvfrom` and a `sendto` (and a trip through tokio's readiness) per query. The calls go
//! through nix (receive) and rustix (send), the safe wrappers already in the dependency
//! tree: the crate forbids `unsafe`. Both are non-blocking and driven by tokio's readiness
//! (`readable`/`writable` then `try_io`): an idle reader sleeps in epoll like any task.

use nix::sys::socket::{recvmmsg, MsgFlags, MultiHeaders, SockaddrStorage};
use rustix::net::addr::SocketAddrArg;
use rustix::net::{MMsgHdr, SendAncillaryBuffer, SendFlags, SocketAddrAny};
use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// Datagrams received (and replies sent) per system call at most. Past a few dozen the
/// call saves little more, and the first query of a batch waits for the others' answers.
pub(crate) const BATCH: usize = 32;

/// Each datagram's buffer: bigger than any query we answer (a query is one question, well
/// under 1 KiB). A longer datagram is cut to it (`MSG_TRUNC`) and answered FORMERR.
const DATAGRAM: usize = 4096;

/// One received datagram: where it is in the batch's buffers and who sent it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Datagram {
    slot: usize,
    len: usize,
    /// It was longer than its buffer: only its first [`DATAGRAM`] bytes are there.
    pub(crate) truncated: bool,
    pub(crate) peer: SocketAddr,
}

/// A reader's receive buffers, allocated once, and what the last receive put in them.
#[derive(Debug)]
pub(crate) struct RecvBatch {
    bufs: Box<[u8]>,
    got: Vec<Datagram>,
}

impl RecvBatch {
    pub(crate) fn new() -> Self {
        Self {
            bufs: vec![0; BATCH * DATAGRAM].into_boxed_slice(),
            got: Vec::with_capacity(BATCH),
        }
    }

    /// Waits until `socket` has datagrams, then receives as many as are queued, up to
    /// [`BATCH`] (at least one).
    pub(crate) async fn recv(&mut self, socket: &UdpSocket) -> io::Result<()> {
        loop {
            socket.readable().await?;
            // `try_io` clears the readiness when the call would block, so the next
            // `readable` sleeps until the kernel has another datagram.
            match socket.try_io(Interest::READABLE, || self.recv_now(socket)) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                other => return other,
            }
        }
    }

    fn recv_now(&mut self, socket: &UdpSocket) -> io::Result<()> {
        self.got.clear();
        // The headers hold raw pointers (not `Send`): made per call, never kept across
        // an await. Two small allocations per batch, not per query.
        let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
        let mut chunks = self.bufs.chunks_exact_mut(DATAGRAM);
        let mut slices: [[IoSliceMut<'_>; 1]; BATCH] = std::array::from_fn(|_| {
            [IoSliceMut::new(
                chunks.next().expect("the buffer holds BATCH datagrams"),
            )]
        });
        let received = recvmmsg(
            socket.as_raw_fd(),
            &mut headers,
            slices.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        )
        .map_err(io::Error::from)?;
        for (slot, msg) in received.enumerate() {
            // A source that is no IP address cannot come to a UDP/IP socket.
            let Some(peer) = msg.address.as_ref().and_then(socket_addr) else {
                tracing::debug!(slot, "dns: udp datagram without an IP source");
                continue;
            };
            self.got.push(Datagram {
                slot,
                len: msg.bytes.min(DATAGRAM),
                truncated: msg.flags.contains(MsgFlags::MSG_TRUNC),
                peer,
            });
        }
        Ok(())
    }

    /// How many datagrams the last receive got.
    pub(crate) fn len(&self) -> usize {
        self.got.len()
    }

    /// The datagrams of the last receive: their bytes and where they came from.
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = (&[u8], &Datagram)> {
        self.got.iter().map(|d| {
            let start = d.slot * DATAGRAM;
            (&self.bufs[start..start + d.len], d)
        })
    }
}

fn socket_addr(addr: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = addr.as_sockaddr_in() {
        return Some(SocketAddr::from(*v4));
    }
    addr.as_sockaddr_in6().map(|v6| SocketAddr::from(*v6))
}

/// Sends every reply, [`BATCH`] per `sendmmsg` at most. A full send buffer (`EAGAIN`)
/// waits until the socket is writable and sends the rest; a reply the kernel refuses
/// (an error for that one message) is logged and skipped, as a failed `send_to` was.
pub(crate) async fn send_all(socket: &UdpSocket, replies: &[(Vec<u8>, SocketAddr)]) {
    let mut next = 0;
    while next < replies.len() {
        match socket.try_io(Interest::WRITABLE, || send_now(socket, &replies[next..])) {
            Ok(sent) => next += sent,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if let Err(error) = socket.writable().await {
                    tracing::debug!(%error, unsent = replies.len() - next, "dns: udp send");
                    return;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                // `sendmmsg` reports an error only for the first message it was given
                // (it returns the count sent before a later one failed): skip that one.
                tracing::debug!(%error, peer = %replies[next].1, "dns: udp send");
                next += 1;
            }
        }
    }
}

/// One `sendmmsg` of the first [`BATCH`] of `replies`: how many were sent (at least one).
fn send_now(socket: &UdpSocket, replies: &[(Vec<u8>, SocketAddr)]) -> io::Result<usize> {
    let replies = &replies[..replies.len().min(BATCH)];
    let addrs: Vec<SocketAddrAny> = replies.iter().map(|(_, peer)| peer.as_any()).collect();
    let iovs: Vec<[IoSlice<'_>; 1]> = replies
        .iter()
        .map(|(bytes, _)| [IoSlice::new(bytes)])
        .collect();
    let mut controls: Vec<SendAncillaryBuffer<'_, '_, '_>> = replies
        .iter()
        .map(|_| SendAncillaryBuffer::default())
        .collect();
    let mut msgs: Vec<MMsgHdr<'_>> = addrs
        .iter()
        .zip(&iovs)
        .zip(controls.iter_mut())
        .map(|((addr, iov), control)| MMsgHdr::new_with_addr(addr, iov, control))
        .collect();
    let sent = rustix::net::sendmmsg(socket, &mut msgs, SendFlags::DONTWAIT)?;
    if sent == 0 {
        // The kernel sends at least one message or fails; never loop on nothing.
        return Err(io::Error::other("sendmmsg sent nothing"));
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::{send_all, RecvBatch, BATCH, DATAGRAM};
    use std::net::SocketAddr;
    use testkit::patience;
    use tokio::net::UdpSocket;

    async fn bound() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").await.unwrap()
    }

    /// Datagram `i`: its number and `i % 50` more bytes, so each is told apart.
    fn datagram(i: usize) -> Vec<u8> {
        let mut d = (i as u16).to_be_bytes().to_vec();
        d.extend(std::iter::repeat_n(i as u8, i % 50));
        d
    }

    async fn recv(batch: &mut RecvBatch, server: &UdpSocket) {
        tokio::time::timeout(patience(), batch.recv(server))
            .await
            .expect("queued datagrams are received")
            .unwrap();
    }

    #[tokio::test]
    async fn a_receive_takes_every_queued_datagram_up_to_a_batch_and_flags_oversized_ones() {
        let server = bound().await;
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = server.local_addr().unwrap();
        // Loopback queues each datagram at the server before `send_to` returns.
        for i in 0..BATCH + 8 {
            client.send_to(&datagram(i), to).unwrap();
        }
        client.send_to(&vec![7u8; DATAGRAM + 1000], to).unwrap();
        let mut batch = RecvBatch::new();
        recv(&mut batch, &server).await;
        assert_eq!(batch.len(), BATCH, "one call takes a whole batch");
        let mut seen = Vec::new();
        for (bytes, d) in batch.datagrams() {
            assert_eq!(d.peer, client.local_addr().unwrap());
            assert!(!d.truncated);
            seen.push(bytes.to_vec());
        }
        let mut rest = Vec::new();
        while seen.len() + rest.len() < BATCH + 9 {
            recv(&mut batch, &server).await;
            rest.extend(batch.datagrams().map(|(b, d)| (b.to_vec(), d.truncated)));
        }
        let (last, truncated) = rest.pop().unwrap();
        assert!(truncated, "a datagram longer than the buffer is flagged");
        assert_eq!(last, vec![7u8; DATAGRAM], "and cut to the buffer");
        seen.extend(rest.into_iter().map(|(b, t)| {
            assert!(!t);
            b
        }));
        let want: Vec<Vec<u8>> = (0..BATCH + 8).map(datagram).collect();
        assert_eq!(seen, want, "every datagram, whole and in order");
    }

    #[tokio::test]
    async fn every_reply_is_sent_past_a_batch_and_past_one_that_fails() {
        let server = bound().await;
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        client.set_read_timeout(Some(patience())).unwrap();
        let peer = client.local_addr().unwrap();
        // An IPv6 destination on an IPv4 socket: the kernel refuses that one message.
        let unreachable: SocketAddr = "[::1]:53".parse().unwrap();
        let replies: Vec<(Vec<u8>, SocketAddr)> = (0..3 * BATCH + 5)
            .map(|i| (datagram(i), if i == BATCH + 3 { unreachable } else { peer }))
            .collect();
        tokio::time::timeout(patience(), send_all(&server, &replies))
            .await
            .expect("the replies are sent");
        let mut buf = [0u8; 512];
        for (i, (want, to)) in replies.iter().enumerate() {
            if *to == unreachable {
                continue;
            }
            let (n, from) = client.recv_from(&mut buf).expect("every reply arrives");
            assert_eq!(from, server.local_addr().unwrap());
            assert_eq!(&buf[..n], &want[..], "reply {i}, in order");
        }
    }
}
