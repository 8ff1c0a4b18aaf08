//! Import circles between source files: who names whom, and where that goes round.
//!
//! A file *names* another when its non-test code holds a path that resolves into the
//! other file's module: `use super::x::Y`, `crate::a::b()`, `child::f()` in expressions,
//! types, patterns and macro arguments alike. A `mod x;` declaration is not naming (it is
//! the tree, not a dependency), and neither are comments or doc links. A path that stops
//! at a module re-exporting an item (`crate::Thing` with `pub use x::Thing` in `lib.rs`)
//! names the re-exporting file: that is the point, `lib.rs` only re-exports and modules
//! import from the module that defines a thing.
//!
//! Test code is left out: `#[cfg(test)]` items and the `tests.rs`/`tests/` modules they
//! declare may use anything.
//!
//! The graph is built with `syn` from the crate roots (`src/lib.rs`, `src/main.rs`,
//! `src/bin/*.rs` and every `path = "src/…"` of the crate's `Cargo.toml`), following
//! `mod` declarations the way rustc does (`foo.rs` declares `foo/bar.rs`, `mod.rs` and the
//! roots declare their siblings). Paths into other crates are not followed: crates cannot
//! form circles (cargo refuses them).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use syn::visit::Visit;

/// Which file names which: a file (relative to the crate's directory) to the files its
/// non-test code names.
pub type FileGraph = BTreeMap<PathBuf, BTreeSet<PathBuf>>;

/// The file graph of the crate whose `Cargo.toml` is in `crate_dir`.
pub fn file_graph(crate_dir: &Path) -> Result<FileGraph, String> {
    let mut modules = Modules::default();
    for root in crate_roots(crate_dir) {
        modules.load(crate_dir, &root, Vec::new())?;
    }
    let mut graph = FileGraph::new();
    for (file, parsed) in &modules.parsed {
        let mut names = Names {
            modules: &modules,
            file,
            scope: modules.file_module[file].clone(),
            found: BTreeSet::new(),
        };
        names.visit_file(parsed);
        graph.insert(file.clone(), names.found);
    }
    Ok(graph)
}

/// Every circle of the graph, each as a walk `a -> b -> … -> a` of file names; one walk per
/// strongly connected group of files, empty when there is none.
pub fn circles(graph: &FileGraph) -> Vec<String> {
    let mut out = Vec::new();
    for group in strongly_connected(graph) {
        if group.len() < 2 {
            continue;
        }
        let start = group.iter().next().unwrap();
        let walk = shortest_walk_back(graph, start, &group);
        let names: Vec<String> = walk.iter().map(|p| p.display().to_string()).collect();
        out.push(names.join(" -> "));
    }
    out
}

fn crate_roots(crate_dir: &Path) -> Vec<PathBuf> {
    let mut roots = BTreeSet::new();
    for fixed in ["src/lib.rs", "src/main.rs"] {
        if crate_dir.join(fixed).is_file() {
            roots.insert(PathBuf::from(fixed));
        }
    }
    if let Ok(dir) = std::fs::read_dir(crate_dir.join("src/bin")) {
        for entry in dir.flatten() {
            let path = entry.path();
            let main = path.join("main.rs");
            if path.extension().is_some_and(|e| e == "rs") {
                roots.insert(Path::new("src/bin").join(entry.file_name()));
            } else if main.is_file() {
                roots.insert(Path::new("src/bin").join(entry.file_name()).join("main.rs"));
            }
        }
    }
    // `[lib]`/`[[bin]]` targets at other paths (`path = "src/xcecli.rs"`).
    let manifest = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap_or_default();
    for line in manifest.lines() {
        let Some(value) = line.trim().strip_prefix("path") else {
            continue;
        };
        let value = value
            .trim_start()
            .trim_start_matches('=')
            .trim()
            .trim_matches('"');
        if value.starts_with("src/") && value.ends_with(".rs") {
            roots.insert(PathBuf::from(value));
        }
    }
    roots.into_iter().collect()
}

/// The crate's module tree: module path -> file, and each file's parsed text.
#[derive(Default)]
struct Modules {
    /// Every module, inline ones included, to the file that holds it.
    files: BTreeMap<Vec<String>, PathBuf>,
    /// The module a file's top level is.
    file_module: BTreeMap<PathBuf, Vec<String>>,
    parsed: BTreeMap<PathBuf, syn::File>,
}

