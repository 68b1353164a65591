#!/usr/bin/env bash
# Profiles on the device (issue: profiler-guided search), in one call of about two minutes:
#   1. harness/tests/profiler_check.py: whether Nsight Compute profiles a process confined as
#      an accused one (ncu inside the sandbox, and ncu outside with its target inside), and
#      which of nsight.py's metrics this ncu knows (metrics.txt lists the tensor-pipe and
#      stall-reason names it has);
#   2. `ksearch profile --counters` of the attention ping-pong kernel (gpu/attention/
#      variants.toml, `wg_m128n128s2_pp`) and of the selective-scan kernel the Mamba bench uses
#      (gpu/mamba/variants.toml, mamba_model.DEFAULT_VARIANT), each evaluated, then run once
#      per shown workload under ncu: the table, the notes, and the JSON.
#
#   run(command="bash gpu/profile_check.sh", timeout_s=600, carry=[".device-carry/ks"])
#
# Prepare here: bash gpu/ksearch_bin.sh pack.
# Results in $OUT: check/ (profiler-check.json, metrics.txt, sections-raw.csv), attention.txt,
# attention.json, scan.txt, scan.json, the rendered kernels, log.txt.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/ksearch_env.sh" profile-check
ATTENTION=${ATTENTION:-wg_m128n128s2_pp}
SCAN=${SCAN:-chunked_fused}

started=$SECONDS
timeout 240 python3 harness/tests/profiler_check.py --out "$OUT/check"
echo "profiler_check: exit $?, $((SECONDS - started)) s"

# The named setting of a variants file, rendered by ksearch into FILE.
render() {  # TASK VARIANTS NAME FILE
    "$KS" tasks --render "$1" --backend cuda --list "$2" | python3 -c '
import json, subprocess, sys
name, ks, task, out = sys.argv[1:]
for line in sys.stdin:
    v = json.loads(line)
    if v.get("name") == name:
        req = json.dumps({"name": name, "knobs": v["knobs"]})
        r = subprocess.run([ks, "tasks", "--render", task, "--backend", "cuda", "--batch"],
                           input=req + "\n", capture_output=True, text=True, check=True)
        open(out, "w").write(json.loads(r.stdout.splitlines()[0])["source"])
        sys.exit(0)
sys.exit(f"no variant {name}")' "$3" "$KS" "$1" "$4"
}

profile() {  # TASK FILE NAME
    local t0=$SECONDS
    timeout 300 "$KS" profile --kernel "$2" --task "$1" --backend cuda --counters --json \
        > "$OUT/$3.json"
    echo "$3: profile --json exit $?, $((SECONDS - t0)) s"
    python3 - "$OUT/$3.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for w in p.get("workloads", []):
    d, c = w["diagnosis"], w["metrics"]["counters"]
    print(f'{w["workload"]:<20} {d["class"]:<14} SoL {100 * d["speed_of_light"]:5.1f}%  '
          f'dram {c.get("dram_pct")}  sm {c.get("compute_pct")}  tensor {c.get("tensor_pct")}  '
          f'occupancy {c.get("occupancy_pct")} ({c.get("occupancy_limiter")})  '
          f'registers {c.get("registers")}')
for n in p.get("notes", []):
    print("note:", n)
PY
}

render attention gpu/attention/variants.toml "$ATTENTION" "$OUT/attention.cu" \
    && profile attention "$OUT/attention.cu" attention
render selective-scan gpu/mamba/variants.toml "$SCAN" "$OUT/scan.cu" \
    && profile selective-scan "$OUT/scan.cu" scan
echo "profile_check: $((SECONDS - started)) s"
