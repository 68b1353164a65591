"""An accused process started ahead of the evaluation that will use it (persistent judge, GPU
backends only).

Starting an accused costs seconds on a GPU (its imports, its CUDA context, the lock-down), all
before the candidate's first call; on the cpu backend it costs a tenth of a second, and core.py
starts no spare there. A persistent judge (supervisor.serve_loop) starts the next
evaluation's accused while the current evaluation checks its candidate, so the next one finds
it ready. The spare is a fresh process that has never loaded candidate code: it gets its arena,
its artifact and its buffers from the evaluation that takes it, exactly as one started then
would. It is taken only by a request whose sandbox it was started with (the key: backend,
sandbox mode, readable paths, limits).

It never runs while anything is timed: an evaluation stops its spare where it is (SIGSTOP)
before its timed calls and lets it go on afterwards (`pause`, `resume`), and so does the
yardstick op; a start-up stopped half-way holds no CPU and queues no device work. (Waiting
for the spare to be ready instead cost an evaluation on the H200 seconds: a GPU accused's
start-up was longer than the checks it overlapped.) A spare that is not taken is killed and
its directory removed: when a request needs another key, and when the judge ends (`close`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Started:
    """A spare: the process, its working directory, and the file its output goes to (the
    request that takes it copies that file into its own log: the request being served when
    the spare started has its own log)."""
    process: Any
    workdir: str
    log: str


# `0`: no spares (every evaluation starts its own accused, as a one-shot harness does).
ENV = "KSEARCH_HARNESS_SPARE_ACCUSED"
_enabled = False
_key: tuple | None = None
_spare: Started | None = None
_paused = False


def enable(on: bool = True) -> None:
    """Only a persistent judge's worker keeps a spare (worker.child_loop): a one-shot harness
    would start one that nobody takes."""
    global _enabled
    _enabled = on and os.environ.get(ENV, "").strip() != "0"
    if not _enabled:
        close()


def enabled() -> bool:
    return _enabled


def take(key: tuple) -> Started | None:
    """The spare when it was started for `key` and is still alive; None otherwise (a spare
    for another key is discarded). The caller owns what it takes (process, directory, log)."""
    global _spare, _key
    if _spare is None:
        return None
    resume()
    if key != _key or _spare.process.dead or not _alive(_spare.process):
        close()
        return None
    got, _spare, _key = _spare, None, None
    return got


def start(key: tuple, factory: Callable[[], Started]) -> None:
    """Starts a spare for `key`, replacing any other; nothing when spares are off. A failure
    to start one is not an error: the next evaluation starts its own."""
    global _spare, _key
    if not _enabled:
        return
    close()
    try:
        _spare = factory()
    except Exception:  # noqa: BLE001 - a spare is an optimisation
        _spare = None
        return
    _key = key


def pause() -> None:
    """Stops the spare (SIGSTOP, every thread) unless it is ready, and so stopped already:
    nothing of its start-up runs until `resume`."""
    global _paused
    if _spare is None or _paused or _spare.process.stopped:
        return
    try:
        _spare.process.stop()
        _paused = True
    except Exception:  # noqa: BLE001 - a spare that cannot be stopped is not kept
        close()


def resume() -> None:
    """Lets a spare `pause` stopped go on starting."""
    global _paused
    if _spare is None or not _paused:
        return
    _paused = False
    try:
        _spare.process.cont()
    except Exception:  # noqa: BLE001
        close()


def discard(spare: Started) -> None:
    """Kills a spare's process and removes its directory and log."""
    try:
        spare.process.kill()
    except Exception:  # noqa: BLE001
        pass
    shutil.rmtree(spare.workdir, ignore_errors=True)
    try:
        os.unlink(spare.log)
    except OSError:
        pass


def close() -> None:
    """Discards the spare, if any."""
    global _spare, _key, _paused
    if _spare is not None:
        discard(_spare)
    _spare, _key, _paused = None, None, False


def _alive(process: Any) -> bool:
    try:
        return bool(process._alive())
    except Exception:  # noqa: BLE001
        return False
