//! `[dns]`: where the DNS listener listens, its zone and whom it answers as. The host
//! reads it from its TOML file and passes it in, checked by [`DnsConfig::check`].

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;

/// The DNS server's configuration.
///
/// ```toml
/// [dns]
/// listen = "127.0.0.1:8600"   # UDP and TCP; unset: no DNS listener
/// domain = "xce"
/// ttl = "1s"
/// principal = "dns"
/// per_source_qps = 5000
/// # udp_readers = 2         # unset: one per worker thread
/// slip = 2
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// The address of the UDP and TCP listeners; `None`: no listener (`/dns-query` is
    /// served anyway, as the caller's token).
    pub listen: Option<SocketAddr>,
    /// The zone's apex: names are `<service>.<project>.<domain>.`.
    pub domain: String,
    /// The TTL of every record, and the SOA minimum (how long negative answers are
    /// cached). Whole seconds.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// The principal (of the tokens file) the UDP and TCP listeners answer as: a name
    /// of a project it may not view answers like a name that does not exist.
    pub principal: String,
    /// UDP queries per second answered per source address (a token bucket with a burst
    /// of one second's worth); past it a source's queries are dropped and counted
    /// (`xce_dns_dropped_total{reason="rate_limited"}`). 0: no limit.
    pub per_source_qps: u32,
    /// Tasks receiving and answering UDP queries, each on its own `SO_REUSEPORT` socket
    /// of the listen address (the kernel spreads sources over them). `None`: one per
    /// worker thread of the runtime (`XCED_WORKER_THREADS`, by default the cores).
    pub udp_readers: Option<u16>,
    /// Of a source's queries past `per_source_qps`, every `slip`-th is answered with an
    /// empty truncated reply (TC) instead of dropped, so a real client whose address a
    /// flood forges retries over TCP and is answered (BIND's RRL `slip`); counted in
    /// `xce_dns_slipped_total`. 1: every one; 0: drop them all. At most 10.
    pub slip: u8,
}

/// The principal a listener answers as when `principal` is not set. DNS has no
/// credentials, so whatever this principal may view, anyone who reaches the port may
/// read: it is a name the operator gives grants to on purpose, never an existing
/// person's or an admin's by default.
pub const DEFAULT_PRINCIPAL: &str = "dns";

/// `per_source_qps` when not set: far above what one resolver or client sends, far below
/// what one core answers, so a single flooding address takes at most a share.
pub const DEFAULT_PER_SOURCE_QPS: u32 = 5000;

/// The most `udp_readers` accepted: past the cores of any machine we run on, more
/// sockets only split the same work finer.
pub const MAX_UDP_READERS: u16 = 64;

/// `slip` when not set: half of the refused queries are answered truncated (BIND's
/// default), the other half dropped; a forged flood is reflected at half its size, with
/// a reply no bigger than the query.
pub const DEFAULT_SLIP: u8 = 2;

/// The largest `slip` accepted (as BIND): past it a client retrying through a flood waits
/// for too many of its own retransmissions.
pub const MAX_SLIP: u8 = 10;

/// The longest `ttl` accepted: past a day a cached answer outlives any rollout.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            listen: None,
            domain: "xce".into(),
            ttl: Duration::from_secs(1),
            principal: DEFAULT_PRINCIPAL.into(),
            per_source_qps: DEFAULT_PER_SOURCE_QPS,
            udp_readers: None,
            slip: DEFAULT_SLIP,
        }
    }
}

