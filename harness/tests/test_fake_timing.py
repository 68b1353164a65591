"""The timing verdicts that no honest or cheating C kernel triggers on demand: a time below the
roofline floor, and an accused process whose reported durations disagree with the judge's
clock. Driven in-process (the judge here, the candidate in a real accused process) with a floor
set by the test, or with the accused's replies rewritten as a tampered clock would write them."""

from __future__ import annotations

import pytest

import driver
from ksearch_harness import accused_client
from ksearch_harness.adapters.cpu import CpuAdapter
from ksearch_harness.protocol import parse_request
from ksearch_harness.worker import execute

# 10 GB/s and 10 GFLOP/s: the r13c200 floor is 20800 B / 40 GB/s = 520 ns.
ROOFLINE = (10e9, 10e9)
# 1 kB/s: every floor is seconds long, so any real time is below it.
SLOW_ROOFLINE = (1e3, 1e3)


def _evaluate(tmp_path, adapter_factory=None, roofline=ROOFLINE, **overrides):
    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path,
                                               **overrides), "evaluate")
    adapter = adapter_factory(req) if adapter_factory else None
    return execute(req, adapter=adapter, roofline_override=roofline)


@pytest.fixture
def lying_clock(monkeypatch):
    """Makes every timed candidate call's reply claim `fake[0]` ns, as an accused whose clock
    or reply was tampered with would; empty calls (round trips) stay honest."""
    fake = [None]
    original = accused_client.AccusedProcess._reply

    def reply(self, seq, deadline):
        r = original(self, seq, deadline)
        if fake[0] is not None and self.last_op == "call" and "ns" in r:
            r["ns"] = fake[0]
        return r

    monkeypatch.setattr(accused_client.AccusedProcess, "_reply", reply)
    return fake


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
        # Every timed call was seen by both clocks, and the accused's lies inside the judge's.
        assert len(w["candidate_reported_ns"]) == len(w["candidate_ns"])
        assert all(0 < r <= win for r, win in zip(w["candidate_reported_ns"],
                                                  w["candidate_window_ns"]))
        assert w["round_trip_ns"] and w["timer_shortfall_ns"] is not None
    assert res["environment"]["mem_bandwidth_gbs"] == pytest.approx(10.0)


def test_time_below_the_floor_is_rejected(tmp_path):
    res = _evaluate(tmp_path, roofline=SLOW_ROOFLINE)
    assert res["status"] == "integrity_violation"
    assert res["violation"]["class"] == "impossible_time", res["message"]
    assert "roofline floor" in res["message"]
    # the measurements are kept for inspection
    assert res["workloads"][0]["candidate_median_ns"] > 0


# Calls of about ten milliseconds: a forged time below the round trip's noise (the shown
# workloads take microseconds) is beyond what the judge's clock can tell; the floor is there.
LONG_CALLS = {"workloads": [driver.workload(1024, 4096), driver.workload(7, 333, held_out=True)]}


def test_a_forged_short_time_is_bounded_and_named(tmp_path, lying_clock):
    lying_clock[0] = 3
    res = _evaluate(tmp_path, roofline=(1e15, 1e15), **LONG_CALLS)
    assert res["status"] == "integrity_violation"
    assert res["violation"]["class"] == "timer_tampering", res["message"]
    w = res["workloads"][0]
    # What counts is bounded by the judge's clock, not the 3 ns the accused claimed.
    assert all(r == 3 for r in w["candidate_reported_ns"])
    assert min(w["candidate_ns"]) > 3


def test_a_report_longer_than_the_window_is_tampering(tmp_path, lying_clock):
    lying_clock[0] = 10**10
    res = _evaluate(tmp_path)
    assert res["status"] == "integrity_violation"
    assert res["violation"]["class"] == "timer_tampering", res["message"]
    assert max(res["workloads"][0]["candidate_ns"]) < 10**10


def test_non_positive_reports_are_tampering(tmp_path, lying_clock):
    lying_clock[0] = 0
    res = _evaluate(tmp_path)
    assert res["violation"]["class"] == "timer_tampering", res["message"]


class RecordingAdapter(CpuAdapter):
    """Records what the core asks of the judge's device around each timed call."""

    def __init__(self, request):
        super().__init__(request)
        self.log: list[str] = []

    def warm_up_clocks(self):
        self.log.append("warm")

    def flush_cache(self):
        self.log.append("flush")
        super().flush_cache()

    def synchronize(self):
        self.log.append("sync")
        super().synchronize()

    def time_call(self, fn):
        self.log.append("time")
        return super().time_call(fn)


