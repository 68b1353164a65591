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


def execute(req: Request, adapter=None, roofline_override=None) -> dict:
    """Runs `req` in this process and returns the result object (never raises)."""
    out = ResultBuilder(req.op, req.nonce)
    try:
        from . import core
        from .machine import steady_heap
        steady_heap()
        if req.op == "evaluate":
            core.evaluate(req, out, adapter, roofline_override)
        elif req.op == "build":
            core.build(req, out, adapter)
        elif req.op == "check-task":
            core.check_task(req, out)
        elif req.op == "yardstick":
            from . import yardstick
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
        result = execute(req)
        from .machine import flush_c_stdio
        flush_c_stdio()
        sys.stdout.flush()
        sys.stderr.flush()
        line = encode_result(result)
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
        except OSError:
            code = EXIT_CHANNEL_FAILED
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        code = 70
    finally:
        # os._exit: no interpreter shutdown, so threads a candidate left behind cannot hold the
        # process up or run atexit handlers.
        os._exit(code)

