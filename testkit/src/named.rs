//! What a map of the code names must exist: every file path and every code identifier that
//! a document quotes in backticks. A renamed file, a moved module or a deleted type then
//! fails a test instead of leaving the map wrong.
//!
//! A quoted span is a *path* when it ends with a known file extension or with `/` (a
//! directory), and does not start with `/` (a URL path): it must be a file or directory of
//! the tree, either from the root or as the tail of a longer path (`core/timers.rs` for a
//! crate's source file; a store key like `meta/events` is not a path). It
//! is an *identifier* when it is a Rust path (`Store`, `Store::batch_limit`,
//! `xce_store::etcd`, `run()`): its last segment must occur as a word in some source
//! file of the tree (Rust, TOML, Python, shell, JavaScript, HTML). Anything else (a
//! command line, a config line, a URL path, a glob) is prose and not checked.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What a document quotes that does not exist: one line per missing name.
pub fn missing(doc: &str, tree: &Tree) -> Vec<String> {
    let mut out = BTreeSet::new();
    for span in quoted(doc) {
        match classify(span) {
            Kind::Path(p) => {
                if !tree.has_path(p) {
                    out.insert(format!("file `{span}`"));
                }
            }
            Kind::Ident(last) => {
                if !tree.words.contains(last) {
                    out.insert(format!("identifier `{span}`"));
                }
            }
            Kind::Prose => {}
        }
    }
    out.into_iter().collect()
}

/// The spans between single backticks, outside fenced code blocks.
pub fn quoted(doc: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in doc.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            out.push(inside);
        }
    }
    out
}

/// What a quoted span is.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind<'a> {
    /// A file or directory path (without a trailing `/`).
    Path(&'a str),
    /// A code identifier: its last path segment.
    Ident(&'a str),
    /// Anything else.
    Prose,
}

const EXTENSIONS: &[&str] = &[".rs", ".md", ".toml", ".py", ".sh", ".js", ".html", ".css"];

/// Classifies one quoted span.
pub fn classify(span: &str) -> Kind<'_> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./".contains(c);
    if span.chars().all(plain)
        && !span.starts_with('/')
        && !span.starts_with('.')
        && (span.ends_with('/') || EXTENSIONS.iter().any(|e| span.ends_with(e)))
    {
        return Kind::Path(span.trim_end_matches('/'));
    }
    let ident = span.strip_suffix("()").unwrap_or(span);
    let segments: Vec<&str> = ident.split("::").collect();
    let is_word = |s: &str| {
        !s.is_empty()
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !s.starts_with(|c: char| c.is_ascii_digit())
    };
    if segments.iter().all(|s| is_word(s)) {
        // A lone lower-case word without `_` is as likely English or a value (`admin`,
        // `placed`) as code: only names that look like code are held to existing.
        let last = *segments.last().unwrap();
        let codeish = segments.len() > 1
            || span.ends_with("()")
            || last.contains('_')
            || last.starts_with(|c: char| c.is_ascii_uppercase());
        if codeish {
            return Kind::Ident(last);
        }
    }
    Kind::Prose
}

/// The files of a tree and the words of its sources.
#[derive(Debug, Default)]
pub struct Tree {
    /// Every file and directory, relative to the root, `/`-separated.
    pub paths: BTreeSet<String>,
    /// Every identifier-like word of the source files.
    pub words: BTreeSet<String>,
}

impl Tree {
    /// Reads the tree under `root`, leaving out `target/` and dot-directories.
    pub fn read(root: &Path) -> std::io::Result<Self> {
        let mut tree = Tree::default();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for entry in std::fs::read_dir(root.join(&rel))? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || name == "target" {
                    continue;
                }
                let rel = rel.join(&name);
                let shown = rel.to_string_lossy().replace('\\', "/");
                if entry.file_type()?.is_dir() {
                    stack.push(rel);
                } else if EXTENSIONS.iter().any(|e| name.ends_with(e)) && !name.ends_with(".md") {
                    let text = std::fs::read_to_string(root.join(&rel)).unwrap_or_default();
                    tree.add_words(&text);
                }
                tree.paths.insert(shown);
            }
        }
        Ok(tree)
    }

    /// Adds the identifier-like words of `text`.
    pub fn add_words(&mut self, text: &str) {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !word.is_empty() {
                self.words.insert(word.to_owned());
            }
        }
    }

    /// Whether `path` is a file or directory of the tree, from the root or as the tail of
    /// a longer path.
    pub fn has_path(&self, path: &str) -> bool {
        let tail = format!("/{path}");
        self.paths.iter().any(|p| p == path || p.ends_with(&tail))
    }
}

#[cfg(test)]
mod tests;
