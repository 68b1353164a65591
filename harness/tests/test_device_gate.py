"""The device gate (device_gate.py): judges of one device side by side, timed work alone."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ksearch_harness import device_gate, spare_accused

import driver

FORK = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def _fresh_gate(monkeypatch):
    monkeypatch.delenv(device_gate.ENV, raising=False)
    device_gate.reset()
    yield
    device_gate.reset()


def _stamp(log: Path, what: str) -> None:
    with open(log, "a") as f:
        f.write(json.dumps([what, os.getpid(), time.monotonic()]) + "\n")


def _stamps(log: Path) -> list[tuple[str, int, float]]:
    return [tuple(json.loads(line)) for line in log.read_text().splitlines()]


def _exclusive_for(directory: str, seconds: float, log: Path, go: "multiprocessing.Event") -> None:
    gate = device_gate.Gate(directory)
    go.wait(10)
    with gate.exclusive():
        _stamp(log, "exclusive-in")
        time.sleep(seconds)
        _stamp(log, "exclusive-out")
    os._exit(0)


def _shared_with_checkpoints(directory: str, seconds: float, log: Path,
                             held: "multiprocessing.Event") -> None:
    gate = device_gate.Gate(directory)
    with gate.shared():
        held.set()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            _stamp(log, "call-in")
            time.sleep(0.003)  # a correctness call on the device
            _stamp(log, "call-out")
            gate.checkpoint()
    os._exit(0)


def _clock(entered: list[str]):
    """A phase clock's stand-in (device_gate's `waiting`): notes each wait's start and end."""
    @contextmanager
    def clock():
        entered.append("in")
        yield
        entered.append("out")
    return clock


def _start(target, *args) -> multiprocessing.Process:
    p = FORK.Process(target=target, args=args)
    p.start()
    return p


def _join(*procs: multiprocessing.Process) -> None:
    for p in procs:
        p.join(20)
        assert p.exitcode == 0


def test_without_a_gate_nothing_waits():
    gate = device_gate.current()
    assert not gate.active and gate.waited() == (0.0, 0)
    with gate.shared():
        gate.checkpoint()
        with gate.exclusive():
            pass
    assert gate.lend_shared() is None


def test_timed_work_runs_alone_and_shared_work_yields_at_its_next_checkpoint(tmp_path):
    directory, log = str(tmp_path / "gate"), tmp_path / "log"
    held, go = FORK.Event(), FORK.Event()
    readers = [_start(_shared_with_checkpoints, directory, 1.0, log, held)]
    assert held.wait(10)
    readers.append(_start(_shared_with_checkpoints, directory, 1.0, log, FORK.Event()))
    time.sleep(0.1)
    writer = _start(_exclusive_for, directory, 0.2, log, go)
    go.set()
    _join(writer, *readers)
    stamps = _stamps(log)
    t_in = next(t for w, _, t in stamps if w == "exclusive-in")
    t_out = next(t for w, _, t in stamps if w == "exclusive-out")
    # Both readers made calls before and after the timed block, none inside it.
    inside = [s for s in stamps if s[0].startswith("call") and t_in < s[2] < t_out]
    assert not inside, inside
    for r in readers:
        mine = [t for w, pid, t in stamps if pid == r.pid and w == "call-in"]
        assert any(t < t_in for t in mine) and any(t > t_out for t in mine)
    # Readers holding the gate in turn, with no gap between their holds, did not starve the
    # writer: it got in within a few calls of asking.
    assert t_in - min(t for w, _, t in stamps if w.startswith("call")) < 0.6


def _hold_exclusive_forever(directory: str, held: "multiprocessing.Event") -> None:
    gate = device_gate.Gate(directory)
    with gate.exclusive():
        held.set()
        time.sleep(60)


def test_a_killed_holder_frees_the_device(tmp_path):
    directory = str(tmp_path / "gate")
    held = FORK.Event()
    holder = _start(_hold_exclusive_forever, directory, held)
    assert held.wait(10)
    gate = device_gate.Gate(directory)
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    t0 = time.monotonic()
    with gate.exclusive():
        pass
    assert time.monotonic() - t0 < 5
    assert gate.waited()[1] <= 1


def _exclusive_when_told(directory: str, go: "multiprocessing.Event", log: Path) -> None:
    gate = device_gate.Gate(directory)
    go.wait(10)
    with gate.exclusive():
        _stamp(log, "exclusive-in")
    os._exit(0)


