//! Config files of `xced controller`, `xced apiserver` and `xced worker`: TOML, then `XCE_`-prefixed
//! environment (only the top-level scalar keys listed here), into validated types.
//!
//! The plugins' config sections (`[address]`, `[ports]`, `[endpoints]`) are the plugin
//! crates' own config types: the files are parsed here, in the wiring, because
//! the host's crates (`local-cluster/*`) do not know the plugins.

use anyhow::{bail, Context, Result};
use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 7480))
}
fn default_data_dir() -> PathBuf {
    PathBuf::from("xce-data")
}
fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// `xced controller --config FILE`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ControllerFile {
    #[serde(default = "default_listen")]
    pub(crate) listen: SocketAddr,
    #[serde(default = "default_data_dir")]
    pub(crate) data_dir: PathBuf,
    /// The tokens file (docs/rbac.md); `--tokens` overrides it.
    #[serde(default)]
    pub(crate) tokens: Option<PathBuf>,
    #[serde(default = "d_heartbeat", with = "humantime_serde")]
    pub(crate) heartbeat_interval: Duration,
    #[serde(default = "d_unreachable", with = "humantime_serde")]
    pub(crate) unreachable_after: Duration,
    #[serde(default = "d_grace", with = "humantime_serde")]
    pub(crate) grace_period: Duration,
    /// The full-disruption rule: see `xce_controller::DisruptionThreshold`
    /// (checked in [`load_controller`]).
    #[serde(default = "d_disruption_threshold")]
    pub(crate) disruption_threshold: f64,
    #[serde(default = "d_body_limit")]
    pub(crate) body_limit: usize,
    #[serde(default)]
    pub(crate) address: host_address::PolicyConfig,
    #[serde(default)]
    pub(crate) endpoints: endpoint_table::TableConfig,
    /// `[dns]`: the DNS server (see `xce_dns::DnsConfig`).
    #[serde(default)]
    pub(crate) dns: xce_dns::DnsConfig,
    /// `[connections]`: caps and timeouts of the API port (see `xce_serve`).
    #[serde(default)]
    pub(crate) connections: xce_serve::ConnLimits,
    /// `[quotas.default]`, `[quotas."team-a"]`: read raw, then checked whole (see
    /// [`quotas`]).
    #[serde(default)]
    pub(crate) quotas: Option<serde_json::Value>,
    /// `redb` (default) or `etcd://HOST:PORT[,HOST:PORT...]`; `--store` overrides it.
    #[serde(default, deserialize_with = "store_spec")]
    pub(crate) store: Option<xce_store::StoreSpec>,
    /// With the etcd store: the most operations the controller puts in one etcd
    /// transaction. Must not exceed etcd's `--max-txn-ops` (128 by default), which etcd
    /// refuses above; raised with it, a big change takes fewer transactions.
    #[serde(default = "d_max_txn_ops")]
    pub(crate) etcd_max_txn_ops: usize,
    /// The store format the controller writes (2 unless set; 3: the events of a batch
    /// refer to its job records, fewer bytes per placement on etcd). Set 3 only once
    /// every controller and apiserver runs a release that reads it (UPGRADING.md): a
    /// store never goes back, and older apiservers fail closed on it.
    #[serde(default = "d_store_format")]
    pub(crate) store_format: u64,
    /// With the etcd store: the lease TTL of the leader election (a standby takes over
    /// within about this long after the leader dies).
    #[serde(default = "d_leader_ttl", with = "humantime_serde")]
    pub(crate) leader_ttl: Duration,
    /// A leader that has not renewed its lease for this long steps down (2/3 of
    /// `leader_ttl` unless set).
    #[serde(default, with = "humantime_serde")]
    pub(crate) renew_deadline: Option<Duration>,
    /// The pause between lease renewals (a fifth of `renew_deadline` unless set).
    #[serde(default, with = "humantime_serde")]
    pub(crate) retry_period: Option<Duration>,
    /// With the etcd store: how long a draining replica's SIGTERM waits for the separate
    /// apiservers to apply its removal.
    #[serde(default = "d_drain_ack_timeout", with = "humantime_serde")]
    pub(crate) drain_ack_timeout: Duration,
    /// Serve TLS with this certificate chain (PEM), and `tls_key`: both or neither.
    #[serde(default)]
    pub(crate) tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub(crate) tls_key: Option<PathBuf>,
    /// `[metrics]`: `public = true` serves `/metrics` without a token.
    #[serde(default)]
    pub(crate) metrics: xce_serve::auth::MetricsConfig,
}

