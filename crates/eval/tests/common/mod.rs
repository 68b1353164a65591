//! What the evaluator's tests that run the real harness share: the checkout and an
//! interpreter that has numpy.

use std::path::{Path, PathBuf};

/// The repository root (tasks/, harness/, gpu/).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A Python that can run the real harness (numpy): `KSEARCH_TEST_PYTHON`, else `python3`;
/// `None`, with the reason printed, when it cannot import numpy.
pub fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("KSEARCH_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("python3"));
    let ok = std::process::Command::new(&candidate)
        .args(["-c", "import numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!(
            "skipped: {} cannot import numpy (set KSEARCH_TEST_PYTHON)",
            candidate.display()
        );
    }
    ok.then_some(candidate)
}
