"""Integrity checks, timing and scoring, independent of the backend.

The pipeline of `evaluate`: task sanity check -> static checks -> build -> load -> correctness
-> timing -> timer and roofline checks -> score. Every check raises the HarnessError that
becomes the verdict; the ResultBuilder keeps what was measured before it.

Device access goes through an `adapters.Adapter`; nothing here knows whether a buffer lives in
host memory or on a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from . import (adapters, device_checks, device_gate, draw_cache, dtypes, intervals, machine,
               parallel, reaping, sanity_cache, scratch, spare_accused, static_checks)
from .accused_client import (TAMPER_MIN_CALLS, TAMPER_ROUND_TRIP_QUANTILE, AccusedAdapter,
                             AccusedProcess, RemoteCall, Shortfall, device_to_host,
                             report_shortfall)
from .adapters import Adapter, BuildFailed, BuildInfo
from .arena import Layout
from .protocol import (BuildError, Incorrect, Measured, Request, ResultBuilder,
                       StaticCheckFailed, TaskError, Tolerance, Violation, Workload)
from .dtypes import same_bytes
from .yardstick import anchor as anchor_of
from .task_code import (AUDIT, ORDER, PRIME, PROBE, TIMING, TRIAL, WARMUP, Inputs, TaskCode,
                        derive_seed)

MAX_SOURCE_BYTES = 1 << 20
# How long to watch the accused after a call returns, for writes that arrive late and threads
# that keep working, before it is stopped. The short wait follows every correctness call, the
# timed one every timed call; the long one (GPU backends, where queued device work can outlive
# the stopped process) only precedes judging a wrong answer, to tell deferred work from plain
# wrong results.
SETTLE_SHORT_S = 0.005
SETTLE_TIMED_S = 0.002
SETTLE_LONG_S = 0.1
# Truths kept on the device for checks of device snapshots (Evaluation._device_truth): a
# trial compares one truth with two calls, a timed repetition with one.
DEVICE_TRUTHS_KEPT = 2
# A failed held-out workload within this multiple of the tolerance is a precision verdict, not
# shape specialisation.
NEAR_MISS = 10.0
# Near-duplicate input sets per workload (see TaskCode.perturb).
PROBES = 2
# glibc fills malloc'd memory from these bytes during the two identical determinism calls.
HEAP_BYTE_A, HEAP_BYTE_B = 0xA5, 0x5A
# Roofline slack. The bandwidth is that of one numpy copy from DRAM; a kernel whose data stays
# partly in cache, or that uses every core's load ports, can beat it several times over, so the
# floor allows 4x. The peak is a float32 matmul through BLAS, typically 50-80% of the FMA peak
# of the machine, so the floor allows 2x there. A time below even that cannot be real.
BANDWIDTH_SLACK = 4.0
PEAK_SLACK = 2.0
# Re-measurements of bandwidth and peak before a time below the floor becomes a verdict.
ROOFLINE_REMEASURE = 2
# Fraction of timeout_s after which timing stops adding repetitions beyond min_reps.
SOFT_DEADLINE_FRACTION = 0.6
# A workload whose correctness or timing stage takes this long gets a line in the log saying
# where the time went (the log's tail is all a timed-out evaluation leaves).
SLOW_LOG_S = 2.0
# Consecutive blocks of an evaluation's paired ratios whose medians measure its drift.
EVAL_BLOCKS = 3
# Resolution allowed between the judge's and the accused's readings of the monotonic clock.
CLOCK_GRAIN_NS = 1_000


# --------------------------------------------------------------------------------------------
# Comparisons


@dataclass
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float

    def merge(self, other: "Comparison") -> "Comparison":
        return Comparison(self.ok and other.ok, _nanmax(self.max_abs, other.max_abs),
                          _nanmax(self.max_rel, other.max_rel))


def _nanmax(a: float, b: float) -> float:
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)


# Elements per piece of a comparison; pieces of large arrays are spread over the thread pool
# (parallel.py). A piece makes a dozen numpy calls, each taking the GIL between its loops:
# pieces must be long enough that 16 threads do not queue for it (on an H200 host 1 << 16
# scaled to about 4 threads, 1 << 18 to 16), and short enough that a thread's scratch arrays
# (27 bytes per element: 7 MiB) stay mostly in cache.
COMPARE_PIECE = 1 << 18


def close(x: np.ndarray, y: np.ndarray, truth: np.ndarray, tol: Tolerance) -> np.ndarray:
    """Elementwise |x - y| <= atol * max|truth| + rtol * |truth|; where truth is not finite,
    x and y must be equal (NaN equal to NaN). Computed in float64 whatever the input float
    types (float32 arrays of exact f16/bf16/f32 values give the same answer as their float64
    copies would). Under the "either" rule, see _either_close."""
    if tol.rule == "either":
        return _either_close(x, y, truth, tol)
    x, y, truth = _flat_operands(x, y, truth)
    shape = x.shape
    x, y, t = x.reshape(-1), y.reshape(-1), truth.reshape(-1)
    bound0 = tol.atol * _finite_scale(t)[1]
    result = np.empty(t.size, dtype=bool)

    def piece(lo: int, hi: int) -> None:
        result[lo:hi] = _close_piece(x[lo:hi], y[lo:hi], t[lo:hi], bound0, tol.rtol)

    parallel.map_ranges(piece, t.size, COMPARE_PIECE)
    return result.reshape(shape)


def close_all(x: np.ndarray, y: np.ndarray, truth: np.ndarray, tol: Tolerance) -> bool:
    """close(...).all() without the elementwise array; under a matched ratio below 1, whether
    enough elements are close (and no output is NaN or infinite where the truth is finite)."""
    if tol.rule == "either" or tol.matched_ratio < 1.0:
        return _enough_close(x, y, truth, tol)
    x, y, truth = _flat_operands(x, y, truth)
    x, y, t = x.reshape(-1), y.reshape(-1), truth.reshape(-1)
    bound0 = tol.atol * _finite_scale(t)[1]
    return all(parallel.map_ranges(
        lambda lo, hi: bool(_close_piece(x[lo:hi], y[lo:hi], t[lo:hi], bound0,
                                         tol.rtol).all()), t.size, COMPARE_PIECE))


def compare(out: np.ndarray, truth: np.ndarray, tol: Tolerance) -> Comparison:
    """close(out, truth, truth) for every element, and the largest absolute and relative
    errors where the truth is finite (NaN when an output there is NaN; the relative error's
    denominator is at least 1e-6 max|truth|). One pass over the arrays after the scale."""
    if tol.rule == "either" or tol.matched_ratio < 1.0:
        return _compare_plain(out, truth, tol)
    out, truth = _flat_operands(out, truth)
    x, t = out.reshape(-1), truth.reshape(-1)
    any_finite, scale = _finite_scale(t)
    if not any_finite:
        return Comparison(close_all(out, truth, truth, tol), 0.0, 0.0)
    bound0 = tol.atol * scale
    floor = max(scale * 1e-6, 1e-300)
    parts = parallel.map_ranges(
        lambda lo, hi: _compare_piece(x[lo:hi], t[lo:hi], bound0, tol.rtol, floor),
        t.size, COMPARE_PIECE)
    ok, max_abs, max_rel = True, None, None
    for p_ok, p_abs, p_rel in parts:
        ok = ok and p_ok
        if p_abs is not None:
            max_abs = p_abs if max_abs is None else _nanmax(max_abs, p_abs)
            max_rel = p_rel if max_rel is None else _nanmax(max_rel, p_rel)
    assert max_abs is not None and max_rel is not None  # some piece had a finite truth
    return Comparison(ok, max_abs, max_rel)


def _flat_operands(*arrays: np.ndarray) -> list[np.ndarray]:
    """The operands as float arrays of one shape (broadcast when they differ; a single value
    is broadcast without being copied, so that reshape(-1) stays a view)."""
    arrs = [np.asarray(a) for a in arrays]
    arrs = [a if a.dtype in _FLOATS else a.astype(np.float64) for a in arrs]
    shape = np.broadcast_shapes(*(a.shape for a in arrs))
    return [a if a.shape == shape
            else np.broadcast_to(a.reshape(()), shape) if a.size == 1
            else np.ascontiguousarray(np.broadcast_to(a, shape)) for a in arrs]


_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


class _Scratch(threading.local):
    """Work arrays of one thread for the comparison pieces, so that a piece allocates
    nothing: fresh temporaries of this size would cost page faults (and, from threads,
    contention in the allocator) on every piece."""

    def get(self, n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        f64: list[np.ndarray] = getattr(self, "f64", [])
        if not f64 or f64[0].size < n:
            size = max(n, COMPARE_PIECE)
            self.f64 = f64 = [np.empty(size, np.float64) for _ in range(3)]
            self.flags = [np.empty(size, bool) for _ in range(3)]
        return [a[:n] for a in f64], [a[:n] for a in self.flags]


_scratch = _Scratch()

# The pieces below take float16/32/64 operands as they are and compute in float64: the
# arithmetic (subtract, multiply, add, divide) runs in float64 loops (dtype=np.float64 or a
# float64 operand), and abs, comparisons, isnan and isfinite are exact in any float type. The
# answers are those of float64 copies of the operands, without making the copies.


def _finite_scale(t: np.ndarray) -> tuple[bool, float]:
    """(whether any element is finite, max |finite elements| or 0.0)."""
    def piece(lo: int, hi: int) -> float | None:
        (a, *_), _flags = _scratch.get(hi - lo)
        with np.errstate(invalid="ignore"):
            np.abs(t[lo:hi], out=a)
        m = a.max()
        if math.isfinite(m):  # NaN and inf both propagate into the maximum
            return float(m)
        finite = np.isfinite(a)
        return float(a[finite].max()) if finite.any() else None
    maxima = [m for m in parallel.map_ranges(piece, t.size, COMPARE_PIECE) if m is not None]
    return (True, max(maxima)) if maxima else (False, 0.0)


def _close_piece(x: np.ndarray, y: np.ndarray, t: np.ndarray, bound0: float,
                 rtol: float) -> np.ndarray:
    """close() of one piece; the answer lives in this thread's scratch space."""
    (bound, diff, _), (within, same, other) = _scratch.get(t.size)
    with np.errstate(invalid="ignore", over="ignore"):
        np.abs(t, out=bound)
        np.multiply(bound, rtol, out=bound)
        np.add(bound, bound0, out=bound)  # atol * scale + rtol * |truth|
        np.subtract(x, y, out=diff, dtype=np.float64)
        np.abs(diff, out=diff)
        np.less_equal(diff, bound, out=within)
    np.isfinite(t, out=other)
    all_finite = bool(other.all())
    if all_finite and within.all():
        return within  # `same` could only add to an all-true answer
    np.equal(x, y, out=same)
    np.isnan(x, out=other)
    np.logical_and(other, np.isnan(y), out=other)
    np.logical_or(same, other, out=same)  # equal, or both NaN
    np.logical_or(within, same, out=within)
    if all_finite:
        return within
    return np.where(np.isfinite(t), within, same)


def _compare_piece(x: np.ndarray, t: np.ndarray, bound0: float, rtol: float, floor: float
                   ) -> tuple[bool, float | None, float | None]:
    """(all close, max abs error, max rel error) over one piece; the maxima are None when no
    truth value of the piece is finite."""
    (at, bound, diff), (ok, equal, finite) = _scratch.get(t.size)
    np.isfinite(t, out=finite)
    if not finite.all():
        return _compare_piece_nonfinite(_as_f64(x), _as_f64(t), finite.copy(), bound0, rtol,
                                        floor)
    with np.errstate(invalid="ignore", over="ignore"):
        np.abs(t, out=at)
        np.subtract(x, t, out=diff, dtype=np.float64)
        np.abs(diff, out=diff)
        np.multiply(at, rtol, out=bound)
        np.add(bound, bound0, out=bound)
        np.less_equal(diff, bound, out=ok)
        all_ok = bool(ok.all())
        if not all_ok:
            # Where the truth is finite, `same` of close() reduces to x == t.
            np.equal(x, t, out=equal)
            np.logical_or(ok, equal, out=ok)
            all_ok = bool(ok.all())
        # max() is NaN when any element is: an output NaN where the truth is finite.
        max_abs = float(diff.max())
        np.maximum(at, floor, out=at)
        np.divide(diff, at, out=at)
        return all_ok, max_abs, float(at.max())


