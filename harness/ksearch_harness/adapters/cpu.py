"""CPU backend: C or C++ compiled into a shared library, called through ctypes on numpy
buffers."""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import shlex
import subprocess
from typing import Any, Callable

import numpy as np

from .. import cache_flush, dtypes, parallel
from ..protocol import Entry, Request, TaskError, TensorSpec
from . import Adapter, BuildFailed, BuildInfo

BASE_FLAGS = ["-O3", "-march=native", "-fPIC", "-shared"]
STD_FLAG = {"c": "-std=c11", "c++": "-std=c++17"}
OPENMP_FLAG = "-fopenmp"
ALIGN = 64  # bytes: a cache line, and the widest SIMD load a kernel may assume
MAX_LOG = 20000


@functools.lru_cache(maxsize=None)
def compiler_version(compiler: tuple[str, ...]) -> str:
    try:
        out = subprocess.run([*compiler, "--version"], capture_output=True, text=True,
                             timeout=20, stdin=subprocess.DEVNULL)
        first = (out.stdout or out.stderr).strip().splitlines()
        return first[0] if first else " ".join(compiler)
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def compiler_for(language: str) -> list[str]:
    if language == "c++":
        return shlex.split(os.environ.get("CXX") or "c++")
    return shlex.split(os.environ.get("CC") or "cc")


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    offset = (-raw.ctypes.data) % ALIGN
    return raw[offset:offset + nbytes].view(dtype).reshape(shape)