fn d_max_txn_ops() -> usize {
    xce_store::DEFAULT_MAX_TXN_OPS
}

fn d_store_format() -> u64 {
    xce_model::DEFAULT_STORE_FORMAT
}

fn d_drain_ack_timeout() -> Duration {
    xce_controller::DEFAULT_DRAIN_ACK_TIMEOUT
}

fn d_leader_ttl() -> Duration {
    xce_store::DEFAULT_LEADER_TTL
}

impl ControllerFile {
    /// The leader election's timings: what is set, the rest derived (see
    /// [`LeaseTimings::from_ttl`](xce_store::LeaseTimings::from_ttl)): only
    /// `leader_ttl = "3s"` gives a 2 s renew deadline and 400 ms retries; nothing set
    /// gives Kubernetes' 15 s, 10 s and 2 s.
    pub(crate) fn lease_timings(&self) -> xce_store::LeaseTimings {
        let derived = xce_store::LeaseTimings::from_ttl(self.leader_ttl);
        let renew_deadline = self.renew_deadline.unwrap_or(derived.renew_deadline);
        xce_store::LeaseTimings {
            ttl: self.leader_ttl,
            renew_deadline,
            retry_period: self.retry_period.unwrap_or(renew_deadline / 5),
        }
    }
}

fn store_spec<'de, D: Deserializer<'de>>(d: D) -> Result<Option<xce_store::StoreSpec>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(serde::de::Error::custom)
}

fn d_heartbeat() -> Duration {
    secs(1)
}
fn d_unreachable() -> Duration {
    secs(3)
}
fn d_grace() -> Duration {
    secs(30)
}
fn d_disruption_threshold() -> f64 {
    xce_controller::DisruptionThreshold::DEFAULT.get()
}
fn d_body_limit() -> usize {
    1 << 20
}

/// `xced apiserver --config FILE`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiserverFile {
    #[serde(default = "default_listen")]
    pub(crate) listen: SocketAddr,
    /// The tokens file (docs/rbac.md); `--tokens` overrides it.
    #[serde(default)]
    pub(crate) tokens: Option<PathBuf>,
    #[serde(default = "d_body_limit")]
    pub(crate) body_limit: usize,
    #[serde(default)]
    pub(crate) endpoints: endpoint_table::TableConfig,
    /// `[dns]`: the DNS server (see `xce_dns::DnsConfig`).
    #[serde(default)]
    pub(crate) dns: xce_dns::DnsConfig,
    /// `[connections]`: caps and timeouts of the API port (see `xce_serve`).
    #[serde(default)]
    pub(crate) connections: xce_serve::ConnLimits,
    /// The controller's store, `etcd://HOST:PORT[,HOST:PORT...]`; `--store` overrides it.
    #[serde(default, deserialize_with = "store_spec")]
    pub(crate) store: Option<xce_store::StoreSpec>,
    /// Serve TLS with this certificate chain (PEM), and `tls_key`: both or neither.
    #[serde(default)]
    pub(crate) tls_cert: Option<PathBuf>,
    #[serde(default)]
    pub(crate) tls_key: Option<PathBuf>,
    /// The controllers serve TLS: forward to the leader over `https://`.
    #[serde(default)]
    pub(crate) leader_tls: bool,
    /// The CA (PEM) that signed the controllers' certificates; the system's roots without.
    #[serde(default)]
    pub(crate) ca_file: Option<PathBuf>,
    /// `[metrics]`: `public = true` serves `/metrics` without a token.
    #[serde(default)]
    pub(crate) metrics: xce_serve::auth::MetricsConfig,
    /// Past this lag behind the store the apiserver fails closed (503 `stale`).
    #[serde(default = "d_max_lag", with = "humantime_serde")]
    pub(crate) max_lag: Duration,
}

fn d_max_lag() -> Duration {
    xce_apiserver::DEFAULT_MAX_LAG
}

/// The range `max_lag` must be in: long enough for a busy machine's store watch (and a
/// few probes of the store), short enough to be the bound it is meant to be.
const MAX_LAG_RANGE: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(60));

