//! The host's part of a service profile (DESIGN §3): name, project, replicas, command,
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
    /// What one replica takes of the plugins' resources (for quotas), by name.
    pub quantities: std::collections::BTreeMap<String, u64>,
    /// The whole `[service]` table as JSON (plugin sections included), as stored.
    pub raw: Value,
}

/// `[service.update]`: how a changed profile replaces the running replicas (DESIGN §8a).
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
            min_ready: Duration::ZERO,
            deadline: Duration::from_secs(300),
            auto_revert: true,
        }
    }
}

/// `service.drain` when the profile does not say.
pub const DEFAULT_DRAIN: Duration = Duration::from_secs(5);
/// The longest `drain`, `min_ready` or `deadline` a profile may ask for.
const MAX_ROLLOUT_DURATION: Duration = Duration::from_secs(3600);

/// The most replicas one service may ask for.
pub const MAX_REPLICAS: u64 = 10_000;

const HOST_KEYS: &[&str] = &[
    "name",
    "project",
    "replicas",
    "command",
    "readiness",
    "drain",
    "update",
    "meta",
];

/// The parts of a profile that do not change what a replica runs: a change of only these
/// makes no new generation (a scale, new rollout settings, or new `meta` labels apply in
/// place). `meta` is here because a replica never sees its labels (they are not in its
/// environment): they label the endpoint entry and the Prometheus targets, which change at
/// once. Restarting every replica to relabel it would be a rollout for nothing — Nomad
/// also updates `meta` in place.
pub const NOT_TEMPLATE_KEYS: &[&str] = &["replicas", "drain", "update", "meta"];

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
    for k in top.keys() {
        if k != "service" {
            errs.push(FieldError::new(k.clone(), "unknown field"));
        }
    }
    let empty = Map::new();
    let svc = match top.get("service") {
        Some(Value::Object(m)) => m,
        Some(_) => {
            errs.push(FieldError::new("service", "must be a table"));
            &empty
        }
        None => {
            errs.push(FieldError::new("service", "missing"));
            &empty
        }
    };
    for k in svc.keys() {
        if !HOST_KEYS.contains(&k.as_str()) && !plugins.iter().any(|p| p.name() == k) {
            errs.push(FieldError::new(format!("service.{k}"), "unknown field"));
        }
    }

    let name = match svc.get("name") {
        Some(Value::String(s)) => match plugin_api::check_name(s) {
            Ok(()) => s.clone(),
            Err(reason) => {
                errs.push(FieldError::new("service.name", reason.to_string()));
                String::new()
            }
        },
        Some(_) => {
            errs.push(FieldError::new("service.name", "must be a string"));
            String::new()
        }
        None => {
            if !svc.is_empty() || top.contains_key("service") {
                errs.push(FieldError::new("service.name", "missing"));
            }
            String::new()
        }
    };
    let project = match svc.get("project") {
        None => "default".to_owned(),
        Some(Value::String(s)) => match plugin_api::check_name(s) {
            Ok(()) => s.clone(),
            Err(reason) => {
                errs.push(FieldError::new("service.project", reason.to_string()));
                String::new()
            }
        },
        Some(_) => {
            errs.push(FieldError::new("service.project", "must be a string"));
            String::new()
        }
    };
    let replicas = match svc.get("replicas") {
        None => 1,
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_REPLICAS).contains(&n) => n as u32,
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
        },
    };
    let command = match svc.get("command") {
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
    };

    // Plugins validate their own sections and tell us which socket names exist.
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

    let readiness = match svc.get("readiness") {
        None => None,
        Some(Value::Object(r)) => parse_readiness(r, &sockets, &mut errs),
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
            quantities,
            raw: Value::Object(svc.clone()),
        })
    } else {
        Err(errs)
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

fn parse_readiness(
    r: &Map<String, Value>,
    sockets: &DeclaredSockets,
    errs: &mut Vec<FieldError>,
) -> Option<Readiness> {
    let before = errs.len();
    for k in r.keys() {
        if ![
            "tcp",
            "http",
            "interval",
            "timeout",
            "failure_threshold",
            "success_threshold",
        ]
        .contains(&k.as_str())
        {
            errs.push(FieldError::new(
                format!("service.readiness.{k}"),
                "unknown field",
            ));
        }
    }
    let check_socket = |field: &str, v: Option<&Value>, errs: &mut Vec<FieldError>| -> String {
        match v.and_then(Value::as_str) {
            Some(s) if sockets.names.iter().any(|n| n == s) => s.to_owned(),
            // The profile is refused for its plugin section anyway.
            Some(s) if !sockets.complete => s.to_owned(),
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
    };
    let probe = match (r.get("tcp"), r.get("http")) {
        (Some(t), None) => Some(Probe::Tcp {
            socket: check_socket("service.readiness.tcp", Some(t), errs),
        }),
        (None, Some(Value::Object(h))) => {
            for k in h.keys() {
                if k != "port" && k != "path" {
                    errs.push(FieldError::new(
                        format!("service.readiness.http.{k}"),
                        "unknown field",
                    ));
                }
            }
            let socket = check_socket("service.readiness.http.port", h.get("port"), errs);
            let path = match h.get("path") {
                None => "/".to_owned(),
                Some(Value::String(p))
                    if p.starts_with('/') && !p.chars().any(char::is_control) =>
                {
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
            Some(Probe::Http { socket, path })
        }
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
    };
    let probe_range = (Duration::from_millis(100), Duration::from_secs(3600));
    let interval = duration(
        "service.readiness.interval",
        r.get("interval"),
        Duration::from_secs(1),
        probe_range,
        errs,
    );
    let timeout = duration(
        "service.readiness.timeout",
        r.get("timeout"),
        interval.min(Duration::from_secs(1)),
        probe_range,
        errs,
    );
    let threshold = |key: &str, errs: &mut Vec<FieldError>| match r.get(key) {
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
    };
    let failure_threshold = threshold("failure_threshold", errs);
    let success_threshold = threshold("success_threshold", errs);
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
    if deadline <= min_ready {
        errs.push(FieldError::new(
            "service.update.deadline",
            "must be longer than min_ready (no replica could make progress in time)",
        ));
    }
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

mod meta;
pub use meta::{MAX_KEY_LEN, MAX_LABELS, MAX_VALUE_BYTES};

#[cfg(test)]
mod tests;
