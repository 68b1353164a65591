"""Compilers run on candidate source in a sandbox of their own.

A compiler is not candidate code, but it reads whatever the source names: `#include` of a path
built by a macro reaches files the static checks never see (another process's environment under
/proc, a key file) and prints them in its error messages, which travel back to the proposer.
So the compiler runs like the accused does (sandbox.py): its own namespaces (no other process
is visible), uid 65534, no network, writes only in a fresh directory of its own, and bounded
memory, processes and time; unlike the accused it may fork and exec (cc1, as, ld, ptxas). The
source is copied in, the artifact copied out, the directory removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import sandbox

# A compiler's resources: memory (nvcc on a large kernel needs a few GiB), tasks (the driver and
# its tools), output files.
MEMORY_BYTES = 8 << 30
TASKS = 256
FILE_BYTES = 1 << 30


@dataclass
class Compiled:
    ok: bool
    log: str
    seconds: float
    layers: list[dict[str, Any]] = field(default_factory=list)


def compile_confined(make_cmd: Callable[[str, str], list[str]], *, source: bytes,
                     source_name: str, output: str, timeout_s: float, mode: str,
                     reveal: tuple[str, ...] = ()) -> Compiled:
    """Runs `make_cmd(source_path, output_path)` in a sandbox where `source` is the only input
    of its own; on success the artifact is moved to `output`. A timeout is a failed build."""
    workdir = tempfile.mkdtemp(prefix="ksearch-build-")
    try:
        src = os.path.join(workdir, source_name)
        out = os.path.join(workdir, "artifact.out")
        with open(src, "wb") as fh:
            fh.write(source)
        os.chmod(src, 0o644)
        cmd = make_cmd(src, out)
        policy = sandbox.Policy(
            workdir=workdir, allow_exec=True, allow_fork=True, mode=mode,
            memory_bytes=MEMORY_BYTES, tasks=TASKS, file_bytes=FILE_BYTES,
            cpu_seconds=int(timeout_s) * 4 + 10,
            reveal=tuple(dict.fromkeys(sandbox.interpreter_paths() + reveal
                                       + tuple(_tool_roots(cmd[0])))))
        env = compiler_environment(workdir)
        t0 = time.monotonic()
        try:
            proc = sandbox.launch(cmd, policy, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  cwd=workdir)
        except sandbox.SandboxUnavailable as e:
            from .protocol import TaskError
            raise TaskError(f"--sandbox require: the compiler cannot be confined here: {e}"
                            ) from None
        except OSError as e:
            return Compiled(False, f"cannot run the compiler `{cmd[0]}`: {e}",
                            time.monotonic() - t0)
        layers = [x.to_json() for x in proc.report]
        try:
            data, _ = proc.communicate(timeout=timeout_s)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            return Compiled(False, f"the compiler timed out after {timeout_s:.0f} s",
                            time.monotonic() - t0, layers)
        log = (data or b"").decode("utf-8", "replace").replace(workdir + "/", "")
        ok = code == 0 and os.path.isfile(out)
        if ok:
            tmp = f"{output}.tmp{os.getpid()}"
            shutil.copyfile(out, tmp)
            os.chmod(tmp, 0o755)
            os.replace(tmp, output)
        return Compiled(ok, log, time.monotonic() - t0, layers)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


_COMPILER_ENV = ("PATH", "LANG", "LC_ALL", "CC", "CXX", "CUDA_HOME", "CUDA_PATH",
                 "LD_LIBRARY_PATH", "CPATH", "LIBRARY_PATH", "C_INCLUDE_PATH",
                 "CPLUS_INCLUDE_PATH")


def compiler_environment(workdir: str) -> dict[str, str]:
    """What a compiler needs from the environment and nothing else: a source that makes the
    compiler print its own environment finds no secret there."""
    env = {k: os.environ[k] for k in _COMPILER_ENV if k in os.environ}
    env.update(HOME=workdir, TMPDIR=workdir)
    return env


def _tool_roots(program: str) -> list[str]:
    """The installation a compiler lives in (`<root>/bin/nvcc` -> `<root>`), which it reads its
    headers and libraries from; revealed to the sandbox's uid when a closed directory hides it."""
    path = shutil.which(program) or program
    real = os.path.realpath(path)
    if os.path.basename(os.path.dirname(real)) == "bin":
        return [os.path.dirname(os.path.dirname(real))]
    return [os.path.dirname(real)]
