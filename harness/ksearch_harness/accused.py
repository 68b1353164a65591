"""The accused process: the only place candidate code runs.

The judge (core.py, through accused_client.py) starts this module inside the sandbox
(sandbox.py) and drives it over one socket (channel.py). It holds the candidate's artifact, its
device buffers and the calls, and answers each command with one reply. It knows nothing the
judge keeps for itself: not the request, its nonce or secret seed, not the reference's outputs,
not the result channel. Its inputs arrive in shared memory (arena.py) that the judge writes while
this process is stopped (SIGSTOP); it is continued only to run a command.

Nothing here is trusted once the candidate is loaded: the candidate's native code can rewrite
this module's functions, forge replies or read the socket. The judge therefore treats every
reply as a claim to check (outputs it reads itself, timings it bounds with its own clock); this
module's job is to be correct for honest candidates and to make the cheap cheats loud.

Commands (`op`), each answered with {"seq": <the command's seq>, "ok": true, ...} or
{"seq", "ok": false, "error": build|runtime|violation|incorrect|task, "message", "class"?}:

- `arena` (with a descriptor): map a shared-memory arena.
- `load` {artifact, entry, workloads, backend, timing}: load the candidate; resolve every entry.
- `alloc` {slot, params, tensors: [{name, role, dtype, shape, offset, nbytes}]}: buffers for
  one workload (on the cpu they are the arena's pages; on GPUs device buffers).
- `h2d` / `d2h` {slot, names}: copies between the arena and device buffers (GPU backends).
  An input copied in, or an output copied out, is also kept as a device copy where the
  adapter can make one (`keep_pristine`: mlx), for `unchanged`.
- `unchanged` {slot, names}: for each tensor, how many of its bytes differ from its device copy
  made at its last `h2d` or `d2h` (`changed`), or that there is no such copy (`unchecked`): the
  inputs check and the deferred-work check of a backend whose memory the judge cannot read
  itself, answered without copying the tensors back.
- `call` {slot, heap_byte, timed}: one call; `timed` answers its duration as measured here
  (perf_counter, or CUDA events on the cuda backend), which the judge bounds.
- `prime` {slot}: an untimed call that brings device memory into its steady state (mlx).
- `noop`: nothing; the judge times these to learn what a round trip costs.
- `exit`.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import mmap
import os
import socket
import sys
import time
from typing import Any, Callable

from . import channel, sandbox
from .machine import die_with_parent, set_heap_perturb, steady_heap


class CommandFailed(Exception):
    def __init__(self, error: str, message: str, violation: str | None = None):
        super().__init__(message)
        self.error, self.message, self.violation = error, message, violation


class Accused:
    def __init__(self, backend: str):
        self.backend = backend
        self.arenas: list[mmap.mmap] = []
        self.adapter: Any = None
        self.request: Any = None
        self.slots: dict[int, Slot] = {}

    # -- commands ------------------------------------------------------------------------

    def handle(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        op = msg.get("op")
        if op == "arena":
            return self.map_arena(fds, int(msg["size"]))
        if op == "load":
            return self.load(msg)
        if op == "alloc":
            return self.alloc(msg, fds)
        if op in ("h2d", "d2h"):
            return self.copy(op, self.slot(msg), msg.get("names") or [],
                             staged=bool(msg.get("staged")))
        if op == "unchanged":
            return self.unchanged(self.slot(msg), msg.get("names") or [])
        if op == "release":
            return self.release(self.slot(msg), msg.get("names") or [])
        if op == "call":
            return self.call(self.slot(msg), int(msg.get("heap_byte", 0)),
                             bool(msg.get("timed")), bool(msg.get("audit")))
        if op == "prime":
            return self.prime(self.slot(msg))
        if op == "noop":
            # The judge times these to learn what a round trip costs; a timed one goes through
            # the same timing code as a timed call, around nothing.
            if msg.get("timed") and self.adapter is not None:
                ns, _ = self.adapter.time_call(_nothing)
                return {"ns": int(ns)}
            return {"ns": 0}
        raise CommandFailed("task", f"unknown command `{op}`")

    def map_arena(self, fds: list[int], size: int) -> dict[str, Any]:
        if len(fds) != 1:
            raise CommandFailed("task", f"an arena needs one descriptor, got {len(fds)}")
        m = mmap.mmap(fds[0], size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        os.close(fds[0])
        self.arenas.append(m)
        return {"arena": len(self.arenas) - 1}

    def load(self, msg: dict[str, Any]) -> dict[str, Any]:
        from . import adapters
        from .adapters import BuildFailed, BuildInfo
        from .protocol import Entry, HarnessError
        self.request = _request_view(msg)
        self.adapter = adapters.create(self.request)
        info = BuildInfo(compiler="", command=[], seconds=0.0, log="",
                         artifact=str(msg["artifact"]))
        entry = Entry(str(msg["entry"]["symbol"]), tuple(msg["entry"]["args"]))
        try:
            self.adapter.load(info, entry)
        except BuildFailed as e:
            raise CommandFailed("build", e.message) from None
        except HarnessError as e:
            raise _failure(e) from None
        return {"pid": os.getpid()}

    def alloc(self, msg: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        from .protocol import TensorSpec
        from . import dtypes
        import numpy as np
        if self.adapter is None:
            for fd in fds:
                os.close(fd)
            raise CommandFailed("task", "alloc before load")
        arena = self.arenas[int(msg.get("arena", 0))]
        slot = Slot(params=dict(msg["params"]))
        shared = self._shared_memory(msg, fds)
        slot.shared = shared
        for t in msg["tensors"]:
            spec = TensorSpec(str(t["name"]), str(t["dtype"]), tuple(int(d) for d in t["shape"]))
            storage = dtypes.get(spec.dtype).storage
            count = int(np.prod(spec.shape, dtype=np.int64))
            view = np.frombuffer(arena, dtype=storage, count=count,
                                 offset=int(t["offset"])).reshape(spec.shape)
            if self.backend == "cpu":
                buf = view
            elif shared is not None and self.backend == "mlx":
                # The candidate's arrays are MLX's; the shared memory stages them (copy).
                from . import device_share
                buf = self.adapter.alloc(spec)
                slot.staging[spec.name] = device_share.span(
                    shared, int(t["device_offset"]), int(t["nbytes"]))
            elif shared is not None:
                from .adapters.device import torch_dtype
                buf = self.adapter.adopt(spec, shared.tensor(
                    int(t["device_offset"]), int(t["nbytes"]), torch_dtype(spec.dtype),
                    spec.shape))
            else:
                buf = self.adapter.alloc(spec)
            (slot.inputs if t["role"] == "input" else slot.outputs)[spec.name] = buf
            slot.views[spec.name] = view
        try:
            slot.fn = self.adapter.bind(slot.inputs, slot.outputs, slot.params)
        except Exception as e:  # noqa: BLE001 - binding runs candidate-facing code
            raise _failure(e) from None
        self.slots[int(msg["slot"])] = slot
        return {}

    def _shared_memory(self, msg: dict[str, Any], fds: list[int]) -> Any:
        """The slot's device memory the judge shares (device_share), when it sent one: on
        cuda the slot's device tensors are then views of it, which the judge writes and reads
        itself; on mlx it stages them (`copy` with `staged`)."""
        share = msg.get("device_share")
        if not share:
            for fd in fds:
                os.close(fd)
            return None
        if len(fds) != 1 or self.backend not in ("cuda", "mlx"):
            for fd in fds:
                os.close(fd)
            raise CommandFailed("task", "shared device memory needs the cuda or mlx backend "
                                "and one descriptor")
        from . import device_share
        try:
            size, emulated = int(share["size"]), bool(share.get("emulated"))
        except (AttributeError, KeyError, TypeError, ValueError):
            os.close(fds[0])
            raise CommandFailed("task", "shared device memory without its size") from None
        # A memory the judge shares but that cannot be mapped here is the harness's failure
        # (or the machine's), never the candidate's; open_shared closes the descriptor.
        try:
            return device_share.open_shared(fds[0], size, emulated=emulated)
        except (device_share.ShareError, OSError, ValueError) as e:
            raise CommandFailed("task", f"cannot map the judge's device memory: {e}") from None

    def slot(self, msg: dict[str, Any]) -> "Slot":
        s = self.slots.get(int(msg.get("slot", -1)))
        if s is None:
            raise CommandFailed("task", f"no slot {msg.get('slot')}")
        return s

    def copy(self, op: str, slot: "Slot", names: list[str], staged: bool = False
             ) -> dict[str, Any]:
        """Copies tensors in (`h2d`) or out (`d2h`) through the arena, or through the slot's
        staging on the device (`staged`, mlx with shared memory)."""
        if self.backend == "cpu":
            return {}  # the buffers are the arena
        import numpy as np
        try:
            for n in names:
                buf = slot.inputs.get(n) or slot.outputs.get(n)
                if buf is None:
                    raise CommandFailed("task", f"no tensor `{n}` in the slot")
                stage = slot.staging.get(n) if staged else None
                if staged and stage is None:
                    raise CommandFailed("task", f"no staging for `{n}` in the slot")
                if stage is not None and op == "h2d":
                    self.adapter.upload_staged(buf, stage)
                elif stage is not None:
                    self.adapter.stage_output(buf, stage)
                elif op == "h2d":
                    self.adapter.upload(buf, slot.views[n])
                else:
                    np.copyto(slot.views[n], self.adapter.to_host(buf), casting="no")
                # An input is compared with what was copied in, an output with what was
                # last copied out (a poisoned output has nothing to be compared with). A
                # staged output is not: the judge copies it out again to see it unchanged.
                if (op == "h2d") == (n in slot.inputs) and not (staged and op == "d2h"):
                    slot.pristine[n] = self.adapter.keep_pristine(buf)
                elif n in slot.outputs:
                    slot.pristine.pop(n, None)
            self.adapter.synchronize()
        except CommandFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a sticky device error is the candidate's
            raise _failure(e) from None
        return {}

    def release(self, slot: "Slot", names: list[str]) -> dict[str, Any]:
        """Drops the outputs a call left (adapters: `release`), where the candidate makes its
        outputs: what poisoning them did, without copying poison in."""
        if self.adapter is None or not self.adapter.candidate_makes_outputs:
            raise CommandFailed("task", "`release` is for backends whose candidates make "
                                "their outputs")
        try:
            for n in names:
                buf = slot.outputs.get(n)
                if buf is None:
                    raise CommandFailed("task", f"no output `{n}` in the slot")
                self.adapter.release(buf)
                slot.pristine.pop(n, None)
        except CommandFailed:
            raise
        except Exception as e:  # noqa: BLE001 - a sticky device error is the candidate's
            raise _failure(e) from None
        return {}

    def unchanged(self, slot: "Slot", names: list[str]) -> dict[str, Any]:
        changed: dict[str, int] = {}
        unchecked: list[str] = []
        try:
            for n in names:
                buf, kept = slot.inputs.get(n), slot.pristine.get(n)
                if buf is None:
                    buf = slot.outputs.get(n)
                if buf is None or kept is None:
                    unchecked.append(n)
                    continue
                changed[n] = int(self.adapter.changed_bytes(buf, kept))
        except Exception as e:  # noqa: BLE001 - a sticky device error is the candidate's
            raise _failure(e) from None
        return {"changed": changed, "unchecked": unchecked}

    def call(self, slot: "Slot", heap_byte: int, timed: bool, audit: bool) -> dict[str, Any]:
        assert slot.fn is not None
        a = self.adapter
        fn = slot.fn
        try:
            if timed:
                a.last_parts = None
                ns, _ = a.time_call(fn)
                parts = getattr(a, "last_parts", None)
                return {"ns": int(ns), **({"parts": parts} if parts else {})}
            set_heap_perturb(heap_byte)
            try:
                reply: dict[str, Any] = {}
                if audit and AUDIT.available:
                    kernels = AUDIT.kernels_of(lambda: (fn(), a.synchronize()))
                    reply = {"kernels": kernels, "own_kernels": _own_kernels(a)}
                else:
                    fn()
                    a.synchronize()
            finally:
                set_heap_perturb(0)
            a.check_after_call()
            return reply
        except Exception as e:  # noqa: BLE001 - everything a call raises is the candidate's
            raise _failure(e) from None

    def prime(self, slot: "Slot") -> dict[str, Any]:
        assert slot.fn is not None
        try:
            return {"ns": int(self.adapter.prime(slot.fn))}
        except Exception as e:  # noqa: BLE001
            raise _failure(e) from None


def _nothing() -> None:
    """The call a timed noop times: no work, on the host or the device."""


# A device clock that records the device's activity finds none in it, and that is no error.
_nothing.ksearch_idle = True  # type: ignore[attr-defined]


class Slot:
    """One workload's buffers and its bound call."""

    def __init__(self, params: dict[str, Any]):
        self.params = params
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.views: dict[str, Any] = {}
        self.pristine: dict[str, Any] = {}  # device copies for `unchanged` (Accused.copy)
        self.fn: Callable[[], None] | None = None
        self.shared: Any = None  # device_share.Mapping the judge shares, if any
        # mlx with shared memory: per tensor, its staging there (device_share.Span).
        self.staging: dict[str, Any] = {}


