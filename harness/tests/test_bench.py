"""The `ksearch bench` tool (ksearch_harness/bench.py) without a GPU.

MLX and PyTorch are replaced by numpy stand-ins, the way test_gpu_mlx_fake.py and
test_gpu_cuda_fake.py do it: the fake `mx.fast.cuda_kernel` and the fake SDPA compute attention
in numpy, and the cuda candidate is CUDA C++ whose entry point runs on the host (nvcc builds it
exactly as a real kernel). What this proves is the bench's glue: request parsing, one process
measuring the kernel and the natives on the same inputs, the correctness check of each, the
samples and medians, the comparators' availability, and the process entry with its private
result channel. Real timings come from gpu/attention/device_check.sh on the device.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import numpy as np
import pytest

import driver
from ksearch_harness import bench, dtypes
from ksearch_harness.adapters import cuda, device

ATTENTION = Path(__file__).resolve().parents[2] / "tasks" / "attention"


def attention(q, k, v, causal):
    """float32 attention in numpy, [B, H, L, D]."""
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        s = np.where(np.triu(np.ones((L, L), dtype=bool), 1), -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhij,bhjd->bhid", p, v).astype(np.float32)


# --------------------------------------------------------------------------------------------
# A numpy stand-in for mlx.core


class Dtype:
    def __init__(self, name, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)
        self.size = self.np.itemsize

    def __repr__(self):
        return f"mlx.core.{self.name}"


class FakeMx(types.ModuleType):
    def __init__(self):
        super().__init__("mlx.core")
        for name, nd in [("float16", np.float16), ("bfloat16", np.uint16),
                         ("float32", np.float32), ("int32", np.int32), ("int64", np.int64),
                         ("int8", np.int8), ("int16", np.int16), ("uint8", np.uint8),
                         ("uint16", np.uint16), ("uint32", np.uint32), ("uint64", np.uint64),
                         ("bool_", np.bool_)]:
            setattr(self, name, Dtype(name, nd))
        self.kernel_calls = 0
        self.sdpa_calls = 0
        # Who ran, in order: "kernel" or "mlx" per call.
        self.calls: list[str] = []
        # MLX native raises from this call on (None: never).
        self.sdpa_fails_after: int | None = None
        mx = self

        class array:  # noqa: N801 - the real class is mlx.core.array
            def __init__(self, data, dtype=None):
                a = np.asarray(data)
                self.dtype = dtype or mx._from_np(a.dtype)
                self._a = np.ascontiguousarray(a.astype(self.dtype.np, copy=False))

            @property
            def shape(self):
                return tuple(self._a.shape)

            def values(self):
                if self.dtype is mx.bfloat16:
                    return dtypes.get("bf16").decode(self._a).astype(np.float32)
                return self._a.astype(np.float32)

            def astype(self, dtype):
                return mx.from_values(self.values(), dtype)

            def reshape(self, shape):
                return array(self._a.reshape(shape), self.dtype)

            def __add__(self, x):
                return array(self._a + (x._a if isinstance(x, array) else x), self.dtype)

            def __mul__(self, x):
                return mx.from_values(self.values() * x, self.dtype)

            def __array__(self, dtype=None, copy=None):
                if self.dtype is mx.bfloat16:
                    raise TypeError("numpy has no bfloat16")
                return self._a if dtype is None else self._a.astype(dtype)

        array.__module__ = "mlx.core"
        self.array = array
        self.cuda = types.SimpleNamespace(is_available=lambda: True)
        self.metal = types.SimpleNamespace(is_available=lambda: False)

        def cuda_kernel(name, input_names, output_names, source, header="", **kw):
            def run(*, inputs, template, output_shapes, output_dtypes, grid, threadgroup, **k):
                mx.kernel_calls += 1
                mx.calls.append("kernel")
                causal = dict(template)["CAUSAL"]
                q, kk, v = (a.values() for a in inputs)
                return [mx.from_values(attention(q, kk, v, causal), output_dtypes[0])]
            return run

        def sdpa(q, k, v, *, scale, mask=None):
            mx.sdpa_calls += 1
            mx.calls.append("mlx")
            if mx.sdpa_fails_after is not None and mx.sdpa_calls > mx.sdpa_fails_after:
                raise RuntimeError("cuDNN: out of workspace")
            assert math.isclose(scale, 1 / math.sqrt(q.shape[-1]))
            return mx.from_values(attention(q.values(), k.values(), v.values(),
                                            mask == "causal"), q.dtype)

        self.fast = types.ModuleType("mlx.core.fast")
        self.fast.cuda_kernel = cuda_kernel
        self.fast.scaled_dot_product_attention = sdpa

    def _from_np(self, dt):
        for d in (self.float16, self.float32, self.int32, self.int64, self.int8, self.int16,
                  self.uint8, self.uint16, self.uint32, self.uint64, self.bool_):
            if d.np == dt:
                return d
        return self.float32

    def from_values(self, values, dtype):
        if dtype is self.bfloat16:
            return self.array(dtypes.get("bf16").encode(values), self.bfloat16)
        return self.array(np.asarray(values).astype(dtype.np), dtype)

    def eval(self, *arrays):
        pass

    def synchronize(self, stream=None):
        pass

    def zeros(self, shape, dtype=None):
        return self.array(np.zeros(shape, (dtype or self.float32).np), dtype or self.float32)

    def concatenate(self, arrays):
        return self.array(np.concatenate([a._a for a in arrays]), arrays[0].dtype)

    def view(self, a, dtype):
        return self.array(a._a.view(dtype.np), dtype)


@pytest.fixture
def fake_mx(monkeypatch):
    mx = FakeMx()
    pkg = types.ModuleType("mlx")
    pkg.core = mx
    monkeypatch.setitem(sys.modules, "mlx", pkg)
    monkeypatch.setitem(sys.modules, "mlx.core", mx)
    monkeypatch.setitem(sys.modules, "mlx.core.fast", mx.fast)
    # No PyTorch here: the SDPA column must say so rather than fail the bench.
    monkeypatch.setitem(sys.modules, "torch", None)
    yield mx
    device.deactivate()


# --------------------------------------------------------------------------------------------
# Requests


SHAPES = [  # (name, B, H, L, D, causal, dtype)
    ("b1h2l33d64-f16-causal", 1, 2, 33, 64, 1, "f16"),
    ("b2h1l17d128-bf16", 2, 1, 17, 128, 0, "bf16"),
]


def _workload(name, B, H, L, D, causal, dtype):
    shape = [B, H, L, D]
    dist = {"kind": "normal", "mean": 0.0, "std": 1.0}
    return {"name": name, "held_out": False,
            "params": {"B": B, "H": H, "L": L, "D": D, "causal": causal, "dtype": dtype},
            "inputs": [{"name": n, "dtype": dtype, "shape": shape, "dist": dist}
                       for n in ("q", "k", "v")],
            "outputs": [{"name": "out", "dtype": dtype, "shape": shape}],
            "flops": 4.0 * B * H * L * L * D / (1 + causal), "bytes": 8.0 * B * H * L * D}


def request(backend: str, candidate: Path, build_dir: Path, reps: int = 4,
            compare=("sdpa", "mlx")) -> dict:
    if backend == "mlx":
        entry = {"symbol": "attention", "args": ["q", "k", "v", "B", "H", "L", "D", "causal"]}
        ref, language = "reference_mlx", "python"
    else:
        entry = {"symbol": "attention_{dtype}",
                 "args": ["q", "k", "v", "out", "B", "H", "L", "D", "causal"]}
        ref, language = "reference_torch", "cuda"
    return {
        "protocol": 1, "op": "bench", "nonce": driver.NONCE, "secret_seed": driver.SECRET_SEED,
        "backend": backend,
        "task": {"name": "attention", "dir": str(ATTENTION),
                 "reference": {"module": "reference.py", "function": ref},
                 "baseline": None, "entry": entry,
                 "forbidden": ["reference", ref, "scaled_dot_product_attention"]},
        "candidate": {"path": str(candidate), "language": language},
        "build_dir": str(build_dir),
        "workloads": [_workload(*s) for s in SHAPES],
        "tolerance": {"f16": {"rtol": 2e-3, "atol": 2e-3}, "bf16": {"rtol": 1.6e-2, "atol": 1.6e-2}},
        "timing": {"flush_bytes": 1 << 20},
        "bench": {"warmup": 1, "reps": reps, "compare": list(compare)},
        "timeout_s": 120,
    }


def run_in_process(obj: dict) -> dict:
    req, settings = bench.parse(obj)
    return bench.Bench(req, settings).run()


# --------------------------------------------------------------------------------------------
# mlx backend


def test_mlx_kernel_and_mlx_native_on_the_same_inputs(fake_mx, tmp_path):
    seed = ATTENTION / "seed" / "naive_mlx.py"
    result = run_in_process(request("mlx", seed, tmp_path / "b", reps=4))
    assert result["status"] == "passed", result["message"]
    assert result["nonce"] == driver.NONCE and result["op"] == "bench"
    assert result["backend"] == "mlx"
    comps = result["comparators"]
    assert comps["mlx"]["available"] is True
    assert comps["sdpa"]["available"] is False and "torch" in comps["sdpa"]["reason"]
    assert [w["name"] for w in result["workloads"]] == [s[0] for s in SHAPES]
    for w in result["workloads"]:
        assert w["flops"] > 0 and w["params"]["dtype"] in ("f16", "bf16")
        kernel, native = w["results"]["kernel"], w["results"]["mlx"]
        assert "sdpa" not in w["results"] and "error" not in kernel, kernel
        for r in (kernel, native):
            assert r["correct"] is True, (w["name"], r)
            assert len(r["samples_ns"]) == 4 and all(s > 0 for s in r["samples_ns"])
            assert r["p10_ns"] <= r["median_ns"] <= r["p90_ns"]
            assert r["median_ns"] == float(np.median(r["samples_ns"]))
            assert r["max_rel_err"] < 1.6e-2
    # warm-up + reps timed calls and the two checked calls, per workload; the same for MLX
    # native minus the output check of the last timed call.
    assert fake_mx.kernel_calls == len(SHAPES) * (1 + 1 + 4)
    assert fake_mx.sdpa_calls == len(SHAPES) * (1 + 1 + 4)
    assert "wall clock" in result["settings"]["kernel_timing"]
    json.dumps(bench.protocol.jsonable(result), allow_nan=False)


def test_contenders_take_turns_and_the_first_of_a_round_rotates(fake_mx, tmp_path):
    seed = ATTENTION / "seed" / "naive_mlx.py"
    req = request("mlx", seed, tmp_path / "b", reps=3, compare=["mlx"])
    req["workloads"] = req["workloads"][:1]
    result = run_in_process(req)
    assert result["status"] == "passed", result["message"]
    # The kernel's checked call, MLX native's checked call, then warm-up (1) + reps (3) rounds
    # of one call each, the first of a round alternating; the kernel's last check reads the
    # output of its last timed call and calls nothing.
    assert fake_mx.calls == ["kernel", "mlx",
                             "kernel", "mlx", "mlx", "kernel", "kernel", "mlx", "mlx", "kernel"]
    w = result["workloads"][0]
    assert list(w["results"]) == ["kernel", "mlx"]
    assert all(len(w["results"][c]["samples_ns"]) == 3 for c in ("kernel", "mlx"))
    assert result["settings"]["order"] == "interleaved"


def test_a_contender_that_fails_midway_is_dropped_and_the_kernel_finishes(fake_mx, tmp_path):
    seed = ATTENTION / "seed" / "naive_mlx.py"
    req = request("mlx", seed, tmp_path / "b", reps=4, compare=["mlx"])
    req["workloads"] = req["workloads"][:1]
    fake_mx.sdpa_fails_after = 3  # the checked call and two rounds succeed
    result = run_in_process(req)
    assert result["status"] == "passed", result["message"]
    w = result["workloads"][0]
    assert "out of workspace" in w["results"]["mlx"]["error"]
    assert w["results"]["mlx"]["status"] == "runtime_error"
    kernel = w["results"]["kernel"]
    assert kernel["correct"] is True and len(kernel["samples_ns"]) == 4
    # No MLX native call after the one that raised.
    assert fake_mx.calls.count("mlx") == 4 and fake_mx.calls[-1] == "kernel"


def test_a_wrong_kernel_is_reported_and_the_natives_still_run(fake_mx, tmp_path):
    src = (ATTENTION / "seed" / "naive_mlx.py").read_text().replace("    return out",
                                                                     "    return out * 1.5")
    cand = tmp_path / "wrong.py"
    cand.write_text(src)
    result = run_in_process(request("mlx", cand, tmp_path / "b", reps=2, compare=["mlx"]))
    assert result["status"] == "passed"
    for w in result["workloads"]:
        assert w["results"]["kernel"]["correct"] is False
        assert w["results"]["kernel"]["max_rel_err"] > 0.1
        assert w["results"]["mlx"]["correct"] is True
        assert "sdpa" not in w["results"]


def test_static_checks_and_build_errors_end_the_bench(fake_mx, tmp_path):
    cheat = tmp_path / "cheat.py"
    cheat.write_text(textwrap.dedent('''
        import mlx.core as mx

        def attention(*, q, k, v, B, H, L, D, causal):
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=D ** -0.5)
    '''))
    result = run_in_process(request("mlx", cheat, tmp_path / "b"))
    assert result["status"] == "static_check_failed", result
    broken = tmp_path / "broken.py"
    broken.write_text("def attention(*, q:\n")
    result = run_in_process(request("mlx", broken, tmp_path / "c"))
    assert result["status"] == "build_error" and "syntax" in result["message"]
    assert result["workloads"] == []


@pytest.mark.parametrize("change, message", [
    ({"bench": {"reps": 0}}, "bench.reps"),
    ({"bench": {"warmup": -1}}, "bench.warmup"),
    ({"bench": {"compare": ["cudnn"]}}, "bench.compare"),
    ({"op": "evaluate"}, "bench"),
    ({"workloads": []}, "workloads"),
])
def test_bad_requests_are_task_errors(tmp_path, change, message):
    obj = request("mlx", ATTENTION / "seed" / "naive_mlx.py", tmp_path / "b")
    obj.update(change)
    with pytest.raises(bench.TaskError, match=message):
        bench.parse(obj)


# --------------------------------------------------------------------------------------------
# cuda backend (host-side entry points built by nvcc, a numpy stand-in for torch)


HOST_ATTENTION = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <vector>

template <typename T> static float f(T x);
template <> float f(__half x) { return __half2float(x); }
template <> float f(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> static T t(float x);
template <> __half t(float x) { return __float2half(x); }
template <> __nv_bfloat16 t(float x) { return __float2bfloat16(x); }

// Runs on the host: the stand-in for torch hands out host memory.
template <typename T>
static int attn(const void* qp, const void* kp, const void* vp, void* op, int64_t B, int64_t H,
                int64_t L, int64_t D, int64_t causal, void* stream) {
  if (stream == 0) return 1;
  const T *q = (const T*)qp, *k = (const T*)kp, *v = (const T*)vp;
  T* o = (T*)op;
  std::vector<float> s(L);
  for (int64_t h = 0; h < B * H; ++h)
    for (int64_t i = 0; i < L; ++i) {
      const int64_t end = causal ? i + 1 : L;
      float m = -INFINITY, sum = 0.f;
      for (int64_t j = 0; j < end; ++j) {
        float acc = 0.f;
        for (int64_t d = 0; d < D; ++d) acc += f(q[(h * L + i) * D + d]) * f(k[(h * L + j) * D + d]);
        s[j] = acc / sqrtf((float)D);
        m = fmaxf(m, s[j]);
      }
      for (int64_t j = 0; j < end; ++j) { s[j] = expf(s[j] - m); sum += s[j]; }
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.f;
        for (int64_t j = 0; j < end; ++j) acc += s[j] * f(v[(h * L + j) * D + d]);
        o[(h * L + i) * D + d] = t<T>(SCALE * acc / sum);
      }
    }
  return 0;
}

extern "C" int attention_f16(const void* q, const void* k, const void* v, void* o, int64_t B,
                             int64_t H, int64_t L, int64_t D, int64_t c, void* s) {
  return attn<__half>(q, k, v, o, B, H, L, D, c, s);
}
extern "C" int attention_bf16(const void* q, const void* k, const void* v, void* o, int64_t B,
                              int64_t H, int64_t L, int64_t D, int64_t c, void* s) {
  return attn<__nv_bfloat16>(q, k, v, o, B, H, L, D, c, s);
}
"""


