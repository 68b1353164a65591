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
    small positive steps, since a negative dt would make the recurrence grow. GPU workloads
    may ask for a `decay` regime: "near0" (dt ~ 1.7..4.5, every exp(dt A) below 0.45, most
    below 0.01: the state forgets at once) or "near1" (dt ~ 1e-3, every exp(dt A) above 0.75,
    most above 0.98: the state carries over thousands of steps, so a scan that drops or
    reorders a chunk's carry shows)."""
    regime = params.get("decay", "mixed")
    if regime == "near0":
        return rng.uniform(2.0, 4.0, size=shape).astype(np.float32)
    if regime == "near1":
        if not params["softplus"]:
            raise ValueError("decay = near1 needs softplus = 1 (dt = softplus(delta + bias))")
        return rng.normal(-7.0, 0.5, size=shape).astype(np.float32)
    if regime != "mixed":
        raise ValueError(f"unknown decay regime {regime!r} (mixed, near0, near1)")
    if params["softplus"]:
        return rng.normal(-2.0, 1.0, size=shape).astype(np.float32)
    return rng.uniform(0.01, 0.2, size=shape).astype(np.float32)


def make_delta_spikes(rng, shape, params):
    """`make_delta`'s draw with every 16th element (from the 8th) replaced by a spike drawn
    from [20, 100], the first of them exactly 100: dt past 20 takes softplus's threshold
    branch (dt itself), and past 88.7 a kernel that computes log1p(exp(dt)) in float32 gets
    inf. Without softplus such a step simply forgets the state (exp(dt A) is 0). Every draw
    of eight elements or more has a value of 100: the `reach` task.toml declares."""
    delta = make_delta(rng, shape, params)
    spikes = delta.reshape(-1)[7::16]
    spikes[:] = rng.uniform(20.0, 100.0, size=spikes.shape)
    if spikes.size:
        spikes[0] = 100.0
    return delta


def make_delta_bias(rng, shape, params):
    """Non-zero, so a kernel that forgets the bias fails; non-negative without softplus, so
    dt stays positive."""
    if params["softplus"]:
        return rng.uniform(-0.5, 0.5, size=shape).astype(np.float32)
    return rng.uniform(0.0, 0.05, size=shape).astype(np.float32)


# -- GPU backends (cuda, mlx) --------------------------------------------------------------------
# u, delta, B, C, z and y are f16 there (A, D and delta_bias stay float32). The correctness truth
# is float64; the timed "reference" is a float32 log-depth scan on the device, the baseline the
# per-step loop that mlx-lm and mamba_ssm's selective_scan_ref run (float32 state).

# Elements of [L, batch, channels, N] per block of the host truth: bounds its memory (about
# four float64 arrays of this size) while keeping the Python loop over t short.
_TRUTH_BLOCK = 1 << 23


def reference_blocked(inputs, params):
    """`reference`, computed a block of channels at a time so that long, wide workloads fit in
    memory: channels are independent, so this is the same float64 computation."""
    batch, dim, L = inputs["u"].shape
    N = inputs["A"].shape[1]
    step = max(1, _TRUTH_BLOCK // max(1, L * batch * N))
    y = np.empty((batch, dim, L), dtype=np.float32)
    for d0 in range(0, dim, step):
        sl = slice(d0, min(dim, d0 + step))
        part = dict(inputs)
        for k in ("u", "delta", "z"):          # [batch, dim, L]
            part[k] = inputs[k][:, sl]
        for k in ("A", "D", "delta_bias"):     # channel first
            part[k] = inputs[k][sl]
        y[:, sl] = _scan(part, params, np.float64)
    return {"y": y}


_INPUTS = ("u", "delta", "z", "A", "B", "C", "D", "delta_bias")


def _cast_inputs(t, cast):
    """The inputs of the PyTorch and MLX scans through `cast` (a dtype conversion), with
    dt = delta + bias before any softplus: (u, z, A, B, C, D, dt)."""
    u, delta, z, A, B, C, D, bias = (cast(t[k]) for k in _INPUTS)
    return u, z, A, B, C, D, delta + bias[None, :, None]


def scan_torch(t, params, dtype):
    """The scan with PyTorch in `dtype` on tensors `t` (any device): pairs (exp(dt A), dt B u)
    composed by a Hillis-Steele scan over time, log2(L) passes over [batch, dim, L, N]."""
    import torch

    u, z, A, B, C, D, dt = _cast_inputs(t, lambda x: x.to(dtype))
    if params["softplus"]:
        dt = torch.where(dt > 20.0, dt, torch.log1p(torch.exp(torch.clamp(dt, max=20.0))))
    a = torch.exp(dt[..., None] * A[None, :, None, :])              # [batch, dim, L, N]
    h = (dt * u)[..., None] * B.transpose(1, 2)[:, None]
    L = u.shape[-1]
    s = 1
    while s < L:
        # The right-hand sides are evaluated into new tensors before the slices are written.
        h[:, :, s:] = a[:, :, s:] * h[:, :, :-s] + h[:, :, s:]
        a[:, :, s:] = a[:, :, s:] * a[:, :, :-s]
        s *= 2
    y = (h * C.transpose(1, 2)[:, None]).sum(-1) + D[None, :, None] * u
    if params["has_z"]:
        y = y * (z * torch.sigmoid(z))
    return y


def reference_torch(inputs, params):
    """The cuda backend's reference: the float32 scan on the GPU when timed; otherwise (the
    truth) the same scan in float64 on the GPU from the exact host values."""
    from ksearch_harness.adapters import device

    import torch

    if not device.timed():
        t = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64)).cuda()
             for k, v in inputs.items()}
        return {"y": scan_torch(t, params, torch.float64).float().cpu().numpy()}
    t = device.torch_inputs(inputs, params)
    return {"y": device.host(scan_torch(t, params, torch.float32))}


