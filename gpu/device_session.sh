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
# A shorter pair re-measures after changes (same carries): `3` (cuda: a short `ksearch run`
# on the attention family, the channel-tiled scan variants; run it with TOTAL_S=230) then `4`
# (MLX: `ksearch bench mamba` end to end with the pipelined and the sync decode loop, then
# attention through MLX).
#
# The last pair of a session (5, 6, 7) after the decode and ping-pong changes: `5` (carry
# ksearch, .device-carry/mlx1, .gpu-carry: stash, attention ping-pong check), `6` (carry
# ksearch, .device-carry/mlx2: MLX launch-setting probe, whole-model mamba bench under the
# cheapest setting), `7` (same carry: an offline search on attention through the mlx backend,
# its show/export and run store).
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
# This checkout's ksearch and harness, with the image's python3 (torch, nvcc, jinja2).
use_ksearch() {
    export KSEARCH_ROOT=$ROOT KSEARCH_PYTHON=$(command -v python3) PYTHONUNBUFFERED=1
    export KSEARCH_CACHE_DIR=/tmp/ksearch-device-work/cache
}
# MLX's second carry half joined to the first (stashed by an earlier call), then use_ksearch.
use_mlx() {
    # shellcheck disable=SC1091
    source .device-carry/mlx2/assemble.sh || exit 3
    use_ksearch
}

# Nsight Compute: on the PATH or where the image installs it; empty when absent.
find_ncu() { command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1; }

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
elif [ "$N" = 3 ]; then
    # The short pair, after changes: MLX half 1 stashed; a short offline search on the cuda
    # family through ksearch; the channel-tiled scan variants on the cuda backend.
    bash .device-carry/mlx1/stash.sh
    use_ksearch
    mkdir -p "$PARTS/attention" "$PARTS/mamba"
    timeout $(($(left) - 100)) target/release/ksearch run --task attention --backend cuda \
        --rounds "${ROUNDS:-3}" --max-wall-time "${RUN_WALL_S:-90}" --timing quick --seed 1 \
        --runs-dir /tmp/ksearch-device-work/runs --json > "$PARTS/attention/run-cuda.json"
    echo "run exit code $?"
    RUN_ID=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"])' \
        "$PARTS/attention/run-cuda.json" 2>/dev/null)
    [ -n "$RUN_ID" ] && target/release/ksearch show "$RUN_ID" \
        --runs-dir /tmp/ksearch-device-work/runs | tee "$PARTS/attention/show-cuda.txt" | head -n 60
    NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    timeout $(($(left) - 5)) python3 gpu/mamba/kernel_bench.py --backend cuda --nvcc "$NVCC" \
        --variants chunked_fused,tiled_c32_t256,tiled_c16_t256,tiled_c16_t512,tiled_c32_t512 \
        --json "$PARTS/mamba/kernel_cuda_tiled.json"
elif [ "$N" = 4 ]; then
    # The short pair's MLX call: the whole-model bench through `ksearch bench mamba` (tuned
    # scan, four-kernel decode, every implementation), then attention through MLX (eval, bench,
    # a short search).
    use_mlx
    mkdir -p "$PARTS/mamba"
    timeout "${MAMBA_BUDGET_S:-260}" target/release/ksearch bench mamba --kernel-only \
        --timeout "$((${MAMBA_BUDGET_S:-260} - 10))" --save "$PARTS/mamba/bench.json" \
        | tee "$PARTS/mamba/bench.txt"
    echo "bench mamba exit code $?"
    # The same model with each step evaluated before the next is built (the loop of the first
    # results), so both decode loops are compared in one call.
    timeout 120 target/release/ksearch bench mamba --impls ksearch,mlx-lm --lengths 512 \
        --stock-budget 10 --decode-loop sync --timeout 110 \
        --save "$PARTS/mamba/bench-sync.json" | tee "$PARTS/mamba/bench-sync.txt"
    python3 - "$PARTS/mamba/bench.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no bench JSON: {e}")
for row in r.get("rows", []):
    print(row["impl"], {k: round(v) for k, v in row["prefill_tok_s"].items()},
          "decode", row.get("decode_tok_s"), row.get("error", ""))
print("kernel", json.dumps(r.get("kernel"))[:600])
print("overhead", r.get("mlx_launch_overhead"), "kernel_only", r.get("kernel_only"))
PY
    OUT=$PARTS/attention BUDGET_S=$(($(left) - 5)) ROUNDS=${ROUNDS:-2} \
        RUN_WALL_S=${RUN_WALL_S:-60} bash gpu/attention/device_check_mlx.sh