@pytest.fixture
def fake_torch(monkeypatch):
    if cuda.find_nvcc() is None:
        pytest.skip("nvcc not installed")
    from test_gpu_cuda_fake import FakeTorch
    fake = FakeTorch()
    fake.sdpa_calls = 0

    def from_values(values, dtype):
        values = np.asarray(values, dtype=np.float32)
        if dtype is fake.bfloat16:
            return fake.Tensor(dtypes.get("bf16").encode(values), dtype)
        return fake.Tensor(values.astype(dtype.np), dtype)

    def sdpa(q, k, v, is_causal=False):
        fake.sdpa_calls += 1
        return from_values(attention(q.float().a, k.float().a, v.float().a, is_causal), q.dtype)

    functional = types.ModuleType("torch.nn.functional")
    functional.scaled_dot_product_attention = sdpa
    fake.nn = types.SimpleNamespace(functional=functional)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.cuda", fake.cuda)
    monkeypatch.setitem(sys.modules, "torch.nn", fake.nn)
    monkeypatch.setitem(sys.modules, "torch.nn.functional", functional)
    monkeypatch.setitem(sys.modules, "mlx", None)
    monkeypatch.setitem(sys.modules, "mlx.core", None)
    yield fake
    device.deactivate()


@pytest.mark.parametrize("scale, correct", [("1.0f", True), ("1.25f", False)])
def test_cuda_kernel_and_sdpa_on_the_same_inputs(fake_torch, tmp_path, scale, correct,
                                                 monkeypatch):
    timed = []
    original = cuda.CudaAdapter.time_call

    def time_call(self, fn):
        timed.append(fn)
        return original(self, fn)

    monkeypatch.setattr(cuda.CudaAdapter, "time_call", time_call)
    cand = tmp_path / "host_attention.cu"
    cand.write_text(HOST_ATTENTION.replace("SCALE", scale))
    result = run_in_process(request("cuda", cand, tmp_path / "b", reps=3))
    assert result["status"] == "passed", (result["message"], result.get("build"))
    assert result["build"]["ptxas"] is not None
    comps = result["comparators"]
    assert comps["sdpa"]["available"] is True
    # SDPA is timed by the adapter that times the kernel (behind the stream hold), as an
    # evaluation times the task's baseline: warm-up and timed calls of both contenders.
    assert "stream hold" in comps["sdpa"]["timing"]
    assert "as evaluations time the baseline" in comps["sdpa"]["timing"]
    assert len(timed) == len(SHAPES) * (1 + 3) * 2
    assert sum(getattr(fn, "ksearch_candidate", False) for fn in timed) == len(SHAPES) * 4
    assert comps["mlx"]["available"] is False
    assert result["environment"]["gpu"] == "Fake H200"
    assert "CUDA events" in result["settings"]["kernel_timing"]
    for w in result["workloads"]:
        kernel, sdpa = w["results"]["kernel"], w["results"]["sdpa"]
        assert "correct" in kernel, kernel
        assert kernel["correct"] is correct, (w["name"], kernel)
        assert sdpa["correct"] is True, (w["name"], sdpa)
        for r in (kernel, sdpa):
            assert len(r["samples_ns"]) == 3 and r["median_ns"] > 0
    assert fake_torch.sdpa_calls == len(SHAPES) * (1 + 1 + 3)


