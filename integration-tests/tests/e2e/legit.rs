//! The legitimate client beside a fault or an attack: it reads a service's endpoints at a
//! steady pace, each read on a new connection (as `curl` would) and in a task of its own
//! (a slow read does not hold up the next), and keeps every outcome, so a test can say how
//! many reads were answered and how fast while the fault lasted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// One read: when it started, how long it took when it was answered (200 with an
/// `endpoints` array), else why not.
#[derive(Debug, Clone)]
pub struct LegitRead {
    pub at: Instant,
    pub answered: Option<Duration>,
    pub error: Option<String>,
}

/// Reads `url` (an endpoint answer) as `token` through `http` every `every` until `stop`
/// says so; each finished read lands in `out`. The task ends once every read has ended.
/// `http` should keep no idle connections (`pool_max_idle_per_host(0)`) and carry the
/// read timeout.
pub fn legit_reader(
    http: reqwest::Client,
    url: String,
    token: String,
    every: Duration,
    mut stop: watch::Receiver<bool>,
    out: Arc<Mutex<Vec<LegitRead>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        let mut reads = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
            let (http, url, token, out) = (http.clone(), url.clone(), token.clone(), out.clone());
            reads.spawn(async move {
                let at = Instant::now();
                let read = match read_once(&http, &url, &token).await {
                    Ok(()) => LegitRead {
                        at,
                        answered: Some(at.elapsed()),
                        error: None,
                    },
                    Err(e) => LegitRead {
                        at,
                        answered: None,
                        error: Some(format!("{e:#}")),
                    },
                };
                out.lock().unwrap().push(read);
            });
        }
        while reads.join_next().await.is_some() {}
    })
}

async fn read_once(http: &reqwest::Client, url: &str, token: &str) -> anyhow::Result<()> {
    let resp = http.get(url).bearer_auth(token).send().await?;
    let status = resp.status().as_u16();
    let body = resp.text().await?;
    anyhow::ensure!(status == 200, "HTTP {status}: {body}");
    let entry: serde_json::Value = serde_json::from_str(&body)?;
    anyhow::ensure!(entry["endpoints"].is_array(), "no endpoints: {body}");
    Ok(())
}
