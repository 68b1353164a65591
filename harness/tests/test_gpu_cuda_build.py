"""The cuda backend's build path, which needs no GPU: nvcc discovery, architecture detection,
the nvcc command, the ptxas register/spill report, entry resolution with `{dtype}`; and, when
nvcc is installed, real builds through the adapter and through the harness process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

import driver
from ksearch_harness.adapters import BuildFailed
from ksearch_harness.adapters import cuda
from ksearch_harness.adapters import device
from ksearch_harness.adapters.device import resolve_entry
from ksearch_harness.protocol import TaskError, parse_request

REPO = Path(__file__).resolve().parents[2]
ATTENTION = REPO / "tasks" / "attention"


@pytest.fixture(autouse=True)
def _no_active_adapter():
    """Adapters register themselves for task code (one per harness process); tests make many."""
    yield
    device.deactivate()


# `nvcc -Xptxas -v` of CUDA 13.0 (V13.0.88, sm_90a): a templated kernel forced to spill with
# -maxrregcount=32 and a small kernel reading __constant__ memory.
PTXAS_CUDA13_SPILLS = """\
ptxas warning : Too big maxrregcount value specified 32, will be ignored
ptxas info    : Overriding maximum register limit 256 for '_Z5heavyILi128EEvPKfPfi' with  32 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for '_Z5lightPf' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z5heavyILi128EEvPKfPfi' for 'sm_90a'
ptxas info    : Function properties for _Z5heavyILi128EEvPKfPfi
    632 bytes stack frame, 788 bytes spill stores, 996 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 632 bytes cumulative stack size
ptxas info    : Compile time = 334.221 ms
ptxas info    : Compiling entry function '_Z5lightPf' for 'sm_90a'
ptxas info    : Function properties for _Z5lightPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
ptxas info    : Compile time = 5.602 ms
"""

# CUDA 13.0, a kernel with 1 KiB of static shared memory and a __syncthreads().
PTXAS_CUDA13_SMEM = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z12scale_kernelPK6__halfPS_l' for 'sm_90a'
ptxas info    : Function properties for _Z12scale_kernelPK6__halfPS_l
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 1 barriers, 1024 bytes smem
ptxas info    : Compile time = 7.866 ms
"""

# The CUDA 12 layout, where shared and constant memory share the `Used` line.
PTXAS_CUDA12 = """\
ptxas info    : 8 bytes gmem
ptxas info    : Compiling entry function '_Z6attn64PK6__halfS1_S1_PS_i' for 'sm_90a'
ptxas info    : Function properties for _Z6attn64PK6__halfS1_S1_PS_i
    16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 168 registers, 16384 bytes smem, 400 bytes cmem[0], 8 bytes cmem[2]
"""


# -- ptxas report --------------------------------------------------------------------------------


def test_ptxas_report_with_spills_and_two_kernels():
    r = cuda.parse_ptxas(PTXAS_CUDA13_SPILLS)
    heavy, light = r["kernels"]
    assert heavy["mangled"] == "_Z5heavyILi128EEvPKfPfi" and heavy["arch"] == "sm_90a"
    assert (heavy["registers"], heavy["barriers"]) == (32, 1)
    assert (heavy["stack_frame_bytes"], heavy["spill_store_bytes"],
            heavy["spill_load_bytes"]) == (632, 788, 996)
    assert (light["registers"], light["barriers"], light["spill_store_bytes"]) == (10, 0, 0)
    assert r["max_registers"] == 32
    assert r["spill_bytes"] == 788 + 996
    assert r["warnings"] == ["Too big maxrregcount value specified 32, will be ignored"]


def test_ptxas_report_shared_memory_cuda13():
    (k,) = cuda.parse_ptxas(PTXAS_CUDA13_SMEM)["kernels"]
    assert (k["registers"], k["barriers"], k["smem_bytes"], k["cmem_bytes"]) == (12, 1, 1024, 0)


def test_ptxas_report_cuda12_layout():
    r = cuda.parse_ptxas(PTXAS_CUDA12)
    (k,) = r["kernels"]
    assert (k["registers"], k["smem_bytes"], k["cmem_bytes"]) == (168, 16384, 408)
    assert (k["spill_store_bytes"], k["spill_load_bytes"]) == (8, 12)
    assert r["gmem_bytes"] == 8


