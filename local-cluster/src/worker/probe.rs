//! Readiness probing: one task per job probes as its profile says and tells the state task
//! about transitions only.

use plugin_api::JobId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::mpsc;

use super::msg::Msg;
use super::procfs;
use crate::profile::{Probe, Readiness};

/// Turns probe outcomes into transitions: `Some(ready)` only when the outcome differs
/// from the last one reported.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transitions {
    last: bool,
}

impl Transitions {
    /// Starts from the last reported outcome (`false` for a new job).
    pub(crate) fn new(last: bool) -> Self {
        Self { last }
    }

    /// Feeds one outcome; returns the transition to report, if any.
    pub(crate) fn observe(&mut self, ready: bool) -> Option<bool> {
        (ready != self.last).then(|| {
            self.last = ready;
            ready
        })
    }
}

/// Why one probe failed (for debug logs only).
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("timed out")]
    Timeout,
    #[error("{0}")]
    Connect(std::io::Error),
    #[error("{0}")]
    Http(reqwest::Error),
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
}

/// What one job's prober needs.
#[derive(Debug)]
pub(crate) struct ProbeJob {
    pub(crate) job: JobId,
    pub(crate) pid: u32,
    pub(crate) start_time: u64,
    pub(crate) readiness: Readiness,
    pub(crate) sockets: BTreeMap<String, SocketAddr>,
    /// The last outcome reported for the job.
    pub(crate) last: bool,
}

/// A shared HTTP client for probes: no proxy (replicas are local to the host), no
/// redirects (a 3xx already counts as ready).
pub(crate) fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("a client without tls or proxies builds")
}

async fn probe_once(
    http: &reqwest::Client,
    probe: &Probe,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<(), ProbeError> {
    match probe {
        Probe::Tcp { .. } => {
            match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                Err(_) => Err(ProbeError::Timeout),
                Ok(Err(e)) => Err(ProbeError::Connect(e)),
                Ok(Ok(_stream)) => Ok(()),
            }
        }
        Probe::Http { path, .. } => {
            let resp = http
                .get(format!("http://{addr}{path}"))
                .timeout(timeout)
                .send()
                .await
                .map_err(|e| {
                    if e.is_timeout() {
                        ProbeError::Timeout
                    } else {
                        ProbeError::Http(e)
                    }
                })?;
            let status = resp.status();
            if status.is_success() || status.is_redirection() {
                Ok(())
            } else {
                Err(ProbeError::Status(status))
            }
        }
    }
}

/// Probes every `interval` until aborted (the state task aborts it when the job ends).
pub(crate) async fn run(pj: ProbeJob, http: reqwest::Client, owner: mpsc::Sender<Msg>) {
    let socket = match &pj.readiness.probe {
        Probe::Tcp { socket } | Probe::Http { socket, .. } => socket,
    };
    let Some(&addr) = pj.sockets.get(socket) else {
        tracing::warn!(
            socket,
            "readiness probe names a socket the launch plan does not have; the job will never be ready"
        );
        return;
    };
    let mut filter = Transitions::new(pj.last);
    let mut tick = tokio::time::interval(pj.readiness.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let outcome = probe_once(&http, &pj.readiness.probe, addr, pj.readiness.timeout).await;
        if let Err(e) = &outcome {
            tracing::trace!(%addr, error = %e, "probe failed");
        }
        let ready = outcome.is_ok();
        if !ready && !procfs::is_same_and_live(pj.pid, pj.start_time) {
            // The process is gone: its exit, not a readiness change, is the news.
            return;
        }
        if let Some(ready) = filter.observe(ready) {
            tracing::info!(ready, "readiness changed");
            let msg = Msg::Ready {
                job: pj.job.clone(),
                pid: pj.pid,
                ready,
            };
            if owner.send(msg).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(start: bool, outcomes: &str, expect: expect_test::Expect) {
        let mut t = Transitions::new(start);
        let out: Vec<String> = outcomes
            .chars()
            .map(|c| match t.observe(c == '1') {
                Some(true) => "up".to_owned(),
                Some(false) => "down".to_owned(),
                None => "-".to_owned(),
            })
            .collect();
        expect.assert_eq(&out.join(" "));
    }

    #[test]
    fn reports_transitions_only() {
        check(false, "0011101", expect_test::expect!["- - up - - down up"]);
    }

    #[test]
    fn an_adopted_ready_job_reports_nothing_while_it_stays_ready() {
        check(true, "111", expect_test::expect!["- - -"]);
        check(true, "10", expect_test::expect!["- down"]);
    }
}