impl Modules {
    fn load(&mut self, crate_dir: &Path, file: &Path, module: Vec<String>) -> Result<(), String> {
        if self.parsed.contains_key(file) {
            return Ok(());
        }
        let text = std::fs::read_to_string(crate_dir.join(file))
            .map_err(|e| format!("{}: {e}", file.display()))?;
        let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        // Where `mod x;` looks for x: next to a root or `mod.rs`, else in `<stem>/`.
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let dir = file.parent().unwrap_or(Path::new("")).to_path_buf();
        let child_dir = if module.is_empty() || stem == "mod" {
            dir
        } else {
            dir.join(stem)
        };
        self.files.insert(module.clone(), file.to_path_buf());
        self.file_module.insert(file.to_path_buf(), module.clone());
        // Marks the file as loaded before its children (a `mod` loop cannot recurse).
        self.parsed.insert(
            file.to_path_buf(),
            syn::File {
                shebang: None,
                attrs: Vec::new(),
                items: Vec::new(),
            },
        );
        self.load_items(crate_dir, file, &parsed.items, &module, &child_dir)?;
        self.parsed.insert(file.to_path_buf(), parsed);
        Ok(())
    }

    fn load_items(
        &mut self,
        crate_dir: &Path,
        file: &Path,
        items: &[syn::Item],
        module: &[String],
        child_dir: &Path,
    ) -> Result<(), String> {
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            if is_test_only(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let mut path = module.to_vec();
            path.push(name.clone());
            match &m.content {
                // An inline module lives in this file; its own `mod x;` look in `<dir>/name/`.
                Some((_, inner)) => {
                    self.files.insert(path.clone(), file.to_path_buf());
                    self.load_items(crate_dir, file, inner, &path, &child_dir.join(&name))?;
                }
                None => {
                    let flat = child_dir.join(format!("{name}.rs"));
                    let nested = child_dir.join(&name).join("mod.rs");
                    let found = if crate_dir.join(&flat).is_file() {
                        flat
                    } else if crate_dir.join(&nested).is_file() {
                        nested
                    } else {
                        return Err(format!(
                            "{}: `mod {name};` found neither {} nor {}",
                            file.display(),
                            flat.display(),
                            nested.display()
                        ));
                    };
                    self.load(crate_dir, &found, path)?;
                }
            }
        }
        Ok(())
    }

    /// The file a path written in module `scope` leads into, if it is in this crate.
    fn resolve(&self, scope: &[String], segments: &[String]) -> Option<&PathBuf> {
        let (mut full, rest) = match segments.first().map(String::as_str) {
            Some("crate") => (Vec::new(), &segments[1..]),
            Some("self") => (scope.to_vec(), &segments[1..]),
            Some("super") => {
                let mut base = scope.to_vec();
                let mut rest = segments;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                (base, rest)
            }
            // A child module of the current one (`gateway::b64`); anything else is another
            // crate, the prelude, a local name or a type.
            Some(first) => {
                let mut child = scope.to_vec();
                child.push(first.to_owned());
                if !self.files.contains_key(&child) {
                    return None;
                }
                (scope.to_vec(), segments)
            }
            None => return None,
        };
        full.extend(rest.iter().cloned());
        // The longest prefix that is a module: the module that holds the named item.
        (0..=full.len())
            .rev()
            .find_map(|n| self.files.get(&full[..n]))
    }
}

/// Every non-test function of the crate in `crate_dir` longer than `max` lines (from its
/// first line, attributes and doc comments aside, to its closing brace), as
/// `file:line name (n lines)`. Test code is left out as in [`file_graph`]: `#[cfg(test)]`
/// items and the test modules they declare.
pub fn long_functions(crate_dir: &Path, max: usize) -> Result<Vec<String>, String> {
    let mut modules = Modules::default();
    for root in crate_roots(crate_dir) {
        modules.load(crate_dir, &root, Vec::new())?;
    }
    let mut out = Vec::new();
    for (file, parsed) in &modules.parsed {
        let mut lengths = Lengths {
            file,
            max,
            found: &mut out,
        };
        lengths.visit_file(parsed);
    }
    Ok(out)
}

/// Collects the functions of one file longer than `max` lines.
struct Lengths<'a> {
    file: &'a Path,
    max: usize,
    found: &'a mut Vec<String>,
}

impl Lengths<'_> {
    fn check(&mut self, name: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
        let first = sig.fn_token.span.start().line;
        let last = block.brace_token.span.close().end().line;
        let lines = last + 1 - first;
        if lines > self.max {
            self.found.push(format!(
                "{}:{first} {name} ({lines} lines)",
                self.file.display()
            ));
        }
    }
}

impl<'ast> Visit<'ast> for Lengths<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if item_attrs(item).is_some_and(is_test_only) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.check(&f.sig.ident, &f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        if is_test_only(&f.attrs) {
            return;
        }
        self.check(&f.sig.ident, &f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.check(&f.sig.ident, &f.sig, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// `#[cfg(test)]` (also inside `all(…)`/`any(…)`), but not `#[cfg(not(test))]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.meta.require_list().is_ok_and(|l| {
                let text = l.tokens.to_string();
                text.split(|c: char| !c.is_alphanumeric() && c != '_')
                    .any(|w| w == "test")
                    && !text.contains("not")
            })
    })
}

