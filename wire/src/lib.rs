//! The typed shapes of every documented REST answer (`docs/api.md`, `docs/status.md`):
//! the one owner of each wire format. The server writes its answers with these types and
//! the client (`xcecli-ext`) reads them with the same ones, so a field cannot be renamed
//! on one side only.
//!
//! - [`endpoints`]: the endpoint routes (`/v1/services/{name}/endpoints`, `/v1/endpoints`,
//!   the streams, Prometheus SD). The endpoint table converts its entries into them.
//! - [`services`]: `/v1/services` (list), `/v1/services/{name}` (the detail, also the answer
//!   of submit, update, scale and restart, with the rollout and each replica's status), and
//!   `DELETE /v1/services/{name}`.
//! - [`hosts`]: the answer of `/v1/hosts`.
//! - [`summaries`]: the plugins' summaries shown beside a job's or a host's own fields, and
//!   [`summaries::check_plugin_name`], which keeps a plugin's name from clashing with them.
//!
//! - [`version`]: the build and protocol versions (`X-Xce-Version`, `X-Xce-Protocol`) and
//!   the skew rule between daemons.
//!
//! Error bodies are `plugin_api::ErrorBody`. Reading is lenient: unknown fields are ignored
//! and most fields have a default, so a client reads the answers of older and newer
//! servers. Fields are declared in the order the server writes them (alphabetical where
//! the answer was once a sorted `serde_json::Map`: tests compare the text). String fields
//! are `Cow`s: the server borrows from its state, a client owns what it read.
//!
//! No server code: this crate links `plugin-api` without its `server` feature, and serde.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod endpoints;
pub mod hosts;
pub mod services;
pub mod summaries;
pub mod version;
