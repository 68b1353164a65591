//! ksearch-assets: where the data shipped with ksearch lives on disk.
//!
//! The built-in tasks, knowledge packs, the Python harness and the Python of the whole-model
//! Mamba bench are embedded in the binary so an installed `ksearch` works from any directory.
//! Child processes (the harness, the bench) need them as real files, so this crate resolves each
//! asset tree to a directory:
//!
//! 1. `$KSEARCH_ROOT/<tree>` when `KSEARCH_ROOT` is set (development, tests);
//! 2. the checkout the binary was built from, when it still exists (so edits to `tasks/` or
//!    `harness/` take effect without a rebuild), unless [`NO_CHECKOUT_VAR`] is set;
//! 3. otherwise the embedded copy, extracted once into the cache under a content hash, so two
//!    versions of ksearch never share a stale copy.

use include_dir::{include_dir, Dir, DirEntry, File};
use std::path::{Path, PathBuf};

static TASKS: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../../tasks");
static KNOWLEDGE: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../../knowledge");
static HARNESS: Dir<'_> = include_dir!("$CARGO_MANIFEST_DIR/../../harness");

/// A tree of chosen files of one checkout directory (`include_dir!` takes a whole directory, and
/// `gpu/mamba` also holds tests, fixtures and emulators that the bench never imports), plus
/// files from elsewhere in the checkout under a name of their own. rustc tracks
/// `include_bytes!` files itself, so an edit to one is picked up without build.rs.
macro_rules! chosen_files {
    ($dir:literal: $($name:literal),+ ; $($extra:literal = $path:literal),*) => {
        Dir::new("", &[
            $(DirEntry::File(File::new(
                $name,
                include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../", $dir, "/", $name)),
            )),)+
            $(DirEntry::File(File::new(
                $extra,
                include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../", $path)),
            )),)*
        ])
    };
}

/// What `ksearch bench mamba` runs: bench.py and the modules it imports at run time (the model,
/// its kernels and its named family settings), the MLX settings probe, the pick rule both
/// share (steady_pick.py), and the client through which it asks the running ksearch for the
/// selective-scan family's renders (gpu/ in a checkout, beside the others here).
static MAMBA_BENCH: Dir<'_> = chosen_files!("gpu/mamba":
    "bench.py",
    "mamba_model.py",
    "model_kernels.py",
    "variants.toml",
    "mlx_env_probe.py",
    "steady_pick.py";
    "ksearch_render.py" = "gpu/ksearch_render.py"
);

/// Set (to anything but empty or `0`), step 2 of the lookup is skipped: the binary behaves as
/// an installed copy far from any checkout. For tests of the embedded assets.
pub const NO_CHECKOUT_VAR: &str = "KSEARCH_NO_SOURCE_CHECKOUT";

/// An asset tree shipped with ksearch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tree {
    Tasks,
    Knowledge,
    Harness,
    /// The Python of `ksearch bench mamba` (`gpu/mamba` in a checkout, only the files it runs).
    MambaBench,
}

impl Tree {
    /// Where the tree is in a checkout, relative to its root.
    pub fn dir_name(self) -> &'static str {
        match self {
            Tree::Tasks => "tasks",
            Tree::Knowledge => "knowledge",
            Tree::Harness => "harness",
            Tree::MambaBench => "gpu/mamba",
        }
    }

    /// The prefix of the tree's extracted copy in the cache (one path component).
    fn cache_name(self) -> &'static str {
        match self {
            Tree::MambaBench => "mamba-bench",
            other => other.dir_name(),
        }
    }

    fn embedded(self) -> &'static Dir<'static> {
        match self {
            Tree::Tasks => &TASKS,
            Tree::Knowledge => &KNOWLEDGE,
            Tree::Harness => &HARNESS,
            Tree::MambaBench => &MAMBA_BENCH,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    #[error("cannot extract the built-in {tree} into {path}: {source}")]
    Extract {
        tree: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("KSEARCH_ROOT={root} has no `{tree}` directory")]
    MissingInRoot { root: PathBuf, tree: &'static str },
}

/// The cache directory of ksearch: `$KSEARCH_CACHE_DIR`, else `$XDG_CACHE_HOME/ksearch`, else
/// `~/.cache/ksearch`, else a directory under the system temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KSEARCH_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("ksearch");
    }
    if let Some(home) = std::env::var_os("HOME") {
        return PathBuf::from(home).join(".cache").join("ksearch");
    }
    std::env::temp_dir().join("ksearch-cache")
}

