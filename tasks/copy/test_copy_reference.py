"""Checks the copy task: the reference and the cpu baseline against the input, the tolerances
against trivial and rounded outputs, the seeds (the cpu one through ctypes, the mlx one's
kernel body compiled as C++ behind a stand-in for mx.fast.cuda_kernel, the cuda one built with
nvcc for sm_90a when nvcc is there) and the seeds against the harness's static checks. The GPU
baselines run only where PyTorch with CUDA, or MLX, is installed.

This file is not called test_reference.py and the directory has no __init__.py, unlike the
other tasks: a package named `copy` would shadow the standard library's `copy` module (pytest
could not import `copy.test_reference`), and without the package a second top-level module
named `test_reference` would collide with selective-scan's (whose directory name is no Python
identifier, so pytest imports its test_reference.py without a package). pytest puts this
directory on sys.path; the lines below add `tasks/` for task_testing and `harness/` for the
static checks and the nvcc command.

Run: /work/main/.venv/bin/python -m pytest tasks
"""

import ctypes
import importlib.util
import pathlib
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
for p in (HERE.parent, REPO / "harness"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
# The harness and task trees are embedded in the ksearch binary: no bytecode caches in them.
sys.dont_write_bytecode = True

from task_testing import TaskUnderTest  # noqa: E402

T = TaskUnderTest(HERE)
TASK, ref = T.spec, T.ref
make_inputs, passes = T.make_inputs, T.passes
BACKENDS = TASK["backends"]


def tol(dtype):
    return TASK["tolerance"][dtype]


def worst(out, expected, dtype):
    """The harness's rule with the task's tolerance for `dtype`: at most 1 passes."""
    t = tol(dtype)
    out, expected = out.astype(np.float64), expected.astype(np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    bound = t["atol"] * np.max(np.abs(expected)) + t["rtol"] * np.abs(expected)
    err = np.abs(out - expected)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.max(np.where(err == 0, 0.0, err / bound)))


def draw(n, dtype, seed):
    return np.random.default_rng(seed).normal(0.0, 1.0, n).astype(dtype)


# -- reference and cpu baseline ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [2, 3, 1001, 65537])
def test_reference_is_an_exact_copy_that_does_not_alias_x(n, dtype):
    x = draw(n, dtype, n)
    y = ref.reference({"x": x}, {"n": n})["y"]
    assert y.dtype == x.dtype and y.shape == (n,)
    assert y.tobytes() == x.tobytes()
    assert not np.shares_memory(x, y)


def test_baseline_passes_and_trivial_outputs_fail():
    for w in T.workloads("cpu", held_out=False)[:1]:
        params = dict(w["params"])
        inputs = make_inputs(params, seed=7)
        expected = ref.reference(inputs, params)["y"]
        got = ref.baseline_numpy(inputs, params)["y"]
        assert got.tobytes() == inputs["x"].tobytes()
        assert passes(got, expected)
        assert not passes(np.zeros_like(expected), expected)
        assert not passes(np.full_like(expected, expected.mean()), expected)


def test_the_tolerances_see_a_narrower_type():
    x = draw(100_000, np.float32, 1)
    # float32 through float16: relative errors up to 4.9e-4.
    assert worst(x.astype(np.float16).astype(np.float32), x, "f32") > 1
    # float16 through bfloat16 (float32 with its 16 low bits rounded away): up to 3.9e-3.
    h = x.astype(np.float16)
    bits = h.astype(np.float32).view(np.uint32)
    bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)
    assert worst(bf16.astype(np.float16), h, "f16") > 1
    # ... and an exact copy passes both.
    assert worst(x.copy(), x, "f32") == 0 and worst(h.copy(), h, "f16") == 0


