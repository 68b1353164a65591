#!/usr/bin/env bash
# The GPU attention work through ksearch on the H200, in one device call (kind nvidia-h200):
#   1. ksearch doctor: the harness must list the cuda backend;
#   2. ksearch eval --backend cuda --held-out of the best measured variant (wg_m64n64s2,
#      rendered from tasks/attention/templates-cuda by ksearch, through gpu/ksearch_render.py): passed, times vs SDPA;
#   3. ksearch bench attention --kernel <it> --backend cuda: kernel, PyTorch SDPA (and MLX native
#      when MLX is importable, see device_check_mlx.sh) per workload, one process;
#   4. ksearch run --task attention --backend cuda: the offline search on the GPU family, a few
#      rounds under a wall-time cap, then ksearch bench --run of its best kernel.
#
# Prepare here (the binary travels; the device cannot build Rust):
#   bash gpu/ksearch_bin.sh pack
#   # optional, for device_check_mlx.sh right after: bash ../shared/device/prepare-mlx-cuda.sh
# Call (repository root; carrying mlx1 as well only stashes it for device_check_mlx.sh):
#   run(command="bash gpu/attention/device_check.sh", timeout_s=600,
#       carry=[".device-carry/ks", ".device-carry/mlx1"])
# What comes back in $OUT (at most 8 files): log.txt, doctor.json, eval.json, bench.txt,
# run.json, bench-run.txt, bench.json. ROUNDS (default 8) and RUN_WALL_S (default 120) bound
# step 4. Every step's time limit is cut to what is left of BUDGET_S (default 560 s), so the
# call ends inside the device's 600 s even when a step hangs; steps that no longer fit are
# skipped, the least important (bench.json) last.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/ksearch-device-check}
WORK=${WORK:-/tmp/ksearch-device-work}
# shellcheck source=../ksearch_bin.sh
source "$ROOT/gpu/ksearch_bin.sh"
ROUNDS=${ROUNDS:-8}
RUN_WALL_S=${RUN_WALL_S:-120}
BUDGET_S=${BUDGET_S:-560}
VARIANT=${VARIANT:-wg_m64n64s2}
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/log.txt") 2>&1

# shellcheck source=device_lib.sh
source gpu/attention/device_lib.sh
ksearch_env

# Only on the GPU machine: the stash lives in /root there until device_check_mlx.sh joins it.
if [ -f .device-carry/mlx1/stash.sh ] && command -v nvidia-smi >/dev/null; then
    step "stash the first half of the MLX carry for device_check_mlx.sh"
    bash .device-carry/mlx1/stash.sh
fi

step "machine"
nvidia-smi -L
nvcc --version | tail -n 2
"$KSEARCH_PYTHON" -c 'import torch, numpy; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "numpy", numpy.__version__)'
if ! "$KS" --version; then
    echo "cannot run $KS here: build it with cargo build --release -p ksearch-cli and carry it" >&2
    exit 2
fi

step "ksearch doctor"
timeout "$(cap 120)" "$KS" doctor --json > "$OUT/doctor.json"
"$KSEARCH_PYTHON" - "$OUT/doctor.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
probe = doc.get("probe") or {}
print("backends:", probe.get("backends"), "| gpus:", probe.get("gpus"), "| nvcc:", probe.get("nvcc"))
if "cuda" not in (probe.get("backends") or []):
    print("WARNING: the harness does not list the cuda backend")
PY

step "render $VARIANT (cuda)"
KERNEL="$WORK/$VARIANT.cu"
KSEARCH_BIN="$KS" "$KSEARCH_PYTHON" gpu/ksearch_render.py attention cuda \
    --variants gpu/attention/variants.toml --name "$VARIANT" -o "$KERNEL"
head -n 2 "$KERNEL"

step "ksearch eval --backend cuda --held-out $VARIANT"
# quick timing: the verdict and rough times; the bench below measures properly.
T=$(cap 240)
timeout "$T" "$KS" eval --task attention --backend cuda --held-out --timeout $((T - 10)) \
    --timing quick --json "$KERNEL" > "$OUT/eval.json"
echo "eval exit code $?"
summarise_eval "$OUT/eval.json" SDPA

step "ksearch bench attention --kernel $VARIANT --backend cuda"
T=$(cap 200)
timeout "$T" "$KS" bench attention --kernel "$KERNEL" --backend cuda --timeout $((T - 10)) \
    | tee "$OUT/bench.txt"
echo "bench exit code $?"

if fits $((RUN_WALL_S + 90)); then
    step "ksearch run --task attention --backend cuda --rounds $ROUNDS (at most ${RUN_WALL_S}s of search)"
    timeout "$(cap $((RUN_WALL_S + 200)))" "$KS" run --task attention --backend cuda \
        --rounds "$ROUNDS" --max-wall-time "$RUN_WALL_S" --timing quick --seed 1 \
        --runs-dir "$WORK/runs" --json > "$OUT/run.json"
    echo "run exit code $?"
    RUN_ID=$("$KSEARCH_PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"])' "$OUT/run.json" 2>/dev/null)
    if [ -n "$RUN_ID" ]; then
        "$KS" show "$RUN_ID" --runs-dir "$WORK/runs" | head -n 60
        if fits 60; then
            step "ksearch bench attention --run $RUN_ID"
            T=$(cap 120)
            timeout "$T" "$KS" bench attention --run "$RUN_ID" --runs-dir "$WORK/runs" \
                --timeout $((T - 10)) --shapes 'b1h32l4096d128-f16-causal;b1h32l4096d128-bf16' \
                | tee "$OUT/bench-run.txt"
            echo "bench --run exit code $?"
        fi
    fi
else
    echo "skipped the run: $((BUDGET_S - SECONDS)) s of the budget left"
fi

if fits 60; then
    step "ksearch bench attention --json (two shapes)"
    T=$(cap 120)
    timeout "$T" "$KS" bench attention --kernel "$KERNEL" --backend cuda --timeout $((T - 10)) \
        --json --shapes 'b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16' \
        > "$OUT/bench.json"
    echo "bench --json exit code $?"
fi
step "done"
