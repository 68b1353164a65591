"""Checks the selective-scan reference against an independent loop implementation, the input
generators, the tolerance against trivial outputs, and the seed kernel through ctypes.

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


def loop_scan(inp, has_z, softplus):
    u, delta, A, B, C, D, z, bias = (
        inp[k].astype(np.float64) for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias")
    )
    batch, dim, L = u.shape
    N = A.shape[1]
    y = np.zeros((batch, dim, L))
    for b in range(batch):
        for d in range(dim):
            h = [0.0] * N
            for t in range(L):
                dt = delta[b, d, t] + bias[d]
                if softplus and dt <= 20.0:
                    dt = math.log(1.0 + math.exp(dt))
                acc = 0.0
                for n in range(N):
                    h[n] = math.exp(dt * A[d, n]) * h[n] + dt * B[b, n, t] * u[b, d, t]
                    acc += h[n] * C[b, n, t]
                out = acc + D[d] * u[b, d, t]
                if has_z:
                    zz = z[b, d, t]
                    out *= zz / (1.0 + math.exp(-zz))
                y[b, d, t] = out
    return y


def params_for(batch, dim, L, N, has_z, softplus):
    return {"batch": batch, "dim": dim, "L": L, "N": N, "has_z": has_z, "softplus": softplus}


@pytest.mark.parametrize("has_z", [0, 1])
@pytest.mark.parametrize("softplus", [0, 1])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 9, 4)])
def test_reference_matches_loops(shape, has_z, softplus):
    params = params_for(*shape, has_z, softplus)
    inputs = make_inputs(params, seed=sum(shape) * 4 + has_z * 2 + softplus)
    y = ref.reference(inputs, params)["y"]
    assert y.dtype == np.float32 and y.shape == (shape[0], shape[1], shape[2])
    np.testing.assert_allclose(y, loop_scan(inputs, has_z, softplus), rtol=1e-5, atol=1e-6)


def test_softplus_threshold_keeps_large_steps():
    params = params_for(1, 1, 3, 2, 0, 1)
    inputs = make_inputs(params, seed=1)
    inputs["delta"][:] = np.array([25.0, 30.0, 50.0], dtype=np.float32)
    y = ref.reference(inputs, params)["y"]
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, loop_scan(inputs, 0, 1), rtol=1e-5)


def test_generators_give_realistic_ranges():
    rng = np.random.default_rng(0)
    A = ref.make_A(rng, (512, 16), {})
    assert A.dtype == np.float32 and np.all(A < 0)
    assert -16.0 <= A.min() < -12.0 and -0.6 < A.max() <= -0.5
    for softplus in (0, 1):
        p = params_for(1, 512, 256, 16, 0, softplus)
        inputs = make_inputs(p, seed=1)
        dt = inputs["delta"].astype(np.float64) + inputs["delta_bias"][None, :, None]
        if softplus:
            dt = np.log1p(np.exp(dt))
        assert np.all(dt > 0) and np.median(dt) < 0.5
        assert np.all(inputs["delta_bias"] != 0) or softplus == 0
        decay = np.exp(dt[0, :, :, None] * inputs["A"][:, None, :])
        # Both fast forgetting and long memory occur.
        assert decay.min() < 0.05 and decay.max() > 0.99


def test_baseline_passes_and_trivial_outputs_fail():
    params = params_for(1, 32, 300, 16, 1, 1)
    inputs = make_inputs(params, seed=21)
    expected = ref.reference(inputs, params)["y"]
    assert passes(ref.baseline_numpy(inputs, params)["y"], expected)
    assert not passes(np.zeros_like(expected), expected)
    assert not passes(np.full_like(expected, expected.mean()), expected)
    assert not passes(expected * (1 + 4e-3), expected)
    # Each option changes the answer, so a kernel ignoring one fails.
    with np.errstate(over="ignore", invalid="ignore"):
        # Without softplus these negative pre-activations make the recurrence blow up.
        for key in ("has_z", "softplus"):
            assert not passes(ref.reference(inputs, {**params, key: 0})["y"], expected)
    no_bias = {**inputs, "delta_bias": np.zeros_like(inputs["delta_bias"])}
    assert not passes(ref.reference(no_bias, params)["y"], expected)


def test_baseline_does_not_mutate_inputs():
    params = params_for(2, 3, 11, 4, 1, 1)
    inputs = make_inputs(params, seed=3)
    before = {k: v.copy() for k, v in inputs.items()}
    ref.baseline_numpy(inputs, params)
    ref.reference(inputs, params)
    assert all(np.array_equal(before[k], inputs[k]) for k in inputs)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("has_z,softplus", [(1, 1), (0, 0)])
def test_seed_kernel_matches_reference(tmp_path, has_z, softplus):
    params = params_for(2, 24, 777, 16, has_z, softplus)
    inputs = make_inputs(params, seed=17)
    y = T.run_seed(tmp_path, inputs, "y", params)
    assert passes(y, ref.reference(inputs, params)["y"])