def test_baseline_keeps_one_buffer_and_does_not_mutate_inputs():
    a = make_inputs({"n": 33}, seed=3)
    before = a["x"].copy()
    y1 = ref.baseline_numpy(a, {"n": 33})["y"]
    ref.reference(a, {"n": 33})
    assert np.array_equal(before, a["x"]) and not np.shares_memory(y1, a["x"])
    b = make_inputs({"n": 33}, seed=4)
    y2 = ref.baseline_numpy(b, {"n": 33})["y"]
    # The same buffer, now holding the new copy: no fresh pages on every call.
    assert y2 is y1 and y2.tobytes() == b["x"].tobytes()
    # Another length gets a buffer of its own.
    c = make_inputs({"n": 7}, seed=5)
    y3 = ref.baseline_numpy(c, {"n": 7})["y"]
    assert y3.shape == (7,) and y3.tobytes() == c["x"].tobytes()


def test_workloads_cover_every_backend_and_the_gpu_dtypes():
    assert set(BACKENDS) == {"cpu", "cuda", "mlx"}
    for b in BACKENDS:
        shown, held = T.workloads(b, held_out=False), T.workloads(b, held_out=True)
        assert shown and held, b
        # Every shown workload is a whole number of MiB; every held-out length is odd.
        assert all(w["params"]["n"] * 4 % (1 << 20) == 0 for w in shown), b
        assert all(w["params"]["n"] % 2 == 1 for w in held), b
    gpu = T.workloads("cuda")
    assert gpu == T.workloads("mlx")
    assert {w["params"]["dtype"] for w in gpu} == {"f32", "f16"}
    # The largest GPU buffer is 256 MiB, past the H200's 50 MiB L2 several times over.
    assert max(w["params"]["n"] * (4 if w["params"]["dtype"] == "f32" else 2)
               for w in gpu) == 256 << 20


# -- cpu seed ------------------------------------------------------------------------------------

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")


@needs_cc
@pytest.mark.parametrize("n", [3, 7, 1001, 65537])
def test_cpu_seed_matches_reference(tmp_path, n):
    params = {"n": n}
    inputs = make_inputs(params, seed=11)
    y = T.run_seed(tmp_path, inputs, "y", params)
    assert y.tobytes() == inputs["x"].tobytes()


# -- static checks -------------------------------------------------------------------------------


def _forbidden(backend):
    """What the harness adds to a backend's `forbidden`: the reference and baseline names."""
    spec = BACKENDS[backend]
    names = set(spec.get("forbidden", []))
    names |= {TASK["reference"]["function"], spec.get("reference", "reference"), spec["baseline"]}
    return sorted(names)


def test_seeds_pass_the_static_checks():
    from ksearch_harness import static_checks

    for backend, language in (("cpu", "c"), ("cuda", "cuda"), ("mlx", "python")):
        src = (HERE / BACKENDS[backend]["seed"]).read_text()
        findings = static_checks.check_source(src, _forbidden(backend), language)
        assert findings == [], (backend, findings)
    mlx_seed = (HERE / BACKENDS["mlx"]["seed"]).read_text()
    assert static_checks.kernel_dialects(mlx_seed) == {"cuda"}
    # The like-for-like mlx calibration candidate (the baseline's own call) passes them too.
    native = (HERE / "calibration" / "copy_mlx_native.py").read_text()
    assert static_checks.check_source(native, _forbidden("mlx"), "python") == []
    # A candidate that calls the mlx baseline or reference by name is a reference_call.
    for name in ("baseline_mlx_copy", "reference_mlx"):
        bad = mlx_seed + f"\n\ndef other(*, x, n):\n    return {name}(x)\n"
        found = static_checks.check_python(bad, _forbidden("mlx"))
        assert [f.violation for f in found] == ["reference_call"], found


# -- mlx seed: its kernel body run on the CPU -----------------------------------------------------

