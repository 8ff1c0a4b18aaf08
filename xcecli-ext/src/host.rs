//! `host cordon|uncordon|drain NAME` (admin) and `host drain NAME --wait`, which follows
//! the drain until no replica is left on the host, printing what is left per service on
//! stderr whenever it changes.

use crate::client::Client;
use crate::error::{CliError, ErrorKind};
use crate::io::Io;
use crate::model::HostAnswer;
use std::io::Write;
use std::time::Duration;

/// How often `--wait` reads the host list (the host answer has no blocking query).
const POLL: Duration = Duration::from_millis(500);

/// `POST /v1/hosts/{name}/{action}`; prints the host's new state on stdout:
/// `host exec-02 cordoned`, `host exec-02 uncordoned`, `host exec-02 draining: 4 replicas
/// left` (or `drained`).
pub(crate) async fn act(
    name: &str,
    action: &str,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let answer = client.host_action(name, action).await?;
    let line = match state_line(&answer.value) {
        Some(s) => format!("host {name} {s}\n"),
        None => format!("host {name} uncordoned\n"),
    };
    io.stdout.write_all(line.as_bytes()).map_err(CliError::io)?;
    io.stdout.flush().map_err(CliError::io)
}

/// `cordoned`, `draining: N replicas left (default/web 2, …)` or `drained`; `None` for a
/// host in service.
fn state_line(h: &HostAnswer) -> Option<String> {
    let m = h.maintenance.as_ref()?;
    if m.state != "draining" {
        return Some(m.state.to_string());
    }
    let per: Vec<String> = m
        .services
        .iter()
        .map(|s| format!("{}/{} {}", s.project, s.name, s.replicas))
        .collect();
    Some(format!(
        "draining: {} replicas left ({})",
        m.left,
        per.join(", ")
    ))
}

/// `--wait`: reads the host until its drain is done (exit 0), someone uncordoned it
/// (exit 1: the drain will not finish), the host is gone (exit 4), or `timeout` runs out
/// (exit 3). A line on stderr whenever what is left changes.
pub(crate) async fn until_drained(
    name: &str,
    timeout: Duration,
    client: &Client,
    io: &mut Io,
) -> Result<(), CliError> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<String> = None;
    loop {
        let list = client.hosts().await?.value;
        let Some(h) = list.hosts.iter().find(|h| h.id == name) else {
            return Err(CliError::new(
                ErrorKind::NotFound,
                format!("host {name:?} is no longer registered"),
            ));
        };
        let Some(line) = state_line(h) else {
            return Err(CliError::new(
                ErrorKind::Invalid,
                format!("host {name} was uncordoned while it drained: the drain stopped"),
            ));
        };
        if last.as_deref() != Some(line.as_str()) {
            let out = format!("host {name} {line}\n");
            io.stderr.write_all(out.as_bytes()).map_err(CliError::io)?;
            io.stderr.flush().map_err(CliError::io)?;
            last = Some(line);
        }
        if h.maintenance.as_ref().is_some_and(|m| m.state == "drained") {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            let left = h.maintenance.as_ref().map_or(0, |m| m.left);
            return Err(CliError::new(
                ErrorKind::Timeout,
                format!("host {name} still has {left} replicas after {timeout:?}"),
            ));
        }
        tokio::time::sleep(
            POLL.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
        )
        .await;
    }
}
