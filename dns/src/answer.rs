//! Answering one query from a [`Zone`]: pure and synchronous, the same for UDP, TCP and
//! DNS over HTTPS (only the size limit differs). The wire format is hickory-proto's.

use crate::view::View;
use crate::zone::{Names, ServiceRecords, Zone, HOSTS_LABEL};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, NS, SOA, SRV};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_proto::serialize::binary::BinEncodable;
use std::net::IpAddr;

/// How a query arrived: it decides how big an answer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// UDP: 512 bytes, or what the client's EDNS0 says (up to [`MAX_UDP`]).
    Udp,
    /// TCP: a whole message (65,535 bytes).
    Tcp,
    /// DNS over HTTPS (RFC 8484): a whole message.
    Https,
}

impl Transport {
    /// Its metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Https => "https",
        }
    }
}

/// The UDP payload size we advertise and the most we send over UDP whatever the client
/// asks: 1232 bytes is the DNS flag day 2020 figure, which avoids IP fragmentation.
pub const MAX_UDP: u16 = 1232;

/// The zone's fixed parts: its apex and TTL, as configured.
#[derive(Debug, Clone)]
pub struct Apex {
    domain: Name,
    ttl: u32,
    soa: Record,
    ns: Record,
}

impl Apex {
    /// The apex `domain` (e.g. `xce`), every record's TTL and the SOA minimum `ttl`.
    pub fn new(domain: &str, ttl: u32) -> Result<Self, hickory_proto::ProtoError> {
        let mut domain = Name::from_ascii(domain)?.to_lowercase();
        domain.set_fqdn(true);
        let rname = Name::from_ascii("hostmaster")?.append_domain(&domain)?;
        // The serial is constant: we serve no zone transfers (nothing reads it), and a
        // serial counting changes would tell anyone when hidden projects change.
        let soa = SOA::new(domain.clone(), rname, 1, 3600, 600, 86400, ttl);
        let soa = Record::from_rdata(domain.clone(), ttl, RData::SOA(soa));
        let ns = Record::from_rdata(domain.clone(), ttl, RData::NS(NS(domain.clone())));
        Ok(Self {
            domain,
            ttl,
            soa,
            ns,
        })
    }

    /// The apex's name (lower case, fully qualified).
    pub fn domain(&self) -> &Name {
        &self.domain
    }
}

/// What an answer was, for metrics and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    /// The answer's wire bytes.
    pub bytes: Vec<u8>,
    /// The question's type (`None`: no parsable question).
    pub qtype: Option<RecordType>,
    /// The answer's code.
    pub rcode: ResponseCode,
    /// Whether it was truncated (TC).
    pub truncated: bool,
    /// How many answers the query's id chose the first of (1 when none were rotated):
    /// queries whose ids agree modulo it get the same answer apart from their header.
    pub(crate) spread: usize,
}

/// Answers the query `bytes` from `zone` as `view` sees it, within `transport`'s size.
/// `None`: the packet is not a query worth answering (too short for a header, or a
/// response): dropped, as servers do, so a forged source cannot make us reflect.
pub fn answer(
    apex: &Apex,
    zone: &Zone,
    view: &dyn View,
    bytes: &[u8],
    transport: Transport,
) -> Option<Answered> {
    let request = match Message::from_vec(bytes) {
        Ok(m) => m,
        Err(_) => return formerr(bytes),
    };
    if request.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.checking_disabled = request.metadata.checking_disabled;
    // One question is answered as if asked in lower case, and its bytes as sent are put
    // back at the end (`echo_question`): the records' names point into the question
    // (compression), so they follow its case, and the rest of the answer is the same
    // bytes whatever the case (one cache entry serves every case, DNS 0x20 included).
    let asked = match request.queries.as_slice() {
        [query] => {
            let mut lower = query.clone();
            lower.set_name(query.name().to_lowercase());
            Some((query.clone(), lower))
        }
        _ => None,
    };
    match &asked {
        Some((_, lower)) => response.add_query(lower.clone()),
        None => response.add_queries(request.queries.iter().cloned()),
    };
    let limit = size_limit(request.edns.as_ref(), transport);
    if request.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(MAX_UDP);
        response.set_edns(edns);
    }
    let qtype = request.queries.first().map(Query::query_type);
    let mut spread = 1;
    if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
        response.metadata.response_code = ResponseCode::BADVERS;
        if let Some(edns) = response.edns.as_mut() {
            edns.set_rcode_high(ResponseCode::BADVERS.high());
        }
    } else if request.metadata.op_code != OpCode::Query {
        response.metadata.response_code = ResponseCode::NotImp;
    } else if let Some((_, lower)) = &asked {
        spread = resolve(apex, zone, view, lower, &mut response);
    } else {
        // Not one question.
        response.metadata.response_code = ResponseCode::FormErr;
    }
    let mut answered = encode(response, limit, qtype);
    answered.spread = spread;
    if let Some((query, lower)) = &asked {
        echo_question(&mut answered.bytes, query, lower);
    }
    Some(answered)
}

