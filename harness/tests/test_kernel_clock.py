"""The kernel clock (kernel_clock.py): a call's device time from recorded device activity, on
a recorder that stands in for PyTorch's profiler; and the mlx adapter timing with it."""

from __future__ import annotations

import time

import pytest

from ksearch_harness import kernel_clock
from ksearch_harness.kernel_clock import ClockError, KernelClock, span_ns
from ksearch_harness.protocol import TaskError


def test_a_span_runs_from_the_first_start_to_the_last_end():
    assert span_ns([]) is None
    assert span_ns([(100, 250)]) == 150
    # Two kernels with a gap between them: the gap is part of what the call costs.
    assert span_ns([(300, 400), (100, 150)]) == 300
    # A malformed record (ending before it starts) is ignored, not allowed to shrink the span.
    assert span_ns([(100, 200), (500, 50)]) == 100
    assert span_ns([(5, 1)]) is None


def recorder(intervals, calls=None):
    def record(fn, sync):
        value = fn()
        sync()
        if calls is not None:
            calls.append(fn)
        return value, list(intervals)
    return record


def test_a_clock_whose_profiler_records_nothing_or_fails_is_not_used():
    silent = KernelClock(recorder([]))
    silent.prepare(lambda: None, lambda: None)
    assert silent.prepared and not silent.available
    assert "recorded no device activity" in silent.why
    with pytest.raises(ClockError, match="not available"):
        silent.measure(lambda: 1, lambda: None)

    def broken(fn, sync):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
    failing = KernelClock(broken)
    failing.prepare(lambda: None, lambda: None)
    assert not failing.available and "CUPTI_ERROR_NOT_INITIALIZED" in failing.why


def test_a_measured_call_reports_its_device_span_and_its_host_time():
    calls = []
    clock = KernelClock(recorder([(1_000, 6_000), (7_000, 9_000)], calls))
    clock.prepare(lambda: None, lambda: None)
    assert clock.available
    device_ns, host_ns, value = clock.measure(lambda: (time.sleep(0.01), "out")[1], lambda: None)
    assert (device_ns, value) == (8_000, "out")
    assert host_ns >= 10_000_000  # the host time of the call itself, not the device's
    assert len(calls) == 3  # two test launches in prepare, one measured call
    # A timed call that recorded no device activity is an error, never a zero.
    empty = KernelClock(recorder([(0, 1)]))
    empty.prepare(lambda: None, lambda: None)
    empty._recorder = recorder([])
    with pytest.raises(ClockError, match="no device activity"):
        empty.measure(lambda: None, lambda: None)
    # A recorder that says what its session did record: the error carries it, so a clock
    # failing where it runs (the accused) says whether the profiler saw anything at all.
    seen = recorder([])
    seen.seen = "7 CPU"
    empty._recorder = seen
    with pytest.raises(ClockError, match=r"a timed call \(the session recorded: 7 CPU\)"):
        empty.measure(lambda: None, lambda: None)


def test_the_clock_is_chosen_by_name(monkeypatch):
    monkeypatch.delenv(kernel_clock.CLOCK_ENV, raising=False)
    assert kernel_clock.chosen() == "kernels"
    monkeypatch.setenv(kernel_clock.CLOCK_ENV, "wall")
    assert kernel_clock.chosen() == "wall"
    monkeypatch.setenv(kernel_clock.CLOCK_ENV, "events")
    with pytest.raises(TaskError, match="KSEARCH_HARNESS_MLX_CLOCK"):
        kernel_clock.chosen()