def test_a_lent_hold_keeps_timed_work_out_until_it_is_let_go(tmp_path):
    """The reaping of a killed accused outlasts its evaluation's hold: what it borrows keeps
    the device from another judge's timing until the accused is gone."""
    directory, log = str(tmp_path / "gate"), tmp_path / "log"
    gate = device_gate.Gate(directory)
    go = FORK.Event()
    writer = _start(_exclusive_when_told, directory, go, log)
    with gate.shared():
        release = gate.lend_shared()
    go.set()
    time.sleep(0.3)
    assert not log.exists(), "timed work began while a lent hold was out"
    _stamp(log, "released")
    release()
    release()  # once is enough
    _join(writer)
    assert [w for w, _, _ in _stamps(log)] == ["released", "exclusive-in"]


def test_a_checkpoint_waits_for_the_timing_and_counts_the_wait(tmp_path):
    directory, log = str(tmp_path / "gate"), tmp_path / "log"
    gate = device_gate.Gate(directory)
    go = FORK.Event()
    writer = _start(_exclusive_for, directory, 0.2, log, go)
    synced: list[float] = []
    clocked: list[str] = []
    clock = _clock(clocked)

    with gate.shared():
        go.set()
        time.sleep(0.1)  # the writer now holds `turn` and waits for this hold
        gate.checkpoint(lambda: synced.append(time.monotonic()), clock)
        assert gate.holding == "shared"
    _join(writer)
    t_in = next(t for w, _, t in _stamps(log) if w == "exclusive-in")
    # The judge's own device work was waited for before it let go, and the wait was clocked.
    assert synced and synced[0] < t_in
    assert clocked[-2:] == ["in", "out"]
    seconds, waits = gate.waited()
    assert waits >= 1 and seconds > 0.1
    # Nobody waiting: a checkpoint neither synchronizes nor waits.
    with gate.shared():
        gate.checkpoint(lambda: synced.append(0.0))
    assert len(synced) == 1


def test_exclusive_inside_shared_gives_the_hold_up_and_takes_it_again(tmp_path):
    directory = str(tmp_path / "gate")
    gate = device_gate.Gate(directory)
    other = device_gate.Gate(directory)  # another open: another holder, as another process
    with gate.shared():
        with gate.exclusive():
            assert gate.holding == "exclusive"
            with gate.shared(), gate.exclusive():  # nested blocks hold what the outer holds
                assert gate.holding == "exclusive"
        assert gate.holding == "shared"
        with other.shared():  # shared beside shared
            pass
    assert gate.holding is None
    with other.exclusive():
        pass


def test_the_watcher_stops_this_judges_spares_before_anything_is_timed(tmp_path, monkeypatch):
    directory, log = str(tmp_path / "gate"), tmp_path / "log"
    calls: list[tuple[str, str]] = []

    def pause(holder="timing"):
        calls.append(("pause", holder))
        time.sleep(0.05)  # stopping the spares takes a while: nobody may time meanwhile
        _stamp(log, "spares-stopped")

    monkeypatch.setattr(spare_accused, "pause", pause)
    monkeypatch.setattr(spare_accused, "resume",
                        lambda holder="timing": calls.append(("resume", holder)))
    monkeypatch.setenv(device_gate.ENV, directory)
    device_gate.watch()
    mine = device_gate.current()
    with mine.shared():  # shared work beside it stops nothing
        time.sleep(0.05)
    assert calls == []
    go = FORK.Event()
    writer = _start(_exclusive_for, directory, 0.3, log, go)
    go.set()
    _join(writer)
    deadline = time.monotonic() + 5
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [("pause", "gate"), ("resume", "gate")]
    order = [w for w, _, _ in _stamps(log)]
    assert order == ["spares-stopped", "exclusive-in", "exclusive-out"], order
    # This judge's own timing stops them too, and they go on after it.
    with mine.shared():
        with mine.exclusive():
            assert calls[-1] == ("pause", "gate")
        deadline = time.monotonic() + 5
        while calls[-1] != ("resume", "gate") and time.monotonic() < deadline:
            time.sleep(0.01)
    assert calls[-2:] == [("pause", "gate"), ("resume", "gate")]


def _evaluate_logging(directory: str, request: dict, log: str) -> None:
    """A judge's worker: one evaluation of `request` through the gate, with its timing stage
    and every correctness call stamped in `log`."""
    os.environ[device_gate.ENV] = directory
    device_gate.reset()
    from ksearch_harness import core, worker
    from ksearch_harness.protocol import parse_request

    timing, checked = core.Evaluation.timing, core.Evaluation._checked_call

    def stamped_timing(self):
        _stamp(Path(log), "timing-in")
        try:
            return timing(self)
        finally:
            _stamp(Path(log), "timing-out")

    def stamped_call(self, *args, **kwargs):
        _stamp(Path(log), "call-in")
        try:
            return checked(self, *args, **kwargs)
        finally:
            _stamp(Path(log), "call-out")

    core.Evaluation.timing = stamped_timing
    core.Evaluation._checked_call = stamped_call
    result = worker.execute(parse_request(request, "evaluate"))
    _stamp(Path(log), "status-" + result["status"])
    gate = (result.get("diagnostics") or {}).get("gate")
    _stamp(Path(log), "gate-" + json.dumps(gate))
    os._exit(0)


