#!/usr/bin/env bash
# The offline search on attention through the cuda backend in one device call (carry
# ["target/release/ksearch"]; no MLX needed): one attempt per cycle, stopped by its wall budget
# between rounds, then `ksearch bench --run` on B1 H32 L4096 D128 f16 causal and not (30
# interleaved rounds against PyTorch SDPA), `ksearch show` and the run store.
#   run(command="RUN_WALL_S=380 bash gpu/attention/cuda_search.sh", timeout_s=560,
#       carry=["target/release/ksearch"])
# Results in $OUT: run-cuda.json, bench-cuda.txt, show-cuda.txt, run-store-cuda.tar.gz.
# No `timeout` around the search: the run stops itself after RUN_WALL_S (see device_session.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/ksearch-cuda-search}
mkdir -p "$OUT"
export KSEARCH_ROOT=$PWD KSEARCH_PYTHON=$(command -v python3) PYTHONUNBUFFERED=1
export KSEARCH_CACHE_DIR=/tmp/ksearch-device-work/cache
RUNS=/tmp/ksearch-device-work/runs-cuda
mkdir -p "$RUNS"
target/release/ksearch run --task attention --backend cuda --rounds "${ROUNDS:-20}" \
    --cycle-cap 1 --stagnation-window 1 --max-wall-time "${RUN_WALL_S:-380}" --no-recheck \
    --timing quick --seed "${SEARCH_SEED:-1}" --runs-dir "$RUNS" --json > "$OUT/run-cuda.json"
echo "run exit code $?"
RUN=$(ls -t "$RUNS" | head -n 1)
[ -n "$RUN" ] || exit 1
target/release/ksearch bench attention --run "$RUN" --runs-dir "$RUNS" --backend cuda \
    --reps 30 --timeout 100 \
    --shapes "b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16" \
    | tee "$OUT/bench-cuda.txt"
target/release/ksearch show "$RUN" --runs-dir "$RUNS" > "$OUT/show-cuda.txt"
head -n 30 "$OUT/show-cuda.txt"
tar -C "$RUNS" -czf "$OUT/run-store-cuda.tar.gz" "$RUN"
