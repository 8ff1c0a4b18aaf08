//! [`Grant`]: a plugin's persisted record of what it granted one job, held as compact JSON
//! text behind one shared allocation.
//!
//! Why text and not a `serde_json::Value`: a grant is written once (by the plugin's
//! `reserve`), then copied into every structure that describes the job (the controller's
//! model, its view, the worker assignments, events) and read back rarely. As a tree, a
//! one-port grant was three `BTreeMap`s (~2 KB in 15 allocations) per copy; as text it is
//! ~60 bytes, and cloning it only bumps a reference count.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::sync::Arc;

/// A plugin's opaque, persisted record of what it granted one job (e.g. the ports it
/// reserved). The host stores it atomically with the placement, hands it to the worker's
/// launch hooks, to listeners, and back to the plugin on restore.
///
/// Immutable compact JSON text; clones share one allocation. On the wire and in stores it
/// *is* that JSON (not a string holding it): it serializes as the value it holds, and
/// deserializes from any JSON value, so records written when grants were
/// `serde_json::Value`s load unchanged. Build one with [`Grant::encode`] (from the
/// plugin's own type, without an intermediate tree) or [`Grant::from_value`]; read it with
/// [`Grant::decode`] (borrowed fields allowed), [`Grant::to_value`] or [`Grant::as_str`].
///
/// Equality is JSON equality: equal text is compared in one `memcmp`; texts that differ
/// only in key order or spacing are compared as trees, so a grant decoded from a store
/// that ordered keys differently still equals the one in memory.
#[derive(Clone)]
pub struct Grant(Arc<str>);

/// A grant that could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
// The cause is in the message and deliberately not a `source` (chains would repeat it).
#[error("{0}")]
pub struct GrantError(serde_json::Error);

thread_local! {
    // `encode` serializes into this buffer and copies the text out once, so a grant costs
    // exactly one allocation (the shared one).
    static ENCODE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Grant {
    /// Encodes a plugin's grant straight to compact JSON text (no `Value` tree). Field
    /// order is `T`'s; fails only where `serde_json` would (e.g. a map with non-string
    /// keys).
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Self, GrantError> {
        ENCODE_BUF.with(|buf| match buf.try_borrow_mut() {
            Ok(mut buf) => {
                buf.clear();
                serde_json::to_writer(&mut *buf, value).map_err(GrantError)?;
                Ok(Self::from_utf8(&buf))
            }
            // Re-entered (a `Serialize` impl that encodes a grant itself): own buffer.
            Err(_) => serde_json::to_vec(value)
                .map(|v| Self::from_utf8(&v))
                .map_err(GrantError),
        })
    }

    fn from_utf8(bytes: &[u8]) -> Self {
        // serde_json writes UTF-8 only.
        Self(Arc::from(
            std::str::from_utf8(bytes).expect("serde_json writes UTF-8"),
        ))
    }

    /// Decodes the grant into the plugin's own type. `T` may borrow from the grant (e.g.
    /// `&str` fields for names without escapes).
    pub fn decode<'a, T: Deserialize<'a>>(&'a self) -> Result<T, GrantError> {
        serde_json::from_str(&self.0).map_err(GrantError)
    }

    /// The grant of a JSON tree (for callers that build grants with `json!`).
    pub fn from_value(value: &serde_json::Value) -> Self {
        Self(Arc::from(value.to_string()))
    }

    /// The grant as a JSON tree.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.0).expect("a grant holds valid JSON")
    }

    /// Parses JSON text (any spacing) into a grant.
    pub fn from_json(text: &str) -> Result<Self, GrantError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let grant = Self::deserialize(&mut de).map_err(GrantError)?;
        de.end().map_err(GrantError)?;
        Ok(grant)
    }

    /// The compact JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<serde_json::Value> for Grant {
    fn from(value: serde_json::Value) -> Self {
        Self::from_value(&value)
    }
}

impl From<&serde_json::Value> for Grant {
    fn from(value: &serde_json::Value) -> Self {
        Self::from_value(value)
    }
}

impl PartialEq for Grant {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || self.0 == other.0
            // Rare: the same JSON spelled with other key order (e.g. a record written by
            // an older host, whose grants were `Value`s with sorted keys).
            || self.to_value() == other.to_value()
    }
}

impl Eq for Grant {}

impl PartialEq<serde_json::Value> for Grant {
    fn eq(&self, other: &serde_json::Value) -> bool {
        self.to_value() == *other
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Grant({})", &*self.0)
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Grant {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Borrowing a `RawValue` from the text writes it verbatim through serde_json's
        // serializers (and parses it through `serde_json::to_value`). The scan validates
        // text every constructor already validated; it allocates nothing.
        let raw: &serde_json::value::RawValue =
            serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
        raw.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Grant {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Transcoded value by value into compact text rather than captured as a
        // `RawValue`: the capture only works straight from serde_json, and grants also
        // arrive buffered (inside internally tagged events) or from `Value`s.
        let mut text = String::with_capacity(64);
        Text(&mut text).deserialize(deserializer)?;
        Ok(Self(Arc::from(text)))
    }
}

/// Writes the JSON value it is fed, compactly, keys in input order.
struct Text<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Text<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

fn push_json<T: Serialize + ?Sized, E: de::Error>(out: &mut String, v: &T) -> Result<(), E> {
    out.push_str(&serde_json::to_string(v).map_err(E::custom)?);
    Ok(())
}

impl<'de> Visitor<'de> for Text<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.push_str(if v { "true" } else { "false" });
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        write!(self.0, "{v}").map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write!(self.0, "{v}").map_err(E::custom)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // serde_json's own spelling (and `null` for what JSON cannot hold), as a `Value`
        // would have written it.
        push_json(self.0, &v)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        push_json(self.0, v)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.push_str("null");
        Ok(())
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let out = self.0;
        out.push('[');
        let mut first = true;
        loop {
            let mark = out.len();
            if !first {
                out.push(',');
            }
            if seq.next_element_seed(Text(&mut *out))?.is_none() {
                out.truncate(mark);
                break;
            }
            first = false;
        }
        out.push(']');
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let out = self.0;
        out.push('{');
        let mut first = true;
        loop {
            let mark = out.len();
            if !first {
                out.push(',');
            }
            if map.next_key_seed(Key(&mut *out))?.is_none() {
                out.truncate(mark);
                break;
            }
            out.push(':');
            map.next_value_seed(Text(&mut *out))?;
            first = false;
        }
        out.push('}');
        Ok(())
    }
}

/// Writes an object key: JSON keys are strings (numbers are quoted, as serde_json does).
struct Key<'a>(&'a mut String);

impl<'de> DeserializeSeed<'de> for Key<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Key<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object key")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        push_json(self.0, v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        write!(self.0, "\"{v}\"").map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write!(self.0, "\"{v}\"").map_err(E::custom)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        write!(self.0, "\"{v}\"").map_err(E::custom)
    }
}

#[cfg(test)]
mod tests;