/// `xced worker --config FILE`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerFile {
    pub(crate) host: String,
    #[serde(default = "default_controller")]
    pub(crate) controller: String,
    /// The worker's own credential (its `[[worker]]` secret in the tokens file).
    #[serde(default)]
    pub(crate) credential: Option<String>,
    /// Or a file holding it.
    #[serde(default)]
    pub(crate) credential_file: Option<PathBuf>,
    #[serde(default = "default_data_dir")]
    pub(crate) data_dir: PathBuf,
    #[serde(default = "d_stop_timeout", with = "humantime_serde")]
    pub(crate) stop_timeout: Duration,
    #[serde(default = "d_facts_interval", with = "humantime_serde")]
    pub(crate) facts_interval: Duration,
    /// How long a replica the controller does not list keeps running before its stop.
    #[serde(default = "d_orphan_drain", with = "humantime_serde")]
    pub(crate) orphan_drain: Duration,
    /// On SIGTERM, drain the host before exiting (as `--leave`).
    #[serde(default)]
    pub(crate) leave_on_stop: bool,
    /// How long a leave waits for the drain before the worker exits anyway.
    #[serde(default = "d_leave_timeout", with = "humantime_serde")]
    pub(crate) leave_timeout: Duration,
    #[serde(default)]
    pub(crate) address: host_address::AddressConfig,
    #[serde(default)]
    pub(crate) ports: port_resource::WorkerPortsConfig,
    /// The CA (PEM) that signed the controllers' certificates, for `https://`
    /// controllers; the system's roots without.
    #[serde(default)]
    pub(crate) ca_file: Option<PathBuf>,
    /// `[replicas]`: how replicas run.
    #[serde(default)]
    pub(crate) replicas: ReplicasFile,
    /// `[logs]`: rotation and retention of replica logs.
    #[serde(default)]
    pub(crate) logs: LogsFile,
    /// `replicas` and `logs` checked and resolved (the user looked up) by [`load_worker`].
    #[serde(skip)]
    pub(crate) settings: xce_worker::ReplicaSettings,
}

/// `[replicas]` of the worker config.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplicasFile {
    /// Run replicas as this user (the worker must run as root).
    #[serde(default)]
    pub(crate) user: Option<String>,
}

/// `[logs]` of the worker config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LogsFile {
    /// The largest size of one log file, e.g. `"10MiB"`.
    #[serde(default = "d_max_size")]
    pub(crate) max_size: String,
    /// Files kept per replica log, the current one included.
    #[serde(default = "d_keep")]
    pub(crate) keep: u32,
    /// How long an ended job's logs stay.
    #[serde(default = "d_retain", with = "humantime_serde")]
    pub(crate) retain: Duration,
}

impl Default for LogsFile {
    fn default() -> Self {
        Self {
            max_size: d_max_size(),
            keep: d_keep(),
            retain: d_retain(),
        }
    }
}

fn d_max_size() -> String {
    "10MiB".to_owned()
}
fn d_keep() -> u32 {
    xce_worker::LogPolicy::default().keep
}
fn d_retain() -> Duration {
    xce_worker::LogPolicy::default().retain
}

fn default_controller() -> String {
    "http://127.0.0.1:7480".into()
}
fn d_stop_timeout() -> Duration {
    secs(10)
}
fn d_facts_interval() -> Duration {
    secs(30)
}
fn d_orphan_drain() -> Duration {
    xce_worker::DEFAULT_ORPHAN_DRAIN
}
fn d_leave_timeout() -> Duration {
    xce_worker::DEFAULT_LEAVE_TIMEOUT
}

const CONTROLLER_ENV: &[&str] = &[
    "listen",
    "data_dir",
    "tokens",
    "heartbeat_interval",
    "unreachable_after",
    "grace_period",
    "disruption_threshold",
    "body_limit",
    "store",
    "leader_ttl",
    "renew_deadline",
    "retry_period",
    "tls_cert",
    "tls_key",
];
const APISERVER_ENV: &[&str] = &[
    "listen",
    "tokens",
    "body_limit",
    "store",
    "tls_cert",
    "tls_key",
    "leader_tls",
    "ca_file",
];
const WORKER_ENV: &[&str] = &[
    "host",
    "controller",
    "credential",
    "credential_file",
    "data_dir",
    "stop_timeout",
    "facts_interval",
    "orphan_drain",
    "leave_on_stop",
    "leave_timeout",
    "ca_file",
];

fn figment(path: &Path, env_keys: &[&str]) -> Result<Figment> {
    if !path.exists() {
        bail!("config file {} does not exist", path.display());
    }
    report_unknown_env(env_keys);
    Ok(Figment::new()
        .merge(Toml::file_exact(path))
        .merge(Env::prefixed("XCE_").only(env_keys)))
}

/// `XCE_` variables of other programs (xcecli's, the log filter): not a daemon setting,
/// not a typo either.
const OTHER_ENV: &[&str] = &["LOG", "API", "TOKEN", "PROJECT", "CONFIG", "CA_FILE"];

