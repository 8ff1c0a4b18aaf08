//! Rendering answers as text: pure functions from parsed answers to the exact bytes the
//! commands print.

use crate::cli::EndpointFormat;
use crate::client::Put;
use crate::error::CliError;
use crate::model::{
    self, EndpointEntry, HostList, JobRow, ReplicaStatus, Rollout, RolloutState, ServiceDetail,
    ServiceList, StopAnswer,
};
use port_resource::name::PortName;
// The port plugin shows its summaries (a job's ports, a host's pool) under its name.
use port_resource::PLUGIN_NAME;
use std::collections::BTreeSet;
use std::time::SystemTime;

/// What an endpoints rendering needs besides the entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndpointsView<'a> {
    /// The output format (already resolved from the default).
    pub(crate) format: EndpointFormat,
    /// `--port`: keep only this port.
    pub(crate) port: Option<&'a str>,
    /// `--all`: show replicas that are placed but not ready (table and json only).
    pub(crate) all: bool,
    /// The service's declared port names, when known: lets `env` print an empty
    /// `XCE_ENDPOINTS_<PORT>=` line for a port no ready replica has yet.
    pub(crate) declared: &'a [String],
}

/// Renders an endpoint entry. `raw` is the body as the server sent it (for `json`).
pub(crate) fn endpoints(
    view: EndpointsView<'_>,
    entry: &EndpointEntry,
    raw: &str,
) -> Result<String, CliError> {
    match view.format {
        EndpointFormat::Json => {
            let mut out = raw.trim_end().to_owned();
            out.push('\n');
            Ok(out)
        }
        EndpointFormat::Table => Ok(endpoints_table(view, entry)),
        EndpointFormat::Plain => {
            let Some(port) = plain_port(view.port, entry)? else {
                return Ok(String::new());
            };
            let mut out = String::new();
            for e in model::ready(entry) {
                if let Some(socket) = e.ports.get(port).and_then(|p| model::socket(e, *p)) {
                    out.push_str(&socket);
                    out.push('\n');
                }
            }
            Ok(out)
        }
        EndpointFormat::Env => {
            let names: BTreeSet<&str> = match view.port {
                Some(p) => [p].into(),
                None => model::ready(entry)
                    .flat_map(|e| e.ports.keys().map(String::as_str))
                    .chain(view.declared.iter().map(String::as_str))
                    .collect(),
            };
            let mut out = String::new();
            for name in names {
                let sockets: Vec<String> = model::ready(entry)
                    .filter_map(|e| model::socket(e, *e.ports.get(name)?))
                    .collect();
                out.push_str(&format!("{}={}\n", env_name(name), sockets.join(",")));
            }
            Ok(out)
        }
    }
}

/// The port `plain` prints: `--port`, or the one port the ready replicas have. `None` when
/// no replica is ready (nothing to print either way).
fn plain_port<'a>(
    port: Option<&'a str>,
    entry: &'a EndpointEntry,
) -> Result<Option<&'a str>, CliError> {
    if let Some(p) = port {
        return Ok(Some(p));
    }
    let names: BTreeSet<&str> = model::ready(entry)
        .flat_map(|e| e.ports.keys().map(String::as_str))
        .collect();
    match names.len() {
        0 => Ok(None),
        1 => Ok(names.into_iter().next()),
        _ => Err(several_ports(&entry.service, names.into_iter())),
    }
}

/// The usage error for `-o plain` without `--port` on a multi-port service.
pub(crate) fn several_ports<'a>(service: &str, names: impl Iterator<Item = &'a str>) -> CliError {
    let names: Vec<&str> = names.collect();
    CliError::usage(format!(
        "service {service:?} has several ports ({}): -o plain prints one",
        names.join(", ")
    ))
    .with_hint(format!(
        "pass --port {}, or use -o env or -o json",
        names.first().unwrap_or(&"NAME")
    ))
}

