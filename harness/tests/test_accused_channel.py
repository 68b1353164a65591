"""The judge against an accused process that breaks the protocol: garbage, oversized or torn
frames, replies to commands it was not given, a process that exits, crashes or hangs. Each is a
verdict of its own (channel tampering, a runtime error, a timeout), never a crash of the judge,
and nothing of the accused is left running."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from ksearch_harness.accused_client import (AccusedProcess, CandidateTimeout,
                                            lingered_enough)
from ksearch_harness.machine import thread_states
from ksearch_harness.protocol import CandidateRuntimeError, Violation

TESTS = Path(__file__).resolve().parent


@pytest.fixture
def workdir():
    """A fresh working directory for an accused, removed afterwards."""
    work = tempfile.mkdtemp(prefix="ksearch-test-accused-")
    yield work
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def fake(monkeypatch, workdir):
    def start(mode: str, timeout_s: float = 20.0) -> AccusedProcess:
        monkeypatch.setenv("FAKE_ACCUSED_MODE", mode)
        monkeypatch.setenv("KSEARCH_HARNESS_ACCUSED_ENV", "FAKE_ACCUSED_MODE")
        path = os.pathsep.join([str(TESTS)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        monkeypatch.setenv("PYTHONPATH", path)
        return AccusedProcess("cpu", workdir=workdir, log_fd=2,
                              deadline=time.monotonic() + timeout_s, module="fake_accused")
    return start


def _gone(proc: AccusedProcess) -> bool:
    end = time.monotonic() + 5
    while time.monotonic() < end:
        states = thread_states(proc.pid)
        if not states or all(s in "ZX" for s, _ in states.values()):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("mode", ["garbage", "oversized", "not_an_object", "wrong_seq"])
def test_a_broken_frame_is_channel_tampering(fake, mode):
    proc = fake(mode)
    with pytest.raises(Violation) as e:
        proc.rpc("noop")
    assert e.value.violation == "result_channel", e.value.message
    assert _gone(proc)


def test_a_process_that_exits_is_a_runtime_error(fake):
    proc = fake("exit")
    with pytest.raises(CandidateRuntimeError) as e:
        proc.rpc("noop")
    assert "ended" in e.value.message and "status 3" in e.value.message
    assert _gone(proc)


def test_a_crash_is_a_runtime_error_that_names_the_signal(fake):
    proc = fake("crash")
    with pytest.raises(CandidateRuntimeError) as e:
        proc.rpc("noop")
    assert "SIGSEGV" in e.value.message, e.value.message
    assert _gone(proc)


@pytest.mark.parametrize("mode", ["hang", "torn"])
def test_a_silent_or_torn_reply_times_out_and_is_killed(fake, mode):
    proc = fake(mode, timeout_s=3.0)
    t0 = time.monotonic()
    with pytest.raises(CandidateTimeout):
        proc.rpc("noop")
    assert time.monotonic() - t0 < 10
    assert _gone(proc)
    # Later commands fail at once instead of waiting again.
    with pytest.raises(CandidateRuntimeError):
        proc.rpc("noop")


def test_an_honest_reply_is_accepted(fake):
    proc = fake("honest")
    assert proc.rpc("noop")["ok"] is True
    proc.kill()
    assert _gone(proc)


def test_lingering_is_a_verdict_when_it_is_the_habit_not_a_blip():
    # Work after every call: caught at the second.
    assert not lingered_enough(1, 1)
    assert lingered_enough(2, 2)
    # Two blips among a hundred honest calls (seen from a single-threaded seed): no verdict.
    assert not lingered_enough(2, 100)
    # Work ahead of a quarter of the calls watched is a verdict however late it starts.
    assert not lingered_enough(24, 100)
    assert lingered_enough(25, 100)


@pytest.mark.parametrize("extra, detail", [((), "not a GPU backend"),
                                           (("--no-kernel-audit",), "turned off")])
def test_the_real_accused_says_whether_its_kernel_audit_is_on(extra, detail, workdir):
    """The accused program itself (not the fake): ready, and its kernel audit reported as the
    launch asked (off only when told, for diagnostics)."""
    work = workdir
    os.chmod(work, 0o777)
    harness = str(TESTS.parent)
    proc = AccusedProcess("cpu", workdir=work, log_fd=2, deadline=time.monotonic() + 60,
                          readable_extra=(harness,), extra_args=extra)
    try:
        proc.wait_ready()
        assert proc.kernel_audit["active"] is False
        assert detail in proc.kernel_audit["detail"], proc.kernel_audit
    finally:
        proc.close()
    assert _gone(proc)


def test_a_settle_window_the_judge_lengthened_is_judged_by_the_window_asked_for():
    from ksearch_harness.accused_client import LINGER_SHARE, Linger
    ms = 1_000_000
    # 2 ms of the accused's CPU time: within a share of a 20 ms window, but not of the 5 ms
    # asked for, which is what counts when the judge's own work made the window longer.
    assert not Linger(2 * ms, 20 * ms, []).lingering
    assert Linger(2 * ms, 20 * ms, [], asked_ns=5 * ms).lingering
    # A window shorter than asked (none is) would be judged as it was.
    assert Linger(int(LINGER_SHARE * 4 * ms) + 1, 4 * ms, [], asked_ns=5 * ms).lingering
