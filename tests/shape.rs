//! The shape of the source tree (ARCHITECTURE.md, "The map"): no process's
//! modules import another process's, nothing below the processes imports a
//! process, the floors (`sys`, `wire`) import only what is below them, and
//! no module import circle inside a room. It reads `src/` as
//! text (comments and string literals left out), resolves every `crate::`,
//! `super::` and `self::` path (and a room's `pub use` re-exports) to the
//! module that holds the item, and checks the edges.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The rooms that are processes of their own: the daemon, the load
/// balancer, the fenced copy launcher, the command and `shinyctl reclaim`.
const PROCESS_ROOMS: [&str; 5] = ["serve", "proxy", "launcher", "cli", "reclaim"];

/// A module path below the crate (`["proxy", "pump"]`).
type Module = Vec<String>;

/// One source file: its module, and the paths it names (resolved to
/// absolute paths below the crate).
struct Source {
    /// The file, for messages.
    file: PathBuf,
    /// Its module path.
    module: Module,
    /// Every path it names, absolute.
    paths: Vec<Module>,
    /// Its `pub use` re-exports: the name and the absolute path it stands for.
    exports: BTreeMap<String, Module>,
}

/// Every `.rs` file under `dir` with its module path; `#[path]` attributes
/// are followed.
fn modules(src: &Path) -> Vec<(PathBuf, Module)> {
    let mut out = Vec::new();
    walk(src, &mut out);
    let mut found: Vec<(PathBuf, Module)> = Vec::new();
    for file in &out {
        let rel = file.strip_prefix(src).unwrap();
        let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let last = parts.pop().unwrap();
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" && !(parts.is_empty() && (stem == "lib" || stem == "main")) {
            parts.push(stem);
        }
        found.push((file.clone(), parts));
    }
    // A `#[path = "x.rs"] mod name;` gives that file the declaring module's name.
    let mut renamed = Vec::new();
    for (file, module) in &found {
        let text = fs::read_to_string(file).unwrap();
        let mut rest = text.as_str();
        while let Some(at) = rest.find("#[path = \"") {
            rest = &rest[at + 10..];
            let target = &rest[..rest.find('"').unwrap()];
            let after = rest[rest.find(']').unwrap() + 1..].trim_start();
            let name: String = after.trim_start_matches("mod ").chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            let mut m = module.clone();
            m.push(name);
            renamed.push((file.parent().unwrap().join(target), m));
        }
    }
    for (path, m) in renamed {
        if let Some(entry) = found.iter_mut().find(|(f, _)| *f == path) {
            entry.1 = m;
        }
    }
    found
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The text with comments, string and character literals blanked out.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
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
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_char(b.get(i.wrapping_sub(1)).copied()) {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                i += if b[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\'') or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
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

fn ident_char(c: Option<char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// The paths of one `use` tree (`a::{b, c::d as e}` gives `a::b`, `a::c::d`),
/// each with the name it is known by.
fn use_tree(tree: &str, prefix: &[String], out: &mut Vec<(Module, String)>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let mut prefix = prefix.to_vec();
        prefix.extend(segments(&tree[..open]));
        let inner = &tree[open + 1..tree.rfind('}').unwrap()];
        let mut depth = 0;
        let mut start = 0;
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_tree(&inner[start..i], &prefix, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        use_tree(&inner[start..], &prefix, out);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut full = prefix.to_vec();
    full.extend(segments(path));
    if full.last().is_some_and(|s| s == "self") {
        full.pop();
    }
    let name = alias.unwrap_or_else(|| full.last().cloned().unwrap_or_default());
    if full.last().is_some_and(|s| s == "*") {
        full.pop();
    }
    out.push((full, name));
}

fn segments(path: &str) -> Vec<String> {
    path.split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

/// A path as written in `module` made absolute, or `None` for a path
/// outside the crate (std, a dependency).
fn absolute(module: &Module, children: &BTreeSet<String>, path: &[String]) -> Option<Module> {
    let first = path.first()?;
    let mut base: Module;
    let mut rest = path;
    match first.as_str() {
        "crate" => {
            base = Vec::new();
            rest = &path[1..];
        }
        "self" => {
            base = module.clone();
            rest = &path[1..];
        }
        "super" => {
            base = module.clone();
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        name if children.contains(name) => base = module.clone(),
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// Every source file with the paths it names.
fn sources(src: &Path) -> Vec<Source> {
    let mods = modules(src);
    let known: BTreeSet<Module> = mods.iter().map(|(_, m)| m.clone()).collect();
    let mut out = Vec::new();
    for (file, module) in &mods {
        let children: BTreeSet<String> =
            known.iter().filter(|m| m.len() == module.len() + 1 && m.starts_with(module)).map(|m| m.last().unwrap().clone()).collect();
        let code = code_only(&fs::read_to_string(file).unwrap());
        let mut rest_text = String::new();
        let mut paths = Vec::new();
        let mut exports = BTreeMap::new();
        let mut rest = code.as_str();
        // `use` statements first (their trees), then every other path.
        while let Some(at) = find_word(rest, "use") {
            let public = rest[..at].trim_end().ends_with(')') || rest[..at].trim_end().ends_with("pub");
            rest_text.push_str(&rest[..at]);
            let end = at + rest[at..].find(';').unwrap();
            let mut trees = Vec::new();
            use_tree(&rest[at + 3..end], &[], &mut trees);
            for (p, name) in trees {
                if let Some(abs) = absolute(module, &children, &p) {
                    if public {
                        exports.insert(name, abs.clone());
                    }
                    paths.push(abs);
                }
            }
            rest = &rest[end + 1..];
        }
        rest_text.push_str(rest);
        for p in inline_paths(&rest_text) {
            if let Some(abs) = absolute(module, &children, &p) {
                paths.push(abs);
            }
        }
        out.push(Source { file: file.clone(), module: module.clone(), paths, exports });
    }
    out
}

/// Where `word` starts as a whole word in `text`.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        if !ident_char(before) && after.is_some_and(|c| c.is_whitespace()) {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Every `a::b::c` path in code (not in a `use`).
fn inline_paths(code: &str) -> Vec<Module> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if ident_char(Some(chars[i])) && !ident_char(i.checked_sub(1).map(|j| chars[j])) && !(i > 0 && chars[i - 1] == ':') {
            let mut path = Vec::new();
            let mut j = i;
            loop {
                let start = j;
                while ident_char(chars.get(j).copied()) {
                    j += 1;
                }
                path.push(chars[start..j].iter().collect::<String>());
                if chars.get(j) == Some(&':') && chars.get(j + 1) == Some(&':') && ident_char(chars.get(j + 2).copied()) {
                    j += 2;
                } else {
                    break;
                }
            }
            if path.len() > 1 {
                out.push(path);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

/// The module that holds what `path` names: its longest known prefix, with
/// `pub use` re-exports followed.
fn holder(path: &[String], by_module: &BTreeMap<Module, &Source>) -> Option<Module> {
    let mut path = path.to_vec();
    for _ in 0..8 {
        let n = (0..=path.len()).rev().find(|n| by_module.contains_key(&path[..*n]))?;
        let module = path[..n].to_vec();
        match path.get(n).and_then(|name| by_module[&module].exports.get(name)) {
            Some(target) if *target != path[..=n] => {
                let mut next = target.clone();
                next.extend(path[n + 1..].iter().cloned());
                path = next;
            }
            _ => return Some(module),
        }
    }
    None
}

/// Every edge from one module to another that it names, with the file.
fn edges(src: &Path) -> Vec<(PathBuf, Module, Module)> {
    let sources = sources(src);
    let by_module: BTreeMap<Module, &Source> = sources.iter().map(|s| (s.module.clone(), s)).collect();
    let mut out = BTreeSet::new();
    for s in &sources {
        for p in &s.paths {
            if let Some(target) = holder(p, &by_module) {
                if target != s.module {
                    out.insert((s.file.clone(), s.module.clone(), target));
                }
            }
        }
    }
    out.into_iter().collect()
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A process room imports no other process's room, and no room below the
/// processes (the floors: `wire`, `sys`, `manifest`, …) imports a process.
#[test]
fn no_process_imports_another() {
    let mut wrong = Vec::new();
    for (file, from, to) in edges(&src_dir()) {
        let (Some(from_room), Some(to_room)) = (from.first(), to.first()) else { continue };
        if from_room != to_room && PROCESS_ROOMS.contains(&to_room.as_str()) {
            wrong.push(format!("{} ({}) imports {}", file.display(), from.join("::"), to.join("::")));
        }
    }
    assert!(wrong.is_empty(), "imports into a process's room from outside it:\n{}", wrong.join("\n"));
}

/// The floors stand on what is below them only: `sys` (the OS) on `home`
/// alone, `wire` (the protocols) on `sys`, `manifest` and `home`.
#[test]
fn floors_stand_on_what_is_below_them() {
    let below: [(&str, &[&str]); 2] = [("sys", &["home"]), ("wire", &["sys", "manifest", "home"])];
    let mut wrong = Vec::new();
    for (file, from, to) in edges(&src_dir()) {
        let (Some(from_room), Some(to_room)) = (from.first(), to.first()) else { continue };
        for (floor, allowed) in below {
            if from_room == floor && to_room != floor && !allowed.contains(&to_room.as_str()) {
                wrong.push(format!("{} ({}) imports {}", file.display(), from.join("::"), to.join("::")));
            }
        }
    }
    assert!(wrong.is_empty(), "a floor imports what stands above it:\n{}", wrong.join("\n"));
}

/// No module import circle: among the modules of the crate, leaving out a
/// module's use of its own parents (a room's front, `mod.rs`) and of its
/// own children (which it declares).
#[test]
fn no_import_circle() {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (_, from, to) in edges(&src_dir()) {
        if from.starts_with(&to) || to.starts_with(&from) {
            continue;
        }
        graph.entry(from).or_default().insert(to);
    }
    let circles = strongly_connected(&graph);
    let shown: Vec<String> = circles.iter().map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(", ")).collect();
    assert!(shown.is_empty(), "module import circles:\n{}", shown.join("\n"));
}

/// The strongly connected sets of more than one module (Tarjan's).
fn strongly_connected(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        on_stack: BTreeSet<Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit(w: &mut Walk, v: &Module) {
        let n = w.index.len();
        w.index.insert(v.clone(), n);
        w.low.insert(v.clone(), n);
        w.stack.push(v.clone());
        w.on_stack.insert(v.clone());
        for to in w.graph.get(v).into_iter().flatten() {
            if !w.index.contains_key(to) {
                visit(w, to);
                let l = w.low[v].min(w.low[to]);
                w.low.insert(v.clone(), l);
            } else if w.on_stack.contains(to) {
                let l = w.low[v].min(w.index[to]);
                w.low.insert(v.clone(), l);
            }
        }
        if w.low[v] == w.index[v] {
            let mut set = Vec::new();
            loop {
                let m = w.stack.pop().unwrap();
                w.on_stack.remove(&m);
                let done = m == *v;
                set.push(m);
                if done {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                w.found.push(set);
            }
        }
    }
    let mut w =
        Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), on_stack: BTreeSet::new(), found: Vec::new() };
    for v in graph.keys() {
        if !w.index.contains_key(v) {
            visit(&mut w, v);
        }
    }
    w.found
}

/// No circle between the sub-rooms of a room (`proxy::copies`,
/// `proxy::requests`, `serve::copies`, …, and a room's loose files, each its
/// own): a sub-room is a unit a reader can take in alone only when what it
/// uses does not use it back.
#[test]
fn no_circle_between_sub_rooms() {
    let src = src_dir();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (_, from, to) in edges(&src) {
        let (Some(room), Some(to_room)) = (from.first(), to.first()) else { continue };
        if room != to_room || from.len() < 2 || to.len() < 2 {
            // Between rooms the other tests decide; a room's front
            // (`mod.rs`) is the room itself.
            continue;
        }
        let (a, b) = (from[..2].to_vec(), to[..2].to_vec());
        if a != b {
            graph.entry(a).or_default().insert(b);
        }
    }
    let circles = strongly_connected(&graph);
    let shown: Vec<String> = circles.iter().map(|c| c.iter().map(|m| m.join("::")).collect::<Vec<_>>().join(", ")).collect();
    assert!(shown.is_empty(), "sub-room import circles:\n{}", shown.join("\n"));
}
