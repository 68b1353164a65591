"""Facts about the machine and process: CPU model, measured bandwidth and peak, threads of this
process, and the glibc heap-perturbation switch."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import socket
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:  # probe must work without numpy
    np = None  # type: ignore[assignment]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5)
            if out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def static_environment() -> dict:
    env = {"cpu_model": cpu_model(), "cores": cores(), "python": platform.python_version(),
           "numpy": getattr(np, "__version__", None), "hostname": socket.gethostname(),
           "platform": platform.platform()}
    return env


@functools.lru_cache(maxsize=None)
def measure_roofline() -> tuple[float, float]:
    """(memory bandwidth in bytes/s, peak FLOP/s), measured once per process: best of a few
    copies of a 32 MiB array (a read and a write per byte) and of a float32 matmul. Both are
    lower bounds on what the hardware can do; core.py applies slack factors for that."""
    return measure_roofline_fresh()


def measure_roofline_fresh() -> tuple[float, float]:
    """A new measurement (for confirming a suspicious time: load from other processes during
    the first one makes the machine look slower than it is)."""
    assert np is not None
    n = (32 << 20) // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        np.copyto(dst, src)
        best = min(best, time.perf_counter_ns() - t0)
    bandwidth = 2 * src.nbytes / (max(best, 1) * 1e-9)
    m = 384
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, m), dtype=np.float32)
    b = rng.standard_normal((m, m), dtype=np.float32)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        a @ b
        best = min(best, time.perf_counter_ns() - t0)
    peak = 2 * m ** 3 / (max(best, 1) * 1e-9)
    return bandwidth, peak


# -- threads ---------------------------------------------------------------------------------


def thread_states() -> dict[int, tuple[str, int]]:
    """tid -> (state letter, utime+stime ticks) for every thread of this process (Linux)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        try:
            out[int(tid)] = (fields[0], int(fields[11]) + int(fields[12]))
        except (IndexError, ValueError):
            continue
    return out


# -- heap perturbation -----------------------------------------------------------------------

_M_PERTURB = -6


@functools.lru_cache(maxsize=None)
def _mallopt():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def set_heap_perturb(byte: int) -> bool:
    """Asks glibc to fill memory it hands out (and takes back) with a pattern derived from
    `byte`; 0 turns it off. Two calls under different bytes then see different garbage in
    uninitialised malloc'd scratch, which the determinism check turns into a verdict."""
    fn = _mallopt()
    return bool(fn and fn(_M_PERTURB, byte))


def flush_c_stdio() -> None:
    """Flushes the C library's stdio buffers, so what a candidate printed reaches the log
    before the process exits with os._exit."""
    try:
        libc = ctypes.CDLL(None)
        libc.fflush(None)
    except (OSError, AttributeError):
        pass
