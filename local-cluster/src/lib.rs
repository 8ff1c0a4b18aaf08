//! `local-cluster`: a small but real host for the xce plugins — controller (with the
//! scheduler and the apiserver), worker agent, and an all-in-one dev mode.
//!
//! It wires plugins in through the `plugin-api` traits only; nothing here knows what a
//! port name or an endpoint is.
#![warn(unreachable_pub)]

pub mod apiserver;
pub mod atomic_file;
pub mod auth;
pub mod clientconf;
pub mod controller;
pub mod limits;
pub mod logging;
pub mod profile;
pub mod proto;
pub mod serve;
pub mod store;
pub mod worker;

#[cfg(test)]
mod architecture {
    /// ARCHITECTURE.md: the library speaks `plugin-api` only; concrete plugins are named
    /// in `src/bin/xced/` (the wiring) and nowhere else.
    #[test]
    fn the_library_names_no_plugin_crate() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() && p.file_name().is_some_and(|n| n != "bin") {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut files,
        );
        assert!(files.len() > 10, "found the sources");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for krate in [
                "port_resource",
                "host_address",
                "endpoint_table",
                "xcecli_ext",
            ] {
                assert!(
                    !text.contains(&format!("{krate}::")),
                    "{} names {krate}",
                    f.display()
                );
            }
        }
    }
}
