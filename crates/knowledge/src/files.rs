//! Reading data files: directory listings in a stable order and TOML with file-named errors.

use crate::error::KnowledgeError;
use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// The `*.toml` files directly inside `dir`, sorted by name; an absent directory is empty, so
/// a pack may leave out a section.
pub(crate) fn toml_files(dir: &Path) -> Result<Vec<PathBuf>, KnowledgeError> {
    if !dir.is_dir() {
        return Ok(Vec::new());
    }
    let io = |source| KnowledgeError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "toml") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

pub(crate) fn read_text(path: &Path) -> Result<String, KnowledgeError> {
    std::fs::read_to_string(path).map_err(|source| KnowledgeError::Io {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn read_toml<T: DeserializeOwned>(path: &Path) -> Result<T, KnowledgeError> {
    parse_toml(path, &read_text(path)?)
}

/// `text`, the contents of `path`, as TOML; the error names the file (toml's own message has
/// the line and column).
pub(crate) fn parse_toml<T: DeserializeOwned>(
    path: &Path,
    text: &str,
) -> Result<T, KnowledgeError> {
    toml::from_str(text).map_err(|source| KnowledgeError::Toml {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}

/// The 1-based lines on which a table header such as `[[action]]` stands, in order: the
/// `i`-th is where the `i`-th table of that array starts.
pub(crate) fn header_lines(text: &str, header: &str) -> Vec<usize> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| {
            let l = l.trim_start();
            l.strip_prefix(header).is_some_and(|rest| {
                rest.trim_start().is_empty() || rest.trim_start().starts_with('#')
            })
        })
        .map(|(n, _)| n + 1)
        .collect()
}
