//! A directory of cached replies keyed by (provider, model, request).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::{ChatRequest, LlmError, Usage};

const CACHE_VERSION: u32 = 1;

/// What a cache file holds. No keys, no headers: only the reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheEntry {
    pub version: u32,
    pub provider: String,
    pub requested_model: String,
    pub request_hash: String,
    pub text: String,
    pub model: String,
    pub usage: Usage,
    /// What the original call cost (a hit costs nothing).
    pub original_cost_usd: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
}

/// One JSON file per reply, under `<dir>/<first two hex digits>/<key>.json`.
/// Files are written to a temporary name and renamed, so concurrent writers
/// and crashes never leave a half-written entry.
#[derive(Debug)]
pub struct ResponseCache {
    dir: PathBuf,
    counter: AtomicU64,
}

impl ResponseCache {
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, LlmError> {
        let dir = dir.into();
        fs::create_dir_all(&dir)
            .map_err(|e| LlmError::io(format!("creating cache dir {}", dir.display()), e))?;
        Ok(ResponseCache {
            dir,
            counter: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key of `req` sent to `model` through `provider`.
    pub fn key(provider: &str, model: &str, req: &ChatRequest) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"ksearch-llm/cache/v1\0");
        h.update(provider.as_bytes());
        h.update(b"\0");
        h.update(model.as_bytes());
        h.update(b"\0");
        h.update(req.hash().as_bytes());
        h.finalize().to_hex().to_string()
    }

    fn path_of(&self, key: &str) -> PathBuf {
        let prefix = key.get(..2).unwrap_or("xx");
        self.dir.join(prefix).join(format!("{key}.json"))
    }

    /// The entry for `key`; unreadable or foreign entries count as misses.
    pub fn get(&self, key: &str) -> Option<CacheEntry> {
        let path = self.path_of(key);
        let text = fs::read_to_string(&path).ok()?;
        match serde_json::from_str::<CacheEntry>(&text) {
            Ok(e) if e.version == CACHE_VERSION => Some(e),
            Ok(_) => None,
            Err(err) => {
                log::warn!("ignoring unreadable cache entry {}: {err}", path.display());
                None
            }
        }
    }

    pub fn put(&self, key: &str, mut entry: CacheEntry) -> Result<(), LlmError> {
        entry.version = CACHE_VERSION;
        let path = self.path_of(key);
        let dir = path.parent().unwrap_or(&self.dir);
        fs::create_dir_all(dir)
            .map_err(|e| LlmError::io(format!("creating cache dir {}", dir.display()), e))?;
        let tmp = dir.join(format!(
            ".{key}.{}.{}.tmp",
            std::process::id(),
            self.counter.fetch_add(1, Ordering::Relaxed)
        ));
        let json = serde_json::to_vec(&entry)
            .map_err(|e| LlmError::Config(format!("cannot encode cache entry: {e}")))?;
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&json)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = fs::remove_file(&tmp);
            LlmError::io(format!("writing cache entry {}", path.display()), e)
        })
    }
}
