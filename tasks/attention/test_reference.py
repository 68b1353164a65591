"""Checks the attention reference against an independent loop implementation, the tolerance
against trivial outputs, and the seed kernel against the reference through ctypes.

Run: /work/main/.venv/bin/python -m pytest tasks
"""

import math
import pathlib
import shutil

import numpy as np
import pytest

from task_testing import TaskUnderTest

HERE = pathlib.Path(__file__).resolve().parent
T = TaskUnderTest(HERE)
TASK, ref = T.spec, T.ref
make_inputs, passes = T.make_inputs, T.passes


def loop_attention(q, k, v, causal):
    B, H, L, D = q.shape
    out = np.zeros((B, H, L, D))
    scale = 1.0 / math.sqrt(D)
    for b in range(B):
        for h in range(H):
            for i in range(L):
                keys = range(i + 1) if causal else range(L)
                scores = [
                    scale * math.fsum(float(q[b, h, i, d]) * float(k[b, h, j, d]) for d in range(D))
                    for j in keys
                ]
                m = max(scores)
                w = [math.exp(s - m) for s in scores]
                total = math.fsum(w)
                for d in range(D):
                    out[b, h, i, d] = math.fsum(w[j] * float(v[b, h, j, d]) for j in keys) / total
    return out


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("B,H,L,D", [(1, 1, 1, 4), (2, 3, 5, 8), (1, 2, 17, 3)])
def test_reference_matches_loops(B, H, L, D, causal):
    params = {"B": B, "H": H, "L": L, "D": D, "causal": causal}
    inputs = make_inputs(params, seed=B * 1000 + L * 10 + causal)
    out = ref.reference(inputs, params)["out"]
    assert out.dtype == np.float32 and out.shape == (B, H, L, D)
    expected = loop_attention(inputs["q"], inputs["k"], inputs["v"], causal)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


def test_causal_first_query_sees_only_the_first_key():
    params = {"B": 1, "H": 1, "L": 6, "D": 4, "causal": 1}
    inputs = make_inputs(params, seed=5)
    out = ref.reference(inputs, params)["out"]
    np.testing.assert_allclose(out[0, 0, 0], inputs["v"][0, 0, 0], rtol=1e-6)
    full = ref.reference(inputs, {**params, "causal": 0})["out"]
    # The last query sees every key either way.
    np.testing.assert_allclose(out[0, 0, -1], full[0, 0, -1], rtol=1e-5)


@pytest.mark.parametrize("causal", [0, 1])
def test_baseline_passes_and_trivial_outputs_fail(causal):
    params = {"B": 1, "H": 2, "L": 64, "D": 32, "causal": causal}
    inputs = make_inputs(params, seed=9)
    expected = ref.reference(inputs, params)["out"]
    assert passes(ref.baseline_numpy(inputs, params)["out"], expected)
    assert not passes(np.zeros_like(expected), expected)
    assert not passes(np.full_like(expected, expected.mean()), expected)
    assert not passes(expected * (1 + 4e-3), expected)
    if causal:
        # Forgetting the mask must fail.
        assert not passes(ref.reference(inputs, {**params, "causal": 0})["out"], expected)


def test_baseline_does_not_mutate_inputs():
    params = {"B": 1, "H": 1, "L": 9, "D": 5, "causal": 1}
    inputs = make_inputs(params, seed=3)
    before = {k: v.copy() for k, v in inputs.items()}
    ref.baseline_numpy(inputs, params)
    ref.reference(inputs, params)
    assert all(np.array_equal(before[k], inputs[k]) for k in inputs)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("causal", [0, 1])
def test_seed_kernel_matches_reference(tmp_path, causal):
    # An odd length, so a kernel that assumes blocks of 16 would show it.
    params = {"B": 2, "H": 2, "L": 37, "D": 24, "causal": causal}
    inputs = make_inputs(params, seed=13)
    out = T.run_seed(tmp_path, inputs, "out", params)
    assert passes(out, ref.reference(inputs, params)["out"])
