//! Answers encoded once per zone: the listeners' queries mostly repeat (a resolver asks
//! for the same few names again and again), and decoding, resolving and encoding with
//! hickory-proto costs more than receiving and sending. A [`Zone`] owns its cache, so a
//! change of the table (a new zone) starts an empty one: no answer outlives its zone.
//!
//! A query is read with hickory-proto's lower-level decoders (header, question, the OPT
//! record), not a whole message; what takes this path is only a plain query (one question,
//! no answer or authority records, at most an OPT record of version 0), everything else is
//! answered by [`answer`] as before. The key is what decides the answer's bytes: the
//! listener (its principal) and its grants as they are now, whether the query has EDNS,
//! the size limit (transport and EDNS payload size), the question's bytes with its name
//! in lower case (names compare without case, RFC 4343: a resolver randomising the case
//! of its questions, DNS 0x20, finds the answer another case put there), and which answer
//! the query's id puts first. A hit is the cached answer with the query's id, its RD and
//! CD flags and its question's bytes as sent, the rest byte for byte what [`answer`]
//! gives: [`answer`] answers a question as if asked in lower case and echoes the
//! question as sent, so the names that point into the question follow its case and
//! nothing else depends on it.

use crate::answer::{answer, size_limit, Answered, Apex, Transport};
use crate::encoded::{Cached, Entry, Table, MAX_ENTRIES};
use crate::zone::Zone;
use hickory_proto::op::{Edns, Header, MessageType, OpCode, Query};
use hickory_proto::rr::{RData, Record, RecordType};
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder, BinEncodable, BinEncoder};
use plugin_api::{LiveGrants, Principal};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Most answers a cached entry spreads over (one encoded answer each); bigger answer sets
/// are rare and are not cached.
const MAX_SPREAD: usize = 64;

/// A listener's principal, as a cache sees it: one id per listener, and its grants as
/// the host holds them (a reload of the tokens changes them without a change of the zone).
#[derive(Debug)]
pub(crate) struct Viewer {
    id: u64,
    pub(crate) principal: Principal,
}

impl Viewer {
    pub(crate) fn new(principal: Principal) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            principal,
        }
    }
}

/// Whether an answer came from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Copied from the cache.
    Hit,
    /// Computed (and kept, if there was room).
    Miss,
    /// Not a plain query: computed by [`answer`], not kept.
    Bypass,
}

/// A plain query as the cache reads it.
struct Plain {
    header: Header,
    /// Where the question ends (it starts after the 12-byte header).
    question_end: usize,
    qtype: RecordType,
    table: Table,
}

/// Answers `bytes` like [`answer`] (the same bytes), from `zone`'s cache when it holds
/// the answer.
pub(crate) fn answer_cached(
    apex: &Apex,
    zone: &Zone,
    viewer: &Viewer,
    bytes: &[u8],
    transport: Transport,
) -> (Option<Answered>, Outcome) {
    let Some(plain) = read_plain(bytes, viewer, transport) else {
        let answered = answer(apex, zone, &viewer.principal, bytes, transport);
        return (answered, Outcome::Bypass);
    };
    // The grants are read before the answer is computed: an answer kept under them was
    // computed under them or later ones (never older), and a reload is a new `Arc`.
    let grants = viewer.principal.credential.current();
    let question = &bytes[12..plain.question_end];
    let mut key = [0u8; MAX_QUESTION];
    let key = lower_question(question, &mut key);
    if let Some(hit) = lookup(zone, &plain, key, question, grants.as_ref()) {
        return (Some(hit), Outcome::Hit);
    }
    let answered = answer(apex, zone, &viewer.principal, bytes, transport);
    if let Some(a) = &answered {
        keep(zone, &plain, key, question, grants, a);
    }
    (answered, Outcome::Miss)
}

/// Reads a plain query: header, one question, no answer or authority records, at most
/// one additional record which is an OPT of version 0. Anything else: `None`.
fn read_plain(bytes: &[u8], viewer: &Viewer, transport: Transport) -> Option<Plain> {
    let mut decoder = BinDecoder::new(bytes);
    let header = Header::read(&mut decoder).ok()?;
    let counts = header.counts;
    if header.metadata.message_type != MessageType::Query
        || header.metadata.op_code != OpCode::Query
        || counts.queries != 1
        || counts.answers != 0
        || counts.authorities != 0
        || counts.additionals > 1
    {
        return None;
    }
    let query = Query::read(&mut decoder).ok()?;
    let question_end = decoder.index();
    let edns = match counts.additionals {
        0 => None,
        _ => {
            let record = Record::read(&mut decoder).ok()?;
            // The OPT records `Message` takes for EDNS (and `Edns::from` accepts); any
            // other additional record goes the uncached way.
            match record.data {
                RData::Update0(RecordType::OPT) | RData::OPT(_) => Some(Edns::from(&record)),
                _ => return None,
            }
        }
    };
    if edns.as_ref().is_some_and(|e| e.version() > 0) {
        return None;
    }
    let table = Table {
        viewer: viewer.id,
        edns: edns.is_some(),
        limit: size_limit(edns.as_ref(), transport),
    };
    Some(Plain {
        header,
        question_end,
        qtype: query.query_type(),
        table,
    })
}

