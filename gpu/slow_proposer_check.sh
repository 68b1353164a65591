#!/usr/bin/env bash
# How busy a search keeps the device while its proposer takes seconds per call (issue:
# evaluation at search speed): `ksearch run --task attention --backend cuda` with a scripted
# proposer (gpu/scripted_proposer.py) that answers every call after DELAY seconds (default 10)
# with the next kernel of a fixed ladder of the attention family (mma.sync, cp.async, causal
# skip, wgmma, ping-pong, then other tensor-core settings, each kernel distinct), SAMPLES
# candidates per round (default 4), STRATEGY (default world-model; best-of-n asks for the next
# round while the current one is evaluated), ROUNDS (default 5); then `ksearch show` of the run
# (the `time:` block: device busy, the proposer's seconds, what overlapped).
#
#   run(command="STRATEGY=best-of-n bash gpu/slow_proposer_check.sh", timeout_s=600,
#       carry=[".device-carry/ks"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack. Results in
# $OUT: run.json, show.txt, show.json, log.txt, and store.tar.gz (the run directory: its
# events, proposer exchanges and every evaluation); on NVIDIA also dmon.txt, the driver's
# samples of the device's activity (ksearch_env.sh's dmon_start, gpu/dmon_busy.py).
set -uo pipefail

STRATEGY=${STRATEGY:-world-model}
source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" "slow-proposer-$STRATEGY"
KERNELS=$WORK/kernels
RUNS=$WORK/runs
mkdir -p "$KERNELS" "$RUNS"
python3 - "$KERNELS" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, "gpu")
from ksearch_render import Family
fam = Family("attention", "cuda")
named = fam.variants(Path("gpu/attention/variants.toml"))
ladder = ["s4_mma", "s5_mma_cpasync", "s7_causal_skip", "s8_wgmma", "wg_m128n128s2",
          "wg_m128n128s2_pp", "wg_m128n128s3_pp"]
kernels = [(name, fam.render(named[name])) for name in ladder]
# Then other tensor-core settings of the family, spread over its enumeration, so that every
# sample of the run is a kernel of its own (a repeated source reuses its result and would
# make the device look idle): 28 in all, 20 samples at the defaults.
taken = [named[name] for name in ladder]
extra = [k for k in fam.enumerate() if k.get("algo") in ("mma", "wgmma") and k not in taken]
step = max(1, len(extra) // 21)
for j, knobs in enumerate(extra[::step][:21]):
    kernels.append((f"enum{j:02d}", fam.render(knobs)))
for i, (name, src) in enumerate(kernels):
    Path(sys.argv[1], f"{i:02d}-{name}.cu").write_text(src)
print(f"{len(kernels)} kernels for the scripted proposer")
PY
export KSEARCH_AGENT_KERNELS=$KERNELS KSEARCH_AGENT_DELAY=${DELAY:-10}
dmon_start
started=$SECONDS
"$KS" run --task attention --backend cuda --strategy "$STRATEGY" --proposer command \
    --command "python3 $ROOT/gpu/scripted_proposer.py" --samples "${SAMPLES:-4}" \
    --rounds "${ROUNDS:-5}" --runs-dir "$RUNS" --max-wall-time "${GUARD_S:-500}" --json \
    > "$OUT/run.json"
echo "run exit code $?, $((SECONDS - started)) s"
dmon_report
RUN=$(ls -t "$RUNS" | head -n 1)
[ -n "$RUN" ] || { echo "no run in $RUNS" >&2; exit 1; }
"$KS" show "$RUN" --runs-dir "$RUNS" > "$OUT/show.txt"
"$KS" show "$RUN" --runs-dir "$RUNS" --json > "$OUT/show.json"
sed -n '1,/^path to the best/p' "$OUT/show.txt"
tar -C "$RUNS" -czf "$OUT/store.tar.gz" "$RUN"