/// `XCE_ENDPOINTS_<NAME>`: the port name's environment form (upper case, `-` → `_`), the
/// one `XCE_PORT_<NAME>` uses. The names printed are valid port names, so the result is a
/// valid shell variable name: those of an entry are checked on arrival (`model::check`),
/// and a `--port` only gets an answer when the service has that port.
fn env_name(port: &str) -> String {
    match PortName::new(port) {
        Ok(name) => format!("XCE_ENDPOINTS_{}", name.env_suffix()),
        // Not reached (see above); printed as given rather than guessed at.
        Err(_) => format!("XCE_ENDPOINTS_{port}"),
    }
}

fn endpoints_table(view: EndpointsView<'_>, entry: &EndpointEntry) -> String {
    let rows: Vec<&model::Endpoint> = if view.all {
        entry.endpoints.iter().collect()
    } else {
        model::ready(entry).collect()
    };
    if rows.is_empty() {
        return format!(
            "no ready endpoints for service {} (index {})\n",
            entry.service, entry.index
        );
    }
    let mut headers = vec!["REPLICA", "HOST", "ADDRESS", "PORTS"];
    if view.all {
        headers.extend(["READY", "STATE"]);
    }
    // The service's `[service.meta]` labels, `k=v,k=v`, on every row: a column only when
    // it has some.
    let meta: Vec<String> = entry.meta.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !meta.is_empty() {
        headers.push("META");
    }
    let lines = rows
        .iter()
        .map(|e| {
            let ports: Vec<String> = declared_order(e.ports.iter(), view.declared)
                .into_iter()
                .filter(|(name, _)| view.port.is_none_or(|p| p == name.as_str()))
                .map(|(name, p)| format!("{name}={p}"))
                .collect();
            let mut row = vec![
                e.replica.to_string(),
                dash(&e.host),
                e.address.map_or_else(|| "-".to_owned(), |a| a.to_string()),
                dash(&ports.join(",")),
            ];
            if view.all {
                row.push(if model::is_ready(e) { "yes" } else { "no" }.to_owned());
                row.push(e.state.map_or_else(|| "-".to_owned(), job_state));
            }
            if !meta.is_empty() {
                row.push(meta.join(","));
            }
            Line::Row(row)
        })
        .collect::<Vec<_>>();
    table(&headers, &lines)
}

/// `(name, value)` pairs in the order of `declared` (a profile's port names, the order
/// of `XCE_PORTS`), then any name it does not list (a port a rollout added), by name.
fn declared_order<'a, V>(
    ports: impl Iterator<Item = (&'a String, V)>,
    declared: &[String],
) -> Vec<(&'a String, V)> {
    let mut ports: Vec<_> = ports.collect();
    ports.sort_by_key(|(name, _)| {
        let at = declared.iter().position(|d| d == *name);
        (at.unwrap_or(usize::MAX), name.as_str())
    });
    ports
}

/// `service list` as a table, with the pending reason under a pending service.
pub(crate) fn service_list(list: &ServiceList) -> String {
    if list.services.is_empty() {
        return "no services\n".to_owned();
    }
    let mut lines = Vec::new();
    for s in &list.services {
        lines.push(Line::Row(vec![
            s.name.to_string(),
            dash(&s.project),
            s.replicas.to_string(),
            s.ready.to_string(),
            s.pending.to_string(),
            dash(&s.state),
        ]));
        if s.pending > 0 {
            if let Some(reason) = &s.pending_reason {
                lines.push(Line::Note(format!("  pending: {reason}")));
            }
        }
    }
    table(
        &["NAME", "PROJECT", "REPLICAS", "READY", "PENDING", "STATE"],
        &lines,
    )
}

