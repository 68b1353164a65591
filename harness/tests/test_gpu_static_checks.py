"""Static checks of the GPU backends: the Python rules for mlx candidates (a corpus of cheating
modules, and honest ones in both kernel dialects), the CUDA rules, and both through the
harness's `build` op, which needs neither mlx nor a GPU."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import driver
from ksearch_harness.static_checks import check_python, check_source, kernel_dialects

REPO = Path(__file__).resolve().parents[2]
SEED_MLX = REPO / "tasks" / "attention" / "seed" / "naive_mlx.py"
SEED_CUDA = REPO / "tasks" / "attention" / "seed" / "naive.cu"
# The attention task's mlx `forbidden` list.
FORBIDDEN = ("reference", "reference_mlx", "baseline_mlx_native", "scaled_dot_product_attention")


def module(body: str) -> str:
    return textwrap.dedent(body).lstrip()


HONEST_HEAD = """
import math
import mlx.core as mx

KERNEL = mx.fast.cuda_kernel(name="k", input_names=["q"], output_names=["out"],
                             source="out[0] = q[0];")
"""

# name -> (source, expected violation class)
MLX_CHEATS = {
    "calls_native_attention": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(D))
""", "reference_call"),
    "imports_native_attention": ("""
from mlx.core.fast import scaled_dot_product_attention as sdpa

def attention(*, q, k, v, B, H, L, D, causal):
    return sdpa(q, k, v, scale=1.0)
""", "reference_call"),
    "calls_the_reference": ("""
import mlx.core as mx
from reference import reference_mlx

def attention(*, q, k, v, B, H, L, D, causal):
    return reference_mlx({"q": q, "k": k, "v": v}, {})["out"]
""", "reference_call"),
    "other_fast_op": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    return mx.fast.rms_norm(q, None, 1e-5)
