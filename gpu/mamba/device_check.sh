#!/usr/bin/env bash
# Everything of gpu/mamba that needs the H200, in two device calls (the MLX wheels travel in two
# halves, see ../shared/device/prepare-mlx-cuda.sh, which must have been run here first so that
# .device-carry/mlx1 and .device-carry/mlx2 exist). The harness steps take the task's resolved
# workloads from a ksearch binary (`ksearch tasks --workloads`): pack it with
# `bash gpu/ksearch_bin.sh pack` and carry ".device-carry/ks" (or set KSEARCH_BIN). Results land
# in $OUT (at most 9 files).
#
#   call 1, carry [".device-carry/mlx1", ".device-carry/ks"]:   bash gpu/mamba/device_check.sh 1
#     stashes the first MLX half; cuda backend: every named variant built with nvcc (ptxas
#     report), checked against the float64 scan and timed (kernel_cuda.json); compute-sanitizer
#     memcheck and racecheck on small shapes (sanitizer.log); the tiled and staged variants in
#     the task's and mlx-lm's channel-last layout (kernel_cuda_layouts.json); the seed and picks
#     through the real harness, held-out workloads and decay regimes included (eval_cuda.json).
#     Correctness steps come first, so a cut budget (BUDGET_S) drops the timing ones.
#   call 2, right after, carry [".device-carry/mlx2", ".device-carry/ks"]:
#     bash gpu/mamba/device_check.sh 2
#     assembles MLX; the whole-model bench: logits check against stock mlx-lm, prefill tok/s at
#     512..4096 and decode tok/s for ksearch, mlx-lm and mambapy, the scan alone against its
#     memory floor (bench.json); the tuned scan's settings and chunked_fused through MLX
#     (kernel_mlx.json); the bench again with
#     the variant fastest channel-last at L=4096 (bench_best.json); the mlx seed and pick through
#     the harness (eval_mlx.json).
# Each step has its own time limit, cut to what is left of BUDGET_S (default 570 s) so that a
# call ends inside the 10-minute limit with whatever finished; a step with less than 20 s left
# is skipped. call${N}.log has the console output of the call.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
# shellcheck source=../ksearch_bin.sh
source gpu/ksearch_bin.sh
OUT=${OUT:-/tmp/ksm-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MLX_ENABLE_TF32=0
step=${1:?usage: device_check.sh 1|2}
exec > >(tee -a "$OUT/call$step.log") 2>&1

BUDGET_S=${BUDGET_S:-570}
run() {  # run LIMIT_S LABEL CMD...: one step, time-limited, never fatal
  local limit=$1 label=$2
  shift 2
  local left=$((BUDGET_S - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "== $label: skipped, ${left}s of the budget left"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $label ($(date +%T), limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "== $label: exit $rc"
  return 0
}

if [ "$step" = 1 ]; then
  bash .device-carry/mlx1/stash.sh
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  export NVCC PATH="$(dirname "$NVCC"):$PATH"
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  run 150 "cuda variants: build, check, time" \
    python3 gpu/mamba/kernel_bench.py --backend cuda --nvcc "$NVCC" --json "$OUT/kernel_cuda.json"
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [ -x "$SAN" ]; then
    for tool in memcheck racecheck; do
      run 70 "compute-sanitizer $tool" "$SAN" --tool "$tool" --error-exitcode 9 \
        python3 gpu/mamba/kernel_bench.py --backend cuda --nvcc "$NVCC" --checks small \
        --variants s0_sequential,seq_lanes16_fused,s2_chunked,chunked_fused,s6_vec,ch_t32_i16,staged_l16_t256,staged_l8_t128 \
        --reps 0 >>"$OUT/sanitizer.log" 2>&1
    done
  else
    echo "no compute-sanitizer" | tee "$OUT/sanitizer.log"
  fi
  run 120 "tiled and staged variants in both layouts" \
    python3 gpu/mamba/kernel_bench.py --backend cuda --nvcc "$NVCC" --layouts task,channel-last \
    --lengths 512,1024,2048,4096 --json "$OUT/kernel_cuda_layouts.json" \
    --variants tiled_c16_t512,tiled_c16_t512_tree,tiled_c16_t512_tree_pf,tiled_c16_t256_tree_pf,staged_l16_t256,staged_l8_t128
  run 150 "harness: cuda seed and picks" env PYTHONPATH=harness \
    python3 gpu/mamba/device_eval.py --backend cuda --process \
    --variants staged_l16_t256,s6_vec --json "$OUT/eval_cuda.json"
elif [ "$step" = 2 ]; then
  # shellcheck disable=SC1091
  source .device-carry/mlx2/assemble.sh || exit 3
  run 200 "whole-model bench (default variant)" \
    python3 gpu/mamba/bench.py --kernel-only --stock-budget 40 --out "$OUT/bench.json"
  run 90 "mlx variants: check, time" \
    python3 gpu/mamba/kernel_bench.py --backend mlx --json "$OUT/kernel_mlx.json" \
    --variants staged_l16_t256,staged_l8_t128,tiled_c16_t512,tiled_c16_t256_tree_pf,chunked_fused
  best=$(python3 - "$OUT/kernel_mlx.json" <<'PY'
import json, sys
try:
    v = json.load(open(sys.argv[1]))["variants"]
except Exception:
    sys.exit(0)
ok = {n: r["timings"]["4096"]["channel_last"] for n, r in v.items()
      if r.get("correct") and "4096" in r.get("timings", {})}
print(min(ok, key=ok.get) if ok else "")
PY
)
  if [ -n "$best" ]; then
    run 90 "bench with $best" python3 gpu/mamba/bench.py --variant "$best" --impls ksearch \
      --kernel-only --out "$OUT/bench_best.json"
  fi
  run 120 "harness: mlx seed and pick" env PYTHONPATH="harness:${PYTHONPATH:-}" \
    python3 gpu/mamba/device_eval.py --backend mlx --variants staged_l16_t256 \
    --json "$OUT/eval_mlx.json"
else
  echo "usage: device_check.sh 1|2" >&2
  exit 2
fi