def _failure(e: BaseException) -> CommandFailed:
    from .protocol import BuildError, HarnessError, Incorrect, TaskError, Violation
    if isinstance(e, CommandFailed):
        return e
    if isinstance(e, Violation) or (isinstance(e, HarnessError) and e.violation
                                     and e.status == "integrity_violation"):
        return CommandFailed("violation", e.message, e.violation)
    if isinstance(e, Incorrect):
        return CommandFailed("incorrect", e.message)
    if isinstance(e, BuildError):
        return CommandFailed("build", e.message)
    if isinstance(e, TaskError):
        return CommandFailed("task", e.message)
    if isinstance(e, HarnessError):
        return CommandFailed("runtime", e.message, e.violation)
    return CommandFailed("runtime", f"{type(e).__name__}: {e}")


def _request_view(msg: dict[str, Any]) -> Any:
    """The part of the request an adapter needs to run a candidate: backend, workloads, the
    timing settings. No nonce, no secret seed, no task directory."""
    from .protocol import Request, Timing, _Fields, _parse_workload
    fields = _Fields(msg, "load")
    workloads = tuple(_parse_workload(w) for w in fields.items("workloads"))
    t = msg.get("timing") or {}
    timing = Timing(int(t.get("warmup", 0)), int(t.get("min_reps", 1)),
                    int(t.get("max_reps", 1)), float(t.get("target_seconds", 0.0)),
                    int(t.get("flush_bytes", 1 << 20)))
    return Request(op="evaluate", nonce="", secret_seed=0, backend=str(msg["backend"]),
                   task=None, candidate=None, build_dir=None, workloads=workloads,
                   tolerance={}, trials=0, timing=timing, timeout_s=float(msg.get("timeout_s",
                                                                                  60.0)))


