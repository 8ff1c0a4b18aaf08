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
//! the size limit (transport and EDNS payload size), the question's bytes **as sent**
//! (case included: hickory-proto compresses names byte for byte, so an answer to
//! `WEB.default.xce.` is not an answer to `web.default.xce.` with its question's case
//! changed), and which answer the query's id puts first. A hit is the cached answer with
//! the query's id and its RD and CD flags, the rest byte for byte what [`answer`] gives.

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
    if let Some(hit) = lookup(zone, &plain, question, grants.as_ref()) {
        return (Some(hit), Outcome::Hit);
    }
    let answered = answer(apex, zone, &viewer.principal, bytes, transport);
    if let Some(a) = &answered {
        keep(zone, &plain, question, grants, a);
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

fn same_grants(a: Option<&LiveGrants>, b: Option<&LiveGrants>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(None), Some(None)) => true,
        (Some(Some(a)), Some(Some(b))) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

fn lookup(
    zone: &Zone,
    plain: &Plain,
    question: &[u8],
    grants: Option<&LiveGrants>,
) -> Option<Answered> {
    let cached = {
        let tables = zone.answers.lock();
        let entry = tables.get(&plain.table)?.get(question)?;
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
    let mut bytes = Vec::with_capacity(12 + cached.body.len());
    header.emit(&mut BinEncoder::new(&mut bytes)).ok()?;
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

/// Keeps `answered` for `question` if it is the answer to exactly that question (its
/// question section is the query's bytes: a query naming its question through a
/// compression pointer reads differently once re-encoded, and is not kept) and there is
/// room.
fn keep(
    zone: &Zone,
    plain: &Plain,
    question: &[u8],
    grants: Option<LiveGrants>,
    answered: &Answered,
) {
    let spread = answered.spread.max(1);
    if spread > MAX_SPREAD || answered.bytes.get(12..plain.question_end) != Some(question) {
        return;
    }
    let Some((head, body)) = answered.bytes.split_first_chunk::<12>() else {
        return;
    };
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
    let entry = match table.get_mut(question) {
        Some(e) if same_grants(e.grants.as_ref(), grants.as_ref()) => e,
        Some(e) => {
            *e = fresh(grants);
            e
        }
        None if held >= MAX_ENTRIES => return,
        None => table
            .entry(question.into())
            .or_insert_with(|| fresh(grants)),
    };
    if entry.by_rotation.len() == spread {
        let slot = usize::from(plain.header.metadata.id) % spread;
        entry.by_rotation[slot] = Some(cached);
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
