//! The cached path gives the uncached path's bytes, byte for byte, for any query; a new
//! zone or new grants start afresh.

use super::{answer_cached, Outcome, Viewer};
use crate::answer::{answer, Transport};
use crate::encoded::MAX_ENTRIES;
use crate::tests::{apex, cluster, entry};
use crate::zone::Zone;
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use plugin_api::{Credential, LiveGrants, Permission, Principal, PrincipalKind};
use proptest::prelude::*;
use std::sync::Arc;
use tokio::sync::watch;

fn principal(projects: &[&str], credential: Credential) -> Principal {
    Principal {
        name: "dns".into(),
        kind: PrincipalKind::User,
        grants: vec![(
            Permission::JobView,
            projects.iter().map(|p| p.to_string()).collect(),
        )],
        credential,
    }
}

/// `cluster()` (a hidden project `team-b` for a viewer of `default`) and a service of
/// 40 replicas whose SRV answer does not fit in 512 bytes.
fn zone() -> Zone {
    let big: Vec<(String, u16)> = (0..40u16)
        .map(|i| (format!("exec-{:02}", i % 4), 20000 + i))
        .collect();
    let big: Vec<(&str, &str, &str, bool, u16)> = big
        .iter()
        .map(|(h, p)| (h.as_str(), "127.0.0.20", "running", true, *p))
        .collect();
    let mut entries = cluster();
    entries.push(entry("default", "big", &big));
    Zone::build(&entries)
}

/// One query's wire bytes, as the proptest varies it.
#[derive(Debug, Clone)]
struct Ask {
    name: String,
    qtype: RecordType,
    class: DNSClass,
    id: u16,
    rd: bool,
    cd: bool,
    /// `(payload size, version, DO)`.
    edns: Option<(u16, u8, bool)>,
    trailing: Vec<u8>,
}

impl Ask {
    fn bytes(&self) -> Vec<u8> {
        let mut m = Message::new(self.id, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = self.rd;
        m.metadata.checking_disabled = self.cd;
        let mut q = Query::query(Name::from_ascii(&self.name).unwrap(), self.qtype);
        q.set_query_class(self.class);
        m.add_query(q);
        if let Some((size, version, dnssec_ok)) = self.edns {
            let mut e = Edns::new();
            e.set_max_payload(size);
            e.set_version(version);
            e.set_dnssec_ok(dnssec_ok);
            m.set_edns(e);
        }
        let mut bytes = m.to_vec().unwrap();
        bytes.extend_from_slice(&self.trailing);
        bytes
    }
}

const NAMES: &[&str] = &[
    "web.default.xce.",
    "_http._tcp.web.default.xce.",
    "_http._tcp.big.default.xce.",
    "big.default.xce.",
    "v6.default.xce.",
    "default.xce.",
    "_tcp.web.default.xce.",
    "db.team-b.xce.",
    "_http._tcp.db.team-b.xce.",
    "exec-01.host.xce.",
    "exec-05.host.xce.",
    "host.xce.",
    "xce.",
    "nope.default.xce.",
    "web.nope.xce.",
    "example.com.",
];

fn mixed_case(name: &str, mask: u64) -> String {
    name.chars()
        .enumerate()
        .map(|(i, c)| {
            if mask >> (i % 64) & 1 == 1 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        })
        .collect()
}

/// `name` with every ASCII letter's case flipped.
fn swap_case(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_uppercase() {
                c.to_ascii_lowercase()
            } else {
                c.to_ascii_uppercase()
            }
        })
        .collect()
}

fn asks() -> impl Strategy<Value = Ask> {
    let name = prop_oneof![
        4 => (proptest::sample::select(NAMES), any::<u64>())
            .prop_map(|(n, mask)| mixed_case(n, mask)),
        1 => "[a-zA-Z0-9_][a-z0-9_-]{0,7}(\\.[a-z0-9_][a-zA-Z0-9_-]{0,7}){0,3}\\.xce\\.",
    ];
    let qtype = prop_oneof![
        4 => proptest::sample::select(vec![
            RecordType::A, RecordType::AAAA, RecordType::SRV, RecordType::SOA,
            RecordType::NS, RecordType::TXT, RecordType::ANY, RecordType::CNAME,
        ]),
        1 => any::<u16>().prop_map(RecordType::from),
    ];
    let class = prop_oneof![8 => Just(DNSClass::IN), 1 => Just(DNSClass::CH)];
    let edns = proptest::option::of((
        0u16..5000,
        prop_oneof![6 => Just(0u8), 1 => Just(1u8)],
        any::<bool>(),
    ));
    let trailing =
        prop_oneof![8 => Just(vec![]), 1 => proptest::collection::vec(any::<u8>(), 1..8)];
    (
        name,
        qtype,
        class,
        any::<u16>(),
        any::<bool>(),
        any::<bool>(),
        edns,
        trailing,
    )
        .prop_map(|(name, qtype, class, id, rd, cd, edns, trailing)| Ask {
            name,
            qtype,
            class,
            id,
            rd,
            cd,
            edns,
            trailing,
        })
}

