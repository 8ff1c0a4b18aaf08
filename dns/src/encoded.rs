//! The store of a zone's encoded answers (`crate::cache` fills and reads it): a part of
//! the [`crate::Zone`], so a new zone starts with an empty one.

use hickory_proto::op::Header;
use plugin_api::LiveGrants;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Questions kept per zone (all listeners and limits together); past it, answers to new
/// questions are computed and not kept until the next change of the zone. A bench's or a
/// cluster's working set is a few answers per service.
pub(crate) const MAX_ENTRIES: usize = 4096;

/// What selects a table of answers: everything but the question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Table {
    pub(crate) viewer: u64,
    pub(crate) edns: bool,
    pub(crate) limit: usize,
}

/// One question's answers: one per rotation the query's id may choose, filled as
/// queries ask.
#[derive(Debug)]
pub(crate) struct Entry {
    /// The grants the answers were computed under (`None`: a principal the host does not
    /// follow). Holding the `Arc` keeps its address from being reused.
    pub(crate) grants: Option<LiveGrants>,
    pub(crate) by_rotation: Vec<Option<Cached>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Cached {
    /// The header as the answer had it (its id and RD/CD are replaced per query).
    pub(crate) header: Header,
    /// Everything after the question (a hit puts the query's header and question first).
    pub(crate) body: Arc<[u8]>,
    pub(crate) rcode: hickory_proto::op::ResponseCode,
    pub(crate) truncated: bool,
}

/// Each table's entries by the question's bytes, its name in lower case.
pub(crate) type Tables = HashMap<Table, HashMap<Box<[u8]>, Entry>>;

/// The encoded answers of one zone.
#[derive(Default)]
pub(crate) struct AnswerCache {
    tables: Mutex<Tables>,
}

impl AnswerCache {
    /// How many questions it holds.
    pub(crate) fn len(&self) -> usize {
        self.lock().values().map(HashMap::len).sum()
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        // A panic while holding the lock leaves at worst a missing answer: keep going.
        self.tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A new zone's cache is empty, whatever the old one held.
impl Clone for AnswerCache {
    fn clone(&self) -> Self {
        Self::default()
    }
}

/// Zones compare by their names; what they have cached is no part of them.
impl PartialEq for AnswerCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for AnswerCache {}

impl std::fmt::Debug for AnswerCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnswerCache")
            .field("questions", &self.len())
            .finish()
    }
}