elif [ "$N" = 5 ]; then
    # Last pair of this session, call 1 (carry ksearch, .device-carry/mlx1 and .gpu-carry):
    # MLX half 1 stashed, then the attention ping-pong variants (memcheck, racecheck, timing
    # against the lockstep wgmma variants and SDPA) on the cuda side.
    bash .device-carry/mlx1/stash.sh
    if [ -f gpu/attention/pingpong_check.sh ]; then
        OUT=$PARTS/attention timeout $(($(left) - 5)) bash gpu/attention/pingpong_check.sh
        echo "pingpong_check exit code $?"
    fi
elif [ "$N" = 6 ]; then
    # Call 2 (carry ksearch and .device-carry/mlx2): MLX's cost per primitive under each
    # launch setting, then the whole-model bench under the cheapest (every implementation runs
    # under it; the setting is in the log and mlx-env.json), sync decode loop.
    use_mlx
    mkdir -p "$PARTS/mamba"
    BEST=$(timeout 60 python3 gpu/mamba/mlx_env_probe.py --json "$PARTS/mamba/mlx-env.json" \
        --print-best)
    echo "MLX launch setting for the bench: ${BEST:-defaults}"
    for kv in $BEST; do export "${kv?}"; done
    timeout $(($(left) - 10)) target/release/ksearch bench mamba --kernel-only \
        --stock-budget 10 --decode-loop sync ${MAMBA_FLAGS:-} \
        --timeout $(($(left) - 20)) --save "$PARTS/mamba/bench.json" | tee "$PARTS/mamba/bench.txt"
    echo "bench mamba exit code $?"
elif [ "$N" = 7 ]; then
    # Call 3 (carry ksearch and .device-carry/mlx2): the offline search on the attention
    # task through the mlx backend, from the naive seed, then show (with the path to the best)
    # and export. The run store travels back whole.
    use_mlx
    RUNS=/tmp/ksearch-device-work/runs
    mkdir -p "$PARTS/attention" "$RUNS"
    # Its own session: when this run was stopped by `timeout` on the H200, the rest of the
    # script went with it and show/export never ran (the run store came back by a second call).
    setsid --wait timeout $(($(left) - 60)) target/release/ksearch run --task attention --backend mlx \
        --rounds "${ROUNDS:-12}" --max-wall-time "${RUN_WALL_S:-300}" --timing quick --seed 1 \
        --runs-dir "$RUNS" --json > "$PARTS/attention/run-mlx.json"
    echo "run exit code $?"
    RUN_ID=$(ls -t "$RUNS" | head -n 1)
    if [ -n "$RUN_ID" ]; then
        target/release/ksearch show "$RUN_ID" --all --runs-dir "$RUNS" \
            | tee "$PARTS/attention/show-mlx.txt"
        target/release/ksearch export "$RUN_ID" --runs-dir "$RUNS" \
            --out "$PARTS/attention/export-mlx"
        tar -C "$RUNS" -czf "$PARTS/attention/run-store.tar.gz" "$RUN_ID"
    fi
elif [ "$N" = 8 ]; then
    # The offline search on attention through the mlx backend in two calls (carry ksearch,
    # .device-carry/mlx2 and, for the second, .gpu-carry/run-store.tar.gz), after a call that
    # stashed MLX half 1. One attempt per cycle: each action is measured once, so the search
    # climbs the catalog's ladder in as few evaluations as it has actions to try.
    #   first:  bash gpu/device_session.sh 8            # new run, stopped by its wall budget
    #   second: RUN=<id> bash gpu/device_session.sh 8   # resume under a raised wall budget,
    #                                                   # re-check, bench the best
    # The first call skips the re-check (about two minutes) so that its time goes to rounds.
    # The run store travels back after each call (and forth again if the machine was lost).
    use_mlx
    RUNS=/tmp/ksearch-device-work/runs
    mkdir -p "$PARTS/attention" "$RUNS"
    if [ -z "${RUN:-}" ]; then
        # No `timeout` here: when it fired on the H200 it took the whole script down. The
        # search stops itself between rounds after RUN_WALL_S.
        target/release/ksearch run --task attention --backend mlx --rounds "${ROUNDS:-20}" \
            --cycle-cap 1 --stagnation-window 1 --max-wall-time "${RUN_WALL_S:-480}" \
            --no-recheck --timing quick --seed "${SEARCH_SEED:-1}" --runs-dir "$RUNS" \
            --json > "$PARTS/attention/run-mlx.json"
        echo "run exit code $?"
        RUN=$(ls -t "$RUNS" | head -n 1)
    else
        if [ ! -d "$RUNS/$RUN" ] && [ -f .gpu-carry/run-store.tar.gz ]; then
            echo "fresh machine: the run store comes from the carry"
            tar -C "$RUNS" -xzf .gpu-carry/run-store.tar.gz
        fi
        target/release/ksearch resume "$RUN" --runs-dir "$RUNS" --recheck \
            --max-wall-time "${RUN_WALL_S:-800}" --json > "$PARTS/attention/resume-mlx.json"
        echo "resume exit code $?"
        target/release/ksearch bench attention --run "$RUN" --runs-dir "$RUNS" --backend mlx \
            --reps 30 --timeout "${BENCH_S:-100}" \
            --shapes "b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16" \
            | tee "$PARTS/attention/bench-best.txt"
        echo "bench exit code $?"
    fi
    if [ -n "$RUN" ] && [ -d "$RUNS/$RUN" ]; then
        target/release/ksearch show "$RUN" --all --runs-dir "$RUNS" \
            | tee "$PARTS/attention/show-mlx.txt" | head -n 80
        target/release/ksearch export "$RUN" --runs-dir "$RUNS" \
            --out "$PARTS/attention/export-mlx"
        tar -C "$RUNS" -czf "$PARTS/attention/run-store.tar.gz" "$RUN"
        cp "$PARTS/attention/run-store.tar.gz" "$FINAL/run-store.tar.gz"
    fi
