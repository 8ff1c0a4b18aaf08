//! The scheduler's consumable-resource plugin for named ports.

use crate::facts::HostPortsFacts;
use crate::grant::PLUGIN_NAME;
use crate::grant::{GrantedPort, PortGrant, Protocol};
use crate::hook::RefusalDetail;
use crate::pool::{HostPool, PortRequest, Shortfall};
use crate::profile::{self, PortsSection, SECTION_PATH};
use plugin_api::{
    FieldError, Grant, HostFacts, HostId, JobId, PlacementRequest, ResourcePlugin, SectionInfo,
    Unfit,
};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
// FxHash, not SipHash: the keys are host and job ids the controller hands in (not
// client input), and hashing them with SipHash on every `fits` and `reserve` was a sixth
// of a reservation in the sim host's profile, and more when a host's jobs were rehashed.
use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, Mutex};

/// The quantity a replica's ports count as for per-project quotas (`quotas.*.ports`):
/// every declared port, dynamic and fixed together.
pub(crate) const QUOTA_PORTS: &str = "ports";

/// Allocates named ports per host (docs/profile.md#port-allocation).
///
/// Unavailable ports (reported by the launch hook through
/// [`ResourcePlugin::launch_refused`]) stay out of the pool of that host until the next
/// [`ResourcePlugin::host_up`] for it (the worker re-registers, e.g. after a restart, or
/// reports changed facts), the host is removed, or
/// [`MAX_UNAVAILABLE`](crate::pool::MAX_UNAVAILABLE) newer marks on the same host and
/// protocol push the oldest out. They are not persisted (a controller restart forgets
/// them; the launch hook finds the port busy again if it still is). They are never
/// "held": a job's release frees what it held, and marks are bounded, so nothing leaks.
#[derive(Debug, Default)]
pub struct PortsPlugin {
    hosts: HashMap<HostId, HostEntry>,
    metrics: Metrics,
    /// The last section parsed for a placement: the scheduler asks `fits` of every host
    /// for one replica, with the same section, so parse it once.
    last: Mutex<Option<(serde_json::Value, Arc<Prepared>)>>,
}

/// A parsed section and what the pool is asked for.
#[derive(Debug)]
struct Prepared {
    section: PortsSection,
    requests: Vec<PortRequest>,
}

/// What the plugin knows about one host.
#[derive(Debug, Clone, Default, PartialEq)]
struct HostEntry {
    /// The last usable `ports` facts section, as reported.
    section: Option<serde_json::Value>,
    /// The pool; `None` while the host has not reported usable facts (reservations
    /// restored meanwhile are kept in `jobs` and applied when the pool is built).
    pool: Option<HostPool>,
    /// Live reservations.
    jobs: HashMap<JobId, PortGrant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HostLabels {
    host: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Default)]
struct Metrics {
    capacity: Family<HostLabels, Gauge>,
    used: Family<HostLabels, Gauge>,
    unavailable: Family<HostLabels, Gauge>,
    failures: Family<ReasonLabels, Counter>,
    /// Each host's three gauges (handles sharing the families' values): every reserve
    /// and release sets them, and looking them up in the families by label (a `String`
    /// built, hashed and compared under a lock, three times) cost a fifth of a placement.
    handles: HashMap<HostId, [Gauge; 3]>,
}

// === impl Metrics ===

impl Metrics {
    fn update(&mut self, host: &str, pool: Option<&HostPool>) {
        let (c, u, n) = pool.map_or((0, 0, 0), |p| (p.capacity(), p.held(), p.unavailable()));
        let gauges = match self.handles.get(host) {
            Some(g) => g,
            None => {
                let labels = HostLabels {
                    host: host.to_owned(),
                };
                let g = [
                    (*self.capacity.get_or_create(&labels)).clone(),
                    (*self.used.get_or_create(&labels)).clone(),
                    (*self.unavailable.get_or_create(&labels)).clone(),
                ];
                self.handles.entry(host.to_owned()).or_insert(g)
            }
        };
        for (g, v) in gauges.iter().zip([c, u, n]) {
            g.set(v.into());
        }
    }

    /// After a reservation or a release on a host with a pool: only the held count
    /// changed (capacity comes with the facts, marks with the launch hook's refusals), so
    /// only that gauge is set. Each gauge is an allocation of its own, and setting all
    /// three (three cache misses and three atomic swaps) was most of a reservation's
    /// metrics time.
    fn held_changed(&mut self, host: &str, pool: &HostPool) {
        match self.handles.get(host) {
            Some([_, used, _]) => {
                used.set(pool.held().into());
            }
            None => self.update(host, Some(pool)),
        }
    }

    fn remove(&mut self, host: &str) {
        self.handles.remove(host);
        let labels = HostLabels {
            host: host.to_owned(),
        };
        self.capacity.remove(&labels);
        self.used.remove(&labels);
        self.unavailable.remove(&labels);
    }

