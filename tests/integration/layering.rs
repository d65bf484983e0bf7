//! Source-level checks of the workspace's layering (docs/architecture.md, "Module layering"):
//!
//! - no import cycle between top-level modules of the library (`src/`; a module's
//!   `#[cfg(test)]` items are left out, as dev-dependencies are: a unit test may drive the
//!   interpreter);
//! - the library never prints and knows nothing of the terminal: `eprint`, `println!`,
//!   `print!`, `indicatif` and `clap` appear only in the CLI crate (`crates/cli/`), and the
//!   library's manifest does not depend on them;
//! - the CLI stays thin: each of its files at most 300 lines, no function over 150.
//!
//! Both scan the source text; the scanners have their own tests below so that a checker that
//! silently finds nothing fails too.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library's sources.
fn src_dir() -> PathBuf {
    crate::common::repo_root().join("src")
}

/// The CLI crate's sources.
fn cli_dir() -> PathBuf {
    crate::common::repo_root().join("crates/cli/src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`src/ops/conv.rs` → `ops`); `None` for the crate
/// root files.
fn top_module(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?.to_string();
    if rel.components().count() > 1 {
        return Some(first);
    }
    let stem = first.strip_suffix(".rs")?;
    (stem != "lib" && stem != "main").then(|| stem.to_string())
}

/// Source text with comments blanked out and string/char literal contents blanked out (so a
/// brace or `crate::` inside a literal or a doc comment is not code).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if src[i..].starts_with("//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if src[i..].starts_with("/*") {
            let mut depth = 0;
            while i < b.len() {
                if src[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if src[i..].starts_with("*/") {
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
            && (src[i + 1..].starts_with('"') || src[i + 1..].starts_with("#\""))
            && !prev_is_ident(b, i)
        {
            // Raw string r"..." or r#"..."#.
            let hashes = src[i + 1..].bytes().take_while(|&x| x == b'#').count();
            let close = format!("\"{}", "#".repeat(hashes));
            let start = i + 2 + hashes;
            let end = src[start..]
                .find(&close)
                .map(|k| start + k + close.len())
                .unwrap_or(b.len());
            out.push_str("\"\"");
            i = end;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            let rest = &src[i + 1..];
            let lit_len = if rest.starts_with('\\') {
                rest.find('\'').map(|k| k + 2)
            } else {
                let mut ch = rest.chars();
                match (ch.next(), ch.next()) {
                    (Some(x), Some('\'')) => Some(x.len_utf8() + 2),
                    _ => None,
                }
            };
            match lit_len {
                Some(n) => {
                    out.push_str("' '");
                    i += n;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn prev_is_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// `code` without its `#[cfg(test)]` items; also the names of `#[cfg(test)] mod x;` files.
fn without_test_items(code: &str) -> (String, Vec<String>) {
    let mut out = String::new();
    let mut test_files = Vec::new();
    let mut rest = code;
    while let Some(k) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..k]);
        let item = &rest[k + "#[cfg(test)]".len()..];
        // The item ends at the first `;` before any `{`, or at the `}` matching its first `{`.
        let semi = item.find(';');
        let brace = item.find('{');
        let end = match (semi, brace) {
            (Some(s), b) if b.is_none_or(|b| s < b) => {
                let head = item[..s].trim();
                if let Some(name) = head.strip_prefix("mod ") {
                    test_files.push(name.trim().to_string());
                }
                s + 1
            }
            (_, Some(b)) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (j, ch) in item[b..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + j + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_files)
}

/// The first path segment of every `crate::` reference, with `crate::{a, b::c}` groups
/// expanded (`a`, `b`).
fn crate_refs(code: &str) -> Vec<String> {
    let mut refs = Vec::new();
    let b = code.as_bytes();
    let mut from = 0;
    while let Some(k) = code[from..].find("crate::") {
        let at = from + k;
        from = at + "crate::".len();
        // `$crate::` (inside a macro) counts; `mycrate::` does not.
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1usize;
            let mut item = String::new();
            let mut items = Vec::new();
            for ch in group.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        items.push(std::mem::take(&mut item));
                        continue;
                    }
                    _ => {}
                }
                item.push(ch);
            }
            items.push(item);
            for it in items {
                let name: String = it
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    refs.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                refs.push(name);
            }
        }
    }
    refs
}

/// Names the crate root re-exports (`pub use exec::{Feeds, Interpreter}` → Feeds → exec) and
/// where each exported macro is defined.
fn root_aliases(lib_rs: &str, files: &[(String, String)]) -> BTreeMap<String, String> {
    let mut aliases = BTreeMap::new();
    let code = code_only(lib_rs);
    for stmt in code.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let (module, names) = match path.split_once("::") {
            Some((m, n)) => (m.trim().to_string(), n.trim()),
            None => continue,
        };
        let names = names.trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = n.trim();
            let alias = n.rsplit(" as ").next().unwrap_or(n).trim();
            let alias = alias.rsplit("::").next().unwrap_or(alias);
            if !alias.is_empty() {
                aliases.insert(alias.to_string(), module.clone());
            }
        }
    }
    for (module, code) in files {
        let mut rest = code.as_str();
        while let Some(k) = rest.find("macro_rules!") {
            rest = &rest[k + "macro_rules!".len()..];
            let name: String = rest
                .trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            aliases.insert(name, module.clone());
        }
    }
    aliases
}

/// Edges between top-level modules (`from → to → the files that refer`).
type Deps = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn module_deps() -> Deps {
    let src = src_dir();
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    // Non-test code of every module file, and the files that are test-only modules.
    let mut files: Vec<(String, String, String)> = Vec::new(); // (module, rel path, code)
    let mut test_only: BTreeSet<PathBuf> = BTreeSet::new();
    for p in &paths {
        let rel = p.strip_prefix(&src).unwrap().to_path_buf();
        let Some(module) = top_module(&rel) else {
            continue;
        };
        let text = std::fs::read_to_string(p).unwrap();
        let (code, test_mods) = without_test_items(&code_only(&text));
        let dir = if p.file_name().is_some_and(|f| f == "mod.rs") {
            p.parent().unwrap().to_path_buf()
        } else {
            p.with_extension("")
        };
        for m in test_mods {
            test_only.insert(dir.join(format!("{m}.rs")));
            test_only.insert(dir.join(&m).join("mod.rs"));
        }
        files.push((module, rel.display().to_string(), code));
    }
    files.retain(|(_, rel, _)| !test_only.contains(&src.join(rel)));
    let modules: BTreeSet<String> = files.iter().map(|(m, _, _)| m.clone()).collect();
    let lib_rs = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let by_module: Vec<(String, String)> = files
        .iter()
        .map(|(m, _, c)| (m.clone(), c.clone()))
        .collect();
    let aliases = root_aliases(&lib_rs, &by_module);
    let mut deps = Deps::new();
    for (module, rel, code) in &files {
        for r in crate_refs(code) {
            let target = if modules.contains(&r) {
                r.clone()
            } else if let Some(m) = aliases.get(&r) {
                m.clone()
            } else {
                panic!(
                    "{rel}: `crate::{r}` names no top-level module, crate-root re-export or macro"
                );
            };
            if &target != module {
                deps.entry(module.clone())
                    .or_default()
                    .entry(target)
                    .or_default()
                    .insert(rel.clone());
            }
        }
    }
    deps
}

/// One cycle of the graph, as `a → b → ... → a` with a file behind each edge; `None` if the
/// graph is acyclic.
fn find_cycle(deps: &Deps) -> Option<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        n: &str,
        deps: &Deps,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(n.to_string(), Mark::Open);
        stack.push(n.to_string());
        for next in deps.get(n).map(|d| d.keys()).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let at = stack.iter().position(|s| s == next).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(next, deps, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(n.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in deps.keys() {
        if marks.get(n).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(cycle) = visit(n, deps, &mut marks, &mut Vec::new()) {
                let edges: Vec<String> = cycle
                    .windows(2)
                    .map(|w| {
                        let files = &deps[&w[0]][&w[1]];
                        format!("{} → {} ({})", w[0], w[1], files.iter().next().unwrap())
                    })
                    .collect();
                return Some(edges.join(", "));
            }
        }
    }
    None
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let deps = module_deps();
    // The scan sees the crate: the interpreter uses the ops and the jobs use the search.
    assert!(deps["exec"].contains_key("ops"), "{deps:?}");
    assert!(deps["jobs"].contains_key("search"), "{deps:?}");
    if let Some(cycle) = find_cycle(&deps) {
        panic!("import cycle between top-level modules: {cycle}");
    }
}

/// Terminal words the library must not use, with the code they were found in.
fn terminal_uses(code: &str) -> Vec<&'static str> {
    ["eprint", "println!", "print!", "indicatif", "clap"]
        .into_iter()
        .filter(|w| {
            code.match_indices(w).any(|(k, _)| {
                // A word starts at an identifier boundary (`print!` inside `eprint!` is
                // reported as `eprint`); `clap` and `indicatif` are whole words.
                let b = code.as_bytes();
                let before_ok = k == 0 || !(b[k - 1].is_ascii_alphanumeric() || b[k - 1] == b'_');
                let after = k + w.len();
                let whole_word = *w == "clap" || *w == "indicatif";
                let after_ok = !whole_word
                    || after >= b.len()
                    || !(b[after].is_ascii_alphanumeric() || b[after] == b'_');
                before_ok && after_ok
            })
        })
        .collect()
}

