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


@pytest.mark.parametrize("audit", [True, False])
def test_a_correctness_calls_own_checks_run_after_the_audit_session(monkeypatch, audit):
    """The accused runs the adapter's checks of an untimed call (cuda: the stream check, whose
    comparison launches kernels of the harness's own) after the kernel audit's session has
    closed, so the audit sees only the call's kernels; a check that fails is the reply."""
    from ksearch_harness import accused
    order: list[str] = []

    class Audit:
        available = True

        def kernels_of(self, fn):
            order.append("audit begins")
            fn()
            order.append("audit ends")
            return ["k"]

    class Adapter:
        built_kernels: list[str] = []
        fail = False

        def synchronize(self):
            order.append("sync")

        def check_after_call(self):
            order.append("check")
            if self.fail:
                raise Violation("deferred_work", "changed after the stream had finished")

    monkeypatch.setattr(accused, "AUDIT", Audit())
    one = accused.Accused("cuda")
    one.adapter = Adapter()
    slot = accused.Slot({})
    slot.fn = lambda: order.append("call")
    reply = one.call(slot, 0, timed=False, audit=audit)
    if audit:
        assert order == ["audit begins", "call", "sync", "audit ends", "check"]
        assert reply["kernels"] == ["k"]
    else:
        assert order == ["call", "sync", "check"]
    one.adapter.fail = True
    with pytest.raises(accused.CommandFailed) as failed:
        one.call(slot, 0, timed=False, audit=audit)
    assert failed.value.violation == "deferred_work"
    assert "changed after the stream" in failed.value.message
