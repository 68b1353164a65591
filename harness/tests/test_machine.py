"""The machine figures behind floors and fractions of peak: measured once per machine and
remembered, so every evaluation uses the same ones; only a better measurement replaces them."""

from __future__ import annotations

import pytest

from ksearch_harness import machine


def test_figures_are_measured_once_and_only_improved(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    key = "cpu:test"
    assert machine.remembered_roofline(key, lambda: (20e9, 300e9)) == (20e9, 300e9)

    def never():
        raise AssertionError("measured again")

    assert machine.remembered_roofline(key, never) == (20e9, 300e9)
    # A busy machine's lower figures and an implausible one change nothing; a better one does.
    machine.remember_roofline(key, 8e9, 5.7e9)
    machine.remember_roofline(key, 25e9, 1e30)
    assert machine.remembered_roofline(key, never) == (25e9, 300e9)
    # Another machine (key) is measured on its own.
    assert machine.remembered_roofline("cpu:other", lambda: (1e9, 2e9)) == (1e9, 2e9)


def test_implausible_remembered_figures_are_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    machine.remember_roofline("k", 1.0, 1.0)  # below every plausible value: not kept
    assert machine.remembered_roofline("k", lambda: (3e9, 4e9)) == (3e9, 4e9)


def test_without_a_cache_each_evaluation_measures(monkeypatch):
    monkeypatch.delenv("KSEARCH_HARNESS_MACHINE_CACHE", raising=False)
    assert machine.remembered_roofline("k", lambda: (1e9, 2e9)) == (1e9, 2e9)
    assert machine.remembered_roofline("k", lambda: (3e9, 1e9)) == (3e9, 1e9)
    machine.remember_roofline("k", 5e9, 5e9)  # nowhere to keep it: no error


@pytest.mark.parametrize("bw, peak", [(0.0, 1e9), (float("nan"), 1e9)])
def test_a_failed_measurement_is_not_remembered(tmp_path, monkeypatch, bw, peak):
    monkeypatch.setenv("KSEARCH_HARNESS_MACHINE_CACHE", str(tmp_path))
    machine.remember_roofline("k", bw, peak)
    assert machine.remembered_roofline("k", lambda: (2e9, 3e9)) == (2e9, 3e9)


def test_process_cpu_time_is_exact_for_a_thread_still_running():
    """A child spins, says so through a pipe, then blocks: what it spent is all counted by the
    time the parent reads the clock, so nothing of the spin appears later as if spent after."""
    import subprocess
    import sys
    import time as clock
    from ksearch_harness.machine import process_cpu_ns
    code = ("import sys, time\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < 0.05: pass\n"
            "sys.stdout.write('x'); sys.stdout.flush()\n"
            "sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        assert child.stdout.read(1) == b"x"
        before = process_cpu_ns(child.pid)
        clock.sleep(0.02)
        after = process_cpu_ns(child.pid)
        assert before is not None and before >= 50_000_000
        # The child only returns to its blocking read; schedstat would show up to a scheduler
        # tick (milliseconds) more here.
        assert after - before < 1_000_000
    finally:
        child.kill()
        child.wait()
    assert process_cpu_ns(child.pid) is None


def test_the_collector_is_paused_inside_and_restored_after():
    import gc
    from ksearch_harness.machine import collector_paused
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError):
        with collector_paused():
            raise RuntimeError("a failed evaluation")
    assert gc.isenabled()


def test_the_peak_is_one_cores_product_rate_times_the_cores(monkeypatch):
    """The judge's BLAS runs on one thread, so the measured product rate is one core's; the
    machine's peak, which floors divide, counts every core a kernel may use."""
    clock = iter(range(0, 10**12, 10**6))  # every timed step takes exactly 1 ms

    monkeypatch.setattr(machine.time, "perf_counter_ns", lambda: next(clock))
    monkeypatch.setattr(machine, "cores", lambda: 6)
    bandwidth, peak = machine.measure_roofline_fresh()
    assert bandwidth == pytest.approx(2 * (32 << 20) / 1e-3)
    assert peak == pytest.approx(6 * 2 * 1024 ** 3 / 1e-3)
