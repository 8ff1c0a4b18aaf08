//! The host's part of a service profile (docs/profile.md): name, project, replicas, command,
//! readiness. Sections owned by resource plugins (e.g. `ports`) are validated by the
//! plugins; this module only routes them and rejects keys nobody owns.
//!
//! Validation collects every problem (field path + reason) so a profile is rejected whole.

use plugin_api::{FieldError, ResourcePlugin};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;

/// How the worker probes a replica's readiness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// The probe.
    pub probe: Probe,
    /// Time between probes.
    #[serde(with = "millis")]
    pub interval: Duration,
    /// Time one probe may take.
    #[serde(with = "millis")]
    pub timeout: Duration,
    /// Failed probes in a row that make a ready replica unready (one slow answer of a
    /// loaded replica need not take it out of its endpoint).
    #[serde(default = "one")]
    pub failure_threshold: u32,
    /// Successful probes in a row that make an unready replica ready.
    #[serde(default = "one")]
    pub success_threshold: u32,
}

/// Records stored before the thresholds existed meant one probe either way.
fn one() -> u32 {
    1
}

/// The largest `failure_threshold` / `success_threshold`.
pub const MAX_PROBE_THRESHOLD: u32 = 100;

/// A readiness probe. Socket names are the names a resource plugin declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Probe {
    /// Ready when a TCP connection to the named socket succeeds.
    Tcp {
        /// Socket name.
        socket: String,
    },
    /// Ready when `GET path` on the named socket answers 2xx or 3xx.
    Http {
        /// Socket name.
        socket: String,
        /// Request path.
        path: String,
    },
}

/// Probe timings on the wire (stored assignments, the worker protocol, the worker's
/// `jobs.json`) are whole milliseconds, not humantime strings: the users' `"2s"` is parsed
/// once by [`validate`], and the stored format stays what it is.
mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// A validated profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// Service name.
    pub name: String,
    /// Project.
    pub project: String,
    /// Replica count.
    pub replicas: u32,
    /// argv. An `Arc`: every assignment of the generation shares it (thousands of
    /// replicas, one copy).
    pub command: Arc<Vec<String>>,
    /// Readiness probe, if any; shared like `command`.
    pub readiness: Option<Arc<Readiness>>,
    /// Time between a replica leaving the endpoint and its SIGTERM (`service.drain`).
    pub drain: Duration,
    /// How a changed profile rolls out (`[service.update]`).
    pub update: UpdatePolicy,
    /// `[service.meta]`: free string labels (validated by `meta`).
    pub meta: std::collections::BTreeMap<String, String>,
    /// `[service.env]`: the replicas' own environment variables (validated by `env`);
    /// shared like `command`.
    pub env: Arc<std::collections::BTreeMap<String, String>>,
    /// What one replica takes of the plugins' resources (for quotas), by name.
    pub quantities: std::collections::BTreeMap<String, u64>,
    /// The whole `[service]` table as JSON (plugin sections included), as stored.
    pub raw: Value,
}

/// `[service.update]`: how a changed profile replaces the running replicas (docs/profile.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdatePolicy {
    /// Replicas above `replicas` a rollout may place.
    pub max_surge: u32,
    /// Ready replicas below `replicas` a rollout may cause.
    pub max_unavailable: u32,
    /// How long a new replica must have been ready before an old one drains.
    pub min_ready: Duration,
    /// No progress for this long: the rollout has failed.
    pub deadline: Duration,
    /// A failed rollout rolls back to the last complete generation's profile.
    pub auto_revert: bool,
}

impl Default for UpdatePolicy {
    fn default() -> Self {
        UpdatePolicy {
            max_surge: 1,
            max_unavailable: 0,
            min_ready: DEFAULT_MIN_READY,
            deadline: Duration::from_secs(300),
            auto_revert: true,
        }
    }
}

