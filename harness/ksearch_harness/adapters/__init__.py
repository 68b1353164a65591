"""Backend adapters: how to build, load, feed and time a candidate on one kind of device.

Everything else (checks, seeds, statistics, verdicts) lives in core.py and is shared, so a new
backend implements only this interface. Buffers are opaque to the core; it moves data through
`upload` and `to_host` (numpy arrays in storage dtype, see dtypes.py).

Backends: `cpu` (C/C++ through ctypes), `cuda` (CUDA C++ built by nvcc, called through ctypes on
PyTorch buffers) and `mlx` (a Python module building `mx.fast.cuda_kernel`/`metal_kernel`
kernels). The GPU modules import torch or mlx only when an adapter is created, so the harness
(and the cpu backend) works on machines that have neither.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..protocol import Entry, Request, TaskError, TensorSpec


@dataclass
class BuildInfo:
    compiler: str
    command: list[str]
    seconds: float
    log: str
    artifact: str
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = {"compiler": self.compiler, "command": self.command, "seconds": self.seconds,
             "log": self.log, "artifact": self.artifact, "cached": self.cached}
        d.update(self.extra)
        return d


class BuildFailed(Exception):
    def __init__(self, message: str, info: BuildInfo | None = None):
        super().__init__(message)
        self.message = message
        self.info = info


def charged_ns(parts: dict[str, int] | None, anchor: dict[str, int] | None, floor_ns: int = 0
               ) -> int | None:
    """What a candidate's timed call is charged, from its `parts` (device_ns, host_ns) and its
    anchor's in the same repetition (`anchor`, timed by the judge): its device time, or its
    host time beyond the anchor's where that is longer, and never less than `floor_ns` (the
    judge's window around the call less a round trip: what keeps a forged figure from paying)
    less the anchor's host time that did not overlap its device time. That part of the window
    is the launch path's cost of any call, which the anchor's figure does not hold either: for
    a device-bound anchor, whose host time hides behind its device time, it is zero. None
    without both parts or the anchor's host time (the mlx kernel clock reports none: its host
    times are the profiler's): the reported figure, bounded by the window, stands."""
    if (not parts or not anchor or "device_ns" not in parts or "host_ns" not in parts
            or "host_ns" not in anchor):
        return None
    anchor_host = int(anchor["host_ns"])
    unhidden = max(anchor_host - int(anchor.get("device_ns", 0)), 0)
    return max(int(parts["device_ns"]), int(parts["host_ns"]) - anchor_host,
               int(floor_ns) - unhidden, 1)


