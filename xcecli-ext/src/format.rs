//! Rendering answers as text: pure functions from parsed answers to the exact bytes the
//! commands print.

use crate::cli::EndpointFormat;
use crate::client::Put;
use crate::error::CliError;
use crate::model::{
    self, EndpointEntry, HostList, JobRow, ReplicaStatus, Rollout, RolloutState, ServiceDetail,
    ServiceList, StopAnswer,
};
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

/// `XCE_ENDPOINTS_<NAME>`: the port name upper-cased, `-` → `_` (port names are checked to
/// be `[a-z0-9-]`, so the result is a valid shell variable name).
fn env_name(port: &str) -> String {
    let mut s = String::from("XCE_ENDPOINTS_");
    s.extend(port.chars().map(|c| {
        if c == '-' {
            '_'
        } else {
            c.to_ascii_uppercase()
        }
    }));
    s
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
            s.name.clone(),
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
                    _ => a.ip.clone(),
                })
                .collect();
            Line::Row(vec![
                h.id.clone(),
                dash(&h.state),
                h.ip_addr.clone().unwrap_or_else(|| "-".to_owned()),
                dash(&addresses.join(",")),
                h.jobs.to_string(),
                ports_used(h.ports.as_ref()),
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
                    j.job.clone(),
                    dash(&j.host),
                    j.generation
                        .map_or_else(|| "-".to_owned(), |g| g.to_string()),
                    dash(&j.state),
                    if j.ready { "yes" } else { "no" }.to_owned(),
                    grant_summary(&j.ports, &declared),
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
fn grant_summary(v: &serde_json::Value, declared: &[String]) -> String {
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

/// Left-aligned columns separated by two spaces, no trailing blanks.
fn table(headers: &[&str], lines: &[Line]) -> String {
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
mod tests {
    use super::*;
    use expect_test::{expect, Expect};

    const WEB: &str = r#"{"service":"web","index":42,"endpoints":[
        {"replica":0,"job":"j-17","host":"exec-01","address":"127.0.0.11","ports":{"http":20417,"metrics":9100}},
        {"replica":1,"job":"j-18","host":"exec-02","address":"127.0.0.12","ports":{"http":20533,"metrics":9100}},
        {"replica":2,"job":"j-19","host":"exec-03","address":"fd00::3","ports":{"http":20001,"metrics":9100},"ready":false,"state":"running"}]}"#;

    /// `args`: `format [port=P] [all] [declared=a,b]`.
    fn check(json: &str, args: &str, expect: Expect) {
        let entry: EndpointEntry = serde_json::from_str(json).unwrap();
        model::check(&entry).unwrap();
        let mut words = args.split_whitespace();
        let format = match words.next().unwrap() {
            "table" => EndpointFormat::Table,
            "json" => EndpointFormat::Json,
            "plain" => EndpointFormat::Plain,
            "env" => EndpointFormat::Env,
            f => panic!("unknown format {f}"),
        };
        let (mut port, mut all, mut declared) = (None, false, Vec::new());
        for w in words {
            if let Some(p) = w.strip_prefix("port=") {
                port = Some(p);
            } else if let Some(d) = w.strip_prefix("declared=") {
                declared = d.split(',').map(str::to_owned).collect();
            } else if w == "all" {
                all = true;
            }
        }
        let view = EndpointsView {
            format,
            port,
            all,
            declared: &declared,
        };
        let actual = match endpoints(view, &entry, json) {
            Ok(out) => out,
            Err(e) => format!("exit {}: {e}", e.exit_code()),
        };
        expect.assert_eq(&actual);
    }

    #[test]
    fn table() {
        check(
            WEB,
            "table",
            expect![[r#"
                REPLICA  HOST     ADDRESS     PORTS
                0        exec-01  127.0.0.11  http=20417,metrics=9100
                1        exec-02  127.0.0.12  http=20533,metrics=9100
            "#]],
        );
        // Ports as the profile declares them (the order of XCE_PORTS), not by name; one
        // the profile does not list (a rollout added it) after those.
        check(
            WEB,
            "table declared=metrics,http",
            expect![[r#"
                REPLICA  HOST     ADDRESS     PORTS
                0        exec-01  127.0.0.11  metrics=9100,http=20417
                1        exec-02  127.0.0.12  metrics=9100,http=20533
            "#]],
        );
        check(
            WEB,
            "table declared=metrics",
            expect![[r#"
                REPLICA  HOST     ADDRESS     PORTS
                0        exec-01  127.0.0.11  metrics=9100,http=20417
                1        exec-02  127.0.0.12  metrics=9100,http=20533
            "#]],
        );
        check(
            WEB,
            "table port=http all",
            expect![[r#"
                REPLICA  HOST     ADDRESS     PORTS       READY  STATE
                0        exec-01  127.0.0.11  http=20417  yes    -
                1        exec-02  127.0.0.12  http=20533  yes    -
                2        exec-03  fd00::3     http=20001  no     running
            "#]],
        );
        check(
            r#"{"service":"web","index":7,"endpoints":[]}"#,
            "table",
            expect![[r#"
                no ready endpoints for service web (index 7)
            "#]],
        );
    }

    #[test]
    fn plain() {
        check(
            WEB,
            "plain port=http",
            expect![[r#"
                127.0.0.11:20417
                127.0.0.12:20533
            "#]],
        );
        check(
            WEB,
            "plain",
            expect![[r#"
                exit 2: error: service "web" has several ports (http, metrics): -o plain prints one
                hint: pass --port http, or use -o env or -o json"#]],
        );
        check(
            r#"{"service":"db","index":3,"endpoints":[
                {"replica":0,"job":"j-1","host":"h","address":"fd00::1","ports":{"pg":5432}}]}"#,
            "plain",
            expect![[r#"
                [fd00::1]:5432
            "#]],
        );
        check(
            r#"{"service":"db","index":3,"endpoints":[]}"#,
            "plain",
            expect![""],
        );
    }

    #[test]
    fn env() {
        check(
            WEB,
            "env",
            expect![[r#"
                XCE_ENDPOINTS_HTTP=127.0.0.11:20417,127.0.0.12:20533
                XCE_ENDPOINTS_METRICS=127.0.0.11:9100,127.0.0.12:9100
            "#]],
        );
        check(
            WEB,
            "env port=metrics",
            expect![[r#"
                XCE_ENDPOINTS_METRICS=127.0.0.11:9100,127.0.0.12:9100
            "#]],
        );
        check(
            r#"{"service":"web","index":9,"endpoints":[]}"#,
            "env declared=http,admin-api",
            expect![[r#"
                XCE_ENDPOINTS_ADMIN_API=
                XCE_ENDPOINTS_HTTP=
            "#]],
        );
    }

    #[test]
    fn json_is_the_entry_as_sent() {
        check(
            r#"{"service":"web","endpoints":[],"index":9}"#,
            "json",
            expect![[r#"
                {"service":"web","endpoints":[],"index":9}
            "#]],
        );
    }

    /// Whatever a (checked) entry holds, `env` lines are `NAME=VALUE` where neither part
    /// needs shell quoting, so `eval "$(xcecli ... -o env)"` cannot run anything.
    #[test]
    fn env_values_never_need_quoting() {
        let entry = r#"{"service":"s","index":1,"endpoints":[
            {"replica":0,"job":"j-1","host":"h","address":"fe80::1","ports":{"a-b-9":1,"http":65535}},
            {"replica":1,"job":"j-2","host":"h","address":"::ffff:10.0.0.2","ports":{"a-b-9":2}},
            {"replica":2,"job":"j-3","host":"h","address":"10.0.0.1","ports":{"http":3}}]}"#;
        let entry: EndpointEntry = serde_json::from_str(entry).unwrap();
        model::check(&entry).unwrap();
        let view = EndpointsView {
            format: EndpointFormat::Env,
            port: None,
            all: false,
            declared: &[],
        };
        let out = endpoints(view, &entry, "").unwrap();
        assert_eq!(out.lines().count(), 2, "{out}");
        for line in out.lines() {
            let (name, value) = line.split_once('=').unwrap();
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{line}"
            );
            assert!(
                value
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b":.,[]%-".contains(&b)),
                "{line}"
            );
        }
    }

    /// 2026-12-03T09:00:00Z.
    fn test_now() -> SystemTime {
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_288_400)
    }

    #[test]
    fn ages_read_at_a_glance() {
        let now = test_now();
        let lines: Vec<String> = [
            "2026-12-03T08:59:48.250Z",
            "2026-12-03T08:56:48Z",
            "2026-12-03T06:55:00Z",
            "2026-11-29T05:00:00Z",
            "2026-12-03T09:00:05Z",
            "yesterday",
            "",
        ]
        .iter()
        .map(|at| format!("{at:?} -> {}", ago(at, now)))
        .collect();
        expect![[r#"
            "2026-12-03T08:59:48.250Z" -> 11s ago
            "2026-12-03T08:56:48Z" -> 3m12s ago
            "2026-12-03T06:55:00Z" -> 2h5m ago
            "2026-11-29T05:00:00Z" -> 4d4h ago
            "2026-12-03T09:00:05Z" -> just now
            "yesterday" -> yesterday
            "" -> -"#]]
        .assert_eq(&lines.join("\n"));
    }

    fn check_list(kind: &str, json: &str, expect: Expect) {
        let actual = match kind {
            "services" => service_list(&serde_json::from_str(json).unwrap()),
            "hosts" => host_list(&serde_json::from_str(json).unwrap()),
            "status" => status(&serde_json::from_str(json).unwrap(), test_now()),
            "stopped" => stopped(&serde_json::from_str(json).unwrap(), false),
            "stopped-now" => stopped(&serde_json::from_str(json).unwrap(), true),
            k => panic!("unknown kind {k}"),
        };
        expect.assert_eq(&actual);
    }

    #[test]
    fn lists() {
        check_list(
            "services",
            r#"{"services":[
                {"name":"web","project":"default","replicas":3,"running":3,"ready":3,"pending":0,"pending_reason":null,"state":"active","index":42},
                {"name":"metrics-exporter","project":"team-a","replicas":4,"running":3,"ready":2,"pending":1,"pending_reason":"port metrics/tcp 9100 is taken on all 3 hosts","state":"active","index":7}]}"#,
            expect![[r#"
                NAME              PROJECT  REPLICAS  READY  PENDING  STATE
                web               default  3         3      0        active
                metrics-exporter  team-a   4         2      1        active
                  pending: port metrics/tcp 9100 is taken on all 3 hosts
            "#]],
        );
        check_list(
            "services",
            r#"{"services":[]}"#,
            expect![[r#"
            no services
        "#]],
        );
        check_list(
            "hosts",
            r#"{"hosts":[
                {"id":"exec-01","state":"ready","ip_addr":"127.0.0.11","addresses":[{"ip":"127.0.0.11","interface":"lo"}],"jobs":3,"ports":{"range":"20000-32000","capacity":12001,"used":3,"unavailable":0}},
                {"id":"exec-02","state":"lost","ip_addr":null,"addresses":[],"jobs":0,"ports":{"range":"20000-32000","capacity":12001,"used":0,"unavailable":2}},
                {"id":"exec-03","state":"ready","ip_addr":"fd00::3","addresses":[{"ip":"fd00::3","interface":"eth0"},{"ip":"10.0.0.3"}],"jobs":1}]}"#,
            expect![[r#"
                ID       STATE  IP_ADDR     ADDRESSES               JOBS  PORTS-USED
                exec-01  ready  127.0.0.11  127.0.0.11(lo)          3     3/12001
                exec-02  lost   -           -                       0     0/12001 (2 unavailable)
                exec-03  ready  fd00::3     fd00::3(eth0),10.0.0.3  1     -
            "#]],
        );
        check_list(
            "status",
            r#"{"name":"web","project":"default","replicas":3,"state":"active","index":42,"generation":2,
                "rollout":{"generation":2,"state":"progressing","updated":2,"ready":3,"outdated":1,
                           "reason":"replica 2: port metrics/tcp 9100 is taken on all 3 hosts"},
                "profile":{},
                "pending":[{"replica":2,"reason":"port metrics/tcp 9100 is taken\non all 3 hosts"}],
                "jobs":[{"job":"j-23","replica":1,"host":"exec-02","state":"running","ready":true,"generation":2,"ports":{"http":20419}},
                        {"job":"j-17","replica":0,"host":"exec-01","state":"draining","ready":false,"generation":1,"ports":{"http":20417}},
                        {"job":"j-22","replica":0,"host":"exec-03","state":"running","ready":true,"generation":2,"ports":{"http":20418}},
                        {"job":"j-19","replica":2,"host":"exec-03","state":"running","ready":true,"generation":1,"ports":{}}]}"#,
            expect![[r#"
                service web in project default: 3 replicas, active, generation 2
                rollout: generation 2 progressing: 2/3 updated, 3 ready, 1 outdated
                  waiting: replica 2: port metrics/tcp 9100 is taken on all 3 hosts
                REPLICA  JOB   HOST     GEN  STATE     READY  PORTS
                0        j-17  exec-01  1    draining  no     http=20417
                0        j-22  exec-03  2    running   yes    http=20418
                1        j-23  exec-02  2    running   yes    http=20419
                2        j-19  exec-03  1    running   yes    -
                pending replica 2: port metrics/tcp 9100 is taken\non all 3 hosts
            "#]],
        );
        // From an apiserver that predates rollouts: no rollout line, no generations.
        check_list(
            "status",
            r#"{"name":"web","project":"default","replicas":1,"state":"stopping","index":42,"profile":{},
                "pending":[],
                "jobs":[{"job":"j-17","replica":0,"host":"exec-01","state":"stopping","ready":false,"ports":{"http":20417}}]}"#,
            expect![[r#"
                service web in project default: 1 replicas, stopping
                REPLICA  JOB   HOST     GEN  STATE     READY  PORTS
                0        j-17  exec-01  -    stopping  no     http=20417
            "#]],
        );
        check_list(
            "status",
            r#"{"name":"web","project":"default","replicas":2,"state":"active","index":9,"generation":4,
                "rollout":{"generation":4,"state":"reverted","updated":0,"ready":0,"outdated":0,
                           "reason":"generation 3 failed: no progress for 5m; restored the profile of generation 2"},
                "profile":{},"pending":[],"jobs":[]}"#,
            expect![[r#"
                service web in project default: 2 replicas, active, generation 4
                rollout: generation 4 reverted: 0/2 updated, 0 ready, 0 outdated
                  reason: generation 3 failed: no progress for 5m; restored the profile of generation 2
                no replicas placed
            "#]],
        );
        // A crash-looping replica: what ended it, when, how often, and where its log is.
        check_list(
            "status",
            r#"{"name":"api","project":"default","replicas":3,"state":"active","index":51,"generation":1,
                "rollout":{"generation":1,"state":"progressing","updated":2,"ready":1,"outdated":0,"reason":null},
                "profile":{},
                "pending":[{"replica":1,"reason":"restarting in 4s: cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"}],
                "jobs":[{"job":"j-9","replica":0,"host":"exec-01","state":"running","ready":true,"generation":1,"log":"/var/lib/xce/logs/j-9.log"},
                        {"job":"j-8","replica":2,"host":"exec-02","state":"running","ready":false,"generation":1,"log":"/var/lib/xce/logs/j-8.log"}],
                "replica_status":[
                  {"replica":0,"restarts":2,"log":"/var/lib/xce/logs/j-9.log","log_host":"exec-01",
                   "last_exit":{"job":"j-4","host":"exec-02","at":"2026-12-03T08:58:30.120Z","code":null,"signal":9,"signal_name":"SIGKILL","error":null,"summary":"SIGKILL (signal 9)"}},
                  {"replica":1,"restarts":3,"log":"/var/lib/xce/logs/j-7.log","log_host":"exec-02",
                   "last_exit":{"job":"j-7","host":"exec-02","at":"2026-12-03T08:59:48Z","code":127,"signal":null,"signal_name":null,"error":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)","summary":"cannot start \"no-such-binary-xyz\": No such file or directory (os error 2)"}},
                  {"replica":2,"restarts":0,"log":"/var/lib/xce/logs/j-8.log","log_host":"exec-02","last_exit":null}]}"#,
            expect![[r#"
                service api in project default: 3 replicas, active, generation 1
                rollout: generation 1 progressing: 2/3 updated, 1 ready, 0 outdated
                REPLICA  JOB  HOST     GEN  STATE    READY  PORTS
                0        j-9  exec-01  1    running  yes    -
                2        j-8  exec-02  1    running  no     -
                pending replica 1: restarting in 4s: cannot start "no-such-binary-xyz": No such file or directory (os error 2)
                REPLICA  RESTARTS  LAST-EXIT  LOG                                CAUSE
                0        2         1m29s ago  exec-01:/var/lib/xce/logs/j-9.log  j-4 on exec-02: SIGKILL (signal 9)
                1        3         12s ago    exec-02:/var/lib/xce/logs/j-7.log  j-7 on exec-02: cannot start "no-such-binary-xyz": No such file or directory (os error 2)
                2        0         -          exec-02:/var/lib/xce/logs/j-8.log  -
            "#]],
        );
        check_list(
            "stopped",
            r#"{"name":"web","stopping":3}"#,
            expect![[r#"
                stopping service web (3 replicas)
            "#]],
        );
        check_list(
            "stopped-now",
            r#"{"name":"web","stopping":3}"#,
            expect![[r#"
                stopping service web (3 replicas, without draining)
            "#]],
        );
    }
}
