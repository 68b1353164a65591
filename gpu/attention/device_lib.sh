# Sourced by device_check.sh and device_check_mlx.sh (the cuda and mlx halves of the device
# check): step headers, step limits cut to what is left of BUDGET_S, the environment ksearch
# runs with on the device, and a summary of an eval's JSON. Needs ROOT, WORK, BUDGET_S.

step() { printf '\n==== %s (%s, %ds)\n' "$*" "$(date +%T)" "$SECONDS"; }

# cap N: N seconds, or what is left of the budget if that is less (at least 1).
cap() {
    local want=$1 left=$((BUDGET_S - SECONDS - 5))
    ((left < want)) && want=$left
    ((want < 1)) && want=1
    echo "$want"
}

# fits N: whether N seconds of the budget are left.
fits() { ((BUDGET_S - SECONDS >= $1)); }

# ksearch reads tasks/, knowledge/ and harness/ from this checkout and runs the harness with the
# image's python3 (PyTorch, numpy, nvcc on PATH; MLX once the carry is assembled);
# nothing is installed.
ksearch_env() {
    export KSEARCH_ROOT="$ROOT"
    export KSEARCH_PYTHON=${KSEARCH_PYTHON:-$(command -v python3)}
    export KSEARCH_CACHE_DIR="$WORK/cache"
    export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
}

# summarise_eval FILE BASELINE: verdict, build report (cuda) and per-workload times of a
# `ksearch eval --json` result, with the ratio against BASELINE (the task's baseline there).
summarise_eval() {
    "$KSEARCH_PYTHON" - "$1" "$2" <<'PY'
import json, sys
baseline = sys.argv[2]
for item in json.load(open(sys.argv[1])):
    r = item.get("result") or {}
    print(item["file"], r.get("status"), r.get("message", "")[:300], "score", r.get("score"))
    b = r.get("build") or {}
    if b.get("arch"):
        ptxas = b.get("ptxas") or {}
        print("  build", b.get("arch"), b.get("seconds"), "s; max registers",
              ptxas.get("max_registers"), "spill bytes", ptxas.get("spill_bytes"))
    for w in r.get("workloads", []):
        med = w.get("candidate_median_ns")
        print(f"  {w['name']:<28} correct={w.get('correct')} "
              f"median={med / 1e6 if med else float('nan'):.3f} ms "
              f"vs {baseline} x{w.get('speedup_vs_baseline')} err={w.get('max_rel_err')}")
PY
}
