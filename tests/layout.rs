//! The layout of `src/`: its modules import each other without a cycle (issue 22: "no
//! import cycle among the modules of `src/`"; issue 39: "one concept per file, no
//! circle"), at two depths: the top-level modules (`shard`, `entry`, ...), and every
//! file (`shard::direct`, `shard::turn`, `entry::pool::heap`, ...). Reads the sources,
//! so a cycle introduced by a path anywhere (tests included) fails here.
//!
//! # The graph
//!
//! One node per file, named by its module path (`src/shard/direct.rs` is
//! `shard::direct`; `src/entry/pool/mod.rs` is `entry::pool`; inline modules, such as
//! `mod tests { .. }`, belong to their file). An edge for every path that names another
//! module or an item in it, in a `use` (`use super::x`, `use crate::a::b::C`,
//! `super::super`, groups such as `use crate::{a, b::{c, d}}`, `self`, renames, globs)
//! or inline in code (`crate::shard::direct::DirectPort`, `direct::take(..)` for a
//! child module, `thread::park()` through an imported module). A path resolves module
//! by module; a name that a module imports (re-exports) counts as an edge to that
//! module, the parent, and to wherever its import leads (so a circle through a
//! parent's `pub use` is still seen). Paths that start with `::` or name another crate
//! (`std`, `loom`) are no edges.
//!
//! One kind of edge is not counted at the file level: a module's to its own children
//! (and their children). A parent is made of its children (it declares them,
//! re-exports them and calls them), and children name their parent's items
//! (`super::ShardShared`): along that line Rust's privacy makes them one unit. Every
//! other edge counts: child to parent, between siblings and between cousins. The
//! top-level graph merges each top-level module's files into one node.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A directed graph between module paths.
type Graph = BTreeMap<String, BTreeSet<String>>;

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

/// The module path of a source file (`src/shard/core.rs` → `shard::core`,
/// `src/entry/pool/mod.rs` → `entry::pool`, `src/lib.rs` → the root, "").
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).expect("under src/");
    let mut parts: Vec<String> = relative
        .components()
        .map(|part| part.as_os_str().to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let last = last.trim_end_matches(".rs");
    if last != "mod" && last != "lib" {
        parts.push(last.to_owned());
    }
    parts.join("::")
}

/// The real sources: every file under `src/`, by module path.
fn real_sources() -> BTreeMap<String, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files
        .iter()
        .map(|file| {
            let text = fs::read_to_string(file).expect("a source file");
            (module_of(&src, file), text)
        })
        .collect()
}

/// `code` with its comments removed and the contents of its string and character
/// literals blanked, so that neither a `crate::` in a doc nor a `'{'` is read as code.
fn strip(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..", r#".."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{7f}'), or else a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 3;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code`'s tokens as far as paths need them: identifiers (and numbers), `::`, and
/// every other character on its own.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push(c.to_string());
            }
            i += 1;
        }
    }
    out
}

/// Whether `token` is an identifier (or a keyword such as `crate`).
fn is_ident(token: &str) -> bool {
    token.starts_with(|c: char| c.is_alphabetic() || c == '_')
}

/// `parent::name`, or `name` at the root.
fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}::{name}")
    }
}

/// The module containing `module` (`None` for the root).
fn parent_of(module: &str) -> Option<String> {
    if module.is_empty() {
        return None;
    }
    Some(
        module
            .rsplit_once("::")
            .map_or(String::new(), |(parent, _)| parent.to_owned()),
    )
}

/// Whether `module` is `ancestor` or inside it.
fn is_within(module: &str, ancestor: &str) -> bool {
    ancestor.is_empty() || module == ancestor || module.starts_with(&format!("{ancestor}::"))
}

/// A path as written, and the module it is written in.
#[derive(Clone, Debug)]
struct Written {
    /// The module (inline modules included) whose scope the path is read in.
    scope: String,
    /// Its segments (`crate`, `super`, `self` and names).
    segments: Vec<String>,
}

/// What the parser keeps of one module (a file's, or an inline one's).
#[derive(Debug, Default)]
struct Module {
    /// The modules declared inside it (`mod x;` and `mod x { .. }`).
    children: BTreeSet<String>,
    /// The names its `use` declarations bind, and the paths they bind them to.
    imports: BTreeMap<String, Written>,
}

/// The whole crate as the parser reads it.
#[derive(Debug, Default)]
struct Crate {
    /// Every module, files and inline ones, by module path.
    modules: BTreeMap<String, Module>,
    /// Every path each file writes (in `use` declarations and in code), by file.
    paths: BTreeMap<String, Vec<Written>>,
}

