//! The public API calls the benches share.

use anyhow::{bail, Result};

/// Submits service `name`: `replicas` replicas of `sleep infinity` with one port `http`
/// and a tcp readiness probe on it (the fake workers report readiness themselves).
pub(crate) async fn submit_sleeper(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: &str,
    replicas: usize,
) -> Result<()> {
    let profile = format!(
        "[service]\nname = \"{name}\"\nreplicas = {replicas}\n\
         command = [\"sleep\", \"infinity\"]\n\
         [[service.ports]]\nname = \"http\"\n\
         [service.readiness]\ntcp = \"http\"\n"
    );
    let r = http
        .post(format!("{base}/v1/services"))
        .bearer_auth(token)
        .header("content-type", "application/toml")
        .body(profile)
        .send()
        .await?;
    if r.status() != 201 {
        let st = r.status();
        bail!(
            "submitting {name} ({replicas} replicas): HTTP {st}: {}",
            r.text().await?
        );
    }
    Ok(())
}
