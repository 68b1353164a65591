#!/usr/bin/env bash
# Issue 23's Mamba figures: `ksearch bench mamba --mlx-settings auto --kernel-only --decode-loop
# sync --impls ksearch` RUNS times (default 3), each its own process (its own MLX setting probe
# and scan tuning), then gpu/mamba/bench_report.py's table of medians and spreads (prefill tok/s
# per length, decode tok/s, the scan alone per layer against its floor, and what each run
# picked). Stock mlx-lm is left out (`--impls ksearch`): its figures do not move between our
# changes and take most of a bench's time.
#
# Prepare here: bash gpu/ksearch_bin.sh pack; bash ../shared/device/prepare-mlx-cuda.sh
# Call 1: run(command="bash .device-carry/mlx1/stash.sh", carry=[".device-carry/mlx1"])
# Call 2: run(command="source .device-carry/mlx2/assemble.sh && bash gpu/mamba/bench_check.sh",
#             carry=[".device-carry/mlx2", ".device-carry/ks"])
# (on a machine where the carry was assembled before: PYTHONPATH=/tmp/ksearch-site bash ...)
# Settings: RUNS (3), BUDGET_S (540), EXTRA (more `ksearch bench mamba` arguments).
# What comes back in $OUT: log.txt, bench-<run>.json and table.md.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../ksearch_env.sh" mamba-bench
RUNS=${RUNS:-3}
BUDGET_S=${BUDGET_S:-540}
# shellcheck source=../attention/device_lib.sh
source gpu/attention/device_lib.sh
for run in $(seq "$RUNS"); do
    fits 60 || { echo "budget spent: run $run skipped"; continue; }
    step "bench run $run"
    # shellcheck disable=SC2086
    timeout "$(cap 300)" "$KS" bench mamba --mlx-settings auto --kernel-only --decode-loop sync \
        --impls ksearch --save "$OUT/bench-$run.json" ${EXTRA:-}
    echo "exit $?"
done
step "table"
"$KSEARCH_PYTHON" gpu/mamba/bench_report.py "$OUT"/bench-*.json | tee "$OUT/table.md"
