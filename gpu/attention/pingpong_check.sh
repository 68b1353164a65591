#!/usr/bin/env bash
# One-shot H200 check of the wgmma ping-pong schedules (knob `wg_schedule`: pingpong, producer
# and producer_tma, docs/gpu-attention.md)
# against the two measured references, in one device call of at most ~150 s:
#   1. the libraries: unpacked from .gpu-carry/pingpong.tar.xz when it was built from this
#      checkout's templates, else built here with nvcc (python3, and a ksearch binary that
#      renders the variants: $KSEARCH_BIN or the checkout's target/*/ksearch; ~15 s);
#   2. smoke: every variant on many sequence lengths (1 .. 1000, partial tiles), D 64 and 128,
#      f16 and bf16, causal and not, against SDPA in f32, no sanitizer (the last two shapes have
#      80 and 150 heads: persistent blocks walk several tiles each, the last round partial).
#      A deadlock in the barrier protocol shows up here as a timeout; then each variant runs
#      alone (15 s each) and those that hang are left out of the later steps;
#   3. compute-sanitizer memcheck, then racecheck, on B1 H2 L300 D128 and D64 (both dtypes,
#      causal and not), only our kernels instrumented;
#   4. timing: bench.py --quick on B1 H32 L4096 D128 and D64, f16, causal and not, with the
#      correctness check against SDPA (median of 20, L2 flushed, CUDA events).
# Every step has a hard time limit cut to what is left of BUDGET_S (default 150); the sanitizer
# steps leave TIMING_S (default 45) for step 4.
#
# Prepare here, on the CPU machine (writes .gpu-carry/pingpong.tar.xz, about 0.4 MB):
#   bash gpu/attention/pingpong_check.sh --prepare [NVCC]
# Device call (repository root):
#   run(command="bash gpu/attention/pingpong_check.sh", timeout_s=200,
#       carry=[".gpu-carry/pingpong.tar.xz"])
# What comes back in $OUT: log.txt (everything), build.json (ptxas report of the variants),
# smoke.txt, memcheck.txt, racecheck.txt, bench.json. VARIANTS overrides the list.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
VARIANTS=${VARIANTS:-"wg_m128n128s3_prodtma_pers wg_m128n128s3_prodtma wg_m128n128s3_prod wg_m128n128s2_pp wg_m128n128s3_pp wg_m128n64s2_pp wg_m128n64s3_pp wg_m128n64s2_pp_ns wg_m128n128s2 wg_m64n64s2"}
CARRY=.gpu-carry/pingpong.tar.xz
# What the libraries are built from; a carry built from other sources is not used.
source_hash() {
    cat tasks/attention/templates-cuda/device.cuh.j2 tasks/attention/templates-cuda/attention.cu.j2 \
        gpu/attention/variants.toml gpu/attention/gpu.toml | sha256sum | cut -c1-16
}

if [ "${1:-}" = "--prepare" ]; then
    NVCC=${2:-$(ls -d "$ROOT"/.venv/lib/python3*/site-packages/nvidia/cu13/bin 2>/dev/null | head -n1)/nvcc}
    PY=${PY:-$ROOT/.venv/bin/python}
    BUILD=$(mktemp -d)
    # shellcheck disable=SC2086
    (cd gpu/attention && "$PY" build.py --out "$BUILD" --nvcc "$NVCC" --jobs "$(nproc)" --mlx-wrap \
        --only $VARIANTS) || exit 1
    source_hash > "$BUILD/SOURCE_HASH"
    mkdir -p .gpu-carry
    tar -C "$BUILD" -cf - --exclude='*.cu' --exclude='*.cuh' --exclude='*.o' . | xz -6 > "$CARRY"
    rm -rf "$BUILD"
    ls -l "$CARRY"
    exit 0
fi

OUT=${OUT:-/tmp/ksearch-pingpong-check}
WORK=${WORK:-/tmp/ksearch-pingpong-work}
BUILD=${BUILD:-$WORK/build}
BUDGET_S=${BUDGET_S:-150}
TIMING_S=${TIMING_S:-45}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK" "$BUILD"
exec > >(tee "$OUT/log.txt") 2>&1
# shellcheck source=device_lib.sh
source gpu/attention/device_lib.sh
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

# keep N: a sanitizer step's limit, leaving N seconds of the budget for the timing step.
keep() {
    local want=$1 left=$((BUDGET_S - SECONDS - $2))
    ((left < want)) && want=$left
    echo "$want"
}

step "machine"
nvidia-smi -L
compute-sanitizer --version 2>/dev/null | tail -n 1

