//! The real UDP and TCP listeners on loopback, fed by a real endpoint table: bad input
//! (random and mutated packets, compression loops, oversized labels, 0-length and
//! 65,535-byte TCP frames) never stops them from answering a legitimate query; and how
//! soon a change of the table reaches the answers.
#![allow(missing_docs)]

use endpoint_table::{Change, EndpointApi, Entry, TableConfig, Update};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use plugin_api::{Credential, Permission, Principal, PrincipalKind};
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;
use testkit::patience;
use xce_dns::{Dns, DnsConfig};

fn entry(index: u64, ready: &[bool]) -> Arc<Entry> {
    let replicas: Vec<serde_json::Value> = ready
        .iter()
        .enumerate()
        .map(|(i, r)| {
            serde_json::json!({
                "replica": i, "job": format!("j-{i}"), "host": format!("exec-{i:02}"),
                "address": format!("127.0.0.{}", 11 + i), "ports": { "http": 20000 + i },
                "state": if *r { "running" } else { "draining" }, "ready": *r,
            })
        })
        .collect();
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "service": "web", "project": "default", "index": index,
            "ports": [ { "name": "http", "protocol": "tcp" } ], "replicas": replicas,
        }))
        .unwrap(),
    )
}

fn admin() -> Principal {
    Principal {
        name: "dns".into(),
        kind: PrincipalKind::User,
        grants: vec![(Permission::JobView, vec!["*".into()])],
        credential: Credential::fixed(),
    }
}

/// A DNS server over a table holding `web` with 3 ready replicas, its zone built.
async fn server() -> (Arc<EndpointApi>, Arc<Dns>) {
    server_with(&DnsConfig::default()).await
}

async fn server_with(cfg: &DnsConfig) -> (Arc<EndpointApi>, Arc<Dns>) {
    let table = Arc::new(EndpointApi::standalone(TableConfig::default()));
    let dns = Dns::new(cfg, &table).unwrap();
    let mut zones = dns.subscribe();
    dns.start();
    table.apply(Update::Resync {
        entries: vec![entry(1, &[true, true, true])],
        rev: 1,
    });
    tokio::time::timeout(patience(), zones.wait_for(|z| z.services() == 1))
        .await
        .expect("the zone is built from the table")
        .unwrap();
    (table, dns)
}

/// [`server_with`], with its UDP and TCP listener on a free loopback port.
async fn listening(cfg: &DnsConfig) -> (Arc<EndpointApi>, Arc<Dns>, xce_dns::Listener) {
    let (table, dns) = server_with(cfg).await;
    let listener = dns
        .listen("127.0.0.1:0".parse().unwrap(), admin())
        .await
        .unwrap();
    (table, dns, listener)
}

fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

fn udp_ask(sock: &std::net::UdpSocket, q: &[u8]) -> Option<Message> {
    sock.send(q).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(Message::from_vec(&buf[..n]).expect("every answer parses"))
}

fn legit_udp(sock: &std::net::UdpSocket, id: u16) {
    let a = udp_ask(sock, &query(id, "web.default.xce.", RecordType::A))
        .expect("a legitimate query is answered");
    assert_eq!(a.metadata.id, id);
    assert_eq!(a.answers.len(), 3);
}