/// `service.update.min_ready` when the profile does not say (Nomad's
/// `min_healthy_time`): a new replica replaces an old one only once it has been ready
/// this long, and a service without a readiness check is ready as soon as its process
/// runs, so without it a command that dies after a few seconds "completed" its rollout.
pub const DEFAULT_MIN_READY: Duration = Duration::from_secs(10);
/// `service.drain` when the profile does not say.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// The longest `drain`, `min_ready` or `deadline` a profile may ask for.
const MAX_ROLLOUT_DURATION: Duration = Duration::from_secs(3600);

/// The most replicas one service may ask for.
pub const MAX_REPLICAS: u64 = 10_000;

/// The largest profile accepted, in bytes: as sent (JSON or TOML), and as JSON once
/// parsed (what the store keeps). A service's record holds its profile, and a change to a
/// service is one store transaction, which on etcd must fit one request (1.5 MiB by
/// default) with the record's other fields and encodings: 256 KiB leaves that room.
pub const MAX_PROFILE_BYTES: usize = 256 * 1024;

const HOST_KEYS: &[&str] = &[
    "name",
    "project",
    "replicas",
    "command",
    "readiness",
    "drain",
    "update",
    "meta",
    "env",
];

/// The parts of a profile that do not change what a replica runs: a change of only these
/// makes no new generation (a scale, new rollout settings, or new `meta` labels apply in
/// place). `meta` is here because a replica never sees its labels (they are not in its
/// environment): they label the endpoint entry and the Prometheus targets, which change at
/// once. Restarting every replica to relabel it would be a rollout for nothing — Nomad
/// also updates `meta` in place.
pub const NOT_TEMPLATE_KEYS: &[&str] = &["replicas", "drain", "update", "meta"];

/// A stored profile's `drain` (its `[service]` table as JSON, validated when it was
/// stored): [`DEFAULT_DRAIN`] when it names none.
pub fn drain_of(service: &Value) -> Duration {
    let mut ignored = Vec::new();
    let limits = (Duration::ZERO, MAX_ROLLOUT_DURATION);
    duration(
        "service.drain",
        service.get("drain"),
        DEFAULT_DRAIN,
        limits,
        &mut ignored,
    )
}

/// Parses a TOML profile into its JSON form (`{"service": {...}}`).
pub fn toml_to_json(text: &str) -> Result<Value, FieldError> {
    let v: toml::Value = toml::from_str(text).map_err(|e| {
        FieldError::new(
            "profile",
            format!("not valid TOML: {}", e.message().trim_end_matches('.')),
        )
    })?;
    serde_json::to_value(v).map_err(|e| FieldError::new("profile", e.to_string()))
}

