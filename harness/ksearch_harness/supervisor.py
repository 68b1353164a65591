"""The harness process as ksearch sees it: it owns the private result channel and runs each op
in a forked worker, so that nothing a candidate does can write or suppress the result.

- The result fd is moved out of the way before anything else happens, stdin is read whole and
  closed, fd 1 and 2 go to a log file; only then is a worker forked.
- The worker never holds the result fd. It reports through a pipe of its own; the supervisor
  accepts exactly one line carrying the request nonce. Extra or malformed bytes on that pipe
  mean a candidate wrote to it: `result_channel`.
- A worker that dies (segfault, abort, exit) becomes a `runtime_error`; one that outlives
  `timeout_s` is killed with its descendants and becomes a `timeout`. A result is always sent.

Standard library only, and no numpy here: the fork happens before any thread exists.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
import tempfile
import time
from typing import Any

from . import protocol, scratch
from .protocol import (CandidateRuntimeError, HarnessError, Request, ResultChannel, TaskError,
                       Violation)

MAX_RESULT_BYTES = 64 << 20
POLL_S = 0.05


def serve(op: str, result_fd: int) -> int:
    try:
        channel = ResultChannel.claim(result_fd)
    except OSError as e:
        print(f"ksearch_harness: --result-fd {result_fd} is not open: {e}", file=sys.stderr)
        return 2
    raw = protocol.read_stdin_and_close()

    def handle(answer: _Answer) -> dict:
        if op == "probe":
            # probe never fails: a missing or unreadable request only costs the nonce.
            try:
                obj = protocol.decode_request(raw)
                answer.nonce = protocol.request_nonce(obj)
                with_sandbox = obj.get("sandbox_probe") is True
            except HarnessError:
                answer.nonce, with_sandbox = None, False
            answer.log_to(_temp_log(), True)
            from . import probe
            return probe.run(answer.nonce, with_sandbox)
        obj = protocol.decode_request(raw)
        answer.nonce = protocol.request_nonce(obj)
        req = protocol.parse_request(obj, op)
        answer.log_to(*_log_path(req))
        return run_worker(req)

    if not _Answer(op).send(channel, handle):
        return 2
    channel.close()
    return 0


class _Answer:
    """One request's way to its result line: what is known of the request so far (op, nonce),
    where fd 1 and 2 go (its log), and the catch-all that turns any failure into a result."""

    def __init__(self, op: str):
        self.op, self.nonce = op, None
        self.log_path: str | None = None
        self.temp_log = False

    def log_to(self, path: str, temp: bool) -> None:
        self.log_path, self.temp_log = path, temp
        protocol.redirect_output(path)

    def send(self, channel: ResultChannel, handle: Any, extra: Any = None) -> bool:
        """Runs `handle(self)` for the result (an error result if it raises), adds the log's
        tail and what `extra()` gives to the result's environment, and writes it to
        `channel`. False when the channel cannot be written."""
        try:
            result = handle(self)
        except HarnessError as e:
            if self.log_path is None:
                self.log_to(_temp_log(), True)
            result = protocol.error_result(self.op, self.nonce, e)
        except Exception as e:  # noqa: BLE001 - a result must always be sent
            result = protocol.error_result(self.op, self.nonce, CandidateRuntimeError(
                f"harness failure: {type(e).__name__}: {e}"))
        result["log_tail"] = protocol.log_tail(self.log_path)
        more = extra() if extra is not None else None
        if more:
            result.setdefault("environment", {}).update(more)
        if self.temp_log and self.log_path:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass
        try:
            channel.send(protocol.encode_result(result))
        except OSError as e:
            print(f"ksearch_harness: cannot write the result: {e}", file=sys.stderr)
            return False
        return True


# Ops a persistent judge serves (`serve_loop`): those that use the device, whose judge gains
# from keeping its imports, device context and caches between requests. A profile's
# candidate runs under the profiler in a process of its own either way; served, the judge
# that draws its inputs (on the GPU for cuda: adapters.large_input_drawer) is already up.
SERVED_OPS = ("evaluate", "yardstick", "profile")


def serve_loop(result_fd: int) -> int:
    """The persistent judge (`python -m ksearch_harness serve`): one request per line on stdin,
    one result line per request on the result fd, in order. Each request runs in a long-lived
    worker, forked at the first request, which keeps its imports (numpy, torch, mlx), its
    device context and its caches from one request to the next; the candidates still run in
    an accused process of their own per evaluation. A worker that outlives a request's
    `timeout_s` is killed with its descendants (a `timeout` result), one that dies gives a
    `runtime_error`; either way the next request gets a fresh worker. The loop ends when stdin
    closes."""
    try:
        channel = ResultChannel.claim(result_fd)
    except OSError as e:
        print(f"ksearch_harness: --result-fd {result_fd} is not open: {e}", file=sys.stderr)
        return 2
    stdin = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the worker inherits /dev/null, never the request stream
    os.close(null)
    worker: _Worker | None = None
    while True:
        line = stdin.readline()
        if not line:
            break
        if not line.strip():
            continue

        def handle(answer: _Answer) -> dict:
            nonlocal worker
            obj = protocol.decode_request(line)
            answer.nonce = protocol.request_nonce(obj)
            answer.op = op = str(obj.get("op"))
            if op not in SERVED_OPS:
                raise TaskError(f"op `{op}` is not served by a persistent judge "
                                f"(only {', '.join(SERVED_OPS)})")
            req = protocol.parse_request(obj, op)
            answer.log_to(*_log_path(req))
            if worker is None or not worker.alive():
                worker = _Worker.fork()
            result = worker.run(req, obj, answer.log_path)
            if not worker.alive():
                worker = None
            return result

        def judge() -> dict | None:
            return {"judge": worker.describe()} if worker is not None else None

        if not _Answer("evaluate").send(channel, handle, judge):
            return 2
    if worker is not None:
        worker.stop()
    channel.close()
    return 0


class _Worker:
    """The persistent judge's long-lived worker: requests in through one pipe (one JSON line
    each), results out through another (one line each)."""

    def __init__(self, pid: int, to_worker: int, from_worker: int, scratch_dir: str):
        self.pid, self.to_worker, self.from_worker = pid, to_worker, from_worker
        self.scratch_dir = scratch_dir
        self.served = 0
        self.dead = False
        self._buf = bytearray()

    @classmethod
    def fork(cls) -> "_Worker":
        req_r, req_w = os.pipe()
        res_r, res_w = os.pipe()
        where = scratch.make()
        pid = os.fork()
        if pid == 0:  # worker
            try:
                scratch.use(where)
                os.close(req_w)
                os.close(res_r)
                rfd, wfd = protocol.move_fd_high(req_r), protocol.move_fd_high(res_w)
                lo, hi = min(rfd, wfd), max(rfd, wfd)
                os.closerange(3, lo)
                os.closerange(lo + 1, hi)
                os.closerange(hi + 1, _fd_limit())
                from .worker import child_loop
                child_loop(rfd, wfd)
            finally:
                os._exit(70)
        os.close(req_r)
        os.close(res_w)
        return cls(pid, req_w, res_r, where)

    def alive(self) -> bool:
        if self.dead:
            return False
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            done = self.pid
        if done:
            self._close()
        return not self.dead

    def describe(self) -> dict:
        return {"pid": self.pid, "served": self.served, "persistent": True}

    def run(self, req: Request, obj: dict, log_path: str) -> dict:
        deadline = time.monotonic() + req.timeout_s
        message = protocol.encode_result({"request": obj, "log": log_path})
        try:
            protocol.write_all(self.to_worker, message)
        except OSError:
            self.kill()
            return protocol.error_result(req.op, req.nonce, CandidateRuntimeError(
                "the judge's worker was gone before the request reached it"))
        line, status, timed_out = self._read_line(deadline)
        self.served += 1
        if timed_out:
            self.kill()
            return protocol.error_result(req.op, req.nonce, _Timeout(
                f"evaluation exceeded timeout_s={req.timeout_s:g}; the worker was killed"))
        if line is None:
            self.dead = True
            self._close()
            return _judge(req, b"", status)
        if self._buf:
            # More than one line for one request: something other than the harness wrote.
            self.kill()
            return _judge(req, line + bytes(self._buf), None)
        return _judge(req, line, None)

    def _read_line(self, deadline: float) -> tuple[bytes | None, int | None, bool]:
        """The worker's next result line; (None, exit status, False) when it exited first."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl + 1])
                del self._buf[:nl + 1]
                return line, None, False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, None, True
            ready, _, _ = select.select([self.from_worker], [], [], min(remaining, POLL_S))
            if ready:
                chunk = os.read(self.from_worker, 1 << 16)
                if chunk:
                    if len(self._buf) < MAX_RESULT_BYTES:
                        self._buf += chunk
                    continue
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self._buf += _drain(self.from_worker)
                nl = self._buf.find(b"\n")
                if nl >= 0:
                    continue
                _kill_group_leftovers()
                return None, status, False

    def kill(self) -> None:
        if not self.dead:
            _kill_tree(self.pid)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            _kill_group_leftovers()
        self.dead = True
        self._close()

    def stop(self) -> None:
        """Ends the worker: its request pipe closes, and it exits."""
        if not self.dead:
            try:
                os.close(self.to_worker)
            except OSError:
                pass
            self.to_worker = -1
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                done, _ = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    break
                time.sleep(POLL_S)
            else:
                _kill_tree(self.pid)
        self.dead = True
        self._close()

    def _close(self) -> None:
        """After the worker has ended: its pipes, and everything it started beneath its
        scratch directory (an accused's directory, a spare's), whether or not it got to clean
        up."""
        self.dead = True
        for fd in (self.to_worker, self.from_worker):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.to_worker = self.from_worker = -1
        scratch.remove(self.scratch_dir)
        self.scratch_dir = ""


