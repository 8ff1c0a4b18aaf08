//! Scale out on etcd (issue #8): a 3-member etcd on loopback, two controllers (one
//! leads, one waits), two `xced apiserver`s serving the endpoint table from their own etcd
//! watch and forwarding everything else to the leader, two workers that talk to the
//! leader through the apiservers. The active controller is killed with SIGKILL in the
//! middle of a rolling replacement of the replicas, then one etcd member.

use crate::daemons::*;
use crate::harness::*;
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Child;
use std::time::{Duration, Instant};

/// The leader lease TTL the controllers run with.
const LEADER_TTL: &str = "3s";
const REPLICAS: usize = 4;

/// The cluster, in a temp dir: etcd, two controllers, two apiservers, two workers.
struct Scale {
    dir: tempfile::TempDir,
    controller_ports: [u16; 2],
    apiserver_ports: [u16; 2],
    first_ip: std::net::Ipv4Addr,
    controllers: [Option<Daemon>; 2],
    apiservers: [Option<Daemon>; 2],
    workers: Vec<Child>,
    etcd: Option<EtcdCluster>,
}

impl Scale {
    fn new(etcd: EtcdCluster, workers: usize) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let controller_ports = [free_port(), free_port()];
        let apiserver_ports = [free_port(), free_port()];
        let first_ip = ip_block();
        let store = etcd.url();
        let tokens_path = dir.path().join("tokens.toml");
        let tokens = admin_and_worker_tokens(workers);
        std::fs::write(&tokens_path, tokens)?;
        for (c, port) in controller_ports.iter().enumerate() {
            std::fs::write(
                dir.path().join(format!("controller-{c}.toml")),
                format!(
                    "listen = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\ntokens = \"{}\"\nstore = \"{store}\"\nleader_ttl = \"{LEADER_TTL}\"\nunreachable_after = \"3s\"\ngrace_period = \"30s\"\n\n[address]\nallow_loopback_hosts = [\"*\"]\n",
                    dir.path().join(format!("controller-{c}")).display(),
                    tokens_path.display(),
                ),
            )?;
        }
        for (a, port) in apiserver_ports.iter().enumerate() {
            std::fs::write(
                dir.path().join(format!("apiserver-{a}.toml")),
                format!(
                    "listen = \"127.0.0.1:{port}\"\ntokens = \"{}\"\nstore = \"{store}\"\n",
                    tokens_path.display(),
                ),
            )?;
        }
        let via = apiserver_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let s = Self {
            dir,
            controller_ports,
            apiserver_ports,
            first_ip,
            controllers: [None, None],
            apiservers: [None, None],
            workers: Vec::new(),
            etcd: Some(etcd),
        };
        for i in 0..workers {
            std::fs::write(
                s.dir.path().join(format!("worker-{i}.toml")),
                format!(
                    "host = \"exec-{:02}\"\ncontroller = \"{via}\"\ncredential = \"worker-{i}-secret\"\ndata_dir = \"{}\"\nstop_timeout = \"3s\"\n\n[address]\nadvertise = \"{}\"\nallow_loopback = true\n",
                    i + 1,
                    s.dir.path().join(format!("worker-{i}")).display(),
                    s.ip(i),
                ),
            )?;
        }
        Ok(s)
    }

    fn ip(&self, i: usize) -> String {
        let o = self.first_ip.octets();
        std::net::Ipv4Addr::new(o[0], o[1], o[2], o[3] + i as u8).to_string()
    }

    /// The controller's own listener (it only listens while it leads).
    fn controller_api(&self, c: usize) -> Api {
        Api::new(
            &format!("http://127.0.0.1:{}", self.controller_ports[c]),
            ADMIN,
        )
    }

    fn apiserver(&self, a: usize) -> Api {
        Api::new(
            &format!("http://127.0.0.1:{}", self.apiserver_ports[a]),
            ADMIN,
        )
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    fn start_controller(&mut self, c: usize) -> Result<()> {
        let d = spawn_xced(
            &["controller"],
            &self.dir.path().join(format!("controller-{c}.toml")),
            &self.log(&format!("controller-{c}")),
        )?;
        self.controllers[c] = Some(d);
        Ok(())
    }

    fn start_apiserver(&mut self, a: usize) -> Result<()> {
        let d = spawn_xced(
            &["apiserver"],
            &self.dir.path().join(format!("apiserver-{a}.toml")),
            &self.log(&format!("apiserver-{a}")),
        )?;
        self.apiservers[a] = Some(d);
        Ok(())
    }

    fn start_workers(&mut self, n: usize) -> Result<()> {
        for i in 0..n {
            let d = spawn_xced(
                &["worker"],
                &self.dir.path().join(format!("worker-{i}.toml")),
                &self.log(&format!("worker-{i}")),
            )?;
            self.workers.push(d.child);
        }
        Ok(())
    }

    fn kill_9_controller(&mut self, c: usize) {
        if let Some(mut d) = self.controllers[c].take() {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }

    /// The controller that serves now (standbys do not listen, a dead one neither).
    fn serving_controller(&self) -> Result<usize> {
        (0..2)
            .find(|&c| {
                self.controllers[c].is_some()
                    && std::net::TcpStream::connect(("127.0.0.1", self.controller_ports[c])).is_ok()
            })
            .context("no controller serves")
    }

    fn announced_at(&self, c: usize) -> Option<Instant> {
        self.controllers[c].as_ref().and_then(Daemon::announced_at)
    }

    /// The cluster has settled on `REPLICAS` ready replicas, none of them a job in `gone`:
    /// the leader lists them running and ready, and the endpoints answer is the same byte
    /// for byte on both apiservers and on the leader's own listener.
    async fn converged(&self, leader: usize, gone: &BTreeSet<String>) -> Result<Option<Snap>> {
        let svc = self.apiserver(0).get_json("/v1/services/web").await?;
        let jobs = jobs(&svc)?;
        if jobs.len() != REPLICAS
            || jobs.values().any(|j| !j.ready || j.state != "running")
            || jobs.keys().any(|j| gone.contains(j))
        {
            bail!(
                "not settled: jobs {jobs:?}, pending {}, gone {gone:?}",
                svc["pending"]
            );
        }
        let mut answers = Vec::new();
        for api in [
            self.apiserver(0),
            self.apiserver(1),
            self.controller_api(leader),
        ] {
            let (status, headers, body) = api.get("/v1/services/web/endpoints").await?;
            if status != 200 {
                bail!("{}: HTTP {status}: {body}", api.base);
            }
            let index = headers
                .get("x-xce-index")
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                .with_context(|| format!("{}: no X-Xce-Index", api.base))?;
            answers.push((api.base, index, body));
        }
        let (_, index, body) = answers[0].clone();
        if answers.iter().any(|(_, i, b)| *i != index || *b != body) {
            return Err(anyhow!("the endpoint answers differ: {answers:#?}"));
        }
        let entry: Value = serde_json::from_str(&body)?;
        if entry["index"].as_u64() != Some(index) {
            bail!("body index differs from X-Xce-Index {index}: {body}");
        }
        let eps = entry_endpoints(&entry);
        let ep_jobs: BTreeSet<String> = eps.iter().map(|(_, j, _)| j.clone()).collect();
        if eps.len() != REPLICAS || ep_jobs != jobs.keys().cloned().collect() {
            bail!("endpoints {eps:?} are not those of the jobs {jobs:?}");
        }
        Ok(Some(Snap {
            jobs,
            addrs: eps.into_iter().map(|(_, j, a)| (j, a)).collect(),
            index,
        }))
    }
}

impl Drop for Scale {
    fn drop(&mut self) {
        // A failed run leaves only its panic message in CI: show what the daemons said.
        if std::thread::panicking() {
            let mut logs: Vec<(String, PathBuf)> = Vec::new();
            for name in ["controller-0", "controller-1", "apiserver-0", "apiserver-1"] {
                logs.push((name.to_owned(), self.log(name)));
            }
            for i in 0..self.workers.len() {
                let name = format!("worker-{i}");
                logs.push((name.clone(), self.log(&name)));
            }
            if let Some(etcd) = &self.etcd {
                for m in 0..etcd.members() {
                    logs.push((format!("etcd-{}", etcd.name(m)), etcd.log(m)));
                }
            }
            dump_logs(&logs);
        }
        // Stop the service through whichever apiserver (or leader) still serves, so no
        // replica outlives the test; then the daemons, then etcd.
        let mut apis: Vec<Api> = (0..2)
            .filter(|&a| self.apiservers[a].is_some())
            .map(|a| self.apiserver(a))
            .collect();
        apis.extend(
            (0..2)
                .filter(|&c| self.controllers[c].is_some())
                .map(|c| self.controller_api(c)),
        );
        stop_service_through(apis, "web");
        for w in &mut self.workers {
            terminate(w);
        }
        for d in self.controllers.iter_mut().flatten() {
            terminate(&mut d.child);
        }
        for d in self.apiservers.iter_mut().flatten() {
            terminate(&mut d.child);
        }
        let ips: Vec<String> = (0..self.workers.len()).map(|i| self.ip(i)).collect();
        kill_leftover_replicas(&ips);
        drop(self.etcd.take());
    }
}

/// One settled state of the service.
#[derive(Debug, Clone)]
struct Snap {
    /// job → where it runs.
    jobs: BTreeMap<String, Job>,
    /// job → `address:port` of its `http` endpoint.
    addrs: BTreeMap<String, String>,
    index: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct Job {
    host: String,
    port: u64,
    state: String,
    ready: bool,
}

/// The jobs of a service's `GET /v1/services/{name}` answer.
fn jobs(svc: &Value) -> Result<BTreeMap<String, Job>> {
    svc["jobs"]
        .as_array()
        .context("jobs")?
        .iter()
        .map(|j| {
            Ok((
                j["job"].as_str().context("job")?.to_owned(),
                Job {
                    host: j["host"].as_str().context("host")?.to_owned(),
                    port: j["ports"]["http"].as_u64().unwrap_or(0),
                    state: j["state"].as_str().unwrap_or("").to_owned(),
                    ready: j["ready"] == true,
                },
            ))
        })
        .collect()
}

/// Every (host, port) and `address:port` a job was ever seen with: a job seen at another
/// place later counts as a reassigned port, as does a place two live jobs share.
#[derive(Default)]
struct Places {
    seen: BTreeMap<String, ((String, u64), String)>,
    reassigned: BTreeSet<String>,
    shared: usize,
}

impl Places {
    fn note(&mut self, snap: &Snap) {
        let mut taken = BTreeSet::new();
        for (job, j) in &snap.jobs {
            let place = (
                (j.host.clone(), j.port),
                snap.addrs.get(job).cloned().unwrap_or_default(),
            );
            if !taken.insert(place.0.clone()) {
                self.shared += 1;
            }
            match self.seen.get(job) {
                Some(before) if *before != place => {
                    self.reassigned.insert(job.clone());
                }
                Some(_) => {}
                None => {
                    self.seen.insert(job.clone(), place);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_controllers_and_two_apiservers_on_a_3_member_etcd_survive_losing_the_leader_and_an_etcd_member(
) {
    let etcd = EtcdCluster::start(3).await.expect("etcd");
    let mut s = Scale::new(etcd, 2).expect("cluster dir");

    // Controller 0 leads; controller 1 waits as a standby.
    s.start_controller(0).unwrap();
    eventually("controller 0 announces its listener", || async {
        Ok(s.announced_at(0).map(|_| ()))
    })
    .await;
    s.start_controller(1).unwrap();
    let standby_log = s.log("controller-1");
    let leader0 = format!("@127.0.0.1:{})", s.controller_ports[0]);
    eventually("controller 1 waits as a standby", || async {
        let text = std::fs::read_to_string(&standby_log).unwrap_or_default();
        Ok(
            (text.contains("standby: waiting for leadership (leader: ") && text.contains(&leader0))
                .then_some(()),
        )
    })
    .await;

    // Two apiservers on the same etcd; the workers reach the leader through them.
    for a in 0..2 {
        s.start_apiserver(a).unwrap();
    }
    for a in 0..2 {
        eventually(&format!("apiserver {a} announces its listener"), || async {
            Ok(s.apiservers[a]
                .as_ref()
                .and_then(Daemon::announced_at)
                .map(|_| ()))
        })
        .await;
    }
    s.start_workers(2).unwrap();
    let a1 = s.apiserver(0);
    let a2 = s.apiserver(1);
    eventually("2 ready hosts (through apiserver 2)", || async {
        let h = a2.get_json("/v1/hosts").await?;
        let ready = h["hosts"]
            .as_array()
            .map_or(0, |a| a.iter().filter(|h| h["state"] == "ready").count());
        Ok((ready == 2).then_some(()))
    })
    .await;

    // `web` through apiserver 1; both apiservers serve its 4 endpoints.
    let web = http_service("web", REPLICAS as u32)
        .interval("500ms")
        .toml();
    let (status, body) = a1.submit_toml(&web).await.unwrap();
    assert_eq!(status, 201, "submit through apiserver 1: {body}");
    let none = BTreeSet::new();
    let first = eventually("4 ready endpoints, the same on every listener", || async {
        s.converged(0, &none).await
    })
    .await;
    for a in [&a1, &a2] {
        assert_eq!(a.plain("web").await.unwrap().len(), REPLICAS);
    }
    let mut places = Places::default();
    places.note(&first);
    let originals: Vec<String> = first.jobs.keys().cloned().collect();

    // Rolling replacement: the original replicas die one at a time, each replaced before
    // the next dies. Right after the second one dies, the active controller gets kill -9.
    let mut gone = BTreeSet::new();
    let mut snap = first.clone();
    let mut replacement_ms = Vec::new();
    let mut announce = Duration::ZERO;
    for (n, victim) in originals.iter().enumerate() {
        let addr = snap.addrs[victim].clone();
        kill_replica_listening_on(&addr).unwrap();
        let mut from = Instant::now();
        gone.insert(victim.clone());
        if n == 1 {
            s.kill_9_controller(0);
            from = Instant::now();
            eventually("controller 1 takes over", || async {
                Ok(s.announced_at(1).map(|_| ()))
            })
            .await;
            announce = s.announced_at(1).unwrap().duration_since(from);
        }
        let leader = usize::from(n > 0);
        snap = eventually(&format!("replica {n} ({addr}) replaced"), || async {
            s.converged(leader, &gone).await
        })
        .await;
        replacement_ms.push(from.elapsed().as_millis());
        places.note(&snap);
    }
    let converged_after_kill_ms = replacement_ms[1];
    assert_eq!(
        places.reassigned,
        BTreeSet::new(),
        "jobs that moved to another host or port"
    );
    assert_eq!(places.shared, 0, "live jobs sharing a (host, port)");
    assert!(
        snap.jobs.keys().all(|j| !originals.contains(j)),
        "every original replica replaced: {snap:?}"
    );
    for addr in snap.addrs.values() {
        assert!(http_ok(addr).await.unwrap(), "{addr} answers HTTP");
    }
    assert!(
        s.controllers[1]
            .as_mut()
            .is_some_and(|d| matches!(d.child.try_wait(), Ok(None))),
        "the new leader runs"
    );

    // An operator brings the killed controller back: it waits as a standby, so that the
    // cluster survives losing its leader again.
    s.start_controller(0).unwrap();
    let log0 = s.log("controller-0");
    eventually("controller 0 is back as a standby", || async {
        let text = std::fs::read_to_string(&log0).unwrap_or_default();
        Ok(text
            .contains("standby: waiting for leadership")
            .then_some(()))
    })
    .await;

    // One etcd member dies: the first endpoint every daemon tries, made the raft leader
    // first (the worst case: an election and a client failover at once). A blocking query on
    // apiserver 2, opened before, answers the change that a replica killed next makes.
    let etcd_member = 0;
    s.etcd.as_ref().unwrap().make_leader(etcd_member).await;
    let blocking = {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(45))
            .build()
            .unwrap();
        let url = format!(
            "{}/v1/services/web/endpoints?index={}&wait=30s",
            a2.base, snap.index
        );
        tokio::spawn(async move {
            let r = http.get(url).bearer_auth(ADMIN).send().await?;
            let status = r.status().as_u16();
            let body = r.text().await?;
            Ok::<_, anyhow::Error>((status, body, Instant::now()))
        })
    };
    s.etcd.as_mut().unwrap().kill_9(etcd_member);
    let member_killed = Instant::now();
    let victim = snap.jobs.keys().next().unwrap().clone();
    let addr = snap.addrs[&victim].clone();
    kill_replica_listening_on(&addr).unwrap();
    gone.insert(victim.clone());
    let (status, body, answered) = blocking.await.unwrap().unwrap();
    assert_eq!(status, 200, "blocking query on apiserver 2: {body}");
    let changed: Value = serde_json::from_str(&body).unwrap();
    assert!(
        changed["index"].as_u64().unwrap_or(0) > snap.index,
        "the blocking query answered without a change: {body}"
    );
    assert!(
        !entry_endpoints(&changed)
            .iter()
            .any(|(_, j, _)| *j == victim),
        "the change the blocking query answered still lists the killed replica: {body}"
    );
    let blocking_ms = answered.duration_since(member_killed).as_millis();
    // The leader may have stopped itself meanwhile: its lease renewals cannot get through
    // while etcd elects a new raft leader, and a leader that cannot be sure of its lease
    // stops (fail-stop). Then the standby takes over; either way the service goes on.
    let after = eventually(
        "the replica killed after the etcd member replaced",
        || async { s.converged(s.serving_controller()?, &gone).await },
    )
    .await;
    let leader_after = s.serving_controller().unwrap();
    let member_loss_recovery_ms = member_killed.elapsed().as_millis();
    places.note(&after);
    let jobs_total = places.seen.len();
    assert_eq!(
        places.reassigned,
        BTreeSet::new(),
        "jobs that moved to another host or port"
    );
    assert_eq!(places.shared, 0, "live jobs sharing a (host, port)");
    for addr in after.addrs.values() {
        assert!(http_ok(addr).await.unwrap(), "{addr} answers HTTP");
    }

    // A client given both apiservers keeps working when the first one is gone.
    if let Some(mut d) = s.apiservers[0].take() {
        let _ = d.child.kill();
        let _ = d.child.wait();
    }
    let client_config = s.dir.path().join("xcecli.toml");
    std::fs::write(
        &client_config,
        format!("api = \"{},{}\"\ntoken = \"{ADMIN}\"\n", a1.base, a2.base),
    )
    .unwrap();
    let out = xcecli_with(
        &client_config,
        &["service", "endpoints", "web", "-o", "plain"],
        &[],
    );
    assert!(out.status.success(), "xcecli --api A1,A2: {}", stderr(&out));
    let mut lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    lines.sort();
    let mut want: Vec<String> = after.addrs.values().cloned().collect();
    want.sort();
    assert_eq!(lines, want, "xcecli through the second apiserver");

    println!(
        "FIGURE scale-out takeover after kill -9 of the active controller mid rolling replacement: standby announced after {} ms, endpoints converged on 2 apiservers + leader after {converged_after_kill_ms} ms (leader_ttl {LEADER_TTL}), jobs={jobs_total} ports_reassigned={} shared_places={}",
        announce.as_millis(),
        places.reassigned.len(),
        places.shared,
    );
    println!(
        "FIGURE scale-out replacement times (ms, kill to identical answers everywhere; #2 spans the takeover): {replacement_ms:?}"
    );
    println!(
        "FIGURE etcd member loss (kill -9 of 1 of 3 members, the raft leader; a replica killed at once): blocking query on apiserver 2 answered after {blocking_ms} ms, recovered (replacement ready, identical answers) after {member_loss_recovery_ms} ms, leader_changed={}",
        leader_after != 1
    );
}