/// Asks every plugin whether `replicas` replicas of the service whose `[service]` table
/// is `raw` could ever be held by the cluster at once
/// ([`ResourcePlugin::check_replicas`]): a submit or a scale asking for more than every
/// host together offers is refused, with each plugin's problems. Not part of
/// [`validate`], which also reads stored profiles back: a stored service stays loadable
/// after hosts leave.
pub fn check_replicas(
    raw: &Value,
    replicas: u32,
    plugins: &[&dyn ResourcePlugin],
) -> Result<(), Vec<FieldError>> {
    let mut errs = Vec::new();
    for p in plugins {
        if let Err(mut e) = p.check_replicas(raw.get(p.name()), replicas) {
            errs.append(&mut e);
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

/// Validates a whole profile (`{"service": {...}}`) with the host's rules and every
/// plugin's, collecting every problem.
pub fn validate(doc: &Value, plugins: &[&dyn ResourcePlugin]) -> Result<Profile, Vec<FieldError>> {
    let mut errs = Vec::new();
    let Some(top) = doc.as_object() else {
        return Err(vec![FieldError::new(
            "profile",
            "must be a table/object with a [service] table",
        )]);
    };
    // A missing or malformed [service] reads as an empty one, so that every other
    // problem is still listed.
    let empty = Map::new();
    let svc = service_table(top, &mut errs).unwrap_or(&empty);
    unknown_service_keys(svc, plugins, &mut errs);

    let name = service_name(svc.get("name"), top.contains_key("service"), &mut errs);
    let project = match svc.get("project") {
        None => "default".to_owned(),
        Some(v) => checked_name("service.project", v, &mut errs),
    };
    let replicas = parse_replicas(svc.get("replicas"), &mut errs);
    let command = parse_command(svc.get("command"), &mut errs);

    // Plugins validate their own sections and tell us which socket names exist.
    let sections = plugin_sections(svc, plugins, &mut errs);

    let readiness = match svc.get("readiness") {
        None => None,
        Some(Value::Object(r)) => parse_readiness(r, &sections.sockets, &mut errs),
        Some(_) => {
            errs.push(FieldError::new("service.readiness", "must be a table"));
            None
        }
    };

    let drain = duration(
        "service.drain",
        svc.get("drain"),
        DEFAULT_DRAIN,
        (Duration::ZERO, MAX_ROLLOUT_DURATION),
        &mut errs,
    );
    let update = match svc.get("update") {
        None => UpdatePolicy::default(),
        Some(Value::Object(u)) => parse_update(u, &mut errs),
        Some(_) => {
            errs.push(FieldError::new("service.update", "must be a table"));
            UpdatePolicy::default()
        }
    };

    let meta = meta::parse(svc.get("meta"), &mut errs);
    let env = env::parse(svc.get("env"), &mut errs);

    if errs.is_empty() {
        Ok(Profile {
            name,
            project,
            replicas,
            command: Arc::new(command),
            readiness: readiness.map(Arc::new),
            drain,
            update,
            meta,
            env: Arc::new(env),
            quantities: sections.quantities,
            raw: Value::Object(svc.clone()),
        })
    } else {
        Err(errs)
    }
}

/// The `[service]` table of the document, `None` when it is missing or no table; lists
/// the document's other (unknown) keys.
fn service_table<'a>(
    top: &'a Map<String, Value>,
    errs: &mut Vec<FieldError>,
) -> Option<&'a Map<String, Value>> {
    for k in top.keys() {
        if k != "service" {
            errs.push(FieldError::new(k.clone(), "unknown field"));
        }
    }
    match top.get("service") {
        Some(Value::Object(m)) => Some(m),
        Some(_) => {
            errs.push(FieldError::new("service", "must be a table"));
            None
        }
        None => {
            errs.push(FieldError::new("service", "missing"));
            None
        }
    }
}

/// Lists the keys of `[service]` that neither the host nor a plugin owns.
fn unknown_service_keys(
    svc: &Map<String, Value>,
    plugins: &[&dyn ResourcePlugin],
    errs: &mut Vec<FieldError>,
) {
    for k in svc.keys() {
        if !HOST_KEYS.contains(&k.as_str()) && !plugins.iter().any(|p| p.name() == k) {
            errs.push(FieldError::new(format!("service.{k}"), "unknown field"));
        }
    }
}

/// `service.name`, required; its absence is a problem of its own only when `[service]`
/// was given (else "service: missing" says it all).
fn service_name(v: Option<&Value>, service_given: bool, errs: &mut Vec<FieldError>) -> String {
    match v {
        Some(v) => checked_name("service.name", v, errs),
        None => {
            if service_given {
                errs.push(FieldError::new("service.name", "missing"));
            }
            String::new()
        }
    }
}

/// A service or project name (`field` says which); empty when it is no valid name.
fn checked_name(field: &str, v: &Value, errs: &mut Vec<FieldError>) -> String {
    match v {
        Value::String(s) => match plugin_api::check_name(s) {
            Ok(()) => s.clone(),
            Err(reason) => {
                errs.push(FieldError::new(field, reason.to_string()));
                String::new()
            }
        },
        _ => {
            errs.push(FieldError::new(field, "must be a string"));
            String::new()
        }
    }
}

/// `service.replicas`: 1 when absent, 0 when invalid.
fn parse_replicas(v: Option<&Value>, errs: &mut Vec<FieldError>) -> u32 {
    let Some(v) = v else {
        return 1;
    };
    match v.as_u64() {
        Some(n) if (1..=MAX_REPLICAS).contains(&n) => n as u32,
        // An integer out of range (negative ones included) is told apart from no integer.
        Some(_) | None if v.is_i64() || v.is_u64() => {
            errs.push(FieldError::new(
                "service.replicas",
                format!("must be between 1 and {MAX_REPLICAS}"),
            ));
            0
        }
        _ => {
            errs.push(FieldError::new("service.replicas", "must be an integer"));
            0
        }
    }
}

/// `service.command`: the argv, each bad item listed (the good ones are kept).
fn parse_command(v: Option<&Value>, errs: &mut Vec<FieldError>) -> Vec<String> {
    match v {
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut out = Vec::new();
            for (i, it) in items.iter().enumerate() {
                match it.as_str() {
                    Some(s) if s.contains('\0') => errs.push(FieldError::new(
                        format!("service.command[{i}]"),
                        "must not contain NUL",
                    )),
                    Some(s) => out.push(s.to_owned()),
                    None => errs.push(FieldError::new(
                        format!("service.command[{i}]"),
                        "must be a string",
                    )),
                }
            }
            if out.first().is_some_and(|s| s.is_empty()) {
                errs.push(FieldError::new("service.command[0]", "must not be empty"));
            }
            out
        }
        Some(Value::Array(_)) => {
            errs.push(FieldError::new("service.command", "must not be empty"));
            Vec::new()
        }
        Some(_) => {
            errs.push(FieldError::new(
                "service.command",
                "must be an array of strings",
            ));
            Vec::new()
        }
        None => {
            errs.push(FieldError::new("service.command", "missing"));
            Vec::new()
        }
    }
}