/// A bad packet of kind `i % 5`: random bytes, a valid query with bytes flipped, cut
/// short, a compression loop, an oversized label.
fn bad_packet(rng: &mut fastrand::Rng, i: usize) -> Vec<u8> {
    let mut q = query(rng.u16(..), "web.default.xce.", RecordType::A);
    match i % 5 {
        0 => (0..rng.usize(0..600)).map(|_| rng.u8(..)).collect(),
        1 => {
            for _ in 0..rng.usize(1..6) {
                let at = rng.usize(..q.len());
                q[at] = rng.u8(..);
            }
            q
        }
        2 => {
            q.truncate(rng.usize(..q.len()));
            q
        }
        // The question's name is a pointer to itself.
        3 => {
            q.truncate(12);
            q.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1]);
            q
        }
        _ => {
            q.truncate(12);
            q.push(64);
            q.extend(std::iter::repeat_n(b'a', 64));
            q.extend_from_slice(&[0, 0, 1, 0, 1]);
            q
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_packets_are_answered_formerr_or_dropped_and_never_stop_the_listener() {
    let (_table, _dns, listener) = listening(&DnsConfig::default()).await;
    let addr = listener.addr();
    let (answered, dropped) = tokio::task::spawn_blocking(move || fuzz_udp(addr))
        .await
        .unwrap();
    let tcp = tokio::task::spawn_blocking(move || bad_tcp_frames(addr))
        .await
        .unwrap();
    println!("FIGURE dns fuzz: udp_bad_packets={} answered={answered} dropped={dropped} tcp_bad_frames={tcp} legit_answered=all", answered + dropped);
}

fn fuzz_udp(addr: std::net::SocketAddr) -> (usize, usize) {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(addr).unwrap();
    sock.set_read_timeout(Some(patience())).unwrap();
    let mut rng = testkit::seeded_rng("dns fuzz");
    let (mut answered, mut dropped) = (0, 0);
    for i in 0..2000 {
        let p = bad_packet(&mut rng, i);
        // Shorter than a header or flagged as a response: dropped, never answered.
        if p.len() < 12 || p[2] & 0x80 != 0 {
            sock.send(&p).unwrap();
            dropped += 1;
        } else {
            let a = udp_ask(&sock, &p).expect("a packet with a query's header is answered");
            if Message::from_vec(&p).is_err() {
                assert_eq!(a.metadata.response_code, ResponseCode::FormErr, "{p:?}");
            }
            answered += 1;
        }
        if i % 100 == 99 {
            legit_udp(&sock, i as u16);
        }
    }
    (answered, dropped)
}

/// 0-length and 65,535-byte frames, a frame cut short by a close: each ends its own
/// connection only; a legitimate query on a new connection is answered.
fn bad_tcp_frames(addr: std::net::SocketAddr) -> usize {
    let frames: Vec<Vec<u8>> = vec![
        vec![0, 0],
        [&[0xff, 0xff][..], &vec![0x41; 65535]].concat(),
        vec![0x01, 0x00, 1, 2, 3],
    ];
    for f in &frames {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(patience())).unwrap();
        s.write_all(f).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = Vec::new();
        // Answered (FORMERR) or closed; either way the read ends.
        let _ = s.read_to_end(&mut rest);
        if rest.len() > 2 {
            let a = Message::from_vec(&rest[2..]).unwrap();
            assert_eq!(a.metadata.response_code, ResponseCode::FormErr);
        }
        let a = tcp_ask(addr, &query(7, "web.default.xce.", RecordType::A));
        assert_eq!(a.answers.len(), 3);
    }
    frames.len()
}

/// One query over a new TCP connection, and its answer.
fn tcp_ask(addr: std::net::SocketAddr, q: &[u8]) -> Message {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(patience())).unwrap();
    s.write_all(&[&(q.len() as u16).to_be_bytes()[..], q].concat())
        .unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut buf).unwrap();
    Message::from_vec(&buf).unwrap()
}

/// How soon a replica that starts draining is gone from the answers: from applying the
/// change to the table to the first answer without it, over 100 changes (printed, never
/// asserted: it is a measurement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_reaches_the_answers_within_a_rebuild() {
    let (table, dns) = server().await;
    let view = admin();
    let q = query(1, "web.default.xce.", RecordType::A);
    let mut took = Vec::new();
    for i in 0..100u64 {
        // Alternately the third replica drains and comes back.
        let draining = i % 2 == 0;
        let want = if draining { 2 } else { 3 };
        let e = entry(2 + i, &[true, true, !draining]);
        let t0 = Instant::now();
        table.apply(Update::Change {
            change: Change::Upsert { entry: e },
        });
        loop {
            let a = Message::from_vec(&dns.answer(&view, &q, xce_dns::Transport::Udp).unwrap())
                .unwrap();
            if a.answers.len() == want {
                break;
            }
            assert!(
                t0.elapsed() < patience(),
                "the change never reached the answers"
            );
            tokio::task::yield_now().await;
        }
        took.push(t0.elapsed());
    }
    took.sort();
    let pct = |p: usize| took[(took.len() * p / 100).min(took.len() - 1)];
    println!(
        "SUMMARY dns freshness changes={} p50={:?} p99={:?} max={:?} (table apply -> first answer without the replica)",
        took.len(),
        pct(50),
        pct(99),
        took[took.len() - 1]
    );
}

