use super::*;
use crate::testutil::*;
use expect_test::{expect, Expect};
use plugin_api::{ClusterSnapshot, JobState, ServiceKey};
use std::collections::BTreeSet;
use std::fmt::Write;

enum Step {
    Event(ClusterEvent),
    Resync(ClusterSnapshot),
}

fn render_entry(e: &Entry) -> String {
    let ports: Vec<_> = e
        .ports
        .iter()
        .map(|p| format!("{}/{}", p.name, p.protocol))
        .collect();
    let mut out = format!(
        "{}#{} {} {{{}}}",
        e.service,
        e.index,
        e.project,
        ports.join(",")
    );
    for r in &e.replicas {
        let addr = r.address.map_or("-".to_owned(), |a| a.to_string());
        let ports: Vec<_> = r.ports.iter().map(|(n, p)| format!("{n}={p}")).collect();
        let _ = write!(
            out,
            " [{} {} g{} {} {} {:?} ready={} {}{}]",
            r.replica,
            r.job,
            r.generation,
            r.host,
            addr,
            r.state,
            r.ready,
            ports.join(","),
            if r.is_endpoint() { " ENDPOINT" } else { "" },
        );
    }
    out
}

fn render_changes(changes: &[Change]) -> String {
    if changes.is_empty() {
        return "no change".into();
    }
    let lines: Vec<_> = changes
        .iter()
        .map(|c| match c {
            Change::Upsert { entry } => render_entry(entry),
            Change::Removed {
                service, project, ..
            } => format!("{project}/{service} removed"),
        })
        .collect();
    lines.join("\n    ")
}

fn check(steps: Vec<Step>, expect: Expect) {
    let mut table = Table::new();
    let mut out = String::new();
    for step in steps {
        let (label, changes) = match step {
            Step::Event(ev) => {
                let label = match &ev {
                    ClusterEvent::Service { service, .. } => format!("service {}", service.name),
                    ClusterEvent::ServiceRemoved { name, project, .. } => {
                        format!("removed {project}/{name}")
                    }
                    ClusterEvent::Job { job, .. } => format!("job {} {:?}", job.job, job.state),
                    ClusterEvent::JobEnded { job, .. } => format!("ended {}", job.job),
                    ClusterEvent::Host { host, .. } => format!("host {}", host.id),
                };
                (format!("@{} {label}", ev.rev()), table.apply(&ev))
            }
            Step::Resync(snap) => (format!("@{} resync", snap.rev), table.resync(&snap)),
        };
        let _ = writeln!(out, "{label}: {}", render_changes(&changes));
    }
    expect.assert_eq(&out);
}

