"""The producer schedule through MLX (no GPU needed, nvcc needed): MLX writes its kernel's
__global__ signature without launch bounds, so the mlx header redefines __global__ with the cuda
entry point's bounds. Compiled the way MLX compiles it (build.py --mlx-wrap: the header, then a
kernel written as MLX writes it), ptxas must honour the register split; without the header's
line it must not (C7508: setmaxnreg ignored), which shows that line is what bounds the kernel."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import build  # noqa: E402
import family  # noqa: E402


@pytest.fixture(scope="module")
def nvcc():
    try:
        return build.find_nvcc(None)
    except SystemExit as e:  # build.py's own lookup: $NVCC, PATH, /usr/local/cuda
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def producer():
    return family.load_variants()["wg_m128n128s3_prod"]


def test_the_header_bounds_the_producer_kernel_as_mlx_compiles_it(nvcc, producer, tmp_path):
    report = build.build_mlx_wrap(nvcc, "prod", producer, tmp_path)
    assert report["mlx_ok"], report["mlx_log"]
    kernels = report["mlx_kernels"]
    assert len(kernels) == 8  # two dtypes, two head dims, causal or not
    # 65536 / 384 threads, down to a multiple of 8: the count the split was asserted against.
    assert {k["registers"] for k in kernels} == {168}
    assert all(k["spill_stores"] == 0 and k["spill_loads"] == 0 for k in kernels)
    assert report["mlx_regs_fit"] and report["mlx_perf_warnings"] == []


def test_without_the_header_line_ptxas_ignores_the_split(nvcc, producer, tmp_path, monkeypatch):
    render = family.render_mlx

    def unbounded(knobs):
        header, body = render(knobs)
        assert "#undef __global__\n#define __global__" in header
        return header.replace("#undef __global__\n#define __global__", "// "), body

    monkeypatch.setattr(family, "render_mlx", unbounded)
    report = build.build_mlx_wrap(nvcc, "prod_unbounded", producer, tmp_path)
    assert report["mlx_ok"], report["mlx_log"]
    assert any(w.startswith("C7508") for w in report["mlx_perf_warnings"]), report["mlx_perf_warnings"]
