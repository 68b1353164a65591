"""The end of an accused process, waited for after the evaluation that killed it (persistent
judge only).

An evaluation ends by killing its accused (SIGKILL through its sandbox) and removing its
working directory. The kill is immediate; the process being gone is not: a GPU accused
releases its device context first, and the launcher reaps it only then. A persistent judge
(worker.child_loop) does not hold the evaluation's result for that: the wait and the removal
of the directory run on a thread of their own (`later`), and `wait` joins them. It is called
before anything is timed (spare_accused.pause_also: a dying process is another process beside
the timed one) and before the judge exits, so nothing of a candidate outlives its judge and
none is still ending while a kernel is timed. A one-shot harness does it all at once, as
before.
"""

from __future__ import annotations

import threading
from typing import Callable

_deferring = False
_pending: list[threading.Thread] = []
_lock = threading.Lock()


def enable(on: bool = True) -> None:
    """Only a persistent judge defers (worker.child_loop); turning it off waits for what is
    pending."""
    global _deferring
    _deferring = on
    if not on:
        wait()


def later(finish: Callable[[], None]) -> None:
    """Runs `finish` (a wait for a killed process, then the removal of what it leaves) on a
    thread of its own when deferring, else now. Its exceptions are dropped: what it cleans up
    is the judge's to lose, not the evaluation's."""
    if not _deferring:
        _quietly(finish)
        return
    t = threading.Thread(target=_quietly, args=(finish,), name="ksearch-reap", daemon=True)
    with _lock:
        _pending[:] = [p for p in _pending if p.is_alive()]
        # Started before `wait` can see it: a thread not yet started cannot be joined.
        t.start()
        _pending.append(t)


def wait() -> None:
    """Returns once every `later` has finished."""
    while True:
        with _lock:
            if not _pending:
                return
            t = _pending.pop(0)
        t.join()


def pending() -> int:
    """How many are still running (for tests)."""
    with _lock:
        return sum(1 for p in _pending if p.is_alive())


def _quietly(finish: Callable[[], None]) -> None:
    try:
        finish()
    except Exception:  # noqa: BLE001 - a cleanup that fails must not end the judge
        pass