/// The sum of the server's `/metrics` samples whose line starts with `name` and contains
/// `label`.
fn metric(dns: &Arc<Dns>, name: &str, label: &str) -> f64 {
    use plugin_api::ApiExtension;
    let mut registry = prometheus_client::registry::Registry::default();
    xce_dns::DnsApi(dns.clone()).register_metrics(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of the rate-limited drops on the server's `/metrics` text.
fn rate_limited(dns: &Arc<Dns>) -> f64 {
    metric(dns, "xce_dns_dropped_total", "rate_limited")
}

/// With several UDP readers (sockets sharing the port), one source address sending from
/// many ports reaches several of them: it is still limited once, by one shared bucket,
/// not once per reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_is_limited_once_across_all_udp_readers() {
    let cfg = DnsConfig {
        per_source_qps: 50,
        udp_readers: Some(4),
        slip: 0,
        ..Default::default()
    };
    let (_table, dns, listener) = listening(&cfg).await;
    assert_eq!(listener.udp_readers(), 4);
    let addr = listener.addr();
    let t0 = Instant::now();
    let sent = tokio::task::spawn_blocking(move || {
        let q = query(3, "web.default.xce.", RecordType::A);
        let mut sent = 0;
        // 8 ports of one address: the kernel hashes them over the 4 sockets.
        for _ in 0..8 {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.connect(addr).unwrap();
            for _ in 0..40 {
                sent += usize::from(s.send(&q).is_ok());
            }
        }
        sent
    })
    .await
    .unwrap();
    let udp_answered = || metric(&dns, "xce_dns_queries_total", "transport=\"udp\"");
    while udp_answered() + rate_limited(&dns) < sent as f64 {
        assert!(
            t0.elapsed() < patience(),
            "every query is answered or dropped"
        );
        tokio::task::yield_now().await;
    }
    let (answered, elapsed) = (udp_answered(), t0.elapsed().as_secs_f64());
    // One bucket: a burst of 50 plus 50/s since; a bucket per reader would pass up to 4×.
    let allowed = 50.0 + (50.0 * elapsed).ceil();
    println!("FIGURE dns shared limit: sent={sent} answered={answered} allowed={allowed} readers=4 seconds={elapsed:.3}");
    assert!(
        answered <= allowed,
        "{answered} answered, at most {allowed} allowed"
    );
    assert!(answered >= 50.0, "the burst is answered");
}

/// One address flooding the listener past `per_source_qps` is dropped (and counted),
/// while another address's queries are all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_address_does_not_starve_another() {
    let cfg = DnsConfig {
        per_source_qps: 100,
        ..Default::default()
    };
    let (_table, dns, listener) = listening(&cfg).await;
    let addr = listener.addr();
    let (legit, sent) = tokio::task::spawn_blocking(move || {
        let flood = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        flood.connect(addr).unwrap();
        let other = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
        other.connect(addr).unwrap();
        other
            .set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        let q = query(9, "web.default.xce.", RecordType::A);
        let (mut answered, mut sent) = (0, 0);
        for round in 0..20 {
            for _ in 0..200 {
                sent += usize::from(flood.send(&q).is_ok());
            }
            // A resolver retransmits a query it got no answer to; within patience.
            let t0 = Instant::now();
            while udp_ask(&other, &query(round, "web.default.xce.", RecordType::A)).is_none() {
                assert!(t0.elapsed() < patience(), "the other address is starved");
            }
            answered += 1;
        }
        (answered, sent)
    })
    .await
    .unwrap();
    let dropped = rate_limited(&dns);
    assert!(dropped > 0.0, "the flood was limited");
    let tries = tokio::task::spawn_blocking(move || client_behind_the_flood(addr))
        .await
        .unwrap();
    let slipped = metric(&dns, "xce_dns_slipped_total", "");
    assert!(slipped > 0.0, "refused queries slipped");
    println!("FIGURE dns flood: flood_sent={sent} rate_limited_drops={dropped} slipped={slipped} other_source_answered={legit}/20 client_behind_flood_tries={tries}");
}