/// What the plugins said of their sections of a profile.
struct PluginSections {
    /// The socket names they declare.
    sockets: DeclaredSockets,
    /// What one replica takes of their resources, summed by name.
    quantities: std::collections::BTreeMap<String, u64>,
}

/// Has every plugin validate its section, listing their problems.
fn plugin_sections(
    svc: &Map<String, Value>,
    plugins: &[&dyn ResourcePlugin],
    errs: &mut Vec<FieldError>,
) -> PluginSections {
    let mut sockets = DeclaredSockets::default();
    let mut quantities = std::collections::BTreeMap::new();
    for p in plugins {
        match p.validate(svc.get(p.name())) {
            Ok(info) => {
                sockets.names.extend(info.socket_names);
                for (k, n) in info.quantities {
                    *quantities.entry(k).or_insert(0) += n;
                }
            }
            Err(mut e) => {
                errs.append(&mut e);
                // A refused section (say, more ports than a host holds) still declares its
                // names when they can be read: without them a correct probe reference
                // would be reported as a second, false problem.
                match p.socket_names(svc.get(p.name())) {
                    Some(names) => sockets.names.extend(names),
                    None => sockets.complete = false,
                }
            }
        }
    }
    PluginSections {
        sockets,
        quantities,
    }
}

/// The socket names the plugins declared, which readiness probes may reference.
#[derive(Debug)]
struct DeclaredSockets {
    names: Vec<String>,
    /// False when some plugin refused its section without telling its names: a name
    /// missing from `names` may then be declared there, so it is no problem of its own.
    complete: bool,
}

impl Default for DeclaredSockets {
    fn default() -> Self {
        DeclaredSockets {
            names: Vec::new(),
            complete: true,
        }
    }
}

impl DeclaredSockets {
    /// The socket a probe field (`field`) names; a problem is listed unless it is a
    /// declared one.
    fn check(&self, field: &str, v: Option<&Value>, errs: &mut Vec<FieldError>) -> String {
        match v.and_then(Value::as_str) {
            Some(s) if self.names.iter().any(|n| n == s) => s.to_owned(),
            // The profile is refused for its plugin section anyway.
            Some(s) if !self.complete => s.to_owned(),
            Some(s) => {
                errs.push(FieldError::new(
                    field,
                    format!("names no declared port: {s:?}"),
                ));
                String::new()
            }
            None => {
                errs.push(FieldError::new(
                    field,
                    "must be the name of a declared port",
                ));
                String::new()
            }
        }
    }
}

/// The keys `[service.readiness]` may have.
const READINESS_KEYS: &[&str] = &[
    "tcp",
    "http",
    "interval",
    "timeout",
    "failure_threshold",
    "success_threshold",
];