def loop_torch(t, params):
    """The per-step recurrence with PyTorch, float32 state: L steps of a few kernels each."""
    import torch

    f = torch.float32
    u, z, A, B, C, D, dt = _cast_inputs(t, lambda x: x.to(f))
    if params["softplus"]:
        dt = torch.nn.functional.softplus(dt)
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=f, device=u.device)
    ys = []
    for i in range(u.shape[-1]):
        h = torch.exp(dt[:, :, i, None] * A) * h + (dt[:, :, i] * u[:, :, i])[..., None] * B[:, None, :, i]
        ys.append((h * C[:, None, :, i]).sum(-1))
    y = torch.stack(ys, dim=-1) + D[None, :, None] * u
    if params["has_z"]:
        y = y * (z * torch.sigmoid(z))
    return y


def baseline_torch_loop(inputs, params):
    """The cuda backend's baseline: the per-step loop (mamba_ssm's selective_scan_ref) on the
    GPU, output in the workload's dtype."""
    from ksearch_harness.adapters import device

    t = device.torch_inputs(inputs, params)
    return {"y": device.host(loop_torch(t, params).to(t["u"].dtype))}


def _mlx():
    import os

    # MLX uses TF32 for float32 matrix products on NVIDIA GPUs unless told otherwise.
    os.environ.setdefault("MLX_ENABLE_TF32", "0")
    import mlx.core as mx

    return mx


def scan_mlx(a_in, params):
    """The float32 scan with MLX ops: the same Hillis-Steele scan as scan_torch, with shifted
    copies instead of slice updates."""
    mx = _mlx()
    f = mx.float32
    u, z, A, B, C, D, dt = _cast_inputs(a_in, lambda x: x.astype(f))
    if params["softplus"]:
        dt = mx.where(dt > 20.0, dt, mx.log1p(mx.exp(mx.minimum(dt, 20.0))))
    a = mx.exp(dt[..., None] * A[None, :, None, :])
    h = (dt * u)[..., None] * mx.swapaxes(B, 1, 2)[:, None]
    L = u.shape[-1]
    s = 1
    while s < L:
        pad = [(0, 0), (0, 0), (s, 0), (0, 0)]
        h_prev = mx.pad(h[:, :, :-s], pad)
        a_prev = mx.pad(a[:, :, :-s], pad, constant_values=1.0)
        h = a * h_prev + h
        a = a * a_prev
        s *= 2
    y = (h * mx.swapaxes(C, 1, 2)[:, None]).sum(-1) + D[None, :, None] * u
    if params["has_z"]:
        y = y * (z * mx.sigmoid(z))
    return y


# Above this many (batch, channel, step, state) elements the host float64 truth takes seconds;
# the device's float32 scan is then the truth (its error, ~1e-7 relative, is far below the f16
# tolerance).
_HOST_TRUTH_MAX = 1 << 24


def reference_mlx(inputs, params):
    """The mlx backend's reference: the float32 scan with MLX ops when timed or when the
    workload is large; otherwise the float64 host truth (MLX has no float64 on GPUs)."""
    from ksearch_harness.adapters import device

    size = params["batch"] * params["dim"] * params["L"] * params["N"]
    if not device.timed() and size <= _HOST_TRUTH_MAX:
        return reference_blocked(inputs, params)
    return {"y": device.host(scan_mlx(device.mlx_inputs(inputs, params), params))}


def loop_mlx(a_in, params):
    """mlx-lm's per-step recurrence (MambaBlock.ssm_step's ops, one step at a time), with a
    float32 state so that it passes the tolerance."""
    mx = _mlx()
    f = mx.float32
    u, z, A, B, C, D, dt = _cast_inputs(a_in, lambda x: x.astype(f))
    if params["softplus"]:
        dt = mx.logaddexp(dt, 0.0)
    state = None
    ys = []
    for i in range(u.shape[-1]):
        d_i, x_i = dt[:, :, i], u[:, :, i]
        new = mx.expand_dims(d_i * x_i, -1) * mx.expand_dims(B[:, :, i], 1)
        if state is not None:
            new = new + state * mx.exp(mx.expand_dims(d_i, -1) * A)
        state = new
        ys.append((state @ mx.expand_dims(C[:, :, i], -1)).squeeze(-1))
    y = mx.stack(ys, axis=-1) + D[None, :, None] * u
    if params["has_z"]:
        y = y * (z * mx.sigmoid(z))
    return y


def baseline_mlx_loop(inputs, params):
    """The mlx backend's baseline: mlx-lm's per-step loop, output in the workload's dtype."""
    from ksearch_harness.adapters import device

    a_in = device.mlx_inputs(inputs, params)
    return {"y": device.host(loop_mlx(a_in, params).astype(a_in["u"].dtype))}