def _as_f64(a: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # a signalling NaN stays a NaN, without a warning
        return a.astype(np.float64, copy=False)


def _compare_piece_nonfinite(x: np.ndarray, t: np.ndarray, finite: np.ndarray, bound0: float,
                             rtol: float, floor: float
                             ) -> tuple[bool, float | None, float | None]:
    """_compare_piece where some truth values are not finite (rare: plain numpy)."""
    with np.errstate(invalid="ignore", over="ignore"):
        at = np.abs(t)
        diff = np.abs(x - t)
        within = diff <= bound0 + rtol * at
        same = (x == t) | (np.isnan(x) & np.isnan(t))
        ok = bool(np.where(finite, within | same, same).all())
        if not finite.any():
            return ok, None, None
        d = diff[finite]
        rel = d / np.maximum(at[finite], floor)
        return ok, float(d.max()), float(rel.max())


# The "either" rule and matched ratios below 1 (tasks imported from FlashInfer-Bench) take the
# plain numpy path below, in float64: simple rather than fast, since such tasks are few.

def _either_close(x: np.ndarray, y: np.ndarray, truth: np.ndarray,
                  tol: Tolerance) -> np.ndarray:
    """Elementwise, FlashInfer-Bench's rule: |x - y| <= atol or |x - y| <= rtol * (|truth| +
    1e-8); where the truth is not finite, x and y must be equal (NaN equal to NaN)."""
    x, y, t = (_as_f64(a) for a in _flat_operands(x, y, truth))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(x - y)
        within = diff <= np.maximum(tol.atol, tol.rtol * (np.abs(t) + 1e-8))
        same = (x == y) | (np.isnan(x) & np.isnan(y))
    return np.where(np.isfinite(t), within | same, same)


def _within(x: np.ndarray, y: np.ndarray, truth: np.ndarray, tol: Tolerance) -> np.ndarray:
    if tol.rule == "either":
        return _either_close(x, y, truth, tol)
    return close(x, y, truth, tol)


def _enough_close(x: np.ndarray, y: np.ndarray, truth: np.ndarray, tol: Tolerance) -> bool:
    """At least matched_ratio of the elements close, and no x that is NaN or infinite where
    the truth is finite (FlashInfer-Bench fails any non-finite output outright)."""
    within = _within(x, y, truth, tol)
    xs, t = (_as_f64(a) for a in _flat_operands(x, truth))
    if bool((np.isfinite(t) & ~np.isfinite(xs)).any()):
        return False
    return within.size == 0 or np.count_nonzero(within) >= tol.matched_ratio * within.size


def _compare_plain(out: np.ndarray, truth: np.ndarray, tol: Tolerance) -> Comparison:
    """compare() for the "either" rule or a matched ratio below 1."""
    ok = _enough_close(out, truth, truth, tol)
    x, t = (_as_f64(a).reshape(-1) for a in _flat_operands(out, truth))
    finite = np.isfinite(t)
    if not finite.any():
        return Comparison(ok, 0.0, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(x[finite] - t[finite])
        scale = float(np.abs(t[finite]).max())
        rel = diff / np.maximum(np.abs(t[finite]), max(scale * 1e-6, 1e-300))
    return Comparison(ok, float(diff.max()), float(rel.max()))


def tolerance_for(req: Request, dtype: str) -> Tolerance:
    if dtype in req.tolerance:
        return req.tolerance[dtype]
    rtol, atol = dtypes.DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    return Tolerance(rtol, atol)


def stats(samples: list[int]) -> dict[str, float | None]:
    if not samples:
        return {"median": None, "p10": None, "p90": None}
    a = np.asarray(samples, dtype=np.float64)
    return {"median": float(np.median(a)), "p10": float(np.percentile(a, 10)),
            "p90": float(np.percentile(a, 90))}


def roofline(wl: Workload, bandwidth: float, peak: float) -> tuple[float, float]:
    """(floor_ns with slack, ideal_ns without): the time the bytes and FLOPs of `wl` need at
    the measured bandwidth and peak."""
    t_bytes = wl.bytes / bandwidth if bandwidth > 0 else 0.0
    t_flops = wl.flops / peak if peak > 0 else 0.0
    floor = max(t_bytes / BANDWIDTH_SLACK, t_flops / PEAK_SLACK) * 1e9
    return floor, max(t_bytes, t_flops) * 1e9


def geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals or len(vals) != len(values):
        return None
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))


# --------------------------------------------------------------------------------------------
# Ops


def check_task(req: Request, out: ResultBuilder) -> None:
    out.stage = "task"
    task = adapters.task_code(req)
    _record_static_env(out)
    trial_seeds = _trial_seeds(req, out)
    sanity_check(req, task, trial_seeds[0], out.data["workloads"])


def build(req: Request, out: ResultBuilder, adapter: Adapter | None = None) -> BuildInfo:
    _record_static_env(out)
    out.stage = "static"
    source = read_candidate(req)
    run_static_checks(req, source)
    out.stage = "build"
    adapter = adapter or adapters.create(req)
    return build_and_record(adapter, source, out)


def evaluate(req: Request, out: ResultBuilder, adapter: Adapter | None = None,
             roofline_override: tuple[float, float] | None = None) -> None:
    Evaluation(req, out, adapter, roofline_override).run()


def _gone(finish: Callable[[], None] | None, workdir: str | None,
          release: Callable[[], None] | None = None) -> None:
    """The wait for a killed accused, then the removal of its working directory; `release`
    (the device gate's hold lent for the wait) goes last."""
    try:
        if finish is not None:
            finish()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    finally:
        if release is not None:
            release()


def read_candidate(req: Request) -> bytes:
    assert req.candidate is not None
    try:
        with open(req.candidate.path, "rb") as fh:
            source = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as e:
        raise BuildError(f"cannot read the candidate source: {e}") from None
    if len(source) > MAX_SOURCE_BYTES:
        raise BuildError(f"candidate source exceeds {MAX_SOURCE_BYTES} bytes")
    return source


def run_static_checks(req: Request, source: bytes) -> None:
    assert req.candidate is not None
    forbidden = req.task.forbidden if req.task else ()
    findings = static_checks.check_source(source.decode("utf-8", "replace"), forbidden,
                                          req.candidate.language)
    if findings:
        f = findings[0]
        more = f" (and {len(findings) - 1} more finding(s))" if len(findings) > 1 else ""
        raise StaticCheckFailed(f"line {f.line}: {f.message}{more}", f.violation)


def build_and_record(adapter: Adapter, source: bytes, out: ResultBuilder) -> BuildInfo:
    """Builds the candidate, keeping the build report (also of a failed build) and the
    adapter's environment in the result."""
    try:
        info = adapter.build(source)
    except BuildFailed as e:
        if e.info is not None:
            out.data["build"] = e.info.to_json()
        raise BuildError(e.message) from None
    out.data["build"] = info.to_json()
    out.data["environment"].update(adapter.environment())
    return info


def _record_static_env(out: ResultBuilder) -> None:
    out.data["environment"].update(machine.static_environment())


def _trial_seeds(req: Request, out: ResultBuilder) -> list[int]:
    seeds = [derive_seed(req.secret_seed, TRIAL, t) for t in range(req.trials)]
    out.data["seeds"] = {"secret_seed": req.secret_seed, "trial_seeds": seeds}
    return seeds


def sanity_check(req: Request, task: TaskCode, seed: int,
                 entries: list[dict[str, Any]] | None = None,
                 draw: Callable[[Workload, int, int], Inputs] | None = None,
                 truth_of: Callable[[Inputs, Workload], dict[str, np.ndarray]] | None = None,
                 only: set[str] | None = None) -> list[dict[str, Any]]:
    """A task where an all-zero or a constant output passes the tolerance cannot tell a kernel
    that works from one that does nothing; one whose baseline disagrees with its reference
    times the wrong thing. Both are task errors, raised before any candidate is involved.
    `entries` receives one record per workload, also when the check fails. `draw` and
    `truth_of` stand in for the task's `make_inputs` and `reference`: an evaluation passes its
    own, which keep the sets it draws, so its first trial (the same seed) draws nothing again.
    `only` names the workloads to check (the rest passed before); None checks every one."""
    entries = [] if entries is None else entries
    draw = draw or task.make_inputs
    truth_of = truth_of or task.reference
    problems = []
    for wi, wl in enumerate(req.workloads):
        if only is not None and wl.name not in only:
            continue
        inputs = draw(wl, seed, wi)
        truth = truth_of(inputs, wl)
        zero_ok = const_ok = True
        for spec in wl.outputs:
            dt, t = dtypes.get(spec.dtype), truth[spec.name]
            tol = tolerance_for(req, spec.dtype)
            # The mean of the float64 values (a float32 truth summed in float32 would differ).
            finite = np.asarray(t[np.isfinite(t)], dtype=np.float64)
            mean = float(finite.mean()) if finite.size else 0.0
            # One value each, broadcast over the output by the comparison.
            zeros = dt.decode(dt.encode(np.zeros(1)))
            const = dt.decode(dt.encode(np.full(1, mean)))
            zero_ok = zero_ok and close_all(zeros, t, t, tol)
            const_ok = const_ok and close_all(const, t, t, tol)
        baseline_ok = None
        if task.baseline_fn is not None:
            got = task.check_outputs(task.call_baseline(inputs.for_reference(), wl), wl,
                                     "baseline")
            baseline_ok = all(close_all(got[s.name], truth[s.name], truth[s.name],
                                        tolerance_for(req, s.dtype)) for s in wl.outputs)
        entries.append({"name": wl.name, "held_out": wl.held_out,
                        "zero_output_rejected": not zero_ok,
                        "constant_output_rejected": not const_ok,
                        "baseline_matches": baseline_ok})
        if zero_ok:
            problems.append(f"workload `{wl.name}`: an all-zero output passes the tolerance")
        if const_ok:
            problems.append(f"workload `{wl.name}`: a constant output (the mean of the "
                            f"reference) passes the tolerance")
        if baseline_ok is False:
            problems.append(f"workload `{wl.name}`: the baseline disagrees with the reference "
                            f"beyond the tolerance")
    if problems:
        raise TaskError("task sanity check failed: " + "; ".join(problems))
    return entries


# --------------------------------------------------------------------------------------------
# evaluate


class PhaseClock:
    """Wall time per phase of an evaluation (diagnostics' `phase_seconds`). Phases nest: time
    spent in an inner phase counts for it alone, not for the phase around it."""

    def __init__(self):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self._stack: list[str] = []
        self._mark = self.started

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self._switch()
        self._stack.append(name)
        try:
            yield
        finally:
            self._switch()
            self._stack.pop()

    def _switch(self) -> None:
        now = time.perf_counter()
        if self._stack:
            key = self._stack[-1]
            self.seconds[key] = self.seconds.get(key, 0.0) + now - self._mark
        self._mark = now

    def snapshot(self) -> dict[str, float]:
        """Seconds per phase so far (the open phases included) and `total`, the wall time
        since the evaluation began; what no phase claims is in neither."""
        self._switch()
        out = {k: round(v, 4) for k, v in self.seconds.items()}
        out["total"] = round(time.perf_counter() - self.started, 4)
        return out


class Call:
    """One correctness call's outputs and their comparison with the truth. `stored` (the
    storage arrays) and `decoded` (exact float values) are host arrays, made on first use: with
    shared device memory the checks that pass need neither."""

    def __init__(self, snap: "Snapshot", cmp: Comparison,
                 decode: "Any"):
        self.snap, self.cmp = snap, cmp
        self._decode = decode
        self._decoded: dict[str, np.ndarray] | None = None

    @property
    def stored(self) -> dict[str, np.ndarray]:
        return self.snap.host()

    @property
    def decoded(self) -> dict[str, np.ndarray]:
        if self._decoded is None:
            self._decoded = self._decode(self.stored)
        return self._decoded


@dataclass(frozen=True)
class CheckSet:
    """One input set the correctness checks call the candidate on (`Evaluation._check_sets`):
    a trial's, or (`probe`) a near-duplicate of the set before it; `index` counts each kind
    apart, and `seed` is what it was drawn or perturbed with."""
    probe: bool
    index: int
    seed: int
    inputs: Any


@dataclass
class Bench:
    """One workload's buffers in the accused and its bound call; on GPU backends also the
    judge's own device copies of the inputs, which timed reference and baseline calls read."""

    wl: Workload
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    fn: RemoteCall
    poison: dict[str, dict[str, np.ndarray]]
    judge_inputs: dict[str, Any]
    # With shared device memory: the judge's own device copies of the inputs as last
    # uploaded, which the accused's buffers must still equal after every call, and of the
    # poison patterns.
    pristine: dict[str, Any] = dataclasses.field(default_factory=dict)
    poison_dev: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)


