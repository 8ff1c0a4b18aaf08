//! All-or-nothing reservation over the loaded resource plugins.

use plugin_api::{Grants, HostId, PlacementRequest, ResourcePlugin};

/// Reserves on `host` with every plugin (`reqs[i]` is plugin `i`'s request), all or
/// nothing: a refusal releases what the plugins before it reserved.
pub(crate) fn reserve_all(
    plugins: &mut [Box<dyn ResourcePlugin>],
    host: &HostId,
    reqs: &[PlacementRequest<'_>],
) -> Option<Grants> {
    let mut grants = Vec::with_capacity(plugins.len());
    for i in 0..plugins.len() {
        let r = &reqs[i];
        match plugins[i].reserve(host, r) {
            Ok(g) => {
                grants.push((plugins[i].name(), g));
            }
            Err(unfit) => {
                // fits said yes a moment ago: the plugin's two answers disagree.
                tracing::warn!(%host, job = r.job, %unfit, "reserve refused after fits");
                let job = r.job.to_owned();
                for p in &mut plugins[..i] {
                    p.release(host, &job);
                }
                return None;
            }
        }
    }
    Some(grants.into_iter().collect())
}