def _temp_log() -> str:
    fd, path = tempfile.mkstemp(prefix="ksearch-harness-", suffix=".log")
    os.close(fd)
    return path


def _log_path(req: Request) -> tuple[str, bool]:
    if req.build_dir is None:
        return _temp_log(), True
    try:
        os.makedirs(req.build_dir, exist_ok=True)
    except OSError as e:
        raise TaskError(f"build_dir: cannot create {req.build_dir}: {e}") from None
    return os.path.join(req.build_dir, f"harness-{req.op}.log"), False


def run_worker(req: Request) -> dict:
    deadline = time.monotonic() + req.timeout_s
    r, w = os.pipe()
    where = scratch.make()
    pid = os.fork()
    if pid == 0:  # worker
        try:
            scratch.use(where)
            os.close(r)
            fd = protocol.move_fd_high(w)
            # The worker keeps fd 0-2 and its pipe, nothing else: in particular not the real
            # result channel, which only this process may write.
            os.closerange(3, fd)
            os.closerange(fd + 1, _fd_limit())
            from .worker import child_main
            child_main(req, fd)
        finally:
            os._exit(70)
    os.close(w)
    try:
        data, status, timed_out = _collect(pid, r, deadline)
    finally:
        scratch.remove(where)  # the worker is gone: what it started beneath goes too
    os.close(r)
    if timed_out:
        return protocol.error_result(req.op, req.nonce, _Timeout(
            f"evaluation exceeded timeout_s={req.timeout_s:g}; the worker was killed"))
    return _judge(req, data, status)


