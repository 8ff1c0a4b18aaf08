//! A controller never leads a store written in a newer format than it understands
//! (`xce_model::FORMAT`): an old standby next to an upgraded leader must not win the
//! election and then fail to load (the store would be left without a leader). It checks
//! `meta/format` before it campaigns and while it waits, and exits naming both formats
//! instead; the leader stays in place.

use anyhow::Result;
use serde_json::json;
use std::time::Duration;
use xce_model::{check_format, decode_format, format_key, LoadError};
use xce_store::etcd::gateway::{b64, unb64, Gateway, Limits};

/// Why an elected controller that found a newer format stops.
pub(crate) const RESIGNED: &str =
    "elected, but this controller cannot lead this store; it resigned and exits";

/// How long one read of the format may take.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The format of the store under `prefix` on `gateway`: `Ok(None)` when none is recorded
/// (format 1) or etcd cannot say now (the load checks again after an election).
async fn stored(gateway: &Gateway, prefix: &str) -> Result<Option<u64>, LoadError> {
    let key = format_key();
    let name = format!("{prefix}{}/{}", key.ns, key.key);
    let body = json!({ "key": b64(name.as_bytes()) });
    let Ok(answer) = gateway
        .call("/v3/kv/range", &body, Limits::each(READ_TIMEOUT))
        .await
    else {
        return Ok(None);
    };
    let Some(kv) = answer.pointer("/kvs/0") else {
        return Ok(None);
    };
    let bytes = unb64(&kv["value"]).unwrap_or_default();
    let found = decode_format(&bytes).map_err(|err| LoadError::Decode { key, err })?;
    check_format(found)?;
    Ok(Some(found))
}

/// Errs (naming both formats) when the store is of a newer format than this build's.
pub(crate) async fn refuse_newer(gateway: &Gateway, prefix: &str) -> Result<()> {
    stored(gateway, prefix).await?;
    Ok(())
}

/// Resolves with the refusal once the store's format is newer than this build's (a
/// leader of a newer release migrated it while this one waited), checking every `period`.
pub(crate) async fn watch_newer(
    gateway: &Gateway,
    prefix: &str,
    period: Duration,
) -> anyhow::Error {
    loop {
        if let Err(e) = refuse_newer(gateway, prefix).await {
            return e;
        }
        tokio::time::sleep(period).await;
    }
}

/// Whether `e` says the store is of a newer format (nothing a retry can fix).
pub(crate) fn is_newer(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<LoadError>(),
            Some(LoadError::NewerFormat { .. })
        )
    })
}
