//! The etcd store's wire forms of a batch: an [`EtcdOp`] per key, the transaction ops
//! of a list of them, and the journal record (one value holding a whole batch).

use super::gateway::{self, b64};
use super::pb::RequestOp;
use crate::contract::StoreError;
use serde_json::{json, Value};

/// A put (`Some` bytes) or delete (`None`) of an etcd key.
pub(super) type EtcdOp = (String, Option<Vec<u8>>);

/// Key and value bytes of the ops (what bounds the size of their request).
pub(super) fn op_bytes(ops: &[EtcdOp]) -> usize {
    ops.iter()
        .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
        .sum()
}

/// The transaction ops of puts and deletes.
pub(super) fn txn_ops(ops: &[EtcdOp]) -> Vec<RequestOp> {
    ops.iter()
        .map(|(k, v)| match v {
            Some(v) => RequestOp::put(k.as_bytes(), v.as_slice()),
            None => RequestOp::delete(k.as_bytes()),
        })
        .collect()
}

/// The journal's value: `[[key, base64 value or null], …]`.
pub(super) fn journal_of(ops: &[EtcdOp]) -> Vec<u8> {
    let list: Vec<Value> = ops
        .iter()
        .map(|(k, v)| json!([k, v.as_deref().map(b64)]))
        .collect();
    Value::Array(list).to_string().into_bytes()
}

pub(super) fn parse_journal(bytes: &[u8]) -> Result<Vec<EtcdOp>, StoreError> {
    let bad = || StoreError::Backend("the etcd store's journal is unreadable".into());
    let list: Vec<(String, Value)> = serde_json::from_slice(bytes).map_err(|_| bad())?;
    list.into_iter()
        .map(|(k, v)| {
            Ok((
                k,
                match v {
                    Value::Null => None,
                    v => Some(gateway::unb64(&v).map_err(StoreError::Backend)?),
                },
            ))
        })
        .collect()
}
