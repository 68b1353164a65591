"""The kernel audit's verdict (core.Evaluation._check_kernels) on the kernel lists a GPU
accused reports: its own kernels and allowed library copies pass, anything else is
`forbidden_kernel`. The profiler side runs on the GPU machine (gpu_smoke.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ksearch_harness import core
from ksearch_harness.protocol import Violation


def judge(backend: str, own: set[str], allowed: tuple[str, ...] = ()):
    task = SimpleNamespace(allowed_kernels=allowed)
    return SimpleNamespace(req=SimpleNamespace(backend=backend, task=task), own_kernels=own,
                           kernels_seen=[])


def check(ev, kernels, built=()):
    core.Evaluation._check_kernels(ev, {"kernels": list(kernels), "own_kernels": list(built)},
                                   "workload `w`, trial 0")


def test_own_kernels_and_copies_pass_and_are_recorded():
    ev = judge("cuda", {"naive_attention"})
    check(ev, ["void naive_attention<__half, 64>(__half const*, __half*, long)",
               "Memcpy DtoD (Device -> Device)", "Memset (Device)"])
    assert ev.kernels_seen[0].startswith("void naive_attention")


def test_a_library_kernel_is_forbidden_unless_the_task_allows_it():
    sdpa = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3"
    with pytest.raises(Violation) as e:
        check(judge("cuda", {"naive_attention"}), ["void naive_attention<float>(float*)", sdpa])
    assert e.value.violation == "forbidden_kernel" and "sdpa" in e.value.message
    check(judge("cuda", {"naive_attention"}, allowed=(r"^cudnn_generated_fort_native_sdpa",)),
          [sdpa])


def test_mlx_kernels_built_at_run_time_are_the_candidates_own():
    ev = judge("mlx", set())
    check(ev, ["custom_kernel_attn_0123456789ab"], built=["attn_0123456789ab"])
    with pytest.raises(Violation):
        check(ev, ["custom_kernel_attn_0123456789ab", "sdpa_vector_float16_t_128"],
              built=["attn_0123456789ab"])


@pytest.mark.parametrize("name,base", [
    ("void naive_attention<__half, 64>(__half const*, __half*, long)", "naive_attention"),
    ("_Z15naive_attentionI6__halfLi64EEvPKT_", "naive_attention"),
    ("_ZN2ns4attnIfEEvPKT_", "attn"),
    ("void at::native::vectorized_elementwise_kernel<4, F>(int, F)",
     "vectorized_elementwise_kernel"),
    ("sm90_xmma_gemm_f16f16_f32", "sm90_xmma_gemm_f16f16_f32"),
])
def test_kernel_base_names(name, base):
    assert core.kernel_base(name) == base
