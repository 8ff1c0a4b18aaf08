use super::*;

const MANIFEST: &str = r#"
[package]
name = "demo"

[features]
server = ["dep:axum"]

[dependencies]
plugin-api = { workspace = true, features = ["server"] }
serde.workspace = true
# a comment = not a dependency
"quoted" = "1"

[target.'cfg(unix)'.dependencies]
rustix.workspace = true

[dependencies.redb]
version = "2"

[dev-dependencies]
axum.workspace = true
"#;

#[test]
fn normal_dependencies_are_read_in_every_form_and_dev_dependencies_are_not() {
    let deps: Vec<String> = normal_deps(MANIFEST).into_iter().collect();
    assert_eq!(deps, ["plugin-api", "quoted", "redb", "rustix", "serde"]);
    assert_eq!(package_name(MANIFEST).as_deref(), Some("demo"));
}

#[test]
fn a_forbidden_dependency_is_reported_with_its_reason() {
    let members = vec![("demo".to_owned(), MANIFEST.to_owned())];
    let rules = [Rule {
        krate: "demo",
        forbidden: &["redb", "axum"],
        why: "demo must not store",
    }];
    // `axum` is only a dev-dependency: allowed.
    assert_eq!(
        broken(&members, &rules),
        ["demo depends on redb: demo must not store"]
    );
    let missing = [Rule {
        krate: "gone",
        forbidden: &[],
        why: "",
    }];
    assert_eq!(
        broken(&members, &missing),
        ["gone: no such member (a rule names it)"]
    );
}

/// The layering of ARCHITECTURE.md's crate map, on the workspace's real manifests.
#[test]
fn the_workspace_keeps_its_layers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members: Vec<(String, String)> = workspace_members(&root)
        .iter()
        .map(|dir| {
            let manifest = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
            (package_name(&manifest).unwrap(), manifest)
        })
        .collect();
    assert!(members.len() >= 10, "members: {members:?}");
    let rules: Vec<Rule> = RULES.iter().copied().chain(host_rules()).collect();
    let report = broken(&members, &rules);
    assert!(
        report.is_empty(),
        "layering rules broken:\n{}",
        report.join("\n")
    );
}

/// `plugin-api`'s axum parts are behind its `server` feature: the wire crate (and through
/// it the CLI) must not turn it on.
#[test]
fn the_wire_crate_takes_plugin_api_without_its_server_feature() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("wire/Cargo.toml")).unwrap();
    assert_eq!(package_name(&manifest).as_deref(), Some("xce-wire"));
    assert!(normal_deps(&manifest).contains("plugin-api"));
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("plugin-api"))
        .unwrap();
    assert!(
        !line.contains("server"),
        "xce-wire turns on plugin-api's server feature: {line}"
    );
}
