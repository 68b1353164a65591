#!/usr/bin/env bash
# The evaluator's judge/accused split on the GPU machine, in one device call: the cpu-backend
# cheat corpus, the sandbox tests and the honest kernels under this machine's kernel and
# cgroups; then the cuda and (when MLX imports) mlx smoke cases through the accused process,
# with the sandbox layers, the kernel audit's findings, round-trip costs and phase times per
# case. Results land in $OUT (pytest.txt, gpu_smoke.json, harness_check.log).
#
#   bash gpu/harness_check.sh                                 # cuda only
#   source .device-carry/mlx2/assemble.sh && bash gpu/harness_check.sh   # with MLX (see
#                                                                          # ../shared/device)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$(mktemp -d)}
export PYTHONPATH="$PWD/harness${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
exec > >(tee "$OUT/harness_check.log") 2>&1

python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
            torch.cuda.get_device_name(0))'
nproc; uname -r
skip_mlx=--skip-mlx
if python3 -c 'import mlx.core as mx; assert mx.cuda.is_available()' 2>/dev/null; then
    skip_mlx=
fi

echo "== cpu corpus, sandbox and honest kernels =="
started=$SECONDS
python3 -m pytest -q -p no:cacheprovider harness/tests/test_cheats.py \
    harness/tests/test_sandbox.py harness/tests/test_honest.py harness/tests/test_kernel_audit.py \
    2>&1 | tail -25 | tee "$OUT/pytest.txt"
echo "pytest took $((SECONDS - started)) s"

echo "== gpu smoke =="
started=$SECONDS
python3 harness/tests/gpu_smoke.py --json "$OUT/gpu_smoke.json" $skip_mlx
echo "gpu smoke took $((SECONDS - started)) s"