elif [ "$N" = 9 ]; then
    # Stash MLX half 1 (carry ksearch, .device-carry/mlx1, .gpu-carry), then what exp2 is worth
    # in the tensor-core kernels: each of s5_mma_cpasync, wg_m64n64s2 and wg_m128n128s3_pp
    # against its expf twin, cuda backend, CUDA events (built here: .gpu-carry/exp2.tar.xz).
    bash .device-carry/mlx1/stash.sh
    mkdir -p .gpu-build "$PARTS/attention" && tar -C .gpu-build -xJf .gpu-carry/exp2.tar.xz
    (cd gpu/attention && python3 bench.py --build-dir ../../.gpu-build --no-mlx --quick \
        --reps 30 --budget-s 150 --json "$PARTS/attention/exp2.json" \
        --only s5_mma_cpasync s5_mma_cpasync_expf wg_m64n64s2 wg_m64n64s2_expf \
        wg_m128n128s3_pp wg_m128n128s3_pp_expf)
    echo "exp2 bench exit code $?"
elif [ "$N" = 10 ]; then
    # Carry ksearch, .device-carry/mlx2 and .gpu-carry: the harness's MLX evaluation against
    # `ksearch bench` for the same kernels, with and without the clock warm-up.
    use_mlx
    OUT=$PARTS/attention bash gpu/attention/eval_probe.sh .gpu-carry/probe/pp.py \
        .gpu-carry/probe/wg_m64n64_expf.py
elif [ "$N" = 11 ]; then
    # Stash MLX half 1 (carry ksearch, .device-carry/mlx1, .gpu-carry/ppab.tar.xz: the ping-pong
    # variants with two and three stages, built here by build.py --only), then where the
    # ping-pong kernel's time goes: Nsight Compute on one call (B1 H32 L4096 D128 f16, causal
    # and not), and both variants' CUDA-event times.
    bash .device-carry/mlx1/stash.sh
    mkdir -p .gpu-build "$PARTS/attention" && tar -C .gpu-build -xJf .gpu-carry/ppab.tar.xz
    NCU=$(find_ncu)
    cd gpu/attention
    for so in wg_m128n128s2_pp wg_m128n128s3_pp; do
        for c in "" --causal; do
            python3 ncu_probe.py --so "../../.gpu-build/$so.so" $c --time
        done
    done
    if [ -n "$NCU" ]; then
        for c in "" --causal; do
            "$NCU" --clock-control none --launch-skip 1 --launch-count 1 -k regex:ksa_attention \
                --set full -o "$PARTS/attention/ncu-s3${c}" \
                python3 ncu_probe.py --so ../../.gpu-build/wg_m128n128s3_pp.so $c
            "$NCU" --import "$PARTS/attention/ncu-s3${c}.ncu-rep" --page details \
                > "$PARTS/attention/ncu-s3${c}.txt" 2>&1
            "$NCU" --import "$PARTS/attention/ncu-s3${c}.ncu-rep" --page raw --csv \
                > "$PARTS/attention/ncu-s3${c}-raw.csv" 2>&1
            grep -E "Throughput|Pipe|Issue|Stall|Warp Cycles|Eligible|Active|Shared|Bank" \
                "$PARTS/attention/ncu-s3${c}.txt" | head -n 60
        done
    else
        echo "no ncu on this machine"
    fi
    cd "$ROOT"