class CpuAdapter(Adapter):
    name = "cpu"

    def __init__(self, request: Request):
        super().__init__(request)
        self._fn: Any = None
        self._lib: Any = None
        self._entry: Entry | None = None
        self._compiler: list[str] = []

    # -- build ---------------------------------------------------------------------------

    def build(self, source: bytes) -> BuildInfo:
        req = self.request
        assert req.candidate is not None and req.build_dir is not None
        language = req.candidate.language
        if language not in STD_FLAG:
            raise BuildFailed(f"the cpu backend compiles C or C++, not `{language}`")
        compiler = compiler_for(language)
        if not compiler:
            raise BuildFailed("empty compiler command ($CC / $CXX)")
        self._compiler = compiler
        version = compiler_version(tuple(compiler))
        flags = BASE_FLAGS + [STD_FLAG[language], OPENMP_FLAG]
        suffix = ".c" if language == "c" else ".cpp"
        key = hashlib.sha256(b"\0".join([source, " ".join(compiler + flags).encode(),
                                         version.encode()])).hexdigest()[:20]
        os.makedirs(req.build_dir, exist_ok=True)
        src_path = os.path.join(req.build_dir, f"candidate-{key}{suffix}")
        artifact = os.path.join(req.build_dir, f"candidate-{key}.so")
        meta_path = os.path.join(req.build_dir, f"candidate-{key}.json")

        cached = _read_meta(meta_path, key)
        if cached is not None and os.path.isfile(artifact):
            return BuildInfo(compiler=version, command=cached["command"], seconds=0.0,
                             log=cached.get("log", ""), artifact=artifact, cached=True)

        # The compiler reads a private copy, so the bytes the static checks passed are the
        # bytes that get compiled even if the candidate file changes meanwhile; it runs in a
        # sandbox (toolchain.py) and sees only that copy.
        with open(src_path, "wb") as fh:
            fh.write(source)
        timeout = max(5.0, min(120.0, req.timeout_s * 0.8))
        name = os.path.basename(src_path)
        info, ok = self._compile(compiler + flags, name, source, version, artifact, timeout)
        if not ok and "openmp" in info.log.lower():
            # Compilers without OpenMP (Apple clang) still build kernels that do not use it.
            flags = [f for f in flags if f != OPENMP_FLAG]
            info, ok = self._compile(compiler + flags, name, source, version, artifact,
                                     timeout)
        if not ok:
            raise BuildFailed(_first_error(info.log) or "compilation failed", info)
        with open(meta_path, "w") as fh:
            json.dump({"key": key, "command": info.command, "log": info.log}, fh)
        return info

    def _compile(self, base: list[str], source_name: str, source: bytes, version: str,
                 artifact: str, timeout: float) -> tuple[BuildInfo, bool]:
        from ..toolchain import compile_confined
        done = compile_confined(lambda src, out: base + [src, "-o", out, "-lm"],
                                source=source, source_name=source_name, output=artifact,
                                timeout_s=timeout, mode=self.request.sandbox)
        log = done.log
        if len(log) > MAX_LOG:
            log = log[:MAX_LOG // 2] + "\n[...]\n" + log[-MAX_LOG // 2:]
        command = base + [source_name, "-o", artifact, "-lm"]
        return BuildInfo(compiler=version, command=command, seconds=done.seconds, log=log,
                         artifact=artifact, extra={"sandbox": done.layers}), done.ok

    def load(self, build: BuildInfo, entry: Entry) -> None:
        try:
            # RTLD_LOCAL: the candidate's symbols never take part in resolving anyone else's,
            # so defining e.g. clock_gettime cannot redirect the harness's clock.
            self._lib = ctypes.CDLL(build.artifact, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as e:
            raise BuildFailed(f"cannot load the compiled library: {e}", build) from None
        try:
            fn = getattr(self._lib, entry.symbol)
        except AttributeError:
            raise BuildFailed(f"the library does not export `{entry.symbol}` (C++ sources "
                              f"need extern \"C\")", build) from None
        fn.restype = None
        self._fn = fn
        self._entry = entry

    # -- buffers and calls ---------------------------------------------------------------

    def alloc(self, spec: TensorSpec) -> np.ndarray:
        return aligned_empty(spec.shape, dtypes.get(spec.dtype).storage)

    def upload(self, buf: np.ndarray, host: np.ndarray) -> None:
        np.copyto(buf, host, casting="no")

    def to_host(self, buf: np.ndarray) -> np.ndarray:
        return parallel.copy(buf)

    def call(self, inputs, outputs, params) -> None:
        self.bind(inputs, outputs, params)()

    def bind(self, inputs: dict[str, np.ndarray], outputs: dict[str, np.ndarray],
             params: dict[str, Any]) -> Callable[[], None]:
        assert self._fn is not None and self._entry is not None, "load() first"
        argtypes: list[Any] = []
        values: list[Any] = []
        for name in self._entry.args:
            if name in inputs or name in outputs:
                arr = inputs[name] if name in inputs else outputs[name]
                argtypes.append(ctypes.c_void_p)
                values.append(ctypes.c_void_p(arr.ctypes.data))
            elif name in params and isinstance(params[name], (bool, int)):
                argtypes.append(ctypes.c_int64)
                values.append(ctypes.c_int64(int(params[name])))
            elif name in params and isinstance(params[name], float):
                argtypes.append(ctypes.c_double)
                values.append(ctypes.c_double(params[name]))
            else:
                raise TaskError(f"entry argument `{name}` is not a tensor or numeric parameter")
        fn = self._fn
        fn.argtypes = argtypes
        args = tuple(values)
        return lambda: fn(*args)

    def flush_cache(self) -> None:
        # On every CPU the candidate may run on, not only the judge's (cache_flush.py).
        cache_flush.flusher(self.request.timing.flush_bytes).flush()

    def environment(self) -> dict[str, Any]:
        if not self._compiler:
            return {}
        return {"compiler": compiler_version(tuple(self._compiler))}


def _read_meta(path: str, key: str) -> dict | None:
    try:
        with open(path) as fh:
            meta = json.load(fh)
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("key") == key else None


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if "error" in line.lower():
            return line.strip()[:500]
    lines = [ln for ln in log.strip().splitlines() if ln.strip()]
    return lines[0][:500] if lines else ""
