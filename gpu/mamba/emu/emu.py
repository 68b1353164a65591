"""Builds a rendered variant of the selective-scan device code for the CPU emulation
(cuda_emu.h + driver.cpp, compiled by a C++20 compiler) and runs its kernels on numpy arrays.
Used by gpu/mamba/tests; needs g++ (or $CXX) with C++20 and <ucontext.h> (Linux, glibc)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
_DTYPES = {np.float16: 0, np.float32: 2}
_CACHE = Path(tempfile.gettempdir()) / "ksm-emu"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def compile_unit(unit: str, prefix: str, headers: tuple[str, ...], failure: str) -> Path:
    """A shared library of the C++ `unit` (which may include the emulation's `headers`),
    cached under a hash of the unit and those headers; a failed build raises RuntimeError
    with `failure` and the compiler's last output."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or $CXX)")
    digest = hashlib.sha256(unit.encode() + b"".join((HERE / h).read_bytes() for h in headers))
    key = digest.hexdigest()[:16]
    _CACHE.mkdir(exist_ok=True)
    lib = _CACHE / f"{prefix}_{key}.so"
    if not lib.exists():
        src = _CACHE / f"{prefix}_{key}.cpp"
        src.write_text(unit)
        tmp = _CACHE / f"{prefix}_{key}.{os.getpid()}.so"
        proc = subprocess.run([cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-w", "-I",
                               str(HERE), str(src), "-o", str(tmp)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{failure}:\n{proc.stderr[-4000:]}")
        tmp.replace(lib)
    return lib


def build_many(variants: list[tuple[str, bool, bool]]) -> list["EmuVariant"]:
    """Compiles (device code, fused, decode) variants into one library (one compiler run: the
    headers are parsed once) and returns a handle per variant."""
    parts = ['#include "cuda_emu.h"']
    for i, (code, fused, decode) in enumerate(variants):
        parts.append(f"#define KSM_TAG v{i}\n#define KSM_FUSED {int(fused)}\n"
                     f"#define KSM_DECODE {int(decode)}\nnamespace v{i} {{\n{code}\n"
                     f'#include "driver.cpp"\n}}\n#undef KSM_TAG\n#undef KSM_FUSED\n#undef KSM_DECODE')
    unit = "\n".join(parts) + "\n"
    lib = compile_unit(unit, "ksm", ("cuda_emu.h", "driver.cpp"), "emulation build failed")
    handle = ctypes.CDLL(str(lib))
    return [EmuVariant(handle, f"v{i}", decode) for i, (_, _, decode) in enumerate(variants)]


class EmuVariant:
    """One rendered variant inside a library built by build_many."""

    def __init__(self, lib, tag: str, decode: bool):
        self.lib = lib
        self.tag = tag
        self.decode_available = decode

    @classmethod
    def build(cls, device_code: str, fused: bool, decode: bool) -> "EmuVariant":
        return build_many([(device_code, fused, decode)])[0]

    def _fn(self, name):
        return getattr(self.lib, f"{name}_{self.tag}")

    def scan(self, inp: dict, *, dtype=np.float32, channel_last=False, has_z=True,
             softplus=True, with_state=False):
        """(y, h_last or None): the kernels run on copies of `inp` cast to `dtype` (u, delta,
        B, C, z, y); A, D, delta_bias and the state stay float32."""
        io = {k: np.ascontiguousarray(inp[k], dtype=dtype) for k in ("u", "delta", "B", "C", "z")}
        f32 = {k: np.ascontiguousarray(inp[k], dtype=np.float32) for k in ("A", "D", "delta_bias")}
        if channel_last:
            batch, L, dim = io["u"].shape
        else:
            batch, dim, L = io["u"].shape
        N = f32["A"].shape[1]
        y = np.full(io["u"].shape, np.nan, dtype=dtype)
        h0 = np.ascontiguousarray(inp["h0"], dtype=np.float32) if "h0" in inp else None
        h_last = np.full((batch, dim, N), np.nan, dtype=np.float32) if with_state else None
        ptr = lambda a: None if a is None else a.ctypes.data_as(ctypes.c_void_p)
        fn = self._fn("emu_scan")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 11 + [ctypes.c_longlong] * 4 + [ctypes.c_int] * 3
        rc = fn(_DTYPES[dtype], ptr(io["u"]), ptr(io["delta"]), ptr(f32["A"]), ptr(io["B"]),
                ptr(io["C"]), ptr(f32["D"]), ptr(io["z"]), ptr(f32["delta_bias"]), ptr(y),
                ptr(h0), ptr(h_last), batch, dim, L, N, int(has_z), int(softplus),
                int(channel_last))
        if rc != 0:
            raise RuntimeError(f"emu_scan returned {rc}")
        return y, h_last

    def decode(self, inp: dict, *, dtype=np.float32, has_z=True, softplus=True):
        """One step: inp holds u, delta, z [batch, dim], B, C [batch, N], A, D, delta_bias, h0."""
        io = {k: np.ascontiguousarray(inp[k], dtype=dtype) for k in ("u", "delta", "B", "C", "z")}
        f32 = {k: np.ascontiguousarray(inp[k], dtype=np.float32)
               for k in ("A", "D", "delta_bias", "h0")}
        batch, dim = io["u"].shape
        N = f32["A"].shape[1]
        y = np.full((batch, dim), np.nan, dtype=dtype)
        h = np.full((batch, dim, N), np.nan, dtype=np.float32)
        ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
        fn = self._fn("emu_decode")
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 11 + [ctypes.c_longlong] * 3 + [ctypes.c_int] * 2
        rc = fn(_DTYPES[dtype], ptr(io["u"]), ptr(io["delta"]), ptr(f32["A"]), ptr(io["B"]),
                ptr(io["C"]), ptr(f32["D"]), ptr(io["z"]), ptr(f32["delta_bias"]), ptr(y),
                ptr(f32["h0"]), ptr(h), batch, dim, N, int(has_z), int(softplus))
        if rc != 0:
            raise RuntimeError(f"emu_decode returned {rc}")
        return y, h
