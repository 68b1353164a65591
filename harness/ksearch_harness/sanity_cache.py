"""The task sanity check's verdict, remembered across evaluations of the same task.

`core.sanity_check` asks whether a task can tell a working kernel from one that does nothing:
it draws inputs for every workload and runs the reference (and the baseline) on them. That is a
property of the task, not of a candidate, yet every evaluation paid for it: about 9 s of each
70-80 s attention evaluation on the H200, most of it drawing 32 MiB inputs on the host. With
`KSEARCH_HARNESS_SANITY_CACHE` naming a directory (ksearch sets it to its cache directory), an
evaluation whose task passed before skips the check.

What a verdict is keyed on: every Python file of the task directory, the request's task and
workload descriptions and tolerances, the backend, the numpy/torch/mlx versions in the process,
and the source of `sanity_check` itself, so that a change to any of them checks again. Only
passes are remembered; a failing task is checked (and reported) every time.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ENV = "KSEARCH_HARNESS_SANITY_CACHE"
_LIBRARIES = ("numpy", "torch", "mlx.core")


def _directory() -> Path | None:
    raw = os.environ.get(ENV, "").strip()
    return Path(raw) if raw else None


def key(raw_request: dict[str, Any], task_dir: str, check: Callable[..., Any]) -> str:
    h = hashlib.sha256()
    for path in sorted(Path(task_dir).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(str(path.relative_to(task_dir)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    described = {k: raw_request.get(k) for k in ("backend", "task", "workloads", "tolerance")}
    h.update(json.dumps(described, sort_keys=True, default=str).encode())
    versions = {name: getattr(sys.modules.get(name), "__version__", None) for name in _LIBRARIES}
    h.update(json.dumps(versions, sort_keys=True).encode())
    h.update(inspect.getsource(check).encode())
    return h.hexdigest()


def known_sane(k: str) -> bool:
    d = _directory()
    return d is not None and (d / f"{k}.json").is_file()


def remember(k: str, entries: list[dict[str, Any]]) -> None:
    """Records a pass. Best effort: a cache that cannot be written only costs the next check."""
    d = _directory()
    if d is None:
        return
    try:
        d.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed into place, so a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".sanity-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"entries": entries}, f)
        os.replace(tmp, d / f"{k}.json")
    except OSError:
        pass
