"""The profile op (profiler.py, profiled.py) without a GPU: a stand-in for ncu that starts its
target as ncu would (inside the accused's sandbox) and then writes a raw page recorded on the
H200 where ncu writes its counters. What is tested is everything around the profiler: the job,
the input set, the candidate's call in the sandbox, reading and reducing the page, held-out
workloads left out, and each way it can fail becoming a line in the result."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest

import driver
from ksearch_harness import nsight, profiler, scratch
from ksearch_harness.protocol import parse_request
from ksearch_harness.worker import execute

PAGE = driver.FIXTURES / "nsight" / "h200-torch-randn-and-matmul-raw.csv"

STAND_IN = """#!{python}
import os, shutil, subprocess, sys, time
args = sys.argv[1:]
at = args.index("--log-file")
log, rest = args[at + 1], args[at + 2:]
while rest[:1] and rest[0].startswith("--"):  # ncu's options that follow its log file
    rest = rest[2:]
rc = subprocess.call(rest)
time.sleep({sleep})
if {write_page}:
    shutil.copyfile({page!r}, log)
sys.exit(rc)
"""


@pytest.fixture
def stand_in_dir():
    """A directory the sandbox's uid reaches without a revealed path (pytest's own are closed
    to it, and a machine without mount namespaces cannot reveal one)."""
    d = Path(tempfile.mkdtemp(prefix="ksearch-ncu-stand-in-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _stand_in(d: Path, write_page: bool = True, sleep: float = 0.0) -> str:
    """An executable in `d` that behaves as ncu does towards its target and its log file."""
    page = d / "page.csv"
    page.write_bytes(PAGE.read_bytes())
    exe = d / "ncu"
    exe.write_text(STAND_IN.format(python=sys.executable, write_page=write_page, page=str(page),
                                   sleep=sleep))
    for p in (d, page, exe):
        p.chmod(p.stat().st_mode | stat.S_IRWXU | stat.S_IROTH | stat.S_IXOTH | stat.S_IRGRP
                | stat.S_IXGRP)
    return str(exe)


def _profile(tmp_path: Path, candidate: Path, shown_only: bool = False, **overrides) -> dict:
    """The profile op on the softmax fixture; `shown_only`: of its smallest shown workload
    alone, as the search asks for a new best's."""
    if shown_only:
        overrides["workloads"] = [driver.workload(*driver.SHOWN[0])]
    req = parse_request(driver.softmax_request(candidate, tmp_path / "build", op="profile",
                                               **overrides), "profile")
    return execute(req)


def _profile_dirs() -> set[str]:
    base = scratch.parent() or tempfile.gettempdir()
    return {p for p in os.listdir(base) if p.startswith("ksearch-profile-")}


def test_each_shown_workload_is_profiled_and_read_back(tmp_path, monkeypatch, stand_in_dir):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    before = _profile_dirs()
    res = _profile(tmp_path, driver.HONEST / "naive.c")
    assert res["status"] == "passed", res["message"]
    prof = res["profile"]
    assert prof["available"] and prof["profiler"].endswith("ncu")
    # Held-out workloads are not profiled: their shapes stay out of the search's advice.
    names = [w["name"] for w in prof["workloads"]]
    assert names == [driver.workload(r, c)["name"] for r, c in driver.SHOWN]
    # A C build lists no GPU kernels, so every launch of the page counts.
    want = nsight.reduce(nsight.parse_raw_csv(PAGE.read_text()), lambda _k: True)
    for w in prof["workloads"]:
        assert "error" not in w, w
        assert w["calls"] == 1  # the candidate ran, in the sandbox, under the stand-in
        assert w["launches"] == want["launches"]
        assert w["counters"] == {k: v for k, v in want.items() if k != "launches"}
        assert w["seconds"] > 0
        # Where the target's time went: its steps, each within the profile's own seconds.
        steps = w["target_seconds"]
        assert list(steps) == ["device", "wait", "load", "inputs", "calls"], steps
        assert all(v >= 0 for v in steps.values()) and sum(steps.values()) <= w["seconds"]
    # Nothing of a profiled workload's directory is left behind.
    assert _profile_dirs() == before


def test_a_candidate_that_crashes_gets_no_counters(tmp_path, monkeypatch, stand_in_dir):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    res = _profile(tmp_path, driver.CHEATS / "segfault.c")
    assert res["status"] == "passed", res["message"]
    for w in res["profile"]["workloads"]:
        assert "counters" not in w
        assert w["error"].startswith("the candidate's process failed"), w


def test_a_profiler_that_writes_nothing_is_reported(tmp_path, monkeypatch, stand_in_dir):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir, write_page=False))
    res = _profile(tmp_path, driver.HONEST / "naive.c")
    for w in res["profile"]["workloads"]:
        assert w["calls"] == 1
        assert w["error"].startswith("the profiler wrote no counters"), w


