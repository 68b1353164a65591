"""The worker process: runs one op and writes its result line to the pipe the supervisor
reads. Also the in-process entry point (`execute`) used by tests."""

from __future__ import annotations

import os
import sys
import traceback

from .protocol import (CandidateRuntimeError, HarnessError, Request, ResultBuilder, TaskError,
                       encode_result)

# Stages whose unexpected exceptions are the task's fault rather than the candidate's.
TASK_STAGES = ("request", "task")
EXIT_CHANNEL_FAILED = 3
# A directory: each op of this judge is profiled (cProfile, the calling thread) into
# <dir>/<op>-<nonce>.prof. A diagnostic for where an evaluation's host time goes.
PROFILE_ENV = "KSEARCH_HARNESS_PROFILE"


def execute(req: Request, adapter=None, roofline_override=None) -> dict:
    """Runs `req` in this process and returns the result object (never raises)."""
    where = os.environ.get(PROFILE_ENV, "").strip()
    if not where:
        return _execute(req, adapter, roofline_override)
    import cProfile
    profile = cProfile.Profile()
    try:
        return profile.runcall(_execute, req, adapter, roofline_override)
    finally:
        try:
            os.makedirs(where, exist_ok=True)
            profile.dump_stats(os.path.join(where, f"{req.op}-{req.nonce}.prof"))
        except OSError as e:
            print(f"harness: cannot write the profile to {where}: {e}", file=sys.stderr)


def _execute(req: Request, adapter=None, roofline_override=None) -> dict:
    out = ResultBuilder(req.op, req.nonce)
    try:
        from . import core, device_gate
        from .machine import collector_paused, steady_heap
        steady_heap()
        if req.op == "evaluate":
            with collector_paused():
                core.evaluate(req, out, adapter, roofline_override)
            if req.profiles_ahead:
                from . import profiler
                # Not while another judge of the device times (device_gate); afterwards its
                # start-up waits with the spares.
                with device_gate.current().shared():
                    profiler.start_ahead(req)
        elif req.op == "build":
            core.build(req, out, adapter)
        elif req.op == "check-task":
            with device_gate.current().shared():
                core.check_task(req, out)
        elif req.op == "profile":
            from . import profiler, spare_accused
            # Nor while a profiler replays the candidate's kernels: its counters are of a
            # device the spares' start-up (contexts, test launches) does not share, nor the
            # other judges' work (device_gate).
            with device_gate.current().exclusive(), spare_accused.paused():
                profiler.profile(req, out, adapter)
        elif req.op == "yardstick":
            from . import spare_accused, yardstick
            # The device alone (device_gate), and spare accused processes an evaluation
            # started do not start up while the yardstick is timed (spare_accused).
            with (device_gate.current().exclusive(), spare_accused.paused(),
                  collector_paused()):
                yardstick.measure(req, out, adapter)
        else:
            raise TaskError(f"op `{req.op}` does not run in a worker")
    except HarnessError as e:
        out.fail(e)
    except Exception as e:  # noqa: BLE001 - every failure must become a result
        traceback.print_exc()
        kind = TaskError if out.stage in TASK_STAGES else CandidateRuntimeError
        out.fail(kind(f"unexpected {type(e).__name__} during {out.stage}: {e}"))
    return out.data


def child_main(req: Request, fd: int) -> None:
    """Entry point of the forked worker; never returns."""
    code = 0
    try:
        import faulthandler
        faulthandler.enable(file=sys.stderr)  # a crash in candidate code leaves a trace in the log
        from .machine import die_with_parent
        die_with_parent()
        if not _send_result(fd, execute(req)):
            code = EXIT_CHANNEL_FAILED
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 70
    finally:
        # os._exit: no interpreter shutdown, so threads a candidate left behind cannot hold the
        # process up or run atexit handlers.
        os._exit(code)


def _send_result(fd: int, result: dict) -> bool:
    """Flushes what the run printed, then writes the result line to `fd`; False when the
    pipe is gone."""
    from .machine import flush_c_stdio
    from .protocol import write_all
    flush_c_stdio()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        write_all(fd, encode_result(result))
    except OSError:
        return False
    return True


def child_loop(req_fd: int, res_fd: int) -> None:
    """Entry point of a persistent judge's worker (supervisor.serve_loop); never returns. Reads
    one request line at a time ({"request": ..., "log": path}), points fd 1 and 2 at that
    request's log, runs it and writes its result line; exits when the request pipe closes.
    What the process imported, its device context and the adapters' caches stay for the next
    request."""
    code = 0
    try:
        import faulthandler
        import json
        from . import device_gate, draw_cache, profiler, reaping, spare_accused
        from .machine import die_with_parent
        from .protocol import parse_request, redirect_output
        die_with_parent()
        draw_cache.enable()
        spare_accused.enable()
        profiler.keep_ahead()
        # An evaluation's killed accused is waited for after its result, and before anything
        # is timed (reaping).
        reaping.enable()
        spare_accused.pause_also(reaping.wait)
        # Beside other judges of the device: their timed work stops this one's spares.
        device_gate.watch()
        reader = os.fdopen(req_fd, "rb")
        while True:
            line = reader.readline()
            if not line:
                break
            msg = json.loads(line)
            redirect_output(msg["log"])
            faulthandler.enable(file=sys.stderr)
            obj = msg["request"]
            try:
                req = parse_request(obj, obj["op"])
                result = execute(req)
            finally:
                lost = _forget_device()
            if not _send_result(res_fd, result):
                code = EXIT_CHANNEL_FAILED
                break
            if lost:
                # This process's own device context is unusable: the next request gets a
                # fresh worker (the supervisor forks one when this one has exited).
                break
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 70
    finally:
        try:
            from . import profiler, reaping, spare_accused
            spare_accused.close()  # nothing of a spare is left behind
            profiler.close()
            reaping.wait()  # nor of an evaluation's accused
        finally:
            os._exit(code)


def _forget_device() -> bool:
    """The next request creates its own adapter; the process keeps the device context. Returns
    whether that context was lost (a CUDA error in the judge's own work is sticky: its
    adapter's, or one in drawing inputs on the device, device.device_lost)."""
    try:
        from .adapters import device
        active = device._ACTIVE
        lost = active is not None and getattr(active, "_dead", None) is not None
        lost = device.device_lost() is not None or lost
        device.deactivate()
        if not lost:
            _release_device_memory()
        return bool(lost)
    except Exception:  # noqa: BLE001 - no device module state to forget
        return False


def _release_device_memory() -> None:
    """Hands the device memory this judge cached for the finished request back (PyTorch's and
    MLX's allocators keep freed blocks): the next candidate's process gets the device as a
    fresh judge would leave it."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:  # noqa: BLE001 - a courtesy, not a check
            pass
    mx = sys.modules.get("mlx.core")
    if mx is not None:
        clear = getattr(mx, "clear_cache", None)
        try:
            if callable(clear):
                clear()
        except Exception:  # noqa: BLE001
            pass