/// A client on the flooding address (as a forged flood makes it look): its UDP queries
/// are refused with the flood's, but one of them slips (an empty TC reply) and the
/// client's retry over TCP is answered. Returns how many UDP tries it took.
fn client_behind_the_flood(addr: std::net::SocketAddr) -> usize {
    let flood = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    flood.connect(addr).unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect(addr).unwrap();
    client
        .set_read_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let t0 = Instant::now();
    for tries in 1.. {
        assert!(t0.elapsed() < patience(), "no refused query slipped");
        // Keep the address's bucket empty, then ask (a new id each try: a late reply to
        // an earlier try is told apart).
        for _ in 0..200 {
            let _ = flood.send(&query(0, "web.default.xce.", RecordType::A));
        }
        let id = 1000 + tries as u16;
        let q = query(id, "web.default.xce.", RecordType::A);
        let Some(a) = udp_ask(&client, &q).filter(|a| a.metadata.id == id) else {
            continue; // dropped: a client retransmits
        };
        if !a.metadata.truncation {
            continue; // the bucket had refilled: answered, but not what this shows
        }
        assert!(a.answers.is_empty() && a.additionals.is_empty(), "{a:?}");
        assert_eq!(a.queries, Message::from_vec(&q).unwrap().queries);
        assert_eq!(tcp_ask(addr, &q).answers.len(), 3, "TCP is not limited");
        return tries;
    }
    unreachable!()
}

/// A host without `[dns] listen` (only `/dns-query` can ask): changes of the table build
/// no zone until a query comes, and that query answers from the table as it is then.
/// Before, every change rebuilt the whole zone: 9 % of a controller's CPU while it placed
/// 50,000 replicas with nobody asking.
#[tokio::test]
async fn without_a_listener_a_zone_is_built_only_when_a_query_asks() {
    let table = Arc::new(EndpointApi::standalone(TableConfig::default()));
    let dns = Dns::new(&DnsConfig::default(), &table).unwrap();
    let mut zones = dns.subscribe();
    let view = admin();
    let ask = |dns: &Dns| {
        let q = query(7, "web.default.xce.", RecordType::A);
        let a = dns.answer(&view, &q, xce_dns::Transport::Https).unwrap();
        Message::from_vec(&a).unwrap().answers.len()
    };
    for index in 1..=50u64 {
        let ready: Vec<bool> = (0..3).map(|i| (index + i) % 4 != 0).collect();
        table.apply(Update::Resync {
            entries: vec![entry(index, &ready)],
            rev: index,
        });
    }
    assert!(
        !zones.has_changed().unwrap(),
        "a zone was built for 50 changes nobody asked about"
    );
    // The last state: index 50, replicas 0..3 ready unless (50 + i) % 4 == 0 (i = 2).
    assert_eq!(ask(&dns), 2, "the first query sees the table as it is");
    zones.borrow_and_update();
    assert_eq!(ask(&dns), 2);
    assert!(!zones.has_changed().unwrap(), "no change, no second build");
    table.apply(Update::Change {
        change: Change::Upsert {
            entry: entry(51, &[true, true, true]),
        },
    });
    assert_eq!(ask(&dns), 3, "a query after a change sees it");
    assert!(zones.has_changed().unwrap());
}

