//! DNS served from the endpoint table (docs/api.md "DNS", docs/design.md): A/AAAA for
//! `<service>.<project>.<domain>.`, SRV for `_<port>._<proto>.<service>.<project>.<domain>.`
//! with the hosts' addresses in the additional section, A/AAAA for
//! `<host>.host.<domain>.`, SOA and NS at the apex.
//!
//! Two layers:
//! - the pure core: a [`Zone`] built once per change of the table, and [`answer`], which
//!   answers one query's bytes as one [`View`] (a principal's grants) sees the zone;
//! - the edge (`server`): the UDP and TCP listeners, `GET|POST /dns-query`, the rebuild
//!   on every change of the table, metrics.
#![warn(missing_docs, unreachable_pub)]
#![forbid(unsafe_code)]

mod answer;
mod cache;
mod config;
mod doh;
mod encoded;
mod limit;
mod metrics;
#[cfg(target_os = "linux")]
mod mmsg;
mod server;
mod view;
mod zone;

pub use answer::{answer, Answered, Apex, Transport, MAX_UDP};
pub use config::{
    ConfigError, DnsConfig, DEFAULT_PER_SOURCE_QPS, DEFAULT_PRINCIPAL, DEFAULT_SLIP, MAX_SLIP,
    MAX_TTL, MAX_UDP_READERS,
};
pub use doh::{DnsApi, DNS_MESSAGE};
pub use server::{Dns, Listener};
pub use view::View;
pub use zone::{Zone, HOSTS_LABEL};

#[cfg(test)]
mod tests;
