//! Which plugins each component loads: the one file of the workspace that constructs the
//! plugins of the controller, the separate apiserver and the worker. the host's crates (`local-cluster/*`) take them as `plugin-api` trait objects
//! and knows none of them; `xced controller`, `xced worker` and `xced dev` all call here,
//! so the three modes cannot load different sets.

use anyhow::{Context, Result};
use std::sync::Arc;
use xce_apiserver::ApiserverPlugins;
use xce_controller::ControllerPlugins;
use xce_worker::WorkerPlugins;

/// The controller's plugins: ports as a resource, the address policy, the endpoint table,
/// DNS answering from it (its UDP and TCP listeners are started by
/// [`crate::dns::listen`] with the server returned here).
///
/// `authority`: with leader election, the term's lease clock — the endpoint table answers
/// only while it says this controller may still lead (`EndpointApi::answer_while`).
pub(crate) fn controller_plugins(
    address: host_address::PolicyConfig,
    endpoints: endpoint_table::TableConfig,
    dns: &xce_dns::DnsConfig,
    authority: Option<endpoint_table::Authority>,
) -> Result<(ControllerPlugins, Arc<xce_dns::Dns>)> {
    let (feed, api) = endpoint_table::endpoint_table(endpoints);
    if let Some(authority) = authority {
        api.answer_while(authority);
    }
    let api = Arc::new(api);
    let dns = xce_dns::Dns::new(dns, &api).context("invalid [dns] config")?;
    let plugins = ControllerPlugins {
        resources: vec![Box::new(port_resource::PortsPlugin::new())],
        facts_policies: vec![Arc::new(host_address::AddressPolicy::new(address))],
        listeners: vec![Arc::new(feed)],
        extensions: vec![api, Arc::new(xce_dns::DnsApi(dns.clone()))],
    };
    Ok((plugins, dns))
}

/// A separate apiserver's plugins: the endpoint table, both halves (its feed follows the
/// controller's store instead of a controller), and DNS answering from it.
pub(crate) fn apiserver_plugins(
    endpoints: endpoint_table::TableConfig,
    dns: &xce_dns::DnsConfig,
) -> Result<(ApiserverPlugins, Arc<xce_dns::Dns>)> {
    let (feed, api) = endpoint_table::endpoint_table(endpoints);
    let api = Arc::new(api);
    let dns = xce_dns::Dns::new(dns, &api).context("invalid [dns] config")?;
    let plugins = ApiserverPlugins {
        listeners: vec![Arc::new(feed)],
        extensions: vec![api, Arc::new(xce_dns::DnsApi(dns.clone()))],
    };
    Ok((plugins, dns))
}

/// A worker's plugins: address and port-pool facts, the port launch hook.
pub(crate) fn worker_plugins(
    address: host_address::AddressConfig,
    ports: port_resource::WorkerPortsConfig,
) -> Result<WorkerPlugins> {
    let addr = host_address::AddressProvider::new(address).context("invalid [address] config")?;
    let ports_facts =
        port_resource::PortFactsProvider::new(&ports).context("invalid [ports] config")?;
    Ok(WorkerPlugins {
        facts: vec![Arc::new(addr), Arc::new(ports_facts)],
        hooks: vec![Arc::new(port_resource::PortsLaunchHook::new())],
    })
}
