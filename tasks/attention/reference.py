"""Ground truth and baselines for the attention task (see task.toml)."""

import math
import os

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


# -- GPU backends -------------------------------------------------------------------------------
# Called inside the harness (docs/backends.md): inputs arrive as host numpy arrays (bf16 as the
# float32 values it encodes) and `ksearch_harness.adapters.device` supplies device copies, so a
# timed call times the device work and not the transfers.

# The float64 `reference` is the truth when it fits in a fraction of a second on the host:
# at most this many scores (B·H·L²) and FLOPs; larger workloads take the device reference in
# float32.
TRUTH_MAX_SCORES = 1 << 24
TRUTH_MAX_FLOPS = 2e9


def _affordable(params):
    B, H, L, D = (params[n] for n in ("B", "H", "L", "D"))
    flops = 4 * B * H * L * L * D / (1 + params["causal"])
    return B * H * L * L <= TRUTH_MAX_SCORES and flops <= TRUTH_MAX_FLOPS


def reference_torch(inputs, params):
    """The cuda backend's reference: attention in float32 with PyTorch on the GPU (what is
    timed as `reference`), or the float64 host reference when untimed and affordable."""
    from ksearch_harness.adapters import device

    if not device.timed() and _affordable(params):
        return reference(inputs, params)
    import torch

    t = device.torch_inputs(inputs, params)
    q, k, v = (t[n].float() for n in ("q", "k", "v"))
    L = q.shape[-2]
    s = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if params["causal"]:
        s.masked_fill_(torch.triu(torch.ones(L, L, dtype=torch.bool, device=s.device), 1),
                       float("-inf"))
    out = torch.matmul(torch.softmax(s, dim=-1), v)
    return {"out": device.host(out)}


def baseline_torch_sdpa(inputs, params):
    """The cuda backend's baseline: PyTorch's fused scaled_dot_product_attention in the
    workload's dtype."""
    import torch.nn.functional as F
    from ksearch_harness.adapters import device

    t = device.torch_inputs(inputs, params)
    out = F.scaled_dot_product_attention(t["q"], t["k"], t["v"],
                                         is_causal=bool(params["causal"]))
    return {"out": device.host(out)}


def _mlx():
    # MLX's float32 matrix products use TF32 on NVIDIA GPUs unless told otherwise; a truth
    # needs full float32.
    os.environ.setdefault("MLX_ENABLE_TF32", "0")
    import mlx.core as mx

    return mx


def reference_mlx(inputs, params):
    """The mlx backend's reference: attention in float32 with MLX ops (timed as `reference`),
    or the float64 host reference when untimed and affordable."""
    from ksearch_harness.adapters import device

    if not device.timed() and _affordable(params):
        return reference(inputs, params)
    mx = _mlx()
    a = device.mlx_inputs(inputs, params)
    q, k, v = (a[n].astype(mx.float32) for n in ("q", "k", "v"))
    return {"out": device.host(attention_mlx_f32(mx, q, k, v, bool(params["causal"])))}


# Scores held at once by the MLX reference (float32): 64 MiB. Unchunked, B1 H32 L4096 made
# three 2 GiB temporaries per call (scores, masked scores, probabilities), allocated and freed
# in managed memory next to the timed calls of the other contenders.
MLX_REFERENCE_CHUNK_SCORES = 1 << 24


def attention_mlx_f32(mx, q, k, v, causal, max_scores=MLX_REFERENCE_CHUNK_SCORES):
    """Attention in float32 with MLX ops, a block of query rows at a time so that at most
    `max_scores` scores exist at once. Rows are independent (each has its own softmax), so the
    blocks compute exactly what one pass over all rows would."""
    B, H, L, D = q.shape
    rows = max(1, min(L, max_scores // max(1, B * H * L)))
    scale = 1.0 / math.sqrt(D)
    kt = k.swapaxes(-1, -2)
    cols = mx.arange(L)[None, :]
    parts = []
    for r0 in range(0, L, rows):
        r1 = min(L, r0 + rows)
        s = (q[:, :, r0:r1, :] @ kt) * scale
        if causal:
            s = mx.where(cols > mx.arange(r0, r1)[:, None], float("-inf"), s)
        part = mx.softmax(s, axis=-1, precise=True) @ v
        # Evaluated block by block: left lazy, MLX would build every block's scores in one
        # graph and hold them together.
        mx.eval(part)
        parts.append(part)
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)


def baseline_mlx_native(inputs, params):
    """The mlx backend's baseline: mx.fast.scaled_dot_product_attention (cuDNN's fused
    attention for f16/bf16 on NVIDIA GPUs, the steel kernel on Apple GPUs)."""
    from ksearch_harness.adapters import device

    mx = _mlx()
    a = device.mlx_inputs(inputs, params)
    out = mx.fast.scaled_dot_product_attention(
        a["q"], a["k"], a["v"], scale=1.0 / math.sqrt(a["q"].shape[-1]),
        mask="causal" if params["causal"] else None)
    return {"out": device.host(out)}