/// Asks `bytes` through the cache and checks the bytes against the uncached answer.
fn same_as_uncached(
    zone: &Zone,
    viewer: &Viewer,
    bytes: &[u8],
    transport: Transport,
) -> Result<Outcome, TestCaseError> {
    let uncached = answer(&apex(), zone, &viewer.principal, bytes, transport);
    let (cached, outcome) = answer_cached(&apex(), zone, viewer, bytes, transport);
    prop_assert_eq!(
        cached
            .as_ref()
            .map(|a| (&a.bytes, a.rcode, a.truncated, a.qtype)),
        uncached
            .as_ref()
            .map(|a| (&a.bytes, a.rcode, a.truncated, a.qtype))
    );
    Ok(outcome)
}

proptest! {
    #[test]
    fn cached_answers_are_the_uncached_bytes(
        asks in proptest::collection::vec(asks(), 1..24),
        tcp in any::<bool>(),
    ) {
        let transport = if tcp { Transport::Tcp } else { Transport::Udp };
        let zone = zone();
        let viewer = Viewer::new(principal(&["default"], Credential::fixed()));
        for ask in &asks {
            let bytes = ask.bytes();
            let first = same_as_uncached(&zone, &viewer, &bytes, transport)?;
            let second = same_as_uncached(&zone, &viewer, &bytes, transport)?;
            if first != Outcome::Bypass {
                prop_assert_eq!(second, Outcome::Hit, "asked again: {:?}", ask);
            }
            // The same question in another case (a resolver's DNS 0x20): the answer the
            // first case put there, with this question echoed.
            let recased = Ask { name: swap_case(&ask.name), ..ask.clone() };
            let third = same_as_uncached(&zone, &viewer, &recased.bytes(), transport)?;
            if first != Outcome::Bypass {
                prop_assert_eq!(third, Outcome::Hit, "asked in another case: {:?}", recased);
            }
            // The same question under another id and flags: the answer's header follows
            // the query, and its rotation the id.
            let other = Ask { id: ask.id.wrapping_add(1), rd: !ask.rd, cd: !ask.cd, ..ask.clone() };
            same_as_uncached(&zone, &viewer, &other.bytes(), transport)?;
        }
    }
}

#[test]
fn a_plain_query_is_cached_and_others_bypass() {
    let zone = zone();
    let viewer = Viewer::new(principal(&["default"], Credential::fixed()));
    let ask = Ask {
        name: "web.default.xce.".into(),
        qtype: RecordType::A,
        class: DNSClass::IN,
        id: 7,
        rd: true,
        cd: false,
        edns: Some((1232, 0, false)),
        trailing: vec![],
    };
    let outcome = |bytes: &[u8]| answer_cached(&apex(), &zone, &viewer, bytes, Transport::Udp).1;
    assert_eq!(outcome(&ask.bytes()), Outcome::Miss);
    assert_eq!(outcome(&ask.bytes()), Outcome::Hit);
    // EDNS version 1 (BADVERS), and anything but one question: computed each time.
    let badvers = Ask {
        edns: Some((1232, 1, false)),
        ..ask.clone()
    }
    .bytes();
    assert_eq!(outcome(&badvers), Outcome::Bypass);
    assert_eq!(outcome(&badvers), Outcome::Bypass);
    assert_eq!(outcome(&[0u8; 5]), Outcome::Bypass);
    // An additional record other than OPT.
    let mut m = Message::from_vec(
        &Ask {
            edns: None,
            ..ask.clone()
        }
        .bytes(),
    )
    .unwrap();
    m.add_additional(hickory_proto::rr::Record::from_rdata(
        Name::from_ascii("x.").unwrap(),
        1,
        hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A::new(127, 0, 0, 1)),
    ));
    assert_eq!(outcome(&m.to_vec().unwrap()), Outcome::Bypass);
    assert_eq!(zone.answers.len(), 1);
}

#[test]
fn a_new_zone_answers_from_its_own_records() {
    let viewer = Viewer::new(principal(&["default"], Credential::fixed()));
    let q = Ask {
        name: "web.default.xce.".into(),
        qtype: RecordType::A,
        class: DNSClass::IN,
        id: 1,
        rd: true,
        cd: false,
        edns: None,
        trailing: vec![],
    }
    .bytes();
    let old = zone();
    answer_cached(&apex(), &old, &viewer, &q, Transport::Udp);
    assert_eq!(
        answer_cached(&apex(), &old, &viewer, &q, Transport::Udp).1,
        Outcome::Hit
    );
    // The table changed: `web` has one replica left. A new zone, a new cache.
    let new = Zone::build(&[entry(
        "default",
        "web",
        &[("exec-09", "127.0.0.19", "running", true, 20009)],
    )]);
    let (cached, outcome) = answer_cached(&apex(), &new, &viewer, &q, Transport::Udp);
    assert_eq!(outcome, Outcome::Miss);
    let uncached = answer(&apex(), &new, &viewer.principal, &q, Transport::Udp).unwrap();
    assert_eq!(cached.unwrap().bytes, uncached.bytes);
    let m = Message::from_vec(&uncached.bytes).unwrap();
    assert_eq!(m.answers.len(), 1);
}