/// Collects the files one file's non-test code names.
struct Names<'a> {
    modules: &'a Modules,
    file: &'a Path,
    /// The module the visitor is in (inline modules push onto it).
    scope: Vec<String>,
    found: BTreeSet<PathBuf>,
}

impl Names<'_> {
    fn name(&mut self, segments: &[String]) {
        if segments.len() < 2 && !matches!(segments.first().map(String::as_str), Some("super")) {
            return;
        }
        if let Some(target) = self.modules.resolve(&self.scope, segments) {
            if target != self.file {
                self.found.insert(target.clone());
            }
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.name(&full);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.name(&full);
            }
            syn::UseTree::Glob(_) => {
                let full = prefix.clone();
                self.name(&full);
            }
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// Paths inside macro arguments (`tracing::info!(…)`, `format!`, `matches!`), which
    /// `syn` leaves as tokens: every `a::b::c` run of identifiers.
    fn tokens(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::TokenTree;
        let mut run: Vec<String> = Vec::new();
        let mut colons = 0;
        let flush = |run: &mut Vec<String>, this: &mut Self| {
            if run.len() >= 2 {
                this.name(run);
            }
            run.clear();
        };
        for tree in tokens {
            match tree {
                TokenTree::Ident(ident) => {
                    if colons == 2 || run.is_empty() {
                        run.push(ident.to_string());
                    } else {
                        flush(&mut run, self);
                        run.push(ident.to_string());
                    }
                    colons = 0;
                }
                TokenTree::Punct(p) if p.as_char() == ':' && !run.is_empty() && colons < 2 => {
                    colons += 1;
                }
                TokenTree::Group(g) => {
                    flush(&mut run, self);
                    colons = 0;
                    self.tokens(g.stream());
                }
                _ => {
                    flush(&mut run, self);
                    colons = 0;
                }
            }
        }
        flush(&mut run, self);
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if item_attrs(item).is_some_and(is_test_only) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // `mod x;` is the tree, not naming; an inline module's body is in scope `x`.
        if let Some((_, items)) = &m.content {
            self.scope.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.scope.pop();
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            _ => return syn::visit::visit_impl_item(self, item),
        };
        if !is_test_only(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if u.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &u.tree);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.name(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    /// `pub(super)`, `pub(in crate::x)`: who may see an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }
}

fn item_attrs(item: &syn::Item) -> Option<&[syn::Attribute]> {
    use syn::Item::*;
    Some(match item {
        Const(i) => &i.attrs,
        Enum(i) => &i.attrs,
        ExternCrate(i) => &i.attrs,
        Fn(i) => &i.attrs,
        ForeignMod(i) => &i.attrs,
        Impl(i) => &i.attrs,
        Macro(i) => &i.attrs,
        Mod(i) => &i.attrs,
        Static(i) => &i.attrs,
        Struct(i) => &i.attrs,
        Trait(i) => &i.attrs,
        TraitAlias(i) => &i.attrs,
        Type(i) => &i.attrs,
        Union(i) => &i.attrs,
        Use(i) => &i.attrs,
        _ => return None,
    })
}

/// Tarjan's strongly connected components (iterative, so deep trees cannot overflow).
fn strongly_connected(graph: &FileGraph) -> Vec<BTreeSet<PathBuf>> {
    let nodes: Vec<&PathBuf> = graph.keys().collect();
    let index_of: BTreeMap<&PathBuf, usize> =
        nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            graph[*n]
                .iter()
                .filter_map(|m| index_of.get(m).copied())
                .collect()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on_stack) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut groups, mut next) = (Vec::new(), Vec::new(), 0);
    for start in 0..n {
        if index[start] != usize::MAX {
            continue;
        }
        let mut work = vec![(start, 0usize)];
        while let Some(&mut (v, ref mut edge)) = work.last_mut() {
            if *edge == 0 && index[v] == usize::MAX {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = succ[v].get(*edge) {
                *edge += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut group = BTreeSet::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    group.insert(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                groups.push(group);
            }
        }
    }
    groups
}

/// The shortest walk from `start` back to itself inside `group` (breadth first).
fn shortest_walk_back(
    graph: &FileGraph,
    start: &PathBuf,
    group: &BTreeSet<PathBuf>,
) -> Vec<PathBuf> {
    let mut came_from: BTreeMap<&PathBuf, &PathBuf> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph[v].iter().filter(|w| group.contains(*w)) {
            if w == start {
                let mut walk = vec![start.clone(), v.clone()];
                let mut at = v;
                while at != start {
                    at = came_from[at];
                    walk.push(at.clone());
                }
                walk.reverse();
                return walk;
            }
            if !came_from.contains_key(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    vec![start.clone()]
}

#[cfg(test)]
mod tests;
