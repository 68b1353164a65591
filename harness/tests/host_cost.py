"""Host-side cost of the harness on large GPU-sized workloads (not a test; run by hand):

    .venv/bin/python harness/tests/host_cost.py [micro|eval|all] [--workloads N]

`micro` times TaskCode.make_inputs for the attention task's GPU workload shapes (f16, bf16)
and core.compare on 16.7M elements. `eval` runs core.evaluate on those workloads with a host
stand-in for a device: the "kernel" copies `v` into `out` and the reference returns `v` as
float32 after encoding its inputs the way device.torch_inputs does, so nearly all the time
measured is the harness's own host work (input generation, checks, comparisons).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ksearch_harness import core, dtypes  # noqa: E402
from ksearch_harness.adapters import BuildInfo  # noqa: E402
from ksearch_harness.adapters.cpu import CpuAdapter  # noqa: E402
from ksearch_harness.protocol import Tolerance, parse_request  # noqa: E402
from ksearch_harness.task_code import TaskCode  # noqa: E402
from ksearch_harness.worker import execute  # noqa: E402

# tasks/attention/task.toml, the GPU workloads: (name, B, H, L, D, causal, dtype, held_out)
ATTENTION_GPU = [
    ("b1h32l4096d128-f16-causal", 1, 32, 4096, 128, 1, "f16", False),
    ("b1h32l4096d128-bf16", 1, 32, 4096, 128, 0, "bf16", False),
    ("b4h32l1024d128-f16", 4, 32, 1024, 128, 0, "f16", False),
    ("b4h32l1024d128-bf16-causal", 4, 32, 1024, 128, 1, "bf16", False),
    ("b1h32l4096d64-f16-causal", 1, 32, 4096, 64, 1, "f16", False),
    ("b8h32l512d128-bf16", 8, 32, 512, 128, 0, "bf16", False),
    ("b2h16l1000d128-f16-causal", 2, 16, 1000, 128, 1, "f16", True),
    ("b1h8l777d64-bf16", 1, 8, 777, 64, 0, "bf16", True),
    ("b3h4l100d64-f16", 3, 4, 100, 64, 0, "f16", True),
]

REFERENCE_PY = '''
import numpy as np
from ksearch_harness import dtypes

def reference(inputs, params):
    # What device.torch_inputs costs on the host outside timed calls: one encode per input.
    for x in inputs.values():
        dtypes.get(params["dtype"]).encode(x)
    return {"out": np.asarray(inputs["v"], dtype=np.float32)}

def baseline(inputs, params):
    return {"out": np.asarray(inputs["v"], dtype=np.float32)}
'''


def workload(name, B, H, L, D, causal, dt, held_out):
    shape = [B, H, L, D]
    spec = {"dtype": dt, "shape": shape, "dist": {"kind": "normal", "mean": 0.0, "std": 1.0}}
    n = B * H * L * D
    return {"name": name, "held_out": held_out,
            "params": {"B": B, "H": H, "L": L, "D": D, "causal": causal, "dtype": dt},
            "inputs": [dict(spec, name=x) for x in ("q", "k", "v")],
            "outputs": [{"name": "out", "dtype": dt, "shape": shape}],
            "flops": 4.0 * B * H * L * L * D, "bytes": 8.0 * n}


def request(task_dir: str, build_dir: str, workloads: list) -> dict:
    return {
        "protocol": 1, "op": "evaluate", "nonce": "n" * 16, "secret_seed": 1234567,
        "backend": "cpu",
        "task": {"name": "attention-host", "dir": task_dir,
                 "reference": {"module": "reference.py", "function": "reference"},
                 "baseline": {"name": "b", "function": "baseline"},
                 "entry": {"symbol": "copy_v", "args": ["q", "k", "v", "out"]},
                 "forbidden": []},
        "candidate": {"path": os.path.join(task_dir, "cand.c"), "language": "c"},
        "build_dir": build_dir,
        "workloads": workloads,
        "tolerance": {"f16": {"rtol": 2e-3, "atol": 2e-3},
                      "bf16": {"rtol": 1.6e-2, "atol": 1.6e-2}},
        "correctness": {"trials": 3},
        # The quick preset of crates/eval.
        "timing": {"warmup": 1, "min_reps": 3, "max_reps": 10, "target_seconds": 0.2,
                   "flush_bytes": 1 << 20},
        "timeout_s": 3600,
    }


class HostDevice(CpuAdapter):
    """The cpu adapter's buffers with a Python "kernel" (out = v) instead of a C library."""

    def build(self, source: bytes) -> BuildInfo:
        return BuildInfo("none", [], 0.0, "", "")

    def load(self, build, entry) -> None:
        pass

    def bind(self, inputs, outputs, params):
        v, out = inputs["v"], outputs["out"]
        return lambda: np.copyto(out, v)