/// An `XCE_` variable that matches no setting is logged (with a did-you-mean), not
/// silently ignored: `XCE_HEARTBEAT_INTERVALL` would otherwise change nothing and say
/// nothing.
fn report_unknown_env(env_keys: &[&str]) {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let Some(key) = name.strip_prefix("XCE_") else {
            continue;
        };
        let lower = key.to_ascii_lowercase();
        if env_keys.contains(&lower.as_str()) || OTHER_ENV.contains(&key) {
            continue;
        }
        let hint = did_you_mean(&lower, env_keys)
            .map(|k| format!(" (did you mean XCE_{}?)", k.to_ascii_uppercase()))
            .unwrap_or_default();
        tracing::warn!(
            "environment variable {name} matches no setting and is ignored{hint}; \
             the settings that the environment may set: {}",
            env_keys
                .iter()
                .map(|k| format!("XCE_{}", k.to_ascii_uppercase()))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The known name closest to `word`, if it is close (a typo, not another word).
fn did_you_mean<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(word, k), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance (small strings only).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Extracts a config, each problem on one line of its own: where (key path), what, and a
/// did-you-mean for an unknown key. Serde stops at the first problem inside a table, so
/// each offending key is taken out and the rest tried again, until every problem is
/// listed (bounded; a missing required key ends the search).
fn extract<T: serde::de::DeserializeOwned>(fig: Figment, what: &str, path: &Path) -> Result<T> {
    use figment::value::Value;
    let first = match fig.extract::<T>() {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let mut lines: Vec<String> = Vec::new();
    let mut removed: Vec<Vec<String>> = Vec::new();
    let mut next = Some(first);
    let mut merged: Option<Value> = fig.extract::<Value>().ok();
    for _ in 0..64 {
        let Some(err) = next.take() else { break };
        let mut progress = false;
        for e in err {
            let key = problem_key(&e);
            // A key this loop took out is reported already, not as "missing".
            if matches!(e.kind, figment::error::Kind::MissingField(_)) && removed.contains(&key) {
                continue;
            }
            lines.push(problem_line(&e));
            if let Some(v) = merged.as_mut() {
                if !key.is_empty() && !removed.contains(&key) && remove_key(v, &key) {
                    removed.push(key);
                    progress = true;
                }
            }
        }
        let Some(v) = merged.as_ref().filter(|_| progress) else {
            break;
        };
        next = Figment::from(figment::providers::Serialized::defaults(v))
            .extract::<T>()
            .err();
    }
    lines.dedup();
    Err(anyhow::anyhow!(
        "invalid {what} config {}:\n  {}",
        path.display(),
        lines.join("\n  ")
    ))
}

/// The key a problem is about: its path, plus the field for an unknown or missing one.
fn problem_key(e: &figment::Error) -> Vec<String> {
    let mut key = e.path.clone();
    let field = match &e.kind {
        figment::error::Kind::UnknownField(name, _) => Some(name.to_string()),
        figment::error::Kind::MissingField(name) => Some(name.to_string()),
        _ => None,
    };
    if let Some(name) = field {
        if key.last() != Some(&name) {
            key.push(name);
        }
    }
    key
}

fn problem_line(e: &figment::Error) -> String {
    let at = if e.path.is_empty() {
        String::new()
    } else {
        format!("{}: ", e.path.join("."))
    };
    let hint = match &e.kind {
        figment::error::Kind::UnknownField(name, expected) => did_you_mean(name, expected)
            .map(|k| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default(),
        _ => String::new(),
    };
    format!("{at}{}{hint}", e.kind)
}

/// Takes `key` (a path of table keys) out of `v`; whether it was there.
fn remove_key(v: &mut figment::value::Value, key: &[String]) -> bool {
    use figment::value::Value;
    let Some((last, parents)) = key.split_last() else {
        return false;
    };
    let mut cur = v;
    for k in parents {
        match cur {
            Value::Dict(_, d) => match d.get_mut(k) {
                Some(next) => cur = next,
                None => return false,
            },
            _ => return false,
        }
    }
    match cur {
        Value::Dict(_, d) => d.remove(last).is_some(),
        _ => false,
    }
}

/// The controller's `[quotas]`, every problem listed. The known quota names are the
/// host's (`services`, `replicas`) and the plugins' quantities (`ports`).
pub(crate) fn quotas(cfg: &ControllerFile) -> Result<xce_controller::quota::Quotas> {
    let Some(v) = &cfg.quotas else {
        return Ok(Default::default());
    };
    xce_controller::quota::Quotas::parse(v, &["ports"]).map_err(|errs| {
        let list: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        anyhow::anyhow!("{}", list.join("; "))
    })
}

/// `[connections]` as a whole: every problem in one error.
fn check_connections(path: &Path, what: &str, c: &xce_serve::ConnLimits) -> Result<()> {
    let problems = c.problems();
    if !problems.is_empty() {
        bail!(
            "invalid {what} config {}: {}",
            path.display(),
            problems.join("; ")
        );
    }
    Ok(())
}

/// `tls_cert` and `tls_key`: both (TLS) or neither (plain HTTP).
pub(crate) fn tls_files(
    path: &Path,
    what: &str,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
) -> Result<Option<xce_serve::TlsFiles>> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(xce_serve::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        })),
        (None, None) => Ok(None),
        (Some(_), None) => bail!(
            "invalid {what} config {}: tls_cert is set but tls_key is not (set both, or neither for plain HTTP)",
            path.display()
        ),
        (None, Some(_)) => bail!(
            "invalid {what} config {}: tls_key is set but tls_cert is not (set both, or neither for plain HTTP)",
            path.display()
        ),
    }
}

