"""The device gate: several judges of one device side by side, timed work alone.

A search may keep more than one persistent judge per device (lanes: crates/eval/src/judge.rs).
Their untimed work may overlap: while one judge checks a call's outputs on the host, another's
accused runs its call on the device, and the device does work it would otherwise wait for. Timed
work may not: while anything is timed (an evaluation's timing stage, a yardstick, a profile),
no other judge runs anything on the device and no accused starts up beside it. The gate keeps
that rule across the judges' processes with two flock(2) locks in a directory that the
evaluator makes for the device and names in `KSEARCH_HARNESS_DEVICE_GATE` (unset: one judge,
and the gate does nothing):

- `gate`: held shared by a judge's untimed work (`shared`: the whole of an evaluation but its
  timing stage), exclusively by timed work (`exclusive`);
- `turn`: held exclusively by a judge that times, from before it asks for `gate` until it is
  done. A shared holder passes `turn` before it takes `gate`, so a judge waiting to time is not
  starved by the others' shared holds: they let go at their next `checkpoint` (between
  correctness calls, before reference outputs) and wait there until the timing is over.

A judge's worker that has the gate also watches it (`_Watcher`, a thread that holds `gate`
shared while this judge's spare accused processes, and what waits with them, may run): when a
judge waits to time, it stops them (spare_accused.pause) before it lets the gate go, and lets
them go on once the timing is over. The timing judge then waits (`wait_for_idle`, bounded)
until its own probe says no other process's kernels still run on the device.

Locks die with their holder: a judge killed on a time-out or a crash frees the device. The
directory is the evaluator's own (mode 0700, outside every sandbox's readable paths) and the
variable is not in what an accused inherits (accused_client._PASSED); the lock files are opened
close-on-exec. A candidate that reached them anyway could hold the device up, never make its own
calls faster. How long an evaluation waited at the gate is its `gate` phase, and in its
diagnostics (`gate`).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterator

ENV = "KSEARCH_HARNESS_DEVICE_GATE"
# How often a judge's watcher looks whether a judge waits to time (seconds): that judge waits
# about this long, at most, for this judge's spares to be stopped.
WATCH_S = 0.002
# How long a hold lent for a killed accused's reaping may last (seconds).
LEND_LIMIT_S = 30.0
# The idle probe (wait_for_idle): the device counts as idle when the judge's own tiny piece of
# work comes back within IDLE_PROBE_S; otherwise another process's kernels still run there (an
# accused of another judge, stopped with kernels queued), and the judge waits IDLE_RETRY_S and
# probes again, for at most IDLE_WAIT_S before it times anyway.
IDLE_PROBE_S = 0.001
IDLE_RETRY_S = 0.005
IDLE_WAIT_S = 2.0


Waiting = Callable[[], ContextManager[Any]]


def _no_clock() -> ContextManager[Any]:
    return nullcontext()


class Gate:
    """The gate of one device, as this process holds it. Used by one thread, the judge's main
    thread (the watcher, and a hold lent for a reaping, open the files for themselves).
    `waiting` (a context manager factory) is entered around every wait, so an evaluation's
    phase clock can count the waits as a phase of their own."""

    active = True

    def __init__(self, directory: str):
        self.directory = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._gate = _open(directory, "gate")
        self._turn = _open(directory, "turn")
        self.holding: str | None = None  # None, "shared" or "exclusive"
        self._waited_s = 0.0
        self._waits = 0

    def waited(self) -> tuple[float, int]:
        """Seconds this process has waited at the gate, and how many times."""
        return self._waited_s, self._waits

    def _lock(self, fd: int, how: int, waiting: Waiting) -> None:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
        t0 = time.perf_counter()
        with waiting():
            fcntl.flock(fd, how)
        self._waited_s += time.perf_counter() - t0
        self._waits += 1

    def _take_shared(self, waiting: Waiting) -> None:
        self._lock(self._turn, fcntl.LOCK_SH, waiting)
        try:
            self._lock(self._gate, fcntl.LOCK_SH, waiting)
        finally:
            fcntl.flock(self._turn, fcntl.LOCK_UN)
        self.holding = "shared"

    def _release(self) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_UN)
        if self.holding == "exclusive":
            fcntl.flock(self._turn, fcntl.LOCK_UN)
        self.holding = None

    @contextmanager
    def shared(self, waiting: Waiting = _no_clock) -> Iterator[None]:
        """Untimed device work, beside other judges' untimed work. Nested in `shared` or
        `exclusive`, it holds what the outer block holds."""
        if self.holding is not None:
            yield
            return
        self._take_shared(waiting)
        try:
            yield
        finally:
            if self.holding is not None:
                self._release()

    @contextmanager
    def exclusive(self, waiting: Waiting = _no_clock) -> Iterator[None]:
        """Timed work: nothing of another judge's runs on the device until the block ends. A
        shared hold of this process is given up for the block and taken again after it."""
        outer = self.holding
        if outer == "exclusive":
            yield
            return
        if outer == "shared":
            self._release()
        self._lock(self._turn, fcntl.LOCK_EX, waiting)
        try:
            self._lock(self._gate, fcntl.LOCK_EX, waiting)
        except BaseException:
            fcntl.flock(self._turn, fcntl.LOCK_UN)
            raise
        self.holding = "exclusive"
        try:
            yield
        finally:
            if outer == "shared":
                # Back to shared without waiting: while this process holds `turn`, no other
                # judge can ask for `gate` exclusively, so the conversion cannot be overtaken.
                fcntl.flock(self._gate, fcntl.LOCK_SH)
                fcntl.flock(self._turn, fcntl.LOCK_UN)
                self.holding = "shared"
            else:
                self._release()

    def checkpoint(self, before_release: Callable[[], None] | None = None,
                   waiting: Waiting = _no_clock) -> None:
        """Inside `shared`: lets a judge that waits to time go first (`before_release`, then
        the shared hold given up, the timing waited out, the hold taken again); nothing when
        none waits."""
        if self.holding != "shared" or not self.timer_waiting():
            return
        if before_release is not None:
            before_release()
        self._release()
        self._take_shared(waiting)

    def timer_waiting(self) -> bool:
        """Whether a judge (this process's main thread included) waits to time or times."""
        try:
            fcntl.flock(self._turn, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return True
            raise
        fcntl.flock(self._turn, fcntl.LOCK_UN)
        return False

    def lend_shared(self, limit_s: float = LEND_LIMIT_S) -> Callable[[], None]:
        """Inside `shared`: a second shared hold, for work that outlasts the block in another
        thread (the reaping of a killed accused); the function returned lets it go (once), and
        it goes by itself after `limit_s`, so that work which hangs cannot hold every judge of
        the device up."""
        fd = _open(self.directory, "gate")
        # Granted at once: this process holds the gate shared, so nobody holds it exclusively.
        fcntl.flock(fd, fcntl.LOCK_SH)
        lock = threading.Lock()
        held = [True]

        def release() -> None:
            with lock:
                if held[0]:
                    held[0] = False
                    os.close(fd)  # the lock goes with the descriptor
        timer = threading.Timer(limit_s, release)
        timer.daemon = True
        timer.start()
        return release

    def close(self) -> None:
        for fd in (self._gate, self._turn):
            try:
                os.close(fd)
            except OSError:
                pass
        self.holding = None


class _Open:
    """No gate (`KSEARCH_HARNESS_DEVICE_GATE` unset): one judge per device, nothing to wait for."""

    holding = None
    active = False

    def waited(self) -> tuple[float, int]:
        return 0.0, 0

    @contextmanager
    def shared(self, waiting: Waiting = _no_clock) -> Iterator[None]:
        yield

    @contextmanager
    def exclusive(self, waiting: Waiting = _no_clock) -> Iterator[None]:
        yield

    def checkpoint(self, before_release: Callable[[], None] | None = None,
                   waiting: Waiting = _no_clock) -> None:
        pass

    def lend_shared(self) -> Callable[[], None] | None:
        return None

    def close(self) -> None:
        pass


def _open(directory: str, name: str) -> int:
    return os.open(os.path.join(directory, name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


class _Watcher:
    """Holds the gate shared while this judge's spare accused processes (and what waits with
    them, spare_accused.pause_also) may run, so nothing is timed before they are stopped: when
    a judge waits to time (`turn` held, this judge's own timing included), the watcher stops
    them, lets the gate go, waits for that timing to end (blocked, no polling meanwhile), takes
    the gate again and lets them go on."""

    def __init__(self, directory: str):
        self._hold = Gate(directory)  # files of its own: a holder apart from the main thread
        self._stop = threading.Event()
        self.pausing = False
        self._thread = threading.Thread(target=self._run, name="device-gate-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from . import spare_accused
        try:
            self._hold._take_shared(_no_clock)
            while not self._stop.wait(WATCH_S):
                if not self._hold.timer_waiting():
                    continue
                spare_accused.pause("gate")
                self.pausing = True
                self._hold._release()
                self._hold._take_shared(_no_clock)
                spare_accused.resume("gate")
                self.pausing = False
        finally:
            if self.pausing:
                spare_accused.resume("gate")
                self.pausing = False
            self._hold.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)


_current: Gate | _Open | None = None
_watcher: _Watcher | None = None


def current() -> Gate | _Open:
    """This process's gate: the one `KSEARCH_HARNESS_DEVICE_GATE` names, else one that does
    nothing."""
    global _current
    if _current is None:
        where = os.environ.get(ENV, "").strip()
        _current = Gate(where) if where else _Open()
    return _current


def alone(measure: Callable[[], Any]) -> Callable[[], Any]:
    """`measure` run with the gate held exclusively (a measurement of the device itself, such
    as its roofline, which other judges' work would disturb)."""
    def run() -> Any:
        with current().exclusive():
            return measure()
    return run


def wait_for_idle(adapter: Any, waiting: Waiting = _no_clock) -> dict[str, Any]:
    """With other judges on the device, timed work begins once nothing of another process
    runs there: the gate stops the other judges, but kernels an accused of theirs queued before
    it was stopped may still run, and would be timed with this judge's calls (time slices).
    Probes (Adapter.idle_probe_seconds; the first probe only warms the probe up) until the
    device answers as an idle one does, for at most IDLE_WAIT_S; returns what it waited, and
    whether the device was still busy when it gave up (`busy_when_timed`). Nothing without a
    gate, or where the adapter cannot tell (None)."""
    if not current().active or adapter.idle_probe_seconds() is None:
        return {}
    t0 = time.perf_counter()
    probes, probe = 0, adapter.idle_probe_seconds()
    with waiting():
        while probe is not None and probe > IDLE_PROBE_S:
            probes += 1
            if time.perf_counter() - t0 > IDLE_WAIT_S:
                print(f"harness: the device stayed busy with other work for "
                      f"{time.perf_counter() - t0:.2f} s before the timed calls (idle probe "
                      f"{probe * 1e3:.2f} ms); timed anyway", file=sys.stderr)
                break
            time.sleep(IDLE_RETRY_S)
            probe = adapter.idle_probe_seconds()
    return {"busy_probes": probes,
            "busy_wait_s": round(time.perf_counter() - t0, 6) if probes else 0.0,
            "busy_when_timed": probe is not None and probe > IDLE_PROBE_S}


def watch() -> None:
    """A persistent judge's worker: starts the watcher for its spares (once; nothing without
    a gate)."""
    global _watcher
    gate = current()
    if _watcher is None and isinstance(gate, Gate):
        _watcher = _Watcher(gate.directory)


def reset() -> None:
    """Forgets the gate and stops the watcher (tests; a forked worker starts afresh)."""
    global _current, _watcher
    if _watcher is not None:
        _watcher.close()
        _watcher = None
    if _current is not None:
        _current.close()
        _current = None
