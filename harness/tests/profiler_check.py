"""Whether Nsight Compute can profile a process confined as an accused one, on this GPU, and
which of the metrics nsight.py asks for this ncu knows (not a test; run by hand on a CUDA
machine, CI has none):

    PYTHONPATH=harness python3 harness/tests/profiler_check.py [--ncu PATH] [--out DIR]

Four steps, each recorded whatever the others do:
- `metrics`: `ncu --query-metrics` for the GPU's chip: which of nsight.ALL_METRICS it lacks,
  and every metric whose name speaks of tensor pipes (hmma, gmma) or warp stalls, kept in
  DIR/metrics.txt, to choose the tensor-pipe and stall-reason names from;
- `sections`: the raw page of ncu's SpeedOfLight, Occupancy, ComputeWorkloadAnalysis and
  WarpStateStats sections for one cuBLAS matmul, unconfined (DIR/sections-raw.csv): the names
  ncu's own analysis reads;
- `inside`: ncu and the matmul both in the accused's sandbox (sandbox.launch with
  accused_policy, exec and fork allowed, since ncu starts its target), with nsight.command's
  metrics, read back by nsight.parse_raw_csv and nsight.reduce;
- `outside`: ncu unconfined, its target started through the sandbox (ncu follows it into the
  new namespaces, or fails to).
Prints and writes DIR/profiler-check.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "harness"))

from ksearch_harness import nsight, sandbox  # noqa: E402
from ksearch_harness.accused_client import accused_policy  # noqa: E402

MATMUL = ("import torch\n"
          "a = torch.randn(4096, 4096, device='cuda', dtype=torch.float16)\n"
          "b = a @ a\n"
          "torch.cuda.synchronize()\n"
          "print('matmul done', float(b[0, 0]))\n")
# cuBLAS's GEMM kernels on Hopper, and not PyTorch's randn.
GEMM = r"regex:.*(gemm|sm90|xmma|cutlass).*"
KEEP = ("gmma", "hmma", "tensor_op", "stall", "warp_latency", "warps_issue")
TIMEOUT_S = 180


def _run(cmd: list[str], **kw) -> dict:
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, **kw)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": repr(e), "seconds": round(time.monotonic() - t, 2)}
    return {"rc": p.returncode, "seconds": round(time.monotonic() - t, 2),
            "stdout": p.stdout, "stderr": p.stderr[-3000:]}


def _read_back(log: str) -> dict:
    if not os.path.exists(log):
        return {"log": None}
    text = Path(log).read_text(errors="replace")
    out: dict = {"log_tail": text[-2000:]}
    try:
        launches = nsight.parse_raw_csv(text)
        out["launches"] = [l["kernel"][:120] for l in launches]
        out["counters"] = nsight.reduce(launches, lambda name: "gemm" in name or "sm90" in name
                                        or "xmma" in name or "cutlass" in name)
    except nsight.NsightError as e:
        out["parse_error"] = str(e)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default=os.environ.get("OUT", "profiler-check"))
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    ncu = args.ncu
    res: dict = {"ncu": ncu, "version": _run([ncu, "--version"]).get("stdout", "").strip()}

    import torch
    major, minor = torch.cuda.get_device_capability()
    chip = {(9, 0): "gh100"}.get((major, minor), f"sm_{major}{minor}")
    q = _run([ncu, "--query-metrics", "--chip", chip])
    names = {line.split()[0] for line in q.get("stdout", "").splitlines() if line.strip()}
    kept = sorted(n for n in names if any(k in n for k in KEEP))
    (out_dir / "metrics.txt").write_text("\n".join(kept) + "\n")
    # --query-metrics lists base names; a metric asks for a base name plus a suffix.
    res["metrics"] = {"rc": q.get("rc"), "listed": len(names), "kept": len(kept),
                      "missing": [m for m in nsight.ALL_METRICS
                                  if not any(m == n or m.startswith(n + ".") for n in names)]}

    scratch = Path(tempfile.mkdtemp(prefix="profiler-check-"))
    os.chmod(scratch, 0o777)  # the sandbox's uid writes ncu's files here
    script = scratch / "matmul.py"
    script.write_text(MATMUL)

    s = _run([ncu, "--csv", "--page", "raw", "--print-units", "base", "--section", "SpeedOfLight",
              "--section", "Occupancy", "--section", "ComputeWorkloadAnalysis", "--section",
              "WarpStateStats", "--kernel-name", GEMM, "--launch-count", "1",
              sys.executable, str(script)])
    (out_dir / "sections-raw.csv").write_text(s.pop("stdout", ""))
    res["sections"] = s

    ncu_root = str(Path(os.path.realpath(ncu)).parents[1])
    policy = dataclasses.replace(
        accused_policy("cuda", str(scratch), "best-effort", (ncu_root,), 0, None),
        allow_exec=True, allow_fork=True)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(scratch), "TMPDIR": str(scratch)}
    log = scratch / "inside.csv"
    t = time.monotonic()
    try:
        with open(scratch / "inside.out", "wb") as fo:
            box = sandbox.launch(nsight.command(ncu, str(log), [sys.executable, str(script)],
                                                GEMM.removeprefix("regex:")),
                                 policy, env=env, stdout=fo, stderr=fo)
            rc = box.wait(timeout=TIMEOUT_S)
        res["inside"] = {"rc": rc, "seconds": round(time.monotonic() - t, 2),
                         "layers": [x.to_json() for x in box.report],
                         "output": (scratch / "inside.out").read_text(errors="replace")[-3000:],
                         **_read_back(str(log))}
    except Exception as e:  # noqa: BLE001 - a check records every failure
        res["inside"] = {"error": repr(e), "seconds": round(time.monotonic() - t, 2)}

    launcher = scratch / "launch.py"
    launcher.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'harness')!r})\n"
        "from ksearch_harness import sandbox\n"
        "from ksearch_harness.accused_client import accused_policy\n"
        f"policy = accused_policy('cuda', {str(scratch)!r}, 'best-effort', (), 0, None)\n"
        f"box = sandbox.launch([sys.executable, {str(script)!r}], policy,\n"
        f"                     env={{'HOME': {str(scratch)!r}}})\n"
        "sys.exit(box.wait(timeout=150))\n")
    log = scratch / "outside.csv"
    o = _run(nsight.command(ncu, str(log), [sys.executable, str(launcher)],
                            GEMM.removeprefix("regex:")))
    res["outside"] = {**o, **_read_back(str(log))}

    (out_dir / "profiler-check.json").write_text(json.dumps(res, indent=1))
    shutil.rmtree(scratch, ignore_errors=True)
    brief = {k: ({kk: vv for kk, vv in v.items() if kk not in ("layers", "log_tail")}
                 if isinstance(v, dict) else v) for k, v in res.items()}
    print(json.dumps(brief, indent=1)[:12000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
