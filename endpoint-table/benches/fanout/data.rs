//! The bench's data (jobs, snapshots) and the pure table's rates.

use super::*;

// === the data ===

pub(crate) fn job(
    id: usize,
    service: &str,
    replica: u32,
    host: usize,
    ready: bool,
    port: u16,
) -> JobInfo {
    let grant = serde_json::json!({"ports": [{"name": "http", "protocol": "tcp", "port": port}]});
    JobInfo {
        job: format!("j-{id}"),
        service: service.into(),
        project: "default".into(),
        replica,
        host: format!("exec-{host:02}"),
        state: JobState::Running,
        ready,
        grants: plugin_api::Grants::from([(port_resource::PLUGIN_NAME, grant.into())]),
        generation: 1,
    }
}

/// Services named by `(name, replicas)`, spread over `hosts` hosts.
pub(crate) fn snapshot(services: &[(String, u32)], hosts: usize) -> ClusterSnapshot {
    let mut snap = ClusterSnapshot {
        rev: BASE,
        ..ClusterSnapshot::default()
    };
    for h in 0..hosts {
        snap.hosts.push(HostInfo {
            id: format!("exec-{h:02}"),
            state: HostState::Ready,
            facts: HostFacts {
                ip_addr: Some(
                    format!("10.0.{}.{}", h / 200, 11 + h % 200)
                        .parse()
                        .unwrap(),
                ),
                ..HostFacts::default()
            },
        });
    }
    let mut id = 0;
    for (name, replicas) in services {
        snap.services.push(ServiceInfo {
            name: name.clone(),
            project: "default".into(),
            replicas: *replicas,
            profile: serde_json::json!({"name": name, "ports": [{"name": "http"}]}),
            rev: BASE,
            generation: 1,
        });
        for r in 0..*replicas {
            snap.jobs.push(job(
                id,
                name,
                r,
                id % hosts,
                true,
                20000 + (id % 10000) as u16,
            ));
            id += 1;
        }
    }
    snap
}

/// The length of svc-0's JSON answer after an even number of changes (its first replica
/// ready) and after an odd number (not ready): the sizes of the values the etcd runs put.
pub(crate) fn svc0_json_lens() -> [usize; 2] {
    let snap = serve_snapshot();
    let key = plugin_api::ServiceKey::new("default", "svc-0");
    [true, false].map(|ready| {
        let mut snap = snap.clone();
        snap.jobs[0].ready = ready;
        let mut table = Table::new();
        table.resync(&snap);
        let answer = endpoint_table::wire::answer(table.entry(&key).unwrap(), None, false);
        serde_json::to_vec(&answer).unwrap().len()
    })
}

// === the pure table ===

pub(crate) fn table_rates() {
    let (services, replicas) = (1000, 3);
    let names: Vec<_> = (0..services)
        .map(|s| (format!("svc-{s}"), replicas))
        .collect();
    let snap = snapshot(&names, 10);
    let mut table = Table::new();
    let t = Instant::now();
    let changed = table.resync(&snap).len();
    let resync = t.elapsed();
    let t = Instant::now();
    black_box(table.resync(&snap));
    let same = t.elapsed();

    let events: Vec<ClusterEvent> = (0..100_000u64)
        .map(|i| {
            // Every job in turn, flipping readiness each pass: every event is a change.
            let n = snap.jobs.len() as u64;
            let mut j = snap.jobs[((i * 7919) % n) as usize].clone();
            j.ready = (i / n) % 2 == 1;
            ClusterEvent::Job {
                rev: BASE + 1 + i,
                job: j,
            }
        })
        .collect();
    let t = Instant::now();
    let mut changes = 0;
    for e in &events {
        changes += black_box(table.apply(e)).len();
    }
    let apply = t.elapsed();
    println!("table: {services} services x {replicas} replicas (in process)");
    println!("  resync from empty      {resync:>10.2?} ({changed} changes)");
    println!("  resync, same state     {same:>10.2?} (0 changes)");
    println!(
        "  apply readiness events {:>10.0} events/s ({changes} changes from {} events)",
        events.len() as f64 / apply.as_secs_f64(),
        events.len()
    );
}
