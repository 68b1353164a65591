"""Ground truth, baseline and input generators for the selective-scan task (see task.toml)."""

import numpy as np


def _dt(delta, delta_bias, softplus, xp_dtype):
    dt = delta.astype(xp_dtype) + delta_bias.astype(xp_dtype)[None, :, None]
    if softplus:
        # Above 20, log1p(exp(x)) equals x to float precision and exp would only risk overflow.
        dt = np.where(dt > 20.0, dt, np.log1p(np.exp(np.minimum(dt, 20.0))))
    return dt


def _scan(inputs, params, dtype):
    u = inputs["u"].astype(dtype)
    A = inputs["A"].astype(dtype)
    B = inputs["B"].astype(dtype)
    C = inputs["C"].astype(dtype)
    D = inputs["D"].astype(dtype)
    dt = _dt(inputs["delta"], inputs["delta_bias"], params["softplus"], dtype)
    # Time-major [L, batch, dim, N], so each step of the recurrence works on one contiguous
    # block and only the loop over t runs in Python.
    dt_t = np.moveaxis(dt, 2, 0)[..., None]                       # [L, batch, dim, 1]
    decay = np.exp(dt_t * A[None, None])                          # [L, batch, dim, N]
    h = (dt_t * np.moveaxis(u, 2, 0)[..., None]) * np.moveaxis(B, 2, 0)[:, :, None, :]
    for t in range(1, h.shape[0]):
        # h_t = decay_t * h_{t-1} + dt_t * B_t * u_t, accumulated in place.
        h[t] += decay[t] * h[t - 1]
    y = np.einsum("lbdn,lbn->bdl", h, np.moveaxis(C, 2, 0))
    y += D[None, :, None] * u
    if params["has_z"]:
        z = inputs["z"].astype(dtype)
        y *= z / (1.0 + np.exp(-z))
    return y


def reference(inputs, params):
    """The selective scan in float64, returned as float32."""
    return {"y": _scan(inputs, params, np.float64).astype(np.float32)}


def baseline_numpy(inputs, params):
    """The same scan in float32, vectorised over batch, channels and state: the timed
    baseline."""
    return {"y": _scan(inputs, params, np.float32)}


def make_A(rng, shape, params):
    """Negative decay rates whose magnitudes are log-uniform in [0.5, 16], so exp(dt * A)
    spans from near 0 (fast forgetting) to near 1 (long memory)."""
    mag = np.exp(rng.uniform(np.log(0.5), np.log(16.0), size=shape))
    return (-mag).astype(np.float32)


def make_delta(rng, shape, params):
    """Pre-softplus step sizes around -2 (dt ~ 0.02..0.7 after softplus); without softplus,
    small positive steps, since a negative dt would make the recurrence grow."""
    if params["softplus"]:
        return rng.normal(-2.0, 1.0, size=shape).astype(np.float32)
    return rng.uniform(0.01, 0.2, size=shape).astype(np.float32)


def make_delta_bias(rng, shape, params):
    """Non-zero, so a kernel that forgets the bias fails; non-negative without softplus, so
    dt stays positive."""
    if params["softplus"]:
        return rng.uniform(-0.5, 0.5, size=shape).astype(np.float32)
    return rng.uniform(0.0, 0.05, size=shape).astype(np.float32)
