//! The core crate's layering, checked on its source: which top-level modules may import which.
//!
//! ARCHITECTURE.md states the rules; this test keeps them true. It reads every non-test source
//! file under `src/`, collects the top-level modules each one names through `crate::...` (in `use`
//! items, brace groups included, and in paths), and checks:
//! - the devices (`cpu`, `gpu`), the worker pool (`worker`), the protocol (`verify`) and the
//!   compiler (`compile`) import nothing from `env`: environments are built on them, never the
//!   other way round;
//! - the generic worker pool knows no roles (`compile`, `cpu`, `gpu`, `env`, `roles`);
//! - there is no import circle among the top-level modules at all.
//!
//! Test code (`*tests*.rs` files, `tests/` folders, `#[cfg(test)]` modules at the end of a file)
//! is left out: tests may reach across layers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path
                .file_name()
                .unwrap()
                .to_string_lossy()
                .contains("tests")
        {
            out.push(path);
        }
    }
}

/// The source without comments and without a trailing `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..cut]
        .lines()
        .map(|l| match l.find("//") {
            // A `//` inside a string literal would cut the line short; paths never follow it.
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Top-level modules named by `crate::` paths in `code`.
fn imports(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let after = rest[i + "crate::".len()..].trim_start();
        if let Some(group) = after.strip_prefix('{') {
            // `crate::{a, b::c, d::{e, f}}`: the names at depth 0 of the group.
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && depth == 0 && (c.is_ascii_alphabetic() || c == '_') => {
                        out.insert(ident_at(&group[j..]).to_string());
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident_at(after);
            if !name.is_empty() {
                out.insert(name.to_string());
            }
        }
        rest = &rest[i + "crate::".len()..];
    }
    out
}

/// Top-level module -> the top-level modules its non-test code imports.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let deps = g.entry(module.clone()).or_default();
        for d in imports(&code_of(&text)) {
            if d != module && d != "self" && d != "super" {
                deps.insert(d);
            }
        }
    }
    g
}

/// A cycle through `start`, if any (depth-first search over the graph).
fn cycle_from(g: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn dfs(
        g: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in g.get(node).into_iter().flatten() {
            if next == start {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if dfs(g, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    dfs(g, start, start, &mut path, &mut seen).then(|| {
        path.push(start.to_string());
        path
    })
}

#[test]
fn the_import_parser_reads_groups_and_paths() {
    let code = "use crate::{a, b::c, d::{e, f}};\nuse crate::g::h;\nlet x = crate::i::j();";
    let got: Vec<String> = imports(code).into_iter().collect();
    assert_eq!(got, ["a", "b", "d", "g", "i"]);
    assert!(imports(&code_of("// crate::hidden\nfn f() {}")).is_empty());
}

#[test]
fn devices_and_workers_do_not_import_environments() {
    let g = graph();
    for module in ["cpu", "gpu", "worker", "verify", "compile"] {
        let deps = g.get(module).cloned().unwrap_or_default();
        assert!(
            !deps.contains("env"),
            "src/{module} imports crate::env; environments are built on the devices, never the other way round ({deps:?})"
        );
    }
    let worker = g.get("worker").cloned().unwrap_or_default();
    for role in ["compile", "cpu", "gpu", "env", "roles"] {
        assert!(
            !worker.contains(role),
            "src/worker imports crate::{role}: the generic pool must know no roles ({worker:?})"
        );
    }
}

#[test]
fn no_import_circle_among_top_level_modules() {
    let g = graph();
    assert!(g.len() > 10, "read too few modules: {:?}", g.keys());
    for module in g.keys() {
        if let Some(cycle) = cycle_from(&g, module) {
            panic!("import circle: {}", cycle.join(" -> "));
        }
    }
}