# The kernel body of the mlx seed inside a C++ function that runs every thread of the grid in
# turn, with what mx.fast.cuda_kernel and CUDA would supply (blockIdx, blockDim, threadIdx,
# uint4, the template constants N and VEC). T is the element: float, or uint16_t for float16.
EMU = r"""
#include <cstdint>
struct Dim3 { unsigned x, y, z; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
template <typename T>
static void one_thread(const T* x, T* y, long N, long VEC, Dim3 blockIdx, Dim3 blockDim,
                       Dim3 threadIdx) {
BODY
}
template <typename T>
static void grid(const void* x, void* y, long N, long VEC, long blocks, long threads) {
  for (long b = 0; b < blocks; ++b)
    for (long t = 0; t < threads; ++t)
      one_thread<T>((const T*)x, (T*)y, N, VEC, Dim3{(unsigned)b, 0, 0},
                    Dim3{(unsigned)threads, 1, 1}, Dim3{(unsigned)t, 0, 0});
}
extern "C" void grid4(const void* x, void* y, long N, long VEC, long blocks, long threads) {
  grid<float>(x, y, N, VEC, blocks, threads);
}
extern "C" void grid2(const void* x, void* y, long N, long VEC, long blocks, long threads) {
  grid<uint16_t>(x, y, N, VEC, blocks, threads);
}
"""

needs_cxx = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler (c++)")


class _FakeKernel:
    """Stands in for what mx.fast.cuda_kernel returns: runs the emulated grid on numpy arrays,
    writing into a NaN-poisoned output, after checking the launch the way MLX reads it (the grid
    counts threads, a whole number of threadgroups)."""

    def __init__(self, lib, source, input_names, output_names):
        self.lib, self.source = lib, source
        assert input_names == ["x"] and output_names == ["y"]

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        (x,), consts = inputs, dict(template)
        assert set(consts) == {"N", "VEC"} and all(isinstance(v, int) for v in consts.values())
        assert grid[1:] == (1, 1) and threadgroup[1:] == (1, 1)
        assert grid[0] % threadgroup[0] == 0 and threadgroup[0] <= 1024
        y = np.full(output_shapes[0], np.nan, dtype=output_dtypes[0])
        fn = self.lib.grid4 if x.itemsize == 4 else self.lib.grid2
        fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_long] * 4
        fn(x.ctypes.data, y.ctypes.data, consts["N"], consts["VEC"], grid[0] // threadgroup[0],
           threadgroup[0])
        return [y]


@pytest.fixture(scope="module")
def mlx_seed(tmp_path_factory):
    """The mlx seed module, imported with a stand-in for mlx.core whose cuda_kernel runs the
    seed's kernel body, compiled as C++, on the CPU."""
    path = HERE / BACKENDS["mlx"]["seed"]
    built = {}

    def cuda_kernel(*, name, input_names, output_names, source):
        if "lib" not in built:
            d = tmp_path_factory.mktemp("mlx-seed")
            (d / "emu.cpp").write_text(EMU.replace("BODY", source))
            subprocess.run(["c++", "-std=c++17", "-O1", "-fno-strict-aliasing", "-shared",
                            "-fPIC", str(d / "emu.cpp"), "-o", str(d / "emu.so")],
                           check=True, capture_output=True)
            built["lib"] = ctypes.CDLL(str(d / "emu.so"))
        return _FakeKernel(built["lib"], source, input_names, output_names)

    core = types.ModuleType("mlx.core")
    core.fast = types.SimpleNamespace(cuda_kernel=cuda_kernel)
    mlx = types.ModuleType("mlx")
    mlx.core = core
    saved = {k: sys.modules.get(k) for k in ("mlx", "mlx.core")}
    sys.modules.update({"mlx": mlx, "mlx.core": core})
    try:
        spec = importlib.util.spec_from_file_location("copy_task_mlx_seed", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [3, 7, 8, 1001, 4096, 65537])
def test_mlx_seed_kernel_copies_every_element(mlx_seed, n, dtype):
    x = draw(n, dtype, n)
    y = getattr(mlx_seed, BACKENDS["mlx"]["entry"])(x=x, n=n)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert y.tobytes() == x.tobytes()


