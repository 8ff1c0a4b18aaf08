//! Which build answers, and which protocol it speaks: the `X-Xce-Version` header every
//! HTTP answer carries, the `X-Xce-Protocol` header every daemon puts on its requests to
//! another (and on its answers), and the skew rule that decides which protocol versions
//! work together (UPGRADING.md).
//!
//! The protocol version is one number for everything the daemons say to each other: the
//! worker routes (`/internal/v1`), the requests an apiserver forwards, the stored records
//! and events a reader follows. A release that changes any of them in a way an older peer
//! would not understand raises it by one; a release never raises it by more.
//!
//! Here because both ends need it and nothing heavier: the daemons (which check peers),
//! and `xcecli` (which tells an old server from a missing route).

use std::fmt;
use std::sync::OnceLock;

/// The header with the answering build's version and commit (`0.1.0+1a2b3c4d5e6f`).
pub const VERSION_HEADER: &str = "x-xce-version";
/// The header with the sender's protocol version (a decimal number).
pub const PROTOCOL_HEADER: &str = "x-xce-protocol";
/// The header an apiserver adds with its own protocol version to every request it
/// forwards to the leader (the client's own `X-Xce-Protocol`, a worker's, passes as it is).
pub const FORWARDED_PROTOCOL_HEADER: &str = "x-xce-apiserver-protocol";
/// The header a controller marks a skew refusal with, naming the refused peer
/// (`worker`, `apiserver`): an apiserver tells its own refusal from a worker's it relays
/// without reading the body.
pub const SKEW_HEADER: &str = "x-xce-skew-refused";
/// The error code of a refusal for a protocol outside the supported skew.
pub const SKEW_CODE: &str = "version_skew";

/// The protocol version this build speaks.
pub const PROTOCOL: u32 = 2;
/// The protocol version of a peer that sends no `X-Xce-Protocol`: the releases before
/// protocol versions were exchanged (they spoke what is now protocol 1).
pub const UNVERSIONED: u32 = 1;

/// The protocol version this process speaks: [`PROTOCOL`], except in a debug build run
/// with `XCE_TEST_PROTOCOL=N`, which pretends to speak `N`. The end-to-end tests use it
/// to show a peer outside the skew being refused without building an old release; a
/// release build ignores the variable (an operator cannot disable the check with it).
pub fn protocol() -> u32 {
    static OWN: OnceLock<u32> = OnceLock::new();
    *OWN.get_or_init(|| {
        if cfg!(debug_assertions) {
            if let Some(n) = std::env::var("XCE_TEST_PROTOCOL")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                return n;
            }
        }
        PROTOCOL
    })
}

/// A peer's protocol version from its `X-Xce-Protocol` header: [`UNVERSIONED`] without
/// one; `None` for a value that is not a number.
pub fn parse_protocol(header: Option<&str>) -> Option<u32> {
    match header {
        None => Some(UNVERSIONED),
        Some(v) => v.trim().parse().ok(),
    }
}

/// What a peer is to the one checking it: the rule differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// A worker talking to its controller: it may be one protocol version older than the
    /// controller, never newer (upgraded last, like a kubelet).
    Worker,
    /// An apiserver forwarding to the leader, or a controller next to another: adjacent
    /// versions (one older or one newer) work together.
    Apiserver,
}

impl Peer {
    /// `worker` or `apiserver` (the value of [`SKEW_HEADER`]).
    pub fn name(self) -> &'static str {
        match self {
            Peer::Worker => "worker",
            Peer::Apiserver => "apiserver",
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A peer outside the supported skew: names both versions and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkewError {
    /// What the peer is.
    pub peer: Peer,
    /// The peer's protocol version.
    pub theirs: u32,
    /// The checking side's (a controller's) protocol version.
    pub ours: u32,
}

impl fmt::Display for SkewError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Self { peer, theirs, ours } = *self;
        let allowed = match peer {
            Peer::Worker => format!("{} or {ours}", ours.saturating_sub(1)),
            Peer::Apiserver => format!("{} to {}", ours.saturating_sub(1), ours + 1),
        };
        let fix = if theirs > ours {
            "upgrade the controllers first (UPGRADING.md gives the order)"
        } else {
            "upgrade it (UPGRADING.md gives the order)"
        };
        write!(
            f,
            "this {peer} speaks protocol {theirs}, the controller speaks protocol {ours} \
             ({peer}s of protocol {allowed} work with it): {fix}"
        )
    }
}

impl std::error::Error for SkewError {}

