//! The repository's documentation points at files that exist: every relative link in a Markdown
//! file, and every `docs/results/…` path named in docs, sources, scripts and task files (a
//! result cited anywhere must be a file in the tree, not a memory of one).

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
        if file.ends_with("tests/docs.rs") {
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