/// `host list` as a table.
pub(crate) fn host_list(list: &HostList) -> String {
    if list.hosts.is_empty() {
        return "no hosts\n".to_owned();
    }
    let lines: Vec<Line> = list
        .hosts
        .iter()
        .map(|h| {
            let addresses: Vec<String> = h
                .addresses
                .iter()
                .map(|a| match &a.interface {
                    Some(i) if !i.is_empty() => format!("{}({i})", a.ip),
                    _ => a.ip.to_string(),
                })
                .collect();
            // A cordon or drain shows beside the liveness, as `ready/draining`.
            let state = match &h.maintenance {
                Some(m) => format!("{}/{}", h.state, m.state),
                None => h.state.to_string(),
            };
            Line::Row(vec![
                h.id.to_string(),
                dash(&state),
                h.ip_addr
                    .map_or_else(|| "-".to_owned(), |ip| ip.to_string()),
                dash(&addresses.join(",")),
                h.jobs.to_string(),
                ports_used(h.summary(PLUGIN_NAME)),
            ])
        })
        .collect();
    table(
        &["ID", "STATE", "IP_ADDR", "ADDRESSES", "JOBS", "PORTS-USED"],
        &lines,
    )
}

/// `used/capacity`, and the ports found taken by something outside xce, if any.
fn ports_used(summary: Option<&serde_json::Value>) -> String {
    let Some(s) = summary else {
        return "-".to_owned();
    };
    let num = |k: &str| s.get(k).and_then(serde_json::Value::as_u64);
    match (num("used"), num("capacity")) {
        (Some(used), Some(cap)) => match num("unavailable") {
            Some(u) if u > 0 => format!("{used}/{cap} ({u} unavailable)"),
            _ => format!("{used}/{cap}"),
        },
        _ => "-".to_owned(),
    }
}

/// What `service submit` prints: `created`, `updated` or `unchanged` as the server says
/// (`X-Xce-Change`), with the generation; a server that does not say gets the generation
/// only.
pub(crate) fn submitted(put: Put, detail: &ServiceDetail) -> String {
    match put {
        Put::Created => format!("service {} created\n", detail.name),
        Put::Updated => format!(
            "service {} updated (generation {})\n",
            detail.name, detail.generation
        ),
        Put::Unchanged => format!(
            "service {} unchanged (generation {})\n",
            detail.name, detail.generation
        ),
        Put::Replaced => format!(
            "service {}: generation {}\n",
            detail.name, detail.generation
        ),
    }
}

/// What `service scale` prints.
pub(crate) fn scaling(detail: &ServiceDetail) -> String {
    format!(
        "service {}: scaling to {} replicas (generation {})\n",
        detail.name, detail.replicas, detail.generation
    )
}

/// What `service restart` prints.
pub(crate) fn restarting(detail: &ServiceDetail) -> String {
    format!(
        "service {}: restarting as generation {}\n",
        detail.name, detail.generation
    )
}

/// One `--wait` progress line, plus `  waiting: <reason>` while the rollout says why it
/// waits: `generation 2: 2/3 updated, 3 ready, 1 outdated`. The reason of a failed or
/// reverted rollout is left to the error that ends the wait, so it is not printed twice.
pub(crate) fn progress(detail: &ServiceDetail, rollout: &Rollout) -> String {
    let mut out = format!(
        "generation {}: {}/{} updated, {} ready, {} outdated\n",
        rollout.generation, rollout.updated, detail.replicas, rollout.ready, rollout.outdated
    );
    if matches!(
        rollout.state,
        RolloutState::Progressing | RolloutState::Unknown
    ) {
        if let Some(line) = reason_line(rollout) {
            out.push_str(&line);
        }
    }
    out
}

/// `  waiting: …` for a rollout in progress, `  reason: …` for one that failed, was
/// reverted or completed with a note; `None` without a reason.
fn reason_line(rollout: &Rollout) -> Option<String> {
    let reason = rollout.reason.as_deref().filter(|r| !r.trim().is_empty())?;
    let label = match rollout.state {
        RolloutState::Progressing | RolloutState::Unknown => "waiting",
        RolloutState::Complete | RolloutState::Failed | RolloutState::Reverted => "reason",
    };
    Some(format!("  {label}: {}\n", one_line(reason)))
}

