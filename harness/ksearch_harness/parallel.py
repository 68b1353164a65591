"""Threads for the harness's own array work on large tensors: drawing inputs, encoding them,
comparing outputs with the truth.

numpy releases the GIL inside Generator fills and ufunc loops, so a thread pool spreads that
work over the cores. Results never depend on the number of threads: callers split their work
into pieces whose boundaries are fixed by the data (not by the pool), and each piece is
computed the same way wherever it runs.

`KSEARCH_HARNESS_THREADS` sets the pool size (1: no pool, everything on the calling thread);
by default it is the number of cores this process may run on, at most DEFAULT_MAX_THREADS.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

import numpy as np

from . import machine

THREADS_ENV = "KSEARCH_HARNESS_THREADS"
# The work is memory-bound: beyond this many threads a host's bandwidth is saturated anyway.
DEFAULT_MAX_THREADS = 32
# Pieces per thread handed to the pool: enough to even out uneven pieces, few enough that
# scheduling stays cheap.
TASKS_PER_THREAD = 4
# Elements per piece of a parallel copy; arrays up to this size are copied on the caller.
COPY_PIECE = 1 << 18

T = TypeVar("T")

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_local = threading.local()


def threads() -> int:
    """Threads used for large arrays: KSEARCH_HARNESS_THREADS when it is a positive integer,
    else the cores this process may use (capped)."""
    raw = os.environ.get(THREADS_ENV, "").strip()
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n >= 1:
            return n
    return max(1, min(machine.cores(), DEFAULT_MAX_THREADS))


def _executor() -> ThreadPoolExecutor | None:
    global _pool, _pool_size
    n = threads()
    if n <= 1 or getattr(_local, "worker", False):
        # A piece of work that itself splits work runs its parts inline: waiting in a pool
        # thread for other pool threads could deadlock.
        return None
    with _lock:
        if _pool is None or _pool_size != n:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="ksearch-host",
                                       initializer=_mark_worker)
            _pool_size = n
        return _pool


def _mark_worker() -> None:
    _local.worker = True


def start() -> None:
    """Starts every pool thread now. The evaluation counts the process's threads before the
    candidate's first call, so that threads appearing later are the candidate's; a pool that
    grew during the evaluation would blur that count."""
    pool = _executor()
    if pool is None:
        return
    n = _pool_size
    barrier = threading.Barrier(n)

    def wait(_: int) -> None:
        try:
            barrier.wait(timeout=10)
        except threading.BrokenBarrierError:
            pass  # a slow start only means fewer threads exist yet, never a wrong result

    list(pool.map(wait, range(n)))


def map_ranges(fn: Callable[[int, int], T], n: int, step: int) -> list[T]:
    """[fn(0, step), fn(step, 2 step), ..., fn(., n)] (the last range may be shorter), computed
    on the pool when there is more than one range."""
    ranges = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
    pool = _executor() if len(ranges) > 1 else None
    if pool is None:
        return [fn(lo, hi) for lo, hi in ranges]
    # Consecutive ranges are grouped into a few tasks per thread, in order.
    per_task = max(1, -(-len(ranges) // (_pool_size * TASKS_PER_THREAD)))
    groups = [ranges[i:i + per_task] for i in range(0, len(ranges), per_task)]
    done = pool.map(lambda group: [fn(lo, hi) for lo, hi in group], groups)
    return [r for group in done for r in group]


def map_items(fn: Callable[[int], T], count: int) -> list[T]:
    """[fn(0), ..., fn(count - 1)], on the pool when count > 1."""
    pool = _executor() if count > 1 else None
    if pool is None:
        return [fn(i) for i in range(count)]
    return list(pool.map(fn, range(count)))


def copy(a: np.ndarray, dtype: np.dtype | type | None = None) -> np.ndarray:
    """A new C-contiguous array with the values of `a`, converted to `dtype` like astype
    would; large arrays are written by the pool in pieces (writing fresh memory costs page
    faults, which threads take in parallel)."""
    src = np.asarray(a)
    out = np.empty(src.shape, dtype=src.dtype if dtype is None else dtype)
    if src.size <= COPY_PIECE or not src.flags.c_contiguous:
        np.copyto(out, src, casting="unsafe")
        return out
    s, d = src.reshape(-1), out.reshape(-1)
    map_ranges(lambda lo, hi: np.copyto(d[lo:hi], s[lo:hi], casting="unsafe"), s.size,
               COPY_PIECE)
    return out