/// The longest question: a name of at most 255 bytes, its type and class.
const MAX_QUESTION: usize = 255 + 4;

/// `question`'s bytes with the ASCII letters of its name's labels in lower case, in
/// `buf`: the cache's key. Lengths, type and class are left alone (a type of 65 is the
/// byte `A`). A name that is not plain labels (a compression pointer: its answer is never
/// kept, see [`keep`]) is its bytes as they are.
fn lower_question<'a>(question: &'a [u8], buf: &'a mut [u8; MAX_QUESTION]) -> &'a [u8] {
    let Some(key) = buf.get_mut(..question.len()) else {
        return question;
    };
    key.copy_from_slice(question);
    let mut at = 0;
    while let Some(&len) = key.get(at) {
        let len = usize::from(len);
        if len == 0 {
            return key;
        }
        match key.get_mut(at + 1..at + 1 + len) {
            Some(label) if len <= 63 => label.make_ascii_lowercase(),
            _ => return question,
        }
        at += 1 + len;
    }
    question
}

fn same_grants(a: Option<&LiveGrants>, b: Option<&LiveGrants>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(None), Some(None)) => true,
        (Some(Some(a)), Some(Some(b))) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

/// The cached answer to `key` (the lower-case question), with the query's header fields
/// and its `question` as sent.
fn lookup(
    zone: &Zone,
    plain: &Plain,
    key: &[u8],
    question: &[u8],
    grants: Option<&LiveGrants>,
) -> Option<Answered> {
    let cached = {
        let tables = zone.answers.lock();
        let entry = tables.get(&plain.table)?.get(key)?;
        if !same_grants(entry.grants.as_ref(), grants) {
            return None;
        }
        let slot = usize::from(plain.header.metadata.id) % entry.by_rotation.len();
        entry.by_rotation[slot].clone()?
    };
    let mut header = cached.header;
    header.metadata.id = plain.header.metadata.id;
    header.metadata.recursion_desired = plain.header.metadata.recursion_desired;
    header.metadata.checking_disabled = plain.header.metadata.checking_disabled;
    let mut bytes = Vec::with_capacity(12 + question.len() + cached.body.len());
    header.emit(&mut BinEncoder::new(&mut bytes)).ok()?;
    bytes.extend_from_slice(question);
    bytes.extend_from_slice(&cached.body);
    Some(Answered {
        bytes,
        qtype: Some(plain.qtype),
        rcode: cached.rcode,
        truncated: cached.truncated,
        // Only `keep` reads it, on a miss.
        spread: 1,
    })
}

/// Keeps `answered` under `key` (its question in lower case) if it is the answer to
/// exactly the query's `question` (its question section is the query's bytes: a query
/// naming its question through a compression pointer reads differently once re-encoded,
/// and is not kept) and there is room. What follows the question is kept: a hit puts its
/// own question before it.
fn keep(
    zone: &Zone,
    plain: &Plain,
    key: &[u8],
    question: &[u8],
    grants: Option<LiveGrants>,
    answered: &Answered,
) {
    let spread = answered.spread.max(1);
    if spread > MAX_SPREAD || answered.bytes.get(12..plain.question_end) != Some(question) {
        return;
    }
    let Some((head, _)) = answered.bytes.split_first_chunk::<12>() else {
        return;
    };
    let body = &answered.bytes[plain.question_end..];
    let Ok(header) = Header::read(&mut BinDecoder::new(head)) else {
        return;
    };
    let cached = Cached {
        header,
        body: body.into(),
        rcode: answered.rcode,
        truncated: answered.truncated,
    };
    let mut tables = zone.answers.lock();
    let held: usize = tables.values().map(HashMap::len).sum();
    let table = tables.entry(plain.table).or_default();
    let fresh = |grants| Entry {
        grants,
        by_rotation: vec![None; spread],
    };
    let entry = match table.get_mut(key) {
        Some(e) if same_grants(e.grants.as_ref(), grants.as_ref()) => e,
        Some(e) => {
            *e = fresh(grants);
            e
        }
        None if held >= MAX_ENTRIES => return,
        None => table.entry(key.into()).or_insert_with(|| fresh(grants)),
    };
    if entry.by_rotation.len() == spread {
        let slot = usize::from(plain.header.metadata.id) % spread;
        entry.by_rotation[slot] = Some(cached);
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
