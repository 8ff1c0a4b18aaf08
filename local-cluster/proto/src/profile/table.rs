//! Tables of string values in a profile (`[service.meta]`, `[service.env]`): one shape,
//! one validation; each table says what its keys and values may be.

use plugin_api::FieldError;
use serde_json::Value;
use std::collections::BTreeMap;

/// What one string table accepts.
pub(super) struct StringTable {
    /// Its path in the profile, e.g. `service.env`.
    pub(super) field: &'static str,
    /// Said when it is not a table, e.g. "must be a table of string labels".
    pub(super) shape: &'static str,
    /// What an entry is called in the count error ("labels", "variables").
    pub(super) noun: &'static str,
    pub(super) max_entries: usize,
    /// The longest value, in bytes.
    pub(super) max_value: usize,
    /// Checks a key; the reason it is refused otherwise.
    pub(super) check_key: fn(&str) -> Result<(), String>,
    /// Checks a value within `max_value`; the reason it is refused otherwise.
    pub(super) check_value: fn(&str) -> Result<(), String>,
}

impl StringTable {
    /// Validates the table at `v`, listing every problem in `errs`; the entries (those
    /// that are valid) either way.
    pub(super) fn parse(
        &self,
        v: Option<&Value>,
        errs: &mut Vec<FieldError>,
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let map = match v {
            None => return out,
            Some(Value::Object(m)) => m,
            Some(_) => {
                errs.push(FieldError::new(self.field, self.shape));
                return out;
            }
        };
        if map.len() > self.max_entries {
            errs.push(FieldError::new(
                self.field,
                format!(
                    "at most {} {} (got {})",
                    self.max_entries,
                    self.noun,
                    map.len()
                ),
            ));
        }
        for (key, value) in map {
            let field = format!("{}.{key}", self.field);
            if let Err(reason) = (self.check_key)(key) {
                errs.push(FieldError::new(field.clone(), reason));
            }
            let Value::String(s) = value else {
                errs.push(FieldError::new(field, "value must be a string"));
                continue;
            };
            if s.len() > self.max_value {
                let reason = format!(
                    "value must be at most {} bytes (got {})",
                    self.max_value,
                    s.len()
                );
                errs.push(FieldError::new(field, reason));
            } else if let Err(reason) = (self.check_value)(s) {
                errs.push(FieldError::new(field, reason));
            } else {
                out.insert(key.clone(), s.clone());
            }
        }
        out
    }
}