def _fd_limit() -> int:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        soft = 1024
    return 65536 if soft in (-1,) or soft > 65536 else soft


class _Timeout(HarnessError):
    status = "timeout"


def _collect(pid: int, r: int, deadline: float) -> tuple[bytes, int | None, bool]:
    """Reads the worker's pipe until the worker exits or the deadline passes."""
    buf = bytearray()
    eof = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _kill_tree(pid)
            return bytes(buf), None, True
        if not eof:
            ready, _, _ = select.select([r], [], [], min(remaining, POLL_S))
            if ready:
                chunk = os.read(r, 1 << 16)
                if chunk:
                    if len(buf) < MAX_RESULT_BYTES:
                        buf += chunk
                else:
                    eof = True
        else:
            time.sleep(min(remaining, POLL_S))
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            buf += _drain(r)
            _kill_group_leftovers()
            return bytes(buf), status, False


def _drain(r: int) -> bytes:
    os.set_blocking(r, False)
    out = bytearray()
    while len(out) < MAX_RESULT_BYTES:
        try:
            chunk = os.read(r, 1 << 16)
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                break
            raise
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _judge(req: Request, data: bytes, status: int | None) -> dict:
    died = ""
    if status is not None:
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = f"signal {sig}"
            died = f"the worker was killed by {name}"
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0:
            code = os.WEXITSTATUS(status)
            if code == 3:
                return protocol.error_result(req.op, req.nonce, Violation(
                    "result_channel", "the worker could not write its result: the candidate "
                    "closed or replaced the result pipe"))
            died = f"the worker exited with status {code}"
    if not data:
        return protocol.error_result(req.op, req.nonce, CandidateRuntimeError(
            f"{died or 'the worker exited'} without a result (the candidate crashed or exited; "
            f"see log_tail)"))
    lines = data.split(b"\n")
    problem = None
    if not data.endswith(b"\n") or len(lines) != 2:
        problem = f"{len([ln for ln in lines if ln])} line(s) where exactly one was expected"
    else:
        try:
            result = protocol.decode_request(lines[0])
        except HarnessError:
            result, problem = None, "a line that is not a JSON object"
        if result is not None and result.get("nonce") != req.nonce:
            problem = "a result without the request nonce"
        if result is not None and problem is None:
            return result
    return protocol.error_result(req.op, req.nonce, Violation(
        "result_channel", f"the worker's result channel carried {problem}: something other "
        f"than the harness wrote to it"))


def _kill_tree(pid: int) -> None:
    """SIGKILLs `pid` and every descendant, found through /proc. The supervisor may share its
    process group with its caller, so a group kill is not an option here."""
    for p in [pid] + _descendants(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
    _kill_group_leftovers()


def _kill_group_leftovers() -> None:
    """A process the candidate started (despite the static checks) is reparented when the
    worker dies, so it is no longer a descendant. When ksearch started the harness as a group
    leader, as it does, every other member of the group is such a leftover."""
    me = os.getpid()
    if os.getpgrp() != me:
        return
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            pgrp = int(stat[stat.rfind(")") + 2:].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        if pgrp == me:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except OSError:
                pass


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [root]
    while stack:
        for c in children.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out
