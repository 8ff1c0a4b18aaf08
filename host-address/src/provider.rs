//! The worker side: the `address` host-facts provider.

use crate::choose::{choose, Choice};
use crate::config::{AddressConfig, ConfigError};
use crate::interfaces::read_interfaces;
use async_trait::async_trait;
use plugin_api::{FactsError, HostFacts, HostFactsProvider};

/// Reports the host's addresses: sets [`HostFacts::ip_addr`] and [`HostFacts::addresses`].
///
/// Every [`collect`](HostFactsProvider::collect) reads the interfaces afresh and chooses
/// again; the worker's timer and diff decide whether anything is sent.
#[derive(Debug, Clone)]
pub struct AddressProvider {
    config: AddressConfig,
}

impl AddressProvider {
    /// The provider's name.
    pub const NAME: &'static str = "address";

    /// Builds the provider, refusing settings that can never work (a loopback `advertise`
    /// without `allow_loopback`, a multicast `advertise`, ...). Whether the interfaces
    /// allow a choice is known only at the first `collect`, which the worker runs at start.
    pub fn new(config: AddressConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The settings.
    pub fn config(&self) -> &AddressConfig {
        &self.config
    }

    /// Reads this machine's interfaces and chooses, synchronously.
    pub fn choose_now(&self) -> Result<Choice, FactsError> {
        let interfaces = read_interfaces().map_err(|e| {
            FactsError::new(Self::NAME, format!("cannot read network interfaces: {e}"))
        })?;
        choose(&interfaces, &self.config).map_err(|e| FactsError::new(Self::NAME, e.to_string()))
    }
}

#[async_trait]
impl HostFactsProvider for AddressProvider {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    async fn collect(&self, facts: &mut HostFacts) -> Result<(), FactsError> {
        // getifaddrs is one netlink round trip on Linux: cheap enough to run inline rather
        // than on the blocking pool.
        let choice = self.choose_now()?;
        tracing::debug!(
            ip_addr = %choice.ip_addr,
            addresses = choice.addresses.len(),
            "host addresses collected"
        );
        choice.apply(facts);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    /// Every machine has a loopback interface, so the xced dev settings (a loopback
    /// address of its own, `allow_loopback`) work against the real interfaces anywhere.
    #[tokio::test]
    async fn collects_from_real_interfaces() {
        let provider = AddressProvider::new(AddressConfig {
            advertise: Some("127.0.0.11".parse().unwrap()),
            prefer: Default::default(),
            allow_loopback: true,
        })
        .unwrap();
        let mut facts = HostFacts::default();
        provider.collect(&mut facts).await.unwrap();
        let want: IpAddr = "127.0.0.11".parse().unwrap();
        assert_eq!(facts.ip_addr, Some(want));
        assert_eq!(facts.addresses[0].ip, want);
        // 127.0.0.11 is attributed to the loopback interface holding 127.0.0.1/8.
        assert!(facts.addresses[0].interface.is_some(), "{facts:?}");
        assert!(facts
            .addresses
            .iter()
            .any(|a| a.ip.is_loopback() && a.ip != want));
        assert_eq!(provider.name(), "address");
    }

    #[test]
    fn refuses_loopback_without_allow() {
        let err = AddressProvider::new(AddressConfig {
            advertise: Some("::1".parse().unwrap()),
            ..Default::default()
        })
        .unwrap_err();
        expect_test::expect![[r#"advertise ::1 is a loopback address, reachable from this machine only; set allow_loopback = true to advertise it (single-machine setups only)"#]]
            .assert_eq(&err.to_string());
    }
}
