//! [`BatchedWrites`]: one system call for the answers of many streams that became ready
//! together.
//!
//! Why: when one change wakes the blocking queries parked on a connection, each stream's
//! handler task queues its answer and wakes the connection task, which the runtime then
//! runs at once (tokio runs a task woken by the running one next). So hyper's HTTP/2
//! connection wrote each answer with a `writev` of its own: one system call, one loopback
//! or network send, and one wake-up of the reader per answer, where one connection
//! carrying 100 watchers could have written them in a few. Measured in the endpoint
//! table's fan-out bench (10,000 blocking queries over 100 connections): 1.00 writes per
//! answer before, see `endpoint-table/README.md` for after.
//!
//! How: on an HTTP/2 connection, writes go into a buffer, and a flush holds them as long as
//! each flush comes after more was written: it wakes the connection task to come back, and
//! tells h2 that all is flushed, so h2 goes on encoding the frames it has queued. The first
//! flush that finds nothing written since the one before writes the batch out: by then the
//! connection task has polled every stream that was ready, and h2 has encoded all their
//! frames. The cost when nothing else is ready is one more poll of the connection task. A
//! batch is written out anyway when it reaches [`BATCH_BYTES`]. HTTP/1.1 connections (one
//! answer in flight, and hyper writes it whole) pass through untouched.
//!
//! Why not hold until the second flush of a batch, as this did first: h2 flushes before
//! encoding each DATA frame of 256 bytes or more (it hands such a payload to the writer
//! as a slice of its own, and takes no further frame until that slice is written), so a
//! batch of such frames was written one or two frames at a time: 0.66 `sendto` per
//! delivered event in the fan-out bench's 100 SSE streams per connection, where every
//! event is about 400 bytes. (Counting writes through `/proc/<pid>/io`'s `syscw` had hidden
//! it: that counts `write`, not `sendto`.)

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The first bytes of every HTTP/2 connection (RFC 9113 §3.4); a connection whose first
/// bytes are not these is HTTP/1.1, and passes through.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The most bytes held for one batch: past this, the batch is written out before more is
/// taken. Bounds the buffer per connection (it is freed once written, so an idle
/// connection holds none of it).
pub const BATCH_BYTES: usize = 64 * 1024;

/// What the connection speaks, as far as its first bytes tell.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// This many bytes of [`PREFACE`] matched so far.
    Sniffing(usize),
    Http2,
    Http1,
}

/// A connection's byte stream (plain TCP or TLS) that batches HTTP/2 writes, see the
/// module docs. Serve connections through it: `TokioIo::new(BatchedWrites::new(stream))`.
#[derive(Debug)]
pub struct BatchedWrites<T> {
    inner: T,
    mode: Mode,
    /// Bytes taken and not written yet (HTTP/2 only); `buf[written..]` is what is left.
    buf: Vec<u8>,
    written: usize,
    /// Bytes were taken since the last flush: a flush now holds the batch (module docs).
    grew: bool,
}

impl<T> BatchedWrites<T> {
    /// Wraps a connection's stream, before anything was read from it.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            mode: Mode::Sniffing(0),
            buf: Vec::new(),
            written: 0,
            grew: false,
        }
    }

    /// Wraps the stream of a client that speaks HTTP/2 with prior knowledge (it writes the
    /// preface, so there is none to read): its requests are batched from the start.
    pub fn http2(inner: T) -> Self {
        Self {
            mode: Mode::Http2,
            ..Self::new(inner)
        }
    }

    /// Whether the connection turned out to be HTTP/2 (its preface was read).
    pub fn is_http2(&self) -> bool {
        self.mode == Mode::Http2
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// Bytes taken and not yet written.
    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }

    /// Notes bytes the peer sent first: they tell HTTP/2 from HTTP/1.1.
    fn sniff(&mut self, read: &[u8]) {
        let Mode::Sniffing(matched) = self.mode else {
            return;
        };
        let rest = &PREFACE[matched..];
        let n = read.len().min(rest.len());
        self.mode = if read[..n] != rest[..n] {
            Mode::Http1
        } else if matched + n == PREFACE.len() {
            Mode::Http2
        } else {
            Mode::Sniffing(matched + n)
        };
    }
}

impl<T: AsyncWrite + Unpin> BatchedWrites<T> {
    /// Writes out everything taken; the buffer is freed once it is.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = match Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]) {
                Poll::Ready(Ok(n)) => n,
                other => return other.map_ok(|_| ()),
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf = Vec::new();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Room for more in the current batch, writing the batch out first when it is full.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.pending() >= BATCH_BYTES {
            if let Err(e) = std::task::ready!(self.poll_write_out(cx)) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(BATCH_BYTES - self.pending()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for BatchedWrites<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut me.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            me.sniff(&buf.filled()[before..]);
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for BatchedWrites<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.mode != Mode::Http2 {
            return Pin::new(&mut me.inner).poll_write(cx, data);
        }
        let room = std::task::ready!(me.poll_room(cx))?;
        let n = data.len().min(room);
        me.buf.extend_from_slice(&data[..n]);
        me.grew = true;
        Poll::Ready(Ok(n))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        if me.mode != Mode::Http2 {
            return Pin::new(&mut me.inner).poll_write_vectored(cx, bufs);
        }
        let mut room = std::task::ready!(me.poll_room(cx))?;
        let mut taken = 0;
        for b in bufs {
            let n = b.len().min(room);
            me.buf.extend_from_slice(&b[..n]);
            taken += n;
            room -= n;
            if room == 0 {
                break;
            }
        }
        me.grew |= taken > 0;
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        // Copying slices into the batch is as cheap as one; before the preface is read,
        // the inner stream's answer (HTTP/1.1 writes go straight to it).
        self.mode == Mode::Http2 || self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.pending() > 0 {
            if std::mem::take(&mut me.grew) {
                // Held: h2 encodes what else is queued, and the streams that are ready
                // add to this batch before the task comes back to write it (module docs).
                cx.waker().wake_by_ref();
                return Poll::Ready(Ok(()));
            }
            std::task::ready!(me.poll_write_out(cx))?;
        }
        Pin::new(&mut me.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        std::task::ready!(me.poll_write_out(cx))?;
        Pin::new(&mut me.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