def test_every_timed_call_follows_a_clock_warm_up_and_then_a_finished_flush(tmp_path,
                                                                           monkeypatch):
    made = []
    original = accused_client.AccusedAdapter.time_call

    def candidate_time_call(self, fn):
        made[0].log.append("time")
        return original(self, fn)

    monkeypatch.setattr(accused_client.AccusedAdapter, "time_call", candidate_time_call)

    def factory(req):
        made.append(RecordingAdapter(req))
        return made[0]

    res = _evaluate(tmp_path, factory)
    assert res["status"] == "passed", res["message"]
    log = made[0].log
    timed = [i for i, op in enumerate(log) if op == "time"]
    # candidate, reference and baseline: three timed calls per repetition
    assert len(timed) >= 3 * len(driver.SHOWN), log
    # The flush comes last, so the warm-up's own traffic does not warm the caches, and it has
    # finished when the call starts (the candidate's process does not share the judge's
    # stream, so nothing else orders the two).
    assert all(i >= 3 and log[i - 3:i] == ["warm", "flush", "sync"] for i in timed), log
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



# Round trips as a 2-core virtual machine gives them (us): anywhere from half a millisecond to
# several, independently from one empty call to the next.
VM_TRIPS_US = [738, 832, 16872, 4166, 647, 3480, 1365, 5319, 3921, 1397, 1762, 681, 6550, 2023,
               2827, 571]
EXCESS_US = [3480, 4166, 2023, 3921, 5319, 2827]
CHEAP_TRIPS_US = [571, 647, 681, 738, 832, 1365]


def test_an_honest_calls_excess_is_a_round_trip_however_they_pair():
    """Each call's excess (window - report) is itself a round trip of that machine; paired with
    the cheap round trips that happened to precede them, three of four look more than a
    millisecond short. Compared as samples, they are what round trips cost."""
    paired = [e - b for e, b in zip(EXCESS_US, CHEAP_TRIPS_US)]
    assert sorted(paired)[1] > 1000
    found = accused_client.report_shortfall([e * 1000 for e in EXCESS_US],
                                            [t * 1000 for t in VM_TRIPS_US])
    assert found.calls == 6 and not found.suspect, found


def test_a_clock_slowed_on_a_noisy_machine_is_suspect():
    call_ns = 25_000_000
    # Reports a tenth of each 25 ms call; the windows carry the same round trips as above.
    excess = [call_ns - call_ns // 10 + e * 1000 for e in EXCESS_US]
    found = accused_client.report_shortfall(excess, [t * 1000 for t in VM_TRIPS_US])
    assert found.suspect and found.by_ns > 15e6, found
    # Fewer calls than the rule needs: bounded (AccusedProcess.timed), not named.
    assert not accused_client.report_shortfall(excess[:4], [t * 1000 for t in VM_TRIPS_US]).suspect


def test_a_shortfall_that_does_not_persist_is_not_named(tmp_path, lying_clock, monkeypatch):
    """Timed calls that fall short of their windows (here: replies rewritten to 3 ns) make the
    judge time fresh calls before naming the candidate; when those are honest, as after a busy
    spell, the candidate passes, its samples still bounded by the judge's clock."""
    from ksearch_harness.core import Evaluation

    confirm = Evaluation._confirm_reports

    def honest_from_now(self, bench):
        lying_clock[0] = None
        return confirm(self, bench)

    monkeypatch.setattr(Evaluation, "_confirm_reports", honest_from_now)
    lying_clock[0] = 3
    res = _evaluate(tmp_path, roofline=(1e15, 1e15), **LONG_CALLS)
    assert res["status"] == "passed", res["message"]
    w = res["workloads"][0]
    assert all(r == 3 for r in w["candidate_reported_ns"])
    assert min(w["candidate_ns"]) > 3
    assert w["timer_shortfall_ns"] > accused_client.TAMPER_MARGIN_NS
    again = w["timer_confirmation_ns"]
    assert again["calls"] == accused_client.TAMPER_MIN_CALLS
    assert again["shortfall"] < accused_client.TAMPER_MARGIN_NS
