//! The independent model: what the cluster must look like, kept from what the scenario
//! did and what the host reported, written without the plugins' code. The checks compare
//! the plugins' own outputs (served endpoint entries, pool usage, a replica's environment)
//! with it, and count every difference as a violation.

use endpoint_table::wire::EndpointsAnswer;
use endpoint_table::Entry;
use plugin_api::{Grants, ServiceKey};
use port_resource::{PortGrant, Protocol};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

/// One declared port of a service, as the scenario wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decl {
    pub(crate) name: String,
    pub(crate) udp: bool,
    pub(crate) fixed: Option<u16>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Placed,
    Running,
    Draining,
    Stopping,
    Unknown,
}

#[derive(Debug)]
struct Job {
    service: ServiceKey,
    slot: u32,
    host: u32,
    ports: BTreeMap<String, (bool, u16)>,
    state: State,
    ready: bool,
}

#[derive(Debug, Default)]
struct Service {
    decls: Vec<Decl>,
    jobs: BTreeSet<String>,
    /// The last index served and the endpoints served with it.
    last: Option<(u64, Vec<Endpoint>)>,
}

/// What one endpoint says: job, host, address, ports by name.
type Endpoint = (String, String, Option<IpAddr>, BTreeMap<String, u16>);

/// The model and the violations found so far.
#[derive(Debug, Default)]
pub(crate) struct Model {
    host_names: Vec<String>,
    host_ips: Vec<IpAddr>,
    host_jobs: Vec<BTreeSet<String>>,
    held: HashMap<(u32, bool, u16), String>,
    held_per_host: Vec<u64>,
    capacity: Vec<Option<u64>>,
    /// Ports "any free" may come from: the range minus the ephemeral overlap and reserved.
    dynamic: (u16, u16),
    reserved: Vec<u16>,
    services: BTreeMap<ServiceKey, Service>,
    jobs: HashMap<String, Job>,
    pub(crate) violations: Vec<String>,
    pub(crate) checks: u64,
    pub(crate) env_checked: u64,
}

// === impl Model ===

impl Model {
    pub(crate) fn new(dynamic: (u16, u16), reserved: Vec<u16>) -> Self {
        Self {
            dynamic,
            reserved,
            ..Self::default()
        }
    }

    fn violation(&mut self, what: String) {
        tracing::error!(violation = %what, "invariant violated");
        self.violations.push(what);
    }

    pub(crate) fn host(&mut self, name: String, ip: IpAddr) {
        self.host_names.push(name);
        self.host_ips.push(ip);
        self.host_jobs.push(BTreeSet::new());
        self.held_per_host.push(0);
        self.capacity.push(None);
    }

    pub(crate) fn service(&mut self, key: &ServiceKey, decls: Vec<Decl>) {
        self.services.insert(
            key.clone(),
            Service {
                decls,
                ..Default::default()
            },
        );
    }

    pub(crate) fn service_removed(&mut self, key: &ServiceKey) {
        if let Some(s) = self.services.remove(key) {
            if !s.jobs.is_empty() {
                self.violation(format!("service {key} removed with live jobs {:?}", s.jobs));
            }
        }
    }

    /// A placement the host committed: its ports must be free on the host, of the
    /// declared names, fixed where declared, else from the dynamic range.
    pub(crate) fn placed(
        &mut self,
        job: &str,
        key: &ServiceKey,
        slot: u32,
        host: u32,
        grants: &Grants,
    ) {
        let grant = match grants
            .get(port_resource::PLUGIN_NAME)
            .map(PortGrant::from_grant)
        {
            Some(Ok(g)) => g,
            Some(Err(e)) => return self.violation(format!("job {job}: unreadable grant: {e}")),
            None => PortGrant::default(),
        };
        let decls = self
            .services
            .get(key)
            .map(|s| s.decls.clone())
            .unwrap_or_default();
        let names: Vec<&str> = grant.ports.iter().map(|p| p.name.as_str()).collect();
        let want: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
        if names != want {
            self.violation(format!(
                "job {job}: granted ports {names:?}, declared {want:?}"
            ));
        }
        let mut ports = BTreeMap::new();
        for (p, d) in grant.ports.iter().zip(&decls) {
            let udp = p.protocol == Protocol::Udp;
            if udp != d.udp {
                self.violation(format!(
                    "job {job}: port {} granted as {}",
                    p.name, p.protocol
                ));
            }
            match d.fixed {
                Some(f) if f != p.port => {
                    self.violation(format!("job {job}: fixed port {} granted {}", f, p.port))
                }
                None if p.port < self.dynamic.0
                    || p.port > self.dynamic.1
                    || self.reserved.contains(&p.port) =>
                {
                    self.violation(format!(
                        "job {job}: port {} outside the usable range {:?}",
                        p.port, self.dynamic
                    ))
                }
                _ => {}
            }
            if let Some(other) = self.held.insert((host, udp, p.port), job.to_owned()) {
                self.violation(format!(
                    "port {}/{} on {} held twice: jobs {other} and {job}",
                    p.port, p.protocol, self.host_names[host as usize]
                ));
            } else {
                self.held_per_host[host as usize] += 1;
            }
            ports.insert(p.name.clone(), (udp, p.port));
        }
        self.host_jobs[host as usize].insert(job.to_owned());
        if let Some(s) = self.services.get_mut(key) {
            s.jobs.insert(job.to_owned());
        }
        self.jobs.insert(
            job.to_owned(),
            Job {
                service: key.clone(),
                slot,
                host,
                ports,
                state: State::Placed,
                ready: false,
            },
        );
    }

