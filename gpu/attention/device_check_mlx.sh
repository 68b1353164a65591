#!/usr/bin/env bash
# The mlx half of the device check (device_check.sh is the cuda half), one device call on the
# H200 (kind nvidia-h200), right after a call that ran .device-carry/mlx1/stash.sh (device_check.sh
# does when mlx1 is carried): the second half of the MLX carry joins the first, then
#   1. ksearch doctor: the harness must now list mlx besides cuda;
#   2. ksearch eval --backend mlx --held-out of the best measured variant as the mlx family's
#      candidate module (mx.fast.cuda_kernel around the same device code);
#   3. ksearch bench attention --backend mlx: the module, MLX native and PyTorch SDPA;
#   4. ksearch bench attention --backend cuda: the .cu kernel against SDPA and MLX native, all
#      three in one process (the comparison device_check.sh makes without MLX);
#   5. ksearch run --task attention --backend mlx: a short offline search on the mlx family.
#
# Prepare here: bash gpu/ksearch_bin.sh pack;
#   bash ../shared/device/prepare-mlx-cuda.sh   (MLX 0.32.4 with its CUDA 13 backend, two halves)
# Call (repository root), soon after device_check.sh carried .device-carry/mlx1:
#   run(command="bash gpu/attention/device_check_mlx.sh", timeout_s=600,
#       carry=[".device-carry/ks", ".device-carry/mlx2"])
# If the machine was replaced in between, assemble.sh says so (exit 3): repeat the mlx1 step,
#   run(command="bash .device-carry/mlx1/stash.sh", carry=[".device-carry/mlx1"]), then this.
# What comes back in $OUT: log.txt, doctor.json, eval-mlx.json, bench-mlx.txt, bench-cuda.txt,
# run-mlx.json, bench-mlx.json. Every step's limit is cut to what is left of BUDGET_S (default
# 560 s); steps that no longer fit are skipped.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/ksearch-device-check}
WORK=${WORK:-/tmp/ksearch-device-work}
# shellcheck source=../ksearch_bin.sh
source "$ROOT/gpu/ksearch_bin.sh"
ROUNDS=${ROUNDS:-4}
RUN_WALL_S=${RUN_WALL_S:-90}
BUDGET_S=${BUDGET_S:-560}
VARIANT=${VARIANT:-wg_m64n64s2}
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/log.txt") 2>&1

# shellcheck source=device_lib.sh
source gpu/attention/device_lib.sh

step "assemble the MLX carry"
if [ -f .device-carry/mlx2/assemble.sh ]; then
    # Sets PYTHONPATH=/tmp/ksearch-site; ksearch passes PYTHONPATH on to the harness.
    # shellcheck disable=SC1091
    source .device-carry/mlx2/assemble.sh || exit $?
else
    echo "no .device-carry/mlx2: carry it (bash ../shared/device/prepare-mlx-cuda.sh makes it)" >&2
    exit 3
fi

ksearch_env
"$KS" --version || { echo "cannot run $KS here" >&2; exit 2; }

step "ksearch doctor"
timeout "$(cap 120)" "$KS" doctor --json > "$OUT/doctor.json"
"$KSEARCH_PYTHON" -c 'import json,sys; p=json.load(open(sys.argv[1])).get("probe") or {}; print("backends:", p.get("backends"), "mlx", p.get("mlx"), "torch", p.get("torch"))' "$OUT/doctor.json"

step "render $VARIANT (mlx module and cuda file)"
MODULE="$WORK/${VARIANT}_mlx.py"
KERNEL="$WORK/$VARIANT.cu"
# The variants name cuda settings; the mlx family has all their knobs but min_blocks.
KSEARCH_BIN="$KS" "$KSEARCH_PYTHON" gpu/ksearch_render.py attention mlx --variants-backend cuda \
    --variants gpu/attention/variants.toml --name "$VARIANT" -o "$MODULE"
KSEARCH_BIN="$KS" "$KSEARCH_PYTHON" gpu/ksearch_render.py attention cuda \
    --variants gpu/attention/variants.toml --name "$VARIANT" -o "$KERNEL"

step "ksearch eval --backend mlx --held-out $VARIANT"
T=$(cap 200)
timeout "$T" "$KS" eval --task attention --backend mlx --held-out --timeout $((T - 10)) \
    --timing quick --json "$MODULE" > "$OUT/eval-mlx.json"
echo "eval exit code $?"
summarise_eval "$OUT/eval-mlx.json" "MLX native"

step "ksearch bench attention --backend mlx"
T=$(cap 150)
timeout "$T" "$KS" bench attention --kernel "$MODULE" --backend mlx --timeout $((T - 10)) \
    | tee "$OUT/bench-mlx.txt"
echo "bench (mlx) exit code $?"

step "ksearch bench attention --backend cuda (SDPA and MLX native in the same process)"
T=$(cap 150)
timeout "$T" "$KS" bench attention --kernel "$KERNEL" --backend cuda --timeout $((T - 10)) \
    | tee "$OUT/bench-cuda.txt"
echo "bench (cuda) exit code $?"

if fits $((RUN_WALL_S + 60)); then
    step "ksearch run --task attention --backend mlx --rounds $ROUNDS (at most ${RUN_WALL_S}s of search)"
    timeout "$(cap $((RUN_WALL_S + 150)))" "$KS" run --task attention --backend mlx \
        --rounds "$ROUNDS" --max-wall-time "$RUN_WALL_S" --timing quick --seed 1 \
        --runs-dir "$WORK/runs" --json > "$OUT/run-mlx.json"
    echo "run exit code $?"
    RUN_ID=$("$KSEARCH_PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"])' "$OUT/run-mlx.json" 2>/dev/null)
    [ -n "$RUN_ID" ] && "$KS" show "$RUN_ID" --runs-dir "$WORK/runs" | head -n 40
fi

if fits 60; then
    step "ksearch bench attention --backend mlx --json (two shapes)"
    T=$(cap 100)
    timeout "$T" "$KS" bench attention --kernel "$MODULE" --backend mlx --timeout $((T - 10)) \
        --json --shapes 'b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16' \
        > "$OUT/bench-mlx.json"
fi
step "done"