pub(crate) fn load_controller(path: &Path) -> Result<ControllerFile> {
    let cfg: ControllerFile = extract(figment(path, CONTROLLER_ENV)?, "controller", path)?;
    // The top-level settings' problems, all of them at once, one line each.
    let mut problems = cfg.lease_timings().problems();
    if cfg.grace_period <= cfg.unreachable_after {
        problems.push("grace_period must be longer than unreachable_after".to_owned());
    }
    if let Err(e) = cfg.threshold() {
        problems.push(e.to_string());
    }
    if cfg.drain_ack_timeout < xce_controller::MIN_DRAIN_ACK_TIMEOUT {
        problems
            .push(xce_controller::ConfigError::DrainAckTimeout(cfg.drain_ack_timeout).to_string());
    }
    if cfg.etcd_max_txn_ops < 2 {
        problems.push(format!(
            "etcd_max_txn_ops ({}) must be at least 2 (a change and its fence); etcd's \
             --max-txn-ops is 128 by default",
            cfg.etcd_max_txn_ops
        ));
    }
    if !(xce_model::OLDEST_WRITABLE_FORMAT..=xce_model::FORMAT).contains(&cfg.store_format) {
        problems.push(format!(
            "store_format ({}) must be between {} and {}: the store formats this release \
             writes",
            cfg.store_format,
            xce_model::OLDEST_WRITABLE_FORMAT,
            xce_model::FORMAT
        ));
    }
    if !problems.is_empty() {
        bail!(
            "invalid controller config {}:\n  {}",
            path.display(),
            problems.join("\n  ")
        );
    }
    cfg.endpoints
        .check()
        .with_context(|| format!("invalid controller config {}: [endpoints]", path.display()))?;
    cfg.dns
        .check()
        .with_context(|| format!("invalid controller config {}: [dns]", path.display()))?;
    check_connections(path, "controller", &cfg.connections)?;
    tls_files(path, "controller", &cfg.tls_cert, &cfg.tls_key)?;
    quotas(&cfg).with_context(|| format!("invalid controller config {}", path.display()))?;
    Ok(cfg)
}

pub(crate) fn load_apiserver(path: &Path) -> Result<ApiserverFile> {
    let cfg: ApiserverFile = extract(figment(path, APISERVER_ENV)?, "apiserver", path)?;
    cfg.endpoints
        .check()
        .with_context(|| format!("invalid apiserver config {}: [endpoints]", path.display()))?;
    cfg.dns
        .check()
        .with_context(|| format!("invalid apiserver config {}: [dns]", path.display()))?;
    check_connections(path, "apiserver", &cfg.connections)?;
    tls_files(path, "apiserver", &cfg.tls_cert, &cfg.tls_key)?;
    if cfg.max_lag < MAX_LAG_RANGE.0 || cfg.max_lag > MAX_LAG_RANGE.1 {
        bail!(
            "invalid apiserver config {}: max_lag: {} is outside {}..={} (the lag past which \
             the apiserver answers 503 stale)",
            path.display(),
            humantime::format_duration(cfg.max_lag),
            humantime::format_duration(MAX_LAG_RANGE.0),
            humantime::format_duration(MAX_LAG_RANGE.1),
        );
    }
    Ok(cfg)
}