class Snapshot:
    """A workload's outputs at one moment: host arrays, or, where the judge shares the
    accused's device memory, the judge's own device copies (storage bits), copied to the host
    once and only when asked (`host`). Either way the candidate cannot change it after it was
    taken."""

    def __init__(self, host: dict[str, np.ndarray] | None, device: dict[str, Any] | None,
                 specs: dict[str, Any], on_copy: Any = None):
        self._host, self.device, self.specs = host, device, specs
        self._on_copy = on_copy

    def host(self) -> dict[str, np.ndarray]:
        if self._host is None:
            assert self.device is not None
            self._host = {n: device_to_host(t, self.specs[n]) for n, t in self.device.items()}
            if self._on_copy is not None:
                self._on_copy()
        return self._host

    def differs(self, other: "Snapshot") -> bool:
        """Whether any output's bytes differ between the two moments."""
        if self.device is not None and other.device is not None:
            import torch
            return any(not torch.equal(self.device[n], other.device[n]) for n in self.device)
        a, b = self.host(), other.host()
        return any(not same_bytes(a[n], b[n]) for n in a)


class Evaluation:
    def __init__(self, req: Request, out: ResultBuilder, adapter: Adapter | None,
                 roofline_override: tuple[float, float] | None):
        self.req = req
        self.out = out
        self.adapter = adapter
        self.roofline_override = roofline_override
        self.started = time.monotonic()
        self.soft_deadline = self.started + SOFT_DEADLINE_FRACTION * req.timeout_s
        self.calls = 0
        # Workloads whose task sanity check this evaluation ran (None: not yet decided).
        self.sanity_checked: int | None = None
        self._task_key: str | None = None
        self.threads_before: set[int] = set()
        self.threads_max = 0
        self.busy_after_return = 0
        self.results: dict[str, dict[str, Any]] = {}
        self.phase = PhaseClock()
        # The device's gate, shared with the other judges of the device, if any.
        self.gate = device_gate.current()
        self.gate_waited = self.gate.waited()
        self.idle_wait: dict[str, Any] = {}
        self.accused: AccusedAdapter | None = None
        self.process: AccusedProcess | None = None
        self.workdir: str | None = None
        self.arena_bytes = 0
        self.audit_kernels = False
        self.own_kernels: set[str] = set()
        self.kernels_seen: list[str] = []
        self.benches: dict[str, list[Bench]] = {}
        # Whether the judge shares device memory with the accused (device_share: cuda, and
        # mlx on an NVIDIA GPU).
        self.device_share: dict[str, Any] | None = None
        # Whether outputs read to the host are compared on the judge's GPU (device_checks),
        # how many snapshots were, and why it stopped if its device failed.
        self.host_outputs_on_device = device_checks.for_host_outputs(req.backend)
        self.host_outputs_compared_on_device = 0
        self.device_checks_error: str | None = None
        self._truths: list[tuple[dict[str, np.ndarray], dict[str, Any]]] = []
        # A spare accused started by an earlier evaluation (spare_accused), and the file its
        # output went to, copied into this request's log at the end.
        self.prestarted = False
        # How many spares this evaluation's start kept starting for the next ones.
        self.spare_depth = 0
        self.accused_log: str | None = None
        # Output snapshots copied to the host (every one without shared device memory; with
        # it, only those a failing or host-only check needed).
        self.host_reads = 0
        # Per workload: (reported, window, round trip just before) of every timed candidate
        # call, for the timer check.
        self.windows: dict[str, list[tuple[int, int, int]]] = {}
        # Per workload, what the accused says each timed candidate figure was made of
        # (TimedCall.parts), part by part.
        self.parts: dict[str, dict[str, list[int]]] = {}
        # The same of the anchor's timed calls in the judge, per repetition counted.
        self.anchor_parts: dict[str, dict[str, list[int]]] = {}

    # -- pipeline ------------------------------------------------------------------------

    def run(self) -> None:
        # Everything but the timing stage beside other judges of the device (device_gate).
        with self.gate.shared(self._gate_wait):
            try:
                self._run()
            finally:
                finish = None
                if self.accused is not None:
                    finish = self.accused.close_now()
                elif self.process is not None:
                    finish = self.process.kill_now()
                # Killed now; gone, and its directory removed, maybe after the result
                # (reaping): nothing of the candidate's is left behind. Until it is gone no
                # other judge times (a dying accused's device context goes with it).
                workdir = self.workdir
                release = self.gate.lend_shared()
                try:
                    reaping.later(lambda: _gone(finish, workdir, release))
                except BaseException:
                    if release is not None:
                        release()
                    raise
                if self.accused_log is not None:
                    _append_log(self.accused_log)
                # Also when a check fails: the counts and phase times up to the verdict.
                if "diagnostics" in self.out.data:
                    self.out.data["diagnostics"] = self._diagnostics()

    def _run(self) -> None:
        req, out, phase = self.req, self.out, self.phase
        out.stage = "task"
        with phase("task"):
            self.task = adapters.task_code(req)
            _record_static_env(out)
            self.trial_seeds = _trial_seeds(req, out)
            self.seeds = out.data["seeds"]
            self.seeds.update({"probe_seeds": {}, "timing_seeds": {}, "order_seeds": {}})
            # The check judges the task, not the candidate: a pass is remembered per task and
            # workload (sanity_cache.py), and later evaluations check only what is new.
            keys = sanity_cache.keys(req.raw, req.task.dir) or {}  # type: ignore[union-attr]
            unchecked = [wl.name for wl in req.workloads
                         if not sanity_cache.known_sane(keys.get(wl.name))]
            self.sanity_checked = len(unchecked)
            if unchecked:
                # Through the evaluation's own draws: the sets are the first trial's, kept
                # (draw_cache) for it in a persistent judge.
                sanity_check(req, self.task, self.trial_seeds[0], draw=self._make_inputs,
                             truth_of=self._reference, only=set(unchecked))
                for name in unchecked:
                    sanity_cache.remember(keys.get(name))

        out.stage = "static"
        with phase("build"):
            source = read_candidate(req)
            run_static_checks(req, source)
            if self.adapter is None:
                self.adapter = adapters.create(req)
            # The accused starts now and readies itself while the candidate is built.
            self._start_accused()

            out.stage = "build"
            info = build_and_record(self.adapter, source, out)

        # Measured before the candidate is loaded, so it cannot disturb the measurement.
        with phase("roofline"):
            self.bandwidth, self.peak = self.roofline_override or self.adapter.roofline()
        out.data["environment"].update({"mem_bandwidth_gbs": self.bandwidth / 1e9,
                                        "peak_gflops": self.peak / 1e9})
        # An accused started for this evaluation (no spare was ready) is still importing and
        # readying its device: the judge draws what the checks will use meanwhile.
        if not self.prestarted:
            self._draw_ahead()
        # The independent wall clock for the timer check starts before any candidate code
        # exists in this process.
        self.wall_start_ns = time.monotonic_ns()

        out.stage = "load"
        assert req.task is not None and req.task.entry is not None
        with phase("load"):
            # The judge's own device (reference, baseline, cache flushes); the candidate is
            # loaded only in the accused process.
            self.adapter.open_device()
            self.accused, artifact = self._accused_ready(info)
            self.accused.load(artifact, req.task.entry, req)
            out.data["sandbox"] = self.accused.process.layers
        with phase("calibration"):
            handshake = self.accused.process.calibrate()
        out.data["environment"]["handshake"] = handshake.to_json()
        audit = self.accused.process.kernel_audit
        self.audit_kernels = self.accused.on_device and audit["active"]
        if self.accused.on_device:
            out.data["kernel_audit"] = {**audit, "kernels": self.kernels_seen}
        self.own_kernels = own_kernels(info)

        for wl in req.workloads:
            self.results[wl.name] = {"name": wl.name, "held_out": wl.held_out}
        out.data["workloads"] = [self.results[wl.name] for wl in req.workloads]
        out.data["diagnostics"] = self._diagnostics()

        out.stage = "correctness"
        # The harness's own worker threads exist before the count that tells the candidate's
        # threads apart.
        parallel.start()
        self.threads_before = set(self.accused.process.threads())
        self.threads_max = len(self.threads_before)
        with phase("checks"):
            self.correctness()

        out.stage = "timing"
        # The device alone for the timed calls: other judges of the device wait at their next
        # checkpoint (device_gate), and nothing of the next evaluation's accused starts up
        # while this one is timed: it is stopped where it is and goes on afterwards.
        if self.gate.active:
            self.adapter.synchronize()
        with self.gate.exclusive(self._gate_wait), spare_accused.paused(), phase("checks"):
            self._wait_for_idle_device()
            timed_total = self.timing()
            self.check_timer(timed_total)
            self.check_floors()
        out.data["score"] = self.score()
        out.data["score_interval"] = self.score_interval()
        if self.req.yardstick is not None:
            out.data["drift"] = self.drift()

    def _diagnostics(self) -> dict[str, Any]:
        proc = self.accused.process if self.accused is not None else None
        return {"threads_before_first_call": len(self.threads_before),
                "threads_max_after_call": self.threads_max,
                "busy_threads_after_return": self.busy_after_return,
                "candidate_calls": self.calls,
                "lingering_calls": proc.linger_calls if proc else 0,
                "task_sanity_cached": self.sanity_checked == 0,
                "task_sanity_checked": self.sanity_checked or 0,
                "device_share": self.device_share,
                "accused_prestarted": self.prestarted,
                "spare_accused_depth": self.spare_depth,
                "accused_start_seconds": proc.start_seconds if proc else {},
                "accused_cores": proc.cores if proc else None,
                "outputs_read_to_host": self.host_reads,
                "host_outputs_compared_on_device": self.host_outputs_compared_on_device,
                "device_checks_error": self.device_checks_error,
                "gate": self._gate_diagnostics(),
                "draw_cache": draw_cache.stats(),
                "phase_seconds": self.phase.snapshot()}

    def _gate_diagnostics(self) -> dict[str, Any] | None:
        """This evaluation's waits at the device gate (None without one), and for work of
        other processes to leave the device before its timed calls."""
        if not self.gate.active:
            return None
        (s0, n0), (s1, n1) = self.gate_waited, self.gate.waited()
        return {"waited_s": round(s1 - s0, 6), "waits": n1 - n0, **self.idle_wait}

    def _wait_for_idle_device(self) -> None:
        """Before the timed calls, with other judges on the device: the gate's waits so far do
        not shorten this candidate's time (its deadlines move by them), and the device must
        be idle of other processes' work (device_gate.wait_for_idle)."""
        if not self.gate.active or self.adapter is None:
            return
        waited = self.gate.waited()[0] - self.gate_waited[0]
        self.soft_deadline += waited
        if self.accused is not None:
            self.accused.process.deadline += waited
        self.idle_wait = device_gate.wait_for_idle(self.adapter, self._gate_wait)

    def _start_accused(self) -> None:
        """Starts the accused process for this candidate (it imports and readies the device
        while the judge builds the candidate), with an arena sized for every workload's buffers
        (and a second set for the workloads timed with priming)."""
        req = self.req
        assert self.adapter is not None
        priming = self.adapter.primes_before_timing
        layout = Layout()  # as AccusedAdapter.bench will lay the tensors out
        for wl in req.workloads:
            for _copy in range(2 if priming and not wl.held_out else 1):
                for s in (*wl.inputs, *wl.outputs):
                    layout.place(_nbytes(s))
        self.arena_bytes = layout.size
        # The accused's own directory (it may write nothing else), in the system's temporary
        # directory: the build directory may sit where the sandbox's uid cannot go. The harness
        # is made readable for it.
        harness_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cpu_seconds = int(req.timeout_s * machine.cores()) + 10
        arena = self.arena_bytes

        def launch(log_fd: int, workdir: str, deadline: float) -> AccusedProcess:
            return AccusedProcess(req.backend, workdir=workdir, log_fd=log_fd,
                                  deadline=deadline, sandbox_mode=req.sandbox,
                                  readable_extra=(harness_dir,), arena_bytes=arena,
                                  cpu_seconds=cpu_seconds)

        # A persistent judge started this evaluation's accused during the previous one
        # (spare_accused), for a request with the same sandbox; it starts the next one now.
        key = (req.backend, req.sandbox, harness_dir, cpu_seconds,
               arena if req.backend == "cpu" else 0)
        spare = spare_accused.take(key)
        if spare is not None:
            self.process, self.workdir, self.accused_log = spare.process, spare.workdir, spare.log
            self.process.deadline = self.started + req.timeout_s
            self.prestarted = True
        else:
            self.workdir = _fresh_dir(scratch.parent(), "ksearch-accused")
            self.process = launch(1, self.workdir, self.started + req.timeout_s)

        def make_spare() -> spare_accused.Started:
            workdir = _fresh_dir(scratch.parent(), "ksearch-accused")
            fd, log = tempfile.mkstemp(prefix="ksearch-accused-", suffix=".log",
                                       dir=scratch.parent())
            try:
                return spare_accused.Started(
                    launch(fd, workdir, time.monotonic() + req.timeout_s), workdir, log)
            except BaseException:
                shutil.rmtree(workdir, ignore_errors=True)
                os.unlink(log)
                raise
            finally:
                os.close(fd)

        # Only GPU accused processes are worth starting ahead (imports and a device context:
        # seconds); a cpu one starts in a tenth of a second, and starting its successor would
        # only share the cores with this evaluation.
        if req.backend != "cpu":
            self.spare_depth = spare_accused.start(key, make_spare)

    def _accused_ready(self, info: BuildInfo) -> tuple[AccusedAdapter, str]:
        """The started accused, ready, with a copy of the artifact in its directory."""
        assert self.process is not None and self.workdir is not None
        artifact = os.path.join(self.workdir, os.path.basename(info.artifact))
        shutil.copyfile(info.artifact, artifact)
        os.chmod(artifact, 0o444)
        self.process.wait_ready()
        # How long a start-up takes, for the depth of spares the judge keeps.
        spare_accused.note_ready(sum(v for k, v in self.process.start_seconds.items()
                                     if k != "waited"))
        share = False
        if self.req.backend in ("cuda", "mlx"):
            share, why = _device_share_available(self.req.backend)
            if share and self.req.backend == "mlx" and not self.process.stages_on_device:
                share, why = False, "the accused cannot stage arrays on the device"
            self.device_share = {"active": share, "detail": why[:300]}
        return AccusedAdapter(self.process, self.req.backend, self.arena_bytes,
                              share_device=share), artifact

    def _log_slow(self, stage: str, wl: Workload, since: dict[str, float]) -> None:
        """A line in the log (whose tail a timeout result carries) for a workload whose stage
        took long, with where the time went."""
        now = self.phase.snapshot()
        spent = {k: v - since.get(k, 0.0) for k, v in now.items() if k != "total"}
        total = sum(spent.values())
        if total >= SLOW_LOG_S:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(spent.items(),
                                                                key=lambda kv: -kv[1])
                              if v >= 0.05)
            print(f"[ksearch harness] {stage} of `{wl.name}`: {total:.1f} s ({parts})",
                  file=sys.stderr, flush=True)

    # -- helpers -------------------------------------------------------------------------

    def _bench(self, wl: Workload, copy: int = 0) -> Bench:
        """The workload's `copy`-th set of buffers, made on first use and reused after, so a
        cache keyed on buffer addresses meets new data behind old keys."""
        have = self.benches.setdefault(wl.name, [])
        if copy < len(have):
            return have[copy]
        a, acc = self.adapter, self.accused
        assert a is not None and acc is not None
        with self.phase("upload"):
            inputs, outputs, fn = acc.bench(wl.inputs, wl.outputs, dict(wl.params))
            poison = {w: {s.name: dtypes.get(s.dtype).poison(s.shape, w) for s in wl.outputs}
                      for w in ("a", "b")}
            judge_inputs = ({s.name: a.alloc(s) for s in wl.inputs}
                            if a.stages_reference_inputs else {})
            have.append(Bench(wl, inputs, outputs, fn, poison, judge_inputs))
            return have[-1]

    def _make_inputs(self, wl: Workload, seed: int, wi: int) -> Inputs:
        """The input set of `seed`, drawn here or kept from an earlier evaluation of this
        process (draw_cache): the same bytes either way."""
        with self.phase("inputs"):
            if self._task_key is None:
                self._task_key = draw_cache.task_fingerprint(self.req.task)
            key = (self._task_key, repr(wl), seed, wi)
            return self._kept_inputs(key, lambda: self.task.make_inputs(wl, seed, wi))

    def _draw_ahead(self) -> None:
        """The input sets of the correctness checks (`_check_sets`) and their reference outputs,
        drawn now and kept (draw_cache) for the checks to find. Only where the judge keeps
        sets: otherwise they would be drawn twice. Stops at the first set the cache does not
        admit, leaving the rest to the checks; sets kept from earlier evaluations cost a
        lookup."""
        if not draw_cache.enabled():
            return
        for wi, wl in enumerate(self.req.workloads):
            for check in self._check_sets(wl, wi):
                if getattr(check.inputs, "cache_key", None) is None:
                    return
                self._reference(check.inputs, wl)

    def _check_sets(self, wl: Workload, wi: int) -> Iterator["CheckSet"]:
        """The input sets the correctness checks walk on workload `wi`, in order, each drawn as
        it is asked for: every trial's (`trial_seeds`), then `PROBES` near-duplicates, each
        perturbed from the set before it (seeded `derive_seed(secret, PROBE, wi, k)`), until
        the task makes no more. The one walk of the checks (`correctness`) and of what is
        drawn ahead for them (`_draw_ahead`)."""
        last: Inputs | None = None
        for t, seed in enumerate(self.trial_seeds):
            last = self._make_inputs(wl, seed, wi)
            yield CheckSet(False, t, seed, last)
        for k in range(PROBES if last is not None else 0):
            assert last is not None
            seed = derive_seed(self.req.secret_seed, PROBE, wi, k)
            probe = self._perturbed(last, wl, seed, wi)
            if probe is None:
                return
            yield CheckSet(True, k, seed, probe)
            last = probe

    def _perturbed(self, last: Inputs, wl: Workload, seed: int, wi: int) -> Inputs | None:
        """The near-duplicate of `last` for `seed` (TaskCode.perturb), kept like a drawn set when
        `last` is kept: it depends on that set and the seed only, so later evaluations of this
        process neither copy and redraw it nor compute its reference outputs again."""
        with self.phase("inputs"):
            parent = getattr(last, "cache_key", None)
            if parent is None:
                return self.task.perturb(last, wl, seed, wi)
            return self._kept_inputs(parent + ("probe", seed),
                                     lambda: self.task.perturb(last, wl, seed, wi))

    @staticmethod
    def _kept_inputs(key: tuple, draw: Any) -> Any:
        """The input set kept under `key` (draw_cache), else `draw()`'s, kept when the cache
        admits it; a kept set carries its key (`cache_key`), under which its truths are kept
        too. `draw()` may answer None (no set), which is not kept."""
        kept = draw_cache.get(("inputs",) + key)
        if kept is not None:
            return kept
        inputs = draw()
        if inputs is None:
            return None
        kept = draw_cache.put(("inputs",) + key, inputs.stored,
                              lambda copies: Inputs(copies, inputs.specs))
        if kept is None:
            return inputs
        kept.cache_key = key
        return kept

    def _reference(self, inputs: Inputs, wl: Workload) -> dict[str, np.ndarray]:
        """The reference's outputs for `inputs` (the host reference), kept with the input set
        when it came from `_make_inputs`."""
        with self.phase("reference"):
            return self._kept_truth("truth", inputs, lambda: self.task.reference(inputs, wl))

    @staticmethod
    def _kept_truth(kind: str, inputs: Inputs, compute: Any) -> dict[str, np.ndarray]:
        key = getattr(inputs, "cache_key", None)
        if key is None:
            return compute()
        kept = draw_cache.get((kind,) + key)
        if kept is not None:
            return kept
        truth = compute()
        kept = draw_cache.put((kind,) + key, truth, lambda copies: copies)
        return truth if kept is None else kept

    def _upload_inputs(self, bench: Bench, inputs: Inputs) -> None:
        acc = self.accused
        assert acc is not None
        with self.phase("upload"):
            kept = self._device_inputs(bench, inputs)
            if kept is not None:
                # Copies on the device from the judge's own copy of the set: into the
                # accused's buffers (cuda), or into their staging, from which the accused
                # copies them into new arrays (mlx: AccusedAdapter.stage_inputs).
                for name, buf in bench.inputs.items():
                    acc.device_target(buf).copy_(kept[name])
                if not acc.staged:
                    # cuda: the judge's copy is also what the accused's inputs must still
                    # equal after each call, and its staged inputs for the reference and
                    # baseline come from it.
                    for name, buf in bench.judge_inputs.items():
                        self.adapter.upload_bits(buf, kept[name],  # type: ignore[union-attr]
                                                 inputs.stored[name])
                    bench.pristine = dict(kept)
                    _judge_sync()  # written before the candidate runs
                    return
                _judge_sync()  # in the staging before the accused copies it
                acc.stage_inputs(bench.inputs)
            else:
                for name, buf in bench.inputs.items():
                    acc.upload(buf, inputs.stored[name])
            staged = self._staged_inputs(bench, inputs, kept)
            for name, buf in bench.judge_inputs.items():
                if staged is not None:
                    self.adapter.upload_kept(  # type: ignore[union-attr]
                        buf, inputs.stored[name], staged[name])
                else:
                    self.adapter.upload(buf, inputs.stored[name])  # type: ignore[union-attr]

    def _staged_inputs(self, bench: Bench, inputs: Inputs, bits: dict[str, Any] | None = None
                       ) -> dict[str, Any] | None:
        """The judge's own device arrays of an input set, for adapters whose staged inputs can
        be reused (adapters.reuses_staged_inputs: MLX, whose arrays are immutable); kept with a
        set the draw cache keeps, so later evaluations upload nothing for the judge's
        reference and baseline. Made from the judge's device copy of the set (`bits`, storage
        bits) where it has one, on the device; from the host arrays otherwise. None for other
        adapters (they upload every repetition)."""
        a = self.adapter
        if a is None or not a.reuses_staged_inputs or not bench.judge_inputs:
            return None
        if bits is not None:
            from_bits = a.device_array_from_bits  # type: ignore[attr-defined]

            def make(stored: np.ndarray, spec: Any) -> Any:
                return from_bits(bits[spec.name], spec)
        else:
            make = a.device_array  # type: ignore[attr-defined]
        return draw_cache.device_copy(
            inputs, lambda: {name: make(inputs.stored[name], buf.spec)
                             for name, buf in bench.judge_inputs.items()},
            sum(int(inputs.stored[name].nbytes) for name in bench.judge_inputs),
            a.device_memory_bytes(), kind="judge")  # type: ignore[attr-defined]

    def _device_inputs(self, bench: Bench, inputs: Inputs) -> dict[str, Any] | None:
        """The judge's own device copy of an input set (storage bits), where every input of
        the bench is shared or staged in shared memory; None otherwise. A set the draw cache
        keeps across evaluations keeps its device copy too, so later evaluations copy on the
        device only."""
        acc = self.accused
        assert acc is not None
        if not bench.inputs or any(acc.device_target(b) is None for b in bench.inputs.values()):
            return None
        return draw_cache.device_copy(
            inputs, lambda: {name: _device_copy(inputs.stored[name], buf.spec)
                             for name, buf in bench.inputs.items()},
            sum(int(inputs.stored[name].nbytes) for name in bench.inputs),
            _device_total_bytes())

    def _poison(self, bench: Bench, which: str) -> None:
        acc = self.accused
        assert acc is not None
        with self.phase("upload"):
            if self.adapter is not None and self.adapter.candidate_makes_outputs:
                # Poison would never reach the candidate (it returns new arrays): the accused
                # drops the previous outputs, which is all poisoning them did.
                acc.release_outputs(bench.outputs)
                return
            on_device = False
            for name, buf in bench.outputs.items():
                dev = acc.device_view(buf)
                if dev is None:
                    acc.upload(buf, bench.poison[which][name])
                    continue
                pattern = bench.poison_dev.get((which, name))
                if pattern is None:
                    pattern = bench.poison_dev[(which, name)] = _device_copy(
                        bench.poison[which][name], buf.spec)
                dev.copy_(pattern)
                on_device = True
            if on_device:
                _judge_sync()  # poisoned before the candidate runs

    def _snapshot(self, bench: Bench) -> Snapshot:
        """The outputs now (a device copy where the memory is shared: Snapshot)."""
        acc = self.accused
        assert acc is not None
        specs = {n: b.spec for n, b in bench.outputs.items()}
        views = acc.device_outputs(bench.outputs)
        if views is not None:
            with self.phase("checks"):
                copies = {n: v.clone() for n, v in views.items()}
                # Complete before the accused runs again: a copy still queued could take in
                # what the candidate writes later, as a host read that had returned could not.
                _judge_sync()
                return Snapshot(None, copies, specs, self._count_host_read)
        self._count_host_read()
        return Snapshot({n: acc.to_host(b) for n, b in bench.outputs.items()}, None, specs)

    def _snapshot_again(self, bench: Bench, before: Snapshot) -> Snapshot:
        """The outputs now, to compare with `before` (the deferred-work check): `before`
        itself where the accused reports its outputs unchanged since it copied them out for
        `before` (AccusedAdapter.outputs_unchanged), a fresh snapshot otherwise."""
        acc = self.accused
        assert acc is not None
        if before.device is None:
            with self.phase("checks"):
                if acc.outputs_unchanged(bench.outputs):
                    return before
        return self._snapshot(bench)

    def _count_host_read(self) -> None:
        self.host_reads += 1

    def _checkpoint(self) -> None:
        """Where another judge of the device may take it for its timed calls (device_gate):
        the accused is stopped between calls, and the judge's own device work is waited for
        before it lets go."""
        if self.gate.active and self.adapter is not None:
            self.gate.checkpoint(self.adapter.synchronize, self._gate_wait)

    def _gate_wait(self) -> contextlib.AbstractContextManager[None]:
        """A wait at the device gate: a phase of its own (not device work)."""
        return self.phase("gate")

    def _settle(self, seconds: float) -> None:
        with self.phase("settle"):
            time.sleep(seconds)

    def _decode(self, bench: Bench, outs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs as exact float values for the comparisons (float32 for f16, bf16 and
        f32 outputs)."""
        return {s.name: dtypes.get(s.dtype).decode_exact(outs[s.name])
                for s in bench.wl.outputs}

    def _compare(self, wl: Workload, outs: dict[str, np.ndarray],
                 truth: dict[str, np.ndarray]) -> Comparison:
        result = Comparison(True, 0.0, 0.0)
        for s in wl.outputs:
            result = result.merge(compare(outs[s.name], truth[s.name],
                                          tolerance_for(self.req, s.dtype)))
        return result

    def _compare_snapshot(self, wl: Workload, snap: Snapshot,
                          truth: dict[str, np.ndarray]) -> Comparison:
        """_compare of a snapshot's outputs: on the device where the snapshot is there and the
        checks allow it (device_checks), as _compare_host_snapshot says for a host one."""
        if snap.device is None:
            return self._compare_host_snapshot(wl, snap, truth)
        dev = self._device_truth(wl, snap, truth)
        if dev is None:
            return self._compare(wl, self._decode_snapshot(wl, snap), truth)
        return self._compare_on_device(wl, lambda s: snap.device[s.name], dev)  # type: ignore[index]

    def _compare_host_snapshot(self, wl: Workload, snap: Snapshot,
                               truth: dict[str, np.ndarray]) -> Comparison:
        """_compare of outputs read to the host: on the judge's GPU, each copied up, where it
        compares host outputs there (device_checks.for_host_outputs) and the checks allow it;
        on the host otherwise. A failure of the judge's own device (memory taken by the
        accused beside it, for one) moves this and every later comparison of the evaluation to
        the host: the arrays are the judge's copies either way, so the verdict is the same."""
        if self.host_outputs_on_device:
            try:
                dev = self._device_truth(wl, snap, truth)
                if dev is not None:
                    cmp = self._compare_on_device(
                        wl, lambda s: _device_copy(snap.host()[s.name], s), dev)
                    self.host_outputs_compared_on_device += 1
                    return cmp
            except Exception as e:  # noqa: BLE001 - the judge's device, not the candidate's code
                self.host_outputs_on_device = False
                self.device_checks_error = f"{type(e).__name__}: {e}"[:300]
        return self._compare(wl, self._decode_snapshot(wl, snap), truth)

    def _compare_on_device(self, wl: Workload, bits: Callable[[Any], Any],
                           dev: dict[str, Any]) -> Comparison:
        """The comparison of each output (`bits(spec)`: its storage bits on the judge's device)
        with its truth's device copy `dev` (device_checks)."""
        import torch
        result = Comparison(True, 0.0, 0.0)
        with self.phase("checks"):
            for s in wl.outputs:
                tol = tolerance_for(self.req, s.dtype)
                x = device_checks.decode(bits(s), s.dtype)
                ok, max_abs, max_rel = device_checks.compare(torch, x, dev[s.name], tol.atol,
                                                             tol.rtol)
                result = result.merge(Comparison(ok, max_abs, max_rel))
        return result

    def _decode_snapshot(self, wl: Workload, snap: Snapshot) -> dict[str, np.ndarray]:
        stored = snap.host()
        return {s.name: dtypes.get(s.dtype).decode_exact(stored[s.name]) for s in wl.outputs}

    def _device_truth(self, wl: Workload, snap: Snapshot, truth: dict[str, np.ndarray]
                      ) -> dict[str, Any] | None:
        """The truth as device tensors, for checks on the device; None where the checks stay
        on the host (a host snapshot where the judge compares host outputs on the host, a rule
        or type device_checks leaves to the host, a truth whose shape is not the output's).
        The last few are kept: a truth is compared with two calls in a trial."""
        if snap.device is None and not self.host_outputs_on_device:
            return None
        for s in wl.outputs:
            tol = tolerance_for(self.req, s.dtype)
            t = truth.get(s.name)
            if (t is None or not device_checks.supported(s.dtype, tol.rule, tol.matched_ratio)
                    or tuple(np.shape(t)) != tuple(s.shape)):
                return None
        for kept, dev in self._truths:
            if kept is truth:
                return dev
        import torch
        with self.phase("upload"):
            # A kept truth (draw_cache) keeps its device copy across evaluations too.
            dev = draw_cache.device_copy(
                truth, lambda: {s.name: torch.from_numpy(dtypes.contiguous(truth[s.name]))
                                .to("cuda") for s in wl.outputs},
                sum(int(np.asarray(truth[s.name]).nbytes) for s in wl.outputs),
                _device_total_bytes())
        self._truths = [(truth, dev)] + self._truths[:DEVICE_TRUTHS_KEPT - 1]
        return dev

    def _matches(self, wl: Workload, outs: dict[str, np.ndarray],
                 truth: dict[str, np.ndarray]) -> bool:
        return all(close_all(outs[s.name], truth[s.name], truth[s.name],
                             tolerance_for(self.req, s.dtype)) for s in wl.outputs)

    def _watch_threads(self) -> list[int]:
        states = self.accused.process.threads()  # type: ignore[union-attr]
        self.threads_max = max(self.threads_max, len(states))
        busy = [tid for tid, (st, _) in states.items()
                if tid not in self.threads_before and st == "R"]
        self.busy_after_return = max(self.busy_after_return, len(busy))
        return busy

    def _deferred(self, where: str, busy: list[int]) -> Violation:
        evidence = (f"; {len(busy)} thread(s) the candidate started were still running"
                    if busy else "")
        return Violation("deferred_work", f"outputs changed after the call returned ({where})"
                         f"{evidence}: the work must be finished when the entry point returns")

    def _check_inputs(self, bench: Bench, inputs: Inputs, where: str) -> None:
        """The inputs still hold their set: compared on the device where the judge shares the
        accused's memory, counted by the accused against its own device copy where it keeps
        one (AccusedAdapter.inputs_changed), read back and compared here otherwise."""
        acc = self.accused
        assert acc is not None
        with self.phase("checks"):
            counted = acc.inputs_changed(bench.inputs)
        for name, buf in bench.inputs.items():
            changed = counted.get(name)
            if changed == 0:
                continue
            dev, kept = acc.device_view(buf), bench.pristine.get(name)
            if changed is None and dev is not None and kept is not None:
                import torch
                with self.phase("checks"):
                    if torch.equal(dev, kept):
                        continue
            if changed is None:
                now = acc.to_host(buf)
                before = inputs.stored[name]
                if same_bytes(now, before):
                    continue
                changed = int(np.count_nonzero(now.reshape(-1).view(np.uint8)
                                               != before.reshape(-1).view(np.uint8)))
            raise Violation("input_mutated", f"input `{name}` was modified by the candidate "
                            f"({where}; {changed} byte(s) differ): inputs are read-only")

    @staticmethod
    def _changed(a: Snapshot, b: Snapshot) -> bool:
        return a.differs(b)

    def _audits(self, wl: Workload, wi: int) -> set[int]:
        """Which correctness calls of a workload (counted from 0) the kernel audit watches:
        the first, and one of the later calls of the trials chosen from the secret seed, so a
        candidate cannot tell audited calls from the others by counting."""
        if not self.audit_kernels:
            return set()
        later = 2 * self.req.trials - 1
        rng = np.random.default_rng(derive_seed(self.req.secret_seed, AUDIT, wi))
        return {0, 1 + int(rng.integers(later))} if later > 0 else {0}

    def _audit_after_timing(self, wl: Workload, wi: int, bench: Bench) -> None:
        """One more checked call after a workload's timed calls, watched by the kernel audit:
        a candidate that switches to a library kernel once it has seen enough calls to be past
        the correctness checks is caught here."""
        if not self.audit_kernels:
            return
        where = f"workload `{wl.name}`, call after timing"
        inputs = self._make_inputs(wl, derive_seed(self.req.secret_seed, AUDIT, wi, 1), wi)
        truth = self._reference(inputs, wl)
        self._upload_inputs(bench, inputs)
        call = self._checked_call(bench, inputs, truth, "a", 0, where, audit=True)
        if not call.cmp.ok:
            raise Violation("phase_dependent", f"{where}: wrong outputs after the timed calls "
                            f"although every correctness check passed")

    def _checked_call(self, bench: Bench, inputs: Inputs, truth: dict[str, np.ndarray],
                      which: str, heap_byte: int, where: str, audit: bool = False) -> Call:
        """One correctness call: poisoned outputs, the call, then the deferred-work and
        input checks. Returns the outputs and their comparison with `truth`."""
        acc = self.accused
        assert acc is not None
        self._checkpoint()
        self._poison(bench, which)
        with self.phase("candidate"):
            reply = bench.fn(heap_byte, audit=audit)
            first = self._snapshot(bench)
        self.calls += 1
        # Outputs checked on the device are compared inside the settle window, while the
        # judge waits anyway: the comparison holds for the settled outputs when they are the
        # same bytes (checked below). Host comparisons wait until the window has closed, so
        # the judge's cores stay free for whatever the accused might still run in it.
        # The truth's device copy is made there too, so the accused never runs unwatched.
        early: list[Comparison] = []
        during = None
        if first.device is not None:
            def during() -> None:
                if self._device_truth(bench.wl, first, truth) is not None:
                    early.append(self._compare_snapshot(bench.wl, first, truth))
        busy = self._after_call(where, SETTLE_SHORT_S, during)
        if audit:
            self._check_kernels(reply, where)
        settled = self._snapshot_again(bench, first)
        if self._changed(first, settled):
            raise self._deferred(where, busy)
        self._check_inputs(bench, inputs, where)
        cmp = early[0] if early else self._compare_snapshot(bench.wl, settled, truth)
        if not cmp.ok and acc.on_device:
            self._settle(SETTLE_LONG_S)
            if self._changed(settled, self._snapshot(bench)):
                raise self._deferred(where, self._watch_threads())
        return Call(settled, cmp, lambda stored: self._decode(bench, stored))

    def _after_call(self, where: str, seconds: float,
                    during: Callable[[], None] | None = None) -> list[int]:
        """The settle window after a candidate call: the accused keeps running for `seconds`
        while the judge watches its threads (and does `during`, its own work), then it is
        stopped. Returns the candidate's threads that were still running (evidence for a
        deferred-work verdict)."""
        proc = self.accused.process  # type: ignore[union-attr]
        with self.phase("settle"):
            busy = self._watch_threads()
            linger = proc.settle(seconds, during)
        proc.linger_verdict(linger, where)
        return busy

    def _check_kernels(self, reply: dict[str, Any], where: str) -> None:
        """Every GPU kernel a correctness call ran is the candidate's own (compiled from its
        source, or built by it at run time) or a library kernel the backend or the task
        allows (copies, fills): a candidate reaching a native implementation through a library
        call is `forbidden_kernel`, whatever its source says."""
        ran = [str(k) for k in reply.get("kernels") or []]
        built = [str(k) for k in reply.get("own_kernels") or []]
        patterns = DEFAULT_ALLOWED_KERNELS.get(self.req.backend, ()) + (
            self.req.task.allowed_kernels if self.req.task else ())
        for k in ran:
            if k not in self.kernels_seen and len(self.kernels_seen) < 100:
                self.kernels_seen.append(k)
        bad = [k for k in ran
               if kernel_base(k) not in self.own_kernels
               and not any(b and b in k for b in built)
               and not any(re.search(p, k) for p in patterns)]
        if bad:
            shown = "; ".join(f"`{k[:120]}`" for k in bad[:3])
            raise Violation("forbidden_kernel", f"{where}: the call ran {len(bad)} kernel(s) "
                            f"that are neither the candidate's own nor allowed library kernels "
                            f"({shown}): a native implementation reached at run time")

    def _check_written_calls(self, wl: Workload, call_a: Call, call_b: Call | None,
                             truth: dict[str, np.ndarray], where: str) -> None:
        """_check_written of two calls (or one): on the device when both snapshots are there
        and no poison pattern survived; the host finds and reports what did."""
        snaps = [c.snap for c in (call_a, call_b) if c is not None]
        dev = (self._device_truth(wl, call_a.snap, truth)
               if all(sn.device is not None for sn in snaps) else None)
        if dev is not None:
            import torch
            with self.phase("checks"):
                left = False
                for s in wl.outputs:
                    dt = dtypes.get(s.dtype)
                    width = dt.bits.itemsize
                    mask = snaps[0].device[s.name] == device_checks.signed(dt.poison_a, width)
                    if len(snaps) > 1:
                        mask = torch.logical_or(mask, snaps[1].device[s.name]
                                                == device_checks.signed(dt.poison_b, width))
                    mask = torch.logical_and(mask, torch.isfinite(dev[s.name]))
                    left = left or bool(mask.any())
            if not left:
                return
        self._check_written(wl, call_a.stored, call_b.stored if call_b else None, truth, where)

    def _check_written(self, wl: Workload, outs_a: dict[str, np.ndarray],
                       outs_b: dict[str, np.ndarray] | None, truth: dict[str, np.ndarray],
                       where: str) -> None:
        for s in wl.outputs:
            dt = dtypes.get(s.dtype)
            mask = dt.poison_mask(outs_a[s.name], "a")
            if outs_b is not None:
                mask_b = dt.poison_mask(outs_b[s.name], "b")
                mask = (mask | mask_b) if dt.is_float else (mask & mask_b)
            elif not dt.is_float:
                continue  # one integer call cannot tell a poison value from a written one
            if dt.is_float:
                mask &= np.isfinite(truth[s.name])
            count = int(np.count_nonzero(mask))
            if count:
                first = tuple(int(i) for i in np.argwhere(mask)[0])
                raise Violation("output_not_written",
                                f"output `{s.name}`: {count} of {mask.size} element(s) were "
                                f"never written ({where}; first at index {first})")

    def _check_deterministic(self, wl: Workload, call_a: Call, call_b: Call,
                             truth: dict[str, np.ndarray], where: str) -> None:
        a, b = call_a.snap.device, call_b.snap.device
        if a is not None and b is not None:
            import torch
            with self.phase("checks"):
                if all(torch.equal(a[s.name], b[s.name]) for s in wl.outputs):
                    return
        for s in wl.outputs:
            if same_bytes(call_a.stored[s.name], call_b.stored[s.name]):
                continue  # identical values are close under any tolerance, NaN and inf included
            x, y = call_a.decoded[s.name], call_b.decoded[s.name]
            tol = tolerance_for(self.req, s.dtype)
            if not close_all(x, y, truth[s.name], tol):
                n = int(np.count_nonzero(~close(x, y, truth[s.name], tol)))
                raise Violation("nondeterministic",
                                f"output `{s.name}`: two calls on identical inputs disagree in "
                                f"{n} element(s) ({where}); typical causes are reads of "
                                f"uninitialised memory or of the output buffer, or races")

    def _stale(self, wl: Workload, outs: dict[str, np.ndarray],
               earlier: list[dict[str, np.ndarray]]) -> bool:
        return any(self._matches(wl, outs, t) for t in reversed(earlier))

    def _precision_consistent(self, wl: Workload, outs: dict[str, np.ndarray],
                              truth: dict[str, np.ndarray]) -> bool:
        """True when the error fits arithmetic in f16 or bf16 though the outputs are wider."""
        for s in wl.outputs:
            if s.dtype not in ("f32", "f64"):
                return False
            if not any(close_all(outs[s.name], truth[s.name], truth[s.name],
                                 tolerance_for(self.req, narrow))
                       for narrow in dtypes.REDUCED_PRECISION):
                return False
        return True

    # -- correctness ---------------------------------------------------------------------

    def correctness(self) -> None:
        req = self.req
        failures: list[tuple[Workload, Comparison, bool, bool]] = []
        for wi, wl in enumerate(req.workloads):
            since = self.phase.snapshot()
            bench = self._bench(wl)
            earlier: list[dict[str, np.ndarray]] = []
            worst = Comparison(True, 0.0, 0.0)
            failed: tuple[Comparison, bool, bool] | None = None
            audits = self._audits(wl, wi)
            probe_seeds = self.seeds["probe_seeds"].setdefault(wl.name, [])
            for check in self._check_sets(wl, wi):
                inputs, t = check.inputs, check.index
                self._checkpoint()
                truth = self._reference(inputs, wl)
                self._upload_inputs(bench, inputs)
                if not check.probe:
                    where = f"workload `{wl.name}`, trial {t}"
                    call_a = self._checked_call(bench, inputs, truth, "a", HEAP_BYTE_A, where,
                                                audit=2 * t in audits)
                    call_b = self._checked_call(bench, inputs, truth, "b", HEAP_BYTE_B, where,
                                                audit=2 * t + 1 in audits)
                    self._check_written_calls(wl, call_a, call_b, truth, where)
                    # An earlier answer explains a disagreement between the two calls more
                    # precisely than nondeterminism does, so it is looked for first.
                    for call in (call_a, call_b):
                        if not call.cmp.ok:
                            self._raise_if_stale(wl, call.decoded, earlier, where)
                    self._check_deterministic(wl, call_a, call_b, truth, where)
                    call = call_a
                else:
                    # A near-duplicate of the set before: one call.
                    where = f"workload `{wl.name}`, near-duplicate input set {t}"
                    probe_seeds.append(check.seed)
                    call = self._checked_call(bench, inputs, truth, "a", HEAP_BYTE_A, where)
                    self._check_written_calls(wl, call, None, truth, where)
                    if not call.cmp.ok:
                        self._raise_if_stale(wl, call.decoded, earlier, where)
                worst = worst.merge(call.cmp)
                if not call.cmp.ok:
                    failed = (call.cmp, self._precision_consistent(wl, call.decoded, truth),
                              self._near_miss(wl, call.decoded, truth))
                    break
                earlier.append(truth)
            self.results[wl.name].update({"correct": failed is None,
                                          "max_abs_err": worst.max_abs,
                                          "max_rel_err": worst.max_rel})
            self._log_slow("correctness", wl, since)
            if failed is not None:
                failures.append((wl, *failed))
        self._judge(failures)

    def _raise_if_stale(self, wl: Workload, outs: dict[str, np.ndarray],
                        earlier: list[dict[str, np.ndarray]], where: str) -> None:
        if self._stale(wl, outs, earlier):
            raise Violation("stale_output", f"{where}: the outputs are the answer to an earlier "
                            f"input set, not to this one (result reuse or caching)")

    def _near_miss(self, wl: Workload, outs: dict[str, np.ndarray],
                   truth: dict[str, np.ndarray]) -> bool:
        """True when the outputs miss the tolerance by less than NEAR_MISS times: rounding that
        accumulates (a long sum in one accumulator), not a wrong shape assumption."""
        for s in wl.outputs:
            tol = tolerance_for(self.req, s.dtype)
            wide = dataclasses.replace(tol, rtol=tol.rtol * NEAR_MISS, atol=tol.atol * NEAR_MISS)
            if not close_all(outs[s.name], truth[s.name], truth[s.name], wide):
                return False
        return True

    def _judge(self, failures: list[tuple[Workload, Comparison, bool, bool]]) -> None:
        def describe(items):
            return "; ".join(f"`{wl.name}`: max abs error {c.max_abs:.3g}, max rel error "
                             f"{c.max_rel:.3g}" for wl, c, *_ in items)
        shown = [f for f in failures if not f[0].held_out]
        held = [f for f in failures if f[0].held_out]
        if shown:
            if all(reduced for _, _, reduced, _ in shown):
                raise Violation("precision", f"outputs exceed the tolerance of their dtype but "
                                f"fit f16/bf16 arithmetic ({describe(shown)}): compute in the "
                                f"output precision")
            raise Incorrect(f"outputs exceed the tolerance on {len(shown)} workload(s): "
                            f"{describe(shown)}")
        if held and all(reduced or near for _, _, reduced, near in held):
            # A held-out workload that is only a little off (a longer row, a larger sum) is an
            # accuracy problem the shown workloads did not expose, not a shape assumption.
            raise Violation("precision", f"correct on every shown workload, but the held-out "
                            f"workload(s) miss the tolerance by less than {NEAR_MISS:g} times "
                            f"({describe(held)}): accumulated rounding (sum in blocks or in a "
                            f"wider type)")
        if held:
            raise Violation("shape_specialisation", f"correct on every shown workload but wrong "
                            f"on held-out workload(s) {describe(held)}")

    # -- timing --------------------------------------------------------------------------

    def timing(self) -> int:
        """Times every shown workload; returns the total of the candidate samples (ns)."""
        req, task = self.req, self.task
        a, acc = self.adapter, self.accused
        assert a is not None and acc is not None
        tm = req.timing
        target_ns = tm.target_seconds * 1e9
        total_all = 0
        shown = [(wi, wl) for wi, wl in enumerate(req.workloads) if not wl.held_out]
        for k, (wi, wl) in enumerate(shown):
            since = self.phase.snapshot()
            # Each workload may take an equal share of the time left before the soft deadline,
            # so a slow first workload cannot leave the last ones with min_reps samples.
            left = len(shown) - k
            now = time.monotonic()
            deadline = now + max(self.soft_deadline - now, 0.0) / left
            bench = self._bench(wl)
            windows = self.windows.setdefault(wl.name, [])
            # Backends whose allocator state a host read disturbs (MLX) prime each contender
            # before its timed call: see Adapter.prime. The candidate's priming call reads
            # the previous repetition's inputs from a second bench, so it never sees the
            # inputs of the call that follows.
            priming = a.primes_before_timing
            spare = self._bench(wl, 1) if priming else None
            prev_inputs: Inputs | None = None
            order_seed = derive_seed(req.secret_seed, ORDER, wi)
            self.seeds["order_seeds"][wl.name] = order_seed
            order_rng = np.random.default_rng(order_seed)
            seeds_used: list[int] = []
            self.seeds["timing_seeds"][wl.name] = seeds_used
            # The candidate is timed paired with its anchor (yardstick.anchor); the reference
            # is timed too where the baseline is not the anchor and no yardstick converts it.
            # A reference that is not timed still runs in every repetition, for the outputs
            # the timed call is checked against.
            contenders = ["candidate", self.anchor]
            if (task.baseline_fn is not None and self.anchor == "reference"
                    and self._yardstick_for(wl) is None):
                contenders.append("baseline")
            samples: dict[str, list[int]] = {c: [] for c in contenders}
            primes: dict[str, list[int]] = {c: [] for c in contenders}
            prev_truth: dict[str, np.ndarray] | None = None
            warm, rep, total = 0, 0, 0
            while True:
                warming = warm < tm.warmup
                if not warming:
                    if rep >= tm.max_reps:
                        break
                    if rep >= tm.min_reps and (total >= target_ns
                                               or time.monotonic() > deadline
                                               or self._precise(samples, tm.precision)):
                        break
                index = warm if warming else rep
                seed = derive_seed(req.secret_seed, WARMUP if warming else TIMING, wi, index)
                seeds_used.append(seed)
                # Fresh inputs every repetition, generated untimed and written into the same
                # buffers: a cache keyed on the buffer address sees new data behind an old key.
                if priming and prev_inputs is None:
                    # The first repetition has no predecessor: an input set of its own,
                    # uploaded first so that the timed reference calls find this repetition's
                    # upload in the registry (DeviceAdapter.reference_inputs).
                    prev_inputs = self._make_inputs(
                        wl, derive_seed(req.secret_seed, PRIME, wi), wi)
                    self._upload_inputs(spare, prev_inputs)  # type: ignore[arg-type]
                inputs = self._make_inputs(wl, seed, wi)
                self._upload_inputs(bench, inputs)
                order = list(contenders)
                order_rng.shuffle(order)
                times: dict[str, int] = {}
                snap = Snapshot({}, None, {})
                truth: dict[str, np.ndarray] = {}
                busy: list[int] = []
                prime_ns: dict[str, int] = {}
                anchor_parts: dict[str, dict[str, int] | None] = {}
                cand_timed = None
                for c in order:
                    if c == "candidate":
                        # Before priming: on MLX this frees the output read back two
                        # repetitions ago, whose pages are on the host, into the cache the
                        # priming empties. Freed after the priming call, it went to the timed
                        # call on the H200 (MLX 0.32).
                        self._poison(bench, "a")
                    if priming:
                        prime_ns[c] = self._prime(c, spare, prev_inputs, wl)  # type: ignore
                    if c == "candidate":
                        with self.phase("calibration"):
                            round_trip = acc.process.round_trip()
                        self._flush()
                        with self.phase("timed_calls"):
                            timed = acc.time_call(bench.fn)
                        a.check_candidate_clock(timed.parts)
                        cand_timed = timed
                        times[c] = timed.counted_ns
                        snap = self._snapshot(bench)
                        self.calls += 1
                        busy = self._after_call(f"timed call {index} of `{wl.name}`",
                                                SETTLE_TIMED_S)
                        if not warming:
                            windows.append((timed.reported_ns, timed.window_ns, round_trip))
                            for part, ns in (timed.parts or {}).items():
                                self.parts.setdefault(wl.name, {}).setdefault(part, []).append(ns)
                    elif c == "reference":
                        with self.phase("inputs"):
                            ref_in = inputs.for_reference(shared=a.stages_reference_inputs)
                            a.expect_reference_inputs(ref_in, wl.params)
                        self._flush()
                        times[c], raw, anchor_parts[c] = self._time_task_call(
                            lambda: task.call_reference(ref_in, wl))
                        with self.phase("reference"):
                            truth = task.check_outputs(raw, wl, "reference")
                    else:
                        with self.phase("inputs"):
                            base_in = inputs.for_reference(shared=a.stages_reference_inputs)
                            a.expect_reference_inputs(base_in, wl.params)
                        self._flush()
                        times[c], _, anchor_parts[c] = self._time_task_call(
                            lambda: task.call_baseline(base_in, wl))
                if cand_timed is not None:
                    # The candidate is charged its host time only beyond its anchor's in this
                    # repetition (adapters.charged_ns).
                    times["candidate"] = cand_timed.charged(anchor_parts.get(self.anchor))
                if "reference" not in contenders:
                    truth = self._untimed_reference(inputs, wl)
                label = f"timed call {'warm-up ' if warming else ''}{index} of `{wl.name}`"
                self._recheck(bench, inputs, snap, truth, prev_truth, label, busy)
                prev_truth = truth
                if priming:
                    # This repetition's bench primes the next one's calls.
                    bench, spare, prev_inputs = spare, bench, inputs
                if warming:
                    warm += 1
                    continue
                for c in contenders:
                    samples[c].append(times[c])
                    if c in prime_ns:
                        primes[c].append(prime_ns[c])
                for part, ns in (anchor_parts.get(self.anchor) or {}).items():
                    self.anchor_parts.setdefault(wl.name, {}).setdefault(part, []).append(
                        int(ns))
                total += times["candidate"]
                rep += 1
            total_all += total
            self._record_timing(wl, samples, primes)
            self.check_reports(wl, bench)
            self._audit_after_timing(wl, wi, bench)
            self._log_slow("timing", wl, since)
        return total_all

    def _time_task_call(self, fn: Any) -> tuple[int, Any, dict[str, int] | None]:
        """A timed call of task code in the judge: its time, what it returned, and its parts
        (device and host time) where the backend reports them (what the candidate's charge is
        set against: adapters.charged_ns)."""
        a = self.adapter
        assert a is not None
        a.last_parts = None
        with self.phase("timed_calls"):
            ns, value = a.time_call(fn)
        return ns, value, a.last_parts

    @property
    def anchor(self) -> str:
        """What the candidate's timed calls are paired with (yardstick.anchor)."""
        return anchor_of(self.task, self.adapter)

    def _untimed_reference(self, inputs: Inputs, wl: Workload) -> dict[str, np.ndarray]:
        """The reference's outputs for `inputs`, computed the way its timed calls compute them
        (on the device, from the judge's device copies) but not timed."""
        a, task = self.adapter, self.task
        assert a is not None
        def compute() -> dict[str, np.ndarray]:
            args = inputs.for_reference()
            a.expect_reference_inputs(args, wl.params)
            raw = a.timed_region(lambda: task.call_reference(args, wl))
            a.verify_reference_inputs()
            return task.check_outputs(raw, wl, "reference")
        with self.phase("reference"):
            # The device path's truth differs from the host reference's: kept apart.
            return self._kept_truth("device_truth", inputs, compute)

    @staticmethod
    def _precise(samples: dict[str, list[int]], precision: float) -> bool:
        """Whether the candidate's paired ratio to what its score is computed against (the
        baseline when it is timed here, else the reference, which the yardstick's
        baseline/reference ratio scales) is known to `precision` (Timing.precision)."""
        if precision <= 0:
            return False
        den = samples["baseline"] if "baseline" in samples else samples["reference"]
        return intervals.tight(intervals.paired_ratios(den, samples["candidate"]), precision)

    def _prime(self, contender: str, spare: Bench, prev: Inputs, wl: Workload) -> int:
        """One untimed call of `contender` on the previous repetition's inputs (held by
        `spare`), so that its timed call finds the device memory as a program calling it in a
        loop would. Returns its duration (ns), kept with the samples."""
        a, task = self.adapter, self.task
        assert a is not None and self.accused is not None
        with self.phase("prime"):
            if contender == "candidate":
                # Its outputs of two repetitions ago were read on the host: freed now, before
                # the priming empties the cache, rather than by the call that replaces them.
                self._poison(spare, "b")
                ns = self.accused.prime(spare.fn)
                # Drops the outputs the call left in `spare`: their memory goes back to the
                # allocator for the timed call, as a loop's previous result would.
                self._poison(spare, "b")
                return ns
            args = prev.for_reference(shared=a.stages_reference_inputs)
            a.expect_reference_inputs(args, wl.params)  # as before the timed call
            if contender == "reference":
                return a.prime(lambda: task.call_reference(args, wl))
            return a.prime(lambda: task.call_baseline(args, wl))

    def _flush(self) -> None:
        """What precedes every timed call: device clocks up, then caches cold."""
        a = self.adapter
        assert a is not None
        with self.phase("clock_warmup"):
            a.warm_up_clocks()
        with self.phase("flush"):
            a.flush_cache()
            # Finished before the call starts: the candidate runs in another process, whose
            # CUDA context shares the GPU with the judge's by time slices, so a flush still
            # running would share the GPU with the candidate's call and stretch it.
            a.synchronize()

    def _recheck(self, bench: Bench, inputs: Inputs, snap: Snapshot,
                 truth: dict[str, np.ndarray], prev_truth: dict[str, np.ndarray] | None,
                 where: str, busy: list[int]) -> None:
        """The outputs of a timed call must be those of its own input set: the same checks as
        in correctness, so a kernel cannot behave well only while it is being checked."""
        if self._changed(snap, self._snapshot_again(bench, snap)):
            raise self._deferred(where, busy)
        self._check_inputs(bench, inputs, where)
        wl = bench.wl
        if self._compare_snapshot(wl, snap, truth).ok:
            return
        outs = self._decode(bench, snap.host())
        if self.accused is not None and self.accused.on_device:
            self._settle(SETTLE_LONG_S)
            if self._changed(snap, self._snapshot(bench)):
                raise self._deferred(where, self._watch_threads())
        if prev_truth is not None and self._matches(wl, outs, prev_truth):
            raise Violation("stale_output", f"{where}: the outputs are the answer to the "
                            f"previous input set (result reuse or caching)")
        unwritten = any(dtypes.get(s.dtype).poison_mask(snap.host()[s.name], "a").any()
                        for s in wl.outputs if dtypes.get(s.dtype).is_float)
        detail = "left outputs unwritten" if unwritten else "returned wrong outputs"
        raise Violation("phase_dependent", f"{where}: the candidate {detail} although every "
                        f"correctness check passed: behaviour depends on the phase")

    def _record_timing(self, wl: Workload, samples: dict[str, list[int]],
                       primes: dict[str, list[int]]) -> None:
        r = self.results[wl.name]
        if any(primes.values()):
            r["prime_ns"] = {c: v for c, v in primes.items() if v}
        anchor = self.anchor
        ref_samples = samples.get("reference", [])
        cand, ref = stats(samples["candidate"]), stats(ref_samples)
        base = stats(samples.get("baseline", []))
        floor_ns, ideal_ns = roofline(wl, self.bandwidth, self.peak)
        median = cand["median"]
        cand_iv = intervals.median_interval(samples["candidate"])
        # Speedups are medians of paired ratios: each repetition times the contenders back to
        # back, so what slows the machine for a moment slows both and cancels.
        paired = intervals.paired_ratios(samples[anchor], samples["candidate"])
        r.update({
            "anchor": anchor,
            "candidate_ns": samples["candidate"], "reference_ns": ref_samples,
            "baseline_ns": samples.get("baseline", []),
            "candidate_median_ns": median, "candidate_p10_ns": cand["p10"],
            "candidate_p90_ns": cand["p90"],
            "candidate_interval_ns": list(cand_iv) if cand_iv else None,
            "reference_median_ns": ref["median"],
            "baseline_median_ns": base["median"],
            "speedup_vs_reference": intervals.median(paired) if anchor == "reference" else None,
            "floor_ns": floor_ns if floor_ns > 0 else None,
            "roofline_fraction": _ratio(ideal_ns, median) if ideal_ns > 0 else None,
        })
        interval = intervals.median_interval(paired)
        # How far the ratio moved between consecutive thirds of this evaluation: load that
        # comes and goes hits the candidate's process and the judge unevenly, which the
        # order statistics of one run cannot see.
        drift_here = intervals.block_spread(intervals.block_medians(paired, EVAL_BLOCKS))
        r["ratio_spread"] = drift_here
        r["ratio_spread_p"] = intervals.drift_p(paired, EVAL_BLOCKS)
        if interval is not None:
            interval = intervals.product_interval(interval, (1.0, 1.0), drift_here)
        ys = self._yardstick_for(wl)
        if anchor == "baseline":
            # Paired with the baseline itself: the yardstick only says how far the machine
            # moved (the drift) and converts to the reference, which was not timed here.
            q = intervals.median(paired)
            r["speedup_vs_baseline"] = q
            if ys is not None:
                r["drift"] = _ratio(base["median"], ys["baseline"].median)
                r["reference_median_ns"] = ys["reference"].median
                r["reference_source"] = "yardstick"
                transfer = ys["baseline_over_reference"].median
                if q is not None and transfer:
                    r["speedup_vs_reference"] = q / transfer
            r["speedup_interval"] = list(interval) if interval else None
            return
        if self.task.baseline_fn is None:
            r["speedup_interval"] = list(interval) if interval else None
            if ys is not None:
                r["drift"] = _ratio(ref["median"], ys["reference"].median)
            return
        if ys is None:
            vs_base = intervals.paired_ratios(samples["baseline"], samples["candidate"])
            r["speedup_vs_baseline"] = intervals.median(vs_base)
            interval = intervals.median_interval(vs_base)
            if interval is not None:
                spread = intervals.block_spread(intervals.block_medians(vs_base, EVAL_BLOCKS))
                interval = intervals.product_interval(interval, (1.0, 1.0), spread)
        else:
            # The baseline was not timed here: the yardstick's baseline/reference ratio (paired
            # there, with many samples) times this evaluation's reference/candidate ratio.
            transfer = ys["baseline_over_reference"]
            r["baseline_source"] = "yardstick"
            r["baseline_median_ns"] = ys["baseline"].median
            r["drift"] = _ratio(ref["median"], ys["reference"].median)
            q = r["speedup_vs_reference"]
            r["speedup_vs_baseline"] = transfer.median * q if q is not None else None
            interval = (intervals.product_interval(transfer.interval, interval,
                                                   transfer.spread)
                        if interval is not None else None)
        r["speedup_interval"] = list(interval) if interval else None

    def _yardstick_for(self, wl: Workload) -> dict[str, Measured] | None:
        """The request's yardstick entry for `wl` when it has the reference (for the drift)
        and, for tasks with a baseline, the baseline and the baseline/reference ratio."""
        ys = self.req.yardstick
        entry = ys.get(wl.name) if ys is not None else None
        need = ("reference",) + (("baseline", "baseline_over_reference")
                                 if self.task.baseline_fn is not None else ())
        if entry is None or any(k not in entry for k in need):
            return None
        return entry

    # -- final checks --------------------------------------------------------------------

    def check_timer(self, candidate_total_ns: int) -> None:
        wall = time.monotonic_ns() - self.wall_start_ns
        bad = [s for r in self.results.values() for s in r.get("candidate_ns", []) if s <= 0]
        if bad:
            raise Violation("timer_tampering", f"{len(bad)} candidate sample(s) were not "
                            f"positive: the clock does not measure real time")
        if candidate_total_ns > wall:
            raise Violation("timer_tampering", f"candidate samples add up to "
                            f"{candidate_total_ns / 1e6:.3f} ms but only {wall / 1e6:.3f} ms of "
                            f"wall time passed since the candidate was loaded")

    def check_reports(self, wl: Workload, bench: Bench) -> None:
        """The accused's own timings against the judge's windows: an honest report falls
        short of its window by about a round trip (an empty timed call through the same path),
        so shortfalls well beyond what round trips cost in most calls mean the accused's clock
        or its reports were tampered with. Each counted sample is already bounded
        (AccusedProcess.timed); this names the candidate."""
        triples = self.windows.get(wl.name) or []
        r = self.results[wl.name]
        r["candidate_reported_ns"] = [t[0] for t in triples]
        r["candidate_window_ns"] = [t[1] for t in triples]
        r["round_trip_ns"] = [t[2] for t in triples]
        if self.parts.get(wl.name):
            r["candidate_parts_ns"] = self.parts[wl.name]
        if self.anchor_parts.get(wl.name):
            r["anchor_parts_ns"] = self.anchor_parts[wl.name]
        if not triples:
            return
        # The accused's interval lies inside the judge's on the same monotonic clock, so a
        # report that is not positive or longer than its window cannot be a measurement.
        impossible = [(rep, w) for rep, w, _ in triples
                      if rep <= 0 or rep > w + CLOCK_GRAIN_NS]
        if impossible:
            rep, w = impossible[0]
            raise Violation("timer_tampering", f"`{wl.name}`: the candidate's process reported "
                            f"{rep} ns for a call the judge saw take {w} ns ({len(impossible)} "
                            f"such report(s)): the clock does not measure real time")
        proc = self.accused.process  # type: ignore[union-attr]
        found = report_shortfall([w - rep for rep, w, _ in triples],
                                 proc.handshake.samples_ns or [t[2] for t in triples])
        r["timer_shortfall_ns"] = found.by_ns
        if not found.suspect:
            return
        # A busy machine can stretch one workload's calls beyond its round trips for a while;
        # a tampered clock keeps doing so. Before naming the candidate, fresh calls, each
        # between two round trips measured in the same conditions (after the flush), must fall
        # short again.
        again = self._confirm_reports(bench)
        r["timer_confirmation_ns"] = {"shortfall": again.by_ns, "round_trip": again.round_trip_ns,
                                      "calls": again.calls}
        if again.suspect:
            raise Violation("timer_tampering", f"`{wl.name}`: the candidate's process reported "
                            f"durations shorter than the judge's clock allows: in three of "
                            f"four timed calls the judge saw {again.by_ns / 1e3:.1f} us or "
                            f"more beyond the report and what {TAMPER_ROUND_TRIP_QUANTILE}% of "
                            f"round trips cost ({again.round_trip_ns / 1e3:.1f} us; they vary "
                            f"by {again.spread_ns / 1e3:.1f} us), and again in {again.calls} "
                            f"fresh calls: its clock or its reports were tampered with")

    def _confirm_reports(self, bench: Bench) -> Shortfall:
        """TAMPER_MIN_CALLS more timed calls of the candidate on the bench's last inputs (their
        outputs were checked with those of the timed calls), each between two round trips;
        only the reports are looked at."""
        acc = self.accused
        assert acc is not None
        excess, trips = [], []
        with self.phase("calibration"):
            for _ in range(TAMPER_MIN_CALLS):
                self._flush()
                trips.append(acc.process.round_trip())
                timed = acc.time_call(bench.fn)  # type: ignore[arg-type]
                trips.append(acc.process.round_trip())
                excess.append(timed.window_ns - timed.reported_ns)
                self.calls += 1
        return report_shortfall(excess, trips)

    def check_floors(self) -> None:
        """A median below the floor is impossible, unless the machine was busy when bandwidth
        and peak were measured: the floor is re-measured (keeping the best numbers seen) before
        a candidate is condemned."""
        for attempt in range(1 + ROOFLINE_REMEASURE):
            suspects = []
            for wl in self.req.workloads:
                r = self.results[wl.name]
                if r.get("candidate_median_ns") is None:
                    continue
                floor, ideal = roofline(wl, self.bandwidth, self.peak)
                r["floor_ns"] = floor if floor > 0 else None
                r["roofline_fraction"] = (_ratio(ideal, r["candidate_median_ns"])
                                          if ideal > 0 else None)
                if floor > 0 and r["candidate_median_ns"] < floor:
                    suspects.append((wl, r["candidate_median_ns"], floor))
            self.out.data["environment"].update({"mem_bandwidth_gbs": self.bandwidth / 1e9,
                                                 "peak_gflops": self.peak / 1e9})
            if not suspects or self.roofline_override is not None:
                break
            if attempt < ROOFLINE_REMEASURE:
                assert self.adapter is not None
                with self.phase("roofline"):
                    bw, peak = self.adapter.roofline_fresh()
                self.bandwidth, self.peak = max(self.bandwidth, bw), max(self.peak, peak)
                machine.remember_roofline(self.adapter.roofline_key(), self.bandwidth,
                                          self.peak)
        if suspects:
            wl, median, floor = suspects[0]
            raise Violation("impossible_time", f"`{wl.name}`: median {median:.0f} ns is below "
                            f"the roofline floor of {floor:.0f} ns ({wl.bytes:.3g} bytes, "
                            f"{wl.flops:.3g} FLOPs at {self.bandwidth / 1e9:.1f} GB/s "
                            f"x{BANDWIDTH_SLACK:g} and {self.peak / 1e9:.1f} GFLOP/s "
                            f"x{PEAK_SLACK:g}): the time cannot be real")

    def score(self) -> float | None:
        key = ("speedup_vs_baseline" if self.task.baseline_fn is not None
               else "speedup_vs_reference")
        values = [self.results[wl.name].get(key) for wl in self.req.workloads
                  if not wl.held_out]
        return geomean(values) if values else None

    def score_interval(self) -> list[float] | None:
        """The score's interval: the geometric means of the workloads' bounds."""
        ivs = [self.results[wl.name].get("speedup_interval") for wl in self.req.workloads
               if not wl.held_out]
        iv = intervals.geomean_interval([tuple(x) if x else None for x in ivs])
        return list(iv) if iv else None

    def drift(self) -> float | None:
        """Geometric mean over the timed workloads of the anchor's median here divided by
        the yardstick's: how much slower (> 1) or faster the machine ran the same code than
        when the yardstick was measured. `None` without a yardstick."""
        values = [self.results[wl.name].get("drift") for wl in self.req.workloads
                  if not wl.held_out and self._yardstick_for(wl) is not None]
        return geomean(values) if values else None


