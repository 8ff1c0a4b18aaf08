//! The etcd HA shape: 3 etcd members, 2 controllers (one leads, one stands by), 2
//! `xced apiserver`s and 3 workers, each its own process (the e2e tests' [`Fleet`]). Every
//! daemon may be paused or killed -9 and restarted; the raft leadership may be moved to any
//! member; an apiserver reaches each etcd member, and a worker each apiserver, through a
//! proxy of the suite (`proxy.rs`) that the nemesis cuts both ways or one way.

use crate::daemons::{healthz, EtcdCluster, Fleet};
use crate::harness::{bin, eventually, wait_for_hosts_of, Api};
use crate::nemesis::Caps;
use crate::proxy::{Cut, Proxy};
use crate::shapes::Shape;
use anyhow::{Context, Result};
use std::path::PathBuf;

const MEMBERS: usize = 3;
const CONTROLLERS: usize = 2;
const APISERVERS: usize = 2;
const WORKERS: usize = 3;

pub struct EtcdHa {
    fleet: Fleet,
    /// Per apiserver, one proxy per etcd member (its store list, its own member first).
    store_proxies: Vec<Vec<Proxy>>,
    /// Per worker, one proxy per apiserver (its controller list).
    worker_proxies: Vec<Vec<Proxy>>,
}

/// The daemon kinds in the order of [`Shape::daemons`].
enum Daemon {
    Member(usize),
    Controller(usize),
    Apiserver(usize),
    Worker(usize),
}

fn which(d: usize) -> Daemon {
    match d {
        d if d < MEMBERS => Daemon::Member(d),
        d if d < MEMBERS + CONTROLLERS => Daemon::Controller(d - MEMBERS),
        d if d < MEMBERS + CONTROLLERS + APISERVERS => Daemon::Apiserver(d - MEMBERS - CONTROLLERS),
        d => Daemon::Worker(d - MEMBERS - CONTROLLERS - APISERVERS),
    }
}

/// Proxies to each of `upstreams` (`127.0.0.1:PORT`), in that order.
async fn proxies(upstreams: &[String]) -> Result<Vec<Proxy>> {
    let mut out = Vec::new();
    for u in upstreams {
        out.push(Proxy::start(u.parse()?).await?);
    }
    Ok(out)
}

/// Replaces `from` by `to` in the config file `path` (which must contain it).
fn rewrite(path: &std::path::Path, from: &str, to: &str) -> Result<()> {
    let text = std::fs::read_to_string(path)?;
    anyhow::ensure!(text.contains(from), "{} has no {from}", path.display());
    std::fs::write(path, text.replace(from, to))?;
    Ok(())
}

impl EtcdHa {
    /// Starts the whole shape; returns once every worker's host is registered.
    pub async fn start() -> Result<Self> {
        let etcd = EtcdCluster::start(MEMBERS).await?;
        let members = etcd.endpoints().to_vec();
        let store = etcd.url();
        let mut fleet = Fleet::new(etcd, WORKERS, APISERVERS)?;
        let mut store_proxies = Vec::new();
        for a in 0..APISERVERS {
            // Apiserver `a` lists member `a` first (the one it is likeliest to watch).
            let mut order = members.clone();
            order.rotate_left(a % MEMBERS);
            let p = proxies(&order).await?;
            let list: Vec<String> = p.iter().map(Proxy::addr).collect();
            let config = fleet.dir.path().join(format!("apiserver-{a}.toml"));
            rewrite(&config, &store, &format!("etcd://{}", list.join(",")))?;
            let mut by_member: Vec<Option<Proxy>> = (0..MEMBERS).map(|_| None).collect();
            for (k, proxy) in p.into_iter().enumerate() {
                by_member[(k + a) % MEMBERS] = Some(proxy);
            }
            store_proxies.push(by_member.into_iter().map(Option::unwrap).collect());
        }
        let apiservers: Vec<String> = (0..APISERVERS)
            .map(|a| format!("127.0.0.1:{}", fleet.apiserver_ports[a]))
            .collect();
        let mut worker_proxies = Vec::new();
        for i in 0..WORKERS {
            let p = proxies(&apiservers).await?;
            let mut urls: Vec<String> = p.iter().map(|p| format!("http://{}", p.addr())).collect();
            urls.rotate_left(i % APISERVERS);
            let config = fleet.dir.path().join(format!("worker-{i}.toml"));
            let direct: Vec<String> = apiservers.iter().map(|a| format!("http://{a}")).collect();
            rewrite(&config, &direct.join(","), &urls.join(","))?;
            // A small dynamic range: ports come back into use within a run (validator 2).
            let text = std::fs::read_to_string(&config)?;
            std::fs::write(
                &config,
                format!("{text}\n[ports]\nrange = \"20000-20011\"\n"),
            )?;
            worker_proxies.push(p);
        }
        fleet.start_leader_and_standby().await;
        for a in 0..APISERVERS {
            fleet.start_apiserver(a)?;
            let port = fleet.apiserver_ports[a];
            eventually(&format!("apiserver {a} serves"), || async move {
                let h = tokio::task::spawn_blocking(move || healthz(port)).await?;
                Ok(h.filter(|(s, _)| *s == 200).map(|_| ()))
            })
            .await;
        }
        fleet.start_workers(WORKERS)?;
        let api = fleet.apiserver(0);
        tokio::task::spawn_blocking(move || wait_for_hosts_of(&api, WORKERS)).await??;
        Ok(Self {
            fleet,
            store_proxies,
            worker_proxies,
        })
    }