def test_a_profiler_past_its_share_of_the_time_is_stopped(tmp_path, monkeypatch, stand_in_dir):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir, sleep=30))
    # Two shown workloads share the request's 3 s.
    res = _profile(tmp_path, driver.HONEST / "naive.c", timeout_s=3)
    assert res["status"] == "passed", res["message"]
    for w in res["profile"]["workloads"]:
        assert w["error"] == "the profiler did not finish within 2 s", w
        assert w["seconds"] < 10


def test_without_a_profiler_the_result_says_why(tmp_path, monkeypatch):
    monkeypatch.delenv(profiler.NCU_ENV, raising=False)
    res = _profile(tmp_path, driver.HONEST / "naive.c")
    assert res["status"] == "passed", res["message"]
    prof = res["profile"]
    assert prof["available"] is False and prof["workloads"] == []
    assert "cpu backend reads no hardware counters" in prof["detail"]
    # Whether this machine has counters at all is asked, and said where it has none.
    missing = profiler.perf_event_missing()
    assert (f"perf_event_open: {missing}" in prof["detail"]) == (missing is not None)


def test_a_machine_without_counters_is_told_apart(monkeypatch):
    monkeypatch.setattr(profiler, "perf_event_missing", lambda: "ENOENT")
    assert profiler.cpu_counters_absent().endswith(
        "this machine exposes none either (perf_event_open: ENOENT)")
    monkeypatch.setattr(profiler, "perf_event_missing", lambda: None)
    assert "exposes none" not in profiler.cpu_counters_absent()


@pytest.mark.parametrize("name", ["missing", "not-executable", "a-directory"])
def test_a_named_profiler_must_be_an_executable_file(tmp_path, monkeypatch, stand_in_dir, name):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    (tmp_path / "a-directory").mkdir()
    value = str(tmp_path / name)
    monkeypatch.setenv(profiler.NCU_ENV, value)
    found, why = profiler.find_ncu("cuda")
    assert found is None and value in why
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    assert profiler.find_ncu("cpu")[0] == os.environ[profiler.NCU_ENV]


def test_a_build_failure_is_the_result(tmp_path, monkeypatch, stand_in_dir):
    bad = tmp_path / "bad.c"
    bad.write_text("this is not C\n")
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    res = _profile(tmp_path, bad)
    assert res["status"] == "build_error"
    assert "profile" not in res


def test_spare_accused_processes_wait_while_a_profile_runs(tmp_path, monkeypatch, stand_in_dir):
    """A persistent judge serves profiles; the accused processes it starts ahead for later
    evaluations are stopped while the profiler runs, as while a yardstick is timed."""
    import contextlib
    from ksearch_harness import spare_accused
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    seen = []

    @contextlib.contextmanager
    def paused():
        seen.append("paused")
        yield
        seen.append("resumed")

    monkeypatch.setattr(spare_accused, "paused", paused)
    called = profiler.profile

    def profile(*args, **kwargs):
        seen.append("profile")
        return called(*args, **kwargs)

    monkeypatch.setattr(profiler, "profile", profile)
    res = _profile(tmp_path, driver.HONEST / "naive.c")
    assert res["status"] == "passed", res["message"]
    assert seen == ["paused", "profile", "resumed"]



@pytest.fixture
def kept_ahead():
    """The profile op as a persistent judge serves it: a profiler started after each profile
    for the next (worker.child_loop); nothing of it is left when the test ends."""
    profiler.keep_ahead()
    yield
    profiler.keep_ahead(False)
    assert profiler._ahead is None


def _eventually(read, done, seconds: float = 10.0):
    """`read()` until `done` holds of it or `seconds` pass; the last reading."""
    end = time.monotonic() + seconds
    got = read()
    while not done(got) and time.monotonic() < end:
        time.sleep(0.01)
        got = read()
    return got


def _tree_states(started) -> list[str]:
    from ksearch_harness.machine import child_pids, thread_states
    pids, at = [started.box.pid], 0
    while at < len(pids):
        pids.extend(child_pids(pids[at]))
        at += 1
    return [s for pid in pids for s, _ in thread_states(pid).values()]


def test_a_judge_starts_the_next_profile_s_profiler_ahead(tmp_path, monkeypatch, stand_in_dir,
                                                         kept_ahead):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    before = _profile_dirs()
    first = _profile(tmp_path, driver.HONEST / "naive.c", shown_only=True)
    assert first["status"] == "passed", first["message"]
    (w,) = first["profile"]["workloads"]
    # Nothing waited for this one: it started its own profiler, whose target readied the
    # device in its own time.
    assert w["started_now"] == "none was started" and "device" in w["target_seconds"]
    waiting = profiler._ahead
    assert waiting is not None and waiting.box.poll() is None
    assert len(_profile_dirs() - before) == 1  # the waiting profiler's own directory
    second = _profile(tmp_path, driver.HONEST / "naive.c", shown_only=True)
    (w2,) = second["profile"]["workloads"]
    assert "error" not in w2, w2
    assert w2["started_ahead_seconds"] > 0 and w2["calls"] == 1 and "started_now" not in w2
    # The device was readied, and the job waited for, before this profile began.
    assert list(w2["target_seconds"]) == ["load", "inputs", "calls"]
    assert w2["counters"] == w["counters"]
    assert waiting.box.poll() is not None  # the one taken has ended, and another waits
    assert profiler._ahead is not None and profiler._ahead is not waiting
    profiler.close()
    assert waiting.box.poll() is not None and _profile_dirs() == before


