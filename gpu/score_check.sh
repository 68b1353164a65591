#!/usr/bin/env bash
# Whether the scores the search ranks by can be trusted on this GPU (issue: scores you can
# trust), for one backend, in one device call:
#   1. one attention kernel evaluated five (EVALS) times in one `ksearch eval` (one
#      yardstick): each score with its interval, and their spread;
#   2. `ksearch bench` of the same kernel: its ratio to the native attention per workload next
#      to the evaluations' median speedup over the same native (the task's baseline);
#   3. the calibration task `copy`: a candidate making the baseline's own copy, three times in
#      one eval; the scores should be 1.00.
#
#   run(command="BACKEND=cuda bash gpu/score_check.sh", carry=[".device-carry/ks"])
#   with MLX (../shared/device): call 1 `bash .device-carry/mlx1/stash.sh`, then
#   run(command="source .device-carry/mlx2/assemble.sh && BACKEND=mlx bash gpu/score_check.sh",
#       carry=[".device-carry/mlx2", ".device-carry/ks"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack. KERNEL
# names the attention variant (gpu/attention/variants.toml). STEPS picks steps (default
# "eval bench copy", run in that order): a call that cannot fit all three in its 600 s runs
# them in two calls
# (STEPS="eval", then STEPS="bench copy" with EVAL_JSON pointing at the first call's eval.json,
# carried back as an untracked file, so the summary has both). mlx calls are timed by their
# device activity (docs/backends.md, "A device clock for MLX"; KSEARCH_HARNESS_MLX_CLOCK=wall for
# the wall clock); the summary says which clock each evaluation used. Results in $OUT: eval.json,
# bench.json, copy.json (eval.json and copy.json as JSON lines), summary.txt, log.txt.
set -uo pipefail

BACKEND=${BACKEND:?set BACKEND=cuda or BACKEND=mlx}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" score-check

case "$BACKEND" in
# The copy calibration: a candidate making the baseline's own copy, three times (cuda: the seed's
# cudaMemcpyAsync; mlx: mx.array(x), which the task allows), and on mlx the seed once more, whose
# mx.fast.cuda_kernel copy also weighs that call path's per-call cost.
cuda) COPIES=(tasks/copy/seed/copy.cu tasks/copy/seed/copy.cu tasks/copy/seed/copy.cu) ;;
mlx) NATIVE=tasks/copy/calibration/copy_mlx_native.py
    COPIES=("$NATIVE" "$NATIVE" "$NATIVE" tasks/copy/seed/copy_mlx.py) ;;
*) echo "unknown BACKEND $BACKEND" >&2; exit 2 ;;
esac
render_attention_kernel

run_eval() {
    local started=$SECONDS copies=()
    for _ in $(seq "${EVALS:-5}"); do copies+=("$F"); done
    "$KS" eval --task attention --backend "$BACKEND" --json-lines "${copies[@]}" > "$OUT/eval.json"
    echo "${EVALS:-5} evaluations took $((SECONDS - started)) s"
}
run_bench() {
    local started=$SECONDS
    "$KS" bench attention --backend "$BACKEND" --kernel "$F" --json > "$OUT/bench.json"
    echo "bench took $((SECONDS - started)) s"
}
run_copy() {
    local started=$SECONDS
    "$KS" eval --task copy --backend "$BACKEND" --json-lines "${COPIES[@]}" > "$OUT/copy.json"
    echo "copy calibration took $((SECONDS - started)) s"
}
# The steps run in the order STEPS names them (a call that may run out of time puts first what
# matters most).
STEPS=${STEPS:-eval bench copy}
for s in $STEPS; do
    case "$s" in
    eval | bench | copy) "run_$s" ;;
    *) echo "unknown step $s (eval, bench, copy)" >&2; exit 2 ;;
    esac
done
if [[ " $STEPS " != *" eval "* ]] && [ -n "${EVAL_JSON:-}" ]; then
    cp "$EVAL_JSON" "$OUT/eval.json"
fi

python3 - "$OUT" "$BACKEND" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
out, backend = sys.argv[1], sys.argv[2]
native = {"cuda": "sdpa", "mlx": "mlx"}[backend]

def evals(name):
    """A JSON document, or JSON lines (`ksearch eval --json-lines`: what finished before a
    call ran out of time)."""
    try:
        text = open(f"{out}/{name}").read()
        try:
            return json.loads(text)
        except ValueError:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        print(f"{name}: unreadable ({e})")
        return []

items = evals("eval.json")
scores = [i["result"].get("score") for i in items]
print(f"== {backend}: one kernel evaluated {len(items)} times against one yardstick ==")
for i in items:
    r = i["result"]
    clock = ((r.get("environment") or {}).get("mlx_clock") or {}).get("used", "")
    print(f"  {r['status']:<10} score {r.get('score')}  interval {r.get('score_interval')}  "
          f"drift {r.get('drift')}  [{r.get('wall_seconds', 0):.1f} s] {clock}")
ok = [s for s in scores if s]
if ok:
    print(f"  spread (max/min - 1): {100 * (max(ok) / min(ok) - 1):.2f}%  "
          f"median {statistics.median(ok):.4f}")
    inside = all(i["result"]["score_interval"][0] <= s <= i["result"]["score_interval"][1]
                 for s in ok for i in items if i["result"].get("score_interval"))
    print(f"  every score inside every interval: {inside}")
per = {}
for i in items:
    for w in i["result"].get("workloads", []):
        if w.get("speedup_vs_baseline"):
            per.setdefault(w["name"], []).append(w["speedup_vs_baseline"])

bench = evals("bench.json")
print(f"== eval vs bench ({native}) per workload: kernel speedup over the native ==")
rows = []
for w in (bench or {}).get("workloads", []) if isinstance(bench, dict) else []:
    k, n = w["contenders"].get("kernel", {}), w["contenders"].get(native, {})
    if not (k.get("median_ms") and n.get("median_ms")) or w["name"] not in per:
        continue
    b = n["median_ms"] / k["median_ms"]
    e = statistics.median(per[w["name"]])
    rows.append((w["name"], e, b))
    print(f"  {w['name']:<28} eval {e:.4f}  bench {b:.4f}  eval/bench {e / b:.4f}")
if rows:
    print(f"  median eval/bench: {statistics.median(e / b for _, e, b in rows):.4f}")

print("== calibration: copies against the baseline's copy (the baseline's own call should be 1.00) ==")
for i in evals("copy.json"):
    r = i["result"]
    ws = ", ".join(f"{w['name']} {w.get('speedup_vs_baseline') or 0:.3f}"
                   for w in r.get("workloads", []) if not w.get("held_out"))
    print(f"  {i['file'].split('/')[-1]:<22} {r['status']:<10} score {r.get('score')}  "
          f"interval {r.get('score_interval')}  ({ws})")
PY