    /// The environment the launch hooks gave the replica (docs/profile.md), checked against
    /// what the model knows of the job.
    pub(crate) fn started(&mut self, job: &str, env: &BTreeMap<String, String>) {
        let Some(j) = self.jobs.get_mut(job) else {
            return self.violation(format!("job {job} started but never placed"));
        };
        j.state = State::Running;
        let ip = self.host_ips[j.host as usize];
        let mut want: BTreeMap<String, String> = BTreeMap::from([
            ("XCE_SERVICE".into(), j.service.name.clone()),
            ("XCE_PROJECT".into(), j.service.project.clone()),
            ("XCE_REPLICA".into(), j.slot.to_string()),
            ("XCE_JOB_ID".into(), job.to_owned()),
            ("XCE_HOST_IP".into(), ip.to_string()),
        ]);
        let mut all = Vec::new();
        let decls = &self.services[&j.service].decls;
        for d in decls {
            let Some(&(_, port)) = j.ports.get(&d.name) else {
                continue;
            };
            let env_name: String = d.name.to_uppercase().replace('-', "_");
            want.insert(format!("XCE_PORT_{env_name}"), port.to_string());
            let addr = match ip {
                IpAddr::V4(v4) => format!("{v4}:{port}"),
                IpAddr::V6(v6) => format!("[{v6}]:{port}"),
            };
            want.insert(format!("XCE_ADDR_{env_name}"), addr);
            all.push(format!("{}={port}", d.name));
        }
        want.insert("XCE_PORTS".into(), all.join(","));
        self.env_checked += 1;
        if *env != want {
            self.violation(format!("job {job}: environment {env:?}, want {want:?}"));
        }
    }

    pub(crate) fn ready(&mut self, job: &str, ready: bool) {
        if let Some(j) = self.jobs.get_mut(job) {
            j.ready = ready;
        }
    }

    pub(crate) fn draining(&mut self, job: &str) {
        if let Some(j) = self.jobs.get_mut(job) {
            j.state = State::Draining;
            j.ready = false;
        }
    }

    pub(crate) fn stopping(&mut self, job: &str) {
        if let Some(j) = self.jobs.get_mut(job) {
            j.state = State::Stopping;
            j.ready = false;
        }
    }

    /// The host went silent: its jobs are `unknown`, kept as they were.
    pub(crate) fn unreachable(&mut self, host: u32) {
        for job in &self.host_jobs[host as usize] {
            if let Some(j) = self.jobs.get_mut(job) {
                j.state = State::Unknown;
            }
        }
    }

    /// The job ended: its ports are free again.
    pub(crate) fn ended(&mut self, job: &str) {
        let Some(j) = self.jobs.remove(job) else {
            return self.violation(format!("job {job} ended but was never placed"));
        };
        for (udp, port) in j.ports.values() {
            if self.held.get(&(j.host, *udp, *port)).map(String::as_str) == Some(job) {
                self.held.remove(&(j.host, *udp, *port));
                self.held_per_host[j.host as usize] -= 1;
            }
        }
        self.host_jobs[j.host as usize].remove(job);
        if let Some(s) = self.services.get_mut(&j.service) {
            s.jobs.remove(job);
        }
    }

    /// The jobs the model has on `host`.
    pub(crate) fn jobs_on(&self, host: u32) -> Vec<String> {
        self.host_jobs[host as usize].iter().cloned().collect()
    }

