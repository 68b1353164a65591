"""What one candidate call costs where it runs (not a test; run by hand): the copy task's seed
called over and over through the same timed path as an evaluation's timed calls, in three
places, interleaved call by call:

- `accused`: an accused process as evaluations start it (sandbox, kernel audit, stopped
  between commands);
- `no-audit`: an accused process without the kernel audit (its profiler sessions);
- `unsandboxed`: the same accused program launched as a plain child process (stopped between
  commands, none of the launcher's sandbox layers, kernel audit on; the accused still installs
  its own stage-2 seccomp filter);
- `bare`: as `unsandboxed`, without the stage-2 filter and the kernel audit: what is left is
  the stop/continue and the channel;
- `in-process`: the backend adapter in this process, no channel, no stops.

    PYTHONPATH=harness python3 harness/tests/call_cost.py [--backend cuda|mlx|cpu] [--mib 16]
        [--calls 60] [--untimed] [--json out.json]

Per place it prints the medians of the reported time and, on the cuda backend (and on mlx with
KSEARCH_HARNESS_MLX_CLOCK=kernels), of its parts (`device_ns`, the device's time; `host_ns`,
the host time of the call itself), and the first error of a place whose calls failed with how
many did. On the H200 the copy seed's 12 us copy read 48 us in evaluations, all of it host
time (docs/results/scores, run 13); this says where that time comes from. Through mlx the
kernel clock worked in the judge but not in evaluations' accused processes (mlx run 4); the
places say which layer takes it away. With --untimed each place makes correctness calls
instead (the kernel audit's profiler session around each where the place audits), timed from
the judge: what the audit costs an evaluation's checks.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "harness"))

from ksearch_harness import adapters  # noqa: E402
from ksearch_harness.accused_client import AccusedAdapter, AccusedProcess  # noqa: E402
from ksearch_harness.adapters import device  # noqa: E402
from ksearch_harness.protocol import parse_request  # noqa: E402

COPY = ROOT / "tasks" / "copy"
SEED = {"cuda": COPY / "seed" / "copy.cu", "mlx": COPY / "seed" / "copy_mlx.py",
        "cpu": COPY / "seed" / "naive.c"}
LANGUAGE = {"cuda": "cuda", "mlx": "python", "cpu": "c"}
ENTRY = {"cuda": ("copy_f32", ["x", "y", "n"]), "mlx": ("copy", ["x", "n"]),
         "cpu": ("copy_f32", ["x", "y", "n"])}
SETTLE_S = 0.005
# --untimed: the places make correctness calls (untimed, audited where the place audits) and
# the figure is each call's wall time from the judge, settle included.
UNTIMED = False


def request(backend: str, mib: int, build_dir: str) -> dict:
    n = (mib << 20) // 4
    return {
        "protocol": 1, "op": "evaluate", "nonce": "c" * 16, "secret_seed": 7,
        "backend": backend,
        "task": {"name": "copy", "dir": str(COPY),
                 "reference": {"module": "reference.py", "function": "reference"},
                 "entry": {"symbol": ENTRY[backend][0], "args": ENTRY[backend][1]},
                 "forbidden": []},
        "candidate": {"path": str(SEED[backend]), "language": LANGUAGE[backend]},
        "build_dir": build_dir,
        "workloads": [{"name": f"f32-{mib}mib", "params": {"n": n, "dtype": "f32"},
                       "inputs": [{"name": "x", "dtype": "f32", "shape": [n],
                                   "dist": {"kind": "normal", "mean": 0.0, "std": 1.0}}],
                       "outputs": [{"name": "y", "dtype": "f32", "shape": [n]}]}],
        "timeout_s": 600,
    }


class Unsandboxed(AccusedProcess):
    """The accused program as a plain child process: no sandbox layers."""

    def _launch(self, argv, env, fd, log_fd, policy) -> int:
        self._launcher = subprocess.Popen(argv, env=env, pass_fds=(fd,), stdout=log_fd,
                                          stderr=log_fd, cwd=policy.workdir)
        self.layers = []
        return int(self._launcher.pid)


class Remote:
    """A place that is an accused process."""

    def __init__(self, cls, req, artifact: str, root: str, extra_args: tuple[str, ...] = ()):
        self.workdir = tempfile.mkdtemp(prefix="accused-", dir=root)
        os.chmod(self.workdir, 0o777)
        wl = req.workloads[0]
        nbytes = 2 * int(np.prod(wl.inputs[0].shape)) * 4 + (1 << 20)
        self.proc = cls(req.backend, workdir=self.workdir, log_fd=2,
                        deadline=time.monotonic() + 3600, readable_extra=(str(ROOT / "harness"),),
                        arena_bytes=nbytes, cpu_seconds=3600, extra_args=extra_args)
        local = os.path.join(self.workdir, os.path.basename(artifact))
        shutil.copyfile(artifact, local)
        os.chmod(local, 0o444)
        self.proc.wait_ready()
        self.acc = AccusedAdapter(self.proc, req.backend, nbytes)
        self.acc.load(local, req.task.entry, req)
        ins, _outs, self.fn = self.acc.bench(wl.inputs, wl.outputs, dict(wl.params))
        x = np.random.default_rng(1).standard_normal(wl.inputs[0].shape, dtype=np.float32)
        self.acc.upload(ins["x"], x)
        self.proc.calibrate()

    def call(self) -> tuple[int, dict[str, int]]:
        if UNTIMED:
            # A correctness call as evaluations make them (the kernel audit's profiler session
            # around it where the place has the audit): its wall time seen from the judge.
            t0 = time.perf_counter_ns()
            self.fn(0, audit=True)
            self.proc.settle(SETTLE_S)
            return time.perf_counter_ns() - t0, {}
        self.proc.round_trip()  # as before every timed call of an evaluation
        t = self.acc.time_call(self.fn)
        self.proc.settle(SETTLE_S)
        return t.reported_ns, dict(t.parts or {})

    def close(self) -> None:
        self.proc.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


class Local:
    """The backend adapter in this process."""

    def __init__(self, req, artifact: str):
        from ksearch_harness.adapters import BuildInfo
        self.a = adapters.create(req)
        self.a.load(BuildInfo("", [], 0.0, "", artifact), req.task.entry)
        wl = req.workloads[0]
        # Kept: the bound call holds only their addresses.
        self.ins = {s.name: self.a.alloc(s) for s in wl.inputs}
        self.outs = {s.name: self.a.alloc(s) for s in wl.outputs}
        x = np.random.default_rng(1).standard_normal(wl.inputs[0].shape, dtype=np.float32)
        self.a.upload(self.ins["x"], x)
        self.fn = self.a.bind(self.ins, self.outs, dict(wl.params))

    def call(self) -> tuple[int, dict[str, int]]:
        if UNTIMED:
            t0 = time.perf_counter_ns()
            self.fn()
            self.a.synchronize()
            ns = time.perf_counter_ns() - t0
            time.sleep(SETTLE_S)
            return ns, {}
        self.a.last_parts = None
        ns, _ = self.a.time_call(self.fn)
        time.sleep(SETTLE_S)
        return int(ns), dict(getattr(self.a, "last_parts", None) or {})

    def close(self) -> None:
        device.deactivate()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cuda", choices=["cuda", "mlx", "cpu"])
    p.add_argument("--mib", type=int, default=16)
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--untimed", action="store_true",
                   help="time correctness calls (with the kernel audit) instead of timed ones")
    p.add_argument("--json")
    a = p.parse_args()
    global UNTIMED
    UNTIMED = a.untimed
    root = tempfile.mkdtemp(prefix="ksearch-call-cost-")
    os.chmod(root, 0o755)
    try:
        req = parse_request(request(a.backend, a.mib, os.path.join(root, "build")), "evaluate")
        os.makedirs(req.build_dir, exist_ok=True)
        builder = adapters.create(req)
        info = builder.build(SEED[a.backend].read_bytes())
        device.deactivate()
        places = {"accused": Remote(AccusedProcess, req, info.artifact, root),
                  "no-audit": Remote(AccusedProcess, req, info.artifact, root,
                                     ("--no-kernel-audit",)),
                  "unsandboxed": Remote(Unsandboxed, req, info.artifact, root),
                  "bare": Remote(Unsandboxed, req, info.artifact, root,
                                 ("--no-kernel-audit", "--no-lockdown")),
                  "in-process": Local(req, info.artifact)}
        samples: dict[str, list[tuple[int, dict[str, int]]]] = {k: [] for k in places}
        errors: dict[str, list[str]] = {k: [] for k in places}
        for _ in range(a.calls):
            for name, place in places.items():
                try:
                    samples[name].append(place.call())
                except Exception as e:  # noqa: BLE001 - a place that fails is a finding
                    errors[name].append(f"{type(e).__name__}: {e}"[:500])
        for place in places.values():
            place.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = {}
    for name, got in samples.items():
        if errors[name]:
            print(f"{name:<12} {len(errors[name])} of {a.calls} calls failed; the first: "
                  f"{errors[name][0]}")
        if not got:
            continue
        got = got[len(got) // 10:]  # the first calls warm up
        row = {"reported_us": statistics.median(r for r, _ in got) / 1e3}
        for part in sorted({k for _, parts in got for k in parts}):
            row[part.replace("_ns", "_us")] = statistics.median(
                parts[part] for _, parts in got if part in parts) / 1e3
        out[name] = row
        print(f"{name:<12} " + "  ".join(f"{k} {v:8.1f}" for k, v in row.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"backend": a.backend, "mib": a.mib,
                                            "calls": a.calls, "untimed": a.untimed,
                                            "medians": out,
                                            "errors": errors, "raw": samples}))


if __name__ == "__main__":
    main()
