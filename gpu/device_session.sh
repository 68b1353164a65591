#!/usr/bin/env bash
# Both case studies' device checks in two back-to-back device calls, for a session whose device
# time (30 min) does not fit four separate calls. Each call runs the parts of
# gpu/attention/device_check*.sh and gpu/mamba/device_check.sh that need the same half of the
# MLX carry, with budgets that add up to one call's 600 s:
#
#   call 1, carry ["target/release/ksearch", ".device-carry/mlx1"]:
#       bash gpu/device_session.sh 1     # cuda: attention (eval, bench, short search), mamba
#                                        # variants, harness eval, memcheck; stashes MLX half 1
#   call 2, right after (the machine stays warm ~30 s), carry
#       ["target/release/ksearch", ".device-carry/mlx2"]:
#       bash gpu/device_session.sh 2     # mlx: mamba whole-model bench, attention through MLX
#                                        # (eval, bench, short search), mamba variants via MLX
#
# Results: $OUT/session<N>.log (console) and $OUT/session<N>.tar.gz (every file the parts wrote;
# the device returns at most 8 files, so they travel packed). Unpack into gpu/results/.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${1:?usage: device_session.sh 1|2}
FINAL=${OUT:-/tmp/ksearch-session}
mkdir -p "$FINAL"
PARTS=/tmp/ksearch-session-parts/$N
rm -rf "$PARTS" && mkdir -p "$PARTS"
exec > >(tee "$FINAL/session$N.log") 2>&1
TOTAL=${TOTAL_S:-575}
left() { echo $((TOTAL - SECONDS)); }
pack() { tar -C "$PARTS" -czf "$FINAL/session$N.tar.gz" . ; }
trap pack EXIT

echo "== device_session $N at $(date +%T)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader
if [ "$N" = 1 ]; then
    # The attention part stashes MLX half 1 (it sees .device-carry/mlx1).
    OUT=$PARTS/attention BUDGET_S=${ATT_BUDGET_S:-290} ROUNDS=${ROUNDS:-4} \
        RUN_WALL_S=${RUN_WALL_S:-60} bash gpu/attention/device_check.sh
    OUT=$PARTS/mamba BUDGET_S=$(($(left) - 5)) bash gpu/mamba/device_check.sh 1
elif [ "$N" = 2 ]; then
    # The mamba part assembles the carry; the attention part sources it again (a no-op then).
    OUT=$PARTS/mamba BUDGET_S=${MAMBA_BUDGET_S:-300} bash gpu/mamba/device_check.sh 2
    OUT=$PARTS/attention BUDGET_S=$(($(left) - 5)) ROUNDS=${ROUNDS:-3} \
        RUN_WALL_S=${RUN_WALL_S:-60} bash gpu/attention/device_check_mlx.sh
else
    echo "usage: device_session.sh 1|2" >&2
    exit 2
fi
echo "== device_session $N done at $(date +%T) (${SECONDS}s)"