def test_ptxas_report_demangles_when_asked():
    r = cuda.parse_ptxas(PTXAS_CUDA13_SMEM, lambda names: {n: "scale_kernel(...)" for n in names})
    assert r["kernels"][0]["name"] == "scale_kernel(...)"
    assert cuda.parse_ptxas("nvcc fatal : no input files")["kernels"] == []


@pytest.mark.skipif(not __import__("shutil").which("c++filt"), reason="no c++filt")
def test_cxxfilt_demangles_kernel_names():
    assert cuda.cxxfilt(["_Z5lightPf"]) == {"_Z5lightPf": "light(float*)"}


# -- nvcc command and discovery --------------------------------------------------------------


def test_nvcc_command_builds_one_architecture_with_the_ptxas_report():
    cmd = cuda.nvcc_command("/opt/cuda/bin/nvcc", "sm_90a", "/b/k.cu", "/b/k.so", ["/w/lib"])
    assert cmd == ["/opt/cuda/bin/nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                   cuda.split_compile_flag(), "-gencode=arch=compute_90a,code=sm_90a", "-Xptxas", "-v", "-L/w/lib", "/b/k.cu", "-o", "/b/k.so"]


def test_nvcc_optimises_on_a_quarter_of_the_cpus_and_at_least_two():
    assert [cuda.split_compile_flag(n) for n in (1, 2, 8, 16, 64)] == [
        "--split-compile=2", "--split-compile=2", "--split-compile=2", "--split-compile=4",
        "--split-compile=16"]


def test_nvcc_counts_the_cpus_this_process_may_use(monkeypatch):
    # A container limited to 8 of a 64-CPU host's CPUs: a quarter of 8.
    monkeypatch.setattr(cuda.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(cuda.os, "cpu_count", lambda: 64)
    assert cuda.split_compile_flag() == "--split-compile=2"


def _fake_nvcc(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_find_nvcc_prefers_path_then_cuda_home_then_pip(tmp_path):
    home = _fake_nvcc(tmp_path / "cuda" / "bin" / "nvcc")
    pip = _fake_nvcc(tmp_path / "site" / "nvidia" / "cu13" / "bin" / "nvcc")
    site = [str(tmp_path / "site")]
    assert cuda.find_nvcc({"CUDA_HOME": str(tmp_path / "cuda")}, lambda _: "/usr/bin/nvcc",
                          site) == "/usr/bin/nvcc"
    assert cuda.find_nvcc({"CUDA_HOME": str(tmp_path / "cuda")}, lambda _: None, site) == home
    assert cuda.find_nvcc({}, lambda _: None, site) == pip
    cu12 = _fake_nvcc(tmp_path / "old" / "nvidia" / "cuda_nvcc" / "bin" / "nvcc")
    assert cuda.find_nvcc({}, lambda _: None, [str(tmp_path / "old")]) == cu12


def test_find_nvcc_returns_none_without_a_toolkit(tmp_path, monkeypatch):
    real = os.path.isfile
    monkeypatch.setattr(cuda.os.path, "isfile",
                        lambda p: False if p == "/usr/local/cuda/bin/nvcc" else real(p))
    assert cuda.find_nvcc({"CUDA_HOME": str(tmp_path)}, lambda _: None, [str(tmp_path)]) is None


def test_pip_layout_gets_its_library_directory(tmp_path):
    nvcc = _fake_nvcc(tmp_path / "cu13" / "bin" / "nvcc")
    assert cuda.cuda_lib_dirs(nvcc) == []
    (tmp_path / "cu13" / "lib").mkdir()
    (tmp_path / "cu13" / "lib" / "libcudart_static.a").write_bytes(b"")
    assert cuda.cuda_lib_dirs(nvcc) == [str(tmp_path / "cu13" / "lib")]


# -- architecture ----------------------------------------------------------------------------


@pytest.mark.parametrize("text,arch", [
    ("sm_90a", "sm_90a"), ("90a", "sm_90a"), ("compute_90a", "sm_90a"), ("sm_90", "sm_90"),
    ("9.0", "sm_90a"), ("8.6", "sm_86"), ("86", "sm_86"), ("10.0", "sm_100a"),
    ("sm_100a", "sm_100a"), (" SM_120A ", "sm_120a"),
])
def test_architecture_names_normalise(text, arch):
    assert cuda.normalise_arch(text) == arch


@pytest.mark.parametrize("text", ["", "hopper", "sm_9", "9", "sm_90b", "9.x"])
def test_non_architectures_are_rejected(text):
    assert cuda.normalise_arch(text) is None


def _never():
    raise AssertionError("must not be consulted")


def test_arch_override_wins_over_every_probe():
    assert cuda.detect_arch({"KSEARCH_CUDA_ARCH": "sm_80"}, _never, _never) == \
        ("sm_80", "KSEARCH_CUDA_ARCH")
    # The spelling that survives ksearch's environment scrub.
    assert cuda.detect_arch({"KSEARCH_HARNESS_CUDA_ARCH": "9.0"}, _never, _never) == \
        ("sm_90a", "KSEARCH_HARNESS_CUDA_ARCH")
    with pytest.raises(BuildFailed, match="not a CUDA architecture"):
        cuda.detect_arch({"KSEARCH_CUDA_ARCH": "hopper"}, _never, _never)


def test_arch_detection_falls_back_from_nvidia_smi_to_torch_to_sm90a():
    assert cuda.detect_arch({}, lambda: "9.0", _never) == ("sm_90a", "nvidia-smi")
    assert cuda.detect_arch({}, lambda: "8.9", _never) == ("sm_89", "nvidia-smi")
    assert cuda.detect_arch({}, lambda: None, lambda: (12, 0)) == ("sm_120a", "torch")
    assert cuda.detect_arch({}, lambda: "garbage", lambda: (8, 0)) == ("sm_80", "torch")
    assert cuda.detect_arch({}, lambda: None, lambda: None) == ("sm_90a", "default")


def test_nvidia_smi_is_asked_once_per_process_and_set_of_visible_devices(monkeypatch):
    """A persistent judge finds a built candidate on every evaluation; the architecture it was
    built for comes from nvidia-smi, which is run once, not once per evaluation."""
    runs = []

    def run(cmd, **kwargs):
        runs.append((cmd[0], os.environ.get("CUDA_VISIBLE_DEVICES")))
        return subprocess.CompletedProcess(cmd, 0, stdout="9.0\n", stderr="")

    monkeypatch.setattr(cuda.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(cuda.subprocess, "run", run)
    cuda._smi_capability_of.cache_clear()
    try:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
        assert [cuda.detect_arch({}) for _ in range(3)] == [("sm_90a", "nvidia-smi")] * 3
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
        assert cuda.detect_arch({}) == ("sm_90a", "nvidia-smi")
    finally:
        cuda._smi_capability_of.cache_clear()
    assert runs == [("nvidia-smi", "0"), ("nvidia-smi", "1")]


# -- entry symbols ---------------------------------------------------------------------------


def test_entry_resolution_fills_dtype_from_the_workload():
    assert resolve_entry("attention_{dtype}", {"dtype": "bf16", "L": 4}) == "attention_bf16"
    assert resolve_entry("attention_f32", {"L": 4}) == "attention_f32"
    with pytest.raises(TaskError, match="no string parameter `dtype`"):
        resolve_entry("attention_{dtype}", {"L": 4})
    with pytest.raises(TaskError, match="no string parameter"):
        resolve_entry("attention_{L}", {"L": 4})
    with pytest.raises(TaskError, match="not an identifier"):
        resolve_entry("attention_{dtype}", {"dtype": "f-16"})


# -- real builds (nvcc installed) ------------------------------------------------------------

NVCC = cuda.find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed (pip install "
                                "nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-crt "
                                "nvidia-nvvm nvidia-cuda-cccl)")

TINY_KERNEL = r"""
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void twice(const float* x, float* y, int64_t n) {
  __shared__ float tile[128];
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.f;
  __syncthreads();
  if (i < n) y[i] = 2.f * tile[threadIdx.x];
}
extern "C" int twice_f32(const void* x, void* y, int64_t n, void* stream) {
  twice<<<(unsigned)((n + 127) / 128), 128, 0, (cudaStream_t)stream>>>(
      (const float*)x, (float*)y, n);
  return (int)cudaGetLastError();
}
"""


def _build_request(source: Path, build_dir: Path, **extra) -> dict:
    req = {"protocol": 1, "op": "build", "nonce": driver.NONCE, "backend": "cuda",
           "candidate": {"path": str(source), "language": "cuda"},
           "build_dir": str(build_dir), "timeout_s": 280}
    req.update(extra)
    return req


@needs_nvcc
def test_adapter_builds_a_kernel_and_keeps_the_ptxas_report(tmp_path, monkeypatch):
    monkeypatch.setenv("KSEARCH_CUDA_ARCH", "sm_90a")
    src = tmp_path / "twice.cu"
    src.write_text(TINY_KERNEL)
    req = parse_request(_build_request(src, tmp_path / "b"), "build")
    adapter = cuda.CudaAdapter(req)
    info = adapter.build(src.read_bytes())
    assert os.path.isfile(info.artifact) and info.compiler.startswith("nvcc")
    assert "-gencode=arch=compute_90a,code=sm_90a" in info.command and "-Xptxas" in info.command
    report = info.extra["ptxas"]
    (k,) = report["kernels"]
    assert k["name"].startswith("twice(") and k["arch"] == "sm_90a"
    assert k["registers"] > 0 and k["smem_bytes"] == 128 * 4 and k["barriers"] == 1
    assert report["spill_bytes"] == 0
    assert info.extra["arch"] == "sm_90a" and info.extra["arch_source"] == "KSEARCH_CUDA_ARCH"
    out = subprocess.run(["nm", "-D", "--defined-only", info.artifact], capture_output=True,
                         text=True)
    assert " T twice_f32" in out.stdout
    # A second build of the same bytes reuses the artifact and its report.
    again = cuda.CudaAdapter(req).build(src.read_bytes())
    assert again.cached and again.artifact == info.artifact
    assert again.extra["ptxas"] == report


WGMMA_KERNEL = r"""
#include <cuda_runtime.h>
#include <stdint.h>
__global__ void fence_only(float* y) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  y[threadIdx.x] = 1.f;
}
extern "C" int fence_f32(void* y, void* stream) {
  fence_only<<<1, 128, 0, (cudaStream_t)stream>>>((float*)y);
  return (int)cudaGetLastError();
}
"""


@needs_nvcc
def test_sm90a_only_instructions_build_without_a_guard(tmp_path, monkeypatch):
    """wgmma exists only in sm_90a. A build that also emitted generic compute_90 PTX would
    reject this kernel; the harness builds exactly the one target, so it must pass."""
    monkeypatch.setenv("KSEARCH_CUDA_ARCH", "sm_90a")
    src = tmp_path / "fence.cu"
    src.write_text(WGMMA_KERNEL)
    req = parse_request(_build_request(src, tmp_path / "b"), "build")
    info = cuda.CudaAdapter(req).build(src.read_bytes())
    assert os.path.isfile(info.artifact)
    assert [k["arch"] for k in info.extra["ptxas"]["kernels"]] == ["sm_90a"]


@needs_nvcc
def test_adapter_reports_compile_errors_with_the_log(tmp_path):
    src = tmp_path / "broken.cu"
    src.write_text("__global__ void k(int* p) { p[0] = not_declared; }\n")
    req = parse_request(_build_request(src, tmp_path / "b"), "build")
    with pytest.raises(BuildFailed) as e:
        cuda.CudaAdapter(req).build(src.read_bytes())
    assert "not_declared" in e.value.message
    assert e.value.info is not None and "error" in e.value.info.log


def test_adapter_refuses_other_languages(tmp_path):
    src = tmp_path / "k.c"
    src.write_text("void k(void) {}\n")
    req = parse_request(_build_request(src, tmp_path / "b",
                                       candidate={"path": str(src), "language": "c"}), "build")
    with pytest.raises(BuildFailed, match="CUDA C"):
        cuda.CudaAdapter(req).build(src.read_bytes())


@needs_nvcc
def test_harness_build_op_builds_the_shipped_attention_seed(tmp_path):
    """What CI checks without a GPU: the seed of the attention task's cuda backend passes the
    static checks and builds for sm_90a through the real harness process, with both dtype
    entry points exported and a register report for each kernel instance."""
    src = ATTENTION / "seed" / "naive.cu"
    req = _build_request(src, tmp_path / "b", task={
        "name": "attention", "forbidden": ["reference", "reference_torch",
                                           "baseline_torch_sdpa"]})
    run = driver.run_harness("build", req, timeout=300,
                             env={"KSEARCH_HARNESS_CUDA_ARCH": "sm_90a"})
    assert run.result is not None, run.stderr
    assert run.result["status"] == "passed", json.dumps(run.result)[:2000]
    build = run.result["build"]
    assert build["arch"] == "sm_90a"
    kernels = build["ptxas"]["kernels"]
    # Two dtypes x three head dims.
    assert len(kernels) == 6, kernels
    assert all(k["registers"] and k["registers"] <= 255 for k in kernels)
    names = subprocess.run(["nm", "-D", "--defined-only", build["artifact"]],
                           capture_output=True, text=True).stdout
    assert " T attention_f16" in names and " T attention_bf16" in names