pub(crate) fn load_worker(path: &Path) -> Result<WorkerFile> {
    let cfg: WorkerFile = extract(figment(path, WORKER_ENV)?, "worker", path)?;
    if cfg.credential.is_none() && cfg.credential_file.is_none() {
        bail!(
            "invalid worker config {}: set credential or credential_file",
            path.display()
        );
    }
    if cfg.leave_timeout.is_zero() {
        bail!(
            "invalid worker config {}: leave_timeout: must be more than 0 (how long a leave waits for the host's drain)",
            path.display()
        );
    }
    let mut cfg = cfg;
    cfg.settings = replica_settings(&cfg).map_err(|problems| {
        anyhow::anyhow!(
            "invalid worker config {}: {}",
            path.display(),
            problems.join("; ")
        )
    })?;
    Ok(cfg)
}

/// `[replicas]` and `[logs]` checked, every problem as `field: reason`.
fn replica_settings(cfg: &WorkerFile) -> Result<xce_worker::ReplicaSettings, Vec<String>> {
    let mut problems = Vec::new();
    let user = match &cfg.replicas.user {
        Some(name) => xce_worker::RunAs::lookup(name)
            .map_err(|e| problems.push(format!("replicas.user: {e}")))
            .ok(),
        None => None,
    };
    if let (Some(u), Some(file)) = (&cfg.replicas.user, &cfg.credential_file) {
        use std::os::unix::fs::PermissionsExt as _;
        if let Ok(meta) = std::fs::metadata(file) {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                problems.push(format!(
                    "credential_file: {} is mode {mode:o}, readable by others (the replicas run as {:?}): chmod 600 it",
                    file.display(),
                    u
                ));
            }
        }
    }
    let max_size = xce_worker::parse_size(&cfg.logs.max_size)
        .map_err(|e| problems.push(format!("logs.max_size: {e}")))
        .unwrap_or(u64::MAX);
    let logs = xce_worker::LogPolicy {
        max_size,
        keep: cfg.logs.keep,
        retain: cfg.logs.retain,
    };
    for (field, reason) in logs.problems() {
        problems.push(format!("logs.{field}: {reason}"));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(xce_worker::ReplicaSettings {
        user,
        logs,
        log_writer: None,
    })
}

impl ControllerFile {
    /// `disruption_threshold` as the controller takes it.
    pub(crate) fn threshold(
        &self,
    ) -> Result<xce_controller::DisruptionThreshold, xce_controller::ConfigError> {
        xce_controller::DisruptionThreshold::try_new(self.disruption_threshold)
    }
}

