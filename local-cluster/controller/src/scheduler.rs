//! Placement of one replica: pure, synchronous logic over the resource plugins.
//!
//! Candidates are filtered with every plugin's `fits`, ordered by spread (fewest jobs of
//! this service, then fewest jobs overall, then host id), and reserved with every plugin
//! all or nothing. A replica that fits nowhere gets a reason aggregated over the hosts.
//! The candidates are the ready hosts nobody cordoned or drains, and "jobs of this
//! service" are those that stay: the scheduling pass (`core/placement.rs`, `Spread`)
//! counts neither draining or stopping jobs nor older-generation jobs a rollout is
//! replacing, so a restart's replacements spread like the replicas they replace.

use plugin_api::{Grants, HostId, PlacementRequest, ResourcePlugin, Unfit};

/// A host that may take placements, with its current load (the scheduling pass keeps
/// these as indexes instead; the tests state them directly).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub(crate) id: HostId,
    /// Live jobs of the service being placed.
    pub(crate) service_jobs: usize,
    /// Live jobs overall.
    pub(crate) total_jobs: usize,
}

/// The replica to place.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) service: &'a str,
    pub(crate) project: &'a str,
    pub(crate) replica: u32,
    pub(crate) job: &'a str,
    /// The service's `[service]` table (plugin sections are looked up by plugin name).
    pub(crate) profile: &'a serde_json::Value,
}

impl<'a> Request<'a> {
    fn for_plugin(&self, p: &dyn ResourcePlugin) -> PlacementRequest<'a> {
        PlacementRequest {
            service: self.service,
            project: self.project,
            replica: self.replica,
            job: self.job,
            section: self.profile.get(p.name()),
        }
    }
}

/// A successful placement: the host and every plugin's grant.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Placement {
    pub(crate) host: HostId,
    pub(crate) grants: Grants,
}

/// Places `req` on the best candidate, reserving with every plugin; or says why it fits
/// nowhere.
#[cfg(test)]
pub(crate) fn place(
    plugins: &mut [Box<dyn ResourcePlugin>],
    candidates: &[Candidate],
    req: &Request<'_>,
) -> Result<Placement, String> {
    if candidates.is_empty() {
        return Err("no ready hosts".to_owned());
    }
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by(|a, b| {
        (a.service_jobs, a.total_jobs, &a.id).cmp(&(b.service_jobs, b.total_jobs, &b.id))
    });
    place_ordered(
        plugins,
        order.into_iter().map(|c| &c.id),
        candidates.len(),
        req,
    )
}

/// `place` over the `hosts` ready hosts already in spread order (`order`): the
/// scheduling pass keeps them sorted as it places, instead of sorting every host again
/// for every replica.
pub(crate) fn place_ordered<'h>(
    plugins: &mut [Box<dyn ResourcePlugin>],
    order: impl Iterator<Item = &'h HostId>,
    hosts: usize,
    req: &Request<'_>,
) -> Result<Placement, String> {
    if hosts == 0 {
        return Err("no ready hosts".to_owned());
    }
    let mut unfit: Vec<(HostId, Unfit)> = Vec::new();
    'hosts: for id in order {
        for p in plugins.iter() {
            if let Err(u) = p.fits(id, &req.for_plugin(&**p)) {
                unfit.push((id.clone(), u));
                continue 'hosts;
            }
        }
        match reserve_all(plugins, id, req) {
            Ok(grants) => {
                return Ok(Placement {
                    host: id.clone(),
                    grants,
                })
            }
            Err(u) => unfit.push((id.clone(), u)),
        }
    }
    Err(aggregate(hosts, unfit))
}

/// Reserves with every plugin; if one fails, releases the ones that already reserved.
fn reserve_all(
    plugins: &mut [Box<dyn ResourcePlugin>],
    host: &HostId,
    req: &Request<'_>,
) -> Result<Grants, Unfit> {
    let mut grants = Vec::with_capacity(plugins.len());
    for i in 0..plugins.len() {
        let preq = req.for_plugin(&*plugins[i]);
        match plugins[i].reserve(host, &preq) {
            Ok(g) => {
                grants.push((plugins[i].name(), g));
            }
            Err(u) => {
                let job = req.job.to_owned();
                for p in &mut plugins[..i] {
                    p.release(host, &job);
                }
                return Err(u);
            }
        }
    }
    // One allocation, shared by every copy of the job's record.
    Ok(grants.into_iter().collect())
}

