"""Backend adapters: how to build, load, feed and time a candidate on one kind of device.

Everything else (checks, seeds, statistics, verdicts) lives in core.py and is shared, so a new
backend implements only this interface. Buffers are opaque to the core; it moves data through
`upload` and `to_host` (numpy arrays in storage dtype, see dtypes.py).
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

    @abc.abstractmethod
    def flush_cache(self) -> None:
        """Evicts the candidate's data from the caches between timed calls."""

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


def create(request: Request) -> Adapter:
    backend = request.backend
    if backend == "cpu":
        from .cpu import CpuAdapter
        return CpuAdapter(request)
    raise TaskError(f"backend `{backend}` is not available in this harness (known: cpu)")
