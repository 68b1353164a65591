"""Ground truth and baseline for the attention task (see task.toml)."""

import numpy as np


def _mask(L):
    # True where key j lies after query i: those scores are excluded.
    return np.triu(np.ones((L, L), dtype=bool), k=1)


def reference(inputs, params):
    """Scaled dot-product attention in float64, returned as float32."""
    q = np.asarray(inputs["q"], dtype=np.float64)
    k = np.asarray(inputs["k"], dtype=np.float64)
    v = np.asarray(inputs["v"], dtype=np.float64)
    D = q.shape[-1]
    s = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(D)
    if params["causal"]:
        s = np.where(_mask(q.shape[-2]), -np.inf, s)
    s = s - s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return {"out": np.matmul(p, v).astype(np.float32)}


def baseline_numpy(inputs, params):
    """What a numpy user would write, in float32: the timed baseline."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    D = q.shape[-1]
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= np.float32(1.0 / np.sqrt(D))
    if params["causal"]:
        s[..., _mask(q.shape[-2])] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return {"out": np.matmul(s, v)}