class Adapter(abc.ABC):
    """One backend. The core calls, in order: build, load, then alloc/upload/bind/time_call/
    to_host as often as it likes."""

    name = "abstract"

    def __init__(self, request: Request):
        self.request = request

    @abc.abstractmethod
    def build(self, source: bytes) -> BuildInfo:
        """Compiles exactly `source` (the text the static checks saw) into the build dir."""

    @abc.abstractmethod
    def load(self, build: BuildInfo, entry: Entry) -> None:
        """Loads the artifact and resolves the entry point. Raises BuildFailed."""

    @abc.abstractmethod
    def alloc(self, spec: TensorSpec) -> Any:
        """A device buffer for `spec` (contents undefined)."""

    @abc.abstractmethod
    def upload(self, buf: Any, host: np.ndarray) -> None:
        """Copies a host array (storage dtype, same shape) into `buf`."""

    @abc.abstractmethod
    def to_host(self, buf: Any) -> np.ndarray:
        """A host copy of `buf` in storage dtype."""

    @abc.abstractmethod
    def call(self, inputs: dict[str, Any], outputs: dict[str, Any],
             params: dict[str, Any]) -> None:
        """Runs the candidate once (asynchronously where the device allows)."""

    def bind(self, inputs: dict[str, Any], outputs: dict[str, Any],
             params: dict[str, Any]) -> Callable[[], None]:
        """A zero-argument call with the arguments resolved once, to keep per-call overhead
        out of the timings."""
        return lambda: self.call(inputs, outputs, params)

    def synchronize(self) -> None:
        """Waits until all work the candidate queued on the device has finished."""

    def check_after_call(self) -> None:
        """Checks of the last untimed call that need its work finished and that launch work of
        the harness's own, so they run after the kernel audit's session around the call
        (cuda: the stream check). Raises a Violation."""

    @abc.abstractmethod
    def flush_cache(self) -> None:
        """Evicts the candidate's data from the caches between timed calls."""

    def idle_probe_seconds(self) -> float | None:
        """How long a tiny piece of the judge's own device work took from its launch to its
        end, the judge's earlier work finished first: microseconds on a device nothing else
        uses, at least a time slice while another process's kernels run on it. None where the
        judge cannot tell (the CPU, whose other work the timing's own checks see)."""
        return None

    def warm_up_clocks(self) -> None:
        """Keeps the device busy for a moment right before a timed call. The harness does
        host work between timed calls (fresh inputs, checks), and a GPU left idle for that
        long drops to its idle clock; a sub-millisecond kernel timed then measures the clock
        ramp, not the kernel. No-op on the CPU."""

    def expect_reference_inputs(self, inputs: dict[str, np.ndarray], params: dict[str, Any]
                                ) -> None:
        """Untimed, before a timed reference or baseline call that will be given `inputs`:
        lets the backend find their device copies then without work inside the timed region.
        No-op except on the GPU backends (DeviceAdapter)."""

    # What the last time_call was made of, where the backend knows (cuda: `device_ns` and
    # `host_ns`; see charged_ns); None elsewhere.
    last_parts: dict[str, int] | None = None
    # Whether the core calls `prime` before every timed call (see there).
    primes_before_timing = False
    # What a candidate's timed calls are paired with, for tasks with a baseline: the baseline
    # itself (True: the GPU backends, whose reference is a naive computation many times slower
    # and noisier than the candidate, while the baseline is the native operation, of the
    # candidate's magnitude and reached the same way, so a paired ratio cancels what timing
    # both shares), or the reference, whose time the yardstick's baseline/reference ratio
    # converts (False: the cpu backend, where reference and baseline are numpy alike).
    pairs_with_baseline = False
    # Whether timed reference and baseline calls read device copies of the inputs that the
    # judge uploads with every input set (GPU backends; see adapters/device.py).
    stages_reference_inputs = False
    # Whether the judge's staged inputs can be device arrays made once and reused (kept with an
    # input set the draw cache keeps: `device_array`, `upload_kept`, `device_memory_bytes`).
    reuses_staged_inputs = False
    # Whether the candidate returns new output arrays rather than writing into buffers it is
    # given (MLX: its kernels' outputs are arrays it allocates). Poison in an output buffer
    # never reaches such a candidate, so the judge has the accused drop the previous call's
    # outputs (`release`) instead of copying poison in before each call.
    candidate_makes_outputs = False

    def release(self, buf: Any) -> None:
        """Drops an output buffer's contents (only where `candidate_makes_outputs`): its memory
        goes back to the backend's allocator, and until a call replaces it the buffer reads as
        poison."""
        raise NotImplementedError(f"the {self.name} backend's candidates write into their "
                                  f"output buffers")

    def check_candidate_clock(self, parts: dict[str, int] | None) -> None:
        """Called with the parts of each of the candidate's timed calls (made in the accused):
        raises where they were not taken with the clock this judge times its own calls with,
        so that a ratio never pairs two different clocks."""

    def open_device(self) -> None:
        """Readies the judge's own use of the device (streams, events) for timing reference and
        baseline calls; the candidate is never loaded in this process."""

    def prime(self, fn: Callable[[], Any]) -> int:
        """Brings the device memory into the state a program calling `fn` in a loop would
        leave it in, by one untimed call of `fn` (the core passes the same contender on the
        previous repetition's inputs). Only backends that set `primes_before_timing` need it:
        the MLX one, whose managed buffers the harness's host reads leave on the host
        (adapters/mlx.py). Returns the call's duration in ns."""
        ns, _ = self.time_call(fn)
        return ns

    def timed_region(self, fn: Callable[[], Any]) -> Any:
        """Runs `fn` as the inside of a timed call (device backends let task code take its
        timed path there: adapters/device.py)."""
        return fn()

    def now_ns(self) -> int:
        return time.perf_counter_ns()

    def time_call(self, fn: Callable[[], Any]) -> tuple[int, Any]:
        """Duration of `fn()` in ns, device work included, and what it returned. Device
        backends override this with event timing."""
        self.synchronize()
        t0 = self.now_ns()
        value = fn()
        self.synchronize()
        return self.now_ns() - t0, value

    def environment(self) -> dict[str, Any]:
        """Backend facts for the result's `environment` (compiler, device name, ...)."""
        return {}

    def roofline(self) -> tuple[float, float]:
        """(bandwidth in bytes/s, peak FLOP/s) of the device the candidate runs on, measured
        once per process; the floors of core.py are computed from it. The host's numbers by
        default; device backends measure their device."""
        from .. import machine
        return machine.measure_roofline()

    def roofline_fresh(self) -> tuple[float, float]:
        """A new measurement, to confirm a time below the floor before it becomes a verdict."""
        from .. import machine
        return machine.measure_roofline_fresh()

    def roofline_key(self) -> str:
        """What this device's figures are remembered under (machine.remembered_roofline)."""
        from .. import machine
        return machine.roofline_key()


BACKENDS = ("cpu", "cuda", "mlx")


def create(request: Request) -> Adapter:
    backend = request.backend
    if backend == "cpu":
        from .cpu import CpuAdapter
        return CpuAdapter(request)
    if backend == "cuda":
        from .cuda import CudaAdapter
        return CudaAdapter(request)
    if backend == "mlx":
        from .mlx import MlxAdapter
        return MlxAdapter(request)
    raise TaskError(f"backend `{backend}` is not available in this harness "
                    f"(known: {', '.join(BACKENDS)})")


def large_input_drawer(backend: str | None) -> Callable[..., None] | None:
    """How the judge draws a large generated float input for `backend`
    (TaskCode.device_draw): on the GPU for cuda (device.torch_draw_into), on the host
    otherwise. A fixed rule per backend, so one seed gives one input set in every process of a
    run; MLX keeps host draws, since its judge works from host copies anyway."""
    if backend == "cuda":
        from .device import torch_draw_into
        return torch_draw_into
    return None


def task_code(request: Request) -> Any:
    """The request's task code (task_code.TaskCode), drawing as the backend does."""
    from ..task_code import TaskCode
    return TaskCode(request.task, device_draw=large_input_drawer(request.backend))  # type: ignore[arg-type]


def available_backends() -> list[str]:
    """The backends this machine can run, judged without importing torch or mlx (that takes
    seconds): cpu always; cuda with PyTorch, nvcc and an NVIDIA GPU; mlx with the mlx package
    and, off macOS, an NVIDIA GPU."""
    import importlib.util
    import sys
    from .cuda import find_nvcc, visible_gpus

    def installed(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or blocked package counts as absent
            return False

    out = ["cpu"]
    gpus = visible_gpus()
    if installed("torch") and find_nvcc() is not None and gpus:
        out.append("cuda")
    if installed("mlx") and (sys.platform == "darwin" or gpus):
        out.append("mlx")
    return out