#[test]
fn library_does_not_print_or_use_terminal_crates() {
    let src = src_dir();
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let mut found = Vec::new();
    for p in &paths {
        let rel = p.strip_prefix(&src).unwrap();
        let code = code_only(&std::fs::read_to_string(p).unwrap());
        for w in terminal_uses(&code) {
            found.push(format!("{}: {w}", rel.display()));
        }
    }
    assert!(paths.len() > 20, "only {} library files found", paths.len());
    assert!(
        found.is_empty(),
        "printing or terminal crates outside the CLI crate (crates/cli):\n{}",
        found.join("\n")
    );
    // The scanner sees printing where it is: in the CLI crate.
    let mut cli = Vec::new();
    rust_files(&cli_dir(), &mut cli);
    assert!(
        cli.iter().any(|p| {
            let code = code_only(&std::fs::read_to_string(p).unwrap());
            terminal_uses(&code).contains(&"println!")
        }),
        "no println! found in crates/cli: the scan looks in the wrong place"
    );
    let manifest = std::fs::read_to_string(crate::common::repo_root().join("Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|d| d.split("\n[").next())
        .expect("the library's [dependencies]");
    for terminal in ["clap", "indicatif", "anyhow"] {
        assert!(
            !deps.lines().any(|l| l.starts_with(&format!("{terminal} "))),
            "the library depends on {terminal}"
        );
    }
}

/// The functions of formatted Rust source longer than `limit` lines: (name, lines). A function
/// starts at a line `fn name` (any visibility) and ends at the first line that is its
/// indentation followed by `}`.
fn long_functions(src: &str, limit: usize) -> Vec<(String, usize)> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = Vec::new();
    for (k, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = line.len() - body.len();
        let decl = ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn "]
            .iter()
            .find_map(|p| body.strip_prefix(p));
        let Some(decl) = decl else { continue };
        if body.ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let Some(end) = lines[k..].iter().position(|l| *l == close) else {
            continue;
        };
        if end + 1 > limit {
            let name: String = decl
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push((name, end + 1));
        }
    }
    out
}

#[test]
fn the_cli_is_thin() {
    let dir = cli_dir();
    let mut paths = Vec::new();
    rust_files(&dir, &mut paths);
    assert!(paths.len() > 10, "only {} CLI files found", paths.len());
    let mut found = Vec::new();
    for p in &paths {
        let text = std::fs::read_to_string(p).unwrap();
        let rel = p.strip_prefix(&dir).unwrap().display();
        let n = text.lines().count();
        if n > 300 {
            found.push(format!("{rel}: {n} lines (at most 300)"));
        }
        for (name, lines) in long_functions(&text, 150) {
            found.push(format!("{rel}: fn {name} is {lines} lines (at most 150)"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn long_functions_are_found() {
    let body = "    x();\n".repeat(5);
    let src = format!("fn short() {{\n}}\npub fn long(\n    a: u8,\n) {{\n{body}}}\nimpl A {{\n    pub(super) fn inner() {{\n{body}    }}\n}}\n");
    assert_eq!(
        long_functions(&src, 6),
        vec![("long".to_string(), 9), ("inner".to_string(), 7)]
    );
    assert!(long_functions(&src, 9).is_empty());
}

#[test]
fn scanners_find_what_they_look_for() {
    // Comments and literals are not code.
    let code = code_only(
        "use crate::a; // crate::b\n/* crate::c */ let s = \"crate::d {\"; let c = '{';\n\
         fn f<'x>() { crate::{e, f::{g, h}}::x(); $crate::i!(); mycrate::j(); }",
    );
    assert_eq!(crate_refs(&code), ["a", "e", "f", "i"]);
    // Test items are left out, test-only module files are named.
    let (code, files) = without_test_items(&code_only(
        "use crate::a;\n#[cfg(test)]\nmod tests { use crate::b; fn x() { if y { crate::c(); } } }\n\
         #[cfg(test)]\nmod more;\nfn z() { crate::d::e(); }",
    ));
    assert_eq!(crate_refs(&code), ["a", "d"]);
    assert_eq!(files, ["more"]);
    // A cycle is found and named; an acyclic graph passes.
    let edge = |deps: &mut Deps, a: &str, b: &str| {
        deps.entry(a.into())
            .or_default()
            .entry(b.into())
            .or_default()
            .insert(format!("src/{a}.rs"));
    };
    let mut deps = Deps::new();
    edge(&mut deps, "data", "tensor");
    edge(&mut deps, "exec", "data");
    edge(&mut deps, "exec", "tensor");
    assert_eq!(find_cycle(&deps), None);
    edge(&mut deps, "data", "exec");
    let cycle = find_cycle(&deps).expect("a cycle");
    assert!(
        cycle.contains("data → exec") && cycle.contains("exec → data"),
        "{cycle}"
    );
    // Terminal words.
    assert_eq!(
        terminal_uses(&code_only(
            "eprintln!(\"x\"); print!(\"y\"); let b = indicatif::ProgressBar::new(1); \
             #[derive(clap::ValueEnum)] struct S; // println!"
        )),
        ["eprint", "print!", "indicatif", "clap"]
    );
    assert!(terminal_uses(&code_only("fn reprint() {} let clapper = 1; // eprint")).is_empty());
}
