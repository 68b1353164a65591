"""The timing verdicts that no honest or cheating C kernel can trigger on demand: a time below
the roofline floor, and a clock that runs faster than the wall. Driven in-process with an
adapter whose timer lies about the candidate's calls."""

from __future__ import annotations

import pytest

import driver
from ksearch_harness.adapters.cpu import CpuAdapter
from ksearch_harness.protocol import parse_request
from ksearch_harness.worker import execute

# 10 GB/s and 10 GFLOP/s: the r13c200 floor is 20800 B / 40 GB/s = 520 ns.
ROOFLINE = (10e9, 10e9)


class LyingTimer(CpuAdapter):
    """Reports `fake_ns` for every call of the candidate; reference and baseline are honest."""

    def __init__(self, request, fake_ns: int):
        super().__init__(request)
        self.fake_ns = fake_ns
        self.candidate_calls: set[int] = set()

    def bind(self, inputs, outputs, params):
        fn = super().bind(inputs, outputs, params)
        self.candidate_calls.add(id(fn))
        return fn

    def time_call(self, fn):
        ns, value = super().time_call(fn)
        return (self.fake_ns if id(fn) in self.candidate_calls else ns), value


def _evaluate(tmp_path, adapter_factory=None):
    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path),
                        "evaluate")
    adapter = adapter_factory(req) if adapter_factory else None
    return execute(req, adapter=adapter, roofline_override=ROOFLINE)


def test_honest_timing_is_above_the_floor(tmp_path):
    res = _evaluate(tmp_path)
    assert res["status"] == "passed", res["message"]
    bw, peak = ROOFLINE
    for (rows, cols), w in zip(driver.SHOWN, res["workloads"]):
        nbytes, flops = 8.0 * rows * cols, 5.0 * rows * cols
        assert w["floor_ns"] == pytest.approx(max(nbytes / (bw * 4), flops / (peak * 2)) * 1e9)
        assert w["roofline_fraction"] == pytest.approx(
            max(nbytes / bw, flops / peak) * 1e9 / w["candidate_median_ns"])
        assert w["candidate_median_ns"] > w["floor_ns"]
    assert res["environment"]["mem_bandwidth_gbs"] == pytest.approx(10.0)


def test_impossibly_fast_candidate_is_rejected(tmp_path):
    res = _evaluate(tmp_path, lambda req: LyingTimer(req, fake_ns=3))
    assert res["status"] == "integrity_violation"
    assert res["violation"]["class"] == "impossible_time", res["message"]
    assert "roofline floor" in res["message"]
    # the measurements are kept for inspection
    assert res["workloads"][0]["candidate_median_ns"] == 3


def test_timer_faster_than_the_wall_is_tampering(tmp_path):
    res = _evaluate(tmp_path, lambda req: LyingTimer(req, fake_ns=10**10))
    assert res["status"] == "integrity_violation"
    assert res["violation"]["class"] == "timer_tampering", res["message"]


def test_non_positive_samples_are_tampering(tmp_path):
    res = _evaluate(tmp_path, lambda req: LyingTimer(req, fake_ns=0))
    assert res["violation"]["class"] == "timer_tampering", res["message"]


class RecordingAdapter(CpuAdapter):
    """Records what the core asks of the device around each timed call."""

    def __init__(self, request):
        super().__init__(request)
        self.log: list[str] = []

    def warm_up_clocks(self):
        self.log.append("warm")

    def flush_cache(self):
        self.log.append("flush")
        super().flush_cache()

    def time_call(self, fn):
        self.log.append("time")
        return super().time_call(fn)


def test_every_timed_call_follows_a_clock_warm_up_and_then_a_flush(tmp_path):
    made = []

    def factory(req):
        made.append(RecordingAdapter(req))
        return made[0]

    res = _evaluate(tmp_path, factory)
    assert res["status"] == "passed", res["message"]
    log = made[0].log
    timed = [i for i, op in enumerate(log) if op == "time"]
    assert timed, log
    # The flush comes last, so the warm-up's own traffic does not warm the caches.
    assert all(i >= 2 and log[i - 2:i] == ["warm", "flush"] for i in timed), log
    assert "clock_warmup" in res["diagnostics"]["phase_seconds"]


def test_device_warm_up_sweeps_for_the_configured_time(tmp_path, monkeypatch):
    import time

    from ksearch_harness.adapters import device

    class Sweeps(device.DeviceAdapter):
        name = "sweeps"

        def __init__(self, request):
            super().__init__(request)
            self.flushes = self.syncs = 0

        def flush_cache(self):
            self.flushes += 1
            time.sleep(0.001)

        def synchronize(self):
            self.syncs += 1

        build = load = alloc = upload = to_host = call = None

    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path), "evaluate")
    Sweeps.__abstractmethods__ = frozenset()
    monkeypatch.setenv("KSEARCH_HARNESS_CLOCK_WARMUP_MS", "30")
    a = Sweeps(req)
    t0 = time.perf_counter()
    a.warm_up_clocks()
    assert time.perf_counter() - t0 >= 0.03
    assert a.flushes >= 2 and a.syncs == a.flushes
    for off in ("0", None):  # off when 0, and by default
        if off is None:
            monkeypatch.delenv("KSEARCH_HARNESS_CLOCK_WARMUP_MS")
        else:
            monkeypatch.setenv("KSEARCH_HARNESS_CLOCK_WARMUP_MS", off)
        b = Sweeps(req)
        b.warm_up_clocks()
        assert b.flushes == 0
    # A bad value is refused when the adapter is made, not in the middle of timing.
    monkeypatch.setenv("KSEARCH_HARNESS_CLOCK_WARMUP_MS", "soon")
    with pytest.raises(Exception, match="KSEARCH_HARNESS_CLOCK_WARMUP_MS"):
        Sweeps(req)
