#!/usr/bin/env bash
# Strategies at equal budget on the device (issue: baseline strategies and `ksearch compare`):
# `ksearch compare --task attention --backend cuda` over STRATEGIES (default the world model,
# evolve and best-of-n), BUDGET evaluations each (default 20), proposer seeds 1..SEEDS (default
# 2), quick timing, CONFIRM_ROUNDS rounds of each run's final confirmation (default 2, as
# `ksearch run`), and FLAGS, more run flags (e.g. `--no-profile-signals`, the ablation of
# profiler-guided search). Every call of one comparison must use the same settings: a run is
# taken up only with equal settings.
# A comparison outlasts one device call, so the runs directory travels: this call resumes or
# reads back every run already in RUNS_FROM (runs.tgz, the run stores an earlier call left in
# its $OUT, carried back; a tarball, since a run store nests deeper than a device call returns),
# runs what is missing until LIMIT_S (default 540) and then stops the comparison with an
# interrupt, which leaves the unfinished run resumable. Call it again with the runs it returned
# until it prints the table.
#
#   run(command="bash gpu/compare_check.sh", timeout_s=600, carry=[".device-carry/ks"])
#   run(command="RUNS_FROM=.device-carry/runs.tgz bash gpu/compare_check.sh",
#       timeout_s=600, carry=[".device-carry/ks", ".device-carry/runs.tgz"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack. Results in
# $OUT: runs.tgz (the run stores), compare.json and compare.txt once every run finished,
# log.txt.
# Measured comparisons: docs/results/compare.
set -uo pipefail

STRATEGIES=${STRATEGIES:-world-model,evolve,best-of-n}
FLAGS=${FLAGS:-}
BUDGET=${BUDGET:-20}
SEEDS=${SEEDS:-2}
CONFIRM_ROUNDS=${CONFIRM_ROUNDS:-2}
LIMIT_S=${LIMIT_S:-540}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" "compare-attention-cuda"
RUNS=$WORK/runs
mkdir -p "$RUNS"
if [ -n "${RUNS_FROM:-}" ]; then
    tar xzf "$RUNS_FROM" -C "$RUNS" || { echo "cannot unpack $RUNS_FROM" >&2; exit 2; }
    echo "resuming from $(ls "$RUNS" | wc -l) runs in $RUNS_FROM"
fi
# Whatever happens below, the run stores go back with the call.
trap 'tar czf "$OUT/runs.tgz" -C "$RUNS" .' EXIT

# shellcheck disable=SC2206 # FLAGS is a list of flags
args=(compare --task attention --backend cuda --strategies "$STRATEGIES"
      --budget "$BUDGET" --seeds "$SEEDS" --confirm-rounds "$CONFIRM_ROUNDS" --runs-dir "$RUNS"
      $FLAGS)
started=$SECONDS
timeout -s INT -k 30 "$LIMIT_S" "$KS" "${args[@]}" --json > "$OUT/compare.json"
status=$?
echo "compare exit code $status, $((SECONDS - started)) s"
if [ "$status" -eq 0 ]; then
    # Every run is finished now: the human table reads them back without running anything.
    "$KS" "${args[@]}" > "$OUT/compare.txt"
    cat "$OUT/compare.txt"
else
    rm -f "$OUT/compare.json"
    echo "not finished: call again with RUNS_FROM set to the runs this call returned"
fi
ls "$RUNS"
