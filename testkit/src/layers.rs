//! Which crate may depend on which: the architecture's layering rules, checked against
//! every member's `Cargo.toml`, so that a rule holds because the compiler keeps it, and
//! keeps holding because a test fails when someone adds a forbidden line.
//!
//! Only `[dependencies]` count (what a crate's library or binary links); tests and
//! benches may use anything through `[dev-dependencies]`.

use std::collections::BTreeSet;
use std::path::Path;

/// The member directories of the workspace whose root is `root` (its `members` list).
pub fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
    manifest
        .split("members")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or("")
        .split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The package name a manifest declares (`[package] name = "…"`).
pub fn package_name(manifest: &str) -> Option<String> {
    let package = manifest.split("[package]").nth(1)?;
    let line = package
        .lines()
        .find(|l| l.trim_start().starts_with("name"))?;
    Some(line.split('"').nth(1)?.to_owned())
}

/// The names of the crates a manifest lists under `[dependencies]` (and its target-specific
/// `[target.….dependencies]`), whether as `name = …`, `name.workspace = true` or a
/// `[dependencies.name]` table.
pub fn normal_deps(manifest: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            let header = line.trim_matches(|c| c == '[' || c == ']');
            in_deps = header == "dependencies" || header.ends_with(".dependencies");
            if let Some(name) = header.strip_prefix("dependencies.") {
                out.insert(name.to_owned());
                in_deps = false;
            }
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = line.split(['=', '.']).next().unwrap_or("").trim();
        if !key.is_empty() {
            out.insert(key.trim_matches('"').to_owned());
        }
    }
    out
}

/// One rule: `krate` must not list any of `forbidden` under `[dependencies]`, because
/// `why`.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The crate (package name) the rule is about.
    pub krate: &'static str,
    /// The crates it must not depend on.
    pub forbidden: &'static [&'static str],
    /// The reason, printed when the rule breaks.
    pub why: &'static str,
}

/// The host's crates: what the plugins must never see.
const HOST: &[&str] = &[
    "xce-proto",
    "xce-stdx",
    "xce-store",
    "xce-serve",
    "xce-model",
    "xce-controller",
    "xce-worker",
    "xce-apiserver",
];
/// The plugin crates and the CLI library: what the host must never see.
const PLUGINS: &[&str] = &[
    "port-resource",
    "host-address",
    "endpoint-table",
    "xce-dns",
    "xcecli-ext",
];
/// The workspace's layering rules (ARCHITECTURE.md, "Crate map").
pub const RULES: &[Rule] = &[
    Rule {
        krate: "xce-worker",
        forbidden: &[
            "xce-controller",
            "xce-model",
            "xce-store",
            "xce-serve",
            "xce-apiserver",
        ],
        why: "the worker knows the controller only through the protocol of xce-proto",
    },
    Rule {
        krate: "xce-apiserver",
        forbidden: &["xce-controller", "xce-worker"],
        why: "the apiserver follows the stored model (xce-model), never the controller's state",
    },
    Rule {
        krate: "xce-controller",
        forbidden: &["xce-apiserver", "xce-worker"],
        why: "the controller serves its own routes and talks to workers over the protocol",
    },
    Rule {
        krate: "xce-model",
        forbidden: &["xce-controller", "xce-serve", "xce-apiserver", "xce-worker"],
        why: "the stored records are below everything that reads or writes them",
    },
    Rule {
        krate: "xce-store",
        forbidden: HOST,
        why: "the store knows keys and bytes, not what they mean",
    },
    Rule {
        krate: "xce-serve",
        forbidden: &[
            "xce-store",
            "xce-model",
            "xce-controller",
            "xce-apiserver",
            "xce-worker",
        ],
        why: "serving HTTP knows nothing of the cluster",
    },
    Rule {
        krate: "xce-proto",
        forbidden: HOST,
        why: "the shared vocabulary depends on nothing of the host",
    },
    Rule {
        krate: "xce-stdx",
        forbidden: HOST,
        why: "the helpers depend on nothing of the host",
    },
    Rule {
        krate: "plugin-api",
        forbidden: &["hyper-util", "hyper", "h2", "tower"],
        why: "the trait crate every plugin links holds no server code (axum only behind `server`)",
    },
    Rule {
        krate: "xcecli-ext",
        forbidden: &[
            "axum",
            "hyper-util",
            "tower",
            "h2",
            "endpoint-table",
            "xce-serve",
        ],
        why: "the CLI reads the wire types (xce-wire) and links no server code",
    },
    Rule {
        krate: "xce-wire",
        forbidden: &["axum", "hyper", "hyper-util", "tower", "h2", "reqwest"],
        why: "the answers' shapes are below the server that writes them and the client that \
              reads them: no server or client code",
    },
    Rule {
        krate: "xce-wire",
        forbidden: HOST,
        why: "the answers' shapes depend on no host crate",
    },
    Rule {
        krate: "xce-wire",
        forbidden: PLUGINS,
        why: "the answers' shapes depend on no plugin (plugin summaries are opaque JSON)",
    },
    Rule {
        krate: "xce-dns",
        forbidden: HOST,
        why: "DNS is an extension of the apiserver: it reads the endpoint table and \
              plugin-api's principals, never the host's state",
    },
    Rule {
        krate: "sim-host",
        forbidden: HOST,
        why: "the simulated host loads the plugins through plugin-api alone",
    },
];

/// Host crates must not name a plugin crate.
pub fn host_rules() -> impl Iterator<Item = Rule> {
    HOST.iter().map(|krate| Rule {
        krate,
        forbidden: PLUGINS,
        why: "the host takes plugins through plugin-api's traits; xced chooses them",
    })
}

/// Every broken rule, one line each, given `(package name, manifest text)` of each member.
pub fn broken(members: &[(String, String)], rules: &[Rule]) -> Vec<String> {
    let mut out = Vec::new();
    for rule in rules {
        let Some((_, manifest)) = members.iter().find(|(name, _)| name == rule.krate) else {
            out.push(format!("{}: no such member (a rule names it)", rule.krate));
            continue;
        };
        let deps = normal_deps(manifest);
        for bad in rule.forbidden {
            if deps.contains(*bad) {
                out.push(format!("{} depends on {bad}: {}", rule.krate, rule.why));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