/// The checkout this binary was built from, if it is still on disk and [`NO_CHECKOUT_VAR`] is
/// not set.
pub fn source_checkout() -> Option<PathBuf> {
    let off = std::env::var_os(NO_CHECKOUT_VAR).is_some_and(|v| !v.is_empty() && v != "0");
    if off {
        return None;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = root.canonicalize().ok()?;
    root.join("Cargo.toml").is_file().then_some(root)
}

/// Resolves `tree` to a directory on disk (see the crate docs for the order).
pub fn locate(tree: Tree) -> Result<PathBuf, AssetError> {
    if let Some(root) = std::env::var_os("KSEARCH_ROOT") {
        let root = PathBuf::from(root);
        let dir = root.join(tree.dir_name());
        return if dir.is_dir() {
            Ok(dir)
        } else {
            Err(AssetError::MissingInRoot {
                root,
                tree: tree.dir_name(),
            })
        };
    }
    if let Some(root) = source_checkout() {
        let dir = root.join(tree.dir_name());
        if dir.is_dir() {
            return Ok(dir);
        }
    }
    extract(tree, &cache_dir())
}

/// Extracts the embedded copy of `tree` under `cache`, keyed by its content hash; returns the
/// directory. Extraction goes to a temporary sibling first and is renamed into place, so a
/// crash never leaves a half-written tree that later runs would trust.
pub fn extract(tree: Tree, cache: &Path) -> Result<PathBuf, AssetError> {
    let dir = tree.embedded();
    let target = cache
        .join("assets")
        .join(format!("{}-{}", tree.cache_name(), content_hash(dir)));
    if target.is_dir() {
        return Ok(target);
    }
    let err = |source| AssetError::Extract {
        tree: tree.dir_name(),
        path: target.clone(),
        source,
    };
    let parent = target.parent().expect("target has a parent");
    std::fs::create_dir_all(parent).map_err(err)?;
    let tmp = parent.join(format!(".{}-tmp-{}", tree.cache_name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(err)?;
    dir.extract(&tmp).map_err(err)?;
    match std::fs::rename(&tmp, &target) {
        Ok(()) => Ok(target),
        // Another process extracted the same content first: theirs is as good as ours.
        Err(_) if target.is_dir() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(target)
        }
        Err(e) => Err(err(e)),
    }
}

fn content_hash(dir: &Dir<'_>) -> String {
    let mut files = Vec::new();
    collect(dir, &mut files);
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hasher = blake3::Hasher::new();
    for (path, contents) in files {
        hasher.update(path.as_bytes());
        hasher.update(&[0]);
        hasher.update(&(contents.len() as u64).to_le_bytes());
        hasher.update(contents);
    }
    hasher.finalize().to_hex()[..16].to_string()
}

fn collect<'a>(dir: &'a Dir<'a>, out: &mut Vec<(String, &'a [u8])>) {
    for file in dir.files() {
        out.push((file.path().to_string_lossy().into_owned(), file.contents()));
    }
    for sub in dir.dirs() {
        collect(sub, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_is_keyed_by_content_and_idempotent() {
        let cache = tempfile::tempdir().unwrap();
        let first = extract(Tree::Harness, cache.path()).unwrap();
        let second = extract(Tree::Harness, cache.path()).unwrap();
        assert_eq!(first, second);
        assert!(first
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("harness-"));
        // The extracted tree holds the same files as the embedded one.
        let mut embedded = Vec::new();
        collect(Tree::Harness.embedded(), &mut embedded);
        for (path, contents) in embedded {
            assert_eq!(
                std::fs::read(first.join(&path)).unwrap(),
                contents,
                "{path}"
            );
        }
    }

    #[test]
    fn the_mamba_bench_tree_holds_the_chosen_files_as_in_the_checkout() {
        let cache = tempfile::tempdir().unwrap();
        let dir = extract(Tree::MambaBench, cache.path()).unwrap();
        assert_eq!(dir.parent().unwrap(), cache.path().join("assets"));
        assert!(dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("mamba-bench-"));
        let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../gpu/mamba");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "bench.py",
                "ksearch_render.py",
                "mamba_model.py",
                "mlx_env_probe.py",
                "model_kernels.py",
                "steady_pick.py",
                "variants.toml"
            ]
        );
        for name in names {
            let source = match name.as_str() {
                "ksearch_render.py" => checkout.join("../ksearch_render.py"),
                _ => checkout.join(&name),
            };
            assert_eq!(
                std::fs::read(dir.join(&name)).unwrap(),
                std::fs::read(source).unwrap(),
                "{name}"
            );
        }
    }
}