impl WorkerFile {
    pub(crate) fn credential(&self) -> Result<String> {
        match (&self.credential, &self.credential_file) {
            (Some(c), _) => Ok(c.clone()),
            (None, Some(f)) => Ok(std::fs::read_to_string(f)
                .with_context(|| format!("reading credential_file {}", f.display()))?
                .trim()
                .to_owned()),
            (None, None) => bail!("no worker credential configured"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_gets_a_did_you_mean() {
        assert_eq!(
            did_you_mean("heartbeat_intervall", CONTROLLER_ENV),
            Some("heartbeat_interval")
        );
        assert_eq!(did_you_mean("grace", CONTROLLER_ENV), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn lease_timings_default_like_kubernetes_derive_from_the_ttl_and_every_problem_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            match load_controller(&path) {
                Ok(cfg) => format!("{:?}", cfg.lease_timings()),
                Err(e) => e.to_string().replace(&path.display().to_string(), "FILE"),
            }
        };
        let out = [
            load(""),
            load("leader_ttl = \"3s\"\n"),
            load("leader_ttl = \"3s\"\nrenew_deadline = \"2500ms\"\n"),
            load("leader_ttl = \"1500ms\"\nrenew_deadline = \"5s\"\nretry_period = \"5s\"\n"),
        ]
        .join("\n");
        expect_test::expect![[r#"
            LeaseTimings { ttl: 15s, renew_deadline: 10s, retry_period: 2s }
            LeaseTimings { ttl: 3s, renew_deadline: 2s, retry_period: 400ms }
            LeaseTimings { ttl: 3s, renew_deadline: 2.5s, retry_period: 500ms }
            invalid controller config FILE:
              leader_ttl (1.5s) must be whole seconds, at least 1s (an etcd lease's TTL)
              renew_deadline (5s) must be shorter than leader_ttl (1.5s): a leader must step down before its lease can run out and a standby take over
              retry_period (5s) must be shorter than renew_deadline (5s): a leader must get more than one try before it steps down"#]].assert_eq(&out);
    }

    /// A `[dns]` section that cannot work is refused at load, naming the field; a good one
    /// is read into the DNS server's config type.
    #[test]
    fn the_dns_section_is_validated_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let load = |kind: &str, text: &str| {
            let path = dir.path().join(format!("{kind}.toml"));
            std::fs::write(&path, text).unwrap();
            let err = match kind {
                "controller" => load_controller(&path).map(|c| format!("{:?}", c.dns)),
                _ => load_apiserver(&path).map(|c| format!("{:?}", c.dns)),
            };
            err.unwrap_or_else(|e| format!("{e:#}"))
                .replace(&dir.path().display().to_string(), "DIR")
        };
        let ok = load(
            "controller",
            "[dns]\nlisten = \"127.0.0.1:8600\"\nttl = \"2s\"\n",
        );
        assert!(
            ok.contains("listen: Some(127.0.0.1:8600)") && ok.contains("ttl: 2s"),
            "{ok}"
        );
        assert_eq!(
            load("controller", "[dns]\nttl = \"1500ms\"\n"),
            "invalid controller config DIR/controller.toml: [dns]: dns.ttl 1s 500ms: DNS TTLs are whole seconds"
        );
        assert_eq!(
            load("apiserver", "[dns]\ndomain = \"Xce\"\n"),
            "invalid apiserver config DIR/apiserver.toml: [dns]: dns.domain \"Xce\": labels are lower-case letters, digits and inner '-'"
        );
    }

    #[test]
    fn a_problem_is_one_line_with_its_key_and_a_did_you_mean() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.toml");
        std::fs::write(&path, "heartbeat_intervall = \"1s\"\n").unwrap();
        let err = load_controller(&path).unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().skip(1).map(str::trim).collect();
        assert!(
            lines.iter().any(|l| l.contains("heartbeat_intervall")
                && l.contains("did you mean `heartbeat_interval`?")),
            "{err}"
        );
        assert!(lines.iter().all(|l| !l.is_empty()), "{err}");
    }

    /// Serde stops at a table's first problem; every problem of the file is listed
    /// anyway, each once, and a required key taken out is not reported as missing.
    #[test]
    fn every_problem_of_a_file_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.toml");
        std::fs::write(
            &path,
            "listen = \"x\"\nheartbeat_intervall = \"1s\"\ngrace_period = \"abc\"\n[address]\nfoo = 1\n",
        )
        .unwrap();
        let err = load_controller(&path).unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().skip(1).map(str::trim).collect();
        let keys: Vec<&str> = lines
            .iter()
            .map(|l| l.split(':').next().unwrap_or(""))
            .collect();
        assert_eq!(
            keys,
            [
                "address.foo",
                "grace_period",
                "heartbeat_intervall",
                "listen"
            ],
            "{err}"
        );

        let worker = dir.path().join("worker.toml");
        std::fs::write(&worker, "host = 7\nstop_timeout = \"x\"\n").unwrap();
        let err = load_worker(&worker).unwrap_err().to_string();
        assert!(
            err.contains("host:") && err.contains("stop_timeout:"),
            "{err}"
        );
        assert!(!err.contains("missing"), "{err}");
    }

    /// `leave_on_stop` and `leave_timeout`: read, defaulted, and a zero bound refused
    /// naming the field.
    #[test]
    fn worker_leave_settings_are_read_and_a_zero_timeout_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let worker = dir.path().join("worker.toml");
        let base = "host = \"exec-01\"\ncredential = \"0123456789abcdef0\"\n";
        std::fs::write(&worker, base).unwrap();
        let cfg = load_worker(&worker).unwrap();
        assert!(!cfg.leave_on_stop);
        assert_eq!(cfg.leave_timeout, xce_worker::DEFAULT_LEAVE_TIMEOUT);
        std::fs::write(
            &worker,
            format!("{base}leave_on_stop = true\nleave_timeout = \"90s\"\n"),
        )
        .unwrap();
        let cfg = load_worker(&worker).unwrap();
        assert!(cfg.leave_on_stop);
        assert_eq!(cfg.leave_timeout, Duration::from_secs(90));
        std::fs::write(&worker, format!("{base}leave_timeout = \"0s\"\n")).unwrap();
        let err = load_worker(&worker).unwrap_err().to_string();
        assert!(err.contains("leave_timeout: must be more than 0"), "{err}");
    }

    /// `[logs]` and `[replicas]`: every bad value named with its field and reason; good
    /// ones resolved (sizes in bytes, the user's ids).
    #[test]
    fn replica_settings_name_each_bad_field() {
        let dir = tempfile::tempdir().unwrap();
        let worker = dir.path().join("worker.toml");
        let load = |extra: &str| {
            std::fs::write(
                &worker,
                format!("host = \"exec-01\"\ncredential = \"c\"\n{extra}"),
            )
            .unwrap();
            load_worker(&worker)
        };
        let err = load("[logs]\nmax_size = \"10 parsecs\"\nkeep = 0\n[replicas]\nuser = \"no-such-user-xce\"\n")
            .unwrap_err()
            .to_string();
        for want in [
            "replicas.user: no user \"no-such-user-xce\" on this host",
            "logs.max_size: unknown unit",
            "logs.keep: 0 is not between 1 and 100",
        ] {
            assert!(err.contains(want), "{want:?} in {err}");
        }
        let err = load("[logs]\nmax_size = \"100\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("logs.max_size: 100 bytes is below"), "{err}");
        let err = load("[logs]\nrotate = true\n").unwrap_err().to_string();
        assert!(err.contains("rotate"), "{err}");
        let cfg = load(
            "[logs]\nmax_size = \"2MiB\"\nkeep = 5\nretain = \"1h\"\n[replicas]\nuser = \"root\"\n",
        )
        .unwrap();
        assert_eq!(cfg.settings.logs.max_size, 2 << 20);
        assert_eq!(cfg.settings.logs.keep, 5);
        assert_eq!(cfg.settings.logs.retain, Duration::from_secs(3600));
        assert_eq!(cfg.settings.user.map(|u| u.uid), Some(0));
        let cfg = load("").unwrap();
        assert_eq!(cfg.settings.logs, xce_worker::LogPolicy::default());
        assert!(cfg.settings.user.is_none());
    }

    #[test]
    fn every_top_level_problem_is_named_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("controller.toml");
        std::fs::write(
            &path,
            "grace_period = \"2s\"\nunreachable_after = \"3s\"\ndisruption_threshold = 1.5\n\
             etcd_max_txn_ops = 1\nstore_format = 4\n",
        )
        .unwrap();
        let err = load_controller(&path).unwrap_err().to_string();
        let lines: Vec<&str> = err.lines().skip(1).map(str::trim).collect();
        assert_eq!(
            lines,
            [
                "grace_period must be longer than unreachable_after",
                "disruption_threshold (1.5) must be more than 0 and at most 1 (1 turns the full-disruption rule off)",
                "etcd_max_txn_ops (1) must be at least 2 (a change and its fence); etcd's --max-txn-ops is 128 by default",
                "store_format (4) must be between 2 and 3: the store formats this release writes",
            ],
            "{err}"
        );
        // A whole number is a share too; 1 turns the rule off.
        std::fs::write(&path, "disruption_threshold = 1\n").unwrap();
        let cfg = load_controller(&path).unwrap();
        assert_eq!(cfg.threshold().unwrap().get(), 1.0);
        std::fs::write(&path, "").unwrap();
        let cfg = load_controller(&path).unwrap();
        assert_eq!(cfg.threshold().unwrap().get(), 0.55);
        assert_eq!(cfg.etcd_max_txn_ops, 128, "etcd's own default");
        std::fs::write(&path, "etcd_max_txn_ops = 1024\n").unwrap();
        assert_eq!(load_controller(&path).unwrap().etcd_max_txn_ops, 1024);
        assert_eq!(
            cfg.store_format, 2,
            "what the previous release's apiservers read"
        );
        std::fs::write(&path, "store_format = 3\n").unwrap();
        assert_eq!(load_controller(&path).unwrap().store_format, 3);
    }

    /// `max_lag` (apiserver) and `drain_ack_timeout` (controller): defaults, and values
    /// that would break the bound refused with the key named.
    #[test]
    fn freshness_bounds_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let ctl = dir.path().join("controller.toml");
        std::fs::write(&ctl, "").unwrap();
        let cfg = load_controller(&ctl).unwrap();
        assert_eq!(cfg.drain_ack_timeout, Duration::from_secs(10));
        std::fs::write(&ctl, "drain_ack_timeout = \"3s\"\n").unwrap();
        let err = load_controller(&ctl).unwrap_err().to_string();
        assert!(
            err.contains("drain_ack_timeout (3s) must be at least 4s"),
            "{err}"
        );
        let api = dir.path().join("apiserver.toml");
        std::fs::write(&api, "").unwrap();
        assert_eq!(
            load_apiserver(&api).unwrap().max_lag,
            Duration::from_secs(2)
        );
        std::fs::write(&api, "max_lag = \"100ms\"\n").unwrap();
        let err = load_apiserver(&api).unwrap_err().to_string();
        assert!(
            err.contains("max_lag: 100ms is outside 500ms..=1m"),
            "{err}"
        );
    }
}
