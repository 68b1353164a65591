#!/usr/bin/env bash
# Profiler-guided search against its ablation on the device (issue: profiler-guided search): the
# world model on attention (cuda) with profile signals (each new best profiled under Nsight
# Compute, summaries classified by its counters) and with `--no-profile-signals`, BUDGET
# evaluations each (default 15), proposer seeds SEED..SEED+SEEDS-1 (default 1, one seed), quick
# timing, one confirmation round: two comparisons through gpu/compare_check.sh, equal but for
# the flag, one after the other on one build cache (a kernel both variants propose compiles
# once; scores do not depend on it). Each may take LIMIT_S seconds (default 280); a run it
# leaves unfinished is resumed by a later call given this call's results as RUNS_FROM (a
# directory holding signals/runs.tgz and ablation/runs.tgz).
#
#   run(command="bash gpu/profile_signals_check.sh", timeout_s=600,
#       carry=[".device-carry/ks"])
#   run(command="SEED=2 RUNS_FROM=.device-carry/signals bash gpu/profile_signals_check.sh",
#       timeout_s=600, carry=[".device-carry/ks", ".device-carry/signals"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack. Results in
# $OUT/signals and $OUT/ablation (compare_check.sh's: runs.tgz, compare.json and compare.txt
# once finished, log.txt). Measured: docs/results/profile.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT_ALL=${OUT:-/tmp/ksearch-profile-signals}
SEED=${SEED:-1}
export STRATEGIES=world-model BUDGET=${BUDGET:-15} SEEDS=${SEEDS:-1}
export CONFIRM_ROUNDS=${CONFIRM_ROUNDS:-1} LIMIT_S=${LIMIT_S:-280}
export KSEARCH_CACHE_DIR=${KSEARCH_CACHE_DIR:-/tmp/ksearch-profile-signals-cache}

for variant in signals ablation; do
    flags="--seed $SEED"
    [ "$variant" = ablation ] && flags="$flags --no-profile-signals"
    from=
    if [ -n "${RUNS_FROM:-}" ] && [ -f "$RUNS_FROM/$variant/runs.tgz" ]; then
        from=$(realpath "$RUNS_FROM/$variant/runs.tgz")
    fi
    echo "== $variant: seeds $SEED..$((SEED + SEEDS - 1)), flags $flags"
    OUT=$OUT_ALL/$variant WORK=/tmp/ksearch-profile-signals-$variant FLAGS=$flags \
        RUNS_FROM=$from bash "$HERE/compare_check.sh"
done