/// Whether a `peer` speaking `theirs` works with a controller speaking `ours` (the skew
/// policy of UPGRADING.md).
pub fn check_skew(peer: Peer, ours: u32, theirs: u32) -> Result<(), SkewError> {
    let ok = match peer {
        Peer::Worker => theirs <= ours && theirs + 1 >= ours,
        Peer::Apiserver => theirs.abs_diff(ours) <= 1,
    };
    if ok {
        Ok(())
    } else {
        Err(SkewError { peer, theirs, ours })
    }
}

/// What this build is: its version and the git commit it was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Build {
    /// The release version (`Cargo.toml`'s).
    pub version: &'static str,
    /// The commit (12 hex digits), or `unknown` when built outside a git checkout.
    pub commit: &'static str,
}

impl Build {
    /// The `X-Xce-Version` value: `VERSION+COMMIT` (semver build metadata).
    pub fn header(&self) -> String {
        format!("{}+{}", self.version, self.commit)
    }
}

impl fmt::Display for Build {
    /// `0.1.0 (commit 1a2b3c4d5e6f, protocol 2)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (commit {}, protocol {})",
            self.version,
            self.commit,
            protocol()
        )
    }
}

static BUILD: OnceLock<Build> = OnceLock::new();

/// Records what this binary is; called once by the binary's `main` (its build script
/// knows the commit). Later calls are ignored.
pub fn set_build(build: Build) {
    let _ = BUILD.set(build);
}

/// What this binary is, as [`set_build`] recorded it; a library used without it (a
/// crate's own tests) says this crate's version and commit `unknown`.
pub fn build() -> Build {
    *BUILD.get_or_init(|| Build {
        version: env!("CARGO_PKG_VERSION"),
        commit: "unknown",
    })
}

/// Records `build` as this binary's (see [`set_build`]) and returns its `--version`
/// line (`0.1.0 (commit 1a2b3c4d5e6f, protocol 2)`).
pub fn init(build: Build) -> &'static str {
    set_build(build);
    static LINE: OnceLock<String> = OnceLock::new();
    LINE.get_or_init(|| self::build().to_string())
}

/// The version and commit an `X-Xce-Version` value names (`None` for a value without `+`).
pub fn parse_version_header(value: &str) -> Option<(&str, &str)> {
    value.split_once('+')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The skew policy, as a table: for a controller at protocol 5, which peers work.
    #[test]
    fn the_skew_policy() {
        let mut out = String::new();
        for peer in [Peer::Worker, Peer::Apiserver] {
            let ok: Vec<String> = (2..=8)
                .map(|theirs| match check_skew(peer, 5, theirs) {
                    Ok(()) => format!("{theirs}:ok"),
                    Err(_) => format!("{theirs}:no"),
                })
                .collect();
            out.push_str(&format!("{peer}: {}\n", ok.join(" ")));
        }
        expect_test::expect![[r#"
            worker: 2:no 3:no 4:ok 5:ok 6:no 7:no 8:no
            apiserver: 2:no 3:no 4:ok 5:ok 6:ok 7:no 8:no
        "#]]
        .assert_eq(&out);
    }

    #[test]
    fn a_refusal_names_both_versions_and_what_to_do() {
        let old = check_skew(Peer::Worker, 3, 1).unwrap_err();
        assert_eq!(
            old.to_string(),
            "this worker speaks protocol 1, the controller speaks protocol 3 (workers of \
             protocol 2 or 3 work with it): upgrade it (UPGRADING.md gives the order)"
        );
        let new = check_skew(Peer::Apiserver, 2, 4).unwrap_err();
        assert_eq!(
            new.to_string(),
            "this apiserver speaks protocol 4, the controller speaks protocol 2 (apiservers \
             of protocol 1 to 3 work with it): upgrade the controllers first (UPGRADING.md \
             gives the order)"
        );
        // A worker newer than its controller is refused too: workers go last.
        assert!(check_skew(Peer::Worker, 2, 3).is_err());
    }

    #[test]
    fn a_peer_without_the_header_is_the_release_before_protocol_versions() {
        assert_eq!(parse_protocol(None), Some(UNVERSIONED));
        assert_eq!(parse_protocol(Some(" 7 ")), Some(7));
        assert_eq!(parse_protocol(Some("seven")), None);
        // The release before this one works with this one in both roles.
        assert!(check_skew(Peer::Worker, PROTOCOL, UNVERSIONED).is_ok());
        assert!(check_skew(Peer::Apiserver, PROTOCOL, UNVERSIONED).is_ok());
        assert_eq!(
            parse_version_header("0.1.0+1a2b3c4d5e6f"),
            Some(("0.1.0", "1a2b3c4d5e6f"))
        );
    }
}
