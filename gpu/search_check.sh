#!/usr/bin/env bash
# The offline search on the attention task on the device, from the naive seed, through one
# backend (BACKEND=cuda or BACKEND=mlx): whether it climbs the family's ladder (tensor cores,
# cp.async, wgmma, ping-pong) and how its best compares with the native attention. One attempt
# per cycle (--cycle-cap 1 --stagnation-window 1), so each catalog action is measured once and
# the climb takes about as many evaluations as it has steps; --timing quick, proposer seed 1
# (SEARCH_SEED). The search stops itself between rounds once RUN_WALL_S seconds have passed:
# no `timeout` around it, since on the device a `timeout` that fired took the whole script down.
#
#   cuda, one call:
#     run(command="BACKEND=cuda bash gpu/search_check.sh", timeout_s=600,
#         carry=[".device-carry/ks"])
#   mlx (MLX in two carry halves, ../shared/device/prepare-mlx-cuda.sh; an evaluation takes
#   tens of seconds, most of it NVRTC and host copies, so the climb may need two calls; times
#   per host in docs/results/attention-gpu): a call that runs `bash .device-carry/mlx1/stash.sh`
#   (carry [".device-carry/mlx1"]), then
#     run(command="source .device-carry/mlx2/assemble.sh && BACKEND=mlx bash gpu/search_check.sh",
#         timeout_s=600, carry=[".device-carry/mlx2", ".device-carry/ks"])
#   and, to finish the run (more rounds, the re-check, the bench), the same with
#   RUN=<run id> RUN_WALL_S=<a larger total>: the run's search seconds over all its sessions,
#   after which the confirmation, the re-check and the bench still run (on mlx several
#   evaluations of tens of seconds each; leave them about five minutes of the call, or the
#   call's limit cuts the script before it writes its results). A fresh machine gets the run
#   store from .gpu-carry/run-store.tar.gz (this script's run-store.tar.gz, carried back).
#
# Without RUN: `ksearch run` under RUN_WALL_S (cuda 380, mlx 470) and ROUNDS (20), no re-check;
# on cuda then the bench. With RUN: `ksearch resume --recheck` under RUN_WALL_S (default 800 s
# in all), then the bench. The bench: `ksearch bench attention --run` of the best, BENCH_REPS
# (30) interleaved rounds, B1 H32 L4096 D128 f16 causal and not. Prepare here: cargo build
# --release -p ksearch-cli && strip target/release/ksearch. Results in $OUT: run.json or
# resume.json, bench.txt, show.txt, run-store.tar.gz, log.txt. Measured runs:
# docs/results/attention-gpu/README.md.
set -uo pipefail

BACKEND=${BACKEND:?set BACKEND=cuda or BACKEND=mlx}
case "$BACKEND" in
cuda) WALL=${RUN_WALL_S:-380} ;;
mlx) WALL=${RUN_WALL_S:-470} ;;
*) echo "unknown BACKEND $BACKEND" >&2; exit 2 ;;
esac
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" "search-$BACKEND"
RUNS=$WORK/runs
mkdir -p "$RUNS"

bench=0
if [ -z "${RUN:-}" ]; then
    "$KS" run --task attention --backend "$BACKEND" --rounds "${ROUNDS:-20}" \
        --cycle-cap 1 --stagnation-window 1 --max-wall-time "$WALL" --no-recheck \
        --timing quick --seed "${SEARCH_SEED:-1}" --runs-dir "$RUNS" --json > "$OUT/run.json"
    echo "run exit code $?"
    RUN=$(ls -t "$RUNS" | head -n 1)
    [ "$BACKEND" = cuda ] && bench=1
else
    if [ ! -d "$RUNS/$RUN" ] && [ -f .gpu-carry/run-store.tar.gz ]; then
        echo "fresh machine: the run store comes from the carry"
        tar -C "$RUNS" -xzf .gpu-carry/run-store.tar.gz
    fi
    "$KS" resume "$RUN" --runs-dir "$RUNS" --recheck --max-wall-time "${RUN_WALL_S:-800}" \
        --json > "$OUT/resume.json"
    echo "resume exit code $?"
    bench=1
fi
[ -n "$RUN" ] && [ -d "$RUNS/$RUN" ] || { echo "no run in $RUNS" >&2; exit 1; }
if [ "$bench" = 1 ]; then
    "$KS" bench attention --run "$RUN" --runs-dir "$RUNS" --backend "$BACKEND" \
        --reps "${BENCH_REPS:-30}" --timeout "${BENCH_S:-100}" \
        --shapes "b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16" \
        | tee "$OUT/bench.txt"
    echo "bench exit code $?"
fi
"$KS" show "$RUN" --all --runs-dir "$RUNS" > "$OUT/show.txt"
head -n 40 "$OUT/show.txt"
tar -C "$RUNS" -czf "$OUT/run-store.tar.gz" "$RUN"
