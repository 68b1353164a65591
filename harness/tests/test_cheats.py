"""The cheat corpus: every cheat is rejected with its class, through the real process
boundary (fresh harness process, own process group, private result fd)."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time

import pytest

import driver
from cheat_table import EXPECTED


def test_every_cheat_file_is_listed_and_names_its_class():
    files = sorted(p.name for p in driver.CHEATS.glob("*.c"))
    assert files == sorted(EXPECTED)
    for name in files:
        header = (driver.CHEATS / name).read_text().split("*/", 1)[0]
        status, cls, *_ = EXPECTED[name]
        primary = cls[0] if isinstance(cls, tuple) else cls
        named = re.search(r"Cheat class: ([a-z_]+)", header)
        assert named, f"{name} lacks a 'Cheat class:' header"
        assert named.group(1) == (primary or "none"), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cheat_is_rejected_with_its_class(corpus_results, name):
    status, cls, *_ = EXPECTED[name]
    run = corpus_results[name]
    assert run.result is not None, f"no result line; stderr: {run.stderr[-2000:]}"
    res = run.result
    assert res["nonce"] == driver.NONCE
    # A tuple lists the verdicts that are equally right for a cheat, pairwise (status, class).
    statuses = status if isinstance(status, tuple) else (status,)
    classes = cls if isinstance(cls, tuple) else (cls,)
    got = (res["status"], (res["violation"] or {}).get("class"))
    assert got in list(zip(statuses, classes)), res["message"]
    if res["status"] != "passed":
        assert res["score"] is None
        assert res["message"]


def test_forged_result_line_is_not_accepted(corpus_results):
    run = corpus_results["forged_result.c"]
    # Exactly one line reached the real channel (run_harness asserts it), and it is ours.
    assert run.raw.count(b"\n") == 1
    assert b'"nonce":"forged"' not in run.raw.split(b'"log_tail"')[0]
    assert run.result["score"] is None
    # What the candidate wrote to fd 1 went to the log, not to the caller.
    assert "forged" in run.result["log_tail"]
    assert run.stdout == ""


def test_timeout_is_a_clean_verdict(corpus_results):
    run = corpus_results["infinite_loop.c"]
    assert run.result["status"] == "timeout"
    assert run.seconds < 3 + 20
    assert driver.live_group_members(run.pgid) == []


def test_a_timed_out_evaluation_leaves_no_files_behind():
    """The worker is killed at the request's timeout, before it can clean up: the directories
    it made for the accused (the candidate's working directory among them) live beneath a
    scratch directory of the supervisor's, removed with the worker (scratch.py)."""
    def ours() -> set[str]:
        return {n for n in os.listdir(tempfile.gettempdir())
                if n.startswith(("ksearch-judge-", "ksearch-accused-"))}
    before = ours()
    with tempfile.TemporaryDirectory() as d:
        req = driver.softmax_request(driver.CHEATS / "infinite_loop.c", d, timeout_s=3)
        run = driver.run_harness("evaluate", req, timeout=60)
        assert run.result is not None and run.result["status"] == "timeout"
    assert ours() - before == set()


def test_group_kill_from_outside_leaves_nothing_running():
    """ksearch's own timeout: it kills the harness's process group. The worker is in that
    group, so no spinning candidate survives, and the verdict is a timeout without a result."""
    with tempfile.TemporaryDirectory() as d:
        req = driver.softmax_request(driver.CHEATS / "infinite_loop.c", d, timeout_s=300)
        run = driver.run_harness("evaluate", req, timeout=4)
        assert run.killed and run.verdict == "timeout" and run.result is None
        deadline = time.monotonic() + 5
        while driver.live_group_members(run.pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert driver.live_group_members(run.pgid) == []
        # The killed supervisor could not remove its scratch directory; the next harness to
        # start does (scratch.sweep), since its pid is gone.
        left = [n for n in os.listdir(tempfile.gettempdir())
                if n.startswith(f"ksearch-judge-{run.pgid}-")]
        assert left, "the killed supervisor made no scratch directory"
        driver.run_harness("evaluate", driver.softmax_request(driver.HONEST / "naive.c", d),
                           timeout=120)
        assert not [n for n in os.listdir(tempfile.gettempdir())
                    if n.startswith(f"ksearch-judge-{run.pgid}-")]


def test_segfault_then_next_evaluation_still_works(corpus_results):
    run = corpus_results["segfault.c"]
    assert "SIGSEGV" in run.result["message"]
    assert "Fatal Python error" in run.result["log_tail"]  # faulthandler's trace in the log
    with tempfile.TemporaryDirectory() as d:
        req = driver.softmax_request(driver.HONEST / "naive.c", d)
        after = driver.run_harness("evaluate", req)
        assert after.result["status"] == "passed", after.result["message"]


ESCAPES = ("fork", "inet_socket", "inet_connect", "unix_socket", "read_environ", "write_tmp",
           "write_harness", "reserve_64gib", "signal_init", "signal_parent")


def _confined() -> bool:
    """Linux as root: every layer of the sandbox is available (CI and the GPU machine)."""
    return sys.platform.startswith("linux") and os.geteuid() == 0


def test_sandboxed_escapes(corpus_results):
    run = corpus_results["escape_attempts.c"]
    res = run.result
    log = res["log_tail"]
    tried = dict(re.findall(r"^ESCAPE (\w+) (ok|denied)$", log, re.M))
    assert set(tried) == set(ESCAPES), log[-2000:]
    # The key in the harness's environment never reaches a candidate, sandbox or not.
    assert driver.CANARY not in json.dumps(res)
    if not _confined():
        pytest.skip("the strict part needs Linux and root")
    layers = {x["name"]: x for x in res["sandbox"]}
    missing = [n for n, x in layers.items() if not x["active"]]
    assert not missing, f"sandbox layers not active: {missing}: {res['sandbox']}"
    escaped = [what for what, outcome in tried.items() if outcome == "ok"]
    assert not escaped, f"the candidate managed {escaped}"
    assert res["status"] == "passed", res["message"]
    assert "LEAKED" not in log


def test_the_compiler_cannot_print_a_secret(corpus_results):
    res = corpus_results["include_environ.c"].result
    assert driver.CANARY not in json.dumps(res)
    if _confined():
        layers = {x["name"]: x["active"] for x in res["build"]["sandbox"]}
        assert layers and all(layers.values()), res["build"]["sandbox"]
