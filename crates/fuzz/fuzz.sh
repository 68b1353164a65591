#!/usr/bin/env bash
# Coverage-guided fuzzing of ksearch on the stable toolchain: libFuzzer (the libfuzzer-sys
# crate) with LLVM SanitizerCoverage inserted through stable codegen flags (-C passes and
# -C llvm-args), so neither nightly nor cargo-fuzz is needed. There is no AddressSanitizer
# (that needs -Z sanitizer); the targets are safe Rust, where the bugs are panics, and
# overflow checks and debug assertions are on.
#
#   crates/fuzz/fuzz.sh build                    # build the instrumented binary only
#   crates/fuzz/fuzz.sh TARGET [SECONDS] [ARGS]  # fuzz task_toml|wm_patch|llm_reply (default 600 s)
#   crates/fuzz/fuzz.sh merge TARGET             # add inputs that cover new edges to the corpus
#
# New inputs go to target/fuzz-work/TARGET (not committed), crashes to
# target/fuzz-crashes/TARGET. A crash is fixed with a regression test, and its minimised
# input (ksearch-fuzz-libfuzzer ... -minimize_crash=1) is added to corpus/TARGET/ as
# regress-<what>, which tests/corpus.rs replays in CI.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
triple=$(rustc -vV | sed -n 's/^host: //p')
# Instrumented artefacts live apart from the normal build; --target keeps the flags off build
# scripts and proc macros (they would not link without the libFuzzer runtime).
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$root/target/fuzz}"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks --cfg fuzzing"
bin="$CARGO_TARGET_DIR/$triple/release/ksearch-fuzz"

build() {
    (cd "$root" && cargo build --release --target "$triple" -p ksearch-fuzz --features libfuzzer \
        --bin ksearch-fuzz)
}

case "${1:-}" in
build)
    build
    ;;
merge)
    target=${2:?usage: fuzz.sh merge TARGET}
    build
    # Adds to the committed corpus the new inputs that cover edges it does not (edges only:
    # keeping every counter feature would add thousands of files).
    KSEARCH_FUZZ_TARGET=$target "$bin" -merge=1 -use_counters=0 -use_cmp=0 \
        "$here/corpus/$target" "$root/target/fuzz-work/$target"
    ;;
task_toml | wm_patch | llm_reply)
    target=$1
    seconds=${2:-600}
    shift $(($# < 2 ? $# : 2))
    build
    work="$root/target/fuzz-work/$target"
    crashes="$root/target/fuzz-crashes/$target"
    mkdir -p "$work" "$crashes"
    KSEARCH_FUZZ_TARGET=$target "$bin" "$work" "$here/corpus/$target" \
        -dict="$here/dict/$target.dict" -max_total_time="$seconds" -max_len=16384 \
        -timeout=10 -rss_limit_mb=4096 -artifact_prefix="$crashes/" -print_final_stats=1 "$@"
    ;;
*)
    sed -n '2,16p' "${BASH_SOURCE[0]}"
    exit 2
    ;;
esac