/// Reads one `use` tree from `tokens[*at..]` (after the `use`), with `prefix` the
/// segments of the groups it is nested in; pushes each path it imports with the name
/// it binds (`None` for a glob or `_`).
fn use_tree(
    tokens: &[String],
    at: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut path = prefix;
    while let Some(token) = tokens.get(*at) {
        if token == "{" {
            *at += 1;
            while tokens.get(*at).is_some_and(|token| token != "}") {
                use_tree(tokens, at, path.clone(), out);
                if tokens.get(*at).is_some_and(|token| token == ",") {
                    *at += 1;
                }
            }
            *at += 1;
            return;
        }
        if token == "*" {
            *at += 1;
            out.push((path, None));
            return;
        }
        if !is_ident(token) {
            break;
        }
        path.push(token.clone());
        *at += 1;
        if tokens.get(*at).is_some_and(|token| token == "::") {
            *at += 1;
        } else {
            break;
        }
    }
    if path.last().is_some_and(|last| last == "self") {
        path.pop();
    }
    let mut name = path.last().cloned();
    if tokens.get(*at).is_some_and(|token| token == "as") {
        name = tokens.get(*at + 1).cloned().filter(|name| name != "_");
        *at += 2;
    }
    if !path.is_empty() {
        out.push((path, name));
    }
}

impl Crate {
    /// Parses `sources` (module path → text).
    fn parse(sources: &BTreeMap<String, String>) -> Crate {
        let mut krate = Crate::default();
        for (file, text) in sources {
            krate.modules.entry(file.clone()).or_default();
            if let Some(parent) = parent_of(file) {
                let name = file.rsplit("::").next().expect("a name").to_owned();
                krate
                    .modules
                    .entry(parent)
                    .or_default()
                    .children
                    .insert(name);
            }
            krate.parse_file(file, text);
        }
        krate
    }

    /// Parses one file, module path `file`.
    fn parse_file(&mut self, file: &str, text: &str) {
        let tokens = tokens(&strip(text));
        // The inline modules open at this point, with the brace depth inside each.
        let mut open: Vec<(String, usize)> = Vec::new();
        let mut depth = 0;
        let scope = |open: &[(String, usize)]| open.last().map_or(file.to_owned(), |m| m.0.clone());
        let mut written = Vec::new();
        let mut at = 0;
        while at < tokens.len() {
            let token = tokens[at].as_str();
            let here = scope(&open);
            match token {
                "{" => depth += 1,
                "}" => {
                    if open.last().is_some_and(|(_, inside)| *inside == depth) {
                        open.pop();
                    }
                    depth = depth.saturating_sub(1);
                }
                "mod" if tokens.get(at + 1).is_some_and(|name| is_ident(name)) => {
                    let name = tokens[at + 1].clone();
                    let module = join(&here, &name);
                    self.modules
                        .entry(here.clone())
                        .or_default()
                        .children
                        .insert(name);
                    self.modules.entry(module.clone()).or_default();
                    if tokens.get(at + 2).is_some_and(|token| token == "{") {
                        depth += 1;
                        open.push((module, depth));
                        at += 3;
                        continue;
                    }
                }
                "use" => {
                    at += 1;
                    let mut items = Vec::new();
                    if tokens.get(at).is_some_and(|token| token == "::") {
                        at += 1; // `use ::x`: another crate
                    } else {
                        use_tree(&tokens, &mut at, Vec::new(), &mut items);
                    }
                    while tokens.get(at).is_some_and(|token| token != ";") {
                        at += 1;
                    }
                    for (segments, name) in items {
                        let path = Written {
                            scope: here.clone(),
                            segments,
                        };
                        if let Some(name) = name {
                            let module = self.modules.entry(here.clone()).or_default();
                            module.imports.insert(name, path.clone());
                        }
                        written.push(path);
                    }
                }
                _ if is_ident(token)
                    && tokens.get(at + 1).is_some_and(|token| token == "::")
                    && !at
                        .checked_sub(1)
                        .is_some_and(|before| tokens[before] == "::" || tokens[before] == "$") =>
                {
                    // A path in code: `a::b::c`, read as far as names go.
                    let mut segments = vec![token.to_owned()];
                    let mut next = at + 1;
                    while tokens.get(next).is_some_and(|token| token == "::")
                        && tokens.get(next + 1).is_some_and(|token| is_ident(token))
                    {
                        segments.push(tokens[next + 1].clone());
                        next += 2;
                    }
                    written.push(Written {
                        scope: here,
                        segments,
                    });
                    at = next;
                    continue;
                }
                _ => {}
            }
            at += 1;
        }
        self.paths
            .entry(file.to_owned())
            .or_default()
            .extend(written);
    }