/// The questions [`many_at_once`] asks, by id: (name, type, answer code, answers).
const MIXED: &[(&str, RecordType, ResponseCode, usize)] = &[
    ("web.default.xce.", RecordType::A, ResponseCode::NoError, 3),
    (
        "_http._tcp.web.default.xce.",
        RecordType::SRV,
        ResponseCode::NoError,
        3,
    ),
    (
        "web.default.xce.",
        RecordType::AAAA,
        ResponseCode::NoError,
        0,
    ),
    (
        "nope.default.xce.",
        RecordType::A,
        ResponseCode::NXDomain,
        0,
    ),
    ("exec-01.host.xce.", RecordType::A, ResponseCode::NoError, 1),
    ("example.com.", RecordType::A, ResponseCode::Refused, 0),
    // The question comes back in the case it was asked (DNS 0x20).
    ("WeB.DeFault.XCE.", RecordType::A, ResponseCode::NoError, 3),
];

/// One client socket: `total` queries with ids `0..total` (question `id % MIXED.len()`),
/// `window` of them in flight at once; checks every answer against its question.
fn many_at_once(addr: std::net::SocketAddr, total: u16, window: u16) {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(addr).unwrap();
    sock.set_read_timeout(Some(patience())).unwrap();
    let ask = |id: u16| {
        let (name, qtype, ..) = MIXED[usize::from(id) % MIXED.len()];
        sock.send(&query(id, name, qtype)).unwrap();
    };
    let mut answered = vec![false; usize::from(total)];
    for id in 0..window.min(total) {
        ask(id);
    }
    let mut next = window.min(total);
    let mut buf = [0u8; 4096];
    for _ in 0..total {
        let n = sock.recv(&mut buf).expect("every query is answered");
        let a = Message::from_vec(&buf[..n]).expect("every answer parses");
        let id = a.metadata.id;
        let (name, qtype, rcode, answers) = MIXED[usize::from(id) % MIXED.len()];
        assert!(!answered[usize::from(id)], "one answer per query ({id})");
        answered[usize::from(id)] = true;
        assert_eq!(a.queries.len(), 1);
        assert_eq!(
            a.queries[0].name().to_ascii(),
            name,
            "the question of id {id}"
        );
        assert_eq!(a.queries[0].query_type(), qtype, "the question of id {id}");
        assert_eq!(a.metadata.response_code, rcode, "{name} {qtype}");
        assert_eq!(a.answers.len(), answers, "{name} {qtype}");
        if next < total {
            ask(next);
            next += 1;
        }
    }
}

/// Many queries in flight at once from several sockets (so a reader finds several queued
/// and takes them with one receive): every one is answered once, with its own id and
/// question, whichever reader and batch it went through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_queries_at_once_from_several_sockets_are_each_answered() {
    let cfg = DnsConfig {
        per_source_qps: 0,
        ..Default::default()
    };
    let (_table, dns, listener) = listening(&cfg).await;
    let addr = listener.addr();
    let clients: Vec<_> = (0..8)
        .map(|_| tokio::task::spawn_blocking(move || many_at_once(addr, 600, 24)))
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    // Each receive is counted with how many datagrams it took.
    let received = metric(&dns, "xce_dns_udp_batch_sum", "");
    let receives = metric(&dns, "xce_dns_udp_batch_count", "");
    println!("FIGURE dns udp batches: datagrams={received} receives={receives}");
    assert_eq!(received, 8.0 * 600.0);
}

/// A datagram longer than a reader's buffer (4,096 bytes; a query is a few dozen) is
/// answered FORMERR from its header, whatever follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_datagram_is_answered_formerr() {
    let (_table, _dns, listener) = listening(&DnsConfig::default()).await;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.connect(listener.addr()).unwrap();
    sock.set_read_timeout(Some(patience())).unwrap();
    let mut q = query(77, "web.default.xce.", RecordType::A);
    q.resize(5000, 0);
    let a = udp_ask(&sock, &q).expect("an answer");
    assert_eq!(a.metadata.id, 77);
    assert_eq!(a.metadata.response_code, ResponseCode::FormErr);
    legit_udp(&sock, 78);
}
