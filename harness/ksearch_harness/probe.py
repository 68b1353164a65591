"""The `probe` op: what this machine offers to ksearch (used by `ksearch doctor`). Every item
is collected on its own; a missing tool is reported as absent, never as a failure."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shlex
import shutil
import subprocess
from typing import Any

from . import PROTOCOL_VERSION, __version__, machine


def _first_line(cmd: list[str]) -> str | None:
    if not cmd or shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=15,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (out.stdout or out.stderr).strip()
    if out.returncode != 0 or not text:
        return None
    return text.splitlines()[0].strip()


def _nvcc_version() -> str | None:
    if shutil.which("nvcc") is None:
        return None
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=15,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    release = [ln for ln in lines if "release" in ln]
    return (release or lines or [None])[-1]


def _package_version(name: str) -> str | None:
    """Version of an installed package, without importing it (torch takes seconds)."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip().startswith("GPU")]


def _safe(fn, *args) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - probe never fails
        return f"error: {type(e).__name__}: {e}"


def _backends() -> list[str]:
    from .adapters import available_backends
    return available_backends()


def collect() -> dict[str, Any]:
    cc = shlex.split(os.environ.get("CC") or "cc")
    cxx = shlex.split(os.environ.get("CXX") or "c++")
    return {
        "harness_version": __version__,
        "protocol": PROTOCOL_VERSION,
        "python": _safe(lambda: __import__("platform").python_version()),
        "numpy": _safe(_package_version, "numpy"),
        "torch": _safe(_package_version, "torch"),
        "mlx": _safe(_package_version, "mlx"),
        "cc": _safe(_first_line, cc + ["--version"]),
        "cxx": _safe(_first_line, cxx + ["--version"]),
        "nvcc": _safe(_nvcc_version),
        "cpu_model": _safe(machine.cpu_model),
        "cores": _safe(machine.cores),
        "gpus": _safe(_gpus),
        "backends": _safe(_backends),
    }


def sandbox_probe() -> dict[str, Any]:
    """The sandbox an accused process of the cpu backend gets, tried: which layers are active
    and which forbidden things a confined process still managed (sandbox.probe)."""
    import tempfile
    from . import sandbox
    from .accused_client import accused_policy
    work = tempfile.mkdtemp(prefix="ksearch-sandbox-probe-")
    try:
        found = sandbox.probe(accused_policy("cpu", work, "best-effort", (), 0, 60))
    finally:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return {"layers": found.get("layers", []), "escapes": found.get("escapes", []),
            "ok": bool(found.get("ok")), "error": found.get("error")}


def run(nonce: str | None, with_sandbox: bool = False) -> dict[str, Any]:
    from .protocol import ResultBuilder
    out = ResultBuilder("probe", nonce)
    info = collect()
    if with_sandbox:
        info["sandbox"] = _safe(sandbox_probe)
    out.data["probe"] = info
    out.data["environment"] = {k: info[k] for k in ("cpu_model", "cores", "python", "numpy")}
    out.data["environment"]["hostname"] = _safe(lambda: __import__("socket").gethostname())
    return out.data
