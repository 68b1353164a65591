"""The process a profiler watches (profiler.py): the candidate called on one workload, inside
the accused's sandbox, from a job file the judge wrote into its working directory.

    python -m ksearch_harness.profiled --job DIR/job.json

The job names the artifact, the entry point, the workload (as a request lists it) and a .npz
of the input set the judge drew; outputs are allocated here. The device is readied and the
process locked down (no exec, no new processes: sandbox.lock_down) before the candidate is
loaded, as in the accused; then it is called `calls` times, each call synchronised. The last
line on stdout is a JSON object: `calls` made and the seconds of each step (`seconds`: the
device readied, the candidate loaded, the inputs placed, the calls, the profiler's replays
among them), or `error` with what failed. Nothing here is
timed or judged: the counters come from the profiler, and the judge reads them as advice.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def run(job: dict[str, Any]) -> dict[str, Any]:
    import time
    marks: dict[str, float] = {}
    last = time.monotonic()

    def mark(step: str) -> None:
        nonlocal last
        now = time.monotonic()
        marks[step] = round(now - last, 3)
        last = now

    import numpy as np

    from . import adapters, sandbox
    from .accused import _prepare_device, _request_view
    from .adapters import BuildInfo
    from .protocol import Entry

    req = _request_view(job)
    if len(req.workloads) != 1:
        return {"error": f"a job profiles one workload, got {len(req.workloads)}"}
    _prepare_device(req.backend, audit=False)
    mark("device")
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
    for _ in range(calls):
        fn()
        adapter.synchronize()
    mark("calls")
    return {"calls": calls, "workload": wl.name, "lockdown": lockdown, "seconds": marks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ksearch_harness.profiled")
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    try:
        with open(args.job) as fh:
            report = run(json.load(fh))
    except Exception as e:  # noqa: BLE001 - the judge reads every failure from the last line
        report = {"error": f"{type(e).__name__}: {e}"[:2000]}
    sys.stdout.write("\n" + json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0 if "calls" in report else 1


if __name__ == "__main__":
    sys.exit(main())
