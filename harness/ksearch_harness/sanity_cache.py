"""The task sanity check's verdict, remembered across evaluations of the same task.

`core.sanity_check` asks whether a task can tell a working kernel from one that does nothing:
it draws inputs for every workload and runs the reference (and the baseline) on them. That is a
property of the task, not of a candidate, yet every evaluation paid for it: about 9 s of each
70-80 s attention evaluation on the H200, most of it drawing 32 MiB inputs on the host. With
`KSEARCH_HARNESS_SANITY_CACHE` naming a directory (ksearch sets it to its cache directory), an
evaluation skips the check of each workload that passed before.

What a verdict is keyed on, per workload: every regular file of the task directory, the
request's task description and tolerances, the workload's own description, the backend, the
platform, the installed numpy, torch and mlx versions, and every source file of this harness
package, so that a change to any of them checks again. Left out on purpose: the seed (the check asks whether all-zero or constant outputs
pass the tolerance, a property of the reference's outputs, not of one draw) and the GPU model.
Only passes are remembered; a failing task is checked (and reported) every time.

Trust: candidate code runs in the accused process, whose sandbox lets it write only in its own
temporary directory (docs/security.md, `landlock`), so it cannot plant a pass here; where that
layer is missing (macOS, older kernels) it could, and would gain nothing for itself (the check
runs before the candidate is built). The cache is a convenience for trusted tasks, not a
defence.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

ENV = "KSEARCH_HARNESS_SANITY_CACHE"
_DISTRIBUTIONS = ("numpy", "torch", "mlx")
_HARNESS = Path(__file__).resolve().parent


def _directory() -> Path | None:
    raw = os.environ.get(ENV, "").strip()
    return Path(raw) if raw else None


def _hash_tree(h: "hashlib._Hash", root: Path, pattern: str) -> None:
    for path in sorted(root.rglob(pattern)):
        if "__pycache__" in path.parts or not path.is_file() or path.is_symlink():
            continue
        data = path.read_bytes()
        name = str(path.relative_to(root)).encode()
        # Lengths first: no two different trees hash the same bytes.
        h.update(len(name).to_bytes(8, "little") + name)
        h.update(len(data).to_bytes(8, "little") + data)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def keys(raw_request: dict[str, Any], task_dir: str) -> dict[str, str] | None:
    """The verdict's key for each workload of the request, by name, or None when nothing is
    cached (no directory, a task file that cannot be read, a workload without a name: then
    the check simply runs). A verdict is per workload, so an evaluation of more workloads
    than an earlier one (a winner's re-check adds the held-out ones) checks only those it
    adds."""
    if _directory() is None:
        return None
    h = hashlib.sha256()
    try:
        _hash_tree(h, Path(task_dir), "*")
        _hash_tree(h, _HARNESS, "*.py")
    except OSError:
        return None
    described = {k: raw_request.get(k) for k in ("backend", "task", "tolerance")}
    described["platform"] = [sys.platform, platform.machine(), platform.python_version()]
    described["versions"] = {d: _version(d) for d in _DISTRIBUTIONS}
    h.update(json.dumps(described, sort_keys=True, default=str).encode())
    common = h.digest()
    out: dict[str, str] = {}
    for w in raw_request.get("workloads") or []:
        name = w.get("name") if isinstance(w, dict) else None
        if not isinstance(name, str) or name in out:
            return None
        one = hashlib.sha256(common)
        one.update(json.dumps(w, sort_keys=True, default=str).encode())
        out[name] = one.hexdigest()
    return out


def known_sane(k: str | None) -> bool:
    d = _directory()
    return k is not None and d is not None and (d / f"{k}.json").is_file()


def remember(k: str | None) -> None:
    """Records a pass. Best effort: a cache that cannot be written only costs the next check."""
    d = _directory()
    if k is None or d is None:
        return
    tmp = None
    try:
        d.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed into place, so a concurrent reader never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".sanity-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"passed": True}, f)
        os.replace(tmp, d / f"{k}.json")
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
