//! What one exchange with one etcd member came to, shared by the two clients of etcd (the
//! JSON gateway's in [`gateway`](super::gateway) and the gRPC one in
//! [`grpc`](super::grpc)), so that both classify failures alike and neither imports the
//! other's internals.

/// The error a member without a leader answers to `hasleader` requests.
pub(super) const NO_LEADER: &str = "etcdserver: no leader";
/// The largest unary answer accepted (a range page of big values stays far below).
pub(super) const MAX_ANSWER: usize = 256 << 20;

/// Why one exchange with one endpoint failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// Nothing reached etcd (no connection, or a member without a leader): safe to try
    /// elsewhere.
    Unreachable(String),
    /// The request may have been applied, no (good) answer came back.
    Unknown(String),
    /// etcd answered that it did not do it.
    Refused(String),
}

/// An error with its causes (reqwest's own text names only the URL).
pub(super) fn describe(e: &dyn std::error::Error) -> String {
    let mut out = Vec::new();
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = cur {
        let s = err.to_string();
        if !out.iter().any(|o: &String| o.contains(&s)) {
            out.push(s);
        }
        cur = err.source();
    }
    // The innermost cause says what happened; reqwest's outer text adds the URL only.
    out.into_iter()
        .filter(|s| {
            !["error sending request", "client error", "tcp connect error"]
                .iter()
                .any(|wrapper| s.starts_with(wrapper))
        })
        .collect::<Vec<_>>()
        .join(": ")
}
