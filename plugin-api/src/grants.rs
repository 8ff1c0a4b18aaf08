//! [`Grants`]: a job's grants by plugin name, behind one shared allocation.
//!
//! Why not a `BTreeMap<String, Grant>`: a map allocates a B-tree leaf of eleven slots
//! however few plugins granted anything (464 bytes for one grant), and a job's record is
//! copied into the model, a transaction, an event, the worker's assignment: each copy paid
//! the leaf again (a heap profile of the controller: the largest part of a job's record).
//! Grants are written once, when a job is placed, and then only read, so they are kept as
//! one immutable sorted slice: one allocation of 64 bytes for one grant, shared by every
//! clone.

use crate::grant::Grant;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;

/// The grants of one job, keyed by plugin name: what `BTreeMap<String, Grant>` was, in
/// one immutable allocation that clones share (no allocation when empty).
///
/// Same contract as the map it replaces: keys are unique and iterate in ascending order;
/// on the wire and in stores it is the same JSON object (keys sorted), and deserializing
/// an object whose key repeats keeps the last value, as the map did. Changing it
/// ([`insert`](Self::insert), [`remove`](Self::remove)) copies the slice: meant for the
/// rare writer (a placement, a test), not for a loop.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Grants(Option<Arc<[Entry]>>);

/// A plugin's name and its grant.
type Entry = (Box<str>, Grant);

impl Grants {
    /// No grants.
    pub const fn new() -> Self {
        Self(None)
    }

    fn slice(&self) -> &[Entry] {
        self.0.as_deref().unwrap_or_default()
    }

    fn index_of(&self, plugin: &str) -> Result<usize, usize> {
        self.slice().binary_search_by(|(k, _)| (**k).cmp(plugin))
    }

    /// The grant of `plugin`.
    pub fn get(&self, plugin: &str) -> Option<&Grant> {
        self.index_of(plugin).ok().map(|i| &self.slice()[i].1)
    }

    /// Whether `plugin` granted something.
    pub fn contains_key(&self, plugin: &str) -> bool {
        self.index_of(plugin).is_ok()
    }

    /// How many plugins granted something.
    pub fn len(&self) -> usize {
        self.slice().len()
    }

    /// Whether no plugin granted anything.
    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// `(plugin, grant)` in ascending plugin order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Grant)> + '_ {
        self.slice().iter().map(|(k, g)| (&**k, g))
    }

    /// The plugin names, ascending.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.slice().iter().map(|(k, _)| &**k)
    }

    /// The grants, in plugin order.
    pub fn values(&self) -> impl ExactSizeIterator<Item = &Grant> + '_ {
        self.slice().iter().map(|(_, g)| g)
    }

    /// Sets `plugin`'s grant; returns the one it replaces.
    pub fn insert(&mut self, plugin: impl Into<Box<str>>, grant: Grant) -> Option<Grant> {
        let plugin = plugin.into();
        let mut v = self.slice().to_vec();
        let old = match self.index_of(&plugin) {
            Ok(i) => Some(std::mem::replace(&mut v[i].1, grant)),
            Err(i) => {
                v.insert(i, (plugin, grant));
                None
            }
        };
        *self = Self::of_sorted(v);
        old
    }

    /// Removes `plugin`'s grant and returns it.
    pub fn remove(&mut self, plugin: &str) -> Option<Grant> {
        let i = self.index_of(plugin).ok()?;
        let mut v = self.slice().to_vec();
        let (_, old) = v.remove(i);
        *self = Self::of_sorted(v);
        Some(old)
    }

    /// `v` sorted by key, keys unique.
    fn of_sorted(v: Vec<Entry>) -> Self {
        if v.is_empty() {
            Self(None)
        } else {
            Self(Some(v.into()))
        }
    }
}

impl<K: Into<Box<str>>> FromIterator<(K, Grant)> for Grants {
    /// A repeated plugin keeps its last grant, as inserting into a map would.
    fn from_iter<I: IntoIterator<Item = (K, Grant)>>(iter: I) -> Self {
        let mut v: Vec<Entry> = iter.into_iter().map(|(k, g)| (k.into(), g)).collect();
        // Stable: of equal keys, the last inserted is the last of its run.
        v.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<Entry> = Vec::with_capacity(v.len());
        for (k, g) in v {
            match out.last_mut() {
                Some(last) if last.0 == k => last.1 = g,
                _ => out.push((k, g)),
            }
        }
        Self::of_sorted(out)
    }
}

impl<K: Into<Box<str>>, const N: usize> From<[(K, Grant); N]> for Grants {
    fn from(pairs: [(K, Grant); N]) -> Self {
        pairs.into_iter().collect()
    }
}

impl From<std::collections::BTreeMap<String, Grant>> for Grants {
    fn from(map: std::collections::BTreeMap<String, Grant>) -> Self {
        map.into_iter().collect()
    }
}

impl<'a> IntoIterator for &'a Grants {
    type Item = (&'a str, &'a Grant);
    type IntoIter =
        std::iter::Map<std::slice::Iter<'a, Entry>, fn(&'a Entry) -> (&'a str, &'a Grant)>;
    fn into_iter(self) -> Self::IntoIter {
        self.slice().iter().map(|(k, g)| (&**k, g))
    }
}

impl std::ops::Index<&str> for Grants {
    type Output = Grant;
    /// Panics when `plugin` granted nothing, as a map's index does.
    fn index(&self, plugin: &str) -> &Grant {
        self.get(plugin)
            .unwrap_or_else(|| panic!("no grant of plugin {plugin:?}"))
    }
}

impl fmt::Debug for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Grants {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Grants {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Map;
        impl<'de> Visitor<'de> for Map {
            type Value = Grants;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of grants by plugin name")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Grants, A::Error> {
                let mut pairs: Vec<(String, Grant)> = Vec::new();
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(pairs.into_iter().collect())
            }
        }
        deserializer.deserialize_map(Map)
    }
}

#[cfg(test)]
mod tests;
