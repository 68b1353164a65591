#!/usr/bin/env bash
# Issue 23's attention figures: named variants of the attention family benched through
# `ksearch bench attention` against PyTorch SDPA and MLX native on the main shape (B1 H32 L4096
# D128 f16, causal and not) and ten shapes from the issue's ranges that are not task workloads,
# on both backends, RUNS times (default 3). Runs alternate between the backends, so both see
# the same machine state; each bench is its own process (harness, compile, contenders).
#
# Prepare here: bash gpu/ksearch_bin.sh pack; bash ../shared/device/prepare-mlx-cuda.sh
# Call 1: run(command="bash .device-carry/mlx1/stash.sh", carry=[".device-carry/mlx1"])
# Call 2: run(command="source .device-carry/mlx2/assemble.sh && bash gpu/attention/shapes_check.sh",
#             carry=[".device-carry/mlx2", ".device-carry/ks"])
# (on a machine where the carry was assembled before: PYTHONPATH=/tmp/ksearch-site bash ...)
# Settings: CUDA_VARIANT (wg_m128n128s3_prod), CUDA_KERNEL (a rendered .cu benched under that
# name instead, e.g. a variant rendered from another tree), MLX_VARIANT (wg_m128n128s3_pp), RUNS (3),
# BACKENDS ("cuda mlx"), BUDGET_S (540). What comes back in $OUT: log.txt, table.md
# (gpu/attention/shapes_report.py's table of all benches) and benches.tgz, one JSON per bench
# (benches/<backend>-<run>.json), packed because a device call brings back only a few files.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../ksearch_env.sh" attention-shapes
CUDA_VARIANT=${CUDA_VARIANT:-wg_m128n128s3_prod}
MLX_VARIANT=${MLX_VARIANT:-wg_m128n128s3_pp}
RUNS=${RUNS:-3}
BACKENDS=${BACKENDS:-cuda mlx}
BUDGET_S=${BUDGET_S:-540}
# shellcheck source=device_lib.sh
source gpu/attention/device_lib.sh

SHAPES='B=1,H=32,L=4096,D=128,causal=0,dtype=f16'
SHAPES+=';B=1,H=32,L=4096,D=128,causal=1,dtype=f16'
SHAPES+=';B=16,H=32,L=256,D=64,causal=0,dtype=f16'
SHAPES+=';B=4,H=32,L=1024,D=64,causal=1,dtype=bf16'
SHAPES+=';B=8,H=32,L=512,D=128,causal=0,dtype=f16'
SHAPES+=';B=2,H=16,L=2048,D=128,causal=0,dtype=bf16'
SHAPES+=';B=1,H=8,L=8192,D=128,causal=1,dtype=f16'
SHAPES+=';B=1,H=32,L=8192,D=64,causal=0,dtype=f16'
SHAPES+=';B=4,H=8,L=4096,D=64,causal=0,dtype=bf16'
SHAPES+=';B=8,H=16,L=1024,D=128,causal=1,dtype=f16'
SHAPES+=';B=16,H=8,L=512,D=64,causal=1,dtype=bf16'
SHAPES+=';B=2,H=32,L=2048,D=64,causal=1,dtype=f16'

mkdir -p "$OUT/benches"
step "render $CUDA_VARIANT (cuda) and $MLX_VARIANT (mlx)"
if [ -n "${CUDA_KERNEL:-}" ]; then
    cp "$CUDA_KERNEL" "$WORK/$CUDA_VARIANT.cu" || exit 2
else
    "$KSEARCH_PYTHON" gpu/ksearch_render.py attention cuda --variants gpu/attention/variants.toml \
        --name "$CUDA_VARIANT" -o "$WORK/$CUDA_VARIANT.cu" || exit 2
fi
"$KSEARCH_PYTHON" gpu/ksearch_render.py attention mlx --variants-backend cuda \
    --variants gpu/attention/variants.toml --name "$MLX_VARIANT" -o "$WORK/${MLX_VARIANT}_mlx.py" || exit 2

for run in $(seq "$RUNS"); do
    for backend in $BACKENDS; do
        if [ "$backend" = cuda ]; then kernel="$WORK/$CUDA_VARIANT.cu"; else kernel="$WORK/${MLX_VARIANT}_mlx.py"; fi
        fits 40 || { echo "budget spent: $backend run $run skipped"; continue; }
        step "bench $backend, run $run"
        T=$(cap 240)
        timeout "$T" "$KS" bench attention --kernel "$kernel" --backend "$backend" \
            --timeout $((T - 5)) --json --shapes "$SHAPES" > "$OUT/benches/$backend-$run.json"
        echo "exit $?"
    done
done
step "table"
shopt -s nullglob
"$KSEARCH_PYTHON" gpu/attention/shapes_report.py "$OUT"/benches/*.json | tee "$OUT/table.md"
tar -C "$OUT" -czf "$OUT/benches.tgz" benches && rm -rf "$OUT/benches"