elif [ "$N" = 12 ]; then
    # Carry ksearch, .device-carry/mlx2 and .gpu-carry/probe: the harness's MLX evaluation
    # against `ksearch bench` (contenders interleaved, BENCH_REPS rounds) for the ping-pong
    # kernels with three and two stages, after the reference was blocked.
    use_mlx
    WARMUPS=${WARMUPS:-0} BENCH_REPS=${BENCH_REPS:-100} BENCH_TIMES=${BENCH_TIMES:-2} OUT=$PARTS/attention \
        bash gpu/attention/eval_probe.sh .gpu-carry/probe/pp.py .gpu-carry/probe/best_pp.py
elif [ "$N" = 13 ]; then
    # Stash MLX half 1 (carry ksearch, .device-carry/mlx1, .gpu-carry/pingpong.tar.xz from
    # `pingpong_check.sh --prepare` and .gpu-carry/ppab.tar.xz, the same kernels before the
    # change), then the ping-pong check of the current templates (smoke over L = 1..1000,
    # memcheck, racecheck, timing), the old and new three-stage kernels on CUDA events in one
    # process each, and Nsight Compute on the new one.
    bash .device-carry/mlx1/stash.sh
    mkdir -p "$PARTS/attention" .gpu-build-old && tar -C .gpu-build-old -xJf .gpu-carry/ppab.tar.xz
    OUT=$PARTS/attention/check BUDGET_S=${CHECK_S:-170} bash gpu/attention/pingpong_check.sh
    echo "pingpong_check exit code $?"
    NEW=/tmp/ksearch-pingpong-work/build
    cd gpu/attention
    for round in 1 2; do
        for so in ../../.gpu-build-old/wg_m128n128s3_pp.so $NEW/wg_m128n128s3_pp.so \
                  ../../.gpu-build-old/wg_m128n128s2_pp.so $NEW/wg_m128n128s2_pp.so; do
            for c in "" --causal; do python3 ncu_probe.py --so "$so" $c --time; done
        done
    done
    NCU=$(find_ncu)
    if [ -n "$NCU" ]; then
        "$NCU" --clock-control none --launch-skip 1 --launch-count 1 -k regex:ksa_attention \
            --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
            --section SchedulerStats -o "$PARTS/attention/ncu-s3-new" \
            python3 ncu_probe.py --so "$NEW/wg_m128n128s3_pp.so"
        "$NCU" --import "$PARTS/attention/ncu-s3-new.ncu-rep" --page details \
            > "$PARTS/attention/ncu-s3-new.txt" 2>&1
        grep -E "Duration|Throughput|Issue Slots|Eligible|Warp Cycles Per Issued|pipeline" \
            "$PARTS/attention/ncu-s3-new.txt" | head -n 30
    fi
    cd "$ROOT"
elif [ "$N" = 14 ]; then
    # Carry ksearch only (no MLX): the offline search on attention through the cuda backend,
    # one attempt per cycle as in mode 8, stopped by RUN_WALL_S between rounds (no `timeout`,
    # see there); then `ksearch bench --run` (30 interleaved rounds against SDPA), show and the
    # run store.
    use_ksearch
    RUNS=/tmp/ksearch-device-work/runs-cuda
    mkdir -p "$PARTS/attention" "$RUNS"
    target/release/ksearch run --task attention --backend cuda --rounds "${ROUNDS:-20}" \
        --cycle-cap 1 --stagnation-window 1 --max-wall-time "${RUN_WALL_S:-380}" \
        --no-recheck --timing quick --seed "${SEARCH_SEED:-1}" --runs-dir "$RUNS" \
        --json > "$PARTS/attention/run-cuda.json"
    echo "run exit code $?"
    RUN=$(ls -t "$RUNS" | head -n 1)
    if [ -n "$RUN" ]; then
        target/release/ksearch bench attention --run "$RUN" --runs-dir "$RUNS" --backend cuda \
            --reps 30 --timeout "${BENCH_S:-100}" \
            --shapes "b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16" \
            | tee "$PARTS/attention/bench-cuda.txt"
        target/release/ksearch show "$RUN" --runs-dir "$RUNS" \
            | tee "$PARTS/attention/show-cuda.txt" | head -n 30
        tar -C "$RUNS" -czf "$PARTS/attention/run-store-cuda.tar.gz" "$RUN"
    fi
else
    echo "usage: device_session.sh 1|2|...|14" >&2
    exit 2
fi
echo "== device_session $N done at $(date +%T) (${SECONDS}s)"
