"""cuda backend: CUDA C++ compiled by nvcc into a shared library whose C entry point runs on the
stream it is given; buffers, the stream, events and the reference/baseline are PyTorch's.

Entry convention (docs/backends.md):

    extern "C" int <entry>(<args...>, void* stream)

tensor arguments are device pointers in `args` order (inputs `const void*`, outputs `void*`),
integer axes are `int64_t`, the current `cudaStream_t` comes last, and the return value is a
`cudaError_t` (0: success). `<entry>` may contain `{dtype}`, filled from the workload's `dtype`
parameter, so one library serves every dtype of a request.

What this adds to the checks of core.py:
- work that escapes the stream (a side stream, the legacy default stream): after each untimed
  call the outputs are copied on the harness's stream and only that stream is synchronized;
  if a device-wide synchronize then changes them, work ran elsewhere (`deferred_work`). Timed
  calls cannot afford the copy; there the host measures how long the device stays busy after
  the end event on the harness stream has completed (the wall time of the device-wide
  synchronize that follows it). Honest work leaves nothing behind; a long tail in most timed
  calls is the same verdict.
- sticky CUDA errors: any CUDA error seen after a candidate call makes the evaluation a
  `runtime_error` and marks the context dead; no CUDA call is made afterwards and the worker
  process ends with its result (ksearch starts a fresh process for the next candidate).
- timing: device-wide synchronize, start event on the harness stream, the call, end event,
  device-wide synchronize; an L2 flush (a write of at least twice the L2) before each call.

torch is imported when the adapter needs the device (load, timing), never at module import:
the build path (nvcc discovery, flags, ptxas report) works on machines without torch or a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .. import dtypes
from ..protocol import (CandidateRuntimeError, Entry, Request, TaskError, TensorSpec,
                        Violation)
from . import BuildFailed, BuildInfo
from .cpu import MAX_LOG, _first_error, _read_meta
from .device import (DeviceAdapter, cuda_error_line, resolve_entry, torch_from_host,
                     torch_to_host, torch_upload)

NVCC_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC"]


def split_compile_flag(cpus: int | None = None) -> str:
    """nvcc optimises a candidate's kernels (each template instantiation is one) on several
    threads: a quarter of the machine's CPUs, at least two. The machine code is the same as a
    one-thread build's (docs/results/evaluation-speed compares the kernels' .text sections);
    only the build is shorter, and the search waits for builds. Not all CPUs: builds written
    ahead run while another candidate is timed, whose launches need a CPU that is free. The
    CPUs are those this process may run on (its affinity), not all the machine has."""
    n = cpus if cpus is not None else _usable_cpus()
    return f"--split-compile={max(2, n // 4)}"


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 2
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 2


PTXAS_VERBOSE = ["-Xptxas", "-v"]
DEFAULT_ARCH = "sm_90a"
# KSEARCH_CUDA_ARCH is the documented override; ksearch passes only KSEARCH_HARNESS_* knobs
# through to the harness, so the second spelling reaches it from a ksearch run.
ARCH_ENV = ("KSEARCH_CUDA_ARCH", "KSEARCH_HARNESS_CUDA_ARCH")
NVCC_TIMEOUT_MAX_S = 300.0

# Escaped-work detection in timed calls: a call is suspicious when the device-wide synchronize
# after the harness stream's end event still waits longer than ESCAPE_TAIL_NS and longer than
# ESCAPE_TAIL_FRACTION of the stream's own time (an idle device answers in a few microseconds).
# The fraction is there for long calls: on the H200 the naive seed (42.5 ms on the stream, 255
# registers with spills) left a 145 us tail after every call, with nothing but its one launch
# on the stream; work hidden within 1% of a call's time cannot buy more than 1%. The verdict
# needs at least ESCAPE_MIN_CALLS suspicious calls making up more than half of the timed calls,
# so a preempted host thread never condemns a kernel.
ESCAPE_TAIL_NS = 100_000
ESCAPE_TAIL_FRACTION = 0.01
ESCAPE_MIN_CALLS = 3
# The L2 flush writes max(this multiple of the L2 size, timing.flush_bytes).
L2_FLUSH_FACTOR = 2
# Roofline measurement: a device-to-device copy and an f16 matrix product (tensor cores).
# Timed calls start behind a kernel that keeps the stream busy while the host enqueues the
# call's work (torch.cuda._sleep), so the start event fires when the work is already queued and
# the events measure the device's time, not the host's launch overhead (whose share differed
# between the candidate's ctypes call and the baseline's PyTorch dispatch). The hold lasts
# HOLD_FACTOR times the longest enqueue seen so far plus HOLD_MARGIN_NS (it only grows, so the
# empty timed calls that measure a round trip just before a timed call hold the stream as long
# as that call). A candidate's call reports the longer of its device time and the host time of
# the call itself, so host work hidden behind the hold still counts; the task's reference and
# baseline count their device time, as `ksearch bench` does. Every call leaves both parts in
# `last_parts` (the host part without the harness's hold launch, event records and, inside task
# code, its lookup of device inputs: DeviceAdapter.helper_ns), and the judge charges the
# candidate only the host time beyond its anchor's in the same repetition
# (adapters.charged_ns): a library call's own enqueue, which on the H200 outlasts a small
# copy's device work, is not counted against a candidate making the very call the baseline
# makes (the `copy` task).
HOLD_FACTOR = 2.0
HOLD_MARGIN_NS = 50_000
HOLD_MAX_NS = 20_000_000
ROOFLINE_COPY_BYTES = 256 << 20
ROOFLINE_MATMUL_N = 8192
ROOFLINE_REPEATS = 5



# Error names for the codes a kernel most often returns, for when torch cannot name them.
CUDA_ERROR_NAMES = {
    1: "cudaErrorInvalidValue", 2: "cudaErrorMemoryAllocation",
    9: "cudaErrorInvalidConfiguration", 98: "cudaErrorInvalidDeviceFunction",
    200: "cudaErrorInvalidKernelImage", 209: "cudaErrorNoKernelImageForDevice",
    222: "cudaErrorUnsupportedPtxVersion", 400: "cudaErrorInvalidResourceHandle",
    700: "cudaErrorIllegalAddress", 701: "cudaErrorLaunchOutOfResources",
    702: "cudaErrorLaunchTimeout", 716: "cudaErrorMisalignedAddress",
    719: "cudaErrorLaunchFailure",
}


# --------------------------------------------------------------------------------------------
# Toolchain discovery


def _site_dirs() -> list[str]:
    dirs: list[str] = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:  # virtualenv's old site.py
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen: list[str] = []
    for d in dirs:
        if d and d not in seen:
            seen.append(d)
    return seen


def find_nvcc(env: dict[str, str] | None = None, which: Callable[[str], str | None] | None = None,
              site_dirs: list[str] | None = None) -> str | None:
    """nvcc from PATH, then `$CUDA_HOME/bin` (`$CUDA_PATH/bin`), then the pip layouts in the
    interpreter's site-packages (`nvidia/cu13/bin` for CUDA 13, `nvidia/cuda_nvcc/bin` for
    CUDA 12), then `/usr/local/cuda/bin`."""
    env = os.environ if env is None else env
    which = shutil.which if which is None else which
    found = which("nvcc")
    if found:
        return found
    candidates = [os.path.join(env[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH")
                  if env.get(v)]
    for d in (_site_dirs() if site_dirs is None else site_dirs):
        candidates += [os.path.join(d, "nvidia", "cu13", "bin", "nvcc"),
                       os.path.join(d, "nvidia", "cuda_nvcc", "bin", "nvcc")]
    candidates.append("/usr/local/cuda/bin/nvcc")
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def cuda_lib_dirs(nvcc: str) -> list[str]:
    """Library directories nvcc does not search by itself. The pip wheels put
    `libcudart_static.a` in `<root>/lib` next to `<root>/bin/nvcc`, where nvcc.profile (which
    expects `lib64`) does not look; a toolkit install needs nothing extra."""
    root = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    out = []
    for d in (os.path.join(root, "lib"), os.path.join(root, "lib64")):
        if glob.glob(os.path.join(d, "libcudart_static.a")):
            out.append(d)
    return out[:1]


@functools.lru_cache(maxsize=None)
def nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "nvcc (version unknown)"
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    release = [ln for ln in lines if "release" in ln]
    return "nvcc " + (release or lines or ["(version unknown)"])[-1]


def nvcc_command(nvcc: str, arch: str, source: str, output: str,
                 lib_dirs: list[str] | None = None) -> list[str]:
    """The build command: a shared library for exactly one architecture, with ptxas's
    register/spill report on stderr.

    `-gencode` rather than `-arch`: nvcc's `-arch=sm_90a` also embeds PTX for the generic
    `compute_90`, where wgmma and setmaxnreg do not assemble, so a kernel using them would fail
    to build although the GPU it runs on has them. Only the one SASS is built; no PTX rides along
    because nothing here JIT-compiles for another chip."""
    virtual = "compute_" + arch.removeprefix("sm_")
    return ([nvcc, *NVCC_FLAGS, split_compile_flag(), f"-gencode=arch={virtual},code={arch}",
             *PTXAS_VERBOSE]
            + [f"-L{d}" for d in (lib_dirs or [])] + [source, "-o", output])


# --------------------------------------------------------------------------------------------
# Architecture


_ARCH_NAME = re.compile(r"^(?:sm_|compute_)?(\d{2,3})([af]?)$")
_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")


def normalise_arch(text: str) -> str | None:
    """`sm_90a`, `90a`, `compute_90a` -> `sm_90a`; `sm_86`, `86` -> `sm_86`; a compute
    capability `9.0` -> `sm_90a` (see arch_for_capability); None if it is none of these."""
    t = text.strip().lower()
    m = _CAPABILITY.match(t)
    if m:
        return arch_for_capability(int(m.group(1)), int(m.group(2)))
    m = _ARCH_NAME.match(t)
    if m:
        return f"sm_{m.group(1)}{m.group(2)}"
    return None


def arch_for_capability(major: int, minor: int) -> str:
    """(9, 0) -> sm_90a: from Hopper on, the `a` targets unlock the architecture-specific
    instructions (wgmma, setmaxnreg); the library is built for the one GPU it runs on."""
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def _smi_capability() -> str | None:
    """The first visible GPU's compute capability as nvidia-smi prints it (`9.0`), or None.
    Asked once per process and set of visible devices: a persistent judge builds (or finds
    built) every candidate it evaluates, and nvidia-smi's start-up is tens of milliseconds,
    while the GPUs a process sees do not change under it."""
    return _smi_capability_of(os.environ.get("CUDA_VISIBLE_DEVICES"))


@functools.lru_cache(maxsize=None)
def _smi_capability_of(visible: str | None) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return lines[0] if out.returncode == 0 and lines else None


def _torch_capability() -> tuple[int, int] | None:
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
        return int(major), int(minor)
    except Exception:  # noqa: BLE001 - no torch, no driver: not an answer
        return None


def detect_arch(env: dict[str, str] | None = None,
                smi: Callable[[], str | None] = _smi_capability,
                torch_cap: Callable[[], tuple[int, int] | None] = _torch_capability
                ) -> tuple[str, str]:
    """(arch, where it came from). Order: the KSEARCH_CUDA_ARCH override, nvidia-smi (cheap,
    no CUDA context in the build process), torch, else sm_90a (CI builds for the H200)."""
    env = os.environ if env is None else env
    for var in ARCH_ENV:
        value = env.get(var, "").strip()
        if value:
            arch = normalise_arch(value)
            if arch is None:
                raise BuildFailed(f"{var}=`{value}` is not a CUDA architecture (e.g. sm_90a)")
            return arch, var
    cap = smi()
    m = _CAPABILITY.match(cap.strip()) if cap else None
    if m:
        return arch_for_capability(int(m.group(1)), int(m.group(2))), "nvidia-smi"
    tc = torch_cap()
    if tc is not None:
        return arch_for_capability(*tc), "torch"
    return DEFAULT_ARCH, "default"


def visible_gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln.strip() for ln in out.stdout.splitlines() if ln.strip().startswith("GPU")]


# --------------------------------------------------------------------------------------------
# ptxas report


_COMPILING = re.compile(r"ptxas info\s*:\s*Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = re.compile(r"ptxas info\s*:\s*Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"ptxas info\s*:\s*Used (\d+) registers(.*)$")
_GMEM = re.compile(r"ptxas info\s*:\s*(\d+) bytes gmem")
_WARNING = re.compile(r"ptxas (?:warning|error)\s*:\s*(.*)$")


def parse_ptxas(log: str, demangle: Callable[[list[str]], dict[str, str]] | None = None
                ) -> dict[str, Any]:
    """The per-kernel facts of `nvcc -Xptxas -v` output: registers, spills, stack frame, static
    shared and constant memory, barriers. Understands the CUDA 12 layout (`Used 30 registers,
    16384 bytes smem, 368 bytes cmem[0]`) and the CUDA 13 one (`Used 12 registers, used 1
    barriers, 1024 bytes smem`)."""
    kernels: list[dict[str, Any]] = []
    frames: dict[str, tuple[int, int, int]] = {}
    current: dict[str, Any] | None = None
    props_for: str | None = None
    gmem = 0
    warnings: list[str] = []
    for line in log.splitlines():
        m = _COMPILING.search(line)
        if m:
            current = {"mangled": m.group(1), "arch": m.group(2), "registers": None,
                       "barriers": 0, "smem_bytes": 0, "cmem_bytes": 0,
                       "stack_frame_bytes": 0, "spill_store_bytes": 0, "spill_load_bytes": 0}
            kernels.append(current)
            props_for = None
            continue
        m = _PROPERTIES.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _FRAME.search(line)
        if m and props_for is not None:
            frames[props_for] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            props_for = None
            continue
        m = _USED.search(line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
            rest = m.group(2)
            b = re.search(r"used (\d+) barriers", rest)
            if b:
                current["barriers"] = int(b.group(1))
            s = re.search(r"(\d+) bytes smem", rest)
            if s:
                current["smem_bytes"] = int(s.group(1))
            current["cmem_bytes"] = sum(int(c) for c in re.findall(r"(\d+) bytes cmem\[\d+\]",
                                                                   rest))
            continue
        m = _GMEM.search(line)
        if m:
            gmem += int(m.group(1))
            continue
        m = _WARNING.search(line)
        if m:
            warnings.append(m.group(1).strip())
    for k in kernels:
        frame = frames.get(k["mangled"])
        if frame:
            k["stack_frame_bytes"], k["spill_store_bytes"], k["spill_load_bytes"] = frame
    names = demangle([k["mangled"] for k in kernels]) if demangle and kernels else {}
    for k in kernels:
        k["name"] = names.get(k["mangled"], k["mangled"])
    regs = [k["registers"] for k in kernels if k["registers"] is not None]
    return {
        "kernels": kernels,
        "max_registers": max(regs) if regs else None,
        "spill_bytes": sum(k["spill_store_bytes"] + k["spill_load_bytes"] for k in kernels),
        "gmem_bytes": gmem,
        "warnings": warnings,
    }


def cxxfilt(names: list[str]) -> dict[str, str]:
    """Demangled names through c++filt when it is installed (it usually is with gcc)."""
    tool = shutil.which("c++filt")
    if tool is None or not names:
        return {}
    try:
        out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = out.stdout.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {}


# --------------------------------------------------------------------------------------------
# Adapter


@dataclass
class CudaBuffer:
    spec: TensorSpec
    tensor: Any  # torch.Tensor on the GPU


_DEVICE_ROOFLINE: tuple[float, float] | None = None


class CudaAdapter(DeviceAdapter):
    name = "cuda"

    def __init__(self, request: Request):
        super().__init__(request)
        self._torch: Any = None
        self._lib: Any = None
        self._entry: Entry | None = None
        self._symbols: dict[str, Any] = {}
        self._stream: Any = None
        self._events: Any = None
        self._flush: Any = None
        self._probe: Any = None  # idle_probe_seconds's one element
        self._dead: str | None = None
        self._timed_candidate_calls = 0
        self._escaped_calls = 0
        # (copy, output) pairs of the last untimed call, for its stream check (check_after_call).
        self._stream_copies: list[tuple[Any, Any]] | None = None
        self._nvcc: str | None = None
        self._arch: str | None = None

    # -- build ---------------------------------------------------------------------------

    def build(self, source: bytes) -> BuildInfo:
        req = self.request
        assert req.candidate is not None and req.build_dir is not None
        if req.candidate.language != "cuda":
            raise BuildFailed(f"the cuda backend compiles CUDA C++ (`cuda`), not "
                              f"`{req.candidate.language}`")
        nvcc = find_nvcc()
        if nvcc is None:
            raise BuildFailed("nvcc not found on PATH, under $CUDA_HOME/bin or in the "
                              "interpreter's site-packages (pip install nvidia-cuda-nvcc)")
        arch, arch_source = detect_arch()
        self._nvcc, self._arch = nvcc, arch
        version = nvcc_version(nvcc)
        lib_dirs = cuda_lib_dirs(nvcc)
        flags = NVCC_FLAGS + [split_compile_flag(), f"-arch={arch}"] + PTXAS_VERBOSE
        key = hashlib.sha256(b"\0".join([source, " ".join(flags).encode(),
                                         version.encode()])).hexdigest()[:20]
        os.makedirs(req.build_dir, exist_ok=True)
        src_path = os.path.join(req.build_dir, f"candidate-{key}.cu")
        artifact = os.path.join(req.build_dir, f"candidate-{key}.so")
        meta_path = os.path.join(req.build_dir, f"candidate-{key}.json")
        extra_base = {"arch": arch, "arch_source": arch_source, "nvcc": nvcc}

        cached = _read_meta(meta_path, key)
        if cached is not None and os.path.isfile(artifact):
            return BuildInfo(compiler=version, command=cached["command"], seconds=0.0,
                             log=cached.get("log", ""), artifact=artifact, cached=True,
                             extra={**extra_base, "ptxas": cached.get("ptxas")})

        # nvcc reads a private copy: the bytes the static checks passed are the bytes built. It
        # runs in a sandbox of its own (toolchain.py) and sees only that copy.
        with open(src_path, "wb") as fh:
            fh.write(source)
        timeout = max(10.0, min(NVCC_TIMEOUT_MAX_S, req.timeout_s * 0.8))
        from ..toolchain import compile_confined
        done = compile_confined(lambda src, out: nvcc_command(nvcc, arch, src, out, lib_dirs),
                                source=source, source_name=os.path.basename(src_path),
                                output=artifact, timeout_s=timeout, mode=req.sandbox)
        log = done.log
        report = parse_ptxas(log, cxxfilt)
        if len(log) > MAX_LOG:
            log = log[:MAX_LOG // 2] + "\n[...]\n" + log[-MAX_LOG // 2:]
        info = BuildInfo(compiler=version,
                         command=nvcc_command(nvcc, arch, os.path.basename(src_path), artifact,
                                              lib_dirs),
                         seconds=done.seconds, log=log, artifact=artifact,
                         extra={**extra_base, "ptxas": report, "sandbox": done.layers})
        if not done.ok:
            raise BuildFailed(_first_error(log) or "nvcc failed", info)
        with open(meta_path, "w") as fh:
            json.dump({"key": key, "command": info.command, "log": info.log, "ptxas": report},
                      fh)
        return info

    # -- device --------------------------------------------------------------------------

    def _torch_mod(self):
        if self._torch is None:
            try:
                import torch
            except ImportError as e:
                raise TaskError(f"the cuda backend needs PyTorch: {e}") from None
            if not torch.cuda.is_available():
                raise TaskError("the cuda backend needs a CUDA device, and PyTorch sees none")
            self._torch = torch
        return self._torch

    def _alive(self) -> None:
        if self._dead is not None:
            raise CandidateRuntimeError(self._dead)

    @contextlib.contextmanager
    def _cuda_errors(self, when: str) -> Iterator[None]:
        """A CUDA error surfacing here is sticky (the context is unusable): record it, make it
        the verdict, and make every later adapter call fail without touching CUDA."""
        self._alive()
        try:
            yield
        except RuntimeError as e:
            first = cuda_error_line(e)
            if first is None:
                raise
            self._dead = (f"CUDA error {when}: {first}. The CUDA context of this harness "
                          f"process is lost; the process ends with this result and the next "
                          f"evaluation runs in a fresh one")
            raise CandidateRuntimeError(self._dead) from None

    def _device_sync(self, when: str) -> None:
        with self._cuda_errors(when):
            self._torch_mod().cuda.synchronize()

    def open_device(self) -> None:
        if self._stream is not None:
            return
        torch = self._torch_mod()
        # A stream of the harness's own, made current for torch too: the reference and
        # baseline run on it, and a candidate that ignores its `stream` argument (launching
        # on the legacy default stream) is caught like one using a side stream, since pool
        # streams do not synchronize with the legacy stream.
        self._stream = torch.cuda.Stream()
        torch.cuda.set_stream(self._stream)
        self._events = (torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True))
        self._hold_ns = HOLD_MARGIN_NS
        self._cycles_per_ns = self._sleep_rate()

    def _sleep_rate(self) -> float | None:
        """GPU cycles per ns of torch.cuda._sleep (None where it is missing): a long sleep
        timed with events."""
        torch = self._torch_mod()
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is None:
            return None
        start, end = self._events
        with self._cuda_errors("measuring the clock"):
            sleep(1000)
            rates = []
            for _ in range(3):
                start.record(self._stream)
                sleep(2_000_000)
                end.record(self._stream)
                end.synchronize()
                ns = start.elapsed_time(end) * 1e6
                if ns > 0:
                    rates.append(2_000_000 / ns)
        return max(rates) if rates else None

    def _hold_stream(self) -> None:
        """Queues a busy kernel long enough for the coming enqueue (see HOLD_FACTOR)."""
        rate = getattr(self, "_cycles_per_ns", None)
        if rate:
            self._torch_mod().cuda._sleep(int(self._hold_ns * rate))

    def load(self, build: BuildInfo, entry: Entry) -> None:
        self.open_device()
        try:
            self._lib = ctypes.CDLL(build.artifact, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as e:
            raise BuildFailed(f"cannot load the compiled library: {e}", build) from None
        self._entry = entry
        for wl in self.request.workloads:
            self._symbol(resolve_entry(entry.symbol, wl.params), build)

    def _symbol(self, name: str, build: BuildInfo | None = None) -> Any:
        fn = self._symbols.get(name)
        if fn is None:
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise BuildFailed(f"the library does not export `{name}` (declare it "
                                  f"extern \"C\")", build) from None
            fn.restype = ctypes.c_int
            self._symbols[name] = fn
        return fn

    # -- buffers and calls ---------------------------------------------------------------

    def alloc(self, spec: TensorSpec) -> CudaBuffer:
        from .device import torch_dtype
        torch = self._torch_mod()
        with self._cuda_errors("allocating a buffer"):
            return CudaBuffer(spec, torch.empty(spec.shape, dtype=torch_dtype(spec.dtype),
                                                device="cuda"))

    def adopt(self, spec: TensorSpec, tensor: Any) -> CudaBuffer:
        """A buffer over device memory allocated elsewhere (the judge's shared memory:
        device_share)."""
        return CudaBuffer(spec, tensor)

    def upload(self, buf: CudaBuffer, host: np.ndarray) -> None:
        with self._cuda_errors("copying to the device"):
            torch_upload(buf.tensor, host)
        self.note_upload(buf.spec, buf.tensor, host)

    def upload_bits(self, buf: CudaBuffer, bits: Any, host: np.ndarray) -> None:
        """As `upload`, from a device tensor of the judge's already holding `host`'s storage
        bits (core._device_copy): a copy on the device, registered under `host` as an upload
        is, so task code finds it."""
        from .device import torch_bits_dtype
        with self._cuda_errors("copying on the device"):
            buf.tensor.view(torch_bits_dtype(host.dtype.itemsize)).copy_(bits)
        self.note_upload(buf.spec, buf.tensor, host)

    def to_host(self, buf: CudaBuffer) -> np.ndarray:
        with self._cuda_errors("copying to the host"):
            return torch_to_host(buf.tensor, dtypes.get(buf.spec.dtype).storage)

    def _fresh(self, stored: np.ndarray, spec: TensorSpec) -> Any:
        with self._cuda_errors("copying to the device"):
            return torch_from_host(stored, spec.dtype)

    def call(self, inputs, outputs, params) -> None:
        self.bind(inputs, outputs, params)()

    def bind(self, inputs: dict[str, CudaBuffer], outputs: dict[str, CudaBuffer],
             params: dict[str, Any]) -> Callable[[], None]:
        assert self._entry is not None and self._stream is not None, "load() first"
        symbol = resolve_entry(self._entry.symbol, params)
        fn = self._symbol(symbol)
        argtypes: list[Any] = []
        values: list[Any] = []
        for name in self._entry.args:
            if name in inputs or name in outputs:
                buf = inputs[name] if name in inputs else outputs[name]
                argtypes.append(ctypes.c_void_p)
                values.append(ctypes.c_void_p(buf.tensor.data_ptr()))
            elif name in params and isinstance(params[name], (bool, int)):
                argtypes.append(ctypes.c_int64)
                values.append(ctypes.c_int64(int(params[name])))
            elif name in params and isinstance(params[name], float):
                argtypes.append(ctypes.c_double)
                values.append(ctypes.c_double(params[name]))
            else:
                raise TaskError(f"entry argument `{name}` is not a tensor or numeric parameter")
        argtypes.append(ctypes.c_void_p)
        values.append(ctypes.c_void_p(self._stream.cuda_stream))
        fn.argtypes = argtypes
        args = tuple(values)
        outs = [outputs[n].tensor for n in outputs]

        def candidate_call() -> None:
            self._alive()
            if self._stream_copies is not None:
                # A caller that did not ask for the last call's check (not the accused, which
                # always does) gets it now: no stream check is skipped.
                self.check_after_call()
            rc = fn(*args)
            if rc != 0:
                self._returned_error(symbol, rc)
            if not self.timing:
                self._stream_copies = self._copy_on_stream(outs)

        candidate_call.ksearch_candidate = True  # type: ignore[attr-defined]
        return candidate_call

    def _returned_error(self, symbol: str, rc: int) -> None:
        # The code may stand for a sticky fault; a device-wide synchronize tells, and then
        # reports that instead.
        self._device_sync(f"after `{symbol}` returned error {rc}")
        raise CandidateRuntimeError(f"`{symbol}` returned CUDA error {rc} "
                                    f"({self._error_name(rc)})")

    def _error_name(self, rc: int) -> str:
        try:
            from torch.cuda import cudart
            rt = cudart()
            return str(rt.cudaGetErrorString(rt.cudaError(rc)))
        except Exception:  # noqa: BLE001 - a name is a courtesy
            return CUDA_ERROR_NAMES.get(rc, "unknown error")

    def _copy_on_stream(self, outs: list[Any]) -> list[tuple[Any, Any]]:
        """Copies of the outputs queued on the harness stream right after an untimed call,
        for its stream check (check_after_call). Device-to-device copies: the kernel audit
        around the call sees them as copies, and nothing crosses to the host."""
        torch = self._torch_mod()
        with self._cuda_errors("after the candidate's call"), torch.cuda.stream(self._stream):
            return [(t.clone(), t) for t in outs]

    def check_after_call(self) -> None:
        """The stream check of the last untimed call: the output copies queued on the harness
        stream right after it must equal the outputs once the whole device is idle, since
        the entry promised that its work is on `stream`. Work left on a side stream or on the
        legacy default stream (which timed calls would not wait for) changes the outputs
        after the copies were taken. Compared on the device, after the kernel audit's session
        (the comparison's kernels are the harness's own)."""
        pairs, self._stream_copies = self._stream_copies, None
        if not pairs:
            return
        torch = self._torch_mod()
        with self._cuda_errors("after the candidate's call"):
            self._stream.synchronize()
            torch.cuda.synchronize()
            same = all(torch.equal(copy, out) for copy, out in pairs)
        if not same:
            raise Violation("deferred_work", "outputs changed after the stream passed to the "
                            "entry point had finished: work ran outside that stream (a side "
                            "stream or the legacy default stream). Launch every kernel on the "
                            "`stream` argument, or make it wait for other streams before "
                            "returning")

    def synchronize(self) -> None:
        self._device_sync("while waiting for the device")

    def idle_probe_seconds(self) -> float | None:
        torch = self._torch_mod()
        with self._cuda_errors("probing whether the device is idle"):
            torch.cuda.synchronize()
            if self._probe is None:
                self._probe = torch.zeros(1, dtype=torch.int32, device="cuda")
            t0 = time.perf_counter_ns()
            self._probe.add_(1)
            torch.cuda.synchronize()
        return (time.perf_counter_ns() - t0) / 1e9

    def flush_cache(self) -> None:
        torch = self._torch_mod()
        with self._cuda_errors("flushing the L2 cache"):
            if self._flush is None:
                l2 = int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 0) or 0)
                nbytes = max(L2_FLUSH_FACTOR * l2, self.request.timing.flush_bytes, 1 << 20)
                self._flush = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
            # A read and a write of every line: dirty lines of the previous call leave too.
            self._flush.add_(1)

    def time_call(self, fn: Callable[[], Any]) -> tuple[int, Any]:
        torch = self._torch_mod()
        self._device_sync("before a timed call")
        start, end = self._events
        wall0 = time.perf_counter_ns()
        hold_ns = self._hold_ns  # the hold this call queues behind
        with self._cuda_errors("in a timed call"):
            self._hold_stream()
            start.record(self._stream)
        self.helper_ns = 0
        call0 = time.perf_counter_ns()
        value = self.timed_region(fn)
        # The call's own host time: what a launch-bound call costs in a loop. The hold's
        # launch, the event records and the harness's helpers are the harness's work, not the
        # contender's; they count only for the hold's length.
        call_ns = time.perf_counter_ns() - call0 - self.helper_ns
        with self._cuda_errors("in a timed call"):
            end.record(self._stream)
            enqueue = time.perf_counter_ns() - wall0
            self._hold_ns = min(max(self._hold_ns, int(HOLD_FACTOR * enqueue) + HOLD_MARGIN_NS),
                                HOLD_MAX_NS)
            end.synchronize()
            stream_done = time.perf_counter_ns()
            torch.cuda.synchronize()
            tail = time.perf_counter_ns() - stream_done
            ns = int(round(start.elapsed_time(end) * 1e6))
            # Both parts go into the candidate's result (which of them made the figure is
            # evidence when a short call reads long); the anchor's host part is the candidate's
            # allowance (adapters.charged_ns). The tail (the escape check's measure) and the
            # hold the call waited behind are kept beside them as evidence: an escape verdict
            # or a slow repetition can be read against every call's, not only the last one's.
            self.last_parts = {"device_ns": ns, "host_ns": call_ns, "tail_ns": tail,
                               "hold_ns": hold_ns}
            if getattr(fn, "ksearch_candidate", False):
                ns = max(ns, call_ns)
        if getattr(fn, "ksearch_candidate", False):
            self._check_escape(ns, tail, time.perf_counter_ns() - wall0, hold_ns)
        self.verify_reference_inputs()
        return ns, value

    def _check_escape(self, event_ns: int, tail_ns: int, wall_ns: int, hold_ns: int) -> None:
        """`tail_ns`: how long the device stayed busy after the harness stream had finished;
        `hold_ns`: the hold the call was queued behind (in the verdict's evidence)."""
        self._timed_candidate_calls += 1
        if tail_ns > max(ESCAPE_TAIL_NS, ESCAPE_TAIL_FRACTION * event_ns):
            self._escaped_calls += 1
        if (self._escaped_calls >= ESCAPE_MIN_CALLS
                and 2 * self._escaped_calls > self._timed_candidate_calls):
            raise Violation("deferred_work", f"in {self._escaped_calls} of "
                            f"{self._timed_candidate_calls} timed calls the device was still "
                            f"busy after the harness stream had finished (last call: "
                            f"{event_ns / 1e3:.1f} us on the stream, {tail_ns / 1e3:.1f} us "
                            f"more until the device was idle, {wall_ns / 1e3:.1f} us of wall "
                            f"time behind a {hold_ns / 1e3:.1f} us stream hold): work escaped "
                            f"the stream")

    # -- machine facts -------------------------------------------------------------------

    def roofline(self) -> tuple[float, float]:
        global _DEVICE_ROOFLINE
        if _DEVICE_ROOFLINE is None:
            from ..machine import remembered_roofline
            from ..device_gate import alone
            # Measured with the device to itself, where other judges share it.
            _DEVICE_ROOFLINE = remembered_roofline(self.roofline_key(),
                                                   alone(self.roofline_fresh))
        return _DEVICE_ROOFLINE

    def roofline_key(self) -> str:
        return f"cuda:{self._torch_mod().cuda.get_device_properties(0).name}"

    def roofline_fresh(self) -> tuple[float, float]:
        """Device memory bandwidth (a device-to-device copy: one read and one write per byte)
        and f16 tensor-core throughput (a square matrix product), best of a few runs each.
        Both are lower bounds on the hardware; core.py adds its slack factors."""
        torch = self._torch_mod()
        start, end = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))

        def best(fn) -> float:
            fn()
            times = []
            for _ in range(ROOFLINE_REPEATS):
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            return max(min(times), 1e-9)

        with self._cuda_errors("measuring the roofline"):
            n = ROOFLINE_COPY_BYTES // 4
            src = torch.ones(n, dtype=torch.float32, device="cuda")
            dst = torch.empty_like(src)
            bandwidth = 2 * src.numel() * 4 / best(lambda: dst.copy_(src))
            del src, dst
            m = ROOFLINE_MATMUL_N
            a = torch.randn(m, m, dtype=torch.float16, device="cuda")
            b = torch.randn(m, m, dtype=torch.float16, device="cuda")
            peak = 2 * m ** 3 / best(lambda: a @ b)
            del a, b
            torch.cuda.empty_cache()
        return bandwidth, peak

    def environment(self) -> dict[str, Any]:
        env: dict[str, Any] = {}
        if self._nvcc:
            env.update({"compiler": nvcc_version(self._nvcc), "cuda_arch": self._arch})
        # Device facts need torch, which only an evaluation loads anyway.
        if self.request.op == "evaluate":
            try:
                torch = self._torch_mod()
                props = torch.cuda.get_device_properties(0)
                env.update({
                    "gpu": props.name,
                    "compute_capability": f"{props.major}.{props.minor}",
                    "sm_count": props.multi_processor_count,
                    "gpu_memory_bytes": props.total_memory,
                    "l2_bytes": getattr(props, "L2_cache_size", None),
                    "torch": torch.__version__,
                    "torch_cuda": torch.version.cuda,
                })
            except (TaskError, RuntimeError):
                pass
        return env