# --------------------------------------------------------------------------------------------
# The process entry


def run_tool(obj: dict, timeout: float = 120.0) -> tuple[dict | None, int]:
    r, w = os.pipe()
    env = dict(os.environ, PYTHONPATH=str(driver.HARNESS_DIR), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.Popen([sys.executable, "-m", "ksearch_harness.bench", "bench",
                             "--result-fd", str(w)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(w,),
                            env=env, start_new_session=True, cwd="/")
    os.close(w)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(obj).encode())
    proc.stdin.close()
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        chunk = os.read(r, 1 << 16)
        if not chunk:
            break
        data += chunk
    os.close(r)
    rc = proc.wait(timeout=timeout)
    lines = data.split(b"\n")
    return (json.loads(lines[0]) if data else None), rc


def test_the_tool_answers_on_its_result_fd(tmp_path):
    # A fresh interpreter without MLX: the result line still comes, with the nonce, and says
    # what is missing; the candidate's output goes to the log in the build dir.
    obj = request("mlx", ATTENTION / "seed" / "naive_mlx.py", tmp_path / "b")
    result, rc = run_tool(obj)
    assert rc == 0 and result is not None
    assert result["nonce"] == driver.NONCE and result["op"] == "bench"
    try:
        import mlx.core  # noqa: F401
        has_mlx = True
    except ImportError:
        has_mlx = False
    if not has_mlx:
        assert result["status"] in ("task_error", "build_error"), result
        assert "mlx" in result["message"]
    assert (tmp_path / "b" / "harness-bench.log").is_file()

    bad = dict(obj, bench={"reps": 0})
    result, rc = run_tool(bad)
    assert rc == 0 and result["status"] == "task_error" and "bench.reps" in result["message"]
    assert result["nonce"] == driver.NONCE
    result, rc = run_tool({"protocol": 1})
    assert rc == 0 and result["status"] == "task_error" and result["nonce"] is None
