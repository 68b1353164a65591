"""The `profile` op: hardware counters of a candidate's kernels, per workload, from Nsight
Compute, for ksearch to interpret (crates/eval/src/bottleneck.rs). Advice, never a score.

For each workload of the request the judge draws an input set (a seed of its own purpose,
task_code.PROFILE), writes it with a job file into a fresh working directory, and starts the
profiler in the accused's sandbox with the candidate's process (profiled.py) as its target:

    ncu --csv --page raw ... --log-file DIR/counters.csv  python -m ksearch_harness.profiled ...

One profiler process per workload, so every launch in its page belongs to that workload. The
sandbox is the accused's (namespaces, no network, its uid, the workdir the only place to write)
except that exec and fork are allowed, since the profiler starts its target; the target locks
itself down (no exec, no new processes) before it loads the candidate. The profiler's page is
read with nsight.parse_raw_csv and reduced to the candidate's own kernels (the build's ptxas
kernel list; every launch where the build lists none) with nsight.reduce.

The page is written inside the sandbox, where the candidate runs: a candidate can forge its own
counters. They steer the search (which idea to try next) and are printed as a profile; they
never enter a score or a verdict.

Where no profiler can run (none installed, the cpu backend, a profiler that fails in the
sandbox), the result says why and has no counters: the search goes on with timings.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from . import adapters, kernel_clock, nsight, sandbox, scratch
from .accused_client import ADDRESS_SPACE_ROOM, accused_environment, accused_policy
from .adapters import Adapter
from .core import (build_and_record, kernel_base, own_kernels, read_candidate,
                   run_static_checks)
from .protocol import Request, ResultBuilder, TaskError
from .task_code import PROFILE, TaskCode, derive_seed

# The environment variable that names the profiler (any backend; else ncu on PATH or in the
# CUDA toolkit, for the GPU backends).
NCU_ENV = "KSEARCH_HARNESS_NCU"
DEFAULT_NCU = "/usr/local/cuda/bin/ncu"
# Calls of the candidate per workload under the profiler: the first call's launches are
# profiled like any other (ncu replays each launch on its own), so one is enough.
CALLS = 1
PAGE = "counters.csv"
JOB = "job.json"
INPUTS = "inputs.npz"


def find_ncu(backend: str) -> tuple[str | None, str]:
    """The profiler to run for `backend`, or None and why there is none."""
    named = os.environ.get(NCU_ENV)
    if named:
        if os.path.isfile(named) and os.access(named, os.X_OK):
            return named, ""
        return None, f"{NCU_ENV}={named} is not an executable file"
    if backend == "cpu":
        return None, cpu_counters_absent()
    found = shutil.which("ncu") or (DEFAULT_NCU if os.access(DEFAULT_NCU, os.X_OK) else None)
    if found is None:
        return None, "Nsight Compute (ncu) is not installed: neither on PATH nor at " + DEFAULT_NCU
    return found, ""


def cpu_counters_absent() -> str:
    """Why a cpu kernel's profile has no hardware counters, for its result: the candidate's
    sandbox blocks perf_event_open (kernel attack surface), so counters could only be read by
    the judge from outside, which ksearch does not do; and whether this machine has any (the
    judge's own perf_event_open of an instruction counter)."""
    why = ("the cpu backend reads no hardware counters (perf_event_open stays blocked in the "
           "candidate's sandbox): the classes come from the timings")
    missing = perf_event_missing()
    if missing:
        why += f"; this machine exposes none either (perf_event_open: {missing})"
    return why


def perf_event_missing() -> str | None:
    """None when this process may count its own user-space instructions with perf_event_open,
    else the error's name (ENOENT: no PMU, as in most VMs; EACCES: perf_event_paranoid)."""
    number = sandbox.syscall_number("perf_event_open")
    if number is None:
        return "no system call number for this architecture"
    # struct perf_event_attr (PERF_ATTR_SIZE_VER5 = 112 bytes): type PERF_TYPE_HARDWARE, size,
    # config PERF_COUNT_HW_INSTRUCTIONS; flags disabled | exclude_kernel | exclude_hv.
    attr = bytearray(112)
    struct.pack_into("=IIQ", attr, 0, 0, len(attr), 1)
    struct.pack_into("=Q", attr, 40, 1 | 1 << 5 | 1 << 6)
    libc = ctypes.CDLL(None, use_errno=True)
    buf = (ctypes.c_char * len(attr)).from_buffer(attr)
    fd = libc.syscall(ctypes.c_long(number), buf, 0, -1, -1, ctypes.c_ulong(0))
    if fd >= 0:
        os.close(fd)
        return None
    code = ctypes.get_errno()
    return errno.errorcode.get(code, str(code))


def profile(req: Request, out: ResultBuilder, adapter: Adapter | None = None) -> None:
    """Fills `out.data["profile"]`: the profiler used and, per workload, its counters."""
    out.stage = "task"
    task = adapters.task_code(req)
    assert req.task is not None and req.task.entry is not None
    out.stage = "static"
    source = read_candidate(req)
    run_static_checks(req, source)
    out.stage = "build"
    adapter = adapter or adapters.create(req)
    info = build_and_record(adapter, source, out)
    own = own_kernels(info)
    ncu, why = find_ncu(req.backend)
    report: dict[str, Any] = {"profiler": ncu, "available": ncu is not None, "detail": why,
                              "own_kernels": sorted(own), "workloads": []}
    out.data["profile"] = report
    if ncu is None:
        return
    out.stage = "profile"
    # Each workload may take an equal share of the request's time (the profiler replays each
    # launch once per pass of its metrics; ksearch allows for that in the request's timeout).
    shown = sum(1 for wl in req.workloads if not wl.held_out)
    seconds = req.timeout_s / max(shown, 1)
    for wi, wl in enumerate(req.workloads):
        if wl.held_out:
            continue  # what the search is shown only; held-out shapes stay out of its advice
        raw = (req.raw or {}).get("workloads", [])
        if wi >= len(raw):
            raise TaskError(f"workloads[{wi}]: missing from the request")
        inputs = task.make_inputs(wl, derive_seed(req.secret_seed, PROFILE, wi), wi)
        report["workloads"].append(_profile_workload(req, ncu, info.artifact, raw[wi], inputs,
                                                     own, seconds))


def _profile_workload(req: Request, ncu: str, artifact: str, workload: dict[str, Any],
                      inputs: Any, own: set[str], seconds: float) -> dict[str, Any]:
    """One workload under the profiler, in a working directory removed afterwards."""
    name = str(workload.get("name", ""))
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="ksearch-profile-", dir=scratch.parent())
    try:
        entry = {"name": name}
        kept = os.path.join(workdir, os.path.basename(artifact))
        shutil.copyfile(artifact, kept)
        os.chmod(kept, 0o444)
        np.savez(os.path.join(workdir, INPUTS), **inputs.stored)
        assert req.task is not None and req.task.entry is not None
        job = {"backend": req.backend, "workloads": [workload], "artifact": kept,
               "entry": {"symbol": req.task.entry.symbol, "args": list(req.task.entry.args)},
               "inputs": os.path.join(workdir, INPUTS), "calls": CALLS,
               "timeout_s": req.timeout_s}
        with open(os.path.join(workdir, JOB), "w") as fh:
            json.dump(job, fh)
        os.chmod(workdir, 0o777)  # the sandbox's uid writes the page here
        for f in (JOB, INPUTS):
            os.chmod(os.path.join(workdir, f), 0o444)
        page = os.path.join(workdir, PAGE)
        target = [sys.executable, "-m", "ksearch_harness.profiled", "--job",
                  os.path.join(workdir, JOB)]
        regex = "^(?:" + "|".join(sorted(map(_regex_escape, own))) + ")" if own else None
        argv = nsight.command(ncu, page, target, regex)
        rc, output, timed_out = _run_confined(req, argv, workdir, ncu, inputs, seconds)
        entry["seconds"] = round(time.monotonic() - started, 3)
        last = _last_json_line(output)
        if timed_out:
            entry["error"] = f"the profiler did not finish within {seconds:.0f} s"
            return entry
        entry["calls"] = last.get("calls", 0)
        # Where the target's own time went (profiled.py); the rest of `seconds` is the
        # profiler's and the interpreter's start and end. Written in the sandbox: advice.
        if isinstance(last.get("seconds"), dict):
            entry["target_seconds"] = {str(k)[:40]: v for k, v in
                                       list(last["seconds"].items())[:8]
                                       if isinstance(v, (int, float))}
        if "calls" not in last:
            tail = " / ".join(output.strip().splitlines()[-3:])
            why = last.get("error") or f"exit status {rc}, no report; output: {tail}"
            entry["error"] = f"the candidate's process failed: {why}"[:1000]
            return entry
        if not os.path.exists(page):
            tail = output.strip().splitlines()[-3:]
            entry["error"] = (f"the profiler wrote no counters (exit status {rc}): "
                              + " / ".join(tail))[:1000]
            return entry
        with open(page, errors="replace") as fh:
            text = fh.read(8 << 20)
        try:
            launches = nsight.parse_raw_csv(text)
        except nsight.NsightError as e:
            entry["error"] = f"the profiler's page does not read: {e}"
            return entry
        counters = nsight.reduce(launches, (lambda k: kernel_base(k) in own) if own
                                 else (lambda _k: True))
        entry["launches"] = counters.pop("launches", 0)
        entry["counters"] = counters
        if not counters:
            entry["error"] = "no launch of the candidate's kernels was profiled"
        return entry
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_confined(req: Request, argv: list[str], workdir: str, ncu: str, inputs: Any,
                  timeout: float) -> tuple[int | None, str, bool]:
    """Runs `argv` in the accused's sandbox with exec and fork allowed, for at most `timeout`
    seconds; returns its exit status, its output (stdout and stderr) and whether it was
    killed on the timeout."""
    harness_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The profiler's own directory, for a machine where it sits below a directory closed to
    # the sandbox's uid (sandbox.Policy.reveal).
    ncu_dir = os.path.dirname(os.path.realpath(ncu))
    nbytes = sum(int(a.nbytes) for a in inputs.stored.values())
    policy = dataclasses.replace(
        accused_policy(req.backend, workdir, req.sandbox, (harness_dir, ncu_dir),
                       4 * nbytes + ADDRESS_SPACE_ROOM, None),
        allow_exec=True, allow_fork=True)
    env = accused_environment(workdir, req.backend)
    env["PATH"] = os.pathsep.join([os.path.dirname(ncu), os.defpath])
    # Nothing is timed there: no device clock of MLX's, whose profiler session would compete
    # with the profiler for the counters.
    env[kernel_clock.CLOCK_ENV] = "wall"
    log = os.path.join(workdir, "output.log")
    timed_out = False
    with open(log, "wb") as fh:
        try:
            box = sandbox.launch(argv, policy, env=env, stdout=fh, stderr=fh, cwd=workdir)
        except (OSError, sandbox.SandboxUnavailable) as e:
            return None, f"the profiler could not start in the sandbox: {e}", False
        try:
            rc: int | None = box.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            box.kill()
            rc, timed_out = None, True
    with open(log, errors="replace") as fh:
        return rc, fh.read()[-20000:], timed_out


def _last_json_line(output: str) -> dict[str, Any]:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                return {}
            return obj if isinstance(obj, dict) else {}
    return {}


def _regex_escape(name: str) -> str:
    """A kernel name in ncu's regular expressions (ECMAScript-like): letters, digits and `_`
    stay, anything else is escaped."""
    return "".join(c if c.isalnum() or c == "_" else "\\" + c for c in name)
