#!/usr/bin/env bash
# The GPU held-out workloads of one task (attention or selective-scan, tasks/<task>/task.toml)
# on the device, through the cuda backend: the seed and named points of the task's cuda
# template family are evaluated together with --held-out, then every candidate's verdict on
# every held-out workload is printed. One device call per task (kind nvidia-h200):
#
#   run(command="TASK=attention bash gpu/heldout_check.sh", timeout_s=600,
#       carry=[".device-carry/ks"])
#   run(command="TASK=selective-scan bash gpu/heldout_check.sh", timeout_s=600, carry=[...])
#
# Prepare here (the device cannot build Rust): bash gpu/ksearch_bin.sh pack, or name another
# binary with KSEARCH_BIN. VARIANTS overrides the
# family points (names in gpu/attention/variants.toml or gpu/mamba/variants.toml). Results in
# $OUT: <task>.jsonl (one ksearch eval --json item per candidate) and log.txt. An attention
# eval takes 30-60 s per candidate on the H200 (nvcc included), a scan eval about as long.
set -uo pipefail

TASK=${TASK:?set TASK=attention or TASK=selective-scan}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" heldout

files=("tasks/$TASK/seed/naive.cu")
case "$TASK" in
attention)
    for v in ${VARIANTS:-s1_tiled s4_mma s7_causal_skip wg_m64n64s2 wg_m64n64_ov wg_m128n128s3_pp}; do
        python3 gpu/ksearch_render.py attention cuda --variants gpu/attention/variants.toml \
            --name "$v" -o "$WORK/$v.cu" && files+=("$WORK/$v.cu")
    done
    ;;
selective-scan)
    for v in ${VARIANTS:-s1_state_lanes s3_items s6_vec ch_t256_i4 seq_lanes8_fused tiled_c32_t256}; do
        python3 gpu/ksearch_render.py selective-scan cuda --variants gpu/mamba/variants.toml \
            --name "$v" -o "$WORK/$v.cu" && files+=("$WORK/$v.cu")
    done
    ;;
*)
    echo "unknown TASK $TASK" >&2
    exit 2
    ;;
esac

# One candidate per eval, so that what finished survives a call cut short; BUDGET_S (default
# 540) bounds them all, EVAL_S (default 200) each.
BUDGET_S=${BUDGET_S:-540}
: > "$OUT/$TASK.jsonl"
for f in "${files[@]}"; do
    left=$((BUDGET_S - SECONDS))
    cap=${EVAL_S:-200}
    [ "$left" -lt "$cap" ] && cap=$left
    if [ "$cap" -lt 30 ]; then
        echo "== skipped $f: ${left}s of the budget left"
        continue
    fi
    echo "== ksearch eval --task $TASK --backend cuda --held-out $f (at most ${cap}s)"
    timeout "$cap" "$KS" eval --task "$TASK" --backend cuda --held-out --timing quick \
        --timeout $((cap - 5)) --json "$f" > "$WORK/one.json"
    echo "eval exit code $?"
    python3 -c 'import json,sys; [print(json.dumps(i)) for i in json.load(open(sys.argv[1]))]' \
        "$WORK/one.json" >> "$OUT/$TASK.jsonl" 2>/dev/null || echo "no result for $f"
    python3 - "$WORK/one.json" <<'PY'
import json, os, sys
try:
    items = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit(0)
for item in items:
    r = item.get("result") or {}
    v = r.get("violation") or {}
    print(f"{os.path.basename(item.get('file', '?'))}: {r.get('status')} "
          f"{v.get('class') or ''} {(r.get('message') or '')[:300]}")
    for w in r.get("workloads", []):
        if w.get("held_out"):
            print(f"  {w['name']:34s} correct={w.get('correct')} "
                  f"abs={w.get('max_abs_err')} rel={w.get('max_rel_err')}")
    bad = [w["name"] for w in r.get("workloads", []) if w.get("correct") is False]
    print("  wrong on:", bad or "none")
PY
done
