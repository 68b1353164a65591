"""The process a profiler watches (profiler.py): the candidate called on one workload, inside
the accused's sandbox, from a job file the judge wrote into its working directory.

    python -m ksearch_harness.profiled --backend cuda --job DIR/job.json [--wait-s S]

The process readies the device for its backend first, then waits for the job file: the judge
may start it (under the profiler) before it knows which candidate is to be profiled, and write
the job when a profile is asked for (profiler.py keeps one started ahead). The judge writes the
job's other files first and the job itself last, under its final name in one rename. The job
names the artifact, the entry point, the workload (as a request lists it) and a .npz of the
input set the judge drew; outputs are allocated here. The process is locked down (no exec, no
new processes: sandbox.lock_down) before the candidate is loaded, as in the accused; then it is
called `calls` times, each call synchronised, between cuProfilerStart and cuProfilerStop: the
profiler runs with profiling off from the start (nsight.command), so only the candidate's calls
are profiled, not the device's start-up nor the inputs' placement. The last line on stdout is
a JSON object: `calls` made and the seconds of each step (`seconds`: the device readied, the
wait for the job, the candidate loaded, the inputs placed, the calls, the profiler's replays
among them), or `error` with what failed. Nothing here is timed or judged: the counters come
from the profiler, and the judge reads them as advice.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from typing import Any, Callable

# How long a process started ahead waits for its job before it gives up (the judge that started
# it takes it at its next profile, or kills it when it ends).
WAIT_S = 3600.0
# How often the job file is looked for.
POLL_S = 0.002


class Marks:
    """The seconds of each step, each from the end of the one before."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def __call__(self, step: str) -> None:
        now = time.monotonic()
        self.seconds[step] = round(now - self._last, 3)
        self._last = now


def wait_for(path: str, limit_s: float) -> dict[str, Any]:
    """The job at `path` once it exists (the judge renames it there whole)."""
    end = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"no job at {path} within {limit_s:.0f} s")
        time.sleep(POLL_S)
    with open(path) as fh:
        job = json.load(fh)
    if not isinstance(job, dict):
        raise ValueError("the job is not a JSON object")
    return job


def profiler_range() -> tuple[Callable[[], int], Callable[[], int]] | None:
    """cuProfilerStart and cuProfilerStop of the CUDA driver, or None where it is not loaded
    (the cpu backend: a stand-in profiler in the tests, which profiles nothing)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    return cuda.cuProfilerStart, cuda.cuProfilerStop


def run(backend: str, job_path: str, wait_s: float = WAIT_S) -> dict[str, Any]:
    mark = Marks()
    from .accused import _prepare_device
    _prepare_device(backend, audit=False)
    mark("device")
    job = wait_for(job_path, wait_s)
    mark("wait")
    if job.get("backend") != backend:
        return {"error": f"the job is for the {job.get('backend')} backend, this process "
                         f"readied {backend}"}
    return run_job(job, mark)


def run_job(job: dict[str, Any], mark: Marks) -> dict[str, Any]:
    import numpy as np

    from . import adapters, sandbox
    from .accused import _request_view
    from .adapters import BuildInfo
    from .protocol import Entry

    req = _request_view(job)
    if len(req.workloads) != 1:
        return {"error": f"a job profiles one workload, got {len(req.workloads)}"}
    span = profiler_range()  # before the lock-down, which the candidate's load follows
    lockdown = sandbox.lock_down().to_json() if job.get("lockdown", True) else None
    adapter = adapters.create(req)
    info = BuildInfo(compiler="", command=[], seconds=0.0, log="", artifact=str(job["artifact"]))
    adapter.load(info, Entry(str(job["entry"]["symbol"]), tuple(job["entry"]["args"])))
    mark("load")
    wl = req.workloads[0]
    with np.load(str(job["inputs"]), allow_pickle=False) as stored:
        inputs = {}
        for spec in wl.inputs:
            inputs[spec.name] = adapter.alloc(spec)
            adapter.upload(inputs[spec.name], stored[spec.name])
    outputs = {spec.name: adapter.alloc(spec) for spec in wl.outputs}
    fn = adapter.bind(inputs, outputs, dict(wl.params))
    mark("inputs")
    calls = max(1, int(job.get("calls", 1)))
    adapter.synchronize()
    if span is not None and span[0]() != 0:
        return {"error": "cuProfilerStart failed: no launch would be profiled"}
    for _ in range(calls):
        fn()
        adapter.synchronize()
    if span is not None:
        span[1]()
    mark("calls")
    return {"calls": calls, "workload": wl.name, "lockdown": lockdown,
            "seconds": mark.seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ksearch_harness.profiled")
    parser.add_argument("--backend", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--wait-s", type=float, default=WAIT_S)
    args = parser.parse_args(argv)
    try:
        report = run(args.backend, args.job, args.wait_s)
    except Exception as e:  # noqa: BLE001 - the judge reads every failure from the last line
        report = {"error": f"{type(e).__name__}: {e}"[:2000]}
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0 if "calls" in report else 1


if __name__ == "__main__":
    sys.exit(main())
