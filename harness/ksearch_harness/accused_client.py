"""The judge's handle on an accused process (accused.py): starting it in the sandbox, freezing
it between commands, timing its calls with the judge's own clock, and watching what it does
after a call returns.

The accused is stopped (SIGSTOP) except while it runs a command, so no thread of the candidate
can compute ahead on inputs the judge is writing, spin while the judge times the baseline, or
write outputs after the judge has read them. A call is timed twice: by the accused, around the
call itself (its clock or CUDA events), and by the judge, from before it continues the accused
to the arrival of the reply (the window). The accused's figure counts only as far as the window
allows: a reported time shorter than the window minus what a round trip costs (calibrated with
empty timed calls when the accused starts) is replaced by that bound, and a candidate whose
reports fall short systematically is rejected (`timer_tampering`). After each call the judge
watches the accused's threads for a settle window: CPU time spent there (`lingering_work`) or a
child process is a verdict; an idle thread pool is not.

Everything the accused says is a claim. Frames that break the protocol, replies to the wrong
command, and a process that dies or hangs become verdicts of their own, never a crash of the
judge.
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import channel, sandbox
from .arena import Arena, Layout, Placement
from .machine import (allowed_cpus, child_pids, physical_memory, process_cpu_ns,
                      thread_states)
from .protocol import (BuildError, CandidateRuntimeError, HarnessError, Incorrect, TaskError,
                       TensorSpec, Violation)

# Empty timed calls measured when the accused starts, to learn what a round trip costs; one more
# precedes every timed call, so the estimate follows the machine's load.
CALIBRATION_CALLS = 24
# The bound on a reported time uses the round trips measured most recently.
RECENT_ROUND_TRIPS = 32
# A reply to a command other than a call must come within this (or the evaluation's deadline).
COMMAND_TIMEOUT_S = 120.0
# How long to wait for every thread of the accused to reach the stopped state.
STOP_WAIT_S = 1.0
# Lingering work: CPU time the accused's threads use within the settle window after a call
# returned, beyond this share of the window, in at least LINGER_MIN_CALLS calls and at least
# LINGER_FRACTION of the calls watched so far. The accused's interpreter does a little work
# after its reply (it returns to its receive loop), so one call is no verdict; work that helps
# the timed calls' median has to linger after a good part of them, and one that lingers after
# every call is caught at its second. CPU time is read from the process's CPU clock
# (machine.process_cpu_ns), which is exact for a thread that is running when it is read.
LINGER_SHARE = 0.25
LINGER_MIN_CALLS = 2
LINGER_FRACTION = 0.25
# The timer check: a timed call whose window exceeds the accused's own figure by more than the
# recent round trips' 95th percentile plus this slack counts the window's bound instead; see
# `report_shortfall` for when the accused is named.
TIMER_SLACK_NS = 2_000
TAMPER_MARGIN_NS = 250_000
TAMPER_SPREAD_FACTOR = 2.0
TAMPER_ROUND_TRIP_QUANTILE = 90
TAMPER_MIN_CALLS = 5


@dataclass(frozen=True)
class Shortfall:
    """How far a workload's timed calls fall short of their windows beyond a round trip."""

    by_ns: float  # lower quartile of (window - report), less a typical round trip
    round_trip_ns: float  # the typical round trip: the TAMPER_ROUND_TRIP_QUANTILE
    spread_ns: float  # the round trips' interquartile range
    calls: int

    @property
    def allowed_ns(self) -> float:
        return max(TAMPER_MARGIN_NS, TAMPER_SPREAD_FACTOR * self.spread_ns)

    @property
    def suspect(self) -> bool:
        return self.calls >= TAMPER_MIN_CALLS and self.by_ns > self.allowed_ns


def report_shortfall(excess_ns: list[int], trips_ns: list[int]) -> Shortfall:
    """What each timed call's window holds beyond the accused's report (`excess_ns`) against
    what empty calls through the same path cost (`trips_ns`). An honest call's excess is a
    round trip, drawn from the same distribution; a tampered clock adds to nearly every call's.
    So the calls' lower quartile is compared with the round trips' upper tail, as two samples
    rather than pair by pair: on a virtual machine a round trip takes anywhere from half a
    millisecond to several, independently from one to the next, so a call's excess less the
    round trip just before it is as wide as both together."""
    trips = trips_ns or [0]
    typical = float(np.percentile(trips, TAMPER_ROUND_TRIP_QUANTILE))
    q1, q3 = np.percentile(trips, [25, 75])
    by = float(np.percentile(excess_ns, 25)) - typical if excess_ns else 0.0
    return Shortfall(by, typical, float(q3 - q1), len(excess_ns))


class CandidateTimeout(HarnessError):
    status = "timeout"