def test_two_judges_evaluate_side_by_side_and_time_alone(tmp_path):
    """Two evaluations of the softmax seed, each in a process of its own behind one gate: both
    pass, and no correctness call of one falls inside the other's timing stage."""
    directory, log = str(tmp_path / "gate"), str(tmp_path / "log")
    procs = []
    for k in range(2):
        req = driver.softmax_request(driver.HONEST / "naive.c", tmp_path / f"build{k}")
        procs.append(_start(_evaluate_logging, directory, req, log))
    _join(*procs)
    stamps = _stamps(Path(log))
    assert [w for w, _, _ in stamps if w.startswith("status")] == ["status-passed"] * 2
    gates = [json.loads(w[len("gate-"):]) for w, _, _ in stamps if w.startswith("gate-")]
    assert all(g is not None and g["waits"] >= 0 for g in gates)
    for p in procs:
        t_in = next(t for w, pid, t in stamps if pid == p.pid and w == "timing-in")
        t_out = next(t for w, pid, t in stamps if pid == p.pid and w == "timing-out")
        others = [(w, t) for w, pid, t in stamps if pid != p.pid and w.startswith("call")]
        assert others, "the other judge made correctness calls"
        inside = [s for s in others if t_in < s[1] < t_out]
        assert not inside, f"{len(inside)} calls of the other judge while {p.pid} timed"


def test_timed_calls_wait_for_other_processes_work_to_leave_the_device(tmp_path, monkeypatch):
    """Another judge's accused may have left kernels running when it was stopped: the timing
    judge probes until the device answers as an idle one does, for a bounded time."""

    class Adapter:
        def __init__(self, probes):
            self.probes = list(probes)

        def idle_probe_seconds(self):
            return self.probes.pop(0) if self.probes else 1e-5

    monkeypatch.setattr(device_gate, "IDLE_RETRY_S", 0.001)
    assert device_gate.wait_for_idle(Adapter([0.5])) == {}, "no gate, no wait"
    monkeypatch.setenv(device_gate.ENV, str(tmp_path / "gate"))
    device_gate.reset()
    clocked: list[str] = []
    clock = _clock(clocked)

    # The first probe warms up; then busy twice, then idle.
    got = device_gate.wait_for_idle(Adapter([0.5, 0.02, 0.01, 2e-5]), clock)
    assert got["busy_probes"] == 2 and not got["busy_when_timed"] and got["busy_wait_s"] > 0
    assert clocked == ["in", "out"]

    monkeypatch.setattr(device_gate, "IDLE_WAIT_S", 0.02)
    got = device_gate.wait_for_idle(Adapter([0.02] * 1000))  # busy for good: timed anyway
    assert got["busy_when_timed"] and got["busy_probes"] >= 2

    got = device_gate.wait_for_idle(Adapter([0.5]))  # idle once warm: no wait
    assert got == {"busy_probes": 0, "busy_wait_s": 0.0, "busy_when_timed": False}

    class Cpu:
        def idle_probe_seconds(self):
            return None

    assert device_gate.wait_for_idle(Cpu()) == {}


def test_a_lent_hold_goes_by_itself_after_its_limit(tmp_path):
    directory, log = str(tmp_path / "gate"), tmp_path / "log"
    gate = device_gate.Gate(directory)
    go = FORK.Event()
    writer = _start(_exclusive_when_told, directory, go, log)
    with gate.shared():
        gate.lend_shared(limit_s=0.3)  # a reaping that hangs, never released
    t0 = time.monotonic()
    go.set()
    _join(writer)
    t_in = next(t for w, _, t in _stamps(log) if w == "exclusive-in")
    assert 0.2 < t_in - t0 < 5


def test_after_its_timing_a_judge_is_back_to_shared_at_once_though_another_waits(tmp_path):
    directory, log = str(tmp_path / "gate"), tmp_path / "log"
    gate = device_gate.Gate(directory)
    go = FORK.Event()
    with gate.shared():
        with gate.exclusive():
            writer = _start(_exclusive_when_told, directory, go, log)
            go.set()
            time.sleep(0.2)  # the other judge now waits to time
        t0 = time.monotonic()
        assert gate.holding == "shared"
        _stamp(log, "shared-again")
    assert time.monotonic() - t0 < 0.1
    _join(writer)
    assert [w for w, _, _ in _stamps(log)] == ["shared-again", "exclusive-in"]