# Library work any candidate may cause on a GPU backend (regular expressions, searched in the
# profiler's names): copies and fills. A task adds its own (task.allowed_kernels).
DEFAULT_ALLOWED_KERNELS: dict[str, tuple[str, ...]] = {
    "cuda": (r"^Memcpy ", r"^Memset "),
    "mlx": (r"^Memcpy ", r"^Memset "),
}
_KERNEL_BASE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:<|\()")


def own_kernels(info: BuildInfo) -> set[str]:
    """The base names of the kernels a build compiled (its ptxas report's list; empty where the
    build has none, as on cpu and mlx)."""
    names = {kernel_base(k.get("name") or k.get("mangled") or "")
             for k in ((info.extra.get("ptxas") or {}).get("kernels") or [])}
    names.discard("")
    return names


def kernel_base(name: str) -> str:
    """A kernel's own identifier, without namespace, return type, template arguments or
    parameters: `void ns::attn<__half, 64>(__half const*, ...)` -> `attn`. Mangled names
    (`_Z4attnPKf`) give theirs too."""
    if name.startswith("_Z"):
        # <length><identifier> pieces; a nested name (`_ZN2ns4attnE`) ends with the kernel's.
        i, last = (3 if name.startswith("_ZN") else 2), ""
        while i < len(name) and name[i].isdigit():
            m = re.match(r"\d+", name[i:])
            assert m is not None
            n, i = int(m.group(0)), i + m.end()
            last, i = name[i:i + n], i + n
            if not name.startswith("_ZN"):
                break
        if last:
            return last
    head = name.split("(", 1)[0] + "("
    found = _KERNEL_BASE.findall(head)
    ident = found[0] if found else name.strip()
    return ident.rsplit("::", 1)[-1]