/// `[service.readiness]`; `None` when it has any problem (each listed).
fn parse_readiness(
    r: &Map<String, Value>,
    sockets: &DeclaredSockets,
    errs: &mut Vec<FieldError>,
) -> Option<Readiness> {
    let before = errs.len();
    unknown_fields(r, READINESS_KEYS, "service.readiness", errs);
    let probe = parse_probe(r, sockets, errs);
    let probe_range = (Duration::from_millis(100), Duration::from_secs(3600));
    let interval = duration(
        "service.readiness.interval",
        r.get("interval"),
        Duration::from_secs(1),
        probe_range,
        errs,
    );
    // A probe may not outlast its interval, nor a second by default.
    let timeout = duration(
        "service.readiness.timeout",
        r.get("timeout"),
        interval.min(Duration::from_secs(1)),
        probe_range,
        errs,
    );
    let failure_threshold = probe_threshold(r, "failure_threshold", errs);
    let success_threshold = probe_threshold(r, "success_threshold", errs);
    if errs.len() > before {
        return None;
    }
    probe.map(|probe| Readiness {
        probe,
        interval,
        timeout,
        failure_threshold,
        success_threshold,
    })
}

/// Lists the keys of `table` (at `path`) not in `known`.
fn unknown_fields(
    table: &Map<String, Value>,
    known: &[&str],
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    for k in table.keys() {
        if !known.contains(&k.as_str()) {
            errs.push(FieldError::new(format!("{path}.{k}"), "unknown field"));
        }
    }
}

/// The probe of `[service.readiness]`: exactly one of `tcp` and `http`.
fn parse_probe(
    r: &Map<String, Value>,
    sockets: &DeclaredSockets,
    errs: &mut Vec<FieldError>,
) -> Option<Probe> {
    match (r.get("tcp"), r.get("http")) {
        (Some(t), None) => Some(Probe::Tcp {
            socket: sockets.check("service.readiness.tcp", Some(t), errs),
        }),
        (None, Some(Value::Object(h))) => Some(parse_http_probe(h, sockets, errs)),
        (None, Some(_)) => {
            errs.push(FieldError::new(
                "service.readiness.http",
                "must be a table { port, path }",
            ));
            None
        }
        (Some(_), Some(_)) => {
            errs.push(FieldError::new(
                "service.readiness",
                "set either tcp or http, not both",
            ));
            None
        }
        (None, None) => {
            errs.push(FieldError::new("service.readiness", "needs tcp or http"));
            None
        }
    }
}

/// `service.readiness.http = { port, path }`; the path defaults to `/`.
fn parse_http_probe(
    h: &Map<String, Value>,
    sockets: &DeclaredSockets,
    errs: &mut Vec<FieldError>,
) -> Probe {
    unknown_fields(h, &["port", "path"], "service.readiness.http", errs);
    let socket = sockets.check("service.readiness.http.port", h.get("port"), errs);
    let path = match h.get("path") {
        None => "/".to_owned(),
        // No control characters: the path goes into the request line as it is.
        Some(Value::String(p)) if p.starts_with('/') && !p.chars().any(char::is_control) => {
            p.clone()
        }
        Some(_) => {
            errs.push(FieldError::new(
                "service.readiness.http.path",
                "must be a path starting with '/'",
            ));
            String::new()
        }
    };
    Probe::Http { socket, path }
}

/// `service.readiness.<key>`, a probe count in `1..=MAX_PROBE_THRESHOLD`; 1 when absent.
fn probe_threshold(r: &Map<String, Value>, key: &str, errs: &mut Vec<FieldError>) -> u32 {
    match r.get(key) {
        None => 1,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=u64::from(MAX_PROBE_THRESHOLD)).contains(&n) => n as u32,
            _ => {
                errs.push(FieldError::new(
                    format!("service.readiness.{key}"),
                    format!("must be an integer between 1 and {MAX_PROBE_THRESHOLD}"),
                ));
                1
            }
        },
    }
}