# -- process ---------------------------------------------------------------------------------


class KernelAudit:
    """Which GPU kernels ran during a call: CUDA activity recorded by PyTorch's profiler
    (CUPTI), which sees every launch of this process whichever library made it. Set up and
    warmed before the candidate is loaded (a profiler's first session can drop events).

    It runs in the accused, so it is evidence against kernels reached through library calls
    (reward hacking), not a defence against native code that disables it (docs/security.md)."""

    def __init__(self) -> None:
        self.available = False
        self.why = "not a GPU backend"

    def prepare(self, sync: Callable[[], None], touch: Callable[[], None]) -> None:
        try:
            from torch.autograd import DeviceType  # noqa: F401
            from torch.profiler import ProfilerActivity, profile  # noqa: F401
        except Exception as e:  # noqa: BLE001 - no torch: no audit, said so in the result
            self.why = f"PyTorch's profiler is not available ({type(e).__name__}: {e})"
            return
        self._sync = sync
        try:
            for _ in range(2):
                seen = self.kernels_of(touch)
        except Exception as e:  # noqa: BLE001
            self.why = f"the profiler failed: {type(e).__name__}: {e}"
            return
        if not seen:
            self.why = "the profiler recorded no kernel of a test launch"
            return
        self.available, self.why = True, "torch.profiler (CUPTI) CUDA activity"

    def kernels_of(self, fn: Callable[[], Any]) -> list[str]:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            self._sync()
        names: list[str] = []
        for e in prof.events():
            if e.device_type == DeviceType.CUDA and e.name not in names:
                names.append(e.name)
        return names[:200]


