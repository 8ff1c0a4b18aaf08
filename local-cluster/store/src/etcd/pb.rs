//! The messages of etcd's v3 API that the store sends and reads, as Protocol Buffers
//! (package `etcdserverpb`, services `KV` and `Watch`; `mvccpb.KeyValue` and `Event`). Written by hand with
//! `prost`'s derive, field numbers from etcd's `rpc.proto` and `kv.proto`: no `.proto`
//! compiler at build time. Only the fields the store uses are declared; a decoder skips
//! the others.

/// `etcdserverpb.ResponseHeader`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    #[prost(int64, tag = "3")]
    pub revision: i64,
    #[prost(uint64, tag = "4")]
    pub raft_term: u64,
}

/// `mvccpb.KeyValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(int64, tag = "2")]
    pub create_revision: i64,
    #[prost(int64, tag = "3")]
    pub mod_revision: i64,
    #[prost(int64, tag = "4")]
    pub version: i64,
    #[prost(bytes = "vec", tag = "5")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "6")]
    pub lease: i64,
}

/// `etcdserverpb.RangeRequest` (sort order: 0 none, 1 ascend, 2 descend; sort target:
/// 0 key, 1 version, 2 create, 3 mod, 4 value).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(int64, tag = "4")]
    pub revision: i64,
    #[prost(int32, tag = "5")]
    pub sort_order: i32,
    #[prost(int32, tag = "6")]
    pub sort_target: i32,
    #[prost(bool, tag = "7")]
    pub serializable: bool,
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
    #[prost(bool, tag = "9")]
    pub count_only: bool,
    /// Only keys modified at this revision or later (0: any).
    #[prost(int64, tag = "10")]
    pub min_mod_revision: i64,
}

/// `etcdserverpb.RangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    #[prost(bool, tag = "3")]
    pub more: bool,
    #[prost(int64, tag = "4")]
    pub count: i64,
}

/// `etcdserverpb.PutRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

/// `etcdserverpb.PutResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.DeleteRangeRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
}

/// `etcdserverpb.DeleteRangeResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteRangeResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// `etcdserverpb.RequestOp`: one operation of a transaction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RequestOp {
    #[prost(oneof = "Request", tags = "1, 2, 3")]
    pub request: Option<Request>,
}

/// `RequestOp.request` (a nested transaction, tag 4, is not used).
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Request {
    #[prost(message, tag = "1")]
    Range(RangeRequest),
    #[prost(message, tag = "2")]
    Put(PutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeRequest),
}

/// `etcdserverpb.ResponseOp`: the answer of one [`RequestOp`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseOp {
    #[prost(oneof = "Response", tags = "1, 2, 3")]
    pub response: Option<Response>,
}

/// `ResponseOp.response`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Response {
    #[prost(message, tag = "1")]
    Range(RangeResponse),
    #[prost(message, tag = "2")]
    Put(PutResponse),
    #[prost(message, tag = "3")]
    DeleteRange(DeleteRangeResponse),
}

/// `Compare.CompareResult`.
pub mod compare_result {
    pub const EQUAL: i32 = 0;
}

/// `Compare.CompareTarget`.
pub mod compare_target {
    pub const CREATE: i32 = 1;
    pub const MOD: i32 = 2;
}

/// `etcdserverpb.Compare`: one condition of a transaction.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    #[prost(int32, tag = "1")]
    pub result: i32,
    #[prost(int32, tag = "2")]
    pub target: i32,
    #[prost(bytes = "vec", tag = "3")]
    pub key: Vec<u8>,
    #[prost(oneof = "TargetUnion", tags = "4, 5, 6, 7")]
    pub target_union: Option<TargetUnion>,
}

/// `Compare.target_union`: the value compared to.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum TargetUnion {
    #[prost(int64, tag = "4")]
    Version(i64),
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes = "vec", tag = "7")]
    Value(Vec<u8>),
}

/// `etcdserverpb.TxnRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnRequest {
    #[prost(message, repeated, tag = "1")]
    pub compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    pub success: Vec<RequestOp>,
    #[prost(message, repeated, tag = "3")]
    pub failure: Vec<RequestOp>,
}

/// `etcdserverpb.TxnResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    pub responses: Vec<ResponseOp>,
}

/// `etcdserverpb.StatusRequest` (`Maintenance/Status`: a member's own view, answered
/// locally).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {}

/// `etcdserverpb.StatusResponse` (only its header: the member's revision).
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
}

/// `etcdserverpb.WatchRequest`: what a client sends on a watch stream (cancelling, tag 2,
/// and progress requests, tag 3, are not used: a watch ends with its stream).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(message, optional, tag = "1")]
    pub create_request: Option<WatchCreateRequest>,
}

/// `etcdserverpb.WatchCreateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchCreateRequest {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    #[prost(int64, tag = "3")]
    pub start_revision: i64,
    #[prost(bool, tag = "4")]
    pub progress_notify: bool,
    #[prost(bool, tag = "6")]
    pub prev_kv: bool,
    /// Lets etcd split an answer above its request size limit into several messages,
    /// every one but the last marked `fragment`.
    #[prost(bool, tag = "8")]
    pub fragment: bool,
}

/// `etcdserverpb.WatchResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    #[prost(int64, tag = "2")]
    pub watch_id: i64,
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    /// Set when the revision asked for was compacted: the oldest one etcd still has.
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    /// More of the same answer follows (see [`WatchCreateRequest::fragment`]).
    #[prost(bool, tag = "7")]
    pub fragment: bool,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// `mvccpb.Event.EventType`.
pub mod event_type {
    pub const PUT: i32 = 0;
    pub const DELETE: i32 = 1;
}

/// `mvccpb.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// See [`event_type`].
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
}

// === building ===

impl RequestOp {
    /// Puts `value` at `key`.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            request: Some(Request::Put(PutRequest {
                key: key.into(),
                value: value.into(),
                lease: 0,
            })),
        }
    }

    /// Deletes `key`.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Self {
            request: Some(Request::DeleteRange(DeleteRangeRequest {
                key: key.into(),
                range_end: Vec::new(),
            })),
        }
    }

    /// Reads `key`.
    pub fn get(key: impl Into<Vec<u8>>) -> Self {
        Self {
            request: Some(Request::Range(RangeRequest {
                key: key.into(),
                ..Default::default()
            })),
        }
    }
}

impl WatchCreateRequest {
    /// A watch of `key` (`range_end` empty), or of the keys from `key` up to `range_end`,
    /// from etcd revision `start` on.
    pub fn new(key: impl Into<Vec<u8>>, range_end: Vec<u8>, start: i64) -> Self {
        Self {
            key: key.into(),
            range_end,
            start_revision: start,
            ..Default::default()
        }
    }
}

impl TxnResponse {
    /// The revision the transaction was applied at (0 when etcd sent no header).
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }

    /// The first key-value the `i`th answer (a range) read, if any.
    pub fn range_kv(&self, i: usize) -> Option<&KeyValue> {
        match self.responses.get(i)?.response.as_ref()? {
            Response::Range(r) => r.kvs.first(),
            _ => None,
        }
    }
}

impl RangeResponse {
    /// The revision the range read at (0 when etcd sent no header).
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }
}
