//! What the repository promises about itself: its documentation points at files that exist
//! (every relative link in a Markdown file, and every `docs/results/…` path named in docs,
//! sources, scripts and task files: a result cited anywhere must be a file in the tree, not a
//! memory of one); results live in topic folders; and no crate's source files import each
//! other in a cycle (data flows one way inside a crate too).

mod common;
use common::workspace_root;
use std::path::{Path, PathBuf};

/// Directories never scanned: build output, caches, git's own, and fixtures that are copies of
/// other releases' files.
const SKIP_DIRS: &[&str] = &[
    "target",
    ".git",
    "node_modules",
    "__pycache__",
    ".pytest_cache",
    ".device-carry",
    "fixtures",
    "runs",
];

/// Files whose text may name a result.
const TEXT_EXTENSIONS: &[&str] = &["md", "rs", "py", "sh", "toml", "j2", "txt"];

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !SKIP_DIRS.contains(&name.as_ref()) && !name.starts_with('.') {
                files_under(&path, out);
            }
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| TEXT_EXTENSIONS.contains(&e))
        {
            out.push(path);
        }
    }
}

fn repo_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    files_under(&workspace_root(), &mut files);
    files.sort();
    files
}

/// The targets of inline Markdown links `[text](target)` and images, with their line numbers.
fn markdown_links(text: &str) -> Vec<(usize, String)> {
    let mut links = Vec::new();
    let mut in_fence = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].split_whitespace().next().unwrap_or("");
            links.push((n + 1, target.to_string()));
            rest = &after[end..];
        }
    }
    links
}

/// Whether a link target is a path in this repository (not a URL, mail address or an anchor
/// within the same page).
fn is_local(target: &str) -> bool {
    !(target.is_empty()
        || target.starts_with('#')
        || target.contains("://")
        || target.starts_with("mailto:"))
}

/// Every `docs/results/<path>` named in a text, with its line number; the path ends at the
/// first character that cannot be part of a file name in this tree.
fn result_paths(text: &str) -> Vec<(usize, String)> {
    const PREFIX: &str = "docs/results/";
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find(PREFIX) {
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || "-_./".contains(c)))
                .unwrap_or(tail.len());
            let path = tail[..len].trim_end_matches(['.', '/']);
            // A path that stops at the prefix, or names a pattern, is prose, not a citation.
            if path.len() > PREFIX.len() && !tail[len..].starts_with(['<', '*', '{']) {
                found.push((n + 1, path.to_string()));
            }
            rest = &tail[len..];
        }
    }
    found
}

