"""Checks the softmax reference against an independent loop implementation, the tolerance
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


def loop_softmax(x):
    rows, cols = x.shape
    y = np.empty((rows, cols))
    for r in range(rows):
        row = [float(v) for v in x[r]]
        m = max(row)
        e = [math.exp(v - m) for v in row]
        s = math.fsum(e)
        for c in range(cols):
            y[r, c] = e[c] / s
    return y


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (5, 130), (2, 1000)])
def test_reference_matches_loops(rows, cols):
    params = {"rows": rows, "cols": cols}
    inputs = make_inputs(params, seed=rows * 1000 + cols)
    y = ref.reference(inputs, params)["y"]
    assert y.dtype == np.float32 and y.shape == (rows, cols)
    np.testing.assert_allclose(y, loop_softmax(inputs["x"]), rtol=1e-6, atol=1e-12)


def test_reference_survives_large_logits():
    x = np.array([[1000.0, 999.0, -1000.0], [-5e3, -5e3, -5e3]], dtype=np.float32)
    y = ref.reference({"x": x}, {"rows": 2, "cols": 3})["y"]
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[1], 1.0 / 3.0, rtol=1e-6)


def test_baseline_passes_and_trivial_outputs_fail():
    for w in TASK["workloads"][:1]:
        params = dict(w["params"])
        inputs = make_inputs(params, seed=7)
        expected = ref.reference(inputs, params)["y"]
        assert passes(ref.baseline_numpy(inputs, params)["y"], expected)
        assert not passes(np.zeros_like(expected), expected)
        assert not passes(np.full_like(expected, expected.mean()), expected)
        # The tolerance is tight enough to see a bf16-sized error.
        assert not passes(expected * (1 + 4e-3), expected)


def test_baseline_does_not_mutate_inputs():
    params = {"rows": 4, "cols": 33}
    inputs = make_inputs(params, seed=3)
    before = inputs["x"].copy()
    ref.baseline_numpy(inputs, params)
    ref.reference(inputs, params)
    assert np.array_equal(before, inputs["x"])


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH")
@pytest.mark.parametrize("rows,cols", [(3, 1000), (1, 4099)])
def test_seed_kernel_matches_reference(tmp_path, rows, cols):
    params = {"rows": rows, "cols": cols}
    inputs = make_inputs(params, seed=11)
    y = T.run_seed(tmp_path, inputs, "y", params)
    assert passes(y, ref.reference(inputs, params)["y"])