/// Up to this many hosts are named in "... on all N hosts (a, b, c)".
const MAX_NAMED_HOSTS: usize = 8;

/// "port x is taken on all 3 hosts (a, b, c)", or per group "port x is taken on a, b; port y is
/// reserved on c". Groups are ordered by their first host.
pub(crate) fn aggregate(total_hosts: usize, mut unfit: Vec<(HostId, Unfit)>) -> String {
    unfit.sort_by(|a, b| a.0.cmp(&b.0));
    let mut groups: Vec<(Unfit, Vec<HostId>)> = Vec::new();
    for (h, u) in unfit {
        match groups.iter_mut().find(|(g, _)| *g == u) {
            Some((_, hosts)) => hosts.push(h),
            None => groups.push((u, vec![h])),
        }
    }
    if let [(u, hosts)] = groups.as_slice() {
        if hosts.len() == total_hosts && total_hosts > 1 {
            // Name them while the list stays readable: an operator wants to know where.
            return if total_hosts <= MAX_NAMED_HOSTS {
                format!("{u} on all {total_hosts} hosts ({})", hosts.join(", "))
            } else {
                format!("{u} on all {total_hosts} hosts")
            };
        }
    }
    groups
        .iter()
        .map(|(u, hosts)| format!("{u} on {}", hosts.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use expect_test::{expect, Expect};
    use plugin_api::{FieldError, Grant, HostFacts, JobId, SectionInfo};
    use serde_json::json;
    use std::collections::{BTreeMap, BTreeSet};

    /// A tiny slot resource: each host has `capacity` slots; a profile section
    /// `{"fixed": n}` asks for slot number n, otherwise any free slot. Records what it
    /// granted and released.
    #[derive(Debug, Default)]
    pub(crate) struct Slots {
        pub(crate) name: &'static str,
        pub(crate) capacity: BTreeMap<HostId, u64>,
        pub(crate) used: BTreeMap<(HostId, u64), JobId>,
        pub(crate) log: Vec<String>,
    }

    impl Slots {
        pub(crate) fn new(name: &'static str) -> Self {
            Self {
                name,
                ..Self::default()
            }
        }
        fn want(&self, host: &HostId, req: &PlacementRequest<'_>) -> Result<u64, Unfit> {
            let cap = *self.capacity.get(host).ok_or_else(|| Unfit {
                resource: self.name.to_owned(),
                why: "is not offered".into(),
            })?;
            if let Some(n) = req
                .section
                .and_then(|s| s.get("fixed"))
                .and_then(|v| v.as_u64())
            {
                return if self.used.contains_key(&(host.clone(), n)) {
                    Err(Unfit {
                        resource: format!("{} {n}", self.name),
                        why: "is taken".into(),
                    })
                } else {
                    Ok(n)
                };
            }
            (0..cap)
                .find(|n| !self.used.contains_key(&(host.clone(), *n)))
                .ok_or_else(|| Unfit {
                    resource: self.name.to_owned(),
                    why: "is full".into(),
                })
        }
    }

    impl ResourcePlugin for Slots {
        fn name(&self) -> &'static str {
            self.name
        }
        fn validate(&self, _: Option<&serde_json::Value>) -> Result<SectionInfo, Vec<FieldError>> {
            Ok(SectionInfo::default())
        }
        fn host_up(&mut self, host: &HostId, facts: &HostFacts) -> Result<(), FieldError> {
            let cap = facts
                .sections
                .get(self.name)
                .and_then(|v| v.as_u64())
                .ok_or_else(|| FieldError::new(self.name, "missing capacity"))?;
            self.capacity.insert(host.clone(), cap);
            Ok(())
        }
        fn host_removed(&mut self, host: &HostId) {
            self.capacity.remove(host);
        }
        fn fits(&self, host: &HostId, req: &PlacementRequest<'_>) -> Result<(), Unfit> {
            self.want(host, req).map(|_| ())
        }
        fn reserve(&mut self, host: &HostId, req: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
            let n = self.want(host, req)?;
            self.used.insert((host.clone(), n), req.job.to_owned());
            self.log.push(format!("reserve {host} {} {n}", req.job));
            Ok(Grant::from(json!(n)))
        }
        fn release(&mut self, host: &HostId, job: &JobId) {
            let before = self.used.len();
            self.used.retain(|(h, _), j| !(h == host && j == job));
            if self.used.len() != before {
                self.log.push(format!("release {host} {job}"));
            }
        }
        fn restore(&mut self, host: &HostId, job: &JobId, grant: &Grant) -> Result<(), String> {
            let n: u64 = grant.decode().map_err(|_| "bad grant")?;
            if let Some(other) = self.used.insert((host.clone(), n), job.clone()) {
                return Err(format!("slot {n} on {host} already held by {other}"));
            }
            self.log.push(format!("restore {host} {job} {n}"));
            Ok(())
        }
        fn grant_summary(&self, grant: &Grant) -> Option<serde_json::Value> {
            Some(grant.to_value())
        }
        fn host_summary(&self, host: &HostId) -> Option<serde_json::Value> {
            let cap = self.capacity.get(host)?;
            // A range, not a scan of every host's slots: the controller asks for every
            // host's summary at each publish.
            let used = self
                .used
                .range((host.clone(), 0)..=(host.clone(), u64::MAX))
                .count();
            Some(json!({"capacity": cap, "used": used}))
        }
    }

    /// A plugin that accepts `fits` but refuses `reserve` on the listed hosts (a race the
    /// scheduler must survive without leaking other plugins' reservations).
    #[derive(Debug)]
    struct Flaky(BTreeSet<HostId>);

    impl ResourcePlugin for Flaky {
        fn name(&self) -> &'static str {
            "flaky"
        }
        fn validate(&self, _: Option<&serde_json::Value>) -> Result<SectionInfo, Vec<FieldError>> {
            Ok(SectionInfo::default())
        }
        fn host_up(&mut self, _: &HostId, _: &HostFacts) -> Result<(), FieldError> {
            Ok(())
        }
        fn host_removed(&mut self, _: &HostId) {}
        fn fits(&self, _: &HostId, _: &PlacementRequest<'_>) -> Result<(), Unfit> {
            Ok(())
        }
        fn reserve(&mut self, host: &HostId, _: &PlacementRequest<'_>) -> Result<Grant, Unfit> {
            if self.0.contains(host) {
                Err(Unfit {
                    resource: "flake".into(),
                    why: "failed at reserve".into(),
                })
            } else {
                Ok(Grant::from(json!("ok")))
            }
        }
        fn release(&mut self, _: &HostId, _: &JobId) {}
        fn restore(&mut self, _: &HostId, _: &JobId, _: &Grant) -> Result<(), String> {
            Ok(())
        }
    }

    fn slots(caps: &[(&str, u64)]) -> Slots {
        let mut s = Slots::new("slots");
        for (h, c) in caps {
            s.capacity.insert((*h).to_owned(), *c);
        }
        s
    }

    fn cand(id: &str, service_jobs: usize, total_jobs: usize) -> Candidate {
        Candidate {
            id: id.into(),
            service_jobs,
            total_jobs,
        }
    }

    /// Places replicas 0.. of `web` one after the other (updating the loads like the
    /// controller does) and prints where each went or why not, then the plugins' logs.
    fn check(
        mut plugins: Vec<Box<dyn ResourcePlugin>>,
        mut hosts: Vec<Candidate>,
        profile: serde_json::Value,
        replicas: u32,
        expect: Expect,
    ) {
        let mut out = Vec::new();
        for r in 0..replicas {
            let job = format!("j-{r}");
            let req = Request {
                service: "web",
                project: "default",
                replica: r,
                job: &job,
                profile: &profile,
            };
            match place(&mut plugins, &hosts, &req) {
                Ok(p) => {
                    let c = hosts.iter_mut().find(|c| c.id == p.host).unwrap();
                    c.service_jobs += 1;
                    c.total_jobs += 1;
                    out.push(format!("{r}: {} {}", p.host, json!(p.grants)));
                }
                Err(reason) => out.push(format!("{r}: pending: {reason}")),
            }
        }
        for p in &plugins {
            for h in ["exec-01", "exec-02", "exec-03"] {
                if let Some(s) = p.host_summary(&h.to_owned()) {
                    out.push(format!("{} {h}: {s}", p.name()));
                }
            }
        }
        expect.assert_eq(&out.join("\n"));
    }

    #[test]
    fn spreads_by_service_then_total_then_id() {
        check(
            vec![Box::new(slots(&[
                ("exec-01", 9),
                ("exec-02", 9),
                ("exec-03", 9),
            ]))],
            vec![
                cand("exec-02", 0, 5),
                cand("exec-01", 0, 5),
                cand("exec-03", 1, 0),
            ],
            json!({}),
            4,
            expect![[r#"
                0: exec-01 {"slots":0}
                1: exec-02 {"slots":0}
                2: exec-03 {"slots":0}
                3: exec-01 {"slots":1}
                slots exec-01: {"capacity":9,"used":2}
                slots exec-02: {"capacity":9,"used":1}
                slots exec-03: {"capacity":9,"used":1}"#]],
        );
    }

    #[test]
    fn reservation_is_all_or_nothing_across_plugins() {
        // `slots` reserves on exec-01 first, then `flaky` fails there: slots must be
        // released before trying exec-02.
        check(
            vec![
                Box::new(slots(&[("exec-01", 1), ("exec-02", 1)])),
                Box::new(Flaky(["exec-01".to_owned()].into())),
            ],
            vec![cand("exec-01", 0, 0), cand("exec-02", 0, 1)],
            json!({}),
            2,
            expect![[r#"
                0: exec-02 {"flaky":"ok","slots":0}
                1: pending: flake failed at reserve on exec-01; slots is full on exec-02
                slots exec-01: {"capacity":1,"used":0}
                slots exec-02: {"capacity":1,"used":1}"#]],
        );
    }

    #[test]
    fn pending_reasons_are_aggregated_over_hosts() {
        let mut taken = slots(&[("exec-01", 9), ("exec-02", 9), ("exec-03", 9)]);
        for h in ["exec-01", "exec-02", "exec-03"] {
            taken.used.insert((h.into(), 7), "other".into());
        }
        check(
            vec![Box::new(taken)],
            vec![
                cand("exec-01", 0, 1),
                cand("exec-02", 0, 1),
                cand("exec-03", 0, 1),
            ],
            json!({"slots": {"fixed": 7}}),
            1,
            expect![[r#"
                0: pending: slots 7 is taken on all 3 hosts (exec-01, exec-02, exec-03)
                slots exec-01: {"capacity":9,"used":1}
                slots exec-02: {"capacity":9,"used":1}
                slots exec-03: {"capacity":9,"used":1}"#]],
        );
        let mut mixed = slots(&[("exec-01", 9), ("exec-03", 9)]);
        mixed.used.insert(("exec-03".into(), 7), "other".into());
        check(
            vec![Box::new(mixed)],
            vec![cand("exec-03", 0, 1), cand("exec-02", 0, 0)],
            json!({"slots": {"fixed": 7}}),
            2,
            expect![[r#"
                0: pending: slots is not offered on exec-02; slots 7 is taken on exec-03
                1: pending: slots is not offered on exec-02; slots 7 is taken on exec-03
                slots exec-01: {"capacity":9,"used":0}
                slots exec-03: {"capacity":9,"used":1}"#]],
        );
        check(
            vec![Box::new(slots(&[]))],
            vec![],
            json!({}),
            1,
            expect!["0: pending: no ready hosts"],
        );
        check(
            vec![Box::new(slots(&[("exec-01", 1)]))],
            vec![cand("exec-01", 0, 0)],
            json!({}),
            2,
            expect![[r#"
                0: exec-01 {"slots":0}
                1: pending: slots is full on exec-01
                slots exec-01: {"capacity":1,"used":1}"#]],
        );
    }
}
