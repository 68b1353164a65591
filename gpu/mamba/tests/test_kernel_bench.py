"""kernel_bench.py's own parts that run without a GPU: the channel-last entry it appends to a
rendered cuda unit (compiled for sm_90a where nvcc is installed) and its correctness count."""

import subprocess

import pytest

import cuda_compile
import kernel_bench
from ksearch_render import Family


@pytest.mark.parametrize("variant", ["chunked_fused", "s2_chunked", "tiled_c16_t512_tree_pf"])
def test_the_channel_last_entry_compiles_for_sm90a(variant, tmp_path):
    """Fused and unfused variants (the unfused entry launches the epilogue kernel too) build
    with the entry, which the object then exports."""
    nvcc = cuda_compile.find_nvcc()
    if nvcc is None:
        pytest.skip("no nvcc ($NVCC, PATH, $CUDA_HOME or nvidia/cu13 in site-packages)")
    fam = Family("selective-scan", "cuda")
    knobs = fam.variants(kernel_bench.HERE / "variants.toml")[variant]
    unit = tmp_path / "unit.cu"
    unit.write_text(kernel_bench.with_channel_last_entry(fam.render(knobs), knobs))
    obj = tmp_path / "unit.o"
    proc = subprocess.run([nvcc, "-c", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a",
                           str(unit), "-o", str(obj)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = obj.read_bytes()
    assert b"selective_scan_channel_last_f16" in exported and b"selective_scan_f16" in exported
    assert ("ksm_epilogue_kernel" in unit.read_text()) == (not knobs["fuse_epilogue"])


def test_an_unwritten_output_counts_as_wrong():
    torch = pytest.importorskip("torch")
    want = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    got = torch.tensor([1.0, float("nan"), 4.0], dtype=torch.float16)
    assert kernel_bench.rel_err(got, want)[1] == 1
    assert kernel_bench.rel_err(want.half(), want)[1] == 0
    assert kernel_bench.rel_err(torch.tensor([1.0, -2.0, 4.5]).half(), want)[1] == 1
