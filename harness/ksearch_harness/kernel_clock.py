"""A device clock for MLX on NVIDIA GPUs: the time of a call from the GPU's own timestamps of
the kernels and copies it ran.

MLX exposes no CUDA events on its streams, so the mlx adapter times a call with the wall clock
around the call, `mx.eval` and `mx.synchronize()`. On the H200 a contender's calls timed that
way varied by a factor of 2-3 from one repetition to the next, and the copy calibration read
0.27-0.30 where 1.00 is right (docs/results/scores, mlx run 3). This clock asks
the driver instead: CUDA activity recorded by PyTorch's profiler (CUPTI, as the kernel audit
records which kernels ran), and a call's device time is the span from the start of its first
device activity to the end of its last. That figure is every contender's, the candidate's too:
the host time of a call under the profiler (kept beside it as evidence) is inflated by the
profiler, by amounts that differ from one process to another, so the judge charges a candidate
its device time, bounded below by its window less a round trip (adapters/mlx.py, time_call).

Where MLX does not run on CUDA or the profiler cannot run (no PyTorch, no CUPTI), the clock
says why and the adapter keeps the wall clock. Which clock an evaluation used is in its result
(`environment.mlx_clock`). `KSEARCH_HARNESS_MLX_CLOCK` picks it: `kernels` (the default: on
the H200 it reads the copy calibration at 1.00 and agrees with `ksearch bench`,
docs/results/scores, mlx run 7) or `wall`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

CLOCK_ENV = "KSEARCH_HARNESS_MLX_CLOCK"
CLOCKS = ("wall", "kernels")
DEFAULT_CLOCK = "kernels"

# A recorder runs `fn`, then `sync`, and returns fn's value with the (start_ns, end_ns) of every
# device activity recorded meanwhile, on one clock.
Recorder = Callable[[Callable[[], Any], Callable[[], None]], tuple[Any, list[tuple[int, int]]]]


class ClockError(Exception):
    """The clock cannot time a call (the profiler failed or recorded nothing)."""


def chosen() -> str:
    raw = os.environ.get(CLOCK_ENV, "").strip() or DEFAULT_CLOCK
    if raw not in CLOCKS:
        from .protocol import TaskError
        raise TaskError(f"{CLOCK_ENV}={raw!r} is not one of {', '.join(CLOCKS)}")
    return raw


def span_ns(intervals: list[tuple[int, int]]) -> int | None:
    """From the start of the first activity to the end of the last (gaps between a call's
    kernels are part of what the call costs on the device); None for no activity."""
    good = [(s, e) for s, e in intervals if e >= s]
    if not good:
        return None
    return max(e for _, e in good) - min(s for s, _ in good)


class _TorchRecorder:
    """A Recorder on PyTorch's profiler. `seen` says what the last session recorded of every
    kind (events per device type) when it recorded no device activity, for the error; it is
    not counted otherwise (the accused's reply, and so the judge's window, waits for it)."""

    def __init__(self) -> None:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        self._cuda, self._activity, self._profile = DeviceType.CUDA, ProfilerActivity, profile
        self.seen = ""

    def __call__(self, fn: Callable[[], Any], sync: Callable[[], None]
                 ) -> tuple[Any, list[tuple[int, int]]]:
        with self._profile(activities=[self._activity.CUDA]) as prof:
            value = fn()
            sync()
        intervals = _intervals(prof, self._cuda)
        self.seen = "" if intervals else _event_kinds(prof)
        return value, intervals


def _raw_events(prof: Any) -> Any:
    """The profiler's raw (Kineto) results where this PyTorch has them, else None."""
    return getattr(getattr(prof, "profiler", None), "kineto_results", None)


def _intervals(prof: Any, cuda: Any) -> list[tuple[int, int]]:
    """Device activities in nanoseconds: from the profiler's raw (Kineto) events where this
    PyTorch has them, else from its parsed events (microseconds)."""
    raw = _raw_events(prof)
    if raw is not None:
        out = []
        for e in raw.events():
            if e.device_type() != cuda:
                continue
            if hasattr(e, "start_ns"):
                start, length = int(e.start_ns()), int(e.duration_ns())
            else:  # older Kineto events: microseconds
                start, length = int(e.start_us()) * 1000, int(e.duration_us()) * 1000
            out.append((start, start + length))
        return out
    return [(int(e.time_range.start * 1000), int(e.time_range.end * 1000))
            for e in prof.events() if e.device_type == cuda]


def _event_kinds(prof: Any) -> str:
    """What a session recorded, counted by device type ("6 CPU"), or "no events"."""
    raw = _raw_events(prof)
    types = ([e.device_type() for e in raw.events()] if raw is not None
             else [e.device_type for e in prof.events()])
    kinds: dict[str, int] = {}
    for t in types:
        kind = str(t).rsplit(".", 1)[-1]
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no events"


class KernelClock:
    """Device time of calls from recorded device activity. `prepare` decides whether it is
    available; `measure` then times one call."""

    def __init__(self, recorder: Recorder | None = None) -> None:
        self._recorder = recorder
        self.prepared = False
        self.available = False
        self.why = "not prepared"
        # The test launch: the least device work a call can do (a round trip's, see measure).
        self.touch: Callable[[], None] | None = None

    def prepare(self, sync: Callable[[], None], touch: Callable[[], None]) -> None:
        """Checks the profiler on a test launch (twice: a first session can drop events)."""
        self.prepared = True
        self.touch = touch
        try:
            recorder = self._recorder or _TorchRecorder()
        except Exception as e:  # noqa: BLE001 - no torch: no clock, said so
            self.why = f"PyTorch's profiler is not available ({type(e).__name__}: {e})"
            return
        try:
            seen = None
            for _ in range(2):
                _, intervals = recorder(touch, sync)
                seen = span_ns(intervals)
        except Exception as e:  # noqa: BLE001
            self.why = f"the profiler failed: {type(e).__name__}: {e}"
            return
        if seen is None:
            self.why = "the profiler recorded no device activity of a test launch"
            return
        self._recorder = recorder
        self.available, self.why = True, "torch.profiler (CUPTI) CUDA activity"

    def measure(self, fn: Callable[[], Any], sync: Callable[[], None], idle_ok: bool = False
                ) -> tuple[int, int, Any]:
        """(device_ns, host_ns, value): the span of the call's device activity, the host time
        until `fn` returned, and its value. A call that recorded no device activity is a
        ClockError, unless `idle_ok` (a call around nothing, whose device time is zero: the
        judge's round trips)."""
        if not self.available or self._recorder is None:
            raise ClockError(f"the kernel clock is not available: {self.why}")
        host: list[int] = []

        def call() -> Any:
            t0 = time.perf_counter_ns()
            value = fn()
            host.append(time.perf_counter_ns() - t0)
            return value

        value, intervals = self._recorder(call, sync)
        device = span_ns(intervals)
        if device is None and idle_ok:
            device = 0
        if device is None:
            seen = getattr(self._recorder, "seen", "")
            raise ClockError("the profiler recorded no device activity of a timed call"
                             + (f" (the session recorded: {seen})" if seen else ""))
        return device, host[0], value


# The process's clock (a process has one device context; the accused prepares it before its
# lock-down, the judge on first use).
CLOCK = KernelClock()