class SandboxRequired(TaskError):
    """`--sandbox require` and a layer this machine does not offer."""

    def __init__(self, why: str):
        super().__init__(f"--sandbox require: the candidate cannot be confined here: {why}")


@dataclass
class Handshake:
    """What an empty timed call costs, seen from the judge: window - reported time."""

    samples_ns: list[int] = field(default_factory=list)

    def recent(self, n: int = RECENT_ROUND_TRIPS) -> "Handshake":
        return Handshake(self.samples_ns[-n:])

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples_ns)) if self.samples_ns else 0.0

    @property
    def p95(self) -> float:
        if not self.samples_ns:
            return 0.0
        s = sorted(self.samples_ns)
        return float(s[min(len(s) - 1, int(round(0.95 * (len(s) - 1))))])

    @property
    def spread(self) -> float:
        """Interquartile range: how much round trips vary, unmoved by a rare slow one."""
        if len(self.samples_ns) < 4:
            return 0.0
        q = statistics.quantiles(self.samples_ns, n=4)
        return float(q[2] - q[0])

    def to_json(self) -> dict[str, Any]:
        return {"calls": len(self.samples_ns), "median_ns": self.median, "p95_ns": self.p95,
                "min_ns": min(self.samples_ns) if self.samples_ns else None}


@dataclass
class TimedCall:
    counted_ns: int  # the duration that counts
    reported_ns: int  # what the accused said
    window_ns: int  # the judge's clock around the round trip
    # What the accused says its figure was made of (cuda: `device_ns`, the events' time, and
    # `host_ns`, the call's own host time; the figure is the longer); the judge charges the
    # candidate from them (adapters.charged_ns).
    parts: dict[str, int] | None = None
    # The judge's window bound (the window less a recent round trip): no less is charged.
    floor_ns: int = 0

    def charged(self, anchor: dict[str, int] | None) -> int:
        """What counts, given the anchor's parts in the same repetition (adapters.charged_ns);
        `counted_ns` where the parts or the anchor's are missing."""
        from .adapters import charged_ns
        ns = charged_ns(self.parts, anchor, self.floor_ns)
        return self.counted_ns if ns is None else min(ns, max(self.window_ns, 1))


def lingered_enough(lingering: int, watched: int) -> bool:
    """Whether `lingering` of the `watched` calls so far make a lingering_work verdict."""
    return lingering >= max(LINGER_MIN_CALLS, LINGER_FRACTION * watched)


@dataclass
class Linger:
    cpu_ns: int
    window_ns: int
    children: list[int]
    # The window asked for, where the judge worked inside it (settle's `during`): if that
    # work made the window longer, the CPU time of the whole window is still held against a
    # share of the window asked for, so the judge's work never makes the check more lenient.
    asked_ns: int | None = None

    @property
    def lingering(self) -> bool:
        judged = self.window_ns if self.asked_ns is None else min(self.window_ns, self.asked_ns)
        return self.cpu_ns > LINGER_SHARE * judged


def start_seconds(launched_at: float, marks: Any, waited: float) -> dict[str, float]:
    """Where an accused's start-up went, from the steps' end times its ready message carries
    (accused.START_MARKS, on the judge's monotonic clock): `main` from the launch (the sandbox,
    the interpreter, the harness's modules), then each step from the one before; `waited`, how
    long the judge blocked for the ready message. Marks that are not (name, time) pairs in
    order are left out: the figures are diagnostics, never trusted."""
    out: dict[str, float] = {}
    before = launched_at
    for mark in marks if isinstance(marks, list) else []:
        if not (isinstance(mark, (list, tuple)) and len(mark) == 2
                and isinstance(mark[0], str) and isinstance(mark[1], (int, float))):
            continue
        name, at = mark[0][:20], float(mark[1])
        if at < before or name in out:
            continue
        out[name] = round(at - before, 4)
        before = at
    out["waited"] = round(max(waited, 0.0), 4)
    return out


