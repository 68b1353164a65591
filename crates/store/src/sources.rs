//! Content-addressed candidate sources: `sources/<blake3>.<ext>`.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::StoreError;

/// The blake3 hex digest of a source text; also its file name stem.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SourceId(String);

impl SourceId {
    pub fn of(code: &str) -> SourceId {
        SourceId(blake3::hash(code.as_bytes()).to_hex().to_string())
    }

    /// Accepts only a well-formed digest, since ids become file names.
    pub fn parse(s: &str) -> Result<SourceId, StoreError> {
        let ok = s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if ok {
            Ok(SourceId(s.to_string()))
        } else {
            Err(StoreError::InvalidSourceId(s.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for SourceId {
    type Error = StoreError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        SourceId::parse(&s)
    }
}

impl From<SourceId> for String {
    fn from(id: SourceId) -> String {
        id.0
    }
}

/// Extensions become part of a file name: keep them to a short alphanumeric word.
pub(crate) fn check_ext(ext: &str) -> Result<(), StoreError> {
    let ok = (1..=16).contains(&ext.len()) && ext.bytes().all(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidExtension(ext.to_string()))
    }
}

pub(crate) fn source_path(dir: &Path, id: &SourceId, ext: &str) -> PathBuf {
    dir.join(format!("{}.{}", id.as_str(), ext))
}

/// Makes `sources/<id>.<ext>` hold `code`, durably, before the caller commits a row naming it.
/// The text goes to a temp file in the same directory, is synced, and renamed into place; then
/// the directory is synced so the rename itself survives. A crash leaves at worst a stray
/// `.partial-*` file, never a truncated source under its final name.
pub(crate) fn write_source(
    dir: &Path,
    id: &SourceId,
    ext: &str,
    code: &str,
) -> Result<(), StoreError> {
    let path = source_path(dir, id, ext);
    if path.is_file() {
        // Same name means same content (renames are atomic and the file was synced first).
        return Ok(());
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".partial-")
        .tempfile_in(dir)
        .map_err(|e| StoreError::io(dir, e))?;
    tmp.write_all(code.as_bytes())
        .and_then(|()| tmp.as_file().sync_all())
        .map_err(|e| StoreError::io(tmp.path(), e))?;
    tmp.persist(&path)
        .map_err(|e| StoreError::io(&path, e.error))?;
    sync_dir(dir)
}

pub(crate) fn read_source(path: &Path, id: &SourceId) -> Result<String, StoreError> {
    let code = std::fs::read_to_string(path).map_err(|e| StoreError::io(path, e))?;
    let actual = SourceId::of(&code);
    if &actual != id {
        return Err(StoreError::SourceCorrupt {
            path: path.to_path_buf(),
            actual: actual.0,
        });
    }
    Ok(code)
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| StoreError::io(dir, e))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), StoreError> {
    // Directories cannot be opened for syncing here; the rename is still atomic.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_blake3_hex_and_validated() {
        let id = SourceId::of("int main(){}");
        assert_eq!(id.as_str(), blake3::hash(b"int main(){}").to_hex().as_str());
        assert_eq!(SourceId::parse(id.as_str()).unwrap(), id);
        for bad in [
            "",
            "../../etc/passwd",
            &id.as_str().to_uppercase(),
            &id.as_str()[1..],
        ] {
            assert!(SourceId::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert!(serde_json::from_str::<SourceId>("\"../x\"").is_err());
    }

    #[test]
    fn extensions_are_checked() {
        for ok in ["c", "cu", "py", "metal", "cpp"] {
            check_ext(ok).unwrap();
        }
        for bad in ["", ".c", "c/../x", "a b", "x".repeat(17).as_str()] {
            assert!(check_ext(bad).is_err(), "{bad:?} accepted");
        }
    }
}
