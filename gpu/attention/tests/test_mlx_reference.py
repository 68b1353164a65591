"""The mlx backend's reference (tasks/attention/reference.py) computes attention a block of query
rows at a time; on MLX's CPU device it must give what the float64 formula gives, for any block
size, causal or not, including blocks that do not divide the length."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tasks" / "attention"))

from reference import attention_mlx_f32  # noqa: E402


def f64_attention(q, k, v, causal):
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if causal:
        L = q.shape[-2]
        s = np.where(np.arange(L)[None, :] > np.arange(L)[:, None], -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(axis=-1, keepdims=True)) @ v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("max_scores", [1, 2 * 3 * 37 * 5, 1 << 24])
def test_blocked_rows_match_the_float64_formula(causal, max_scores):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, 37, 16)) for _ in range(3))
    want = f64_attention(q, k, v, causal)
    got = attention_mlx_f32(mx, *(mx.array(x.astype(np.float32)) for x in (q, k, v)), causal,
                            max_scores=max_scores)
    got = np.array(got)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_the_blocks_bound_the_scores_held_at_once():
    # 2 x 3 x 37 scores per query row: a budget of 5 rows' worth gives blocks of 5 rows.
    q = k = v = mx.zeros((2, 3, 37, 16))
    calls = []
    real_softmax = mx.softmax

    def counting(s, *a, **kw):
        calls.append(s.shape)
        return real_softmax(s, *a, **kw)

    mx.softmax = counting
    try:
        attention_mlx_f32(mx, q, k, v, True, max_scores=2 * 3 * 37 * 5)
    finally:
        mx.softmax = real_softmax
    assert [c[2] for c in calls] == [5] * 7 + [2]
