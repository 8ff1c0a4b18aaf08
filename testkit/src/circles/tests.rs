use super::*;

/// Writes `files` (path, text) under a fresh crate directory and returns its circles.
fn check(files: &[(&str, &str)]) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"t\"\n").unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    circles(&file_graph(dir.path()).unwrap())
}

#[test]
fn a_pair_naming_each_other_is_a_circle() {
    let found = check(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "src/b.rs",
            "pub struct B;\nfn f() { let _ = super::a::A(B); }\n",
        ),
    ]);
    assert_eq!(found, ["src/a.rs -> src/b.rs -> src/a.rs"]);
}

#[test]
fn a_crate_root_re_export_used_by_its_module_is_a_circle() {
    let found = check(&[
        (
            "src/lib.rs",
            "mod api;\npub use api::Api;\npub struct Shared;\n",
        ),
        ("src/api.rs", "pub struct Api(crate::Shared);\n"),
    ]);
    assert_eq!(found, ["src/api.rs -> src/lib.rs -> src/api.rs"]);
}

#[test]
fn a_longer_circle_through_nested_files_and_macros_is_named_whole() {
    let found = check(&[
        ("src/lib.rs", "pub mod store;\n"),
        ("src/store.rs", "mod etcd;\nfn f() { etcd::open(); }\n"),
        (
            "src/store/etcd.rs",
            "mod gateway;\npub fn open() { gateway::g(); }\n",
        ),
        (
            "src/store/etcd/gateway.rs",
            "pub fn g() { println!(\"{:?}\", crate::store::X); }\n",
        ),
    ]);
    assert_eq!(
        found,
        ["src/store/etcd/gateway.rs -> src/store.rs -> src/store/etcd.rs -> src/store/etcd/gateway.rs"]
    );
}

#[test]
fn layers_tests_comments_and_other_crates_are_not_circles() {
    let found = check(&[
        // lib.rs re-exports; modules import from the defining module; `mod` is not naming.
        (
            "src/lib.rs",
            "mod shared;\nmod api;\npub use api::Api;\npub use shared::Shared;\n",
        ),
        (
            "src/shared.rs",
            "/// Used by [`crate::Api`].\npub(crate) struct Shared;\npub(super) fn f() {}\n",
        ),
        (
            "src/api.rs",
            "use crate::shared::Shared;\npub struct Api(Shared, std::fs::File);\n\
             #[cfg(test)]\nmod tests { use crate::Api; }\n\
             #[cfg(test)]\nfn helper() -> crate::Api { todo!() }\n",
        ),
        ("src/main.rs", "mod cli;\nfn main() { cli::run() }\n"),
        ("src/cli.rs", "pub fn run() { let _ = t::Api; }\n"),
    ]);
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn a_missing_module_file_is_an_error_naming_both_places_looked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), "mod gone;\n").unwrap();
    let err = file_graph(dir.path()).unwrap_err();
    assert_eq!(
        err,
        "src/lib.rs: `mod gone;` found neither src/gone.rs nor src/gone/mod.rs"
    );
}

/// Issue 13: no import circle between the files of any crate of the workspace.
#[test]
fn no_crate_of_the_workspace_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let members = crate::layers::workspace_members(&root);
    assert!(
        members.len() >= 3,
        "found the workspace's members: {members:?}"
    );
    let mut report = Vec::new();
    let mut files = 0;
    for member in &members {
        let graph = file_graph(&root.join(member)).unwrap();
        files += graph.len();
        for circle in circles(&graph) {
            report.push(format!("{member}: {circle}"));
        }
    }
    println!("{} crates, {files} files checked", members.len());
    assert!(
        report.is_empty(),
        "import circles between files (extract what both sides share into a module of its \
         own; lib.rs only re-exports):\n{}",
        report.join("\n")
    );
}

/// The function-length check counts from `fn` to the closing brace and leaves test code out.
#[test]
fn a_long_function_is_found_and_test_code_is_not() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("Cargo.toml"), "[package]\nname = \"t\"\n").unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    let body = |n: usize| "    let _ = 1;\n".repeat(n);
    let lib = format!(
        "mod a;\n#[cfg(test)]\nmod tests;\n\n/// Doc.\npub fn short() {{\n{}}}\n\nstruct S;\nimpl S {{\n    fn long(&self) {{\n{}    }}\n}}\n",
        body(2),
        body(4)
    );
    std::fs::write(dir.path().join("src/lib.rs"), lib).unwrap();
    let a = format!(
        "pub fn also_long() {{\n{}}}\n#[cfg(test)]\nfn in_test() {{\n{}}}\n",
        body(5),
        body(9)
    );
    std::fs::write(dir.path().join("src/a.rs"), a).unwrap();
    std::fs::write(
        dir.path().join("src/tests.rs"),
        format!("fn t() {{\n{}}}\n", body(9)),
    )
    .unwrap();
    let found = long_functions(dir.path(), 5).unwrap();
    assert_eq!(
        found,
        [
            "src/a.rs:1 also_long (7 lines)",
            "src/lib.rs:13 long (6 lines)"
        ]
    );
}

/// No non-test function of the workspace is longer than 80 lines: a longer one is broken
/// into named steps (issue 32 took 28 of them apart).
#[test]
fn no_function_of_the_workspace_is_longer_than_eighty_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for member in crate::layers::workspace_members(&root) {
        for f in long_functions(&root.join(&member), 80).unwrap() {
            found.push(format!("{member}/{f}"));
        }
    }
    assert!(
        found.is_empty(),
        "functions over 80 lines (break them into named steps):\n{}",
        found.join("\n")
    );
}
