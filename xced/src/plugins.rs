//! Which plugins each component loads: the one file of the workspace that constructs the
//! plugins of the controller, the separate apiserver and the worker. the host's crates (`local-cluster/*`) take them as `plugin-api` trait objects
//! and knows none of them; `xced controller`, `xced worker` and `xced dev` all call here,
//! so the three modes cannot load different sets.

use anyhow::{Context, Result};
use std::sync::Arc;
use xce_apiserver::ApiserverPlugins;
use xce_controller::ControllerPlugins;
use xce_worker::WorkerPlugins;

/// The controller's plugins: ports as a resource, the address policy, the endpoint table.
pub(crate) fn controller_plugins(
    address: host_address::PolicyConfig,
    endpoints: endpoint_table::TableConfig,
) -> ControllerPlugins {
    let (feed, api) = endpoint_table::endpoint_table(endpoints);
    ControllerPlugins {
        resources: vec![Box::new(port_resource::PortsPlugin::new())],
        facts_policies: vec![Arc::new(host_address::AddressPolicy::new(address))],
        listeners: vec![Arc::new(feed)],
        extensions: vec![Arc::new(api)],
    }
}

/// A separate apiserver's plugins: the endpoint table, both halves (its feed follows the
/// controller's store instead of a controller).
pub(crate) fn apiserver_plugins(endpoints: endpoint_table::TableConfig) -> ApiserverPlugins {
    let (feed, api) = endpoint_table::endpoint_table(endpoints);
    ApiserverPlugins {
        listeners: vec![Arc::new(feed)],
        extensions: vec![Arc::new(api)],
    }
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
