"""Cold caches before a timed call on the cpu backend, on every CPU the timed code may run on.

A buffer larger than the last-level cache, read and written by the judge, evicts the shared
cache and the private caches (L1, L2) of the core the judge's thread happens to run on, but
not those of the other cores. The candidate runs in another process that the scheduler puts on
any core: where that is another core than the flush's, its inputs can still be in that core's
L2 from its previous call, and the call is timed warm.

So the flush is split over one worker thread per CPU of the judge's affinity mask (which the
accused inherits), each pinned to its CPU and writing its share of the buffer, at least
`MIN_PER_CPU` bytes, more than any core's private caches: after a flush every core's private
caches and the shared cache hold the flush's lines, not the candidate's. The workers are
started once per process and sleep between flushes; numpy releases the GIL while they write.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

# Each CPU's share of the flush, at least: more than a core's L1 and L2 on current CPUs
# (2 MiB of L2 on the largest x86 cores, 4 MiB shared by a cluster on some ARM ones).
MIN_PER_CPU = 8 << 20

try:
    _getcpu = ctypes.CDLL(None, use_errno=True).sched_getcpu
    _getcpu.restype = ctypes.c_int
except (OSError, AttributeError):
    _getcpu = None


def current_cpu() -> int | None:
    """The CPU the calling thread runs on, where the C library says."""
    if _getcpu is None:
        return None
    cpu = _getcpu()
    return cpu if cpu >= 0 else None


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


class CacheFlush:
    """`flush()` reads and writes `total_bytes` (at least MIN_PER_CPU per CPU) spread over one
    thread per CPU in `cpus`, each pinned to its CPU, and returns when all are done. With one
    CPU or none known, the calling thread writes the whole buffer itself."""

    def __init__(self, total_bytes: int, cpus: list[int] | None = None):
        self.cpus = allowed_cpus() if cpus is None else list(cpus)
        # Per worker: where it ran during the last flush (None where pinning failed).
        self.ran_on: list[int | None] = []
        if len(self.cpus) <= 1:
            self._buffers = [np.zeros(max(1, total_bytes // 8), dtype=np.float64)]
            self._workers: list[threading.Thread] = []
            return
        share = max(MIN_PER_CPU, total_bytes // len(self.cpus))
        self._buffers = [np.zeros(share // 8, dtype=np.float64) for _ in self.cpus]
        self.ran_on = [None] * len(self.cpus)
        self._start = threading.Barrier(len(self.cpus) + 1)
        self._done = threading.Barrier(len(self.cpus) + 1)
        self._workers = [threading.Thread(target=self._work, args=(i,), daemon=True,
                                          name=f"ksearch-flush-{cpu}")
                         for i, cpu in enumerate(self.cpus)]
        for w in self._workers:
            w.start()

    def _work(self, i: int) -> None:
        try:
            os.sched_setaffinity(0, {self.cpus[i]})  # this thread only (Linux: pid 0)
            pinned = True
        except (AttributeError, OSError):
            pinned = False
        buf = self._buffers[i]
        while True:
            self._start.wait()
            try:
                # A read and a write of every line: dirty lines of earlier calls get evicted too.
                np.add(buf, 1.0, out=buf)
                self.ran_on[i] = current_cpu() if pinned else None
            finally:
                self._done.wait()

    def flush(self) -> None:
        if not self._workers:
            np.add(self._buffers[0], 1.0, out=self._buffers[0])
            return
        self._start.wait()
        self._done.wait()

    @property
    def buffers(self) -> list[np.ndarray]:
        return self._buffers


_flushers: dict[int, CacheFlush] = {}
_lock = threading.Lock()


def flusher(total_bytes: int) -> CacheFlush:
    """The process's flush of `total_bytes` (its threads live as long as the process: a
    persistent judge serves many evaluations with one)."""
    with _lock:
        f = _flushers.get(total_bytes)
        if f is None:
            f = _flushers[total_bytes] = CacheFlush(total_bytes)
        return f
