# Sourced by the device scripts that drive a release ksearch (score_check.sh, heldout_check.sh),
# with the run's name as $1: sets ROOT (and cds there), OUT and WORK (/tmp/ksearch-$1[-work]
# unless given), KS (the binary, also KSEARCH_BIN: gpu/ksearch_render.py renders with it; gpu/ksearch_bin.sh), sends all output to $OUT/log.txt as well, points ksearch at
# this checkout's tasks and harness (or KSEARCH_ROOT's) with the image's python3 (torch, nvcc,
# numpy) and a cache under $WORK (unless KSEARCH_CACHE_DIR names one), and stops unless the GPU and the binary answer.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-/tmp/ksearch-$1}
WORK=${WORK:-/tmp/ksearch-$1-work}
# shellcheck source=ksearch_bin.sh
source "$ROOT/gpu/ksearch_bin.sh"
mkdir -p "$OUT" "$WORK"
exec > >(tee "$OUT/log.txt") 2>&1
export KSEARCH_ROOT=${KSEARCH_ROOT:-$ROOT} KSEARCH_PYTHON=$(command -v python3) PYTHONUNBUFFERED=1
export KSEARCH_CACHE_DIR=${KSEARCH_CACHE_DIR:-$WORK/cache}
nvidia-smi -L
"$KS" --version || { echo "cannot run $KS" >&2; exit 2; }

# The attention variant KERNEL (gpu/attention/variants.toml; by default the ping-pong kernel on
# cuda, s7_causal_skip on mlx) rendered for $BACKEND into $WORK; sets KERNEL and F (its path).
render_attention_kernel() {
    local ext
    case "$BACKEND" in
    cuda) KERNEL=${KERNEL:-wg_m128n128s3_pp}; ext=cu ;;
    mlx) KERNEL=${KERNEL:-s7_causal_skip}; ext=py ;;
    *) echo "unknown BACKEND $BACKEND" >&2; exit 2 ;;
    esac
    F="$WORK/$KERNEL.$ext"
    python3 "$ROOT/gpu/ksearch_render.py" attention "$BACKEND" --variants-backend cuda \
        --variants "$ROOT/gpu/attention/variants.toml" --name "$KERNEL" -o "$F" || exit 2
}

# The driver's samples of the device's activity while a run goes (`nvidia-smi dmon` of the
# first GPU CUDA_VISIBLE_DEVICES names, else GPU 0, into $OUT/dmon.txt), where there is an
# NVIDIA driver: `dmon_start` before the run, `dmon_report` after it prints the mean share of
# time a kernel ran (gpu/dmon_busy.py), an independent check of `ksearch show`'s device busy
# fraction. The sampler is stopped when the script exits, however it ends (an EXIT trap).
dmon_start() {
    local gpu=${CUDA_VISIBLE_DEVICES:-0}
    gpu=${gpu%%,*}
    DMON_PID=
    DMON_FROM=$(date +%T)
    command -v nvidia-smi > /dev/null || return 0
    case "$gpu" in '' | *[!0-9]*) gpu=0 ;; esac
    nvidia-smi dmon -i "$gpu" -s u -o T -d 1 > "$OUT/dmon.txt" 2>&1 &
    DMON_PID=$!
    trap 'dmon_stop' EXIT
}
dmon_stop() {
    [ -n "${DMON_PID:-}" ] || return 0
    kill "$DMON_PID" 2> /dev/null
    wait "$DMON_PID" 2> /dev/null
    DMON_PID=
}
dmon_report() {
    local to
    to=$(date +%T)
    [ -n "${DMON_PID:-}" ] || return 0
    sleep 1
    dmon_stop
    python3 "$ROOT/gpu/dmon_busy.py" "$OUT/dmon.txt" "$DMON_FROM" "$to"
}