#[test]
fn every_relative_link_in_the_docs_resolves_to_a_file() {
    let root = workspace_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in repo_files()
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "md"))
    {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, target) in markdown_links(&text) {
            if !is_local(&target) {
                continue;
            }
            let path = target.split('#').next().unwrap_or("");
            let resolved = file.parent().unwrap().join(path);
            checked += 1;
            if !resolved.exists() {
                broken.push(format!(
                    "{}:{line}: {target}",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} relative links seen: is the scan finding the docs?"
    );
    assert!(
        broken.is_empty(),
        "links to missing files:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_cited_result_is_a_file_in_docs_results() {
    let root = workspace_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in repo_files() {
        if file.ends_with("tests/repository.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (line, path) in result_paths(&text) {
            checked += 1;
            if !root.join(&path).exists() {
                broken.push(format!(
                    "{}:{line}: {path}",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} result citations seen: is the scan finding them?"
    );
    assert!(
        broken.is_empty(),
        "results cited but not in the tree:\n{}",
        broken.join("\n")
    );
}

#[test]
fn results_are_topic_folders_of_a_readme_and_compressed_raw_data() {
    let results = workspace_root().join("docs/results");
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&results).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !path.is_dir() {
            problems.push(format!("{name}: a file outside a topic folder"));
            continue;
        }
        if !path.join("README.md").is_file() {
            problems.push(format!("{name}/: no README.md"));
        }
        for file in std::fs::read_dir(&path).unwrap().flatten() {
            let file_name = file.file_name().to_string_lossy().into_owned();
            if file_name != "README.md" && !file_name.ends_with(".gz") {
                problems.push(format!(
                    "{name}/{file_name}: raw data is stored compressed (.gz)"
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/results layout:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_scanners_find_what_they_look_for() {
    let text = "see [a](docs/x.md#y) and ![i](img.png), [web](https://e.org)\n\
                ```\n[fenced](nope.md)\n```\n\
                cited in docs/results/scores/README.md. and `docs/results/<topic>/`";
    let links: Vec<String> = markdown_links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(links, ["docs/x.md#y", "img.png", "https://e.org"]);
    assert!(!is_local("https://e.org") && !is_local("#anchor") && is_local("a/b.md"));
    assert_eq!(
        result_paths(text),
        [(5, "docs/results/scores/README.md".to_string())]
    );
}

/// The module path of a source file of a crate (`src/a/mod.rs` → `a`, `src/a/b.rs` → `a::b`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// `crate::…` and `super::…` paths in the non-test code of a source file.
fn paths_used(text: &str) -> Vec<(bool, Vec<String>)> {
    let code = text.split("#[cfg(test)]").next().unwrap_or("");
    let mut found = Vec::new();
    for (prefix, is_crate) in [("crate::", true), ("super::", false)] {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &code[at + prefix.len()..];
            // `crate::{a, b::c}`: the first segment of each item of the group.
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(group.len())];
                for item in inner.split(',') {
                    let first = item.trim().split("::").next().unwrap_or("").trim();
                    if !first.is_empty() {
                        found.push((is_crate, vec![first.to_string()]));
                    }
                }
                continue;
            }
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            let segs = rest[..end]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            found.push((is_crate, segs));
        }
    }
    found
}

#[test]
fn no_crate_has_source_files_that_import_each_other_in_a_cycle() {
    let root = workspace_root().join("crates");
    let mut cycles = Vec::new();
    for krate in std::fs::read_dir(&root).unwrap().flatten() {
        let src = krate.path().join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = Vec::new();
        files_under(&src, &mut files);
        files.retain(|f| f.extension().is_some_and(|e| e == "rs"));
        let modules: std::collections::BTreeMap<String, &PathBuf> =
            files.iter().map(|f| (module_of(&src, f), f)).collect();
        let mut edges: std::collections::BTreeMap<&str, std::collections::BTreeSet<String>> =
            Default::default();
        for (module, file) in &modules {
            let text = std::fs::read_to_string(file).unwrap();
            for (is_crate, segs) in paths_used(&text) {
                let full: Vec<String> = if is_crate {
                    segs
                } else {
                    let mut parent: Vec<String> = module
                        .split("::")
                        .filter(|s| !s.is_empty())
                        .map(String::from)
                        .collect();
                    parent.pop();
                    parent.extend(segs);
                    parent
                };
                // The longest prefix that names a file of the crate; a file's own children
                // and ancestors (re-exports, `super::`) are not edges between peers.
                // Paths through the crate root's re-exports name no file.
                let target = (1..=full.len())
                    .rev()
                    .map(|k| full[..k].join("::"))
                    .find(|m| modules.contains_key(m));
                if let Some(t) = target {
                    let related = t == *module
                        || module.starts_with(&format!("{t}::"))
                        || t.starts_with(&format!("{module}::"));
                    if !related {
                        edges.entry(module.as_str()).or_default().insert(t);
                    }
                }
            }
        }
        // Depth-first search for a back edge.
        fn visit<'a>(
            m: &'a str,
            edges: &'a std::collections::BTreeMap<&str, std::collections::BTreeSet<String>>,
            state: &mut std::collections::BTreeMap<&'a str, u8>,
            stack: &mut Vec<&'a str>,
            found: &mut Vec<String>,
        ) {
            state.insert(m, 1);
            stack.push(m);
            for next in edges.get(m).into_iter().flatten() {
                match state.get(next.as_str()) {
                    Some(1) => {
                        let at = stack.iter().position(|s| *s == next).unwrap_or(0);
                        found.push(format!("{} -> {next}", stack[at..].join(" -> ")));
                    }
                    Some(_) => {}
                    None => visit(next, edges, state, stack, found),
                }
            }
            stack.pop();
            state.insert(m, 2);
        }
        let mut state = std::collections::BTreeMap::new();
        let mut found = Vec::new();
        for m in modules.keys() {
            if !state.contains_key(m.as_str()) {
                visit(m, &edges, &mut state, &mut Vec::new(), &mut found);
            }
        }
        let name = krate.file_name().to_string_lossy().into_owned();
        cycles.extend(found.into_iter().map(|c| format!("{name}: {c}")));
    }
    assert!(
        cycles.is_empty(),
        "source files importing each other:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_check_sees_crate_and_super_paths() {
    let text = "use crate::a::b::{C, D};\nuse super::sibling;\nfn f() { crate::x::y(); }\n\
                use crate::{p, q::r};\n\
                #[cfg(test)]\nmod tests { use crate::z; }";
    let used = paths_used(text);
    assert!(
        used.contains(&(true, vec!["a".into(), "b".into()])),
        "{used:?}"
    );
    assert!(used.contains(&(false, vec!["sibling".into()])));
    assert!(used.contains(&(true, vec!["x".into(), "y".into()])));
    assert!(used.contains(&(true, vec!["p".into()])) && used.contains(&(true, vec!["q".into()])));
    assert!(!used
        .iter()
        .any(|(_, s)| s.first().is_some_and(|x| x == "z")));
    let src = Path::new("/k/src");
    assert_eq!(module_of(src, Path::new("/k/src/lib.rs")), "");
    assert_eq!(module_of(src, Path::new("/k/src/a/mod.rs")), "a");
    assert_eq!(module_of(src, Path::new("/k/src/a/b.rs")), "a::b");
}
