"""Test helpers: build requests for the softmax fixture and drive the harness the way ksearch
does (fresh process, own process group, request on stdin, result on a private fd)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HARNESS_DIR = Path(__file__).resolve().parents[1]
TESTS_DIR = Path(__file__).resolve().parent
FIXTURES = TESTS_DIR / "fixtures"
CHEATS = TESTS_DIR / "cheats"
HONEST = TESTS_DIR / "honest"
NONCE = "5e3c1d2a9b8f4e7d"
# A stand-in for an API key in the harness's environment: no candidate may ever read it.
CANARY = "sk-canary-7f3e9a1c5b2d"
SECRET_SEED = 20260101

# Shown workloads and one held out (odd sizes); the cheats that special-case shapes or count
# calls are written against exactly these (see their header comments).
SHOWN = [(8, 64), (13, 200)]
HELD_OUT = [(7, 333)]


def workload(rows: int, cols: int, held_out: bool = False, dist: dict | None = None) -> dict:
    return {
        "name": f"r{rows}c{cols}", "held_out": held_out,
        "params": {"rows": rows, "cols": cols},
        "inputs": [{"name": "x", "dtype": "f32", "shape": [rows, cols],
                    "dist": dist or {"kind": "normal", "mean": 0.0, "std": 3.0}}],
        "outputs": [{"name": "y", "dtype": "f32", "shape": [rows, cols]}],
        "flops": 5.0 * rows * cols, "bytes": 8.0 * rows * cols,
    }


def softmax_request(candidate: Path | str | None, build_dir: Path | str, op: str = "evaluate",
                    task_dir: Path | None = None, **overrides) -> dict:
    req = {
        "protocol": 1, "op": op, "nonce": NONCE, "secret_seed": SECRET_SEED, "backend": "cpu",
        "task": {
            "name": "softmax-fixture", "dir": str(task_dir or FIXTURES / "softmax"),
            "reference": {"module": "reference.py", "function": "reference"},
            "baseline": {"name": "numpy", "function": "baseline_numpy"},
            "entry": {"symbol": "softmax_f32", "args": ["x", "y", "rows", "cols"]},
            "forbidden": ["reference", "baseline_numpy"],
        },
        "candidate": {"path": str(candidate) if candidate else "/nonexistent.c",
                      "language": "c"},
        "build_dir": str(build_dir),
        "workloads": [workload(r, c) for r, c in SHOWN]
        + [workload(r, c, held_out=True) for r, c in HELD_OUT],
        "tolerance": {"f32": {"rtol": 2e-5, "atol": 1e-5}},
        "correctness": {"trials": 2},
        "timing": {"warmup": 1, "min_reps": 5, "max_reps": 8, "target_seconds": 0.002,
                   "flush_bytes": 1 << 20},
        "timeout_s": 60,
    }
    req.update(overrides)
    return req


@dataclass
class Run:
    result: dict | None  # the parsed result line, None when none arrived
    raw: bytes  # everything read from the result fd
    returncode: int | None
    killed: bool  # the driver killed the process group after its own timeout
    seconds: float
    stdout: str
    stderr: str
    pgid: int

    @property
    def verdict(self) -> str:
        """What ksearch would conclude: the result's status, or `timeout` after a kill."""
        if self.killed:
            return "timeout"
        return self.result["status"] if self.result else "no_result"


def run_harness(op: str, request: dict | bytes, timeout: float = 120.0,
                env: dict | None = None) -> Run:
    payload = request if isinstance(request, bytes) else json.dumps(request).encode()
    r, w = os.pipe()
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(HARNESS_DIR)] + [p for p in [e.get("PYTHONPATH")]
                                                             if p])
    e["PYTHONDONTWRITEBYTECODE"] = "1"
    if env:
        e.update(env)
    out_path = f"/tmp/ksearch-harness-test-{os.getpid()}-{time.monotonic_ns()}"
    with open(out_path + ".out", "w+b") as out_f, open(out_path + ".err", "w+b") as err_f:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "ksearch_harness", op, "--result-fd", str(w)],
            stdin=subprocess.PIPE, stdout=out_f, stderr=err_f, pass_fds=(w,), env=e,
            start_new_session=True, cwd="/")
        os.close(w)
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()
        buf = bytearray()
        killed = False
        deadline = t0 + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                killed = True
                break
            ready, _, _ = select.select([r], [], [], min(remaining, 0.2))
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                buf += chunk
        os.close(r)
        rc = proc.wait()
        seconds = time.monotonic() - t0
        out_f.seek(0)
        err_f.seek(0)
        stdout = out_f.read().decode("utf-8", "replace")
        stderr = err_f.read().decode("utf-8", "replace")
    for suffix in (".out", ".err"):
        os.unlink(out_path + suffix)
    result = None
    if buf and not killed:
        lines = bytes(buf).split(b"\n")
        assert len(lines) == 2 and lines[1] == b"", f"expected one result line, got {buf!r}"
        result = json.loads(lines[0])
    return Run(result, bytes(buf), None if killed else rc, killed, seconds, stdout, stderr,
               proc.pid)


def live_group_members(pgid: int) -> list[int]:
    """Processes (zombies excluded) still in process group `pgid`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found