    /// The endpoints a service must serve: running (or unknown) ready jobs.
    fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        let Some(s) = self.services.get(key) else {
            return Vec::new();
        };
        let mut out: Vec<Endpoint> = s
            .jobs
            .iter()
            .filter_map(|id| {
                let j = &self.jobs[id];
                let up = matches!(j.state, State::Running | State::Unknown) && j.ready;
                up.then(|| {
                    let ports = j.ports.iter().map(|(n, (_, p))| (n.clone(), *p)).collect();
                    let h = j.host as usize;
                    (
                        id.clone(),
                        self.host_names[h].clone(),
                        Some(self.host_ips[h]),
                        ports,
                    )
                })
            })
            .collect();
        out.sort();
        out
    }

    /// Checks the entry the API side serves for `key` (`None`: it serves none).
    pub(crate) fn check_entry(&mut self, key: &ServiceKey, served: Option<&Entry>) {
        self.checks += 1;
        let known = self.services.contains_key(key);
        let Some(entry) = served else {
            if known {
                self.violation(format!("service {key}: no entry served"));
            }
            return;
        };
        if !known {
            return self.violation(format!("service {key}: removed but still served"));
        }
        let mut got: Vec<Endpoint> = entry
            .endpoints()
            .map(|r| {
                let ports = r.ports.iter().map(|(n, p)| (n.to_owned(), *p)).collect();
                (r.job.to_string(), r.host.to_string(), r.address, ports)
            })
            .collect();
        got.sort();
        self.compare(key, entry.index, got, "entry");
    }

    /// Checks an answer read over HTTP.
    pub(crate) fn check_answer(&mut self, key: &ServiceKey, answer: &EndpointsAnswer) {
        self.checks += 1;
        let mut got: Vec<Endpoint> = answer
            .endpoints
            .iter()
            .map(|e| (e.job.clone(), e.host.clone(), e.address, e.ports.clone()))
            .collect();
        got.sort();
        self.compare(key, answer.index, got, "http answer");
    }

    fn compare(&mut self, key: &ServiceKey, index: u64, got: Vec<Endpoint>, what: &str) {
        let want = self.endpoints(key);
        if got != want {
            let missing: Vec<_> = want
                .iter()
                .filter(|e| !got.contains(e))
                .map(|e| &e.0)
                .collect();
            let extra: Vec<_> = got
                .iter()
                .filter(|e| !want.contains(e))
                .map(|e| &e.0)
                .collect();
            self.violation(format!(
                "service {key}: {what} at index {index} differs from the ready set: \
                 missing {missing:?}, extra {extra:?}"
            ));
        }
        let last = self.services.get_mut(key).and_then(|s| s.last.take());
        if let Some((last_index, last_got)) = &last {
            if index < *last_index {
                self.violation(format!(
                    "service {key}: index went back {last_index} -> {index}"
                ));
            } else if index == *last_index && *last_got != got {
                self.violation(format!(
                    "service {key}: content changed at the same index {index}"
                ));
            }
        }
        let keep = match last {
            Some((i, g)) if i > index => (i, g),
            _ => (index, got),
        };
        if let Some(s) = self.services.get_mut(key) {
            s.last = Some(keep);
        }
    }

    /// Checks a host's pool usage (the plugin's `host_summary`): as many ports used as the
    /// model holds there, and the capacity it started with.
    pub(crate) fn check_pool(&mut self, host: u32, summary: Option<&serde_json::Value>) {
        self.checks += 1;
        let name = self.host_names[host as usize].clone();
        let (Some(used), Some(capacity)) = (
            summary.and_then(|s| s["used"].as_u64()),
            summary.and_then(|s| s["capacity"].as_u64()),
        ) else {
            return self.violation(format!("host {name}: no pool summary ({summary:?})"));
        };
        let held = self.held_per_host[host as usize];
        if used != held {
            self.violation(format!(
                "host {name}: pool says {used} ports used, jobs hold {held}"
            ));
        }
        match self.capacity[host as usize] {
            None => self.capacity[host as usize] = Some(capacity),
            Some(c) if c != capacity => {
                self.violation(format!("host {name}: capacity {c} became {capacity}"))
            }
            Some(_) => {}
        }
    }

    /// The live jobs of a service, by slot.
    pub(crate) fn service_jobs(&self, key: &ServiceKey) -> Vec<(String, u32)> {
        self.services
            .get(key)
            .map(|s| {
                s.jobs
                    .iter()
                    .map(|j| (j.clone(), self.jobs[j].slot))
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(crate) fn hosts_of(&self, key: &ServiceKey) -> BTreeSet<u32> {
        self.services
            .get(key)
            .map(|s| s.jobs.iter().map(|j| self.jobs[j].host).collect())
            .unwrap_or_default()
    }

    /// The host of a live job (none or one).
    pub(crate) fn hosts_of_job(&self, job: &str) -> Option<u32> {
        self.jobs.get(job).map(|j| j.host)
    }

    /// The service of a live job.
    pub(crate) fn service_of(&self, job: &str) -> Option<ServiceKey> {
        self.jobs.get(job).map(|j| j.service.clone())
    }
}