    /// The modules `path` reaches (see the module docs), into `out`.
    fn resolve(&self, path: &Written, hops: usize, out: &mut BTreeSet<String>) {
        if hops > 16 {
            return;
        }
        let segments = &path.segments;
        let Some(first) = segments.first() else {
            return;
        };
        let (mut module, mut rest) = match first.as_str() {
            "crate" => (String::new(), &segments[1..]),
            "self" => (path.scope.clone(), &segments[1..]),
            "super" => {
                let mut module = path.scope.clone();
                let mut rest = &segments[..];
                while rest.first().is_some_and(|segment| segment == "super") {
                    let Some(parent) = parent_of(&module) else {
                        return;
                    };
                    module = parent;
                    rest = &rest[1..];
                }
                (module, rest)
            }
            name => {
                let scope = &self.modules[&path.scope];
                if scope.children.contains(name) {
                    (path.scope.clone(), &segments[..])
                } else if let Some(import) = scope.imports.get(name) {
                    let mut followed = import.clone();
                    followed.segments.extend_from_slice(&segments[1..]);
                    self.resolve(&followed, hops + 1, out);
                    return;
                } else {
                    return; // another crate (`std`), a type (`Self`), a local
                }
            }
        };
        while let Some(name) = rest.first() {
            let Some(here) = self.modules.get(&module) else {
                break;
            };
            if here.children.contains(name) {
                module = join(&module, name);
                rest = &rest[1..];
            } else if let Some(import) = here.imports.get(name) {
                out.insert(module.clone());
                let mut followed = import.clone();
                followed.segments.extend_from_slice(&rest[1..]);
                self.resolve(&followed, hops + 1, out);
                return;
            } else {
                break;
            }
        }
        out.insert(module);
    }

    /// The file `module` is written in: itself, or the file of the inline module's
    /// nearest ancestor that is a file.
    fn file_of(&self, module: &str) -> String {
        let mut module = module.to_owned();
        while !self.paths.contains_key(&module) {
            match parent_of(&module) {
                Some(parent) => module = parent,
                None => break,
            }
        }
        module
    }

    /// Every edge between files (the root, `lib.rs`, left out), before any is dropped.
    fn edges(&self) -> Graph {
        let mut graph = Graph::new();
        for (file, paths) in &self.paths {
            if file.is_empty() {
                continue;
            }
            let mut reached = BTreeSet::new();
            for path in paths {
                self.resolve(path, 0, &mut reached);
            }
            let reached = reached
                .iter()
                .map(|module| self.file_of(module))
                .filter(|target| !target.is_empty() && target != file);
            graph.entry(file.clone()).or_default().extend(reached);
        }
        graph
    }
}

/// The file-level graph of `sources`: every edge but a module's to its own
/// descendants (module docs).
fn file_graph(sources: &BTreeMap<String, String>) -> Graph {
    let mut graph = Crate::parse(sources).edges();
    for (file, targets) in &mut graph {
        targets.retain(|target| !is_within(target, file));
    }
    graph
}

/// The top-level graph of `sources`: each top-level module's files as one node.
fn top_level_graph(sources: &BTreeMap<String, String>) -> Graph {
    let top = |module: &str| module.split("::").next().unwrap_or_default().to_owned();
    let mut graph = Graph::new();
    for (file, targets) in Crate::parse(sources).edges() {
        let from = top(&file);
        let reached = targets.iter().map(|target| top(target));
        let node = graph.entry(from.clone()).or_default();
        node.extend(reached.filter(|target| *target != from));
    }
    graph
}