/// Puts `query`'s bytes in place of the question `lower` (the same name in lower case)
/// that the answer `bytes` was encoded with: the question section is copied from the
/// query (RFC 1035 4.1.2), and names that point into it read in the query's case.
fn echo_question(bytes: &mut [u8], query: &Query, lower: &Query) {
    let (Ok(asked), Ok(lower)) = (query.to_bytes(), lower.to_bytes()) else {
        return;
    };
    // The question is the first name of the message, never compressed, and lowering
    // ASCII letters keeps every label's length: the two encodings have the same length.
    if let Some(question) = bytes.get_mut(12..12 + lower.len()) {
        if *question == *lower && asked.len() == lower.len() {
            question.copy_from_slice(&asked);
        }
    }
}

/// The reply to a query refused by the rate limit that slips: its question, TC set, no
/// records, no bigger than the query (no amplification). `None`: not a query we would
/// answer (then it is dropped like any other).
pub(crate) fn slip(bytes: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(bytes).ok()?;
    if request.metadata.message_type != MessageType::Query || request.queries.len() != 1 {
        return None;
    }
    let mut response = Message::response(request.metadata.id, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.truncation = true;
    response.add_queries(request.queries);
    response.to_vec().ok()
}

/// FORMERR for a packet with a query's header that does not parse; nothing for anything
/// shorter than a header or flagged as a response.
pub(crate) fn formerr(bytes: &[u8]) -> Option<Answered> {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([bytes[0], bytes[1]]);
    let op_code = OpCode::from_u8((bytes[2] >> 3) & 0x0f);
    let response = Message::error_msg(id, op_code, ResponseCode::FormErr);
    Some(encode(response, 512, None))
}

pub(crate) fn size_limit(edns: Option<&Edns>, transport: Transport) -> usize {
    match transport {
        Transport::Tcp | Transport::Https => usize::from(u16::MAX),
        Transport::Udp => match edns {
            None => 512,
            Some(e) => usize::from(e.max_payload().clamp(512, MAX_UDP)),
        },
    }
}

/// The answer's bytes within `limit`: the additional section goes first, then answers
/// from the end, with TC set when an answer was left out (the client retries over TCP).
fn encode(mut response: Message, limit: usize, qtype: Option<RecordType>) -> Answered {
    let mut bytes = response.to_vec().unwrap_or_default();
    if bytes.len() > limit && !response.additionals.is_empty() {
        response.additionals.clear();
        bytes = response.to_vec().unwrap_or_default();
    }
    while bytes.len() > limit && !(response.answers.is_empty() && response.authorities.is_empty()) {
        response.metadata.truncation = true;
        if response.answers.pop().is_none() {
            response.authorities.clear();
        }
        bytes = response.to_vec().unwrap_or_default();
    }
    Answered {
        bytes,
        qtype,
        rcode: response.metadata.response_code,
        truncated: response.metadata.truncation,
        spread: 1,
    }
}

/// What a name under the apex is.
enum Found {
    /// It has records of the asked type (or of others: then NODATA).
    Records(Vec<Record>, Vec<Record>),
    /// It exists (has records of other types, or names under it): NODATA.
    NoData,
    /// No such name, or one of a project `view` may not see: NXDOMAIN, the same bytes.
    NxDomain,
}

/// Fills `response` with the answer to `query`; returns over how many answers the
/// query's id chose the first (1: no rotation).
fn resolve(
    apex: &Apex,
    zone: &Zone,
    view: &dyn View,
    query: &Query,
    response: &mut Message,
) -> usize {
    let qname = query.name();
    if query.query_class() != DNSClass::IN || !apex.domain.zone_of(qname) {
        // Not ours: not authoritative, no referral (we are no recursive resolver).
        response.metadata.response_code = ResponseCode::Refused;
        return 1;
    }
    response.metadata.authoritative = true;
    let Some(names) = &zone.live else {
        response.metadata.authoritative = false;
        response.metadata.response_code = ResponseCode::ServFail;
        return 1;
    };
    let labels = relative_labels(qname, &apex.domain);
    let rel: Vec<&str> = labels.iter().map(String::as_str).collect();
    let found = lookup(apex, names, view, qname, query.query_type(), &rel);
    match found {
        Found::Records(mut answers, additionals) if !answers.is_empty() => {
            // Clients mostly take the first record: start each answer elsewhere (by the
            // query's id), so load spreads and one query's answer stays deterministic.
            let len = answers.len();
            answers.rotate_left(usize::from(response.metadata.id) % len);
            response.add_answers(answers);
            response.add_additionals(additionals);
            len
        }
        Found::Records(..) | Found::NoData => {
            response.add_authority(apex.soa.clone());
            1
        }
        Found::NxDomain => {
            response.metadata.response_code = ResponseCode::NXDomain;
            response.add_authority(apex.soa.clone());
            1
        }
    }
}

/// The labels of `qname` below `domain`, lower case, from the apex down (`web.default`
/// gives `["default", "web"]`). Labels that are not UTF-8 stay as they are (they match
/// nothing).
fn relative_labels(qname: &Name, domain: &Name) -> Vec<String> {
    let below = usize::from(qname.num_labels().saturating_sub(domain.num_labels()));
    let mut labels: Vec<String> = qname
        .iter()
        .take(below)
        .map(|l| String::from_utf8_lossy(l).to_ascii_lowercase())
        .collect();
    labels.reverse();
    labels
}

fn lookup(
    apex: &Apex,
    names: &Names,
    view: &dyn View,
    qname: &Name,
    qtype: RecordType,
    rel: &[&str],
) -> Found {
    let ttl = apex.ttl;
    match rel {
        [] => match qtype {
            RecordType::SOA => Found::Records(vec![apex.soa.clone()], vec![]),
            RecordType::NS => Found::Records(vec![apex.ns.clone()], vec![]),
            _ => Found::NoData,
        },
        [HOSTS_LABEL] => exists(names.hosts.values().any(|h| view.may_view_any(&h.projects))),
        [HOSTS_LABEL, host] => match names.hosts.get(*host) {
            Some(h) if view.may_view_any(&h.projects) => {
                Found::Records(address_records(qname, &[h.addr], qtype, ttl), vec![])
            }
            _ => Found::NxDomain,
        },
        [project, rest @ ..] if view.may_view(project) => match names.services.get(*project) {
            Some(services) => in_project(names, services, view, qname, qtype, ttl, rest),
            None => Found::NxDomain,
        },
        _ => Found::NxDomain,
    }
}

fn in_project(
    names: &Names,
    services: &std::collections::HashMap<String, ServiceRecords>,
    view: &dyn View,
    qname: &Name,
    qtype: RecordType,
    ttl: u32,
    rest: &[&str],
) -> Found {
    let (service, below) = match rest {
        [] => return Found::NoData,
        [service, below @ ..] => (*service, below),
    };
    let Some(recs) = services.get(service) else {
        return Found::NxDomain;
    };
    match below {
        [] => Found::Records(address_records(qname, &recs.addrs, qtype, ttl), vec![]),
        [proto] => exists(recs.srv.keys().any(|(_, p)| p == proto)),
        [proto, port] => match recs.srv.get(&(port.to_string(), proto.to_string())) {
            None => Found::NxDomain,
            Some(_) if qtype != RecordType::SRV => Found::NoData,
            Some(targets) => srv_records(names, view, qname, targets, ttl),
        },
        _ => Found::NxDomain,
    }
}

fn exists(yes: bool) -> Found {
    if yes {
        Found::NoData
    } else {
        Found::NxDomain
    }
}

fn address_records(qname: &Name, addrs: &[IpAddr], qtype: RecordType, ttl: u32) -> Vec<Record> {
    addrs
        .iter()
        .filter_map(|addr| match (qtype, addr) {
            (RecordType::A, IpAddr::V4(v4)) => Some(RData::A(A(*v4))),
            (RecordType::AAAA, IpAddr::V6(v6)) => Some(RData::AAAA(AAAA(*v6))),
            _ => None,
        })
        .map(|rdata| Record::from_rdata(qname.clone(), ttl, rdata))
        .collect()
}

fn srv_records(
    names: &Names,
    view: &dyn View,
    qname: &Name,
    targets: &[(std::sync::Arc<str>, u16)],
    ttl: u32,
) -> Found {
    let mut answers = Vec::with_capacity(targets.len());
    let mut additionals = Vec::new();
    let mut added = std::collections::BTreeSet::new();
    for (host, port) in targets {
        let Ok(target) = host_name(host, qname) else {
            continue;
        };
        let srv = SRV::new(0, 1, *port, target.clone());
        answers.push(Record::from_rdata(qname.clone(), ttl, RData::SRV(srv)));
        if let Some(h) = names.hosts.get(&**host) {
            if view.may_view_any(&h.projects) && added.insert(host.clone()) {
                let qtype = match h.addr {
                    IpAddr::V4(_) => RecordType::A,
                    IpAddr::V6(_) => RecordType::AAAA,
                };
                additionals.extend(address_records(&target, &[h.addr], qtype, ttl));
            }
        }
    }
    Found::Records(answers, additionals)
}

/// `<host>.host.<domain>.` for an SRV answer to `qname` (`_port._proto.service.project.<domain>.`).
fn host_name(host: &str, qname: &Name) -> Result<Name, hickory_proto::ProtoError> {
    // Four labels above the apex: port, proto, service, project.
    let mut apex = qname.clone();
    for _ in 0..4 {
        apex = apex.base_name();
    }
    Name::from_labels([host, HOSTS_LABEL])?.append_domain(&apex.to_lowercase())
}
