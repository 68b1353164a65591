"""The selective scan in float64 numpy, with the extras a model needs (a state in and out, the
channel-last layout): the yardstick of the CPU tests and of the device checks. With h0 = None
and the task's layout it is the same computation as tasks/selective-scan/reference.py (a test
holds the two together)."""

from __future__ import annotations

import numpy as np


def softplus(x):
    x = np.asarray(x, dtype=np.float64)
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def scan_ref(u, delta, A, B, C, D, z, delta_bias, h0=None, *, has_z=True, softplus_dt=True,
             channel_last=False):
    """(y, h_last) in float64. u, delta, z: [batch, dim, L] ([batch, L, dim] if channel_last);
    B, C: [batch, N, L] ([batch, L, N]); A: [dim, N]; D, delta_bias: [dim]; h0: [batch, dim, N]
    or None (zeros). y comes back in the layout of u."""
    f = lambda x: np.asarray(x, dtype=np.float64)
    u, delta, z, B, C = f(u), f(delta), f(z), f(B), f(C)
    if channel_last:
        u, delta, z = (np.swapaxes(x, 1, 2) for x in (u, delta, z))
        B, C = np.swapaxes(B, 1, 2), np.swapaxes(C, 1, 2)
    A, D, bias = f(A), f(D), f(delta_bias)
    batch, dim, L = u.shape
    N = A.shape[1]
    dt = delta + bias[None, :, None]
    if softplus_dt:
        dt = softplus(dt)
    h = np.zeros((batch, dim, N)) if h0 is None else f(h0).copy()
    y = np.empty((batch, dim, L))
    for t in range(L):
        a = np.exp(dt[:, :, t, None] * A[None])
        h = a * h + (dt[:, :, t] * u[:, :, t])[:, :, None] * B[:, None, :, t]
        y[:, :, t] = np.einsum("bdn,bn->bd", h, C[:, :, t])
    y += D[None, :, None] * u
    if has_z:
        y *= z / (1.0 + np.exp(-z))
    if channel_last:
        y = np.swapaxes(y, 1, 2)
    return y, h


def make_inputs(rng, batch, dim, L, N, *, regime="mixed", channel_last=False, with_h0=False):
    """Inputs as the task draws them (mixed decays), or with every decay near 0 ("near0") or
    near 1 ("near1"); float32 arrays in the requested layout."""
    seq = (batch, L, dim) if channel_last else (batch, dim, L)
    bc = (batch, L, N) if channel_last else (batch, N, L)
    A = -np.exp(rng.uniform(np.log(0.5), np.log(16.0), size=(dim, N)))
    if regime == "near0":
        delta = rng.uniform(2.0, 4.0, size=seq)
    elif regime == "near1":
        delta = rng.normal(-7.0, 0.5, size=seq)
    else:
        delta = rng.normal(-2.0, 1.0, size=seq)
    out = {
        "u": rng.normal(size=seq), "delta": delta, "A": A,
        "B": rng.normal(size=bc), "C": rng.normal(size=bc),
        "D": rng.normal(1.0, 0.5, size=dim), "z": rng.normal(size=seq),
        "delta_bias": rng.uniform(-0.5, 0.5, size=dim),
    }
    if with_h0:
        out["h0"] = rng.normal(size=(batch, dim, N))
    return {k: v.astype(np.float32) for k, v in out.items()}