AUDIT = KernelAudit()


def _own_kernels(adapter: Any) -> list[str]:
    """Kernels the candidate built at run time (mlx: through mx.fast.cuda_kernel)."""
    return list(getattr(adapter, "built_kernels", []))[:200]


# When each step of the start-up ended (CLOCK_MONOTONIC, which the judge's clock shares): the
# ready message carries them, and the judge reports where a start's seconds went
# (accused_client.AccusedProcess.start_seconds).
START_MARKS: list[tuple[str, float]] = []


def _mark(step: str) -> None:
    START_MARKS.append((step, time.monotonic()))


def _prepare_device(backend: str, audit: bool = True) -> None:
    """Device start-up before the lock-down: importing torch or mlx and creating the CUDA
    context may need what the locked-down process may not do; the kernel audit starts here
    too (unless `audit` is off: diagnostics only, tests/call_cost.py)."""
    if not audit:
        AUDIT.why = "turned off (--no-kernel-audit)"
    if backend == "cuda":
        import torch
        _mark("import")
        if torch.cuda.is_available():
            torch.cuda.init()
            probe = torch.zeros(1 << 10, device="cuda")
            _mark("context")
            if audit:
                AUDIT.prepare(torch.cuda.synchronize, lambda: probe.add_(1))
                _mark("audit")
    elif backend == "mlx":
        os.environ.setdefault("MLX_ENABLE_TF32", "0")
        import mlx.core as mx
        _mark("import")
        mx.eval(mx.zeros((1,)))
        _mark("context")
        if getattr(mx, "cuda", None) is not None and mx.cuda.is_available():
            probe = mx.zeros((1 << 10,))
            if audit:
                AUDIT.prepare(mx.synchronize, lambda: mx.eval(probe + 1))
                _mark("audit")
            # The mlx adapter's device clock, if chosen, needs the profiler set up before the
            # lock-down as the audit does.
            from . import kernel_clock
            if kernel_clock.chosen() == "kernels":
                from .adapters.mlx import prepare_device_clock
                prepare_device_clock(mx)
                _mark("clock")
            _prepare_staging()
    import numpy  # noqa: F401 - every backend's buffers are numpy views of the arena


