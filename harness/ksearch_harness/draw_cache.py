"""Input sets and reference outputs kept in the judge from one evaluation to the next.

Every evaluation of a run draws its inputs from the same seeds (derived from the run's secret
seed and the workload), so the candidates of a run see the same input sets, and the reference's
outputs for them are the same too. A one-shot harness drew and computed them again for every
candidate; the persistent judge (supervisor.serve_loop) keeps them in this process, so the
second and later evaluations of a session skip both. Nothing here is visible to a candidate:
the accused receives the same bytes either way, and each repetition still gets an input set of
its own.

Keys: a fingerprint of the task (its request description and the size and modification time of
every file of its directory), the workload's full description, the seed and the workload's
index; what kind of value (`inputs`, `truth`). A task edited between two requests gets new keys.

Only the persistent judge's worker keeps entries (`enable`). Admission: entries are kept until the budget is spent, then no more are admitted (an LRU
policy would evict every set before its reuse, since an evaluation walks its sets in the same
order each time). The budget: `KSEARCH_HARNESS_DRAW_CACHE_MB` (0 turns the cache off), by
default a quarter of the machine's memory, at most 24 GiB: on the H200 the attention task's
evaluations draw about 13 GB of input sets, and an eighth (at most 8 GiB) left a third of them
to be drawn and their reference computed again in every evaluation
(docs/results/evaluation-speed).

A kept value may also keep device copies (the judge's copy of a kept input set, the truth for
checks on the device, on MLX the judge's own arrays of a set), within a budget of its own:
`KSEARCH_HARNESS_DEVICE_CACHE_MB`, by default a quarter of the device's memory, so a
candidate keeps most of the device. Device copies of values that are not kept are made and
dropped by their user as before.

Kept arrays live outside the heap: each is copied into an anonymous memory map of its own and
the original goes back to the allocator. Kept on the heap, they made it grow with every input
set, so the judge's later allocations, the reference's temporaries in its timed calls among
them, landed on fresh pages: on the CPU machine the softmax reference's largest workload read
2.2 times its yardstick time in a one-shot harness (docs/results/evaluation-speed). Kept arrays
are read-only, so code that would alter a kept set fails loudly instead of corrupting the next
evaluation.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import weakref
from typing import Any, Callable

import numpy as np

from .machine import physical_memory

ENV = "KSEARCH_HARNESS_DRAW_CACHE_MB"
DEFAULT_SHARE = 4
DEFAULT_MAX_BYTES = 24 << 30
DEVICE_ENV = "KSEARCH_HARNESS_DEVICE_CACHE_MB"
DEVICE_SHARE = 4

# Only a persistent judge's worker keeps anything (worker.child_loop turns it on): a one-shot
# harness would pay for the copies and never meet them again.
_enabled = False
_entries: dict[tuple, Any] = {}
_bytes = 0
_stats = {"hits": 0, "misses": 0, "refused": 0}
# Kept values by identity, and the device copies kept for some of them (by kind and identity).
_kept_ids: set[int] = set()
_device: dict[tuple[str, int], Any] = {}
_device_bytes = 0


def enable(on: bool = True) -> None:
    global _enabled
    _enabled = on


def _mib_setting(name: str) -> int | None:
    raw = os.environ.get(name, "").strip()
    if raw:
        try:
            return max(0, int(float(raw) * (1 << 20)))
        except ValueError:
            pass
    return None


def enabled() -> bool:
    """Whether this process keeps input sets and reference outputs (a persistent judge's
    worker, with a budget above zero)."""
    return _enabled and budget_bytes() > 0


def budget_bytes() -> int:
    if not _enabled:
        return 0
    chosen = _mib_setting(ENV)
    if chosen is not None:
        return chosen
    return min(DEFAULT_MAX_BYTES, physical_memory() // DEFAULT_SHARE)


def task_fingerprint(task: Any) -> str:
    """The task's request description and the size and modification time of each of its
    files: a task edited between two requests gets new keys."""
    h = hashlib.sha256(repr(task).encode())
    root = getattr(task, "dir", None)
    if root and os.path.isdir(root):
        for base, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(base, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                h.update(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_mtime_ns}\0"
                         .encode())
    return h.hexdigest()


def get(key: tuple) -> Any:
    value = _entries.get(key)
    _stats["hits" if value is not None else "misses"] += 1
    return value


# Maps at least this large ask the kernel for transparent huge pages (MADV_HUGEPAGE): filling
# a fresh map costs a page fault per page, which with 4 KiB pages is most of the time it takes
# to copy an input set or a truth into it (docs/results/evaluation-speed, "Huge pages").
# Where THP is off or the advice is unknown the map is an ordinary one.
HUGE_PAGE_MIN_BYTES = 4 << 20


# The maps _new_map made: off_heap adopts an array without copying it only when it is all of
# one of these, never a map another process can write (the arena, shared device memory).
_OWN_MAPS: "weakref.WeakSet[mmap.mmap]" = weakref.WeakSet()


def _new_map(nbytes: int) -> mmap.mmap:
    """An anonymous private map of `nbytes`, advised to use huge pages where it is large.
    Private: a shared anonymous map is shmem, which THP leaves alone unless told otherwise."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    _OWN_MAPS.add(m)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None and nbytes >= HUGE_PAGE_MIN_BYTES:
        try:
            m.madvise(advice)
        except (OSError, ValueError):
            pass
    return m