def test_a_profiler_started_ahead_waits_while_anything_is_timed(tmp_path, monkeypatch,
                                                               stand_in_dir, kept_ahead):
    from ksearch_harness import spare_accused
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    _profile(tmp_path, driver.HONEST / "naive.c", shown_only=True)
    waiting = profiler._ahead
    assert waiting is not None
    end = time.monotonic() + 20
    while len(_tree_states(waiting)) < 2 and time.monotonic() < end:
        time.sleep(0.01)  # until the stand-in has started its target
    with spare_accused.paused():
        # The stand-in and its target, every thread stopped (a signal takes effect when its
        # thread next runs: on a loaded machine, not at once; a thread inside a system call
        # that waits on the disk, state D, stops only when the call ends).
        states = _eventually(lambda: _tree_states(waiting),
                             lambda st: len(st) >= 2 and all(s in "Tt" for s in st), 30.0)
        assert len(states) >= 2 and all(s in "Tt" for s in states), states
    states = _eventually(lambda: _tree_states(waiting),
                         lambda st: not any(s in "Tt" for s in st))
    assert not any(s in "Tt" for s in states), states
    # A profile taking it lets it go on, though the profile op pauses what waits.
    res = _profile(tmp_path, driver.HONEST / "naive.c", shown_only=True)
    assert res["profile"]["workloads"][0]["started_ahead_seconds"] > 0


def test_a_profiler_started_ahead_that_died_or_does_not_fit_is_replaced(
        tmp_path, monkeypatch, stand_in_dir, kept_ahead):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    _profile(tmp_path, driver.HONEST / "naive.c", shown_only=True)
    profiler._ahead.box.kill()
    res = _profile(tmp_path, driver.HONEST / "naive.c", shown_only=True)
    (w,) = res["profile"]["workloads"]
    assert "error" not in w and "started_ahead_seconds" not in w, w
    assert w["started_now"].startswith("the one started ahead had ended (exit status"), w
    # One started for another sandbox (here: a cpu target's address space, for larger inputs)
    # is not taken either.
    waiting = profiler._ahead
    res = _profile(tmp_path, driver.HONEST / "naive.c")
    first = res["profile"]["workloads"][0]
    assert first["started_now"] == "the one started ahead was for another sandbox", first
    assert all("started_ahead_seconds" not in w for w in res["profile"]["workloads"])
    assert waiting.box.poll() is not None


def test_a_gpu_profiler_started_ahead_fits_every_workload_of_its_task(tmp_path):
    """The search profiles a new best on the workload furthest from the speed of light, which
    changes from one profile to the next; a GPU target's sandbox does not depend on it."""
    def key(backend: str, shown: tuple[int, int]) -> tuple:
        obj = driver.softmax_request(None, tmp_path, op="profile", backend=backend,
                                     workloads=[driver.workload(*shown)])
        return profiler._key(parse_request(obj, "profile"), "/ncu")

    small, large = driver.SHOWN
    assert key("cuda", small) == key("cuda", large)
    assert key("cpu", small) != key("cpu", large)


def test_an_evaluation_that_says_profiles_will_follow_starts_the_first_one_s_profiler(
        tmp_path, monkeypatch, stand_in_dir, kept_ahead):
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(stand_in_dir))
    for ahead in (False, True):
        obj = driver.softmax_request(driver.HONEST / "naive.c", tmp_path / "build",
                                     profiles_ahead=ahead)
        res = execute(parse_request(obj, "evaluate"))
        assert res["status"] == "passed", res["message"]
        # Nothing is started for a run that will not profile.
        assert (profiler._ahead is not None) == ahead
    first = _profile(tmp_path, driver.HONEST / "naive.c")
    w = first["profile"]["workloads"][0]
    assert w["started_ahead_seconds"] > 0 and "error" not in w, w


def test_profiles_ahead_must_be_a_boolean(tmp_path):
    from ksearch_harness.protocol import TaskError
    obj = driver.softmax_request(driver.HONEST / "naive.c", tmp_path, profiles_ahead="yes")
    with pytest.raises(TaskError, match="profiles_ahead"):
        parse_request(obj, "evaluate")
    assert not parse_request(driver.softmax_request(None, tmp_path), "evaluate").profiles_ahead
