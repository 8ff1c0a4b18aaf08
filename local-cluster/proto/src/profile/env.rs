//! `[service.env]` (docs/profile.md): the replica's own environment variables. A replica
//! inherits nothing of its worker's environment, so what a program needs beyond its
//! `XCE_*` variables and `PATH`/`LANG`/`HOME` is declared here, in the profile, where
//! every host gives it the same.

use plugin_api::FieldError;
use serde_json::Value;
use std::collections::BTreeMap;

use super::table::StringTable;

/// The most variables a service may set.
pub const MAX_ENV_VARS: usize = 64;
/// The longest variable name, in bytes.
pub const MAX_ENV_NAME: usize = 128;
/// The longest value, in bytes.
pub const MAX_ENV_VALUE: usize = 4096;

/// Validates `service.env`, listing every problem in `errs`; the variables (those that are
/// valid) either way.
pub(super) fn parse(v: Option<&Value>, errs: &mut Vec<FieldError>) -> BTreeMap<String, String> {
    StringTable {
        field: "service.env",
        shape: "must be a table of string values (NAME = \"value\")",
        noun: "variables",
        max_entries: MAX_ENV_VARS,
        max_value: MAX_ENV_VALUE,
        check_key: check_name,
        check_value: |s| {
            if s.contains('\0') {
                Err("value must not contain NUL".into())
            } else {
                Ok(())
            }
        },
    }
    .parse(v, errs)
}

/// A variable name: a letter or `_`, then letters, digits and `_`; not `XCE_…`, which
/// the worker sets (a profile cannot forge its own port or job id).
fn check_name(name: &str) -> Result<(), String> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !first_ok
        || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || name.len() > MAX_ENV_NAME
    {
        return Err(format!(
            "variable names are 1-{MAX_ENV_NAME} characters of A-Z, a-z, 0-9 and '_', not starting with a digit"
        ));
    }
    if name.to_ascii_uppercase().starts_with("XCE_") {
        return Err(
            "XCE_ variables are set by the worker (ports, addresses, the job's identity)".into(),
        );
    }
    Ok(())
}
