//! What every SSE stream shares with what cuts it off (its slot's or the journal's
//! `Laggards`, checked right after each change): how far behind its client is, its place
//! among the watchers, and the cut-off of a client that falls too far behind. Used by the
//! per-service stream (`crate::stream`, behind its service's watch channel) and the
//! all-services stream (`crate::allstream`, behind the journal), so both cut off slow
//! readers the same way and free their places the same way.

use crate::delivery::Recipient;
use crate::metrics::Kind;
use crate::shared::{Behind, StableWaker, WatcherGuard};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// What a stream shares with the `Laggards` that follow it.
#[derive(Debug)]
pub(crate) struct Lag {
    /// The position of the last change the stream took (its source's position when it
    /// opened, until it took one): the client is behind by the source's position minus
    /// this.
    taken: AtomicU64,
    /// The stream's place among the watchers; taken away when the client is cut off (or
    /// the stream is dropped), so a cut-off client stops counting against the caps, and
    /// stops holding up the delivery histogram, at once, even though its connection lives
    /// until hyper polls the stream again.
    place: Mutex<Option<Place>>,
    /// How far behind the client may fall.
    limit: u64,
    kind: Kind,
    /// What the stream follows, for the log line of a cut-off.
    what: String,
    principal: String,
    /// The stream's task, woken by its `Laggards` after each change when the stream
    /// registered it (a per-service stream does: its slot's changes wake it this way, not
    /// through the slot's watch channel).
    waker: StableWaker,
}

/// What an open stream holds: its count against the caps, and (a per-service stream) its
/// registration as a recipient of its service's changes.
#[derive(Debug)]
pub(crate) struct Place {
    pub(crate) counted: WatcherGuard,
    pub(crate) recipient: Option<Recipient>,
}

// === impl Lag ===

impl Lag {
    /// A stream at position `taken`, holding `place`, cut off past `limit` behind.
    pub(crate) fn new(taken: u64, place: Place, limit: u64, what: String) -> Arc<Self> {
        Arc::new(Self {
            taken: AtomicU64::new(taken),
            kind: place.counted.kind(),
            principal: place.counted.principal().to_owned(),
            place: Mutex::new(Some(place)),
            limit,
            what,
            waker: StableWaker::default(),
        })
    }

    /// Has the `Laggards` that follow the stream wake `waker` after each change (`kept`:
    /// see [`StableWaker::register`]).
    pub(crate) fn wake_on_change(
        &self,
        waker: &std::task::Waker,
        kept: &mut Option<std::task::Waker>,
    ) {
        self.waker.register(waker, kept);
    }

    fn place(&self) -> std::sync::MutexGuard<'_, Option<Place>> {
        self.place.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn is_cut(&self) -> bool {
        self.place().is_none()
    }

    pub(crate) fn release(&self) -> Option<Place> {
        self.place().take()
    }

    /// The position of the last change taken.
    pub(crate) fn taken(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }

    /// The stream took the changes up to `position`.
    pub(crate) fn take(&self, position: u64) {
        self.taken.store(position, Ordering::Release);
    }

    /// Whether a source at `position` is more than the limit ahead of the stream; if so
    /// the client is cut off.
    pub(crate) fn check(&self, position: u64) -> bool {
        let behind = position.saturating_sub(self.taken());
        if behind <= self.limit {
            return false;
        }
        self.cut_off(behind);
        true
    }

    /// The stream took slot seq `seq`: it is sending it now (`sent`), or will not.
    pub(crate) fn settle(&self, seq: u64, sent: bool) {
        if let Some(recipient) = self.place().as_mut().and_then(|p| p.recipient.as_mut()) {
            if sent {
                recipient.handed(seq);
            } else {
                recipient.skipped(seq);
            }
        }
    }

    /// Cuts the client off (once: the stream and its `Laggards` may both see the lag).
    fn cut_off(&self, behind: u64) {
        let Some(place) = self.release() else {
            return;
        };
        place.counted.metrics().lagged(self.kind);
        tracing::info!(
            stream = %self.what,
            principal = %self.principal,
            behind,
            "stream client fell behind, disconnecting it"
        );
    }
}

impl Behind for Lag {
    fn check(&self, position: u64) -> bool {
        let cut = Lag::check(self, position);
        // A stream cut off is woken too: it ends its answer.
        self.waker.wake();
        cut
    }
}
