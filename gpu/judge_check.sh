#!/usr/bin/env bash
# What the persistent judge saves on the device (issue: evaluation at search speed): one
# attention kernel evaluated FILES times in one `ksearch eval --json-lines`, with a judge per
# evaluation (KSEARCH_PERSISTENT_JUDGE=0) and with the persistent judge (1), alternated PAIRS
# times, one backend per call (BACKEND=cuda or BACKEND=mlx). Prints per evaluation its wall,
# score and the harness's phase seconds, then the medians per mode over the evaluations after
# each call's first.
#
#   run(command="BACKEND=cuda bash gpu/judge_check.sh", timeout_s=600,
#       carry=[".device-carry/ks"])
#   mlx: as gpu/score_check.sh says (two carry halves).
#
# Prepare here: bash gpu/ksearch_bin.sh pack. KERNEL
# names the attention variant (gpu/attention/variants.toml). Results in $OUT: judge-<mode>-<pair>.jsonl,
# summary.txt, log.txt.
set -uo pipefail

BACKEND=${BACKEND:?set BACKEND=cuda or BACKEND=mlx}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" judge-check

case "$BACKEND" in
cuda) KERNEL=${KERNEL:-wg_m128n128s3_pp}; EXT=cu ;;
mlx) KERNEL=${KERNEL:-s7_causal_skip}; EXT=py ;;
*) echo "unknown BACKEND $BACKEND" >&2; exit 2 ;;
esac
F="$WORK/$KERNEL.$EXT"
python3 gpu/ksearch_render.py attention "$BACKEND" --variants-backend cuda \
    --variants gpu/attention/variants.toml --name "$KERNEL" -o "$F" || exit 2
files=()
for _ in $(seq "${FILES:-4}"); do files+=("$F"); done

for pair in $(seq "${PAIRS:-2}"); do
    for mode in 0 1; do
        started=$SECONDS
        KSEARCH_PERSISTENT_JUDGE=$mode "$KS" eval --task attention --backend "$BACKEND" \
            --json-lines "${files[@]}" > "$OUT/judge-$mode-$pair.jsonl"
        echo "judge=$mode pair $pair: $((SECONDS - started)) s"
    done
done

python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import glob, json, os, statistics, sys
out = sys.argv[1]
later = {"0": [], "1": []}
for path in sorted(glob.glob(os.path.join(out, "judge-*.jsonl"))):
    mode = os.path.basename(path).split("-")[1]
    for k, line in enumerate(open(path)):
        r = json.loads(line).get("result") or {}
        ph = (r.get("diagnostics") or {}).get("phase_seconds") or {}
        wall = r.get("wall_seconds") or 0.0
        print(f"{os.path.basename(path)} #{k}: {r.get('status')} score {r.get('score')} "
              f"wall {wall:.1f} s  " + " ".join(f"{p} {v:.1f}" for p, v in sorted(ph.items())
                                                 if v >= 0.5))
        if k > 0:
            later[mode].append(wall)
for mode, walls in later.items():
    if walls:
        print(f"judge={mode}: median wall after each call's first evaluation "
              f"{statistics.median(walls):.1f} s over {len(walls)}")
PY