""", "forbidden_call"),
    "precompiled_kernel": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    return mx.fast.precompiled_cuda_kernel(name="x", compiled_source=b"", inputs=[q])
""", "forbidden_call"),
    "imports_torch": ("""
import mlx.core as mx
import torch

def attention(*, q, k, v, B, H, L, D, causal):
    return mx.array(torch.softmax(torch.zeros(1), 0).numpy())
""", "forbidden_call"),
    "imports_numpy": ("""
import numpy as np
import mlx.core as mx

def attention(*, q, k, v, B, H, L, D, causal):
    return mx.array(np.asarray(q))
""", "forbidden_call"),
    "imports_mlx_nn": ("""
import mlx.nn as nn

def attention(*, q, k, v, B, H, L, D, causal):
    return nn.MultiHeadAttention(D, 1)(q, k, v)
""", "forbidden_call"),
    "patches_synchronize": (HONEST_HEAD + """
mx.synchronize = lambda *a, **k: None

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "patches_through_an_alias": (HONEST_HEAD + """
fast = mx.fast
fast.cuda_kernel = None

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "deletes_a_module_attribute": (HONEST_HEAD + """
del mx.eval

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "patches_with_setattr": (HONEST_HEAD + """
setattr(mx, "synchronize", print)

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "lazy_array_protocol": (HONEST_HEAD + """
class Later:
    def __init__(self, fn):
        self.fn = fn

    def __array__(self, dtype=None, copy=None):
        return self.fn()

def attention(*, q, k, v, B, H, L, D, causal):
    return Later(lambda: q)
""", "lazy_output"),
    "array_subclass": (HONEST_HEAD + """
class Deferred(mx.array):
    pass

def attention(*, q, k, v, B, H, L, D, causal):
    return Deferred(q)
""", "lazy_output"),
    "async_eval": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    out = q * 1
    mx.async_eval(out)
    return out
""", "forbidden_call"),
    "side_stream": (HONEST_HEAD + """
SIDE = mx.new_stream(mx.gpu)

def attention(*, q, k, v, B, H, L, D, causal):
    return mx.add(q, 0, stream=SIDE)
""", "forbidden_call"),
    "stream_keyword_only": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    return mx.multiply(q, 1, stream=mx.gpu)
""", "forbidden_call"),
    "exec": (HONEST_HEAD + """
exec("import torch")

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "dunder_import": (HONEST_HEAD + """
t = __import__("tor" + "ch")

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "getattr_by_computed_name": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    op = getattr(mx.fast, "scaled_dot_" + "product_attention")
    return op(q, k, v, scale=1.0)
""", "forbidden_call"),
    "module_dict": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    return mx.fast.__dict__["scaled_dot_" + "product_attention"](q, k, v, scale=1.0)
""", "forbidden_call"),
    "threads": (HONEST_HEAD + """
import threading

def attention(*, q, k, v, B, H, L, D, causal):
    threading.Thread(target=lambda: None).start()
    return q
""", "forbidden_call"),
    "os_and_files": (HONEST_HEAD + """
import os

def attention(*, q, k, v, B, H, L, D, causal):
    os.system("true")
    return q
""", "forbidden_call"),
    "result_file": (HONEST_HEAD + """
def attention(*, q, k, v, B, H, L, D, causal):
    mx.save("/tmp/cache.npy", q)
    return mx.load("/tmp/cache.npy")
""", "forbidden_call"),
    "process_wide_settings": (HONEST_HEAD + """
mx.set_cache_limit(0)

def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
    "relative_import": ("""
from . import helper

def attention(*, q, k, v, B, H, L, D, causal):
    return helper.run(q)
""", "forbidden_call"),
    "async_function": (HONEST_HEAD + """
async def attention(*, q, k, v, B, H, L, D, causal):
    return q
""", "forbidden_call"),
}


@pytest.mark.parametrize("name", sorted(MLX_CHEATS))
def test_cheating_mlx_module_is_flagged(name):
    src, cls = MLX_CHEATS[name]
    findings = check_python(module(src), FORBIDDEN)
    assert cls in [f.violation for f in findings], (name, findings)
    assert all(f.line >= 1 for f in findings)


HONEST_METAL = module("""
import mlx.core as mx

SOURCE = '''
    uint row = thread_position_in_grid.x;
    if (row < n_rows) { out[row] = q[row]; }
'''
_KERNEL = mx.fast.metal_kernel(name="copy_rows", input_names=["q"], output_names=["out"],
                               source=SOURCE)


def attention(*, q, k, v, B, H, L, D, causal):
    (out,) = _KERNEL(inputs=[q], template=[("T", q.dtype), ("n_rows", B * H * L)],
                     grid=(B * H * L, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[q.shape], output_dtypes=[q.dtype])
    return out
""")

HONEST_BOTH = module("""
import functools
import math

import mlx.core as mx
from mlx.core import fast


@functools.lru_cache(maxsize=None)
def _kernel(dialect: str):
    # Comments may name anything: scaled_dot_product_attention, torch, exec.
    if dialect == "metal":
        return fast.metal_kernel(name="k", input_names=["q"], output_names=["out"],
                                 source="out[0] = q[0];")
    return fast.cuda_kernel(name="k", input_names=["q"], output_names=["out"],
                            source="out[0] = q[0];  // not the reference")


class Launch:
    def __init__(self, threads: int):
        self.threads = threads

    def grid(self, rows: int):
        return (math.ceil(rows / self.threads) * self.threads, 1, 1)


def attention(*, q, k, v, B, H, L, D, causal):
    dialect = "cuda" if mx.cuda.is_available() else "metal"
    launch = Launch(128)
    input = q  # a builtin's name reused for a variable is fine
    (out,) = _kernel(dialect)(inputs=[input, k, v], grid=launch.grid(B * H * L),
                              threadgroup=(launch.threads, 1, 1), output_shapes=[q.shape],
                              output_dtypes=[q.dtype])
    return out
""")


@pytest.mark.parametrize("src", [SEED_MLX.read_text(), HONEST_METAL, HONEST_BOTH],
                         ids=["seed", "metal", "both-dialects"])
def test_honest_mlx_modules_pass(src):
    assert check_python(src, FORBIDDEN) == []


def test_kernel_dialects():
    assert kernel_dialects(SEED_MLX.read_text()) == {"cuda"}
    assert kernel_dialects(HONEST_METAL) == {"metal"}
    assert kernel_dialects(HONEST_BOTH) == {"cuda", "metal"}
    assert kernel_dialects("import mlx.core as mx\ndef f(*, q):\n    return q * 2\n") == set()
    assert kernel_dialects("def broken(:\n") == set()


def test_a_syntax_error_is_left_to_the_build():
    assert check_python("def attention(:\n    pass\n", FORBIDDEN) == []


def test_python_findings_carry_lines_and_reference_first():
    src = module("""
    import mlx.core as mx
    import os

    def attention(*, q, k, v, B, H, L, D, causal):
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0)
    """)
    findings = check_source(src, FORBIDDEN, "python")
    assert findings[0].violation == "reference_call" and findings[0].line == 5
    assert ("forbidden_call", 2) in [(f.violation, f.line) for f in findings]


# -- CUDA ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("src", [
    "void cb(void*); int e(void* s) { cudaLaunchHostFunc((cudaStream_t)s, cb, 0); return 0; }",
    "int e(void) { return (int)cudaDeviceReset(); }",
    "int e(void) { return (int)cudaSetDevice(1); }",
    "int e(void) { CUcontext c; return (int)cuCtxGetCurrent(&c); }",
    "void e(cudaStreamAttrValue* a) { a->accessPolicyWindow.num_bytes = 1 << 20; }",
    "int e(void) { return cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 1 << 20); }",
    "#include <torch/extension.h>\nint e(void) { return 0; }",
    "#include <ATen/cuda/CUDAContext.h>\nint e(void) { return 0; }",
    # The C rules apply to CUDA sources too.
    '#include <dlfcn.h>\nint e(void) { return dlopen("libcudnn.so", 2) != 0; }',
    "int e(void) { reference_torch(); return 0; }",
])
def test_cuda_sources_are_flagged(src):
    findings = check_source(src, ("reference", "reference_torch"), "cuda")
    assert findings, src


@pytest.mark.parametrize("src", [
    SEED_CUDA.read_text(),
    "// cudaDeviceReset would break the harness\n__global__ void k(float* p) { p[0] = 1; }",
    'const char* note = "accessPolicyWindow";\n__global__ void k(float* p) { p[0] = 1; }',
    "__global__ void k(long long* p) { p[0] = clock64(); }",
])
def test_honest_cuda_sources_pass(src):
    assert check_source(src, ("reference", "reference_torch"), "cuda") == []


def test_cuda_rules_do_not_apply_to_cpu_sources():
    # A C kernel that happens to name a CUDA API is judged by the C rules only.
    assert check_source("int cudaDeviceReset(void) { return 0; }", (), "c") == []


# -- through the harness's build op (no mlx, no GPU needed) ---------------------------------


def _mlx_build(tmp_path: Path, name: str, source: str) -> dict:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    req = {"protocol": 1, "op": "build", "nonce": driver.NONCE, "backend": "mlx",
           "task": {"name": "attention", "forbidden": list(FORBIDDEN)},
           "candidate": {"path": str(path), "language": "python"},
           "build_dir": str(tmp_path / f"build-{name}"), "timeout_s": 60}
    run = driver.run_harness("build", req, timeout=90)
    assert run.result is not None, run.stderr
    return run.result


def test_build_op_accepts_honest_mlx_modules_of_both_dialects(tmp_path):
    for name, src, dialects in [("seed", SEED_MLX.read_text(), ["cuda"]),
                                ("metal", HONEST_METAL, ["metal"])]:
        result = _mlx_build(tmp_path, name, src)
        assert result["status"] == "passed", result
        assert result["build"]["kernel_dialects"] == dialects
        assert Path(result["build"]["artifact"]).read_text() == src


def test_build_op_rejects_cheating_mlx_modules(tmp_path):
    for name in ("calls_native_attention", "patches_synchronize", "lazy_array_protocol",
                 "async_eval", "imports_torch"):
        src, cls = MLX_CHEATS[name]
        result = _mlx_build(tmp_path, name, module(src))
        assert result["status"] == "static_check_failed", (name, result["status"])
        assert result["violation"]["class"] == cls, (name, result["violation"])


def test_build_op_reports_python_syntax_errors(tmp_path):
    result = _mlx_build(tmp_path, "broken", "import mlx.core as mx\ndef attention(:\n    pass\n")
    assert result["status"] == "build_error"
    assert "line 2" in result["message"]
