use super::*;

fn tree() -> Tree {
    let mut tree = Tree::default();
    for p in [
        "local-cluster/controller/src/core/timers.rs",
        "docs/api.md",
        "docs",
    ] {
        tree.paths.insert(p.to_owned());
    }
    tree.add_words("pub struct Store; fn batch_limit() {} mod xce_store;");
    tree
}

#[test]
fn spans_are_classified_as_paths_identifiers_or_prose() {
    let cases = [
        ("core/timers.rs", Kind::Path("core/timers.rs")),
        ("docs/", Kind::Path("docs")),
        ("ARCHITECTURE.md", Kind::Path("ARCHITECTURE.md")),
        ("Store", Kind::Ident("Store")),
        ("Store::batch_limit", Kind::Ident("batch_limit")),
        ("run()", Kind::Ident("run")),
        ("xce_store", Kind::Ident("xce_store")),
        ("admin", Kind::Prose),
        ("meta/events", Kind::Prose),
        ("/v1/services", Kind::Prose),
        ("drain = \"0s\"", Kind::Prose),
        ("XCE_*", Kind::Prose),
        ("xced dev --demo", Kind::Prose),
    ];
    for (span, kind) in cases {
        assert_eq!(classify(span), kind, "{span}");
    }
}

#[test]
fn a_renamed_file_or_identifier_is_reported_and_code_blocks_are_not_read() {
    let doc = "See `core/timers.rs`, `core/clocks.rs`, `docs/api.md` and `docs/`.\n\
               `Store::batch_limit` and `Store::batch_size`; `xce_store` not `local_cluster`.\n\
               ```\n`Nowhere` in a fence\n```\n";
    assert_eq!(
        missing(doc, &tree()),
        [
            "file `core/clocks.rs`",
            "identifier `Store::batch_size`",
            "identifier `local_cluster`",
        ]
    );
}

/// ARCHITECTURE.md names only files and identifiers that exist.
#[test]
fn the_architecture_map_names_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let tree = Tree::read(&root).unwrap();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let gone = missing(&doc, &tree);
    assert!(
        gone.is_empty(),
        "ARCHITECTURE.md names what does not exist (rename it there too):\n{}",
        gone.join("\n")
    );
}