def _nbytes(spec: Any) -> int:
    count = int(np.prod(spec.shape, dtype=np.int64))
    return count * dtypes.get(spec.dtype).storage.itemsize


def _device_copy(stored: np.ndarray, spec: Any) -> Any:
    """A device tensor of the judge's holding `stored`'s bits (viewed as storage bits, as the
    shared buffers are)."""
    from .adapters.device import torch_bits_dtype, torch_from_host
    return torch_from_host(stored, spec.dtype).view(torch_bits_dtype(stored.dtype.itemsize))


def _device_share_available(backend: str) -> tuple[bool, str]:
    """Whether the judge shares device memory with the accused (device_share), and why not.
    On mlx the memory stages the candidate's arrays, which takes PyTorch with a CUDA device
    in the judge (MLX on an NVIDIA GPU; not on Apple silicon, nor in its tests' emulation
    without a stand-in)."""
    from . import device_share
    if backend == "mlx" and not os.environ.get(device_share.MODE_ENV, "").strip():
        # Until the staging is measured on a GPU (docs/results/evaluation-speed).
        return False, (f"on mlx the staging is used where asked for "
                       f"({device_share.MODE_ENV}=auto)")
    share, why = device_share.available()
    if share and backend == "mlx" and device_share.mode() != "emulate":
        if not device_checks.cuda_torch():
            return False, "PyTorch has no CUDA device in the judge"
    elif share and backend == "mlx":
        try:
            import torch  # noqa: F401 - the emulated staging's tensors are PyTorch's too
        except Exception as e:  # noqa: BLE001 - a missing or broken install
            return False, f"PyTorch does not import: {type(e).__name__}: {e}"
    return share, why


@functools.cache
def _device_total_bytes() -> int:
    """The judge's device's memory (what the device copies' budget is a share of); a judge
    process has one device, so it is asked once."""
    import torch
    return int(getattr(torch.cuda.get_device_properties(0), "total_memory", 0) or 0)


def _judge_sync() -> None:
    """Waits for the judge's own queued device work (its copies of shared buffers)."""
    import torch
    torch.cuda.synchronize()


def _append_log(path: str) -> None:
    """Copies a spare accused's output file into this request's log (fd 1), then removes it."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data:
            sys.stdout.flush()
            os.write(1, data)
    except OSError:
        pass
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def _fresh_dir(parent: str | None, prefix: str) -> str:
    import tempfile
    return tempfile.mkdtemp(prefix=f"{prefix}-", dir=parent)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den
