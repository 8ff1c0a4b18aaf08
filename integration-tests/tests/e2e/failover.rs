//! A leader that stops answering without dying (SIGSTOP: it keeps its connections open and
//! its etcd lease until the lease runs out) on etcd HA, and what clients see meanwhile:
//! the workers leave it for the standby that takes over, nothing is stopped, the endpoint
//! table never empties; the apiserver answers 503 `no_leader` with `Retry-After` during a
//! takeover and `xcecli` reads wait for the new leader.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The grace period of this fleet's controllers (shorter than the default 30 s, so the
/// freeze outlasts it quickly); `unreachable_after` stays 3 s.
const GRACE: Duration = Duration::from_secs(8);

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "kill {sig} {pid}");
}

/// Lines of the file at `path` that contain every one of `needles`.
fn count_lines(path: &std::path::Path, needles: &[&str]) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .count()
}

fn count(path: &std::path::Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .matches(needle)
        .count()
}

/// The live job ids of `web`.
async fn job_ids(api: &Api) -> Result<BTreeSet<String>> {
    let svc = api.get_json("/v1/services/web").await?;
    Ok(svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .filter_map(|j| j["job"].as_str().map(str::to_owned))
        .collect())
}

async fn ready_hosts(api: &Api) -> Result<usize> {
    let h = api.get_json("/v1/hosts").await?;
    Ok(h["hosts"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count()))
}

