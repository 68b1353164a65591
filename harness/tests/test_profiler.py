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
if rest[:1] == ["--kernel-name-base"]:
    rest = rest[4:]
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


def _profile(tmp_path: Path, candidate: Path, **overrides) -> dict:
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
        assert list(steps) == ["device", "load", "inputs", "calls"], steps
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