class AccusedProcess:
    """One accused process. Not thread-safe; the judge drives it from one thread."""

    def __init__(self, backend: str, *, workdir: str, log_fd: int, deadline: float,
                 python: str | None = None, sandbox_mode: str = "best-effort",
                 readable_extra: tuple[str, ...] = (), arena_bytes: int = 0,
                 cpu_seconds: int | None = None, module: str = "ksearch_harness.accused",
                 extra_args: tuple[str, ...] = ()):
        self.backend = backend
        self.deadline = deadline
        self.seq = 0
        self.last_op = ""
        self.dead: str | None = None
        self.stopped = False
        self.layers: list[dict[str, Any]] = []
        self.handshake = Handshake()
        self.linger_calls = 0
        self.settled_calls = 0
        self._launcher: Any = None
        judge_end, accused_end = channel.pair()
        self.sock = judge_end
        argv = [python or sys.executable, "-m", module,
                "--channel-fd", str(accused_end.fileno()), "--backend", backend, *extra_args]
        env = accused_environment(workdir, backend)
        self.launched_at = time.monotonic()
        # Where the start-up's seconds went (`start_seconds`), once it is ready.
        self.start_seconds: dict[str, float] = {}
        self.cores: int | None = None
        try:
            policy = accused_policy(backend, workdir, sandbox_mode, readable_extra,
                                    arena_bytes, cpu_seconds)
            self.pid = self._launch(argv, env, accused_end.fileno(), log_fd, policy)
        finally:
            accused_end.close()
        self.ready = False
        self.kernel_audit: dict[str, Any] = {"active": False, "detail": ""}
        # mlx: whether the accused can stage arrays in shared device memory (accused.py).
        self.stages_on_device = False

    def wait_ready(self) -> None:
        """Waits for the accused to finish starting (imports, device, lock-down), which it
        does while the judge builds the candidate, then stops it."""
        if self.ready:
            return
        waited_from = time.monotonic()
        ready = self._reply(0, min(self.deadline, time.monotonic() + COMMAND_TIMEOUT_S))
        self.start_seconds = start_seconds(self.launched_at, ready.get("start_marks"),
                                           time.monotonic() - waited_from)
        if not ready.get("ok"):
            self.kill()
            raise TaskError(f"the accused process could not start: {ready.get('message')}")
        audit = ready.get("kernel_audit")
        self.kernel_audit = ({"active": bool(audit.get("active")),
                              "detail": str(audit.get("detail", ""))[:300]}
                             if isinstance(audit, dict) else {"active": False, "detail": ""})
        self.stages_on_device = bool(ready.get("stages_on_device"))
        lock = ready.get("lockdown")
        if isinstance(lock, dict):
            self.layers.append({"name": str(lock.get("name", "seccomp_lockdown")),
                                "active": bool(lock.get("active")),
                                "detail": str(lock.get("detail", ""))[:500]})
        # Read by the judge, not reported by the accused: the cores the accused's main thread
        # may run on once it has started (a runtime that binds threads at load, as OpenMP
        # under OMP_PROC_BIND does, shows here; docs/results/evaluation-speed).
        self.cores = allowed_cpus(self.pid)
        self.ready = True
        self.stop()

    # -- launching -----------------------------------------------------------------------

    def _launch(self, argv: list[str], env: dict[str, str], fd: int, log_fd: int,
                policy: Any) -> int:
        try:
            self._launcher = sandbox.launch(argv, policy, env=env, pass_fds=(fd,),
                                            stdout=log_fd, stderr=log_fd, cwd=policy.workdir)
        except sandbox.SandboxUnavailable as e:
            raise SandboxRequired(str(e)) from None
        self.layers = [x.to_json() for x in self._launcher.report]
        return int(self._launcher.pid)

    # -- process control -----------------------------------------------------------------

    def stop(self) -> None:
        """SIGSTOP, then wait until every thread has stopped."""
        if self.dead or self.stopped:
            return
        try:
            os.kill(self.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.stopped = True
        end = time.monotonic() + STOP_WAIT_S
        while time.monotonic() < end:
            states = thread_states(self.pid)
            if not states or all(s in "Tt" for s, _ in states.values()) or any(
                    s in "ZX" for s, _ in states.values()):
                return
            time.sleep(0.0002)

    def cont(self) -> None:
        if self.dead or not self.stopped:
            return
        try:
            os.kill(self.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        self.stopped = False

    def kill(self) -> None:
        """SIGKILL; the sandbox takes everything the accused started with it."""
        self.kill_now()()

    def kill_now(self) -> Callable[[], None]:
        """SIGKILL, without waiting for the process to be gone: returns that wait (and the
        removal of its sandbox's cgroups), which `kill` does at once. A killed accused runs no
        more of its code; a GPU one may take a while to release its device context."""
        launcher = self._launcher
        if launcher is not None:
            launcher.send_kill()
        try:
            self.sock.close()
        except OSError:
            pass
        self.dead = self.dead or "killed by the judge"
        return launcher.kill if launcher is not None else _nothing

    def close(self) -> None:
        self.close_now()()

    def close_now(self) -> Callable[[], None]:
        """Asks the accused to exit, then `kill_now`: returns the wait for it to be gone."""
        if not self.dead:
            try:
                self.rpc("exit", timeout_s=5.0)
            except HarnessError:
                pass
        return self.kill_now()

    def exit_description(self) -> str:
        """How the accused ended, when it did (for messages)."""
        if self._launcher is None:
            return "unknown"
        try:
            code = self._launcher.wait(1.0)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: still running
            return "it is still running"
        if code < 0:
            return f"killed by {_signal_name(-code)}"
        return f"exit status {code}"

    # -- commands ------------------------------------------------------------------------

    def rpc(self, op: str, *, fds: tuple[int, ...] = (), timeout_s: float = COMMAND_TIMEOUT_S,
            keep_running: bool = False, **fields: Any) -> dict[str, Any]:
        deadline = min(self.deadline, time.monotonic() + timeout_s)
        seq = self._send(op, fields, fds)
        try:
            return self._checked(self._reply(seq, deadline))
        finally:
            if not keep_running:
                self.stop()

    def _send(self, op: str, fields: dict[str, Any], fds: tuple[int, ...] = ()) -> int:
        if self.dead:
            raise CandidateRuntimeError(self.dead)
        self.wait_ready()
        self.seq += 1
        self.cont()
        try:
            channel.send(self.sock, {"seq": self.seq, "op": op, **fields}, fds)
        except OSError:
            self._died()
        return self.seq

    def _reply(self, seq: int, deadline: float) -> dict[str, Any]:
        try:
            reply = channel.recv(self.sock, deadline)
        except channel.AccusedTimeout:
            self.kill()
            self.dead = "the candidate did not answer in time"
            raise CandidateTimeout("the candidate's process did not answer within the "
                                   "evaluation's time limit; it was killed") from None
        except channel.AccusedProtocolError as e:
            self._died(str(e))
        if reply.get("seq") != seq:
            self.kill()
            self.dead = "protocol broken"
            raise Violation("result_channel", f"the candidate's process answered a command it "
                            f"was not given (seq {reply.get('seq')!r}, expected {seq}): "
                            f"something other than the harness wrote to its channel")
        return reply

    def _died(self, why: str = "") -> None:
        # The channel closed or broke: the process crashed, exited, or broke the framing.
        time.sleep(0.05)
        alive = self._alive()
        self.kill()
        if alive:
            self.dead = "protocol broken"
            raise Violation("result_channel", f"the candidate's process broke its channel "
                            f"({why}): something other than the harness wrote to it")
        self.dead = f"the candidate's process ended ({self.exit_description()})"
        raise CandidateRuntimeError(f"{self.dead} while running a command; the candidate "
                                    f"crashed or exited (see log_tail)")

    def _alive(self) -> bool:
        states = thread_states(self.pid)
        return bool(states) and not all(s in "ZX" for s, _ in states.values())

    @staticmethod
    def _checked(reply: dict[str, Any]) -> dict[str, Any]:
        if reply.get("ok") is True:
            return reply
        message = str(reply.get("message", "the candidate's process reported a failure"))
        error = reply.get("error")
        if error == "build":
            raise BuildError(message)
        if error == "incorrect":
            raise Incorrect(message)
        if error == "violation":
            cls = reply.get("class")
            from .protocol import VIOLATION_CLASSES
            if cls in VIOLATION_CLASSES:
                raise Violation(str(cls), message)
            raise CandidateRuntimeError(message)
        if error == "task":
            raise TaskError(message)
        raise CandidateRuntimeError(message)

    # -- calls ---------------------------------------------------------------------------

    def calibrate(self, calls: int = CALIBRATION_CALLS) -> Handshake:
        """Empty timed calls through the same path as a timed candidate call."""
        for _ in range(calls):
            self.round_trip()
        return self.handshake

    def round_trip(self) -> int:
        """One empty timed call: what a round trip costs right now (window - reported)."""
        t = self.timed("noop")
        self.stop()
        sample = max(0, t.window_ns - t.reported_ns)
        self.handshake.samples_ns.append(sample)
        return sample

    def timed(self, op: str, **fields: Any) -> TimedCall:
        """One timed command; the accused keeps running afterwards (settle() stops it)."""
        deadline = self.deadline
        if self.dead:
            raise CandidateRuntimeError(self.dead)
        self.wait_ready()
        self.seq += 1
        seq = self.seq
        self.last_op = op
        message = {"seq": seq, "op": op, "timed": True, **fields}
        t0 = time.perf_counter_ns()
        self.cont()  # after t0: whatever runs from here on is inside the window
        try:
            channel.send(self.sock, message)
        except OSError:
            self._died()
        reply = self._reply(seq, deadline)
        t1 = time.perf_counter_ns()
        self._checked(reply)
        window = t1 - t0
        reported = reply.get("ns", 0)
        if not isinstance(reported, int) or isinstance(reported, bool):
            self.kill()
            raise Violation("result_channel", "the candidate's process answered a timed call "
                            "without a duration")
        counted, floor = reported, 0
        if op != "noop" and self.handshake.samples_ns:
            # The accused's figure cannot be shorter than what the judge saw minus what a
            # round trip costs, nor longer than the window itself.
            recent = self.handshake.recent()
            floor = min(max(window - int(recent.p95) - TIMER_SLACK_NS, 0), window)
            counted = max(reported, floor)
        counted = min(counted, window)
        parts = reply.get("parts")
        if not (isinstance(parts, dict) and len(parts) <= 4
                and all(isinstance(k, str) and type(v) is int for k, v in parts.items())):
            parts = None
        return TimedCall(counted_ns=max(counted, 1), reported_ns=reported, window_ns=window,
                         parts=parts, floor_ns=floor)

    def call(self, slot: int, heap_byte: int, audit: bool = False) -> dict[str, Any]:
        """One untimed call; the accused keeps running afterwards (settle() stops it). With
        `audit`, the reply lists the GPU kernels that ran (accused.KernelAudit)."""
        seq = self._send("call", {"slot": slot, "heap_byte": heap_byte, "timed": False,
                                  "audit": audit})
        return self._checked(self._reply(seq, self.deadline))

    def settle(self, seconds: float, during: Callable[[], None] | None = None) -> Linger:
        """Watches the accused for `seconds` after a call returned, then stops it. CPU time
        its threads spend meanwhile, or a child process, is counted; see `linger_verdict`.
        `during` is the judge's own work done inside the window (the window lasts at least
        `seconds`, longer if that work does); the accused is stopped even if it raises."""
        before = process_cpu_ns(self.pid)
        t0 = time.perf_counter_ns()
        try:
            if during is not None:
                during()
            left = seconds - (time.perf_counter_ns() - t0) / 1e9
            if left > 0:
                time.sleep(left)
            after = process_cpu_ns(self.pid)
            window = time.perf_counter_ns() - t0
            children = child_pids(self.pid)
        finally:
            self.stop()
        cpu = max(0, after - before) if before is not None and after is not None else 0
        linger = Linger(cpu, window, children,
                        int(seconds * 1e9) if during is not None else None)
        self.settled_calls += 1
        if linger.lingering:
            self.linger_calls += 1
        return linger

    def linger_verdict(self, linger: Linger, where: str) -> None:
        if linger.children:
            raise Violation("lingering_work", f"{where}: the candidate left {len(linger.children)} "
                            f"child process(es) running after the call returned")
        if linger.lingering and lingered_enough(self.linger_calls, self.settled_calls):
            raise Violation("lingering_work", f"{where}: the candidate's threads used "
                            f"{linger.cpu_ns / 1e6:.2f} ms of CPU within "
                            f"{linger.window_ns / 1e6:.2f} ms after the call returned (in "
                            f"{self.linger_calls} of {self.settled_calls} calls): work must be "
                            f"finished when the entry point returns, and idle threads must "
                            f"sleep")

    def threads(self) -> dict[int, tuple[str, int]]:
        return thread_states(self.pid)


# -- the Adapter face --------------------------------------------------------------------------


class RemoteBuffer:
    """A tensor of the accused: its arena view and where it lives in the accused. With shared
    device memory (device_share) also either `dev`, the judge's own view of the accused's
    device tensor (its storage bits, cuda), which the judge writes and reads without the
    arena; or `staging` (mlx on an NVIDIA GPU), a shared device buffer the accused copies the
    tensor in from and out to on the device, as it copies through the arena otherwise: the
    candidate's arrays are MLX's own, which no other process can map."""

    def __init__(self, spec: TensorSpec, view: Any, slot: int, role: str, dev: Any = None):
        self.spec, self.view, self.slot, self.role = spec, view, slot, role
        self.dev = dev
        self.staging: Any = None


class RemoteCall:
    """`bench.fn` of core.py for a remote candidate."""

    def __init__(self, owner: "AccusedAdapter", slot: int):
        self.owner, self.slot = owner, slot
        self.ksearch_candidate = True

    def __call__(self, heap_byte: int = 0, audit: bool = False) -> dict[str, Any]:
        return self.owner.process.call(self.slot, heap_byte, audit)


class AccusedAdapter:
    """The candidate's side of core.py's adapter interface, carried out by an accused process.

    Buffers live in one shared arena per workload slot; on the cpu backend the candidate works
    on them directly, so uploads and reads are the judge's own memory accesses. On GPU backends
    an upload is also a copy to the device (`h2d`) and a read first a copy back (`d2h`), unless
    the judge shares the slot's device memory with the accused (`share_device`):
    - cuda: the candidate's buffers are that memory; the judge copies between its host arrays
      and the shared device tensors itself, and can check them on the device (`device_view`);
    - mlx (on an NVIDIA GPU): the memory stages each tensor (`RemoteBuffer.staging`); the
      judge writes an input there and the accused copies it into a new MLX array on the device
      (`h2d` with `staged`), and the accused copies an output there for the judge to read or
      compare on the device (`d2h` with `staged`, `device_outputs`). No host copy either way,
      nor the page migrations of MLX's managed memory that host copies cost."""

    def __init__(self, process: AccusedProcess, backend: str, arena_bytes: int,
                 share_device: bool = False):
        self.process = process
        self.backend = backend
        self.on_device = backend != "cpu"
        self.share_device = share_device and backend in ("cuda", "mlx")
        self.staged = self.share_device and backend == "mlx"
        self.arena = Arena(arena_bytes)
        self.layout = Layout()
        self.slots = 0
        self.shared: list[Any] = []  # device_share.Mapping per slot, kept while slots live
        process.rpc("arena", fds=(self.arena.fd,), size=self.arena.size)

    def load(self, artifact: str, entry: Any, request: Any) -> None:
        from .protocol import jsonable
        workloads = request.raw.get("workloads") if request.raw else None
        self.process.rpc("load", artifact=artifact,
                         entry={"symbol": entry.symbol, "args": list(entry.args)},
                         workloads=workloads or [], backend=self.backend,
                         timing=jsonable(request.raw.get("timing") or {}),
                         timeout_s=request.timeout_s)

    def bench(self, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
              params: dict[str, Any]) -> tuple[dict[str, RemoteBuffer], dict[str, RemoteBuffer],
                                               RemoteCall]:
        import numpy as np
        from . import dtypes
        slot = self.slots
        self.slots += 1
        tensors = []
        made: dict[str, RemoteBuffer] = {}
        device = Layout() if self.share_device else None
        for role, specs in (("input", inputs), ("output", outputs)):
            for s in specs:
                storage = dtypes.get(s.dtype).storage
                count = int(np.prod(s.shape, dtype=np.int64))
                place = self._place(count * storage.itemsize)
                view = np.frombuffer(self.arena.map, dtype=storage, count=count,
                                     offset=place.offset).reshape(s.shape)
                made[s.name] = RemoteBuffer(s, view, slot, role)
                t = {"name": s.name, "role": role, "dtype": s.dtype, "shape": list(s.shape),
                     "offset": place.offset, "nbytes": place.nbytes}
                if device is not None:
                    t["device_offset"] = device.place(place.nbytes).offset
                tensors.append(t)
        if device is None:
            self.process.rpc("alloc", slot=slot, params=params, tensors=tensors)
        else:
            self._alloc_shared(slot, params, tensors, made, max(device.size, 1))
        ins = {s.name: made[s.name] for s in inputs}
        outs = {s.name: made[s.name] for s in outputs}
        return ins, outs, RemoteCall(self, slot)

    def _alloc_shared(self, slot: int, params: dict[str, Any], tensors: list[dict[str, Any]],
                      made: dict[str, RemoteBuffer], nbytes: int) -> None:
        """Allocates the slot's device memory here, maps it in the accused and gives each
        buffer the judge's view of it (its storage bits)."""
        from . import device_share, dtypes
        from .adapters.device import torch_bits_dtype
        try:
            mapping, fd = device_share.create(nbytes)
        except device_share.ShareError as e:
            raise TaskError(f"harness error: cannot allocate shared device memory: {e}") from None
        self.shared.append(mapping)
        try:
            self.process.rpc("alloc", fds=(fd,), slot=slot, params=params, tensors=tensors,
                             device_share={"size": mapping.size,
                                           "emulated": mapping.emulated})
        finally:
            os.close(fd)
        for t in tensors:
            b = made[t["name"]]
            storage = dtypes.get(b.spec.dtype).storage
            view = mapping.tensor(int(t["device_offset"]), int(t["nbytes"]),
                                  torch_bits_dtype(np.dtype(storage).itemsize), b.spec.shape)
            if self.staged:
                b.staging = view
            else:
                b.dev = view

    def device_view(self, buf: RemoteBuffer) -> Any:
        """The judge's device view of `buf` (storage bits), or None without shared memory or
        where the memory only stages the tensor (mlx): what the candidate sees is elsewhere."""
        return buf.dev

    def device_target(self, buf: RemoteBuffer) -> Any:
        """Where the judge writes an input on the device: the candidate's buffer itself
        (`dev`) or its staging (`stage_inputs` then has the accused take it); None without
        shared memory."""
        return buf.dev if buf.dev is not None else buf.staging

    def stage_inputs(self, bufs: dict[str, RemoteBuffer]) -> None:
        """After the judge wrote `bufs` (inputs of one slot) on the device: the accused copies
        each from its staging into a new array of the candidate's, on the device (`h2d` with
        `staged`). Nothing to do where the candidate's buffers are the shared memory."""
        names = [n for n, b in bufs.items() if b.dev is None and b.staging is not None]
        if names:
            self.process.rpc("h2d", slot=_one_slot(bufs), names=names, staged=True)

    def device_outputs(self, bufs: dict[str, RemoteBuffer]) -> dict[str, Any] | None:
        """Device tensors (storage bits) holding the outputs of one slot now, for the judge to
        copy and check on the device: the shared buffers themselves (cuda), or their staging
        after the accused copied each output there (mlx); None unless every output has one."""
        if bufs and all(b.dev is not None for b in bufs.values()):
            return {n: b.dev for n, b in bufs.items()}
        if not bufs or any(b.staging is None for b in bufs.values()):
            return None
        self.process.rpc("d2h", slot=_one_slot(bufs), names=list(bufs), staged=True)
        return {n: b.staging for n, b in bufs.items()}

    def _place(self, nbytes: int) -> Placement:
        place = self.layout.place(nbytes)
        if self.layout.size > self.arena.size:
            raise TaskError(f"harness error: the arena ({self.arena.size} bytes) is too small "
                            f"for the workloads' tensors")
        return place

    def upload(self, buf: RemoteBuffer, host: Any) -> None:
        import numpy as np
        target = self.device_target(buf)
        if target is not None:
            from .adapters.device import torch_upload
            torch_upload(target, host)  # complete when it returns, before any later command
            self.stage_inputs({buf.spec.name: buf})  # mlx: the accused copies it in
            return
        np.copyto(buf.view, host, casting="no")
        if self.on_device:
            self.process.rpc("h2d", slot=buf.slot, names=[buf.spec.name])

    def release_outputs(self, bufs: dict[str, RemoteBuffer]) -> None:
        """Has the accused drop the outputs of one slot (Accused.release): for backends whose
        candidates make their outputs, in place of uploading poison into them."""
        slots = {b.slot for b in bufs.values()}
        if len(slots) == 1:
            self.process.rpc("release", slot=slots.pop(), names=list(bufs))

    def to_host(self, buf: RemoteBuffer) -> Any:
        from . import parallel
        if buf.dev is not None:
            return device_to_host(buf.dev, buf.spec)
        if buf.staging is not None:
            self.process.rpc("d2h", slot=buf.slot, names=[buf.spec.name], staged=True)
            return device_to_host(buf.staging, buf.spec)
        if self.on_device:
            self.process.rpc("d2h", slot=buf.slot, names=[buf.spec.name])
        return parallel.copy(buf.view)

    def inputs_changed(self, bufs: dict[str, RemoteBuffer]) -> dict[str, int]:
        """Bytes changed per input since its upload, as the accused counts them against the
        device copy it made then (Accused.unchanged): for GPU backends whose memory the judge
        does not share. Inputs the accused kept no copy of are left out; the judge reads them
        back. Like a read back (`d2h`), the count is the accused's report."""
        return self._unchanged(bufs)

    def outputs_unchanged(self, bufs: dict[str, RemoteBuffer]) -> bool:
        """Whether every output still holds what the accused last copied out of it, as it
        counts against the device copy it made then (Accused.unchanged); False where it kept
        none (the judge then reads the outputs again). The accused's report, as the copies
        out are."""
        counted = self._unchanged(bufs)
        return bool(bufs) and set(counted) == set(bufs) and not any(counted.values())

    def _unchanged(self, bufs: dict[str, RemoteBuffer]) -> dict[str, int]:
        """The accused's counts of changed bytes for the buffers of one slot that the judge
        does not share; buffers it kept no device copy of are left out."""
        names = [n for n, b in bufs.items() if b.dev is None]
        slots = {b.slot for b in bufs.values()}
        if not self.on_device or not names or len(slots) != 1:
            return {}
        reply = self.process.rpc("unchanged", slot=slots.pop(), names=names)
        changed = reply.get("changed")
        if not isinstance(changed, dict):
            return {}
        return {str(n): int(c) for n, c in changed.items() if n in names}

    def time_call(self, fn: RemoteCall) -> TimedCall:
        return self.process.timed("call", slot=fn.slot)

    def prime(self, fn: RemoteCall) -> int:
        return int(self.process.rpc("prime", slot=fn.slot).get("ns", 0))

    def close(self) -> None:
        self.close_now()()

    def close_now(self) -> Callable[[], None]:
        """Ends the accused (AccusedProcess.close_now) and lets go of the arena and the shared
        device memory here, on the judge's own thread (the driver calls that unmap it are made
        where the judge's device context is current); returns the wait for the process to be
        gone. The accused's own mappings keep the memory until it is gone
        (device_share.Mapping.close)."""
        finish = self.process.close_now()
        self.arena.close()
        for m in self.shared:
            m.close()
        self.shared = []
        return finish


def _one_slot(bufs: dict[str, RemoteBuffer]) -> int:
    slots = {b.slot for b in bufs.values()}
    if len(slots) != 1:
        raise TaskError("harness error: one copy command takes the tensors of one slot")
    return slots.pop()


def device_to_host(bits: Any, spec: TensorSpec) -> Any:
    """A host copy of a device tensor of `spec`'s storage bits (a shared buffer or the judge's
    snapshot of one)."""
    from . import dtypes
    from .adapters.device import torch_to_host
    return torch_to_host(bits, dtypes.get(spec.dtype).storage)


# -- environment -------------------------------------------------------------------------------

_PASSED = ("PATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CUDA_HOME",
           "PYTHONPATH")


def accused_environment(workdir: str, backend: str) -> dict[str, str]:
    """The accused's environment: what a kernel needs to load and run, nothing of the judge's.
    Honest thread pools sleep when idle (passive OpenMP), so an idle pool never reads as
    lingering work; numpy in the accused keeps to one thread.

    On the cpu backend OpenMP threads are bound to cores: a pool woken for each timed call
    after the judge's work in between (tens of milliseconds) was otherwise placed on the waking
    thread's core and ran the call at one thread's speed in most evaluations and at two
    threads' in a few (docs/results/scores). Nowhere else: the binding pins the thread that
    loads the OpenMP runtime, and every thread it starts after, to the first core, and on the
    GPU backends that thread is the accused's Python, which loads the runtime with PyTorch, so
    every accused of a judge (the one evaluated and the spares starting) ran on one core
    (docs/results/evaluation-speed)."""
    env = {k: os.environ[k] for k in _PASSED if k in os.environ}
    harness_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [harness_dir] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update({
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        "HOME": workdir, "TMPDIR": workdir,
        "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
        "OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "0",
        "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
    })
    if backend == "cpu":
        env.update({"OMP_PROC_BIND": "true", "OMP_PLACES": "cores"})
    # More variables by name, for a machine whose kernels need them (the MLX_* or CUDA_*
    # settings of a device, or a test's fake modules): KSEARCH_HARNESS_ACCUSED_ENV=A,B.
    extra = [n.strip() for n in os.environ.get("KSEARCH_HARNESS_ACCUSED_ENV", "").split(",")]
    for name in ["MLX_ENABLE_TF32", "KSEARCH_HARNESS_MLX_CLOCK", *extra]:
        if name and name in os.environ:
            env[name] = os.environ[name]
    return env


# Limits of the accused. Memory: a share of the machine's, so a candidate that allocates without
# bound meets the cgroup (killed: a runtime error), not the host's OOM killer. Address space
# (cpu only; CUDA reserves far more than it uses): the arena plus room for the interpreter,
# thread stacks and glibc's per-thread heaps, so that reserving tens of GiB fails at once.
# Output: what a chatty kernel may print to the log.
ADDRESS_SPACE_ROOM = 16 << 30
MEMORY_SHARE = 0.5
MIN_MEMORY_BYTES = 2 << 30
FILE_BYTES = 256 << 20
TASKS_PER_CORE = 8
MIN_TASKS = 256


def accused_policy(backend: str, workdir: str, mode: str, readable_extra: tuple[str, ...],
                   arena_bytes: int, cpu_seconds: int | None) -> Any:
    """The sandbox of an accused process (sandbox.Policy): nothing but its working directory to
    write, no process of its own after its imports, no network. GPU backends also need their
    device files, a unix socket (the CUDA driver makes one) and writes beneath their private
    /proc (the driver names its threads); the host's unix sockets are hidden from them."""
    import socket as _socket
    ram = physical_memory()
    gpu = backend in ("cuda", "mlx")
    return sandbox.Policy(
        workdir=workdir,
        devices=("/dev/nvidia*",) if gpu else (),
        address_space_bytes=None if gpu else arena_bytes + ADDRESS_SPACE_ROOM,
        memory_bytes=max(MIN_MEMORY_BYTES, int(MEMORY_SHARE * ram)),
        cpu_seconds=cpu_seconds,
        file_bytes=FILE_BYTES,
        tasks=max(MIN_TASKS, TASKS_PER_CORE * (os.cpu_count() or 1)),
        mode=mode,
        socket_families=(_socket.AF_UNIX,) if gpu else (),
        proc_writable=gpu,
        hide=("/run", "/var/run") if gpu else (),
        reveal=tuple(dict.fromkeys(sandbox.interpreter_paths() + readable_extra)),
    )


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _nothing() -> None:
    """What is left to wait for when nothing was started."""
