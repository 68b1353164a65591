"""The persistent judge (`python -m ksearch_harness serve`): requests one per line on stdin,
results one per line on the result fd, served by one long-lived worker until a request times
out or the worker dies, after which the next request gets a fresh one."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import driver


@contextlib.contextmanager
def _kept_draws(keep: bool = True):
    """The draw cache on (or off) for the block, as in a persistent judge's worker, and
    emptied before and after."""
    from ksearch_harness import draw_cache
    draw_cache.clear()
    draw_cache.enable(keep)
    try:
        yield
    finally:
        draw_cache.clear()
        draw_cache.enable(False)


class Judge:
    def __init__(self):
        self.r, w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(driver.HARNESS_DIR)] + [p for p in [env.get("PYTHONPATH")] if p])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ksearch_harness", "serve", "--result-fd", str(w)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(w,), env=env, start_new_session=True, cwd="/")
        os.close(w)
        self.buf = bytearray()

    def ask(self, request: dict, timeout: float = 120.0) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            assert left > 0, "no result in time"
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 16)
                assert chunk, "the judge closed its result channel"
                self.buf += chunk
        nl = self.buf.index(b"\n")
        line = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        return json.loads(line)

    def close(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        os.close(self.r)
        return code


def _accused_leftovers() -> set[str]:
    tmp = tempfile.gettempdir()
    return {n for n in os.listdir(tmp) if n.startswith(("ksearch-accused", "ksearch-judge"))}


def test_one_worker_serves_requests_until_one_times_out():
    before = _accused_leftovers()
    judge = Judge()
    try:
        with tempfile.TemporaryDirectory() as d:
            naive = driver.HONEST / "naive.c"
            first = judge.ask(driver.softmax_request(naive, d, nonce="a" * 16))
            assert first["status"] == "passed", first["message"]
            assert first["nonce"] == "a" * 16
            j1 = first["environment"]["judge"]
            assert j1["persistent"] and j1["served"] == 1
            second = judge.ask(driver.softmax_request(naive, d, op="yardstick", nonce="b" * 16))
            assert second["status"] == "passed", second["message"]
            assert second["nonce"] == "b" * 16 and second["yardstick"]["workloads"]
            assert second["environment"]["judge"] == {**j1, "served": 2}
            # A request that outlives its limit: the worker is killed, the result says so.
            late = judge.ask(driver.softmax_request(naive, d, nonce="c" * 16, timeout_s=0.05))
            assert late["status"] == "timeout", late
            assert late["nonce"] == "c" * 16
            # The next request gets a fresh worker.
            again = judge.ask(driver.softmax_request(naive, d, nonce="d" * 16))
            assert again["status"] == "passed", again["message"]
            assert again["environment"]["judge"]["served"] == 1
            assert again["environment"]["judge"]["pid"] != j1["pid"]
            # Nothing kept from the killed worker: the only hits are those of this evaluation's
            # own draws, each drawn once and then found: the first trial's sets and truths,
            # which the task's check drew, found when the judge draws ahead of the checks, and
            # every set of the checks found by them (inputs and truth, two hits each).
            sets = (len(again["seeds"]["trial_seeds"]) * len(again["workloads"])
                    + sum(len(s) for s in again["seeds"]["probe_seeds"].values()))
            assert again["diagnostics"]["draw_cache"]["hits"] == \
                2 * (len(again["workloads"]) + sets), again["diagnostics"]["draw_cache"]
            # The next evaluation in that worker finds its input sets and reference outputs
            # kept (draw_cache): the same inputs, so the same errors, without drawing them.
            kept = judge.ask(driver.softmax_request(naive, d, nonce="g" * 16))
            assert kept["status"] == "passed", kept["message"]
            assert kept["diagnostics"]["draw_cache"]["hits"] > 0
            # On the cpu backend every evaluation starts its own accused (spares are for GPU
            # backends: test_a_gpu_judge_starts_the_next_accused_ahead).
            assert kept["diagnostics"]["accused_prestarted"] is False
            errors = [(w["name"], w["max_abs_err"]) for w in again["workloads"]]
            assert [(w["name"], w["max_abs_err"]) for w in kept["workloads"]] == errors
            # Ops that do not time on a device are not served here.
            built = judge.ask(driver.softmax_request(naive, d, op="build", nonce="e" * 16))
            assert built["status"] == "task_error" and "not served" in built["message"]
            # A malformed line costs its request, not the judge.
            assert judge.ask({"op": "evaluate"})["status"] == "task_error"
            last = judge.ask(driver.softmax_request(naive, d, nonce="f" * 16))
            assert last["status"] == "passed", last["message"]
    finally:
        assert judge.close() == 0
    # Nothing of an accused is left: not the spare the last evaluation started, nor the
    # directories of the worker killed for its timeout (scratch.py).
    left = _accused_leftovers() - before
    assert not left, left


def test_a_persistent_judge_serves_the_profile_op(monkeypatch):
    """The profile op runs in the judge that evaluates (its imports and device context kept);
    its candidate still runs under the profiler (here a stand-in for ncu) in a process of its
    own."""
    from ksearch_harness import profiler
    from test_profiler import _stand_in
    stand_in = tempfile.mkdtemp(prefix="ksearch-ncu-stand-in-")
    os.chmod(stand_in, 0o755)
    monkeypatch.setenv(profiler.NCU_ENV, _stand_in(Path(stand_in)))
    judge = Judge()
    try:
        with tempfile.TemporaryDirectory() as d:
            naive = driver.HONEST / "naive.c"
            first = judge.ask(driver.softmax_request(naive, d, nonce="a" * 16))
            assert first["status"] == "passed", first["message"]
            prof = judge.ask(driver.softmax_request(naive, d, op="profile", nonce="b" * 16))
            assert prof["status"] == "passed", prof["message"]
            assert prof["environment"]["judge"] == {**first["environment"]["judge"],
                                                    "served": 2}
            shown = [w for w in prof["profile"]["workloads"]]
            assert shown and all(w["calls"] == 1 and "error" not in w for w in shown), shown
    finally:
        assert judge.close() == 0
        shutil.rmtree(stand_in, ignore_errors=True)


def test_a_later_evaluation_draws_no_near_duplicate_and_computes_no_truth_again(tmp_path,
                                                                                monkeypatch):
    """The near-duplicate input sets (TaskCode.perturb) depend on their parent set and seed
    only: a judge keeps them with their reference outputs like the drawn sets, so its next
    evaluation of the run neither copies and perturbs a set nor calls the reference again,
    and finds the same errors."""
    from ksearch_harness import sanity_cache, worker
    from ksearch_harness.protocol import parse_request
    from ksearch_harness.task_code import TaskCode

    calls = {"perturb": 0, "reference": 0}

    def counted(name):
        real = getattr(TaskCode, name)

        def wrapper(self, *args, **kwargs):
            calls[name] += 1
            return real(self, *args, **kwargs)
        return wrapper

    for name in calls:
        monkeypatch.setattr(TaskCode, name, counted(name))
    # As ksearch runs it: the task's sanity check (which draws and computes on its own) is
    # remembered after the first evaluation.
    monkeypatch.setenv(sanity_cache.ENV, str(tmp_path / "sanity"))
    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path), "evaluate")
    with _kept_draws():
        first = worker.execute(req)
        drawn = dict(calls)
        second = worker.execute(req)
    assert first["status"] == second["status"] == "passed", (first["message"],
                                                            second["message"])
    assert drawn["perturb"] > 0 and drawn["reference"] > drawn["perturb"], drawn
    assert calls == drawn, (drawn, calls)
    errors = [(w["name"], w["max_abs_err"]) for w in first["workloads"]]
    assert [(w["name"], w["max_abs_err"]) for w in second["workloads"]] == errors


def test_the_task_check_draws_the_first_trials_sets_for_the_evaluation(tmp_path, monkeypatch):
    """The task's sanity check draws each workload's set for the first trial's seed and runs
    the reference on it; the evaluation's first trial uses the same seed. Through the judge's
    own draws, the first evaluation draws and computes each of those sets once, not twice."""
    from ksearch_harness import sanity_cache, worker
    from ksearch_harness.protocol import parse_request
    from ksearch_harness.task_code import TaskCode

    drawn: list[tuple[int, int]] = []
    computed = {"reference": 0}
    real_draw, real_reference = TaskCode.make_inputs, TaskCode.reference

    def make_inputs(self, wl, seed, wi):
        drawn.append((seed, wi))
        return real_draw(self, wl, seed, wi)

    def reference(self, inputs, wl):
        computed["reference"] += 1
        return real_reference(self, inputs, wl)

    monkeypatch.setattr(TaskCode, "make_inputs", make_inputs)
    monkeypatch.setattr(TaskCode, "reference", reference)
    monkeypatch.setenv(sanity_cache.ENV, str(tmp_path / "sanity"))
    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path), "evaluate")

    def first_evaluation(keep: bool) -> tuple[dict, list[tuple[int, int]], int]:
        drawn.clear()
        computed["reference"] = 0
        for entry in (tmp_path / "sanity").glob("*"):
            entry.unlink()
        with _kept_draws(keep):
            return worker.execute(req), list(drawn), computed["reference"]

    kept, kept_draws, kept_refs = first_evaluation(True)
    assert kept["status"] == "passed", kept["message"]
    # Every set drawn once: the sanity check's are the first trial's.
    assert len(kept_draws) == len(set(kept_draws)), kept_draws
    # The control: without kept sets, the first trial's sets are drawn twice.
    plain, plain_draws, plain_refs = first_evaluation(False)
    assert plain["status"] == "passed", plain["message"]
    workloads = len(req.workloads)
    assert len(plain_draws) - len(set(plain_draws)) >= workloads, plain_draws
    assert plain_refs - kept_refs >= workloads, (plain_refs, kept_refs)


def test_a_judge_draws_the_checks_sets_while_a_fresh_accused_starts(tmp_path, monkeypatch):
    """An evaluation whose accused was started for it (no spare was ready: a judge's first
    evaluation) draws every input set of its correctness checks and their reference outputs
    before it waits for the accused to be ready, which meanwhile imports and readies its
    device: the checks then find every set kept. Each set is still drawn once."""
    from ksearch_harness import core, draw_cache, sanity_cache, worker
    from ksearch_harness.protocol import parse_request
    from ksearch_harness.task_code import TaskCode

    drawn: list[tuple[int, int]] = []
    real_draw = TaskCode.make_inputs

    def make_inputs(self, wl, seed, wi):
        drawn.append((seed, wi))
        return real_draw(self, wl, seed, wi)

    at_ready: list[int] = []
    real_ready = core.Evaluation._accused_ready

    def accused_ready(self, info):
        at_ready.append(len(drawn))
        return real_ready(self, info)

    in_checks: list[dict] = []
    real_correctness = core.Evaluation.correctness

    def correctness(self):
        before = draw_cache.stats()
        real_correctness(self)
        after = draw_cache.stats()
        in_checks.append({k: after[k] - before[k] for k in ("hits", "misses")})

    monkeypatch.setattr(TaskCode, "make_inputs", make_inputs)
    monkeypatch.setattr(core.Evaluation, "_accused_ready", accused_ready)
    monkeypatch.setattr(core.Evaluation, "correctness", correctness)
    monkeypatch.setenv(sanity_cache.ENV, str(tmp_path / "sanity"))
    req = parse_request(driver.softmax_request(driver.HONEST / "naive.c", tmp_path), "evaluate")
    with _kept_draws():
        result = worker.execute(req)
    assert result["status"] == "passed", result["message"]
    assert result["diagnostics"]["accused_prestarted"] is False
    trials = len(result["seeds"]["trial_seeds"])
    probes = sum(len(s) for s in result["seeds"]["probe_seeds"].values())
    assert at_ready == [trials * len(req.workloads)], (at_ready, trials, len(req.workloads))
    assert probes > 0
    assert in_checks == [{"hits": in_checks[0]["hits"], "misses": 0}], in_checks
    assert in_checks[0]["hits"] >= 2 * (trials * len(req.workloads) + probes)
    assert len(drawn) == len(set(drawn)), drawn


def test_a_worker_whose_device_context_is_lost_ends_after_its_answer():
    """worker._forget_device says whether the judge's own device context died (a sticky CUDA
    error marks the adapter dead), so child_loop ends and the next request gets a new worker."""
    import types

    from ksearch_harness import worker
    from ksearch_harness.adapters import device
    device._ACTIVE = types.SimpleNamespace(_dead="CUDA error: an illegal memory access")
    assert worker._forget_device() is True and device._ACTIVE is None
    device._ACTIVE = types.SimpleNamespace(_dead=None)
    assert worker._forget_device() is False and device._ACTIVE is None
    assert worker._forget_device() is False


def test_the_draw_cache_admits_until_its_budget_is_spent(monkeypatch):
    """Kept arrays are read-only copies outside the heap; admission stops at the budget; a
    budget of 0 keeps nothing."""
    import numpy as np

    from ksearch_harness import draw_cache
    draw_cache.clear()
    monkeypatch.setenv(draw_cache.ENV, "1")  # 1 MiB
    # Off outside a persistent judge's worker.
    assert draw_cache.put(("x", 0), {"a": np.zeros(4)}, lambda c: c) is None
    draw_cache.clear()
    draw_cache.enable()
    a = np.arange(100_000, dtype=np.float32)  # 400 KB
    kept = draw_cache.put(("x", 1), {"a": a}, lambda copies: copies)
    assert draw_cache.get(("x", 1)) is kept
    assert kept["a"] is not a and np.array_equal(kept["a"], a)
    assert not kept["a"].flags.writeable and not kept["a"].flags.owndata
    assert a.flags.writeable  # the caller's array is left alone
    b = np.zeros((250, 400), dtype=np.float32)
    assert draw_cache.put(("x", 2), {"b": b}, lambda c: c)["b"].shape == (250, 400)
    c = np.zeros(100_000, dtype=np.float32)
    assert draw_cache.put(("x", 3), {"c": c}, lambda c: c) is None  # over the budget
    assert draw_cache.get(("x", 3)) is None and draw_cache.stats()["refused"] == 1
    scalar = draw_cache.off_heap(np.float32(2.5))
    assert scalar.shape == () and float(scalar) == 2.5
    monkeypatch.setenv(draw_cache.ENV, "0")  # off
    draw_cache.clear()
    assert draw_cache.put(("x", 1), {"a": a}, lambda c: c) is None
    draw_cache.clear()
    draw_cache.enable(False)


def test_kept_values_keep_device_copies_within_the_device_budget(monkeypatch):
    """A kept value's device copy is made once and handed out again while the device budget
    (a share of the device's memory, or KSEARCH_HARNESS_DEVICE_CACHE_MB) lasts; values that
    are not kept, or come after the budget is spent, get a new copy every time."""
    import numpy as np

    from ksearch_harness import draw_cache
    draw_cache.clear()
    draw_cache.enable()
    monkeypatch.delenv(draw_cache.DEVICE_ENV, raising=False)
    try:
        made = []

        def copy(tag):
            def make():
                made.append(tag)
                return object()
            return make
        first = draw_cache.put(("d", 1), {"a": np.zeros(4)}, lambda c: c)
        second = draw_cache.put(("d", 2), {"a": np.zeros(4)}, lambda c: c)
        loose = {"a": np.zeros(4)}  # never kept
        device_total = 4000  # a quarter of it: 1000 bytes of device copies
        one = draw_cache.device_copy(first, copy("first"), 600, device_total)
        assert draw_cache.device_copy(first, copy("first"), 600, device_total) is one
        assert draw_cache.device_kept(first)
        # The second would pass the budget: made each time, not kept.
        draw_cache.device_copy(second, copy("second"), 600, device_total)
        draw_cache.device_copy(second, copy("second"), 600, device_total)
        draw_cache.device_copy(loose, copy("loose"), 1, device_total)
        draw_cache.device_copy(loose, copy("loose"), 1, device_total)
        assert made == ["first", "second", "second", "loose", "loose"]
        assert not draw_cache.device_kept(second) and not draw_cache.device_kept(loose)
        assert draw_cache.stats()["device_bytes"] == 600
        monkeypatch.setenv(draw_cache.DEVICE_ENV, "0")  # keep none on the device
        draw_cache.clear()
        again = draw_cache.put(("d", 1), {"a": np.zeros(4)}, lambda c: c)
        draw_cache.device_copy(again, copy("again"), 1, device_total)
        assert not draw_cache.device_kept(again)
    finally:
        draw_cache.clear()
        draw_cache.enable(False)


def test_spares_are_stopped_while_something_is_timed_and_taken_oldest_first(monkeypatch):
    """spare_accused keeps its depth of spares: `pause` stops them (the judge does not wait
    for them to be ready) and leaves any stopped already as they are; `resume` or
    `take` lets them go on; `take` hands out the oldest (it had longest to start) and skips dead
    ones; a request for another sandbox discards them all."""
    from ksearch_harness import spare_accused

    class Process:
        def __init__(self, stopped=False):
            self.stopped, self.dead, self.signals = stopped, None, []

        def stop(self):
            self.signals.append("STOP")
            self.stopped = True

        def cont(self):
            self.signals.append("CONT")
            self.stopped = False

        def _alive(self):
            return self.dead is None

        def kill(self):
            self.signals.append("KILL")

    made = []

    def factory(stopped=False):
        def started():
            fd, log = tempfile.mkstemp()
            os.close(fd)
            made.append(Process(stopped))
            return spare_accused.Started(made[-1], tempfile.mkdtemp(), log)
        return started

    monkeypatch.setattr(spare_accused.machine, "cores", lambda: 16)
    monkeypatch.setenv(spare_accused.ENV, "2")
    spare_accused.enable()
    try:
        spare_accused.start(("k",), factory())
        assert len(made) == 2  # filled to its depth
        first, second = made
        spare_accused.pause()
        spare_accused.pause()  # once is enough
        assert first.signals == second.signals == ["STOP"]
        spare_accused.resume()
        spare_accused.resume()
        assert first.signals == ["STOP", "CONT"] and not first.stopped
        with spare_accused.paused():  # as evaluations and yardsticks time their calls
            assert first.stopped and second.stopped
        assert not first.stopped and not second.stopped
        # Two holders (this judge's timing, and its device gate's watcher while another judge
        # times): the spares go on once both have resumed.
        with spare_accused.paused():
            spare_accused.pause("gate")
        assert first.stopped and second.stopped
        spare_accused.resume("gate")
        assert not first.stopped and first.signals == ["STOP", "CONT"] * 3
        # Paused when taken: the evaluation that takes the oldest gets them going again.
        spare_accused.pause()
        got = spare_accused.take(("k",))
        assert got is not None and got.process is first and not first.stopped
        assert not second.stopped
        spare_accused.discard(got)
        # Refilled by the next start; a spare stopped by someone else is left as it is.
        spare_accused.start(("k",), factory(stopped=True))
        third = made[-1]
        spare_accused.pause()
        spare_accused.resume()
        assert third.signals == []
        # A dead spare is skipped (and discarded); the next oldest is taken.
        second.dead = "killed"
        got = spare_accused.take(("k",))
        assert got is not None and got.process is third and second.signals[-1] == "KILL"
        spare_accused.discard(got)
        # Another sandbox: nothing fits, and what was kept is discarded.
        spare_accused.start(("k",), factory())
        kept = made[-2:]
        assert spare_accused.take(("other",)) is None
        assert all(p.signals[-1] == "KILL" for p in kept)
        # A depth of 0 turns them off; a number picks the depth.
        monkeypatch.setenv(spare_accused.ENV, "0")
        spare_accused.enable()
        assert not spare_accused.enabled()
        monkeypatch.setenv(spare_accused.ENV, "1")
        spare_accused.enable()
        spare_accused.start(("k",), factory())
        assert len(spare_accused._spares) == 1
        # Unset: the default depth.
        monkeypatch.delenv(spare_accused.ENV)
        spare_accused.enable()
        spare_accused.start(("k",), factory())
        assert len(spare_accused._spares) == spare_accused.INITIAL_DEPTH == 6
    finally:
        spare_accused.enable(False)
    assert made[-1].signals[-1] == "KILL"  # untaken spares go with the judge's end


def test_spare_depth_follows_the_measured_start_ups_and_evaluations(monkeypatch):
    """Unpinned, the judge keeps as many spares as one start-up takes evaluations, plus one:
    INITIAL_DEPTH until it has measured a start-up and three gaps between evaluations (the
    first evaluation's, longer than the rest, is not the median then), then
    ceil(median start-up / median gap) + 1, at most MAX_DEPTH; spares beyond a depth that fell
    are taken in turn, not killed. Pinned by the environment, the depth is what it says
    whatever is measured."""
    from ksearch_harness import spare_accused

    class Process:
        stopped, dead = False, None

        def stop(self):
            self.stopped = True

        def cont(self):
            self.stopped = False

        def _alive(self):
            return True

        def kill(self):
            pass

    def factory():
        fd, log = tempfile.mkstemp()
        os.close(fd)
        return spare_accused.Started(Process(), tempfile.mkdtemp(), log)

    def evaluations(at):
        """Each evaluation's take and start; the depth the last start kept."""
        depth = None
        for t in at:
            got = spare_accused.take(("k",), now=t)
            if got is not None:
                spare_accused.discard(got)
            depth = spare_accused.start(("k",), factory)
        return depth

    monkeypatch.setattr(spare_accused.machine, "cores", lambda: 16)
    monkeypatch.delenv(spare_accused.ENV, raising=False)
    spare_accused.enable()
    try:
        assert evaluations([-20.0]) == spare_accused.INITIAL_DEPTH
        assert len(spare_accused._spares) == spare_accused.INITIAL_DEPTH  # nothing measured
        spare_accused.note_ready(8.0)
        evaluations([0.0, 1.5])
        assert spare_accused.wanted_depth() == spare_accused.INITIAL_DEPTH  # two gaps only
        # Evaluations 1.5 s apart after a first of 20 s, start-ups of 8 s:
        # ceil(8 / 1.5) + 1 = 7 ahead.
        assert evaluations([3.0]) == spare_accused.wanted_depth() == 7
        assert len(spare_accused._spares) == 7
        # Slow evaluations (20 s apart): two once their gaps are the median, a start-up within
        # one evaluation, plus one. The spares started are taken in turn, and then the pool
        # stays at two.
        spare_accused.note_ready(8.0)
        spare_accused.note_ready(8.0)
        evaluations([23.0, 43.0, 63.0, 83.0])
        assert spare_accused.wanted_depth() == 2
        assert len(spare_accused._spares) == 3
        evaluations([103.0, 123.0, 143.0])
        assert len(spare_accused._spares) == 2
        # Start-ups far longer than evaluations: at most MAX_DEPTH.
        for _ in range(spare_accused.RECENT):
            spare_accused.note_ready(60.0)
        evaluations([144.0, 145.0, 146.0, 147.0, 148.0])
        assert spare_accused.wanted_depth() == spare_accused.MAX_DEPTH
        assert len(spare_accused._spares) == spare_accused.MAX_DEPTH
        # And at most half the cores: a start-up keeps about one busy.
        monkeypatch.setattr(spare_accused.machine, "cores", lambda: 6)
        assert spare_accused.wanted_depth() == 3
        # A nonsensical figure is not a start-up.
        spare_accused.note_ready(float("nan"))
        spare_accused.note_ready(-1.0)
        assert list(spare_accused._starts) == [60.0] * spare_accused.RECENT
        # Pinned: the environment's number, whatever was measured.
        monkeypatch.setenv(spare_accused.ENV, "2")
        spare_accused.enable()
        spare_accused.note_ready(60.0)
        evaluations([200.0, 201.0, 202.0, 203.0, 204.0, 205.0, 206.0, 207.0])
        assert spare_accused.wanted_depth() == 2 and len(spare_accused._spares) == 2
        # Off: none, and no depth reported.
        spare_accused.enable(False)
        assert spare_accused.wanted_depth() == spare_accused.start(("k",), factory) == 0
    finally:
        spare_accused.enable(False)
    assert not spare_accused._spares


def test_a_killed_accused_is_waited_for_after_the_result_and_before_anything_is_timed(
        tmp_path, monkeypatch):
    """reaping: in a persistent judge an evaluation's killed accused is waited for (and its
    directory removed) on a thread of its own, so the result does not wait for it; pausing for
    a timed call (the judge's worker hooks `reaping.wait` into spare_accused's pause) waits
    for it; a one-shot harness waits at once. An evaluation in such a judge leaves nothing
    behind once that wait has returned."""
    import threading

    from ksearch_harness import reaping, spare_accused, worker
    from ksearch_harness.protocol import parse_request

    monkeypatch.setattr(spare_accused, "_also", [])
    released = threading.Event()
    order: list[str] = []

    def slow() -> None:
        released.wait(10)
        order.append("reaped")

    reaping.enable()
    try:
        spare_accused.pause_also(reaping.wait)
        reaping.later(slow)
        assert reaping.pending() == 1 and order == []
        paused = threading.Thread(target=lambda: (spare_accused.pause(),
                                                  order.append("paused")))
        paused.start()
        paused.join(0.2)
        assert paused.is_alive() and order == [], "a pause must wait for the dying accused"
        released.set()
        paused.join(10)
        assert order == ["reaped", "paused"]
        spare_accused.resume()

        before = _accused_leftovers()
        req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path)
        result = worker.execute(parse_request(req, "evaluate"))
        assert result["status"] == "passed", result["message"]
        reaping.wait()
        assert reaping.pending() == 0
        assert not _accused_leftovers() - before
    finally:
        reaping.enable(False)
    # Not deferring: done before `later` returns.
    done: list[int] = []
    reaping.later(lambda: done.append(1))
    assert done == [1] and reaping.pending() == 0