/// A `[dns]` section that cannot work; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `domain` is not a DNS name we can serve.
    #[error("dns.domain {domain:?}: {reason}")]
    Domain {
        /// The value given.
        domain: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// `ttl` is not whole seconds within the bounds.
    #[error("dns.ttl {ttl}: {reason}")]
    Ttl {
        /// The value given, formatted.
        ttl: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// `principal` is empty.
    #[error("dns.principal: must name a principal of the tokens file")]
    Principal,
    /// `udp_readers` is out of bounds.
    #[error("dns.udp_readers {0}: must be 1 to {MAX_UDP_READERS} (unset: one per worker thread)")]
    UdpReaders(u16),
    /// `slip` is too large.
    #[error("dns.slip {0}: must be 0 (always drop) to {MAX_SLIP}")]
    Slip(u8),
}

impl DnsConfig {
    /// Checks the section as a whole.
    pub fn check(&self) -> Result<(), ConfigError> {
        check_domain(&self.domain).map_err(|reason| ConfigError::Domain {
            domain: self.domain.clone(),
            reason,
        })?;
        let ttl_error = |reason| ConfigError::Ttl {
            ttl: humantime::format_duration(self.ttl).to_string(),
            reason,
        };
        if self.ttl.subsec_nanos() != 0 {
            return Err(ttl_error("DNS TTLs are whole seconds"));
        }
        if self.ttl > MAX_TTL {
            return Err(ttl_error("at most 1 day"));
        }
        if self.principal.trim().is_empty() {
            return Err(ConfigError::Principal);
        }
        if let Some(n) = self
            .udp_readers
            .filter(|n| !(1..=MAX_UDP_READERS).contains(n))
        {
            return Err(ConfigError::UdpReaders(n));
        }
        if self.slip > MAX_SLIP {
            return Err(ConfigError::Slip(self.slip));
        }
        Ok(())
    }

    /// `ttl` in seconds, as records carry it.
    pub fn ttl_secs(&self) -> u32 {
        u32::try_from(self.ttl.as_secs()).unwrap_or(u32::MAX)
    }
}

/// Lower-case letters, digits and `-` in labels of 1-63 characters, not starting or
/// ending with `-`, dot-separated, at most 200 characters in all (room for the names
/// under it).
fn check_domain(domain: &str) -> Result<(), &'static str> {
    let domain = domain.strip_suffix('.').unwrap_or(domain);
    if domain.is_empty() {
        return Err("must not be empty (a zone at the root would answer for every name)");
    }
    if domain.len() > 200 {
        return Err("longer than 200 characters");
    }
    for label in domain.split('.') {
        let ok_chars = label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if label.is_empty() || label.len() > 63 {
            return Err("every label must have 1 to 63 characters");
        }
        if !ok_chars || label.starts_with('-') || label.ends_with('-') {
            return Err("labels are lower-case letters, digits and inner '-'");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> String {
        match toml::from_str::<DnsConfig>(text) {
            Err(e) => format!("parse error: {}", e.message()),
            Ok(cfg) => match cfg.check() {
                Ok(()) => format!("{cfg:?}"),
                Err(e) => format!("invalid: {e}"),
            },
        }
    }

    #[test]
    fn defaults_and_errors_name_the_field() {
        assert_eq!(
            check(""),
            "DnsConfig { listen: None, domain: \"xce\", ttl: 1s, principal: \"dns\", per_source_qps: 5000, udp_readers: None, slip: 2 }"
        );
        assert_eq!(
            check("listen = \"127.0.0.1:8600\"\ndomain = \"svc.example\"\nttl = \"5s\""),
            "DnsConfig { listen: Some(127.0.0.1:8600), domain: \"svc.example\", ttl: 5s, principal: \"dns\", per_source_qps: 5000, udp_readers: None, slip: 2 }"
        );
        assert_eq!(
            check("domain = \"Bad_Zone\""),
            "invalid: dns.domain \"Bad_Zone\": labels are lower-case letters, digits and inner '-'"
        );
        assert_eq!(
            check("domain = \"\""),
            "invalid: dns.domain \"\": must not be empty (a zone at the root would answer for every name)"
        );
        assert_eq!(
            check("ttl = \"1500ms\""),
            "invalid: dns.ttl 1s 500ms: DNS TTLs are whole seconds"
        );
        assert_eq!(
            check("ttl = \"2days\""),
            "invalid: dns.ttl 2days: at most 1 day"
        );
        assert_eq!(
            check("principal = \" \""),
            "invalid: dns.principal: must name a principal of the tokens file"
        );
        assert_eq!(
            check("listen = \"nowhere\""),
            "parse error: invalid socket address syntax"
        );
        assert_eq!(
            check("udp_readers = 0"),
            "invalid: dns.udp_readers 0: must be 1 to 64 (unset: one per worker thread)"
        );
        assert_eq!(
            check("udp_readers = 65"),
            "invalid: dns.udp_readers 65: must be 1 to 64 (unset: one per worker thread)"
        );
        assert!(check("udp_readers = 4").ends_with("udp_readers: Some(4), slip: 2 }"));
        assert!(check("slip = 0").ends_with("slip: 0 }"));
        assert_eq!(
            check("slip = 11"),
            "invalid: dns.slip 11: must be 0 (always drop) to 10"
        );
        assert!(check("lisen = \"x\"").starts_with("parse error: unknown field `lisen`"));
    }
}