def micro() -> None:
    req = parse_request(request("/", "/", [workload(*w) for w in ATTENTION_GPU]), "evaluate")
    with tempfile.TemporaryDirectory() as d:
        Path(d, "reference.py").write_text(REFERENCE_PY)
        task = TaskCode(req.task.__class__(**{**req.task.__dict__, "dir": d}))
        print("make_inputs (q, k, v), best of 2:")
        total = 0.0
        for wi, wl in enumerate(req.workloads):
            best = min(_timed(lambda: task.make_inputs(wl, 99, wi)) for _ in range(2))
            total += best
            n = int(np.prod(wl.inputs[0].shape))
            print(f"  {wl.name:30s} {n / 1e6:6.1f}M x3  {best:7.3f} s")
        print(f"  {'all 9 workloads':30s} {'':11s}  {total:7.3f} s")
    n = 1 << 24
    rng = np.random.default_rng(0)
    truth32 = rng.standard_normal(n, dtype=np.float32)
    for dt in ("f16", "bf16"):
        d = dtypes.get(dt)
        stored = d.encode(truth32 * np.float32(1.001))
        tol = Tolerance(*dtypes.DEFAULT_TOLERANCE[dt])
        # float64 operands (what core passed before), then what core passes now where the
        # harness has them: the exact float32 values of the output and of a float32 truth.
        operands = [("float64", d.decode(stored), truth32.astype(np.float64))]
        if hasattr(d, "decode_exact"):
            operands.append(("float32", d.decode_exact(stored), truth32))
        for label, out, truth in operands:
            best = min(_timed(lambda: core.compare(out, truth, tol)) for _ in range(3))
            print(f"compare, {n / 1e6:.1f}M elements ({dt} output, {label} operands): "
                  f"{best:.3f} s")
        best = min(_timed(lambda: d.decode(stored)) for _ in range(3))
        print(f"decode to float64, {n / 1e6:.1f}M {dt}: {best:.3f} s")
        if hasattr(d, "decode_exact"):
            best = min(_timed(lambda: d.decode_exact(stored)) for _ in range(3))
            print(f"decode_exact (float32), {n / 1e6:.1f}M {dt}: {best:.3f} s")


def evaluate(count: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        Path(d, "reference.py").write_text(REFERENCE_PY)
        Path(d, "cand.c").write_text("void copy_v(void) {}\n")
        wls = [workload(*w) for w in ATTENTION_GPU[:count]]
        req = parse_request(request(d, d, wls), "evaluate")
        t0 = time.monotonic()
        res = execute(req, adapter=HostDevice(req), roofline_override=(1e15, 1e18))
        wall = time.monotonic() - t0
    print(f"evaluate, {count} workload(s): status {res['status']} {res['message'][:200]}")
    diag = res.get("diagnostics", {})
    print(f"  wall {wall:.1f} s; candidate calls {diag.get('candidate_calls')}")
    phases = diag.get("phase_seconds")
    if phases:
        print("  phases: " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or ""))
    p.add_argument("what", nargs="?", default="all", choices=["micro", "eval", "all"])
    p.add_argument("--workloads", type=int, default=len(ATTENTION_GPU))
    a = p.parse_args()
    if a.what in ("micro", "all"):
        micro()
    if a.what in ("eval", "all"):
        evaluate(a.workloads)


if __name__ == "__main__":
    main()