/// A duration string within `[min, max]`, or `default` when absent; a problem is listed
/// and `default` returned otherwise.
fn duration(
    field: &str,
    v: Option<&Value>,
    default: Duration,
    (min, max): (Duration, Duration),
    errs: &mut Vec<FieldError>,
) -> Duration {
    match v {
        None => default,
        Some(Value::String(s)) if s.trim().starts_with('-') => {
            errs.push(FieldError::new(field, "must not be negative"));
            default
        }
        Some(Value::String(s)) => match humantime::parse_duration(s.trim()) {
            Ok(d) if d >= min && d <= max => d,
            Ok(_) => {
                errs.push(FieldError::new(
                    field,
                    format!(
                        "must be between {} and {}",
                        humantime::format_duration(min),
                        humantime::format_duration(max)
                    ),
                ));
                default
            }
            Err(e) => {
                errs.push(FieldError::new(field, format!("not a duration ({e})")));
                default
            }
        },
        Some(_) => {
            errs.push(FieldError::new(
                field,
                "must be a duration string like \"1s\"",
            ));
            default
        }
    }
}

/// A rollout's `deadline` must be longer than its `min_ready` (`given`: set by the
/// profile, not the default).
fn check_deadline(
    deadline: Duration,
    min_ready: Duration,
    given: bool,
    errs: &mut Vec<FieldError>,
) {
    if deadline <= min_ready {
        let default = if given { "" } else { ", its default" };
        errs.push(FieldError::new(
            "service.update.deadline",
            format!(
                "must be longer than min_ready ({}{default}): no replica could make progress in time",
                humantime::format_duration(min_ready),
            ),
        ));
    }
}

/// `[service.update]`, every problem listed.
fn parse_update(u: &Map<String, Value>, errs: &mut Vec<FieldError>) -> UpdatePolicy {
    let d = UpdatePolicy::default();
    for k in u.keys() {
        if ![
            "max_surge",
            "max_unavailable",
            "min_ready",
            "deadline",
            "auto_revert",
        ]
        .contains(&k.as_str())
        {
            errs.push(FieldError::new(
                format!("service.update.{k}"),
                "unknown field",
            ));
        }
    }
    let count = |key: &str, default: u32, errs: &mut Vec<FieldError>| match u.get(key) {
        None => default,
        Some(v) => match v.as_u64() {
            Some(n) if n <= MAX_REPLICAS => n as u32,
            _ => {
                errs.push(FieldError::new(
                    format!("service.update.{key}"),
                    format!("must be an integer between 0 and {MAX_REPLICAS}"),
                ));
                default
            }
        },
    };
    let max_surge = count("max_surge", d.max_surge, errs);
    let max_unavailable = count("max_unavailable", d.max_unavailable, errs);
    if max_surge == 0 && max_unavailable == 0 {
        errs.push(FieldError::new(
            "service.update",
            "max_surge and max_unavailable must not both be 0 (a rollout could never replace a replica)",
        ));
    }
    let min_ready = duration(
        "service.update.min_ready",
        u.get("min_ready"),
        d.min_ready,
        (Duration::ZERO, MAX_ROLLOUT_DURATION),
        errs,
    );
    let deadline = duration(
        "service.update.deadline",
        u.get("deadline"),
        d.deadline,
        (Duration::from_secs(1), MAX_ROLLOUT_DURATION),
        errs,
    );
    check_deadline(deadline, min_ready, u.contains_key("min_ready"), errs);
    let auto_revert = match u.get("auto_revert") {
        None => d.auto_revert,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errs.push(FieldError::new(
                "service.update.auto_revert",
                "must be true or false",
            ));
            d.auto_revert
        }
    };
    UpdatePolicy {
        max_surge,
        max_unavailable,
        min_ready,
        deadline,
        auto_revert,
    }
}

mod env;
mod meta;
mod table;
pub use env::{MAX_ENV_NAME, MAX_ENV_VALUE, MAX_ENV_VARS};
pub use meta::{MAX_KEY_LEN, MAX_LABELS, MAX_VALUE_BYTES};

#[cfg(test)]
mod tests;
