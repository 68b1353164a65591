"""What the judge/accused split costs per evaluation (not a test; run by hand): the same request
evaluated by this harness and by an earlier harness tree, alternately, each in a fresh process
the way ksearch runs it, with the total wall time and the phases of every run.

    git archive <commit> harness | tar -x -C /tmp/before     # a harness from before the split
    PYTHONPATH=harness python harness/tests/isolation_cost.py --before /tmp/before/harness \\
        [--backend cpu|cuda] [--runs 5] [--json out.json]

cpu: the softmax fixture's naive kernel (driver.softmax_request). cuda: the attention seed on
gpu_smoke.py's f16 workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import driver  # noqa: E402


def request(backend: str, root: Path) -> dict:
    root.mkdir(parents=True, exist_ok=True)
    if backend == "cpu":
        return driver.softmax_request(driver.HONEST / "naive.c", root)
    import gpu_smoke
    seed = root / "seed.cu"
    seed.write_text(gpu_smoke.SEED_CU)
    return gpu_smoke.request("cuda", seed, root / "build", gpu_smoke.F16, "f16", "attention_f16")


def one(harness: Path, raw: dict, trees: tuple[Path, ...]) -> dict:
    """One evaluation by the harness in `harness`; no other harness tree stays on the path."""
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
              if p and Path(p).resolve() not in trees]
    env = {"PYTHONPATH": os.pathsep.join([str(harness)] + others)}
    saved = driver.HARNESS_DIR
    driver.HARNESS_DIR = harness
    try:
        t0 = time.perf_counter()
        run = driver.run_harness("evaluate", raw, timeout=raw["timeout_s"] + 60, env=env)
        wall = time.perf_counter() - t0
    finally:
        driver.HARNESS_DIR = saved
    res = run.result or {}
    return {"wall_s": wall, "status": res.get("status"), "message": res.get("message", "")[:200],
            "phases": (res.get("diagnostics") or {}).get("phase_seconds"),
            "handshake": (res.get("environment") or {}).get("handshake")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="an earlier harness directory")
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    now = HERE.parent.resolve()
    before = args.before.resolve()
    trees = (now, before)
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(args.runs):
            for name, tree in (("before", before), ("after", now))[:: 1 if i % 2 else -1]:
                raw = request(args.backend, Path(d) / f"{name}-{i}")
                r = one(tree, raw, trees)
                rows[name].append(r)
                print(f"{name:6s} run {i}: {r['wall_s']:.2f} s {r['status']}", flush=True)
    summary = {}
    for name, rs in rows.items():
        walls = [r["wall_s"] for r in rs]
        summary[name] = {"median_s": statistics.median(walls), "min_s": min(walls),
                         "max_s": max(walls), "statuses": sorted({str(r["status"]) for r in rs})}
        print(f"{name:6s} median {summary[name]['median_s']:.2f} s "
              f"(min {summary[name]['min_s']:.2f}, max {summary[name]['max_s']:.2f}); "
              f"statuses {summary[name]['statuses']}")
    if args.json:
        args.json.write_text(json.dumps({"backend": args.backend, "runs": rows,
                                         "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