/// What a finished `--wait` prints on stdout.
pub(crate) fn complete(detail: &ServiceDetail, rollout: &Rollout) -> String {
    format!(
        "service {}: generation {} complete, {} of {} replicas ready\n",
        detail.name, rollout.generation, rollout.ready, detail.replicas
    )
}

/// `service status NAME`: the service, its rollout, its replicas (sorted by replica index,
/// then generation: during a rollout one index may have an old and a new job), and the
/// replicas no host can hold.
pub(crate) fn status(detail: &ServiceDetail, now: SystemTime) -> String {
    let mut out = format!(
        "service {} in project {}: {} replicas, {}",
        detail.name,
        dash(&detail.project),
        detail.replicas,
        dash(&detail.state)
    );
    if detail.generation > 0 {
        out.push_str(&format!(", generation {}", detail.generation));
    }
    out.push('\n');
    if let Some(r) = &detail.rollout {
        out.push_str(&format!(
            "rollout: generation {} {}: {}/{} updated, {} ready, {} outdated\n",
            r.generation,
            r.state.as_str(),
            r.updated,
            detail.replicas,
            r.ready,
            r.outdated
        ));
        if let Some(line) = reason_line(r) {
            out.push_str(&line);
        }
        if let Some(warning) = &r.dns_warning {
            out.push_str(&format!("  dns: {}\n", one_line(warning)));
        }
    }
    let declared = model::declared_ports(&detail.profile);
    let mut jobs: Vec<&JobRow> = detail.jobs.iter().collect();
    jobs.sort_by_key(|j| (j.replica, j.generation));
    if jobs.is_empty() {
        out.push_str("no replicas placed\n");
    } else {
        let lines: Vec<Line> = jobs
            .iter()
            .map(|j| {
                Line::Row(vec![
                    j.replica.to_string(),
                    j.job.to_string(),
                    dash(&j.host),
                    j.generation
                        .map_or_else(|| "-".to_owned(), |g| g.to_string()),
                    dash(&j.state),
                    if j.ready { "yes" } else { "no" }.to_owned(),
                    grant_summary(j.summary(PLUGIN_NAME), &declared),
                ])
            })
            .collect();
        out.push_str(&table(
            &["REPLICA", "JOB", "HOST", "GEN", "STATE", "READY", "PORTS"],
            &lines,
        ));
    }
    for p in &detail.pending {
        out.push_str(&format!(
            "pending replica {}: {}\n",
            p.replica,
            p.reason.as_deref().map_or_else(|| "-".to_owned(), one_line)
        ));
    }
    out.push_str(&replica_status(&detail.replica_status, now));
    out
}

/// Per replica: restarts, the last exit (what, when, which job), and where the newest
/// job's log is; nothing when the server sent nothing to show.
fn replica_status(slots: &[ReplicaStatus], now: SystemTime) -> String {
    let known = |r: &&ReplicaStatus| r.restarts > 0 || r.last_exit.is_some() || r.log.is_some();
    if !slots.iter().any(|r| known(&r)) {
        return String::new();
    }
    let lines: Vec<Line> = slots
        .iter()
        .map(|r| {
            let (exit, when) = match &r.last_exit {
                Some(e) => (
                    format!(
                        "{} on {}: {}",
                        dash(&e.job),
                        dash(&e.host),
                        one_line(&e.summary)
                    ),
                    ago(&e.at, now),
                ),
                None => ("-".to_owned(), "-".to_owned()),
            };
            let log = match (&r.log_host, &r.log) {
                (Some(h), Some(l)) => format!("{}:{}", one_line(h), one_line(l)),
                (None, Some(l)) => one_line(l),
                _ => "-".to_owned(),
            };
            // The cause last: it is the one long, free-form column.
            Line::Row(vec![
                r.replica.to_string(),
                r.restarts.to_string(),
                when,
                log,
                exit,
            ])
        })
        .collect();
    table(
        &["REPLICA", "RESTARTS", "LAST-EXIT", "LOG", "CAUSE"],
        &lines,
    )
}