def off_heap_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A writable array in an anonymous memory map of its own, for a value that may be kept:
    off_heap then keeps it as it is instead of copying it."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size == 0:
        return np.empty(shape, dtype=dtype)
    return np.frombuffer(_new_map(size), dtype=dtype).reshape(shape)


def _whole_map(a: np.ndarray) -> bool:
    """Whether `a` is all of a map this module made (off_heap_empty's arrays), through views
    that cover it whole: adopting it leaves no other writable way in but those views' bases,
    which only the code that asked for the map holds."""
    base: Any = a
    while isinstance(base, np.ndarray):
        if not base.flags.c_contiguous:
            return False
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's view of the map
        base = base.obj
    return isinstance(base, mmap.mmap) and base in _OWN_MAPS and len(base) == a.nbytes


def off_heap(a: np.ndarray) -> np.ndarray:
    """A read-only copy of `a` in an anonymous memory map of its own (see the module's
    docstring); `a` itself, made read-only, when it already is one (off_heap_empty)."""
    if isinstance(a, np.ndarray) and a.nbytes and _whole_map(a):
        a.flags.writeable = False
        return a
    a = np.ascontiguousarray(a).reshape(np.shape(a))
    if a.nbytes == 0:
        out = a.copy()
    else:
        out = np.frombuffer(_new_map(a.nbytes), dtype=a.dtype).reshape(a.shape)
        np.copyto(out, a)
    out.flags.writeable = False
    return out


def put(key: tuple, arrays: dict[str, np.ndarray],
        make: Callable[[dict[str, np.ndarray]], Any]) -> Any:
    """Keeps `make(copies)`, where the copies are `arrays` moved off the heap (off_heap),
    while the budget lasts, and returns it; returns None when it is not admitted (the caller
    goes on with what it has)."""
    global _bytes
    size = sum(int(np.asarray(a).nbytes) for a in arrays.values())
    if key in _entries or _bytes + size > budget_bytes():
        _stats["refused"] += key not in _entries
        return None
    value = make({name: off_heap(np.asarray(a)) for name, a in arrays.items()})
    _entries[key] = value
    _kept_ids.add(id(value))
    _bytes += size
    return value


def device_budget_bytes(device_total_bytes: int) -> int:
    if not _enabled:
        return 0
    chosen = _mib_setting(DEVICE_ENV)
    return chosen if chosen is not None else device_total_bytes // DEVICE_SHARE


def device_copy(value: Any, make: Callable[[], Any], nbytes: int,
                device_total_bytes: int, kind: str = "") -> Any:
    """The device copy of `value`: the one kept for it, or `make()`, kept when `value` is a
    kept value and the device budget allows. `kind` tells apart copies of one value made for
    different uses (the accused's shared buffers, the judge's own arrays)."""
    global _device_bytes
    key = (kind, id(value))
    if id(value) in _kept_ids:
        dev = _device.get(key)
        if dev is not None:
            return dev
    dev = make()
    if (id(value) in _kept_ids
            and _device_bytes + nbytes <= device_budget_bytes(device_total_bytes)):
        _device[key] = dev
        _device_bytes += nbytes
    return dev


def device_kept(value: Any, kind: str = "") -> bool:
    return (kind, id(value)) in _device


def stats() -> dict[str, int]:
    """What the cache did in this process so far (for the result's diagnostics)."""
    return {**_stats, "entries": len(_entries), "bytes": _bytes,
            "device_entries": len(_device), "device_bytes": _device_bytes}


def clear() -> None:
    global _bytes, _device_bytes
    _entries.clear()
    _kept_ids.clear()
    _device.clear()
    _bytes = _device_bytes = 0
    for k in _stats:
        _stats[k] = 0
