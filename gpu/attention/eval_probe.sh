#!/usr/bin/env bash
# How far the harness's MLX evaluation is from `ksearch bench` for the same kernels, and whether
# bringing the clocks up before each timed call (KSEARCH_HARNESS_CLOCK_WARMUP_MS) closes it.
# On a two-workload copy of the attention task (B1 H32 L4096 D128 f16, causal and not), so one
# evaluation takes seconds rather than a minute. Run on the device with MLX assembled:
#   OUT=dir bash gpu/attention/eval_probe.sh kernel.py [kernel.py ...]
# Writes $OUT/eval-w<ms>.json (the harness's raw results) and $OUT/bench-<kernel>-<i>.txt
# (BENCH_TIMES benches of BENCH_REPS rounds per kernel; WARMUPS lists the clock warm-ups).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUT=${OUT:?set OUT}
mkdir -p "$OUT"
TASK=/tmp/ksearch-probe-task
rm -rf "$TASK" && cp -r "$ROOT/tasks/attention" "$TASK"
python3 - "$TASK/task.toml" <<'PY'
import re, sys
p = sys.argv[1]
s = open(p).read()
head, *blocks = re.split(r"(?m)^\[\[workloads\]\]\n", s)
keep = []
tail = ""
for b in blocks:
    # The last block carries the sections after the workloads.
    m = re.search(r"(?m)^\[(?!\[workloads)", b)
    body, rest = (b[:m.start()], b[m.start():]) if m else (b, "")
    tail = rest or tail
    # The loader wants a workload on every backend the task declares: one of the cpu ones.
    if 'backends = ["cpu"]' in body and "held_out" not in body and not any(
            'backends = ["cpu"]' in k for k in keep):
        keep.append(body)
    if "B = 1, H = 32, L = 4096, D = 128" in body and 'dtype = "f16"' in body:
        keep.append(body)
    if 'name = "b1h32l4096d128-f16-causal"' in body:
        keep.append(body.replace("b1h32l4096d128-f16-causal", "b1h32l4096d128-f16")
                    .replace("causal = 1", "causal = 0"))
s = head + "".join("[[workloads]]\n" + b for b in dict.fromkeys(keep)) + tail
open(p, "w").write(s)
PY
grep -c '^\[\[workloads' "$TASK/task.toml"
for w in ${WARMUPS:-0 20}; do
    KSEARCH_HARNESS_CLOCK_WARMUP_MS=$w "$ROOT/target/release/ksearch" eval --task "$TASK" \
        --backend mlx --timing quick --seed 7 --json "$@" > "$OUT/eval-w$w.json"
    echo "eval (clock warm-up $w ms) exit code $?"
    python3 - "$OUT/eval-w$w.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    res = r.get("result", r)
    for w in res.get("workloads", []):
        c, b = w.get("candidate_ns"), w.get("baseline_ns")
        if not c:
            continue
        med = lambda xs: sorted(xs)[len(xs) // 2] / 1e6
        print(f"{r.get('file', '?')[-28:]:28s} {w['name']:28s} cand {med(c):.3f} "
              f"[{min(c)/1e6:.3f}..{max(c)/1e6:.3f}] native {med(b):.3f} "
              f"[{min(b)/1e6:.3f}..{max(b)/1e6:.3f}] ratio {med(b)/med(c):.2f}")
PY
done
for i in $(seq "${BENCH_TIMES:-1}"); do
    for k in "$@"; do
        "$ROOT/target/release/ksearch" bench attention --kernel "$k" --backend mlx \
            --reps "${BENCH_REPS:-20}" --warmup 10 \
            --shapes "b1h32l4096d128-f16-causal;B=1,H=32,L=4096,D=128,causal=0,dtype=f16" \
            | tee "$OUT/bench-$(basename "$k" .py)-$i.txt"
    done
done
