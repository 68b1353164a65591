#!/usr/bin/env bash
# Issue 20's device half: the tasks ksearch imports, evaluated and searched on the GPU. In one
# call, each step printed and its exit code kept (a failing step does not stop the others):
#   1. KernelBench: `ksearch import kernelbench` of both examples (the introspection runs the
#      problems with the image's PyTorch; compare the written task.toml's tensors with the
#      recordings under examples/kernelbench/introspected), then `ksearch tasks --check`.
#   2. FlashInfer-Bench: the GQA paged-decode example imported with its seed, family and
#      actions (--with), the seed evaluated (`ksearch eval --held-out`), then the offline
#      search (`ksearch run`, ROUNDS rounds, RUN_WALL_S seconds, --timing quick) and its
#      winner exported as a FlashInfer-Bench Solution and traces (`export --format flashinfer`).
#   3. Whether flashinfer / flashinfer_bench import here (to compare with FlashInfer's own
#      kernel and to run the exported Solution; the image has no network, so they are there or
#      not).
#
#   run(command="bash gpu/import_check.sh", timeout_s=600, carry=[".device-carry/ks"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack. Results in
# $OUT: kernelbench-*.toml, gqa-eval.json, run.json, show.txt, export/, log.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" import
EX=$ROOT/examples
step() { echo; echo "==== $*"; }

step "KernelBench imports"
for problem in "$EX"/kernelbench/level1/*.py; do
    stem=$(basename "$problem" .py)
    rm -rf "$WORK/kb-$stem"
    "$KS" import kernelbench "$problem" --out "$WORK/kb-$stem"
    echo "import exit code $?"
    cp "$WORK/kb-$stem/task.toml" "$OUT/kernelbench-$stem.toml"
    "$KS" tasks --check "$WORK/kb-$stem"
    echo "check exit code $?"
done

step "FlashInfer-Bench GQA decode: import, seed, search, export"
NAME=gqa_paged_decode_h32_kv4_d128_ps1
TASK=$WORK/gqa
rm -rf "$TASK" "$WORK/runs"
"$KS" import flashinfer "$EX/flashinfer-bench/definitions/gqa_paged/$NAME.json" \
    --workloads "$EX/flashinfer-bench/workloads/gqa_paged/$NAME.jsonl" \
    --with "$EX/flashinfer-bench/ksearch/$NAME" --out "$TASK"
echo "import exit code $?"
"$KS" eval --task "$TASK" --backend cuda --held-out --json "$TASK/seed/naive.cu" > "$OUT/gqa-eval.json"
echo "seed eval exit code $?"
"$KS" run --task "$TASK" --backend cuda --rounds "${ROUNDS:-12}" --cycle-cap 1 \
    --stagnation-window 1 --max-wall-time "${RUN_WALL_S:-300}" --timing quick \
    --seed "${SEARCH_SEED:-1}" --runs-dir "$WORK/runs" --json > "$OUT/run.json"
echo "run exit code $?"
RUN=$(ls -t "$WORK/runs" | head -n 1)
"$KS" show "$RUN" --runs-dir "$WORK/runs" > "$OUT/show.txt"
"$KS" export "$RUN" --runs-dir "$WORK/runs" --format flashinfer --out "$OUT/export"
echo "export exit code $?"

step "FlashInfer here?"
python3 - <<'PY'
import importlib.util
for name in ("flashinfer", "flashinfer_bench"):
    print(name, "present" if importlib.util.find_spec(name) else "absent")
PY
