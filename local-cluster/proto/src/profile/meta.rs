//! `[service.meta]` (docs/profile.md): free string labels, copied into endpoint entries and
//! Prometheus SD labels (`__meta_xce_meta_<key>`), so keys must be valid label-name parts.

use plugin_api::FieldError;
use serde_json::Value;
use std::collections::BTreeMap;

use super::table::StringTable;

/// The most labels a service may have.
pub const MAX_LABELS: usize = 32;
/// The longest label key, in characters.
pub const MAX_KEY_LEN: usize = 63;
/// The longest label value, in bytes.
pub const MAX_VALUE_BYTES: usize = 256;

/// Validates `service.meta`, listing every problem in `errs`; the labels (those that are
/// valid) either way.
pub(super) fn parse(v: Option<&Value>, errs: &mut Vec<FieldError>) -> BTreeMap<String, String> {
    StringTable {
        field: "service.meta",
        shape: "must be a table of string labels",
        noun: "labels",
        max_entries: MAX_LABELS,
        max_value: MAX_VALUE_BYTES,
        check_key,
        check_value: |_| Ok(()),
    }
    .parse(v, errs)
}

/// A label key: 1-63 characters of `[a-z0-9_]`.
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.chars().count() > MAX_KEY_LEN {
        return Err(format!("label names must be 1-{MAX_KEY_LEN} characters"));
    }
    if !key
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(
            "label names may contain only a-z, 0-9 and '_' (they become Prometheus label names)"
                .into(),
        );
    }
    Ok(())
}