/// Polls the plain endpoint list of `web` on every controller every 100 ms; records how
/// long it was empty (an answer with no endpoint) and how long no controller answered.
struct Watcher {
    stop: Arc<AtomicBool>,
    /// (empty windows, longest time without any answer)
    result: Arc<Mutex<(Vec<Duration>, Duration)>>,
    /// How many answers it had.
    answers: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Watcher {
    fn start(ports: [u16; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let result = Arc::new(Mutex::new((Vec::new(), Duration::ZERO)));
        let answers = Arc::new(AtomicU64::new(0));
        let (s, r, n) = (stop.clone(), result.clone(), answers.clone());
        let task = tokio::spawn(async move {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_millis(300))
                .build()
                .unwrap();
            let mut empty_since: Option<Instant> = None;
            let mut last_answer = Instant::now();
            while !s.load(Ordering::Relaxed) {
                for port in ports {
                    let url =
                        format!("http://127.0.0.1:{port}/v1/services/web/endpoints?format=plain");
                    let Ok(resp) = http.get(&url).bearer_auth(ADMIN).send().await else {
                        continue;
                    };
                    if resp.status() != 200 {
                        continue;
                    }
                    let Ok(body) = resp.text().await else {
                        continue;
                    };
                    let now = Instant::now();
                    n.fetch_add(1, Ordering::Relaxed);
                    {
                        let mut g = r.lock().unwrap();
                        g.1 = g.1.max(now - last_answer);
                    }
                    last_answer = now;
                    if body.lines().count() == 0 {
                        empty_since.get_or_insert(now);
                    } else if let Some(t) = empty_since.take() {
                        r.lock().unwrap().0.push(now - t);
                    }
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if let Some(t) = empty_since {
                r.lock().unwrap().0.push(t.elapsed());
            }
        });
        Self {
            stop,
            result,
            answers,
            task,
        }
    }

    /// Waits until it has had an answer: it watches.
    async fn watching(&self) {
        eventually("the watcher's first answer", || async {
            Ok((self.answers.load(Ordering::Relaxed) > 0).then_some(()))
        })
        .await;
    }

    async fn finish(self) -> (Vec<Duration>, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let r = self.result.lock().unwrap().clone();
        r
    }
}

/// A fleet of 2 controllers with a grace period of [`GRACE`], `workers` workers and
/// `apiservers` apiservers; controller 0 leads, controller 1 waits.
async fn fleet(workers: usize, apiservers: usize) -> Fleet {
    let etcd = EtcdCluster::start(1).await.expect("etcd");
    let mut ha = Fleet::new(etcd, workers, apiservers).expect("cluster dir");
    for c in 0..2 {
        let path = ha.dir.path().join(format!("controller-{c}.toml"));
        let text = std::fs::read_to_string(&path).unwrap();
        let grace = format!("grace_period = \"{}s\"", GRACE.as_secs());
        std::fs::write(&path, text.replace("grace_period = \"30s\"", &grace)).unwrap();
    }
    ha.start_leader_and_standby().await;
    ha
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_frozen_past_the_grace_period_workers_move_to_the_standby_and_nothing_stops() {
    let mut ha = fleet(3, 0).await;
    ha.start_workers(2).unwrap();
    let a = ha.controller_api(0);
    eventually("2 ready hosts", || async {
        Ok((ready_hosts(&a).await? == 2).then_some(()))
    })
    .await;
    let web = http_service("web", 4).interval("500ms").toml();
    assert_eq!(a.submit_toml(&web).await.unwrap().0, 201);
    let mut eps_before = a.wait_ready("web", 4).await;
    eps_before.sort();
    // A third host, exec-03, with no replica: it dies with the freeze, so that the new
    // leader's judgement of it — lost one grace period after it fell silent — shows when
    // a host judged on the frozen leader's silence would have been lost too.
    ha.start_worker(2).unwrap();
    eventually("3 ready hosts", || async {
        Ok((ready_hosts(&a).await? == 3).then_some(()))
    })
    .await;
    let jobs_before = job_ids(&a).await.unwrap();
    let worker_logs: Vec<_> = (0..2).map(|i| ha.log(&format!("worker-{i}"))).collect();
    let switched_before: Vec<usize> = worker_logs
        .iter()
        .map(|l| count(l, "switched to the controller that answers"))
        .collect();
    let stops_before: usize = worker_logs
        .iter()
        .map(|l| count(l, "stopping replica"))
        .sum();

    let watcher = Watcher::start(ha.controller_ports);
    watcher.watching().await;
    let pid0 = ha.controllers[0].as_ref().unwrap().child.id();
    let _ = ha.workers[2].kill();
    let _ = ha.workers[2].wait();
    signal(pid0, "-STOP");
    let frozen = Instant::now();

    // The standby takes over once the frozen leader's lease runs out.
    ha.wait_announced(1).await;
    let takeover = ha.announced_at(1).unwrap() - frozen;

    // Both workers leave the frozen leader: their heartbeats reach the new one.
    let mut moved = Vec::new();
    for (i, log) in worker_logs.iter().enumerate() {
        eventually(&format!("worker {i} moved to controller 1"), || async {
            Ok(
                (count(log, "switched to the controller that answers") > switched_before[i])
                    .then_some(()),
            )
        })
        .await;
        moved.push(frozen.elapsed());
    }
    let workers_moved = moved.into_iter().max().unwrap();
    let b = ha.controller_api(1);
    eventually("2 ready hosts on controller 1", || async {
        Ok((ready_hosts(&b).await? == 2).then_some(()))
    })
    .await;

    // Frozen past the grace period: the new leader declares the dead exec-03 lost, and
    // keeps every other host and replica.
    let log1 = ha.log("controller-1");
    eventually("controller 1 declares exec-03 lost", || async {
        Ok((count_lines(&log1, &["host lost", "exec-03"]) > 0).then_some(()))
    })
    .await;
    let freeze = frozen.elapsed();
    assert!(freeze > GRACE, "frozen past the grace period: {freeze:?}");
    let jobs_frozen = job_ids(&b).await.unwrap();
    let lost_on_new = ["host lost", "host unreachable"]
        .iter()
        .map(|what| count_lines(&log1, &[what]) - count_lines(&log1, &[what, "exec-03"]))
        .sum::<usize>();

    // The old leader continues: deposed (its lease is gone), it must do no damage.
    let old_log = ha.log("controller-0");
    let old_lines = std::fs::read_to_string(&old_log)
        .unwrap_or_default()
        .lines()
        .count();
    signal(pid0, "-CONT");
    let resumed = Instant::now();
    // Deposed, it drops its state and waits as a standby in the same process (issue 12,
    // bug 8; it used to exit with status 1).
    let old_role = loop {
        if let Some(st) = ha.controllers[0]
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
        {
            break format!("exited ({st})");
        }
        if let Some((200, body)) = healthz(ha.controller_ports[0]) {
            if body.starts_with("standby") {
                break "a standby".to_owned();
            }
        }
        assert!(
            resumed.elapsed() < patience(),
            "the old leader neither stood by nor exited"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let old_role_after = resumed.elapsed();
    // Whatever the deposed leader set in motion before it stood by has reached the
    // workers by the time each of them has taken a later order of the new leader: a
    // service with a replica on each host, ready. A worker takes its orders in turn,
    // and reports in turn, so a replica it was told to stop would be reported gone
    // before the new one ready.
    let probe = http_service("probe", 2).interval("500ms").toml();
    assert_eq!(b.submit_toml(&probe).await.unwrap().0, 201);
    b.wait_ready("probe", 2).await;
    let probe_hosts: BTreeSet<String> = b.get_json("/v1/services/probe").await.unwrap()["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["host"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(
        probe_hosts.len(),
        2,
        "a probe replica on each host: {probe_hosts:?}"
    );
    let (empty_windows, longest_unanswered) = watcher.finish().await;

    let jobs_after = job_ids(&b).await.unwrap();
    let mut eps_after = b.plain("web").await.unwrap();
    eps_after.sort();
    let stopped: usize = worker_logs
        .iter()
        .map(|l| count(l, "stopping replica"))
        .sum::<usize>()
        - stops_before;
    let old_said: Vec<String> = std::fs::read_to_string(&old_log)
        .unwrap_or_default()
        .lines()
        .skip(old_lines)
        .filter(|l| l.contains("WARN") || l.contains("ERROR") || l.contains("leader"))
        .map(|l| l.chars().take(220).collect())
        .collect();
    println!(
        "FIGURE leader frozen {}s past grace_period {}s (leader_ttl {LEADER_TTL}): takeover {} ms, workers moved {} ms after the freeze, replicas stopped {stopped}, jobs changed {}, endpoint empty windows {} (longest {} ms), longest time without an endpoint answer {} ms, host unreachable/lost on the new leader {lost_on_new}",
        freeze.as_secs(),
        GRACE.as_secs(),
        takeover.as_millis(),
        workers_moved.as_millis(),
        jobs_before.symmetric_difference(&jobs_after).count(),
        empty_windows.len(),
        empty_windows.iter().max().map_or(0, Duration::as_millis),
        longest_unanswered.as_millis(),
    );
    println!(
        "FIGURE old leader after SIGCONT: {old_role} after {} ms; its log since: {old_said:#?}",
        old_role_after.as_millis()
    );
    assert_eq!(jobs_frozen, jobs_before, "the same jobs during the freeze");
    assert_eq!(jobs_after, jobs_before, "the same jobs after SIGCONT");
    assert_eq!(eps_after, eps_before, "the same endpoints");
    assert_eq!(stopped, 0, "no replica stopped");
    assert!(
        empty_windows.is_empty(),
        "endpoint list empty: {empty_windows:?}"
    );
    assert_eq!(
        lost_on_new, 0,
        "the new leader judged a host on the old one's silence"
    );
    assert!(
        ha.serving_controller().ok() == Some(1),
        "controller 1 still leads"
    );
    assert_eq!(
        old_role, "a standby",
        "the deposed leader waits as a standby"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_takeover_the_apiserver_answers_503_no_leader_and_xcecli_reads_wait() {
    let mut ha = fleet(0, 1).await;
    ha.start_apiserver(0).unwrap();
    eventually("the apiserver serves", || async {
        Ok(ha.apiservers[0].as_ref().unwrap().announced().then_some(()))
    })
    .await;
    let api = ha.apiserver(0);
    eventually("hosts through the apiserver", || async {
        Ok((api.get("/v1/hosts").await?.0 == 200).then_some(()))
    })
    .await;
    let config = ha.dir.path().join("client.toml");
    std::fs::write(
        &config,
        format!(
            "api = \"http://127.0.0.1:{}\"\ntoken = \"{ADMIN}\"\n",
            ha.apiserver_ports[0]
        ),
    )
    .unwrap();

    ha.kill_9_controller(0);
    let killed = Instant::now();
    // xcecli, started right away, waits for the new leader within its own deadline.
    let cli = tokio::task::spawn_blocking({
        let config = config.clone();
        move || {
            let out = xcecli_with(&config, &["host", "list", "-o", "json"], &[]);
            (out, killed.elapsed())
        }
    });
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let served = loop {
        let (status, headers, body) = api.get("/v1/hosts").await.unwrap();
        let key = match status {
            503 => {
                assert!(body.contains(r#""code":"no_leader""#), "{body}");
                assert_eq!(headers["retry-after"], "1", "Retry-After on a 503");
                "503 no_leader".to_owned()
            }
            s => s.to_string(),
        };
        *seen.entry(key).or_default() += 1;
        if status == 200 {
            break killed.elapsed();
        }
        assert!(killed.elapsed() < patience(), "no new leader: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (out, cli_took) = cli.await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let retries = stderr.matches("retrying in").count();
    println!(
        "FIGURE apiserver during a takeover (leader kill -9, leader_ttl {LEADER_TTL}): answers {seen:?}, new leader served after {} ms; xcecli host list exit {:?} after {} ms with {retries} retries noted",
        served.as_millis(),
        out.status.code(),
        cli_took.as_millis()
    );
    assert!(
        seen.keys().all(|k| k == "200" || k == "503 no_leader"),
        "only 503 no_leader before the new leader: {seen:?}"
    );
    assert!(
        seen.contains_key("503 no_leader"),
        "the takeover was seen: {seen:?}"
    );
    assert_eq!(out.status.code(), Some(0), "xcecli: {stderr}");
    assert!(
        retries > 0 && stderr.contains("a leader controller answers again"),
        "{stderr}"
    );
}
