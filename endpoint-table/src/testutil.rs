//! Builders for the controller's vocabulary, shared by the unit tests.

use plugin_api::{
    ClusterEvent, EndReason, HostFacts, HostInfo, HostState, JobInfo, JobState, ServiceInfo,
    ServiceKey,
};
use port_resource::grant::{GrantedPort, PortGrant, Protocol};

/// A service declaring `ports` (all tcp).
pub(crate) fn service(name: &str, project: &str, ports: &[&str]) -> ServiceInfo {
    let ports: Vec<_> = ports
        .iter()
        .map(|p| serde_json::json!({"name": p, "protocol": "tcp"}))
        .collect();
    ServiceInfo {
        name: name.into(),
        project: project.into(),
        replicas: 3,
        profile: serde_json::json!({"name": name, "project": project, "ports": ports}),
        rev: 0,
        generation: 1,
    }
}

/// A running, ready job with `ports` granted.
pub(crate) fn job(
    id: &str,
    service: &str,
    project: &str,
    replica: u32,
    host: &str,
    ports: &[(&str, u16)],
) -> JobInfo {
    let grant = PortGrant {
        ports: ports
            .iter()
            .map(|(name, port)| GrantedPort {
                name: (*name).into(),
                protocol: Protocol::Tcp,
                port: *port,
            })
            .collect(),
    };
    JobInfo {
        job: id.into(),
        service: service.into(),
        project: project.into(),
        replica,
        host: host.into(),
        state: JobState::Running,
        ready: true,
        grants: plugin_api::Grants::from([(port_resource::PLUGIN_NAME, grant.to_grant())]),
        generation: 1,
    }
}

/// A ready host advertising `ip`.
pub(crate) fn host(id: &str, ip: Option<&str>) -> HostInfo {
    HostInfo {
        id: id.into(),
        state: HostState::Ready,
        facts: HostFacts {
            ip_addr: ip.map(|ip| ip.parse().unwrap()),
            ..HostFacts::default()
        },
    }
}

pub(crate) fn ev_service(rev: u64, mut service: ServiceInfo) -> ClusterEvent {
    service.rev = rev;
    ClusterEvent::Service { rev, service }
}

pub(crate) fn ev_removed(rev: u64, name: &str, project: &str) -> ClusterEvent {
    ClusterEvent::ServiceRemoved {
        rev,
        name: name.into(),
        project: project.into(),
    }
}

pub(crate) fn ev_job(rev: u64, job: JobInfo) -> ClusterEvent {
    ClusterEvent::Job { rev, job }
}

pub(crate) fn ev_ended(rev: u64, job: JobInfo) -> ClusterEvent {
    ClusterEvent::JobEnded {
        rev,
        job,
        reason: EndReason::Stopped,
    }
}

/// A host event naming `services` as `(project, name)`.
pub(crate) fn ev_host(rev: u64, host: HostInfo, services: &[(&str, &str)]) -> ClusterEvent {
    ClusterEvent::Host {
        rev,
        host,
        services: services
            .iter()
            .map(|(project, name)| ServiceKey::new(*project, *name))
            .collect(),
    }
}

/// The key of service `name` in `project`.
pub(crate) fn key(project: &str, name: &str) -> ServiceKey {
    ServiceKey::new(project, name)
}