def _prepare_staging() -> None:
    """Whether this mlx accused can stage the candidate's arrays in device memory the judge
    shares (`alloc`, `copy` with `staged`): MLX runs on CUDA here and the driver, which
    copies between that memory and MLX's, loads now, before the lock-down (or the staging is
    emulated in host memory: tests). The ready message says so (`stages_on_device`)."""
    global STAGES_ON_DEVICE
    from . import device_share
    try:
        if device_share.mode() != "emulate":
            device_share.load_driver()
        STAGES_ON_DEVICE = True
    except (OSError, device_share.ShareError):
        STAGES_ON_DEVICE = False


# Whether this accused can stage an mlx candidate's arrays in shared device memory
# (_prepare_staging); the cuda backend's shared buffers are its tensors themselves.
STAGES_ON_DEVICE = False


def serve(sock: socket.socket, backend: str, audit: bool = True, lockdown_on: bool = True) -> int:
    accused = Accused(backend)
    try:
        _prepare_device(backend, audit)
        lockdown = (sandbox.lock_down() if lockdown_on else
                    sandbox.Layer("lockdown", False, "turned off (--no-lockdown)")).to_json()
        _mark("lockdown")
    except Exception as e:  # noqa: BLE001 - reported to the judge, which decides
        channel.send(sock, {"seq": 0, "ok": False, "error": "task",
                            "message": f"the accused could not start: {type(e).__name__}: {e}"})
        return 1
    channel.send(sock, {"seq": 0, "ok": True, "op": "ready", "pid": os.getpid(),
                        "lockdown": lockdown, "start_marks": START_MARKS,
                        "stages_on_device": STAGES_ON_DEVICE,
                        "kernel_audit": {"active": AUDIT.available, "detail": AUDIT.why}})
    while True:
        try:
            msg, fds = channel.recv_with_fds(sock)
        except (channel.AccusedProtocolError, OSError):
            return 0  # the judge is gone
        seq = msg.get("seq")
        if msg.get("op") == "exit":
            channel.send(sock, {"seq": seq, "ok": True})
            return 0
        try:
            reply = {"seq": seq, "ok": True, **accused.handle(msg, fds)}
        except CommandFailed as e:
            reply = {"seq": seq, "ok": False, "error": e.error, "message": e.message[:4000]}
            if e.violation:
                reply["class"] = e.violation
        except Exception as e:  # noqa: BLE001 - the judge gets every failure as a reply
            reply = {"seq": seq, "ok": False, "error": "runtime",
                     "message": f"{type(e).__name__}: {e}"[:4000]}
        sys.stdout.flush()
        sys.stderr.flush()
        channel.send(sock, reply)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ksearch_harness.accused")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--backend", required=True)
    # Diagnostics only (tests/call_cost.py): what the kernel audit's profiler costs a call.
    # The judge never passes it; the result's kernel_audit then says the audit is off.
    parser.add_argument("--no-kernel-audit", action="store_true")
    # Diagnostics only, likewise: what the stage-2 seccomp filter costs a call.
    parser.add_argument("--no-lockdown", action="store_true")
    args = parser.parse_args(argv)
    _mark("main")  # the interpreter and the harness's modules are up
    die_with_parent()
    steady_heap()  # as the judge: timed calls see a heap in its steady state
    # Nor does the cycle collector run here (machine.collector_paused): a collection after a
    # reply would count as the candidate's lingering work, one inside a call as its time.
    # The process lives for one evaluation; what it allocates is freed by reference counts.
    gc.disable()
    faulthandler.enable(file=sys.stderr)
    sock = socket.socket(fileno=args.channel_fd)
    code = serve(sock, args.backend, audit=not args.no_kernel_audit,
                 lockdown_on=not args.no_lockdown)
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter shutdown: threads a candidate left behind cannot hold the process up.
    os._exit(code)


if __name__ == "__main__":
    main()