#[test]
fn shrunk_grants_are_not_answered_from_the_cache() {
    let grants = |projects: &[&str]| -> LiveGrants {
        Some(Arc::new(vec![(
            Permission::JobView,
            projects.iter().map(|p| p.to_string()).collect(),
        )]))
    };
    let (tx, rx) = watch::channel(grants(&["default", "team-b"]));
    let viewer = Viewer::new(principal(&["*"], Credential::following(rx)));
    let zone = zone();
    let q = Ask {
        name: "db.team-b.xce.".into(),
        qtype: RecordType::A,
        class: DNSClass::IN,
        id: 3,
        rd: false,
        cd: false,
        edns: None,
        trailing: vec![],
    }
    .bytes();
    let ask = || answer_cached(&apex(), &zone, &viewer, &q, Transport::Udp);
    assert_eq!(ask().1, Outcome::Miss);
    let (seen, outcome) = ask();
    assert_eq!(outcome, Outcome::Hit);
    assert_eq!(
        Message::from_vec(&seen.unwrap().bytes)
            .unwrap()
            .answers
            .len(),
        1
    );
    // A reload of the tokens takes `team-b` away: the name is hidden at once.
    tx.send_replace(grants(&["default"]));
    let (hidden, outcome) = ask();
    assert_eq!(outcome, Outcome::Miss);
    let uncached = answer(&apex(), &zone, &viewer.principal, &q, Transport::Udp).unwrap();
    assert_eq!(hidden.unwrap().bytes, uncached.bytes);
    assert_eq!(uncached.rcode, hickory_proto::op::ResponseCode::NXDomain);
    assert_eq!(ask().1, Outcome::Hit);
}

#[test]
fn the_cache_keeps_at_most_its_bound() {
    let zone = zone();
    let viewer = Viewer::new(principal(&["default"], Credential::fixed()));
    for i in 0..MAX_ENTRIES + 10 {
        let q = Ask {
            name: format!("n{i}.default.xce."),
            qtype: RecordType::A,
            class: DNSClass::IN,
            id: 1,
            rd: false,
            cd: false,
            edns: None,
            trailing: vec![],
        }
        .bytes();
        answer_cached(&apex(), &zone, &viewer, &q, Transport::Udp);
    }
    assert_eq!(zone.answers.len(), MAX_ENTRIES);
}

/// A question in mixed case is answered from the entry its lower-case form put in the
/// cache: its question comes back byte for byte as sent, the records are the same bytes
/// (their names point into the question, so they read in its case), and the answer is
/// the uncached path's.
#[test]
fn a_mixed_case_question_is_echoed_and_answered_from_the_lower_case_entry() {
    let zone = zone();
    let viewer = Viewer::new(principal(&["default"], Credential::fixed()));
    let ask = |name: &str| {
        Ask {
            name: name.into(),
            qtype: RecordType::SRV,
            class: DNSClass::IN,
            id: 9,
            rd: true,
            cd: false,
            edns: Some((1232, 0, false)),
            trailing: vec![],
        }
        .bytes()
    };
    let lower = ask("_http._tcp.web.default.xce.");
    let (plain, outcome) = answer_cached(&apex(), &zone, &viewer, &lower, Transport::Udp);
    assert_eq!(outcome, Outcome::Miss);
    let plain = plain.unwrap().bytes;
    let mixed = ask("_HTTP._Tcp.WEB.default.XCE.");
    let (hit, outcome) = answer_cached(&apex(), &zone, &viewer, &mixed, Transport::Udp);
    assert_eq!(outcome, Outcome::Hit, "another case, the same entry");
    let hit = hit.unwrap().bytes;
    // The question follows the 12 bytes of the header.
    let question = Query::query(
        Name::from_ascii("_http._tcp.web.default.xce.").unwrap(),
        RecordType::SRV,
    );
    let end = 12
        + hickory_proto::serialize::binary::BinEncodable::to_bytes(&question)
            .unwrap()
            .len();
    assert_eq!(hit[12..end], mixed[12..end], "the question as sent");
    assert_eq!(hit[..12], plain[..12]);
    assert_eq!(hit[end..], plain[end..], "the same records, byte for byte");
    let uncached = answer(&apex(), &zone, &viewer.principal, &mixed, Transport::Udp).unwrap();
    assert_eq!(hit, uncached.bytes);
    let m = Message::from_vec(&hit).unwrap();
    assert_eq!(
        m.queries[0].name().to_ascii(),
        "_HTTP._Tcp.WEB.default.XCE."
    );
    assert_eq!(m.answers.len(), 3);
    for record in &m.answers {
        assert_eq!(
            record.name.to_ascii(),
            "_HTTP._Tcp.WEB.default.XCE.",
            "points into the question"
        );
    }
}
