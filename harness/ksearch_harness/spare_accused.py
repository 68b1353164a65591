"""Accused processes started ahead of the evaluations that will use them (persistent judge,
GPU backends only).

Starting an accused costs seconds on a GPU (its imports, its CUDA context, the kernel audit's
profiler, the lock-down), all before the candidate's first call; on the cpu backend it costs a
tenth of a second, and core.py starts no spare there. A persistent judge
(supervisor.serve_loop) keeps spares starting while evaluations run: each evaluation takes the
oldest and starts one to replace it. How many it keeps (its depth) follows what it measures: as
many as one start-up takes evaluations, plus one (`wanted_depth`: the median of the last
start-ups, from launch to ready, over the median time between evaluations; INITIAL_DEPTH
until that is measured), at most `MAX_DEPTH` and half the judge's cores;
`KSEARCH_HARNESS_SPARE_ACCUSED` pins it. So a spare has had about as long as a start takes to
get ready when its evaluation comes. A spare is a fresh process that has never loaded
candidate code: it gets its arena, its artifact and its buffers from the
evaluation that takes it, exactly as one started then would. It is taken only by a request
whose sandbox it was started with (the key: backend, sandbox mode, readable paths, limits).

No spare runs while anything is timed: an evaluation stops them where they are (SIGSTOP)
before its timed calls and lets them go on afterwards (`pause`, `resume`), and so does the
yardstick op; a start-up stopped half-way holds no CPU and queues no device work. Other
processes a judge starts ahead wait with them (`pause_also`: the profiler of its next profile,
profiler.py). (Waiting
for a spare to be ready instead cost an evaluation on the H200 seconds: a GPU accused's
start-up was longer than the checks it overlapped.) Spares that are not taken are killed and
their directories removed: when a request needs another key, and when the judge ends
(`close`).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from . import machine


@dataclass
class Started:
    """A spare: the process, its working directory, and the file its output goes to (the
    request that takes it copies that file into its own log: the request being served when
    the spare started has its own log)."""
    process: Any
    workdir: str
    log: str


# `0`: no spares (every evaluation starts its own accused, as a one-shot harness does); a
# number: how many to keep started ahead, whatever is measured (`wanted_depth` otherwise).
ENV = "KSEARCH_HARNESS_SPARE_ACCUSED"
# Before anything is measured: six. An accused's start-up on a GPU is mostly the kernel audit's
# profiler coming up, 6-14 s on the H100 while evaluations took 1.4-4 s, and the depths the
# measurement then asked for were 4-8; a spare added once the first evaluations are measured is
# ready only a start-up later, so a pool that starts small leaves the evaluations of that time
# waiting (three did, for a third of them: docs/results/evaluation-speed). Where evaluations are
# slow the measured depth falls to two or three, and the surplus is taken in turn. At most
# MAX_DEPTH: each spare holds a device context and an interpreter with the backend imported;
# and at most half the cores (`_core_cap`): a start-up keeps about one core busy, beside the
# evaluation it overlaps.
INITIAL_DEPTH = 6
MAX_DEPTH = 8
# How many recent start-ups and evaluation starts `wanted_depth` looks at, and how many gaps
# between evaluations it waits for: three, so that the median is not the first evaluation's
# (a judge's first draws the run's inputs and checks the task: seconds longer than the rest;
# with two gaps it halved the depth for a while on the H100 and two evaluations waited).
RECENT = 5
MIN_GAPS = 3
_depth = 0
# Whether the environment pinned the depth (no measuring then).
_pinned = False
_key: tuple | None = None
# Seconds from launch to ready of recent accused processes (`note_ready`), and the times
# (monotonic) recent evaluations asked for one (`take`).
_starts: deque[float] = deque(maxlen=RECENT)
_takes: deque[float] = deque(maxlen=RECENT + 1)
# Oldest first: the oldest has had longest to start.
_spares: list[Started] = []
# The spares `pause` stopped (by id), for `resume` to let go on.
_paused: set[int] = set()
# Other processes started ahead that wait with the spares (profiler.py's profiler): their
# (pause, resume), each resuming only what it paused.
_also: list[tuple[Callable[[], None], Callable[[], None] | None]] = []
# Who wants the spares stopped: the judge's own timed work ("timing") and its device gate's
# watcher while another judge times ("gate", device_gate.py). They go on when neither does.
_holders: set[str] = set()
# The judge's main thread and its gate watcher both reach the spares.
_lock = threading.RLock()


def enable(on: bool = True) -> None:
    """Only a persistent judge's worker keeps spares (worker.child_loop): a one-shot harness
    would start some that nobody takes."""
    global _depth, _pinned
    pinned = _configured_depth()
    _pinned = pinned is not None
    _depth = (INITIAL_DEPTH if pinned is None else pinned) if on else 0
    _starts.clear()
    _takes.clear()
    if not _depth:
        close()


def _configured_depth() -> int | None:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        return max(0, min(int(raw), MAX_DEPTH))
    except ValueError:
        return None


def note_ready(seconds: float) -> None:
    """An accused of this judge took `seconds` from its launch to ready (pauses included:
    what a spare needs ahead of its evaluation)."""
    if seconds > 0 and math.isfinite(seconds):
        _starts.append(seconds)


def wanted_depth() -> int:
    """The depth to keep: pinned by the environment, else as many spares as one start-up
    takes evaluations, plus one, from the medians of the last `RECENT` start-ups and of the
    times between the last evaluations (INITIAL_DEPTH until a start-up and MIN_GAPS gaps are
    measured), at most MAX_DEPTH and `_core_cap`."""
    if _pinned or not _depth:
        return _depth
    times = list(_takes)
    gaps = [b - a for a, b in zip(times, times[1:]) if b > a]
    if not _starts or len(gaps) < MIN_GAPS:
        return min(INITIAL_DEPTH, _core_cap())
    ahead = math.ceil(statistics.median(_starts) / statistics.median(gaps)) + 1
    return min(ahead, MAX_DEPTH, _core_cap())


def _core_cap() -> int:
    """Half the cores this judge may use, at least two."""
    return max(2, machine.cores() // 2)


def enabled() -> bool:
    return _depth > 0


def take(key: tuple, now: float | None = None) -> Started | None:
    """The oldest spare started for `key` that is still alive; None when there is none (spares
    for another key are discarded, and so are dead ones). The caller owns what it takes
    (process, directory, log). Each call is an evaluation asking (at `now`, monotonic: the
    clock's time when not given), which `wanted_depth` measures."""
    with _lock:
        return _take(key, now)


def _take(key: tuple, now: float | None) -> Started | None:
    global _key
    if _depth:
        _takes.append(time.monotonic() if now is None else now)
    if not _spares:
        return None
    _resume_spares()
    if key != _key:
        close()
        return None
    while _spares:
        got = _spares.pop(0)
        if not got.process.dead and _alive(got.process):
            return got
        discard(got)
    _key = None
    return None


def start(key: tuple, factory: Callable[[], Started]) -> int:
    """Starts spares for `key` until the judge keeps its depth of them (`wanted_depth`;
    replacing any for another key); nothing when spares are off. Returns that depth (0 when
    off), for the result's diagnostics. A failure to start one is not an error: the next
    evaluation starts its own. Spares beyond a depth that has fallen are not stopped: they are
    taken in turn."""
    global _key
    if not _depth:
        return 0
    with _lock:
        if key != _key:
            close()
        _key = key
        depth = wanted_depth()
        while len(_spares) < depth:
            try:
                _spares.append(factory())
            except Exception:  # noqa: BLE001 - a spare is an optimisation
                break
        return depth


def pause_also(stop: Callable[[], None], go_on: Callable[[], None] | None = None) -> None:
    """Has `pause` and `resume` call `stop` and `go_on` too (once, however often asked); no
    `go_on` for what has nothing to go on with once waited for (reaping)."""
    if (stop, go_on) not in _also:
        _also.append((stop, go_on))


def pause(holder: str = "timing") -> None:
    """Stops every spare (SIGSTOP, every thread) that is not stopped already, ready or still
    starting: nothing of theirs runs until `resume`, which continues only those stopped here.
    So do the processes `pause_also` named. `holder` says who asks (the judge's own timing, or
    its device gate's watcher while another judge times): what it stops goes on once every
    holder that asked has resumed; asking twice is asking once."""
    with _lock:
        _holders.add(holder)
        for stop, _ in _also:
            try:
                stop()
            except Exception:  # noqa: BLE001 - what cannot be stopped is its owner's to drop
                pass
        for spare in list(_spares):
            if id(spare) in _paused or spare.process.stopped:
                continue
            try:
                spare.process.stop()
                _paused.add(id(spare))
            except Exception:  # noqa: BLE001 - a spare that cannot be stopped is not kept
                _drop(spare)


def resume(holder: str = "timing") -> None:
    """Lets what `pause` stopped go on starting, once no other holder wants it stopped."""
    with _lock:
        _holders.discard(holder)
        if _holders:
            return
        for _, go_on in _also:
            if go_on is None:
                continue
            try:
                go_on()
            except Exception:  # noqa: BLE001
                pass
        _resume_spares()


def _resume_spares() -> None:
    for spare in list(_spares):
        if id(spare) not in _paused:
            continue
        _paused.discard(id(spare))
        try:
            spare.process.cont()
        except Exception:  # noqa: BLE001
            _drop(spare)
    _paused.clear()


@contextmanager
def paused(holder: str = "timing") -> Iterator[None]:
    """`pause` for the block's duration, then `resume`, however the block ends."""
    pause(holder)
    try:
        yield
    finally:
        resume(holder)


def _drop(spare: Started) -> None:
    _spares.remove(spare)
    _paused.discard(id(spare))
    discard(spare)


def discard(spare: Started) -> None:
    """Kills a spare's process and removes its directory and log."""
    try:
        spare.process.kill()
    except Exception:  # noqa: BLE001
        pass
    shutil.rmtree(spare.workdir, ignore_errors=True)
    try:
        os.unlink(spare.log)
    except OSError:
        pass


def close() -> None:
    """Discards every spare."""
    global _key
    with _lock:
        while _spares:
            discard(_spares.pop(0))
        _paused.clear()
        _key = None


def _alive(process: Any) -> bool:
    try:
        return bool(process._alive())
    except Exception:  # noqa: BLE001
        return False
