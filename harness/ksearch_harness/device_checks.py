"""The judge's output checks computed on its GPU instead of with numpy on the host: where the
outputs are (the judge shares the accused's device memory: device_share), or after one copy up
where the judge holds them on the host (mlx, whose memory it cannot reach; cuda without
sharing) and has a CUDA device of its own (`for_host_outputs`).

The arithmetic is core.py's, element for element: outputs and truth in float64, an element is
close when |x - t| <= atol * max|finite t| + rtol * |t|, or equal (NaN to NaN) where the truth
is not finite; the largest absolute and relative errors over finite truth values, NaN when an
output there is NaN. The functions take an array namespace `xp` (PyTorch on the device; numpy
in the tests, which compare them with core.py's host versions on the same arrays) and return
plain Python values.

Only the common case is here: the "scaled" rule with every element required close, and float
element types. Anything else (the FlashInfer "either" rule, matched ratios, integer outputs) and
every failure's details (counts, first index, near misses) stay on the host.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Where the judge holds the outputs on the host (mlx, whose memory it cannot reach, or cuda
# without shared memory), it may still compare them on its own GPU: a copy up and the
# comparison there take a fraction of numpy's passes over the same elements.
# $KSEARCH_HARNESS_DEVICE_CHECKS: `auto` (default: on the judge's GPU where PyTorch has a
# CUDA device) or `off` (every comparison of host outputs stays on the host). On an H100 an
# mlx evaluation's checks took half the time with it (docs/results/evaluation-speed).
MODE_ENV = "KSEARCH_HARNESS_DEVICE_CHECKS"

# Element types these checks decode on the device: the storage bits reinterpreted as the
# float type of the same width (bf16 and f16 widened to float32 exactly).
FLOAT_TYPES = ("f16", "bf16", "f32", "f64")


def for_host_outputs(backend: str | None) -> bool:
    """Whether the judge of `backend` compares outputs it read to the host on its GPU: unless
    $KSEARCH_HARNESS_DEVICE_CHECKS is `off`, where the backend is a GPU one and PyTorch
    imports and has a CUDA device (an NVIDIA GPU, which on mlx is the one MLX runs on: Apple
    silicon has none, and keeps the host's checks)."""
    if (backend in (None, "cpu") or sys.platform == "darwin"
            or os.environ.get(MODE_ENV, "auto").strip().lower() == "off"):
        return False
    return cuda_torch()


def cuda_torch() -> bool:
    """PyTorch imports here and sees a CUDA device (the import is Python's to keep)."""
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a missing or broken install (a library clash) is none
        return False


def supported(dtype: str, rule: str, matched_ratio: float) -> bool:
    return dtype in FLOAT_TYPES and rule == "scaled" and matched_ratio >= 1.0


def decode(bits: Any, dtype: str) -> Any:
    """A device tensor of storage bits (an integer tensor of the element's width) as the float
    values it holds: float32 for f16, bf16 and f32, float64 for f64."""
    import torch
    view = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32,
            "f64": torch.float64}[dtype]
    x = bits.view(view)
    return x.float() if dtype in ("f16", "bf16") else x


def _f64(xp: Any, a: Any) -> Any:
    return a.astype(xp.float64) if hasattr(a, "astype") else a.to(xp.float64)


def _same(xp: Any, x: Any, y: Any) -> Any:
    """Equal, or both NaN."""
    return xp.logical_or(x == y, xp.logical_and(xp.isnan(x), xp.isnan(y)))


def _scale(xp: Any, t: Any, finite: Any) -> float:
    """max |t| over finite t (0.0 when none is finite)."""
    at = xp.abs(t)
    if bool(finite.all()):
        return float(at.max())
    kept = at[finite]
    count = kept.numel() if hasattr(kept, "numel") else kept.size
    return float(kept.max()) if count else 0.0


def compare(xp: Any, out: Any, truth: Any, atol: float, rtol: float) -> tuple[bool, float, float]:
    """(every element close, max abs error, max rel error) of `out` against `truth`, as
    core.compare: the relative error's denominator is at least 1e-6 max|truth|; both maxima are
    0.0 when no truth value is finite."""
    x, t = _f64(xp, out).reshape(-1), _f64(xp, truth).reshape(-1)
    finite = xp.isfinite(t)
    if not bool(finite.any()):
        return bool(_same(xp, x, t).all()), 0.0, 0.0
    scale = _scale(xp, t, finite)
    at = xp.abs(t)
    diff = xp.abs(x - t)
    within = diff <= atol * scale + rtol * at
    close = xp.where(finite, xp.logical_or(within, _same(xp, x, t)), _same(xp, x, t))
    ok = bool(close.all())
    if bool(finite.all()):
        d, a = diff, at
    else:
        d, a = diff[finite], at[finite]
    floor = max(scale * 1e-6, 1e-300)
    max_abs = float(d.max())
    max_rel = float((d / xp.maximum(a, xp.full_like(a, floor))).max())
    return ok, max_abs, max_rel


def close_all(xp: Any, x: Any, y: Any, truth: Any, atol: float, rtol: float) -> bool:
    """core.close_all: every |x - y| within the truth's bound where the truth is finite, x and
    y equal (NaN to NaN) where it is not."""
    x, y, t = (_f64(xp, a).reshape(-1) for a in (x, y, truth))
    finite = xp.isfinite(t)
    bound = atol * _scale(xp, t, finite) + rtol * xp.abs(t)
    within = xp.abs(x - y) <= bound
    same = _same(xp, x, y)
    return bool(xp.where(finite, xp.logical_or(within, same), same).all())


def signed(pattern: int, width: int) -> int:
    """An unsigned bit pattern as the signed integer of `width` bytes with the same bits (the
    device's bit tensors are signed)."""
    top = 1 << (8 * width)
    return pattern - top if pattern >= top >> 1 else pattern