@needs_cxx
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_mlx_seed_kernel_copies_a_misaligned_view(mlx_seed, dtype):
    # An input that starts 1 element past an aligned address takes the element-wise path.
    base = draw(1002, dtype, 9)
    x = base[1:]
    assert x.ctypes.data % 16 != 0
    y = mlx_seed.copy(x=x, n=x.size)
    assert y.tobytes() == x.tobytes()


# -- cuda seed -----------------------------------------------------------------------------------


def _nvcc():
    from ksearch_harness.adapters import cuda
    return cuda.find_nvcc()


@pytest.mark.skipif(_nvcc() is None, reason="nvcc not found (CI installs the CUDA 13 wheels)")
def test_cuda_seed_builds_for_sm90a_and_exports_both_entries(tmp_path):
    """What the harness runs to build it (adapters.cuda.nvcc_command): a shared library for
    sm_90a. The seed launches no kernel of its own (ptxas reports none); the copy is the
    runtime's."""
    from ksearch_harness.adapters import cuda

    nvcc = _nvcc()
    src = HERE / BACKENDS["cuda"]["seed"]
    lib = tmp_path / "copy.so"
    cmd = cuda.nvcc_command(nvcc, "sm_90a", str(src), str(lib), cuda.cuda_lib_dirs(nvcc))
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert cuda.parse_ptxas(done.stdout + done.stderr)["kernels"] == []
    if shutil.which("nm"):
        names = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                               text=True).stdout
        for dtype in sorted({w["params"]["dtype"] for w in T.workloads("cuda")}):
            assert f" T copy_{dtype}\n" in names, names


# -- GPU baselines, where a GPU library is installed ---------------------------------------------


def _makes_a_new_buffer_holding_x(copy, seed):
    """Evaluates `copy(x, a)` (x on the host, a its MLX copy as task code gets it) and checks
    that it made memory of its own holding x: MLX's active memory grows by the array's size."""
    mx = pytest.importorskip("mlx.core")
    from ksearch_harness.adapters import device

    n = 1 << 20
    x = draw(n, np.float32, seed)
    a = device.mlx_inputs({"x": x}, {"n": n})["x"]
    mx.eval(a)
    mx.synchronize()
    before = mx.get_active_memory()
    y = copy(x, a)
    mx.eval(y)
    mx.synchronize()
    assert mx.get_active_memory() - before >= 4 * n
    assert np.asarray(y).tobytes() == x.tobytes()


def test_mlx_baseline_makes_a_new_buffer():
    """mx.array(x) is a copy MLX computes into memory of its own (an AsType node), not a view:
    evaluating it grows MLX's active memory by the array's size. MLX's CPU backend shows the
    same graph as its GPU backends."""
    _makes_a_new_buffer_holding_x(
        lambda x, a: ref.baseline_mlx_copy({"x": x}, {"n": x.size})["y"].value, 2)


def test_the_mlx_calibration_candidate_makes_the_baselines_copy():
    """calibration/copy_mlx_native.py returns what the baseline returns, computed the same way
    (a new buffer holding x), and the task allows the kernel that does it."""
    pytest.importorskip("mlx.core")  # the module imports it
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "copy_mlx_native", HERE / "calibration" / "copy_mlx_native.py")
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    _makes_a_new_buffer_holding_x(lambda x, a: native.copy(x=a, n=x.size), 3)
    assert BACKENDS["mlx"]["allowed_kernels"] == ["mlx::core::cu::copy_v<"]


def test_torch_baseline_copies_on_the_device():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from ksearch_harness.adapters import device

    n = 1 << 20
    x = draw(n, np.float32, 3)
    y = ref.baseline_torch_copy({"x": x}, {"n": n, "dtype": "f32"})["y"]
    assert y.value.is_cuda
    assert np.asarray(y).tobytes() == x.tobytes()
    # Not the harness's input buffer: a copy.
    t = device.torch_inputs({"x": x}, {"n": n, "dtype": "f32"})["x"]
    assert y.value.data_ptr() != t.data_ptr()
