//! Controller tests: the state machine on a fake clock (`Sim`), the router through
//! `oneshot` (no sockets, `App`), one real-socket run with a fake worker, restarts on
//! redb and etcd, and big services within the store's batch limit. The shared doubles
//! and drivers are in `fakes.rs`, `sim.rs` and `app.rs`; each other file is one topic.

use super::core::{Core, Timing, Wiring};
use super::metrics::Metrics;
use super::scheduler::tests::Slots;
use super::*;
use axum::body::Body;
use expect_test::{expect, Expect};
use http::{Method, Request, StatusCode};
use plugin_api::{
    ClusterEvent, ClusterSnapshot, FieldError, Grant, HostFacts, HostId, HostState, JobId,
    LaunchRefusal, PlacementRequest, SectionInfo, Unfit,
};
use plugin_api::{JobState, Permission, Principal, PrincipalKind, ServiceKey};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;
use tower::ServiceExt;
use xce_proto::worker::{Assignments, Caller, ExitCause, RegisterRequest, RunningJob, WorkerEvent};
use xce_serve::auth::Tokens;
use xce_store::MemStore;
use xce_store::{Batch, Key, StoreError};

mod app;
mod fakes;
mod sim;

use app::*;
use fakes::*;
use sim::*;

mod config;
mod etcd;
mod fail_stop;
mod hosts;
mod identity;
mod lifecycle;
mod maintenance;
mod numbers;
mod profile_limit;
mod reports;
mod restarts;
mod rollouts;
mod routes;
mod scale;
mod sessions;
mod settles;
mod unreachable;
mod versions;
mod workers;
