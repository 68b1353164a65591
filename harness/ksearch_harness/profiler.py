"""The `profile` op: hardware counters of a candidate's kernels, per workload, from Nsight
Compute, for ksearch to interpret (crates/eval/src/bottleneck.rs). Advice, never a score.

For each workload of the request the judge draws an input set (a seed of its own purpose,
task_code.PROFILE) and hands it, with a job file, to a profiler running in the accused's sandbox
with the candidate's process (profiled.py) as its target:

    ncu --csv --page raw ... --profile-from-start off --log-file DIR/counters.csv \
        python -m ksearch_harness.profiled --backend B --job DIR/job.json

One profiler process per workload, so every launch in its page belongs to that workload. The
target readies the device, then waits for the job in its working directory: a persistent judge
starts the profiler of its next profile when one ends (`keep_ahead`), so that start-up (the
profiler's, the interpreter's, the device context's under the profiler: seconds the search
would wait) is paid while the search goes on; spare_accused pauses it with its own spares while
anything is timed. A one-shot harness starts its profiler when it has written the job. The
sandbox is the accused's (namespaces, no network, its uid, the workdir the only place to write)
except that exec and fork are allowed, since the profiler starts its target; the target locks
itself down (no exec, no new processes) before it loads the candidate, and profiles only its
calls (cuProfilerStart/Stop). The profiler's page is read with nsight.parse_raw_csv and reduced
to the candidate's own kernels (the build's ptxas kernel list; every launch where the build
lists none) with nsight.reduce.

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
import signal
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from . import adapters, kernel_clock, nsight, profiled, sandbox, scratch, spare_accused
from .accused_client import (ADDRESS_SPACE_ROOM, STOP_WAIT_S, accused_environment,
                             accused_policy)
from .adapters import Adapter
from .core import (_nbytes, build_and_record, kernel_base, own_kernels, read_candidate,
                   run_static_checks)
from .machine import child_pids, thread_states
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
OUTPUT = "output.log"


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
    key = _key(req, ncu)
    # Each workload may take an equal share of the request's time (the profiler replays each
    # launch once per pass of its metrics; ksearch allows for that in the request's timeout).
    shown = sum(1 for wl in req.workloads if not wl.held_out)
    seconds = req.timeout_s / max(shown, 1)
    try:
        for wi, wl in enumerate(req.workloads):
            if wl.held_out:
                continue  # what the search is shown only; held-out shapes stay out of its advice
            raw = (req.raw or {}).get("workloads", [])
            if wi >= len(raw):
                raise TaskError(f"workloads[{wi}]: missing from the request")
            inputs = task.make_inputs(wl, derive_seed(req.secret_seed, PROFILE, wi), wi)
            report["workloads"].append(_profile_workload(req, key, raw[wi], info.artifact,
                                                         inputs, own, seconds))
    finally:
        if _keep:
            _start_ahead(key)


@dataclasses.dataclass
class WaitingProfiler:
    """A profiler and its target (profiled.py), started in the accused's sandbox in a working
    directory of their own, where the target waits for its job once it has readied the
    device; `key` is what it was started for (_key)."""
    box: Any
    workdir: str
    key: tuple
    started: float
    stopped: bool = False


# A persistent judge keeps one profiler started ahead (keep_ahead): its target's start-up (the
# profiler's own, the interpreter's, the device's under the profiler) takes seconds, and the
# profile of a new best is waited for by the search. Started after each profile, for the next,
# and after an evaluation that says profiles will follow (`start_ahead`), for the first.
_keep = False
_ahead: WaitingProfiler | None = None


def keep_ahead(on: bool = True) -> None:
    """Only a persistent judge's worker keeps a profiler started ahead (worker.child_loop);
    spare_accused pauses it with its own spares while anything is timed."""
    global _keep
    _keep = on
    if on:
        spare_accused.pause_also(_pause_ahead, _resume_ahead)
    else:
        close()


def close() -> None:
    """Kills the profiler started ahead, if any, and removes its directory."""
    global _ahead
    if _ahead is not None:
        _discard(_ahead)
        _ahead = None


def _key(req: Request, ncu: str) -> tuple:
    """What a profiler's sandbox depends on: the backend, the sandbox mode, the profiler, and
    on the cpu backend, whose target's address space is limited, the largest shown workload's
    inputs (a GPU target's is not: any workload of the task fits the one started ahead)."""
    largest = max((sum(_nbytes(s) for s in wl.inputs) for wl in req.workloads
                   if not wl.held_out), default=0) if req.backend == "cpu" else 0
    return (req.backend, req.sandbox, ncu, largest)


def _take(key: tuple) -> tuple[WaitingProfiler | None, str]:
    """The profiler started ahead for `key`, running, else None and why (none was started,
    one for another key or one that ended is discarded)."""
    global _ahead
    got, _ahead = _ahead, None
    if got is None:
        return None, "none was started" if _keep else "a one-shot harness starts none"
    why = ""
    if got.key != key:
        why = "the one started ahead was for another sandbox"
    elif (rc := got.box.poll()) is not None:
        why = f"the one started ahead had ended (exit status {rc})"
    if why:
        _discard(got)
        return None, why
    _signal_tree(got, signal.SIGCONT)
    got.stopped = False
    return got, ""


def start_ahead(req: Request) -> None:
    """Starts the profiler of the first profile a run of `req`'s backend and sandbox will ask
    for (an evaluation's `profiles_ahead`), where a persistent judge keeps one and a profiler
    is found; one waiting already for the same sandbox stays."""
    if not _keep:
        return
    ncu, _ = find_ncu(req.backend)
    if ncu is not None:
        _start_ahead(_key(req, ncu))


def _start_ahead(key: tuple) -> None:
    """Starts the profiler the next profile takes, unless one for `key` waits already. A
    failure is not an error: the next profile starts its own."""
    global _ahead
    if _ahead is not None and _ahead.key == key and _ahead.box.poll() is None:
        return
    close()
    try:
        _ahead = _start(key)
    except Exception:  # noqa: BLE001 - a profiler started ahead is an optimisation
        _ahead = None


def _start(key: tuple) -> WaitingProfiler:
    """A profiler whose target readies the device in a fresh working directory and then waits
    for JOB there (profiled.py), in the accused's sandbox with exec and fork allowed."""
    backend, mode, ncu, largest = key
    workdir = tempfile.mkdtemp(prefix="ksearch-profile-", dir=scratch.parent())
    try:
        os.chmod(workdir, 0o777)  # the sandbox's uid writes the page and its output here
        harness_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # The profiler's own directory, for a machine where it sits below a directory closed
        # to the sandbox's uid (sandbox.Policy.reveal).
        ncu_dir = os.path.dirname(os.path.realpath(ncu))
        policy = dataclasses.replace(
            accused_policy(backend, workdir, mode, (harness_dir, ncu_dir),
                           4 * largest + ADDRESS_SPACE_ROOM, None),
            allow_exec=True, allow_fork=True)
        env = accused_environment(workdir, backend)
        env["PATH"] = os.pathsep.join([os.path.dirname(ncu), os.defpath])
        # Nothing is timed there: no device clock of MLX's, whose profiler session would
        # compete with the profiler for the counters.
        env[kernel_clock.CLOCK_ENV] = "wall"
        target = [sys.executable, "-m", "ksearch_harness.profiled", "--backend", backend,
                  "--job", os.path.join(workdir, JOB), "--wait-s", str(profiled.WAIT_S)]
        argv = nsight.command(ncu, os.path.join(workdir, PAGE), target, from_start=False)
        with open(os.path.join(workdir, OUTPUT), "wb") as fh:
            box = sandbox.launch(argv, policy, env=env, stdout=fh, stderr=fh, cwd=workdir)
        return WaitingProfiler(box, workdir, key, time.monotonic())
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _discard(started: WaitingProfiler) -> None:
    try:
        started.box.kill()
    except Exception:  # noqa: BLE001
        pass
    shutil.rmtree(started.workdir, ignore_errors=True)


def _signal_tree(started: WaitingProfiler, sig: int) -> list[int]:
    """`sig` to every process of the profiler's sandbox (the profiler, its target, theirs);
    returns their pids."""
    pids = [started.box.pid]
    at = 0
    while at < len(pids):
        pids.extend(p for p in child_pids(pids[at]) if p not in pids)
        at += 1
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return pids


def _pause_ahead() -> None:
    """Stops the profiler started ahead where it is (its start-up queues no device work and
    holds no CPU while something is timed)."""
    if _ahead is None or _ahead.stopped:
        return
    pids = _signal_tree(_ahead, signal.SIGSTOP)
    _ahead.stopped = True
    # A signal is delivered when its thread next runs: wait until every thread has stopped.
    end = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < end:
        states = [st for pid in pids for st, _ in thread_states(pid).values()]
        if all(st in "TtZX" for st in states):
            return
        time.sleep(0.0002)


def _resume_ahead() -> None:
    if _ahead is not None and _ahead.stopped:
        _signal_tree(_ahead, signal.SIGCONT)
        _ahead.stopped = False


def _profile_workload(req: Request, key: tuple, workload: dict[str, Any], artifact: str,
                      inputs: Any, own: set[str], seconds: float) -> dict[str, Any]:
    """One workload under a profiler, the one started ahead when there is one, else one
    started now; its working directory is removed afterwards."""
    name = str(workload.get("name", ""))
    began = time.monotonic()
    entry: dict[str, Any] = {"name": name}
    started, why = _take(key)
    if started is not None:
        entry["started_ahead_seconds"] = round(began - started.started, 3)
    else:
        entry["started_now"] = why
        try:
            started = _start(key)
        except (OSError, sandbox.SandboxUnavailable) as e:
            entry["seconds"] = round(time.monotonic() - began, 3)
            entry["error"] = f"the profiler could not start in the sandbox: {e}"
            return entry
    workdir = started.workdir
    try:
        kept = os.path.join(workdir, os.path.basename(artifact))
        shutil.copyfile(artifact, kept)
        os.chmod(kept, 0o444)
        np.savez(os.path.join(workdir, INPUTS), **inputs.stored)
        os.chmod(os.path.join(workdir, INPUTS), 0o444)
        assert req.task is not None and req.task.entry is not None
        job = {"backend": req.backend, "workloads": [workload], "artifact": kept,
               "entry": {"symbol": req.task.entry.symbol, "args": list(req.task.entry.args)},
               "inputs": os.path.join(workdir, INPUTS), "calls": CALLS,
               "timeout_s": req.timeout_s}
        # Written whole, then renamed: the target reads the job once its name exists.
        part = os.path.join(workdir, JOB + ".part")
        with open(part, "w") as fh:
            json.dump(job, fh)
        os.chmod(part, 0o444)
        os.rename(part, os.path.join(workdir, JOB))
        try:
            rc: int | None = started.box.wait(timeout=seconds)
            timed_out = False
        except subprocess.TimeoutExpired:
            started.box.kill()
            rc, timed_out = None, True
        with open(os.path.join(workdir, OUTPUT), errors="replace") as fh:
            output = fh.read()[-20000:]
        entry["seconds"] = round(time.monotonic() - began, 3)
        last = _last_json_line(output)
        if timed_out:
            entry["error"] = f"the profiler did not finish within {seconds:.0f} s"
            return entry
        entry["calls"] = last.get("calls", 0)
        # Where the target's own time went (profiled.py); the rest of `seconds` is the
        # profiler's and the interpreter's start and end. Written in the sandbox: advice.
        # A target started ahead readied the device and waited before this profile began.
        if isinstance(last.get("seconds"), dict):
            ahead = ("device", "wait") if "started_ahead_seconds" in entry else ()
            entry["target_seconds"] = {str(k)[:40]: v for k, v in
                                       list(last["seconds"].items())[:8]
                                       if isinstance(v, (int, float)) and k not in ahead}
        if "calls" not in last:
            tail = " / ".join(output.strip().splitlines()[-3:])
            why = last.get("error") or f"exit status {rc}, no report; output: {tail}"
            entry["error"] = f"the candidate's process failed: {why}"[:1000]
            return entry
        page = os.path.join(workdir, PAGE)
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
        _discard(started)


def _last_json_line(output: str) -> dict[str, Any]:
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                return {}
            return obj if isinstance(obj, dict) else {}
    return {}
