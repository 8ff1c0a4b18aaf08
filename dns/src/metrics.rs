//! `/metrics`: queries by transport, type and answer code; the answer latency; zone
//! rebuilds.

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::answer::{Answered, Transport};
use crate::cache::Outcome;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    transport: &'static str,
    qtype: &'static str,
    rcode: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    transport: &'static str,
    reason: &'static str,
}

/// The DNS server's metrics (cheap to clone: shared).
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    queries: Family<QueryLabels, Counter>,
    dropped: Family<DropLabels, Counter>,
    latency: Family<TransportLabel, Histogram>,
    pub(crate) rebuilds: Counter,
    pub(crate) services: Gauge,
    pub(crate) slipped: Counter,
    cache: Family<CacheLabel, Counter>,
    udp_batch: Histogram,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabel {
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    transport: &'static str,
}

impl Metrics {
    pub(crate) fn new() -> Self {
        Self {
            queries: Family::default(),
            dropped: Family::default(),
            // 10 µs to about 2.6 s.
            latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1e-5, 4.0, 10))
            }),
            rebuilds: Counter::default(),
            services: Gauge::default(),
            slipped: Counter::default(),
            cache: Family::default(),
            // 1 to 64 datagrams.
            udp_batch: Histogram::new(exponential_buckets(1.0, 2.0, 7)),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "xce_dns_queries",
            "DNS queries answered, by transport (udp, tcp, https), question type and answer code",
            self.queries.clone(),
        );
        registry.register(
            "xce_dns_dropped",
            "DNS packets not answered, by transport and reason (not_a_query, rate_limited, bad_frame)",
            self.dropped.clone(),
        );
        registry.register(
            "xce_dns_slipped",
            "UDP queries past the per-source rate answered with an empty truncated reply (TC) instead of dropped, so the client retries over TCP",
            self.slipped.clone(),
        );
        registry.register(
            "xce_dns_answer_cache",
            "Listener queries by what the zone's cache of encoded answers did: hit (copied), miss (computed, kept while there is room), bypass (not a plain query: computed)",
            self.cache.clone(),
        );
        registry.register(
            "xce_dns_answer_seconds",
            "Time from a DNS query's arrival to its answer being ready, by transport",
            self.latency.clone(),
        );
        registry.register(
            "xce_dns_udp_batch",
            "Datagrams a UDP reader took from its socket with one receive (recvmmsg on Linux: up to 32; 1 elsewhere)",
            self.udp_batch.clone(),
        );
        registry.register(
            "xce_dns_zone_rebuilds",
            "Rebuilds of the DNS zone, one per applied change of the endpoint table (coalesced)",
            self.rebuilds.clone(),
        );
        registry.register(
            "xce_dns_zone_services",
            "Services in the DNS zone as last built",
            self.services.clone(),
        );
    }

    pub(crate) fn answered(&self, transport: Transport, a: &Answered, seconds: f64) {
        let labels = QueryLabels {
            transport: transport.as_str(),
            qtype: a.qtype.map_or("none", qtype_label),
            rcode: rcode_label(a.rcode),
        };
        self.queries.get_or_create(&labels).inc();
        let transport = TransportLabel {
            transport: transport.as_str(),
        };
        self.latency.get_or_create(&transport).observe(seconds);
    }

    /// One receive of a UDP reader took `datagrams`.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn udp_batch(&self, datagrams: usize) {
        self.udp_batch.observe(datagrams as f64);
    }

    pub(crate) fn cache(&self, outcome: Outcome) {
        let result = match outcome {
            Outcome::Hit => "hit",
            Outcome::Miss => "miss",
            Outcome::Bypass => "bypass",
        };
        self.cache.get_or_create(&CacheLabel { result }).inc();
    }

    pub(crate) fn dropped(&self, transport: Transport, reason: &'static str) {
        let labels = DropLabels {
            transport: transport.as_str(),
            reason,
        };
        self.dropped.get_or_create(&labels).inc();
    }
}

/// A bounded label set: the types we serve by name, the rest as `other`.
fn qtype_label(t: RecordType) -> &'static str {
    match t {
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::SRV => "SRV",
        RecordType::SOA => "SOA",
        RecordType::NS => "NS",
        RecordType::ANY => "ANY",
        RecordType::TXT => "TXT",
        RecordType::PTR => "PTR",
        RecordType::CNAME => "CNAME",
        RecordType::HTTPS => "HTTPS",
        _ => "other",
    }
}

fn rcode_label(r: ResponseCode) -> &'static str {
    match r {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::Refused => "REFUSED",
        ResponseCode::BADVERS => "BADVERS",
        _ => "other",
    }
}