#[test]
fn readiness_and_lifecycle() {
    let web = service("web", "team-a", &["http"]);
    let mut j1 = job("j-1", "web", "team-a", 0, "exec-01", &[("http", 20001)]);
    j1.state = JobState::Placed;
    j1.ready = false;
    let placed = j1.clone();
    let running = JobInfo {
        state: JobState::Running,
        ..placed.clone()
    };
    let ready = JobInfo {
        ready: true,
        ..running.clone()
    };
    let unknown = JobInfo {
        state: JobState::Unknown,
        ..ready.clone()
    };
    let stopping = JobInfo {
        state: JobState::Stopping,
        ..ready.clone()
    };
    check(
        vec![
            Step::Event(ev_host(1, host("exec-01", Some("127.0.0.11")), &[])),
            Step::Event(ev_service(2, web)),
            Step::Event(ev_job(3, placed)),
            Step::Event(ev_job(4, running)),
            Step::Event(ev_job(5, ready.clone())),
            Step::Event(ev_job(6, ready)),
            Step::Event(ev_job(7, unknown)),
            Step::Event(ev_job(8, stopping.clone())),
            Step::Event(ev_ended(9, stopping)),
            Step::Event(ev_removed(10, "web", "team-a")),
            Step::Event(ev_job(11, j1)),
        ],
        expect![[r#"
            @1 host exec-01: no change
            @2 service web: web#2 team-a {http/tcp}
            @3 job j-1 Placed: web#3 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Placed ready=false http=20001]
            @4 job j-1 Running: web#4 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=false http=20001]
            @5 job j-1 Running: web#5 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
            @6 job j-1 Running: web#6 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
            @7 job j-1 Unknown: web#7 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Unknown ready=true http=20001 ENDPOINT]
            @8 job j-1 Stopping: web#8 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Stopping ready=true http=20001]
            @9 ended j-1: web#9 team-a {http/tcp}
            @10 removed team-a/web: team-a/web removed
            @11 job j-1 Placed: no change
        "#]],
    );
}

/// A rollout that adds a port: each replica carries its job's generation and its own
/// ports; a draining replica stays in the entry, no longer an endpoint, until it ends.
#[test]
fn rollout_generations_and_draining() {
    let v1 = service("web", "team-a", &["http"]);
    let v2 = ServiceInfo {
        generation: 2,
        ..service("web", "team-a", &["http", "metrics"])
    };
    let old = job("j-1", "web", "team-a", 0, "exec-01", &[("http", 20001)]);
    let new = JobInfo {
        generation: 2,
        ..job(
            "j-2",
            "web",
            "team-a",
            0,
            "exec-01",
            &[("http", 20002), ("metrics", 20003)],
        )
    };
    let draining = JobInfo {
        state: JobState::Draining,
        ready: false,
        ..old.clone()
    };
    check(
        vec![
            Step::Event(ev_host(1, host("exec-01", Some("127.0.0.11")), &[])),
            Step::Event(ev_service(2, v1)),
            Step::Event(ev_job(3, old)),
            Step::Event(ev_service(4, v2)),
            Step::Event(ev_job(5, new)),
            Step::Event(ev_job(6, draining.clone())),
            Step::Event(ev_ended(7, draining)),
        ],
        expect![[r#"
            @1 host exec-01: no change
            @2 service web: web#2 team-a {http/tcp}
            @3 job j-1 Running: web#3 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
            @4 service web: web#4 team-a {http/tcp,metrics/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
            @5 job j-2 Running: web#5 team-a {http/tcp,metrics/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT] [0 j-2 g2 exec-01 127.0.0.11 Running ready=true http=20002,metrics=20003 ENDPOINT]
            @6 job j-1 Draining: web#6 team-a {http/tcp,metrics/tcp} [0 j-1 g1 exec-01 127.0.0.11 Draining ready=false http=20001] [0 j-2 g2 exec-01 127.0.0.11 Running ready=true http=20002,metrics=20003 ENDPOINT]
            @7 ended j-1: web#7 team-a {http/tcp,metrics/tcp} [0 j-2 g2 exec-01 127.0.0.11 Running ready=true http=20002,metrics=20003 ENDPOINT]
        "#]],
    );
}

#[test]
fn host_addresses() {
    let web = service("web", "team-a", &["http", "metrics"]);
    let j1 = job(
        "j-1",
        "web",
        "team-a",
        1,
        "exec-01",
        &[("http", 20001), ("metrics", 20002)],
    );
    let j2 = job("j-2", "web", "team-a", 0, "exec-02", &[("http", 20001)]);
    let mut unreachable = host("exec-01", Some("::1"));
    unreachable.state = plugin_api::HostState::Unreachable;
    check(
        vec![
            Step::Event(ev_service(1, web)),
            Step::Event(ev_job(2, j1)),
            Step::Event(ev_job(3, j2)),
            Step::Event(ev_host(4, host("exec-01", None), &[("team-a", "web")])),
            Step::Event(ev_host(
                5,
                host("exec-01", Some("::1")),
                &[("team-a", "web")],
            )),
            Step::Event(ev_host(6, unreachable, &[("team-a", "web")])),
            Step::Event(ev_host(7, host("exec-02", Some("127.0.0.12")), &[])),
        ],
        expect![[r#"
            @1 service web: web#1 team-a {http/tcp,metrics/tcp}
            @2 job j-1 Running: web#2 team-a {http/tcp,metrics/tcp} [1 j-1 g1 exec-01 - Running ready=true http=20001,metrics=20002]
            @3 job j-2 Running: web#3 team-a {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 - Running ready=true http=20001] [1 j-1 g1 exec-01 - Running ready=true http=20001,metrics=20002]
            @4 host exec-01: web#4 team-a {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 - Running ready=true http=20001] [1 j-1 g1 exec-01 - Running ready=true http=20001,metrics=20002]
            @5 host exec-01: web#5 team-a {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 - Running ready=true http=20001] [1 j-1 g1 exec-01 ::1 Running ready=true http=20001,metrics=20002 ENDPOINT]
            @6 host exec-01: web#6 team-a {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 - Running ready=true http=20001] [1 j-1 g1 exec-01 ::1 Running ready=true http=20001,metrics=20002 ENDPOINT]
            @7 host exec-02: web#7 team-a {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 127.0.0.12 Running ready=true http=20001 ENDPOINT] [1 j-1 g1 exec-01 ::1 Running ready=true http=20001,metrics=20002 ENDPOINT]
        "#]],
    );
}

#[test]
fn resync_takes_the_stored_revisions_and_never_lowers_an_index() {
    let web = service("web", "team-a", &["http"]);
    let api = service("api", "team-b", &[]);
    let j1 = job("j-1", "web", "team-a", 0, "exec-01", &[("http", 20001)]);
    let mut malformed = job("j-2", "web", "team-a", 1, "exec-01", &[]);
    malformed.grants.insert(
        "ports",
        plugin_api::Grant::from_value(&serde_json::json!({"ports": "nope"})),
    );
    let snapshot = |rev, services: Vec<ServiceInfo>, jobs| ClusterSnapshot {
        rev,
        services: services
            .into_iter()
            .map(|s| ServiceInfo { rev, ..s })
            .collect(),
        jobs,
        hosts: vec![host("exec-01", Some("127.0.0.11"))],
    };
    check(
        vec![
            Step::Resync(snapshot(
                5,
                vec![web.clone(), api.clone()],
                vec![j1.clone()],
            )),
            Step::Resync(snapshot(
                9,
                vec![web.clone(), api.clone()],
                vec![j1.clone()],
            )),
            Step::Resync(snapshot(12, vec![web.clone()], vec![j1.clone(), malformed])),
            // A snapshot older than what the table holds must still raise the index.
            Step::Resync(snapshot(3, vec![web.clone()], vec![])),
            // Another project's `web` is another service: team-a's is untouched.
            Step::Event(ev_service(13, service("web", "team-b", &["http"]))),
        ],
        expect![[r#"
            @5 resync: web#5 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
                api#5 team-b {}
            @9 resync: web#9 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
                api#9 team-b {}
            @12 resync: team-b/api removed
                web#12 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT] [1 j-2 g1 exec-01 127.0.0.11 Running ready=true  ENDPOINT]
            @3 resync: web#13 team-a {http/tcp}
            @13 service web: web#13 team-b {http/tcp}
        "#]],
    );
}

/// Two projects each with a `web`: two services with two entries. An event of one never
/// touches the other, a host event names the one it means, removing one leaves the other,
/// and a resync tells them apart.
#[test]
fn same_name_in_two_projects() {
    let a = service("web", "team-a", &["http"]);
    let b = service("web", "team-b", &["http", "metrics"]);
    let ja = job("j-1", "web", "team-a", 0, "exec-01", &[("http", 20001)]);
    let jb = job(
        "j-2",
        "web",
        "team-b",
        0,
        "exec-02",
        &[("http", 20002), ("metrics", 20003)],
    );
    let both = ClusterSnapshot {
        rev: 20,
        services: vec![
            ServiceInfo {
                rev: 20,
                ..a.clone()
            },
            ServiceInfo {
                rev: 18,
                ..b.clone()
            },
        ],
        jobs: vec![ja.clone(), jb.clone()],
        hosts: vec![
            host("exec-01", Some("127.0.0.11")),
            host("exec-02", Some("127.0.0.12")),
        ],
    };
    let only_a = ClusterSnapshot {
        rev: 21,
        services: vec![ServiceInfo {
            rev: 20,
            ..a.clone()
        }],
        jobs: vec![ja.clone()],
        ..both.clone()
    };
    check(
        vec![
            Step::Event(ev_host(1, host("exec-01", Some("127.0.0.11")), &[])),
            Step::Event(ev_host(2, host("exec-02", Some("127.0.0.12")), &[])),
            Step::Event(ev_service(3, a)),
            Step::Event(ev_service(4, b)),
            Step::Event(ev_job(5, ja.clone())),
            Step::Event(ev_job(6, jb.clone())),
            // exec-02 runs only team-b's replica: team-a's entry is not touched.
            Step::Event(ev_host(
                7,
                host("exec-02", Some("127.0.0.22")),
                &[("team-b", "web")],
            )),
            Step::Event(ev_removed(8, "web", "team-b")),
            // A late event of a job of the removed service brings nothing back.
            Step::Event(ev_ended(9, jb)),
            Step::Event(ev_job(10, JobInfo { ready: false, ..ja })),
            Step::Resync(both),
            Step::Resync(only_a),
        ],
        expect![[r#"
            @1 host exec-01: no change
            @2 host exec-02: no change
            @3 service web: web#3 team-a {http/tcp}
            @4 service web: web#4 team-b {http/tcp,metrics/tcp}
            @5 job j-1 Running: web#5 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
            @6 job j-2 Running: web#6 team-b {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 127.0.0.12 Running ready=true http=20002,metrics=20003 ENDPOINT]
            @7 host exec-02: web#7 team-b {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 127.0.0.22 Running ready=true http=20002,metrics=20003 ENDPOINT]
            @8 removed team-b/web: team-b/web removed
            @9 ended j-2: no change
            @10 job j-1 Running: web#10 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=false http=20001]
            @20 resync: web#20 team-a {http/tcp} [0 j-1 g1 exec-01 127.0.0.11 Running ready=true http=20001 ENDPOINT]
                web#18 team-b {http/tcp,metrics/tcp} [0 j-2 g1 exec-02 127.0.0.12 Running ready=true http=20002,metrics=20003 ENDPOINT]
            @21 resync: team-b/web removed
        "#]],
    );
}

// === property: the table equals a from-scratch recomputation ===

mod prop {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const SERVICES: [&str; 2] = ["a", "b"];
    const PROJECTS: [&str; 2] = ["p1", "p2"];
    const HOSTS: [&str; 3] = ["h1", "h2", "h3"];
    const JOBS: [&str; 5] = ["j1", "j2", "j3", "j4", "j5"];
    const STATES: [JobState; 7] = [
        JobState::Placed,
        JobState::Running,
        JobState::Draining,
        JobState::Stopping,
        JobState::Unknown,
        JobState::Exited,
        JobState::Lost,
    ];

    #[derive(Debug, Clone)]
    /// Services are `(SERVICES[s], PROJECTS[p])`: both names exist in both projects, as
    /// four different services.
    enum Op {
        Service(usize, usize, usize),
        Remove(usize, usize),
        Job(usize, usize, usize, u32, usize, usize, bool, u16, u64),
        Ended(usize),
        Host(usize, usize, Vec<(usize, usize)>),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..2usize, 0..2usize, 0..3usize).prop_map(|(s, p, n)| Op::Service(s, p, n)),
            (0..2usize, 0..2usize).prop_map(|(s, p)| Op::Remove(s, p)),
            (
                0..5usize,
                0..2usize,
                0..2usize,
                0..3u32,
                0..3usize,
                0..7usize,
                any::<bool>(),
                0..3u16,
                1..3u64,
            )
                .prop_map(|(j, s, pr, r, h, st, ready, p, g)| {
                    Op::Job(j, s, pr, r, h, st, ready, p, g)
                }),
            (0..5usize).prop_map(Op::Ended),
            (
                0..3usize,
                0..4usize,
                proptest::collection::vec((0..2usize, 0..2usize), 0..3)
            )
                .prop_map(|(h, ip, s)| Op::Host(h, ip, s)),
        ]
    }

    /// The cluster as plain maps: what the controller would hold.
    #[derive(Default)]
    struct Model {
        services: BTreeMap<ServiceKey, ServiceInfo>,
        jobs: BTreeMap<String, JobInfo>,
        hosts: BTreeMap<String, HostInfo>,
    }

    impl Model {
        /// Every entry from scratch (index 0), written independently of `Table`.
        fn entries(&self) -> BTreeMap<ServiceKey, Entry> {
            let mut out = BTreeMap::new();
            for s in self.services.values() {
                let ports = s.profile["ports"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| DeclaredPort {
                        name: p["name"].as_str().unwrap().into(),
                        protocol: Protocol::Tcp,
                    })
                    .collect();
                let mut replicas: Vec<Replica> = self
                    .jobs
                    .values()
                    .filter(|j| j.service == s.name && j.project == s.project)
                    .map(|j| Replica {
                        replica: j.replica,
                        job: j.job.as_str().into(),
                        host: j.host.as_str().into(),
                        address: self.hosts.get(&j.host).and_then(|h| h.facts.ip_addr),
                        ports: port_resource::PortGrant::from_grant(&j.grants["ports"])
                            .unwrap()
                            .ports
                            .into_iter()
                            .map(|p| (p.name, p.port))
                            .collect(),
                        generation: j.generation,
                        state: j.state,
                        ready: j.ready,
                    })
                    .collect();
                replicas.sort_by_key(|r| (r.replica, r.job.clone()));
                let entry = Entry {
                    service: s.name.clone(),
                    project: s.project.clone(),
                    index: 0,
                    ports,
                    replicas,
                    meta: Default::default(),
                    rendered: Default::default(),
                };
                out.insert(ServiceKey::new(&s.project, &s.name), entry);
            }
            out
        }

        fn event(&mut self, rev: u64, op: &Op) -> ClusterEvent {
            let ports = [&[][..], &["http"][..], &["http", "metrics"][..]];
            match op {
                Op::Service(s, p, n) => {
                    let svc = service(SERVICES[*s], PROJECTS[*p], ports[*n]);
                    let svc = ServiceInfo { rev, ..svc };
                    self.services
                        .insert(key(PROJECTS[*p], SERVICES[*s]), svc.clone());
                    ClusterEvent::Service { rev, service: svc }
                }
                Op::Remove(s, p) => {
                    self.services.remove(&key(PROJECTS[*p], SERVICES[*s]));
                    ev_removed(rev, SERVICES[*s], PROJECTS[*p])
                }
                Op::Job(j, s, pr, r, h, st, ready, p, g) => {
                    let mut info = job(
                        JOBS[*j],
                        SERVICES[*s],
                        PROJECTS[*pr],
                        *r,
                        HOSTS[*h],
                        &[("http", 20000 + p)],
                    );
                    info.state = STATES[*st];
                    info.ready = *ready;
                    info.generation = *g;
                    if info.state.is_ended() {
                        self.jobs.remove(JOBS[*j]);
                    } else {
                        self.jobs.insert(info.job.clone(), info.clone());
                    }
                    ev_job(rev, info)
                }
                Op::Ended(j) => {
                    let info = self
                        .jobs
                        .remove(JOBS[*j])
                        .unwrap_or_else(|| job(JOBS[*j], "a", "p1", 0, "h1", &[]));
                    ev_ended(rev, info)
                }
                Op::Host(h, ip, s) => {
                    let ip = [None, Some("10.0.0.1"), Some("10.0.0.2"), Some("::1")][*ip];
                    let info = host(HOSTS[*h], ip);
                    self.hosts.insert(info.id.clone(), info.clone());
                    let services: Vec<(&str, &str)> = s
                        .iter()
                        .map(|(s, p)| (PROJECTS[*p], SERVICES[*s]))
                        .collect();
                    ev_host(rev, info, &services)
                }
            }
        }
    }

    /// The services an event touches, written independently of `Table`: the service of
    /// a service event, the service of a job event (and of the job it replaces), the
    /// services a host event names and those with jobs on that host. Each by project and
    /// name: another project's service of the same name is never touched.
    fn touched_by(
        jobs_before: &BTreeMap<String, JobInfo>,
        event: &ClusterEvent,
    ) -> BTreeSet<ServiceKey> {
        let of_job = |j: &JobInfo| key(&j.project, &j.service);
        let mut out = BTreeSet::new();
        match event {
            ClusterEvent::Service { service, .. } => {
                out.insert(key(&service.project, &service.name));
            }
            ClusterEvent::ServiceRemoved { .. } => {}
            ClusterEvent::Job { job, .. } | ClusterEvent::JobEnded { job, .. } => {
                out.insert(of_job(job));
                out.extend(jobs_before.get(&job.job).map(of_job));
            }
            ClusterEvent::Host { host, services, .. } => {
                out.extend(services.iter().cloned());
                out.extend(
                    jobs_before
                        .values()
                        .filter(|j| j.host == host.id)
                        .map(of_job),
                );
            }
        }
        out
    }

    proptest! {
        #[test]
        fn table_matches_recomputation(ops in proptest::collection::vec(op(), 1..60)) {
            let mut model = Model::default();
            let mut table = Table::new();
            let mut expected: BTreeMap<ServiceKey, Entry> = BTreeMap::new();
            let mut rev = 0;
            for op in &ops {
                rev += 1 + u64::from(rev % 3 == 0);
                let before = model.jobs.clone();
                let event = model.event(rev, op);
                let changes = table.apply(&event);

                // The expected entries: content from scratch; the index is the revision of
                // the last event that touched the service, and an untouched entry keeps
                // its content.
                let touched = touched_by(&before, &event);
                let mut next = BTreeMap::new();
                let mut expected_changes = BTreeMap::new();
                for (name, mut entry) in model.entries() {
                    match expected.get(&name) {
                        Some(old) if !touched.contains(&name) => {
                            prop_assert!(old.same_content(&entry), "untouched {} changed", name);
                            entry.index = old.index;
                        }
                        _ => {
                            entry.index = rev;
                            expected_changes.insert(name.clone(), Some(entry.clone()));
                        }
                    }
                    next.insert(name, entry);
                }
                for name in expected.keys().filter(|n| !next.contains_key(*n)) {
                    expected_changes.insert(name.clone(), None);
                }
                for (name, old) in &expected {
                    if let Some(new) = next.get(name) {
                        prop_assert!(new.index >= old.index && new.index >= 1);
                    }
                }
                expected = next;

                let got: BTreeMap<ServiceKey, Option<Entry>> = changes
                    .iter()
                    .map(|c| match c {
                        Change::Upsert { entry } => (entry.key(), Some((**entry).clone())),
                        Change::Removed { .. } => (c.key(), None),
                    })
                    .collect();
                prop_assert_eq!(got.len(), changes.len(), "one change per service");
                prop_assert_eq!(&got, &expected_changes);
                let table_entries: BTreeMap<ServiceKey, Entry> =
                    table.entries().map(|e| (e.key(), (**e).clone())).collect();
                prop_assert_eq!(&table_entries, &expected);
            }

            // A resync with the same state (each service with the revision of the last
            // event that touched it, as the controller stores it) changes nothing, and a
            // fresh table serves exactly the same entries, indexes included.
            let snapshot = ClusterSnapshot {
                rev,
                services: model
                    .services
                    .values()
                    .map(|s| ServiceInfo { rev: expected[&key(&s.project, &s.name)].index, ..s.clone() })
                    .collect(),
                jobs: model.jobs.values().cloned().collect(),
                hosts: model.hosts.values().cloned().collect(),
            };
            prop_assert_eq!(table.resync(&snapshot), vec![]);
            let mut fresh = Table::new();
            fresh.resync(&snapshot);
            for (name, entry) in &expected {
                prop_assert_eq!(&**fresh.entry(name).unwrap(), entry);
            }
        }
    }

    proptest! {
        /// The incremental table, fed in batches of any size, ends exactly where feeding it
        /// one event at a time ends, and where a from-scratch rebuild (a fresh table
        /// resynced to the final state) ends, indexes included; and a reader of the
        /// batches' changes holds the same entries, each published with a higher index.
        #[test]
        fn batches_equal_one_by_one_and_a_rebuild(
            ops in proptest::collection::vec(op(), 1..80),
            cuts in proptest::collection::vec(1..7usize, 1..30),
        ) {
            let mut model = Model::default();
            let mut events = Vec::new();
            for (n, op) in ops.iter().enumerate() {
                events.push(model.event(n as u64 + 1, op));
            }
            let mut single = Table::new();
            for event in &events {
                single.apply(event);
            }
            let mut batched = Table::new();
            let mut served: BTreeMap<ServiceKey, Arc<Entry>> = BTreeMap::new();
            let mut rest = &events[..];
            let mut cuts = cuts.iter().cycle();
            while !rest.is_empty() {
                let n = (*cuts.next().unwrap()).min(rest.len());
                let (batch, tail) = rest.split_at(n);
                rest = tail;
                for change in batched.apply_batch(batch) {
                    match change {
                        Change::Upsert { entry } => {
                            if let Some(old) = served.get(&entry.key()) {
                                prop_assert!(entry.index > old.index, "index not raised");
                            }
                            served.insert(entry.key(), entry);
                        }
                        Change::Removed { .. } => {
                            prop_assert!(served.remove(&change.key()).is_some(), "removed unseen");
                        }
                    }
                }
            }
            let all = |t: &Table| -> Vec<Entry> { t.entries().map(|e| (**e).clone()).collect() };
            prop_assert_eq!(all(&batched), all(&single));
            let served: Vec<Entry> = served.values().map(|e| (**e).clone()).collect();
            prop_assert_eq!(&served, &all(&batched));

            let snapshot = ClusterSnapshot {
                rev: events.len() as u64,
                services: model
                    .services
                    .values()
                    .map(|s| {
                        let index = batched.entry(&key(&s.project, &s.name)).unwrap().index;
                        ServiceInfo { rev: index, ..s.clone() }
                    })
                    .collect(),
                jobs: model.jobs.values().cloned().collect(),
                hosts: model.hosts.values().cloned().collect(),
            };
            let mut fresh = Table::new();
            fresh.resync(&snapshot);
            prop_assert_eq!(all(&fresh), all(&batched));
            prop_assert_eq!(batched.resync(&snapshot), vec![]);
        }
    }
}
