"""Where a judge's worker puts the directories and files of the processes it starts (each
accused process's working directory, a spare accused's log): a directory the supervisor makes
for that worker before forking it and removes once the worker has ended, however it ended, so
nothing a candidate wrote outlives its worker, not even when a timeout kills the worker before
it could clean up. Standard library only (the supervisor imports it).

A supervisor that is itself killed (ksearch's own timeout kills the harness's whole process
group) cannot remove its directories: their names carry the supervisor's pid, and the next
supervisor to start removes those whose supervisor is gone (`sweep`). That assumes the
temporary directory is not shared with harnesses in another pid namespace, whose live
supervisors would look gone from here.

Without a supervisor (tests calling worker.execute in their own process) the system's temporary
directory is used, and each evaluation removes what it made.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

PREFIX = "ksearch-judge-"
_OWNER = re.compile(re.escape(PREFIX) + r"(\d+)-")
_dir: str | None = None


def make() -> str:
    """A new scratch directory (the supervisor's side), named after this process: traversable
    by the sandbox's uid, which owns the accused's working directory beneath it. Sweeps the
    directories of supervisors that are gone first."""
    sweep()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    os.chmod(path, 0o711)
    return path


def sweep(base: str | None = None) -> list[str]:
    """Removes the scratch directories beneath `base` (the temporary directory) whose
    supervisor process no longer exists; returns their names."""
    base = base or tempfile.gettempdir()
    gone = []
    try:
        names = os.listdir(base)
    except OSError:
        return gone
    for name in names:
        m = _OWNER.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process: alive
    return True


def use(path: str | None) -> None:
    """This process (a worker, right after the fork) puts what it starts beneath `path`."""
    global _dir
    _dir = path


def parent() -> str | None:
    """The directory to create beneath (None: the system's temporary directory)."""
    return _dir if _dir and os.path.isdir(_dir) else None


def remove(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)
