//! Replays every corpus entry of every fuzz target (seeds and minimised crashes): none may
//! panic. This is how CI runs the fuzzers; campaigns run outside CI with `fuzz.sh`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use ksearch_fuzz::{corpus_files, Target};

fn replay(target: Target) {
    let files = corpus_files(&target.corpus_dir());
    assert!(
        files.len() >= 3,
        "the {} corpus is missing or nearly empty",
        target.name()
    );
    let started = Instant::now();
    let mut failures = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| target.run(&data))) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("{}: {why}", f.display()));
        }
    }
    eprintln!(
        "{}: {} inputs in {:.2} s",
        target.name(),
        files.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn task_toml_corpus() {
    replay(Target::TaskToml);
}

#[test]
fn wm_patch_corpus() {
    replay(Target::WmPatch);
}

#[test]
fn llm_reply_corpus() {
    replay(Target::LlmReply);
}