    fn etcd(&mut self) -> &mut EtcdCluster {
        self.fleet.etcd.as_mut().expect("the fleet's etcd")
    }
}

impl Shape for EtcdHa {
    fn name(&self) -> &'static str {
        "etcd"
    }
    fn api(&self) -> Api {
        self.fleet.apiserver(0)
    }
    fn reader_apis(&self) -> Vec<Api> {
        let mut apis: Vec<Api> = (0..APISERVERS).map(|a| self.fleet.apiserver(a)).collect();
        apis.extend((0..CONTROLLERS).map(|c| self.fleet.controller_api(c)));
        apis
    }
    fn daemons(&self) -> Vec<String> {
        let m = (0..MEMBERS).map(|m| format!("etcd-m{m}"));
        let c = (0..CONTROLLERS).map(|c| format!("controller-{c}"));
        let a = (0..APISERVERS).map(|a| format!("apiserver-{a}"));
        let w = (0..WORKERS).map(|i| format!("worker-{i}"));
        m.chain(c).chain(a).chain(w).collect()
    }
    fn pid(&self, daemon: usize) -> Option<u32> {
        let f = &self.fleet;
        match which(daemon) {
            Daemon::Member(m) => f.etcd.as_ref().and_then(|e| e.pid(m)),
            Daemon::Controller(c) => f.controllers[c].as_ref().map(|d| d.child.id()),
            Daemon::Apiserver(a) => f.apiservers[a].as_ref().map(|d| d.child.id()),
            Daemon::Worker(i) => Some(f.workers[i].id()),
        }
    }
    fn caps(&self) -> Vec<Caps> {
        (0..self.daemons().len())
            .map(|d| {
                let member = matches!(which(d), Daemon::Member(_));
                Caps {
                    kill: true,
                    partition: matches!(which(d), Daemon::Apiserver(_) | Daemon::Worker(_)),
                    clock: false,
                    disk: false,
                    leader: member,
                    under_apiserver: member && d < APISERVERS,
                }
            })
            .collect()
    }
    fn kill9(&mut self, daemon: usize) {
        match which(daemon) {
            Daemon::Member(m) => self.etcd().kill_9(m),
            Daemon::Controller(c) => self.fleet.kill_9_controller(c),
            Daemon::Apiserver(a) => self.fleet.kill_9_apiserver(a),
            Daemon::Worker(i) => {
                let _ = self.fleet.workers[i].kill();
                let _ = self.fleet.workers[i].wait();
            }
        }
    }
    fn restart(&mut self, daemon: usize) -> Result<()> {
        match which(daemon) {
            Daemon::Member(m) => self.etcd().restart(m),
            Daemon::Controller(c) => self.fleet.start_controller(c),
            Daemon::Apiserver(a) => self.fleet.start_apiserver(a),
            Daemon::Worker(i) => {
                let d = self
                    .fleet
                    .spawn_from(&bin("xced"), "worker", &format!("worker-{i}"))
                    .context("restarting a worker")?;
                self.fleet.workers[i] = d.child;
                Ok(())
            }
        }
    }
    fn partition(&mut self, daemon: usize, cut: Cut) {
        let proxies = match which(daemon) {
            Daemon::Apiserver(a) => &self.store_proxies[a],
            Daemon::Worker(i) => &self.worker_proxies[i],
            _ => unreachable!("only apiservers and workers are partitioned"),
        };
        for p in proxies {
            p.set(cut);
        }
    }
    fn move_leader(&mut self, daemon: usize) {
        let Daemon::Member(m) = which(daemon) else {
            unreachable!("the leadership moves to a member")
        };
        let etcd = self.fleet.etcd.as_ref().expect("the fleet's etcd");
        tokio::runtime::Handle::current().block_on(etcd.make_leader(m));
    }
    fn logs(&self) -> Vec<PathBuf> {
        let mut logs: Vec<PathBuf> = self
            .daemons()
            .iter()
            .filter(|d| !d.starts_with("etcd-"))
            .map(|d| self.fleet.log(d))
            .collect();
        if let Some(e) = &self.fleet.etcd {
            logs.extend((0..MEMBERS).map(|m| e.log(m)));
        }
        logs
    }
}