/// `12s ago`, `3m12s ago`, `2h5m ago`, `4d3h ago` from an RFC 3339 time; the time as sent
/// when it does not parse; `just now` for a time ahead of this machine's clock.
pub(crate) fn ago(at: &str, now: SystemTime) -> String {
    let Ok(t) = humantime::parse_rfc3339_weak(at) else {
        return dash(&one_line(at));
    };
    let Ok(d) = now.duration_since(t) else {
        return "just now".to_owned();
    };
    let s = d.as_secs();
    let (d, h, m) = (s / 86_400, s / 3_600 % 24, s / 60 % 60);
    match s {
        0..60 => format!("{s}s ago"),
        60..3_600 => format!("{m}m{}s ago", s % 60),
        3_600..86_400 => format!("{h}h{m}m ago"),
        _ => format!("{d}d{h}h ago"),
    }
}

/// Server text on one line, control characters escaped: a reason must neither break the
/// one-line-per-change output nor send escape sequences to the terminal.
pub(crate) fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A job's grant summary: `name=port` pairs in declaration order when it is a flat map of
/// numbers (the port plugin's), else compact JSON.
fn grant_summary(v: Option<&serde_json::Value>, declared: &[String]) -> String {
    let Some(v) = v else {
        return "-".to_owned();
    };
    match v {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::Object(m) if m.is_empty() => "-".to_owned(),
        serde_json::Value::Object(m) if m.values().all(serde_json::Value::is_u64) => {
            declared_order(m.iter(), declared)
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        }
        other => other.to_string(),
    }
}

/// The `xcecli service status NAME [--project P]` a hint suggests.
pub(crate) fn status_command(name: &str, project: Option<&str>) -> String {
    match project {
        Some(p) => format!("xcecli service status {name} --project {p}"),
        None => format!("xcecli service status {name}"),
    }
}

/// What `service stop` prints.
pub(crate) fn stopped(answer: &StopAnswer, now: bool) -> String {
    let how = if now { ", without draining" } else { "" };
    format!(
        "stopping service {} ({} replicas{how})\n",
        answer.name, answer.stopping
    )
}

/// A job state as the REST API spells it.
fn job_state(state: plugin_api::JobState) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{state:?}").to_lowercase())
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.to_owned()
    }
}

/// A table line: an aligned row, or a free-form note under the previous row.
enum Line {
    Row(Vec<String>),
    Note(String),
}

/// Left-aligned columns separated by two spaces, no trailing blanks. Every cell and note
/// has its control characters escaped ([`one_line`]): server text (a `[service.meta]`
/// value, a host's reason) can neither send escape sequences to the terminal nor forge a
/// line of the table.
fn table(headers: &[&str], lines: &[Line]) -> String {
    let lines: Vec<Line> = lines
        .iter()
        .map(|l| match l {
            Line::Row(cells) => Line::Row(cells.iter().map(|c| one_line(c)).collect()),
            Line::Note(note) => Line::Note(one_line(note)),
        })
        .collect();
    let lines = &lines;
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for line in lines {
        if let Line::Row(cells) = line {
            for (w, c) in widths.iter_mut().zip(cells) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let row = |cells: &mut dyn Iterator<Item = &str>| {
        let mut line = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            line.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
        }
        let mut line = line.trim_end().to_owned();
        line.push('\n');
        line
    };
    let mut out = row(&mut headers.iter().copied());
    for line in lines {
        match line {
            Line::Row(cells) => out.push_str(&row(&mut cells.iter().map(String::as_str))),
            Line::Note(note) => {
                out.push_str(note);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
