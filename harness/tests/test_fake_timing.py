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
