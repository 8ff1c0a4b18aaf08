//! Starting the DNS listeners of a controller's or an apiserver's DNS server: the
//! principal they answer as comes from the tokens in force.

use anyhow::{Context, Result};
use std::sync::Arc;
use xce_serve::keyring::Keyring;

/// Binds `[dns] listen` (if set) and answers there as `[dns] principal`; the listeners
/// stop when the returned value is dropped.
pub(crate) async fn listen(
    dns: &Arc<xce_dns::Dns>,
    cfg: &xce_dns::DnsConfig,
    keyring: &Keyring,
) -> Result<Option<xce_dns::Listener>> {
    let Some(addr) = cfg.listen else {
        return Ok(None);
    };
    let principal = keyring.principal_named(&cfg.principal).with_context(|| {
        format!(
            "dns.principal {:?}: no [[token]] of the tokens file has this principal; add \
             one whose job.view grants are the projects DNS may answer for (docs/rbac.md)",
            cfg.principal
        )
    })?;
    let listener = dns
        .listen(addr, principal)
        .await
        .with_context(|| format!("dns.listen {addr}: cannot listen on UDP and TCP"))?;
    println!(
        "xced: dns on {} (udp, tcp), zone {}, {} udp readers.",
        listener.addr(),
        cfg.domain,
        listener.udp_readers()
    );
    Ok(Some(listener))
}
