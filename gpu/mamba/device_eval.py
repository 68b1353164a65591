"""Device check of the selective-scan task's GPU backends through the real harness: the task's
cuda / mlx workloads (held-out ones and the decay regimes included), resolved by ksearch itself
(`ksearch tasks --workloads`), and candidates (the seeds, named family variants) evaluated by
`ksearch_harness` in this process (its GPU adapter, the task's reference.py references and
baselines, every integrity check) — what `ksearch eval` would do on an H200.

    PYTHONPATH=harness python3 gpu/mamba/device_eval.py --backend cuda --json out.json \\
        [--variants s0_sequential,chunked_fused] [--process] [--ksearch target/release/ksearch]

Exit status 1 if a candidate does not pass.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TASK_DIR = REPO / "tasks" / "selective-scan"
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(REPO / "harness"))

from ksearch_render import Family  # noqa: E402

SPEC = tomllib.loads((TASK_DIR / "task.toml").read_text())
DEFAULT_TOL = {"f32": {"rtol": 2e-5, "atol": 1e-5}, "f16": {"rtol": 1e-2, "atol": 5e-3},
               "bf16": {"rtol": 2e-2, "atol": 1e-2}}


def workloads(ksearch: str, backend: str) -> list[dict]:
    """The task's workloads for `backend`, resolved by ksearch (shapes, dtypes, distributions,
    roofline numbers), exactly as it sends them to the harness."""
    out = subprocess.run([ksearch, "tasks", "--workloads", str(TASK_DIR), "--backend", backend],
                         capture_output=True, text=True, check=False,
                         env=dict(os.environ, KSEARCH_ROOT=str(REPO)))
    if out.returncode != 0:
        sys.exit(f"{ksearch} tasks --workloads failed ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout)


def request(backend: str, wls: list[dict], candidate: Path, build_dir: Path) -> dict:
    b = SPEC["backends"][backend]
    tol = {**DEFAULT_TOL, **SPEC.get("tolerance", {})}
    forbidden = sorted(set(b.get("forbidden", [])) | {"reference", b["reference"], b["baseline"]})
    return {
        "protocol": 1, "op": "evaluate", "nonce": os.urandom(8).hex(),
        "secret_seed": int.from_bytes(os.urandom(6), "little"), "backend": backend,
        "task": {"name": SPEC["name"], "dir": str(TASK_DIR),
                 "reference": {"module": SPEC["reference"]["module"], "function": b["reference"]},
                 "baseline": {"name": b["baseline"], "function": b["baseline"]},
                 "entry": {"symbol": b["entry"], "args": b["args"]}, "forbidden": forbidden},
        "candidate": {"path": str(candidate), "language": b["language"]},
        "build_dir": str(build_dir),
        "workloads": wls,
        "tolerance": tol,
        "correctness": {"trials": 2},
        "timing": {"warmup": 1, "min_reps": 3, "max_reps": 10, "target_seconds": 0.3,
                   "flush_bytes": 256 << 20},
        "timeout_s": 600,
    }


def summarize(name: str, result: dict) -> dict:
    cls = (result.get("violation") or {}).get("class")
    row = {"candidate": name, "status": result.get("status"), "violation": cls,
           "message": (result.get("message") or "")[:500], "score": result.get("score"),
           "workloads": []}
    for w in result.get("workloads", []):
        row["workloads"].append({k: w.get(k) for k in (
            "name", "held_out", "correct", "max_abs_err", "max_rel_err", "candidate_median_ns",
            "reference_median_ns", "baseline_median_ns", "speedup_vs_baseline", "floor_ns",
            "roofline_fraction")})
    if isinstance(result.get("build"), dict):
        ptx = result["build"].get("ptxas") or {}
        row["ptxas"] = {"max_registers": ptx.get("max_registers"),
                        "spill_bytes": ptx.get("spill_bytes")}
    row["environment"] = {k: (result.get("environment") or {}).get(k) for k in (
        "gpu", "mem_bandwidth_gbs", "peak_gflops", "torch", "mlx", "compiler")}
    mark = "ok  " if row["status"] == "passed" else "FAIL"
    print(f"[{mark}] {name:28s} {row['status']}{'/' + cls if cls else ''} score "
          f"{row['score']}", flush=True)
    if row["status"] != "passed":
        print(f"       {row['message']}", flush=True)
    for w in row["workloads"]:
        if w.get("candidate_median_ns"):
            print(f"       {w['name']:30s} {w['candidate_median_ns'] / 1e3:10.1f} us  baseline "
                  f"{(w['baseline_median_ns'] or 0) / 1e3:10.1f} us  x{w['speedup_vs_baseline'] or 0:8.1f}"
                  f"  err {w['max_rel_err']:.1e}", flush=True)
        elif w.get("correct") is False:
            print(f"       {w['name']:30s} INCORRECT err {w.get('max_rel_err')}", flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=("cuda", "mlx"), required=True)
    ap.add_argument("--variants", default="chunked_fused",
                    help="named variants to evaluate besides the seed (comma-separated)")
    ap.add_argument("--process", action="store_true",
                    help="also run the seed through `python -m ksearch_harness evaluate`")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--ksearch", default=os.environ.get("KSEARCH_BIN",
                                                        str(REPO / "target/release/ksearch")),
                    help="the ksearch binary that resolves the workloads and renders the variants (default: $KSEARCH_BIN, "
                         "else target/release/ksearch)")
    args = ap.parse_args(argv)
    os.environ["KSEARCH_BIN"] = args.ksearch  # the variants are rendered by the same ksearch
    wls = workloads(args.ksearch, args.backend)
    if args.backend == "mlx":
        os.environ.setdefault("MLX_ENABLE_TF32", "0")
    from ksearch_harness import worker
    from ksearch_harness.adapters import device
    from ksearch_harness.protocol import parse_request

    root = Path(tempfile.mkdtemp(prefix=f"ksm-eval-{args.backend}-"))
    fam = Family("selective-scan", args.backend)
    suffix = ".cu" if args.backend == "cuda" else ".py"
    seed = TASK_DIR / SPEC["backends"][args.backend]["seed"]
    candidates = [("seed", seed)]
    named = fam.variants(HERE / "variants.toml")
    chosen = [n for n in args.variants.split(",") if n]
    for name, source in zip(chosen, fam.render_many([named[n] for n in chosen])):
        path = root / f"{name}{suffix}"
        path.write_text(source)
        candidates.append((name, path))
    rows = []
    for name, path in candidates:
        raw = request(args.backend, wls, path, root / f"build-{name}")
        t0 = time.monotonic()
        try:
            result = worker.execute(parse_request(raw, "evaluate"))
        finally:
            device.deactivate()
        print(f"       ({time.monotonic() - t0:.1f} s)", flush=True)
        rows.append(summarize(name, result))
    if args.process:
        raw = request(args.backend, wls, seed, root / "build-process")
        req_path = root / "process.json"
        req_path.write_text(json.dumps(raw))
        r_fd, w_fd = os.pipe()
        with open(req_path) as stdin:
            proc = subprocess.run([sys.executable, "-m", "ksearch_harness", "evaluate",
                                   "--result-fd", str(w_fd)], stdin=stdin, pass_fds=(w_fd,),
                                  capture_output=True, text=True, timeout=900,
                                  env=dict(os.environ, PYTHONPATH=str(REPO / "harness") + os.pathsep
                                           + os.environ.get("PYTHONPATH", "")))
        os.close(w_fd)
        with os.fdopen(r_fd) as f:
            line = f.read().strip()
        result = json.loads(line) if line else {"status": "no result",
                                                "message": proc.stderr[-500:]}
        rows.append(summarize("seed (harness process)", result))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    failed = [r for r in rows if r["status"] != "passed"]
    print(f"{len(rows)} evaluations, {len(failed)} not passed; work dir {root}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
