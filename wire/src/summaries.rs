//! The plugins' summaries beside an answer's own fields: each resource plugin may show a
//! summary of a job's grant (`ResourcePlugin::grant_summary`, e.g. `"ports": {"http":
//! 20417}` on each job of a service detail) and of a host (`host_summary`, e.g. the port
//! pool's usage on each host of `GET /v1/hosts`) under its own name, as a key of the job's
//! or the host's object.
//!
//! A plugin whose name were one of the object's own fields would lose its summary (or hide
//! the field), so the host refuses such a plugin at start ([`check_plugin_name`]); the
//! writers here still keep the object's own field if a clash slips through.

use serde::ser::{SerializeMap, Serializer};
use serde::Serialize;
use serde_json::Value;
use std::borrow::Cow;
use std::collections::btree_map;
use std::collections::BTreeMap;
use std::iter::Peekable;

/// Plugin summaries by plugin name. The server borrows them from its state where it keeps
/// them as a map, a client owns what it read (every key beside the object's own fields).
pub type Summaries<'a> = Cow<'a, BTreeMap<String, Value>>;

/// The own fields of a job of the service detail (`jobs[]` of `GET /v1/services/{name}`),
/// in the order they are written.
pub const JOB_FIELDS: &[&str] = &[
    "generation",
    "host",
    "job",
    "log",
    "ready",
    "replica",
    "state",
];

/// The own fields of a host of `GET /v1/hosts`, in the order they are written.
pub const HOST_FIELDS: &[&str] = &["addresses", "id", "ip_addr", "jobs", "maintenance", "state"];

/// A plugin name that would clash with a field of an answer that shows plugin summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameClash {
    /// The plugin's name.
    pub plugin: String,
    /// The answer and field it clashes with, as the API documents it (`jobs[].state of
    /// GET /v1/services/{name}`).
    pub field: String,
}

impl std::fmt::Display for NameClash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "plugin {:?} cannot be loaded: its name is the field {}, and the API shows each \
             plugin's summary under the plugin's name beside that field; rename the plugin",
            self.plugin, self.field
        )
    }
}

impl std::error::Error for NameClash {}

/// Whether a plugin may be named `name`: not when a job or a host answer has a field of
/// that name (its summaries are shown as keys beside those fields). The host calls this for
/// every resource plugin at start.
pub fn check_plugin_name(name: &str) -> Result<(), NameClash> {
    let clash = |field: String| NameClash {
        plugin: name.to_owned(),
        field,
    };
    if JOB_FIELDS.contains(&name) {
        return Err(clash(format!("jobs[].{name} of GET /v1/services/{{name}}")));
    }
    if HOST_FIELDS.contains(&name) {
        return Err(clash(format!("hosts[].{name} of GET /v1/hosts")));
    }
    Ok(())
}

/// Writes an object's own fields and its plugin summaries as one JSON object, keys in
/// order (the own fields are given in `own`'s order, which is sorted; summaries go between
/// them by name). A summary named like an own field is left out.
pub(crate) struct Merged<'s, M> {
    map: M,
    own: &'static [&'static str],
    next: usize,
    summaries: Peekable<btree_map::Iter<'s, String, Value>>,
}

impl<'s, M: SerializeMap> Merged<'s, M> {
    /// Starts the object.
    pub(crate) fn new<S: Serializer<SerializeMap = M, Error = M::Error>>(
        ser: S,
        own: &'static [&'static str],
        summaries: &'s BTreeMap<String, Value>,
    ) -> Result<Self, M::Error> {
        let extra = summaries
            .keys()
            .filter(|k| !own.contains(&k.as_str()))
            .count();
        let map = ser.serialize_map(Some(own.len() + extra))?;
        Ok(Self {
            map,
            own,
            next: 0,
            summaries: summaries.iter().peekable(),
        })
    }

    /// The next own field (in `own`'s order), after the summaries named before it.
    pub(crate) fn field<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), M::Error> {
        debug_assert_eq!(self.own.get(self.next), Some(&name), "fields out of order");
        self.next += 1;
        while let Some((k, v)) = self.summaries.next_if(|(k, _)| k.as_str() < name) {
            self.map.serialize_entry(k, v)?;
        }
        // A clash (refused at start): the object's own field wins.
        let _ = self.summaries.next_if(|(k, _)| k.as_str() == name);
        self.map.serialize_entry(name, value)
    }

    /// The summaries named after every own field, and the end of the object.
    pub(crate) fn end(mut self) -> Result<M::Ok, M::Error> {
        for (k, v) in self.summaries {
            self.map.serialize_entry(k, v)?;
        }
        self.map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_named_like_a_field_is_refused_with_the_field() {
        assert_eq!(check_plugin_name("ports"), Ok(()));
        assert_eq!(check_plugin_name("slots"), Ok(()));
        expect_test::expect![[r#"plugin "state" cannot be loaded: its name is the field jobs[].state of GET /v1/services/{name}, and the API shows each plugin's summary under the plugin's name beside that field; rename the plugin"#]]
            .assert_eq(&check_plugin_name("state").unwrap_err().to_string());
        expect_test::expect![[r#"plugin "ip_addr" cannot be loaded: its name is the field hosts[].ip_addr of GET /v1/hosts, and the API shows each plugin's summary under the plugin's name beside that field; rename the plugin"#]]
            .assert_eq(&check_plugin_name("ip_addr").unwrap_err().to_string());
        for f in JOB_FIELDS.iter().chain(HOST_FIELDS) {
            assert!(check_plugin_name(f).is_err(), "{f}");
        }
    }

    #[test]
    fn the_field_lists_are_sorted() {
        assert!(JOB_FIELDS.windows(2).all(|w| w[0] < w[1]));
        assert!(HOST_FIELDS.windows(2).all(|w| w[0] < w[1]));
    }
}