step "libraries"
want=$(source_hash)
if [ -f "$CARRY" ]; then
    tar -C "$BUILD" -xJf "$CARRY"
    have=$(cat "$BUILD/SOURCE_HASH" 2>/dev/null || echo none)
    if [ "$have" != "$want" ]; then
        echo "the carry was built from other sources ($have, this checkout $want): rebuilding"
        rm -f "$BUILD"/*.so
    fi
fi
missing=""
for v in $VARIANTS; do [ -f "$BUILD/$v.so" ] || missing="$missing $v"; done
if [ -n "$missing" ]; then
    echo "building:$missing"
    # shellcheck disable=SC2086
    (cd gpu/attention && timeout "$(cap 60)" "$PY" build.py --out "$BUILD" --jobs 16 --only $missing) \
        || echo "BUILD FAILED"
fi
cp "$BUILD/build.json" "$OUT/build.json" 2>/dev/null
"$PY" - "$BUILD/build.json" $VARIANTS <<'PY'
import json, sys
report = {r["name"]: r for r in json.load(open(sys.argv[1]))}
for name in sys.argv[2:]:
    r = report.get(name)
    if not r:
        print(f"{name:<22} NOT BUILT")
        continue
    ks = r["kernels"]
    regs = sorted({k.get("registers") for k in ks})
    spill = sum(k.get("spill_stores", 0) + k.get("spill_loads", 0) for k in ks)
    print(f"{name:<22} ok={r['ok']} registers={regs} spill_bytes={spill} smem={r['smem_bytes']} "
          f"{' '.join(r.get('perf_warnings', []))}")
PY

# Only our kernels are instrumented: torch's own launches run at full speed.
SAN_FILTER=()
if compute-sanitizer --help 2>/dev/null | grep -q -- "--kernel-name"; then
    SAN_FILTER=(--kernel-name kns=ksa_attention)
fi
cd gpu/attention
# shellcheck disable=SC2086
ONLY=(--build-dir "$BUILD" --no-mlx --only $VARIANTS)

step "smoke: lengths 1..1000, D 64/128, f16/bf16, causal and not"
timeout "$(keep 25 $((TIMING_S + 60)))" "$PY" bench.py "${ONLY[@]}" --sanitize --check-shapes \
    1,2,1,64 1,2,33,128 1,2,64,64 1,2,65,128 1,2,127,64 1,2,128,128 1,2,129,64 1,2,191,128 \
    1,2,256,64 2,3,300,128 1,2,1000,64 1,4,1000,128 2,40,1000,128 3,50,1000,64 \
    > "$OUT/smoke.txt" 2>&1
rc=$?
echo "smoke rc=$rc (124: timed out, a hang)"
grep -v ': ok ' "$OUT/smoke.txt" | tail -n 30
if ((rc == 124)); then
    # Something hangs (the last line names the kernel that never returned). Find every variant
    # that does, one process each, and go on with the others.
    step "smoke timed out: which variants hang"
    kept=""
    for v in $VARIANTS; do
        timeout 15 "$PY" bench.py --build-dir "$BUILD" --no-mlx --only "$v" --sanitize \
            --check-shapes 1,2,300,128 1,2,65,64 > "$OUT/smoke-$v.txt" 2>&1
        r=$?
        echo "$v rc=$r $(tail -n 1 "$OUT/smoke-$v.txt")"
        ((r == 124)) || kept="$kept $v"
    done
    VARIANTS=$kept
    if [ -z "${VARIANTS// /}" ]; then
        step "every variant hangs; nothing left to check"
        exit 1
    fi
    # shellcheck disable=SC2086
    ONLY=(--build-dir "$BUILD" --no-mlx --only $VARIANTS)
fi

for tool in memcheck racecheck; do
    step "compute-sanitizer --tool $tool, B1 H2 L300 D128 and D64"
    limit=$(keep 40 "$TIMING_S")
    if ((limit < 10)); then
        echo "skipped: no time left"
        continue
    fi
    timeout "$limit" compute-sanitizer --tool "$tool" "${SAN_FILTER[@]}" --print-limit 20 \
        "$PY" bench.py "${ONLY[@]}" --sanitize --check-shapes 1,2,300,128 1,2,300,64 \
        > "$OUT/$tool.txt" 2>&1
    echo "$tool rc=$? (124: timed out)"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|Error|FAIL|checks," "$OUT/$tool.txt" | head -n 30
done

step "timing: B1 H32 L4096 D128 and D64, f16, causal and not"
timeout "$(cap 200)" "$PY" bench.py "${ONLY[@]}" --quick --budget-s "$(cap 200)" --json "$OUT/bench.json" \
    | grep -vE '^\{'
echo "timing rc=${PIPESTATUS[0]}"

step "done"
