#!/usr/bin/env bash
# One harness change on the device (issue: evaluation at search speed): one attention kernel
# evaluated FILES times in one `ksearch eval --timing quick --json-lines`, with the harness and
# tasks of an older commit (`old`) and of the working tree (`new`), alternated PAIRS times on
# one machine, one backend per call (BACKEND=cuda or BACKEND=mlx). Prints per evaluation its
# wall, score and the harness's phase seconds, then the medians per tree over the evaluations
# after each call's first.
#
#   here:   bash gpu/tree_check.sh prepare <commit>     (the old tree, .device-carry/oldtree;
#                                                        only where TREES names `old`)
#           bash gpu/ksearch_bin.sh pack
#   run(command="BACKEND=cuda bash gpu/tree_check.sh", timeout_s=600,
#       carry=[".device-carry/ks", ".device-carry/oldtree"])
#   mlx: as gpu/score_check.sh says (two carry halves), .device-carry/oldtree with the second.
#
# KERNEL names the attention variant (gpu/attention/variants.toml). TREES (default `old new`)
# lists the settings alternated in each pair: `old` is the old tree, any other label the
# working tree, run with the environment assignments in ENV_<label> if set, e.g.
#   TREES='old host staged' ENV_host='KSEARCH_HARNESS_DEVICE_SHARE=off' BACKEND=mlx ...
# Results in $OUT: tree-<label>-<pair>.jsonl, summary.txt, log.txt. Measured:
# docs/results/evaluation-speed.
set -uo pipefail

if [ "${1:-}" = prepare ]; then
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
    commit=${2:?usage: bash gpu/tree_check.sh prepare <commit>}
    rm -rf .device-carry/oldtree && mkdir -p .device-carry/oldtree &&
        git archive "$commit" harness tasks | tar -x -C .device-carry/oldtree &&
        echo "$commit" > .device-carry/oldtree/COMMIT && du -sh .device-carry/oldtree
    exit $?
fi

BACKEND=${BACKEND:?set BACKEND=cuda or BACKEND=mlx}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" tree-check
OLD="$ROOT/.device-carry/oldtree"
if [[ " ${TREES:-old new} " == *" old "* ]]; then
    [ -d "$OLD/harness" ] || { echo "no old tree: run 'bash gpu/tree_check.sh prepare <commit>' here and carry .device-carry/oldtree" >&2; exit 2; }
    echo "old tree: $(cat "$OLD/COMMIT" 2>/dev/null || echo unknown)"
fi

render_attention_kernel
files=()
for _ in $(seq "${FILES:-4}"); do files+=("$F"); done

for pair in $(seq "${PAIRS:-2}"); do
    for tree in ${TREES:-old new}; do
        root=$ROOT
        [ "$tree" = old ] && root=$OLD
        settings_var="ENV_$tree"
        settings=${!settings_var:-}
        started=$SECONDS
        # shellcheck disable=SC2086 # the settings are assignments, one word each
        env $settings KSEARCH_ROOT="$root" "$KS" eval --task attention --backend "$BACKEND" \
            --timing quick --json-lines "${files[@]}" > "$OUT/tree-$tree-$pair.jsonl"
        echo "tree $tree${settings:+ ($settings)}, pair $pair: $((SECONDS - started)) s"
    done
done

python3 gpu/alternated_summary.py "$OUT" tree | tee "$OUT/summary.txt"
