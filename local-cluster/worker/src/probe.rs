//! Readiness probing: one task per job probes as its profile says and tells the state task
//! about transitions only.

use plugin_api::JobId;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::mpsc;

use super::msg::Msg;
use super::procfs;
use xce_proto::profile::{Probe, Readiness};

/// Turns probe outcomes into transitions: `Some(ready)` only when the last
/// `threshold` outcomes in a row differ from the last one reported (the failure threshold
/// for a ready job, the success threshold for an unready one).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Transitions {
    last: bool,
    /// Outcomes in a row that differed from `last`.
    streak: u32,
    failures: u32,
    successes: u32,
}

impl Transitions {
    /// Starts from the last reported outcome (`false` for a new job), with the
    /// profile's thresholds (each at least 1).
    pub(crate) fn new(last: bool, failures: u32, successes: u32) -> Self {
        Self {
            last,
            streak: 0,
            failures: failures.max(1),
            successes: successes.max(1),
        }
    }

    /// Feeds one outcome; returns the transition to report, if any.
    pub(crate) fn observe(&mut self, ready: bool) -> Option<bool> {
        if ready == self.last {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if ready { self.successes } else { self.failures };
        (self.streak >= needed).then(|| {
            self.last = ready;
            self.streak = 0;
            ready
        })
    }
}

/// Why one probe failed: the text of a failing probe's result, as the worker logs it and
/// the controller shows it in the rollout's reason.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("{}", io_words(.0))]
    Connect(std::io::Error),
    #[error("{}", http_words(.0))]
    Http(reqwest::Error),
    #[error("answered {}", .0.as_u16())]
    Status(reqwest::StatusCode),
}

/// An I/O error in a few words: `connection refused` rather than `Connection refused
/// (os error 111)`.
fn io_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::ConnectionReset => "connection reset".into(),
        K::ConnectionAborted => "connection aborted".into(),
        K::TimedOut => "timed out".into(),
        K::UnexpectedEof => "connection closed before an answer".into(),
        _ => e.to_string(),
    }
}

/// A request error by its innermost cause (reqwest's own text names the URL, which the
/// probe's description already says): the I/O error when there is one.
fn http_words(e: &reqwest::Error) -> String {
    let mut cause: &dyn std::error::Error = e;
    while let Some(next) = cause.source() {
        if let Some(io) = next.downcast_ref::<std::io::Error>() {
            return io_words(io);
        }
        cause = next;
    }
    cause.to_string()
}

/// A failing probe's result in words, naming the probe: `readiness GET / answered 404`,
/// `readiness GET /: connection refused`, `readiness TCP 127.0.0.1:8080: timed out after
/// 1s`.
fn describe(probe: &Probe, addr: SocketAddr, e: &ProbeError) -> String {
    match (probe, e) {
        (Probe::Http { path, .. }, ProbeError::Status(_)) => format!("readiness GET {path} {e}"),
        (Probe::Http { path, .. }, _) => format!("readiness GET {path}: {e}"),
        (Probe::Tcp { .. }, _) => format!("readiness TCP {addr}: {e}"),
    }
}

/// The failing results a job's prober reports while the job is not ready: each one whose
/// text differs from the last one reported (a probe failing the same way every second is
/// reported once, and logged once).
#[derive(Debug, Default)]
pub(crate) struct FailureNotes {
    last: Option<String>,
}

impl FailureNotes {
    /// Feeds the result of one probe (`None`: it passed); returns the text to report.
    pub(crate) fn observe(&mut self, failure: Option<String>) -> Option<String> {
        match failure {
            None => {
                self.last = None;
                None
            }
            Some(text) if self.last.as_deref() == Some(text.as_str()) => None,
            Some(text) => {
                self.last = Some(text.clone());
                Some(text)
            }
        }
    }
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
                Err(_) => Err(ProbeError::Timeout(timeout)),
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
                        ProbeError::Timeout(timeout)
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
    let mut filter = Transitions::new(
        pj.last,
        pj.readiness.failure_threshold,
        pj.readiness.success_threshold,
    );
    let mut tick = tokio::time::interval(pj.readiness.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut notes = FailureNotes::default();
    let mut reported = pj.last;
    loop {
        tick.tick().await;
        let outcome = probe_once(&http, &pj.readiness.probe, addr, pj.readiness.timeout).await;
        let failure = outcome
            .as_ref()
            .err()
            .map(|e| describe(&pj.readiness.probe, addr, e));
        let ready = outcome.is_ok();
        if !ready && !procfs::is_same_and_live(pj.pid, pj.start_time) {
            // The process is gone: its exit, not a readiness change, is the news.
            return;
        }
        let transition = filter.observe(ready);
        if let Some(r) = transition {
            reported = r;
        }
        // While the job is not ready (as reported), a failing result whose text changed is
        // news too: it says what the job's rollout waits for.
        let note = if reported {
            None
        } else {
            notes.observe(failure)
        };
        if reported {
            notes.observe(None);
        }
        if let Some(ready) = transition {
            // The last failure says why a replica left its endpoint (a timeout under
            // load reads differently from a refused connection).
            match &note {
                Some(last_probe) => tracing::info!(ready, %last_probe, "readiness changed"),
                None => tracing::info!(ready, "readiness changed"),
            }
        } else if let Some(last_probe) = &note {
            tracing::info!(%last_probe, "readiness probe failing");
        } else {
            continue;
        }
        let msg = Msg::Ready {
            job: pj.job.clone(),
            pid: pj.pid,
            ready: reported,
            probe: note,
        };
        if owner.send(msg).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(start: bool, outcomes: &str, expect: expect_test::Expect) {
        check_with(start, 1, 1, outcomes, expect);
    }

    fn check_with(
        start: bool,
        failures: u32,
        successes: u32,
        outcomes: &str,
        expect: expect_test::Expect,
    ) {
        let mut t = Transitions::new(start, failures, successes);
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

    #[test]
    fn thresholds_need_that_many_outcomes_in_a_row() {
        // Failure threshold 3: two failures and a success keep the replica ready.
        check_with(
            true,
            3,
            1,
            "1001000",
            expect_test::expect!["- - - - - - down"],
        );
        // Success threshold 2: an alternating probe never makes it ready.
        check_with(false, 1, 2, "101010", expect_test::expect!["- - - - - -"]);
        check_with(false, 1, 2, "0110", expect_test::expect!["- - up down"]);
    }

    proptest::proptest! {
        /// Against a model that reads the whole history: a transition is reported exactly
        /// when the last `threshold` outcomes all differ from the state reported before.
        #[test]
        fn reports_exactly_what_the_history_says(
            start: bool,
            failures in 1u32..5,
            successes in 1u32..5,
            outcomes in proptest::collection::vec(proptest::bool::ANY, 0..60),
        ) {
            let mut t = Transitions::new(start, failures, successes);
            let mut state = start;
            // Outcomes since the state was last reported (or since the start).
            let mut since = 0usize;
            for (i, &o) in outcomes.iter().enumerate() {
                let got = t.observe(o);
                since += 1;
                let needed = if state { failures } else { successes } as usize;
                let window = &outcomes[i + 1 - since.min(needed)..=i];
                let expected = (window.len() == needed && window.iter().all(|&w| w != state))
                    .then_some(!state);
                proptest::prop_assert_eq!(got, expected, "outcome {} of {:?}", i, outcomes);
                if let Some(s) = got {
                    state = s;
                    since = 0;
                }
            }
        }
    }
}
