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

render_attention_kernel
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

python3 gpu/alternated_summary.py "$OUT" judge | tee "$OUT/summary.txt"
