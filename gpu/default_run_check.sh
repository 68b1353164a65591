#!/usr/bin/env bash
# The default search on the device, as a new user runs it (issue: evaluation at search speed):
# `ksearch run --task attention --backend cuda` with no tuning flags, proposer seed SEED, then
# `ksearch show` of the run. Whether it finishes within 5 minutes, reaches the ping-pong wgmma
# kernel, and where its time went (the `time:` block: evaluations per hour, phases, device busy).
# One seed per device call (a run takes about 5 minutes); the wall limit is only a guard.
#
#   run(command="SEED=1 bash gpu/default_run_check.sh", timeout_s=600,
#       carry=[".device-carry/ks"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack. BACKEND
# (default cuda) may be mlx, with MLX carried as gpu/score_check.sh says. Results in $OUT:
# run.json, show.txt, show.json, log.txt, and store.tar.gz (the run directory: every
# evaluation with its phases and raw samples); on NVIDIA also dmon.txt, the driver's samples of
# the device's activity during the run (`nvidia-smi dmon`), summarised by gpu/dmon_busy.py as
# an independent check of the busy fraction. Measured runs: docs/results/evaluation-speed.
set -uo pipefail

BACKEND=${BACKEND:-cuda}
SEED=${SEED:?set SEED to the proposer seed (1, 2, 3, ...)}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" "default-run-$BACKEND-$SEED"
RUNS=$WORK/runs
mkdir -p "$RUNS"

dmon_start
started=$SECONDS
# ROUNDS (unset: the default budget) tries another round budget with everything else default.
"$KS" run --task attention --backend "$BACKEND" --seed "$SEED" --runs-dir "$RUNS" \
    ${ROUNDS:+--rounds "$ROUNDS"} --max-wall-time "${GUARD_S:-540}" --json > "$OUT/run.json"
echo "run exit code $?, $((SECONDS - started)) s"
dmon_report
RUN=$(ls -t "$RUNS" | head -n 1)
[ -n "$RUN" ] || { echo "no run in $RUNS" >&2; exit 1; }
"$KS" show "$RUN" --runs-dir "$RUNS" > "$OUT/show.txt"
"$KS" show "$RUN" --runs-dir "$RUNS" --json > "$OUT/show.json"
sed -n '1,/^world model/p' "$OUT/show.txt"
tar -C "$RUNS" -czf "$OUT/store.tar.gz" "$RUN"
