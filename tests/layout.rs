//! The layout of `src/`: the top-level modules import each other without a cycle
//! (issue 22: "no import cycle among the modules of `src/`"). Reads the sources, so
//! a cycle introduced by a `use crate::…` anywhere (tests included) fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a source file belongs to (`src/shard/core.rs` → `shard`).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src/");
    let first = relative.components().next().expect("a file name");
    first
        .as_os_str()
        .to_string_lossy()
        .trim_end_matches(".rs")
        .to_owned()
}

/// The names the crate root re-exports, and the module each comes from
/// (`pub use timer::{Builder, ShardedTimer};`).
fn root_exports(lib: &str) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        for name in items.split(|c: char| !(c.is_alphanumeric() || c == '_')) {
            if name.starts_with(|c: char| c.is_ascii_alphabetic()) {
                names.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    names
}

/// The modules `code` (comments stripped) reaches through `crate::…` paths.
fn imports(
    code: &str,
    modules: &BTreeSet<String>,
    exports: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let group = if let Some(inner) = rest.strip_prefix('{') {
            &inner[..inner.find('}').unwrap_or(inner.len())]
        } else {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        };
        for word in group.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':')) {
            let head = word.split("::").next().unwrap_or_default();
            if modules.contains(head) {
                found.insert(head.to_owned());
            } else if let Some(module) = exports.get(head) {
                found.insert(module.clone());
            }
        }
    }
    found
}

/// A cycle in `graph`, if there is one (depth-first search, grey/black marking).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

/// The import graph of `src/`'s top-level modules, `lib` (the root) left out.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|file| module_of(&src, file))
        .filter(|module| module != "lib")
        .collect();
    let exports = root_exports(&fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs"));
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        if module == "lib" {
            continue;
        }
        let code: String = fs::read_to_string(file)
            .expect("a source file")
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut reached = imports(&code, &modules, &exports);
        reached.remove(&module);
        graph.entry(module).or_default().extend(reached);
    }
    graph
}

#[test]
fn the_modules_of_src_import_each_other_without_a_cycle() {
    let graph = import_graph();
    // The scan sees the edges that exist (so an empty graph cannot pass by accident).
    assert!(graph["timer"].contains("shard"), "{graph:#?}");
    assert!(graph["shard"].contains("dispatch"), "{graph:#?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}\n{graph:#?}", cycle.join(" → "));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn dispatch_names_neither_the_shard_nor_the_service() {
    let graph = import_graph();
    let dispatch = &graph["dispatch"];
    for module in ["shard", "timer", "handle", "future"] {
        assert!(
            !dispatch.contains(module),
            "dispatch imports {module}: {dispatch:?}"
        );
    }
}
