//! The simulated workers: each host runs the real [`HostFactsProvider`]s (its address
//! and its ports) and the real [`LaunchHook`]s, and records the environment a replica
//! would get instead of spawning it.

use host_address::{AddressConfig, AddressProvider, Advertise};
use plugin_api::{
    FactsError, HostFacts, HostFactsProvider, LaunchContext, LaunchHook, LaunchPlan, LaunchRefusal,
};
use port_resource::{PortFactsProvider, PortsLaunchHook, WorkerPortsConfig};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

/// The address simulated host `i` advertises: `127.1.0.1`, `127.1.0.2`, … Every
/// `127.0.0.0/8` address is this machine's loopback, so the launch hook's bind check of
/// a granted port is a real check on an address of that host alone.
pub fn host_ip(i: u32) -> IpAddr {
    let b = 1 + i / 62_500;
    let c = (i / 250) % 250;
    let d = i % 250 + 1;
    IpAddr::V4(Ipv4Addr::new(127, b as u8, c as u8, d as u8))
}

/// The workers of every simulated host.
pub(crate) struct Workers {
    providers: Vec<Vec<Box<dyn HostFactsProvider>>>,
    hooks: Vec<Box<dyn LaunchHook>>,
    /// The workers' own runtime: the traits are async, the simulation is not.
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("hosts", &self.providers.len())
            .finish_non_exhaustive()
    }
}

/// What a worker was configured with (the `[ports]` and `[address]` sections a real
/// worker reads from its config file).
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// The dynamic port range, `"lo-hi"`.
    pub range: String,
    /// Reserved ports.
    pub reserved: Vec<u16>,
    /// Where the kernel's ephemeral range is read from.
    pub ephemeral_range_file: PathBuf,
}

// === impl Workers ===

impl Workers {
    pub(crate) fn new(
        hosts: u32,
        settings: &WorkerSettings,
    ) -> Result<Self, crate::error::SimError> {
        let ports = WorkerPortsConfig {
            range: settings.range.clone(),
            reserved: settings.reserved.clone(),
            ephemeral_range_file: settings.ephemeral_range_file.clone(),
        };
        let mut providers = Vec::with_capacity(hosts as usize);
        for i in 0..hosts {
            let address = AddressProvider::new(AddressConfig {
                advertise: Some(Advertise::Ip(host_ip(i))),
                prefer: Default::default(),
                allow_loopback: true,
            })
            .map_err(|e| crate::error::SimError::Config(format!("address: {e}")))?;
            let ports = PortFactsProvider::new(&ports)
                .map_err(|e| crate::error::SimError::Config(format!("ports: {e}")))?;
            providers.push(vec![
                Box::new(address) as Box<dyn HostFactsProvider>,
                Box::new(ports),
            ]);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| crate::error::SimError::Config(format!("workers' runtime: {e}")))?;
        Ok(Self {
            providers,
            hooks: vec![Box::new(PortsLaunchHook::new())],
            rt,
        })
    }

    /// What host `i`'s worker reports: every provider's part, in order.
    pub(crate) fn collect(&self, i: u32) -> Result<HostFacts, FactsError> {
        let mut facts = HostFacts::default();
        self.rt.block_on(async {
            for p in &self.providers[i as usize] {
                p.collect(&mut facts).await?;
            }
            Ok(facts)
        })
    }

    /// Runs every launch hook for the job, as a worker does just before spawning.
    pub(crate) fn launch(&self, cx: &LaunchContext) -> Result<LaunchPlan, LaunchRefusal> {
        let mut plan = LaunchPlan::default();
        self.rt.block_on(async {
            for h in &self.hooks {
                h.prepare(cx, &mut plan).await?;
            }
            Ok(plan)
        })
    }
}
