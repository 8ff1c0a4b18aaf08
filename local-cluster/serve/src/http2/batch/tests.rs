use super::*;
use proptest::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

/// A stream that hands out `reads` one per read and records every write call; while
/// `blocked`, writes are refused (the socket's send buffer is full).
#[derive(Default)]
struct Mock {
    reads: VecDeque<Vec<u8>>,
    writes: Vec<Vec<u8>>,
    blocked: bool,
}

impl AsyncRead for Mock {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(r) = self.reads.pop_front() {
            buf.put_slice(&r);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Mock {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.blocked {
            return Poll::Pending;
        }
        self.writes.push(data.to_vec());
        Poll::Ready(Ok(data.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Counts its wake-ups.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Harness {
    io: BatchedWrites<Mock>,
    count: Arc<Count>,
    waker: Waker,
}

impl Harness {
    /// A stream whose peer sends `reads`, all of them read already.
    fn new(reads: &[&[u8]]) -> Self {
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut h = Self {
            io: BatchedWrites::new(Mock {
                reads: reads.iter().map(|r| r.to_vec()).collect(),
                ..Mock::default()
            }),
            count,
            waker,
        };
        for _ in reads {
            let mut space = [0u8; 64];
            let mut buf = ReadBuf::new(&mut space);
            let r = Pin::new(&mut h.io).poll_read(&mut Context::from_waker(&h.waker), &mut buf);
            assert!(matches!(r, Poll::Ready(Ok(()))));
        }
        h
    }

    fn write(&mut self, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(&mut Context::from_waker(&self.waker), data)
    }

    fn flush(&mut self) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(&mut Context::from_waker(&self.waker))
    }

    fn wakes(&self) -> usize {
        self.count.0.load(Ordering::SeqCst)
    }

    fn writes(&self) -> &[Vec<u8>] {
        &self.io.inner.writes
    }
}

#[test]
fn http1_passes_through() {
    let mut h = Harness::new(&[b"GET / HTTP/1.1\r\n\r\n"]);
    assert!(!h.io.is_http2());
    assert!(matches!(h.write(b"HTTP/1.1 200 OK"), Poll::Ready(Ok(15))));
    // Written at once, not held for a flush; the flush neither yields nor writes.
    assert_eq!(h.writes(), [b"HTTP/1.1 200 OK".to_vec()]);
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert_eq!(h.wakes(), 0);
}

#[test]
fn a_request_that_starts_like_the_preface_is_http1() {
    // "PRI" and then not the preface: HTTP/1.1 (hyper answers it an error).
    let mut h = Harness::new(&[b"PRI * HTTP/1.1\r\n"]);
    assert!(!h.io.is_http2());
    let _ = h.write(b"x");
    assert_eq!(h.writes().len(), 1);
}

#[test]
fn http2_writes_wait_for_a_flush_that_finds_nothing_new_and_go_out_in_one() {
    // The preface, split across reads.
    let mut h = Harness::new(&[&PREFACE[..5], &PREFACE[5..]]);
    assert!(h.io.is_http2());
    for answer in [&b"one"[..], b"two"] {
        assert!(matches!(h.write(answer), Poll::Ready(Ok(3))));
    }
    assert!(h.writes().is_empty(), "held until flushed");
    // The first flush holds the batch (h2 goes on) and wakes the task to come back.
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert!(h.writes().is_empty());
    assert_eq!(h.wakes(), 1);
    // What is written meanwhile joins the batch.
    let _ = h.write(b"three");
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert!(h.writes().is_empty());
    // A flush with nothing new since the last writes the batch out.
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert_eq!(h.writes(), [b"onetwothree".to_vec()]);
    assert_eq!(h.io.pending(), 0);
    assert_eq!(h.io.buf.capacity(), 0, "the buffer is freed once written");
    // A new batch is held again; an empty one is not, and wakes nobody.
    let _ = h.write(b"four");
    assert!(h.flush().is_ready());
    assert_eq!(h.writes().len(), 1);
    assert!(h.flush().is_ready());
    assert!(h.flush().is_ready());
    assert_eq!(h.writes().len(), 2);
    assert_eq!(h.wakes(), 3);
}

/// h2 flushes before it encodes each DATA frame of 256 bytes or more (such a payload is
/// handed over as a slice of its own). The frames of one pass still leave in one write:
/// with the first version, which wrote at the second flush of a batch, 100 such frames
/// left in 50 writes.
#[test]
fn a_flush_per_frame_still_writes_the_pass_at_once() {
    let mut h = Harness::new(&[PREFACE]);
    let frame = [b'x'; 9 + 400];
    for _ in 0..100 {
        assert!(matches!(h.write(&frame), Poll::Ready(Ok(409))));
        assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    }
    assert!(h.writes().is_empty());
    // The task comes back: h2's flush at the end of its poll finds nothing new.
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert_eq!(h.writes().len(), 1);
    assert_eq!(h.writes()[0].len(), 100 * 409);
}

#[test]
fn a_client_batches_from_the_start() {
    let mut io = BatchedWrites::http2(Mock::default());
    assert!(io.is_http2());
    let waker = Waker::from(Arc::new(Count::default()));
    let cx = &mut Context::from_waker(&waker);
    assert!(Pin::new(&mut io).poll_write(cx, PREFACE).is_ready());
    assert!(io.inner.writes.is_empty());
    assert!(Pin::new(&mut io).poll_flush(cx).is_ready());
    assert!(io.inner.writes.is_empty());
    assert!(Pin::new(&mut io).poll_flush(cx).is_ready());
    assert_eq!(io.inner.writes, [PREFACE.to_vec()]);
}

#[test]
fn a_full_batch_is_written_before_more_is_taken() {
    let mut h = Harness::new(&[PREFACE]);
    let big = vec![7u8; BATCH_BYTES + 10];
    // Only what fits is taken.
    assert!(matches!(h.write(&big), Poll::Ready(Ok(n)) if n == BATCH_BYTES));
    assert!(h.writes().is_empty());
    // The next write writes the full batch out first.
    assert!(matches!(h.write(&big[BATCH_BYTES..]), Poll::Ready(Ok(10))));
    assert_eq!(h.writes().len(), 1);
    assert_eq!(h.writes()[0].len(), BATCH_BYTES);
    assert_eq!(h.io.pending(), 10);
}

#[test]
fn a_blocked_socket_holds_the_batch_back() {
    let mut h = Harness::new(&[PREFACE]);
    let _ = h.write(b"answer");
    assert!(h.flush().is_ready());
    h.io.inner.blocked = true;
    assert!(h.flush().is_pending());
    assert!(h.writes().is_empty());
    // A full batch refuses more while blocked.
    let _ = h.write(&vec![0u8; BATCH_BYTES]);
    assert!(h.write(b"more").is_pending());
    h.io.inner.blocked = false;
    // Held once more (bytes were taken since the last flush), then written.
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert!(h.writes().is_empty());
    assert!(matches!(h.flush(), Poll::Ready(Ok(()))));
    assert_eq!(h.writes().concat().len(), BATCH_BYTES);
}

proptest! {
    /// Whatever the reads' split and the sequence of writes and flushes, every byte goes
    /// out once and in order, the batch never holds more than `BATCH_BYTES`, and after
    /// two flushes nothing is held.
    #[test]
    fn bytes_go_out_in_order(
        cut in 0..PREFACE.len(),
        ops in prop::collection::vec(
            prop_oneof![
                (1usize..3 * BATCH_BYTES / 2).prop_map(Some),
                Just(None),
            ],
            0..20,
        ),
    ) {
        let mut h = Harness::new(&[&PREFACE[..cut], &PREFACE[cut..]]);
        prop_assert!(h.io.is_http2());
        let mut sent = Vec::new();
        for op in ops {
            match op {
                Some(len) => {
                    // Numbered bytes, so a reordering or a repeat shows.
                    let data: Vec<u8> = (sent.len()..sent.len() + len).map(|i| i as u8).collect();
                    let Poll::Ready(Ok(n)) = h.write(&data) else {
                        panic!("the mock never blocks");
                    };
                    prop_assert!(n > 0 && n <= len);
                    sent.extend_from_slice(&data[..n]);
                }
                None => {
                    let _ = h.flush();
                }
            }
            prop_assert!(h.io.pending() <= BATCH_BYTES);
        }
        let _ = h.flush();
        prop_assert!(h.flush().is_ready());
        prop_assert_eq!(h.writes().concat(), sent);
    }
}
