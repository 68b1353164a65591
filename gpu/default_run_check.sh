#!/usr/bin/env bash
# The default search on the device, as a new user runs it (issue: evaluation at search speed):
# `ksearch run --task attention --backend cuda` with no tuning flags, proposer seed SEED, then
# `ksearch show` of the run. Whether it finishes within 5 minutes, reaches the ping-pong wgmma
# kernel, and where its time went (the `time:` block: evaluations per hour, phases, device busy).
# The wall limit (GUARD_S) is only a guard. SEEDS (instead of SEED) runs one seed after another,
# each into $OUT/seed-S, and packs them into $OUT/runs.tgz (a device call brings back only a few
# files); the measured walls are in docs/results/evaluation-speed. With SEEDS, LANES (a list of
# KSEARCH_JUDGE_LANES values) runs each seed once per value in the order given, the Nth into
# $OUT/seed-S-run-N-lanes-L: two lanes against one, alternated in one call (with SAMPLES above
# one, or the run has one candidate in flight and the lanes make no difference).
#
#   run(command="SEED=1 bash gpu/default_run_check.sh", timeout_s=600,
#       carry=[".device-carry/ks"])
#   run(command="SEEDS='1 2 3' GUARD_S=240 bash gpu/default_run_check.sh", ...)
#   run(command="SEEDS=1 LANES='2 1 2 1' SAMPLES=2 ROUNDS=10 GUARD_S=130 bash ...", ...)
#
# Prepare here: bash gpu/ksearch_bin.sh pack. BACKEND
# (default cuda) may be mlx, with MLX carried as gpu/score_check.sh says. Results in $OUT:
# run.json, show.txt, show.json, log.txt, and store.tar.gz (the run directory: every
# evaluation with its phases and raw samples); on NVIDIA also dmon.txt, the driver's samples of
# the device's activity during the run (`nvidia-smi dmon`), summarised by gpu/dmon_busy.py as
# an independent check of the busy fraction. Measured runs: docs/results/evaluation-speed.
set -uo pipefail

BACKEND=${BACKEND:-cuda}
if [ -n "${SEEDS:-}" ] && [ -z "${SEED:-}" ]; then
    all=${OUT:-/tmp/ksearch-default-runs-$BACKEND}
    mkdir -p "$all"
    for s in $SEEDS; do
        n=0
        for lanes in ${LANES:--}; do
            name=seed-$s
            if [ -n "${LANES:-}" ]; then
                n=$((n + 1))
                name=$name-run-$n-lanes-$lanes
                export KSEARCH_JUDGE_LANES=$lanes
                echo "== $name"
            fi
            OUT=$all/$name WORK=${WORK:-/tmp/ksearch-default-run-$BACKEND}-$name SEED=$s \
                bash "${BASH_SOURCE[0]}" |
                grep -E "^(time:|status:|confirmed:|run exit|driver-sampled|re-check)|builds written|lanes"
        done
    done
    (cd "$all" && tar czf runs.tgz seed-* && rm -rf seed-*)
    exit 0
fi
SEED=${SEED:?set SEED to the proposer seed (1, 2, 3, ...), or SEEDS to a list of them}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" "default-run-$BACKEND-$SEED"
RUNS=$WORK/runs
mkdir -p "$RUNS"

dmon_start
started=$SECONDS
# ROUNDS (unset: the default budget) tries another round budget, SAMPLES (unset: one) more
# candidates per attempt (judged in lanes), with everything else default.
"$KS" run --task attention --backend "$BACKEND" --seed "$SEED" --runs-dir "$RUNS" \
    ${ROUNDS:+--rounds "$ROUNDS"} ${SAMPLES:+--samples "$SAMPLES"} \
    --max-wall-time "${GUARD_S:-540}" --json > "$OUT/run.json"
echo "run exit code $?, $((SECONDS - started)) s"
dmon_report
RUN=$(ls -t "$RUNS" | head -n 1)
[ -n "$RUN" ] || { echo "no run in $RUNS" >&2; exit 1; }
"$KS" show "$RUN" --runs-dir "$RUNS" > "$OUT/show.txt"
"$KS" show "$RUN" --runs-dir "$RUNS" --json > "$OUT/show.json"
sed -n '1,/^world model/p' "$OUT/show.txt"
tar -C "$RUNS" -czf "$OUT/store.tar.gz" "$RUN"
