"""device_checks against core.py's host checks: the same verdicts and error figures on the same
arrays (numpy standing in for PyTorch's namespace; on a GPU the functions run with torch, which
harness/tests/device_share_check.py compares the same way)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ksearch_harness import core, device_checks, dtypes
from ksearch_harness.protocol import Tolerance

TOL = Tolerance(rtol=1e-3, atol=1e-4)
# numpy warns about inf - inf; the checks mean it (NaN, then not close).
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _cases():
    rng = np.random.default_rng(3)
    t = rng.standard_normal(4096).astype(np.float32)
    near = t * (1 + 0.5e-3 * rng.standard_normal(t.size)).astype(np.float32)
    far = t.copy()
    far[17] += 1.0
    t_nonfinite = t.copy()
    t_nonfinite[[3, 9, 40]] = [np.nan, np.inf, -np.inf]
    x_matches_nonfinite = near.copy()
    x_matches_nonfinite[[3, 9, 40]] = [np.nan, np.inf, -np.inf]
    x_misses_nonfinite = near.copy()
    x_misses_nonfinite[[3, 9, 40]] = [0.0, np.inf, np.inf]
    x_nan = near.copy()
    x_nan[100] = np.nan
    all_nan = np.full(64, np.nan, np.float32)
    return [
        ("identical", t, t),
        ("within tolerance", near, t),
        ("one far element", far, t),
        ("nonfinite truth, matched", x_matches_nonfinite, t_nonfinite),
        ("nonfinite truth, missed", x_misses_nonfinite, t_nonfinite),
        ("output NaN where the truth is finite", x_nan, t),
        ("no finite truth", all_nan, all_nan),
        ("float64", near.astype(np.float64), t.astype(np.float64)),
        ("zeros", np.zeros(128, np.float32), np.zeros(128, np.float32)),
    ]


def _same_float(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("name,x,t", _cases(), ids=[c[0] for c in _cases()])
def test_compare_matches_the_host(name, x, t):
    host = core.compare(x, t, TOL)
    ok, max_abs, max_rel = device_checks.compare(np, x, t, TOL.atol, TOL.rtol)
    assert ok == host.ok
    assert _same_float(max_abs, host.max_abs), (max_abs, host.max_abs)
    assert _same_float(max_rel, host.max_rel), (max_rel, host.max_rel)


@pytest.mark.parametrize("name,x,t", _cases(), ids=[c[0] for c in _cases()])
def test_close_all_matches_the_host(name, x, t):
    rng = np.random.default_rng(5)
    y = (x * (1 + 1e-4 * rng.standard_normal(x.size))).astype(x.dtype)
    for a, b in ((x, t), (x, y), (t, y)):
        assert device_checks.close_all(np, a, b, t, TOL.atol, TOL.rtol) == \
            core.close_all(a, b, t, TOL)


def test_poison_patterns_compare_as_signed_bits():
    for name in device_checks.FLOAT_TYPES:
        dt = dtypes.get(name)
        width = dt.bits.itemsize
        signed = np.dtype(f"i{width}")
        poisoned = dt.poison((5,), "a").view(signed)
        assert (poisoned == device_checks.signed(dt.poison_a, width)).all()
        assert not (poisoned == device_checks.signed(dt.poison_b, width)).any()


def test_rules_and_types_left_to_the_host():
    assert device_checks.supported("bf16", "scaled", 1.0)
    assert not device_checks.supported("i32", "scaled", 1.0)
    assert not device_checks.supported("f32", "either", 1.0)
    assert not device_checks.supported("f32", "scaled", 0.99)