    fn failed(&self, reason: &str) {
        self.failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

// === impl PortsPlugin ===

impl PortsPlugin {
    /// A plugin that knows no host yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Why a request does not fit a host, as the scheduler shows it.
    fn unfit(&self, section: &PortsSection, pool: &HostPool, s: Shortfall) -> Unfit {
        let (index, why, kind) = match s {
            Shortfall::Taken { index } => (index, "is taken".to_owned(), "taken"),
            Shortfall::Reserved { index } => (index, "is reserved".to_owned(), "reserved"),
            Shortfall::Unavailable { index } => (
                index,
                "is unavailable (held by a process outside xce)".to_owned(),
                "unavailable",
            ),
            Shortfall::Exhausted { index } => (
                index,
                format!("has no free port in {}", pool.facts().range),
                "exhausted",
            ),
        };
        self.metrics.failed(kind);
        let d = &section.ports[index];
        let resource = match d.port {
            Some(port) => format!("port {}/{} {port}", d.name, d.protocol),
            None => format!("port {}/{}", d.name, d.protocol),
        };
        Unfit { resource, why }
    }

    fn unreported(&self) -> Unfit {
        self.metrics.failed("unreported");
        Unfit {
            resource: "ports".to_owned(),
            why: "are not reported by the host".to_owned(),
        }
    }

    /// The section of a placement request; it was validated, so a failure is a host bug.
    fn section(&self, request: &PlacementRequest<'_>) -> Result<Arc<Prepared>, Unfit> {
        let key = request.section.unwrap_or(&serde_json::Value::Null);
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((value, prepared)) = last.as_ref() {
            if value == key {
                return Ok(prepared.clone());
            }
        }
        let section = PortsSection::parse(request.section).map_err(|errors| {
            self.metrics.failed("invalid");
            Unfit {
                resource: "ports".to_owned(),
                why: format!(
                    "are not valid: {}",
                    errors.first().map(|e| e.to_string()).unwrap_or_default()
                ),
            }
        })?;
        let prepared = Arc::new(Prepared {
            requests: section.requests(),
            section,
        });
        *last = Some((key.clone(), prepared.clone()));
        Ok(prepared)
    }

    fn apply_holds(pool: &mut HostPool, jobs: &HashMap<JobId, PortGrant>) {
        for grant in jobs.values() {
            for p in &grant.ports {
                // Conflicts were refused when the jobs were restored.
                let _ = pool.hold(p.protocol, p.port);
            }
        }
    }
}

impl ResourcePlugin for PortsPlugin {
    fn name(&self) -> &'static str {
        PLUGIN_NAME
    }

    fn validate(
        &self,
        section: Option<&serde_json::Value>,
    ) -> Result<SectionInfo, Vec<FieldError>> {
        let (drafts, mut errors) = profile::draft(section);
        let pools: Vec<&HostPool> = self
            .hosts
            .values()
            .filter_map(|h| h.pool.as_ref())
            .collect();
        // Checks against the cluster only make sense once some host is known.
        if !pools.is_empty() {
            for d in &drafts {
                if let Some(Some(port)) = d.port {
                    if pools.iter().all(|p| p.is_reserved(port)) {
                        errors.push(FieldError::new(
                            format!("{SECTION_PATH}[{}].port", d.index),
                            format!("port {port} is reserved on every host"),
                        ));
                    }
                }
            }
            let most = pools.iter().map(|p| p.capacity()).max().unwrap_or(0);
            for proto in [Protocol::Tcp, Protocol::Udp] {
                let any = drafts
                    .iter()
                    .filter(|d| d.protocol == Some(proto) && d.port == Some(None))
                    .count() as u32;
                if any > most {
                    errors.push(FieldError::new(
                        SECTION_PATH,
                        format!(
                            "{any} \"any free\" {proto} ports are more than any host's \
                             range can hold (at most {most})"
                        ),
                    ));
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(SectionInfo {
            quantities: [(QUOTA_PORTS.to_owned(), drafts.len() as u64)].into(),
            socket_names: drafts
                .into_iter()
                .filter_map(|d| d.name.map(|n| n.as_str().to_owned()))
                .collect(),
        })
    }

    /// The names of a refused section, when every entry's name can be read: a section
    /// refused for asking more than any host holds still declares its ports.
    fn socket_names(&self, section: Option<&serde_json::Value>) -> Option<Vec<String>> {
        let names = profile::declared_names(section)?;
        Some(names.iter().map(|n| n.as_str().to_owned()).collect())
    }

    /// Refuses `replicas` × the "any free" ports of one protocol above what the dynamic
    /// ranges of every host with usable facts hold together: no placement could ever
    /// give them all (the user lowers `replicas`, or the operator widens ranges or adds
    /// hosts). Fixed ports are left to the placement: more replicas than hosts that can
    /// give a fixed port stay pending with a reason, since hosts may come. Checked only
    /// once some host is known, like [`validate`](ResourcePlugin::validate)'s checks.
    fn check_replicas(
        &self,
        section: Option<&serde_json::Value>,
        replicas: u32,
    ) -> Result<(), Vec<FieldError>> {
        let Ok(section) = PortsSection::parse(section) else {
            // `validate` reports a bad section.
            return Ok(());
        };
        let pools: Vec<&HostPool> = self
            .hosts
            .values()
            .filter_map(|h| h.pool.as_ref())
            .collect();
        if pools.is_empty() {
            return Ok(());
        }
        // Both protocols' dynamic sets have the same size on a host.
        let total: u64 = pools.iter().map(|p| u64::from(p.capacity())).sum();
        let mut errors = Vec::new();
        for proto in [Protocol::Tcp, Protocol::Udp] {
            let any = section
                .ports
                .iter()
                .filter(|d| d.protocol == proto && d.port.is_none())
                .count() as u64;
            let need = any * u64::from(replicas);
            if need > total {
                errors.push(FieldError::new(
                    SECTION_PATH,
                    format!(
                        "{replicas} replicas × {any} \"any free\" {proto} port{} need {need} \
                         ports, more than the dynamic ranges of all {} registered hosts \
                         hold together ({total}): lower replicas, or widen the hosts' \
                         port ranges",
                        if any == 1 { "" } else { "s" },
                        pools.len()
                    ),
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    fn host_up(&mut self, host: &HostId, facts: &HostFacts) -> Result<(), FieldError> {
        let entry = self.hosts.entry(host.clone()).or_default();
        let parsed = match HostPortsFacts::from_facts(facts) {
            Ok(p) => p,
            Err(e) => {
                entry.section = None;
                entry.pool = None;
                self.metrics.update(host, None);
                return Err(e);
            }
        };
        let value = facts.sections.get(PLUGIN_NAME);
        if let Some(pool) = entry
            .pool
            .as_mut()
            .filter(|_| entry.section.as_ref() == value)
        {
            // The same facts again: the worker re-registered (restarted). Give ports
            // marked unavailable another chance; the launch hook checks them again.
            pool.clear_unavailable();
            self.metrics.update(host, Some(pool));
            return Ok(());
        }
        let pool = match &entry.pool {
            Some(old) => old.rebuild(&parsed),
            None => {
                let mut pool = HostPool::new(&parsed);
                Self::apply_holds(&mut pool, &entry.jobs);
                pool
            }
        };
        if let Some(o) = parsed.ephemeral_overlap() {
            tracing::info!(%host, overlap = %o, "ports of the ephemeral range are not handed out");
        }
        entry.section = value.cloned();
        entry.pool = Some(pool);
        self.metrics.update(host, entry.pool.as_ref());
        Ok(())
    }

    fn host_removed(&mut self, host: &HostId) {
        self.hosts.remove(host);
        self.metrics.remove(host);
    }

    fn fits(&self, host: &HostId, request: &PlacementRequest<'_>) -> Result<(), Unfit> {
        let prepared = self.section(request)?;
        let section = &prepared.section;
        if section.ports.is_empty() {
            return Ok(());
        }
        let Some(pool) = self.hosts.get(host).and_then(|h| h.pool.as_ref()) else {
            return Err(self.unreported());
        };
        pool.check(&prepared.requests)
            .map_err(|s| self.unfit(section, pool, s))
    }

    fn reserve(&mut self, host: &HostId, request: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
        let prepared = self.section(request)?;
        let section = &prepared.section;
        if let Some(existing) = self.hosts.get(host).and_then(|h| h.jobs.get(request.job)) {
            // Reserving twice for one job is idempotent.
            return Ok(existing.to_grant());
        }
        if section.ports.is_empty() {
            return Ok(PortGrant::default().to_grant());
        }
        let Some(entry) = self.hosts.get_mut(host).filter(|h| h.pool.is_some()) else {
            return Err(self.unreported());
        };
        let pool = entry.pool.as_mut().expect("filtered on a pool");
        let mut out = Vec::with_capacity(section.ports.len());
        if let Err(s) = pool.reserve(&prepared.requests, &mut out) {
            let pool = self.hosts[host].pool.as_ref().expect("checked above");
            return Err(self.unfit(section, pool, s));
        }
        let grant = PortGrant {
            ports: section
                .ports
                .iter()
                .zip(out)
                .map(|(d, port)| GrantedPort {
                    name: d.name.as_str().to_owned(),
                    protocol: d.protocol,
                    port,
                })
                .collect(),
        };
        tracing::debug!(
            %host, job = request.job, service = request.service, replica = request.replica,
            ports = ?grant.ports.iter().map(|p| (p.name.as_str(), p.port)).collect::<Vec<_>>(),
            "ports reserved"
        );
        // Encoded before the record moves into the map: no copy of it.
        let encoded = grant.to_grant();
        entry.jobs.insert(request.job.to_owned(), grant);
        self.metrics.held_changed(host, pool);
        Ok(encoded)
    }

    fn release(&mut self, host: &HostId, job: &JobId) {
        let Some(entry) = self.hosts.get_mut(host) else {
            return;
        };
        let Some(grant) = entry.jobs.remove(job) else {
            return;
        };
        match entry.pool.as_mut() {
            Some(pool) => {
                for p in &grant.ports {
                    pool.release(p.protocol, p.port);
                }
                self.metrics.held_changed(host, pool);
            }
            None => self.metrics.update(host, None),
        }
    }

    fn restore(&mut self, host: &HostId, job: &JobId, grant: &Grant) -> Result<(), String> {
        let grant = PortGrant::from_grant(grant).map_err(|e| e.to_string())?;
        let entry = self.hosts.entry(host.clone()).or_default();
        if let Some(existing) = entry.jobs.get(job) {
            return if *existing == grant {
                Ok(())
            } else {
                Err(format!(
                    "job {job} on {host} was already restored with other ports"
                ))
            };
        }
        for (i, p) in grant.ports.iter().enumerate() {
            if p.port == 0 {
                return Err(format!(
                    "port {}/{} of job {job} on {host} is 0, which is not a port",
                    p.name, p.protocol
                ));
            }
            let twice = grant.ports[..i]
                .iter()
                .any(|o| o.protocol == p.protocol && o.port == p.port);
            let holder = entry.jobs.iter().find_map(|(other, g)| {
                g.ports
                    .iter()
                    .any(|o| o.protocol == p.protocol && o.port == p.port)
                    .then_some(other.as_str())
            });
            if twice || holder.is_some() {
                return Err(format!(
                    "port {}/{} {} of job {job} on {host} is already held by job {}",
                    p.name,
                    p.protocol,
                    p.port,
                    holder.unwrap_or(job)
                ));
            }
        }
        if let Some(pool) = entry.pool.as_mut() {
            for (i, p) in grant.ports.iter().enumerate() {
                // Cannot fail: the pool holds exactly the ports of `jobs`, checked above.
                // Should it, undo this grant's holds so nothing leaks.
                if let Err(e) = pool.hold(p.protocol, p.port) {
                    for q in &grant.ports[..i] {
                        pool.release(q.protocol, q.port);
                    }
                    return Err(format!("job {job} on {host}: {e}"));
                }
            }
        }
        entry.jobs.insert(job.clone(), grant);
        self.metrics.update(host, entry.pool.as_ref());
        Ok(())
    }

    fn launch_refused(&mut self, host: &HostId, job: &JobId, detail: &serde_json::Value) {
        let detail: RefusalDetail = match serde_json::from_value(detail.clone()) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(%host, %job, error = %e, "unreadable port refusal detail");
                return;
            }
        };
        let Some(pool) = self.hosts.get_mut(host).and_then(|h| h.pool.as_mut()) else {
            return;
        };
        for p in &detail.ports {
            tracing::warn!(
                %host, %job, protocol = %p.protocol, port = p.port,
                "port held by a process outside xce; marked unavailable on the host"
            );
            pool.mark_unavailable(p.protocol, p.port);
        }
        self.metrics.update(host, Some(pool));
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "xce_port_pool_capacity",
            "Ports of a host's dynamic range that may be handed out (per protocol)",
            self.metrics.capacity.clone(),
        );
        registry.register(
            "xce_port_pool_used",
            "Ports held by live jobs on a host (both protocols, fixed ports included)",
            self.metrics.used.clone(),
        );
        registry.register(
            "xce_port_pool_unavailable",
            "Ports marked unavailable on a host (held by a process outside xce)",
            self.metrics.unavailable.clone(),
        );
        registry.register(
            "xce_port_alloc_failures",
            "Port allocations that failed on a host (fit checks and reservations), by reason",
            self.metrics.failures.clone(),
        );
    }

    fn grant_summary(&self, grant: &Grant) -> Option<serde_json::Value> {
        let grant = PortGrant::from_grant(grant).ok()?;
        Some(serde_json::Value::Object(
            grant
                .ports
                .into_iter()
                .map(|p| (p.name, p.port.into()))
                .collect(),
        ))
    }

    fn host_summary(&self, host: &HostId) -> Option<serde_json::Value> {
        let pool = self.hosts.get(host)?.pool.as_ref()?;
        Some(serde_json::json!({
            "range": pool.facts().range.to_string(),
            "capacity": pool.capacity(),
            "used": pool.held(),
            "unavailable": pool.unavailable(),
        }))
    }
}

#[cfg(test)]
mod tests;