/// A cycle in `graph`, if there is one (depth-first search, grey/black marking).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
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
fn import_graph() -> Graph {
    top_level_graph(&real_sources())
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
fn the_files_of_src_import_each_other_without_a_cycle() {
    let graph = file_graph(&real_sources());
    // The scan sees the edges that exist, at every depth: a `use super::sibling::X`,
    // a `use super::X` of the parent's own item, an inline `crate::` path.
    assert!(graph["shard::direct"].contains("shard::turn"), "{graph:#?}");
    assert!(
        graph["shard::shard_loop"].contains("shard::direct"),
        "{graph:#?}"
    );
    assert!(graph["shard::turn"].contains("shard"), "{graph:#?}");
    assert!(graph["shard::own"].contains("entry"), "{graph:#?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between files: {}\n{graph:#?}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_file_level_scan_finds_the_circle_direct_shard_loop_put_back() {
    // The circle issue 39 broke: `direct.rs` took `InCustody` from the loop's file,
    // which takes `DirectPort` from `direct.rs`. Put back in a copy of the sources.
    let mut sources = real_sources();
    let direct = sources
        .get_mut("shard::direct")
        .expect("src/shard/direct.rs");
    direct.push_str("\nuse super::shard_loop::InCustody;\n");
    let graph = file_graph(&sources);
    let cycle = find_cycle(&graph).expect("the circle is found");
    assert!(
        cycle.contains(&"shard::direct".to_owned())
            && cycle.contains(&"shard::shard_loop".to_owned()),
        "{cycle:?}"
    );
}

#[test]
fn the_parser_resolves_every_form_of_path() {
    let sources: BTreeMap<String, String> = [
        ("", "mod a; mod b; mod c;\npub use c::Api;\n"),
        (
            "a",
            "//! crate::b::Commented is no edge\nmod x; mod y;\npub(crate) use self::y::Again;\n",
        ),
        ("a::x", "use super::y::Y;\npub struct X;\n"),
        (
            "a::y",
            "pub struct Y; pub struct Again;\nfn f() { let _ = \"crate::c::InAString\"; crate::b::g(); }\n",
        ),
        (
            "b",
            "mod deep;\nuse crate::{a, c::{Api, Other as Renamed}};\nuse std::fmt;\npub fn g() {}\n",
        ),
        (
            "b::deep",
            "use super::super::a::x::X;\nuse crate::Api;\nuse super::super::a::Again;\n\
             #[cfg(test)]\nmod tests {\n    use super::super::g;\n    fn t() { let c = '{'; }\n}\n\
             fn h() { ::core::mem::drop(()); }\n",
        ),
        ("c", "pub struct Api; pub struct Other;\nuse ::core::mem;\n"),
    ]
    .into_iter()
    .map(|(module, text)| (module.to_owned(), text.to_owned()))
    .collect();
    let graph = file_graph(&sources);
    let edges = |file: &str| -> Vec<&str> { graph[file].iter().map(String::as_str).collect() };
    assert_eq!(
        edges("a"),
        Vec::<&str>::new(),
        "a's edges go to its own children"
    );
    assert_eq!(edges("a::x"), ["a::y"]);
    assert_eq!(edges("a::y"), ["b"]);
    assert_eq!(edges("b"), ["a", "c"]);
    // `crate::Api`: the root's re-export, followed to `c`; `a::Again`: the parent
    // `a` that re-exports it, and `a::y` where it comes from; `super::super::g`, from
    // an inline module, is `b`'s.
    assert_eq!(edges("b::deep"), ["a", "a::x", "a::y", "b", "c"]);
    assert_eq!(edges("c"), Vec::<&str>::new());
    assert_eq!(find_cycle(&graph), None);
}

#[test]
fn the_file_level_scan_finds_a_circle_between_two_files() {
    let pair = |right: &str| -> BTreeMap<String, String> {
        [
            ("", "mod p;\n"),
            (
                "p",
                "mod left; mod right;\npub(crate) use self::left::L;\npub(crate) struct Shared;\n",
            ),
            (
                "p::left",
                "use super::right::R;\nuse super::Shared;\npub(crate) struct L;\n",
            ),
            ("p::right", right),
        ]
        .into_iter()
        .map(|(module, text)| (module.to_owned(), text.to_owned()))
        .collect()
    };
    // A parent and its children are no circle; a sibling pair is, whether through an
    // inline path or through the parent's re-export.
    let apart = file_graph(&pair("pub(crate) struct R;\n"));
    assert_eq!(find_cycle(&apart), None, "{apart:#?}");
    for right in [
        "pub(crate) struct R;\nfn f() { crate::p::left::L::new(); }\n",
        "pub(crate) struct R;\nuse super::L;\n",
        "pub(crate) struct R;\nuse crate::p::{left::{self}, Shared};\n",
    ] {
        let graph = file_graph(&pair(right));
        let cycle = find_cycle(&graph).unwrap_or_else(|| panic!("no cycle in {graph:#?}"));
        assert_eq!(cycle.len(), 3, "{cycle:?}");
        assert!(cycle.contains(&"p::left".to_owned()) && cycle.contains(&"p::right".to_owned()));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let mut graph = Graph::new();
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
