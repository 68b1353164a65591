//! `ksearch-fuzz`: built with `--features libfuzzer` (see `crates/fuzz/fuzz.sh`), it is a
//! libFuzzer binary whose target is chosen by `KSEARCH_FUZZ_TARGET` (task_toml, wm_patch,
//! llm_reply) and whose arguments are libFuzzer's. Without the feature it replays inputs:
//! `ksearch-fuzz TARGET [FILE|DIR]...` (default: the target's corpus), exit 1 if any panics.
#![cfg_attr(feature = "libfuzzer", no_main)]

use ksearch_fuzz::Target;

#[cfg(feature = "libfuzzer")]
mod engine {
    use super::Target;
    use std::sync::OnceLock;

    fn target() -> Target {
        static T: OnceLock<Target> = OnceLock::new();
        *T.get_or_init(|| {
            let name = std::env::var("KSEARCH_FUZZ_TARGET").unwrap_or_default();
            Target::from_name(&name).unwrap_or_else(|| {
                eprintln!("set KSEARCH_FUZZ_TARGET to task_toml, wm_patch or llm_reply");
                std::process::exit(2)
            })
        })
    }

    libfuzzer_sys::fuzz_target!(|data: &[u8]| target().run(data));
}

#[cfg(not(feature = "libfuzzer"))]
fn main() {
    use std::path::PathBuf;

    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(target) = args.first().and_then(|n| Target::from_name(n)) else {
        eprintln!("usage: ksearch-fuzz task_toml|wm_patch|llm_reply [FILE|DIR]...");
        std::process::exit(2);
    };
    let mut paths: Vec<PathBuf> = args[1..].iter().map(PathBuf::from).collect();
    if paths.is_empty() {
        paths.push(target.corpus_dir());
    }
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            files.extend(ksearch_fuzz::corpus_files(&p));
        } else {
            files.push(p);
        }
    }
    let mut failed = 0;
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        if std::panic::catch_unwind(|| target.run(&data)).is_err() {
            eprintln!("FAILED: {}", f.display());
            failed += 1;
        }
    }
    println!("{} inputs, {failed} failed", files.len());
    std::process::exit(i32::from(failed > 0));
}
