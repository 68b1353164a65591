"""Ground truth and baselines for the copy task (see task.toml and README.md).

Every baseline is a plain copy on its backend, so a candidate that makes the same copy should
score 1.00: the task calibrates the evaluator's ratios for bandwidth-bound work.
"""

import numpy as np


def reference(inputs, params):
    """The truth: a copy of x, in x's own dtype (a copy is exact, so there is nothing to
    compute in float64)."""
    return {"y": np.array(inputs["x"], copy=True)}


# The cpu baseline's output buffer, kept from call to call (one at a time: the harness times one
# workload after another). np.copyto into it is a memcpy, like the candidate's write into the
# harness's output buffer. `x.copy()` would allocate a new array on every call, and glibc maps
# each one afresh (above 32 MiB always), so every call would also fault in and zero its pages:
# measured on a 2-core Xeon VM, x.copy() took 1.9x as long as np.copyto at 64 MiB and 5x at
# 256 MiB, and a memcpy seed would have scored that much instead of 1.00.
_kept = {"out": None}


def baseline_numpy(inputs, params):
    """The cpu backend's baseline: np.copyto into an output buffer kept between calls."""
    x = inputs["x"]
    out = _kept["out"]
    if out is None or out.shape != x.shape or out.dtype != x.dtype:
        out = _kept["out"] = np.empty_like(x)
    np.copyto(out, x)
    return {"y": out}


# -- GPU backends -------------------------------------------------------------------------------
# Called inside the harness (docs/backends.md): inputs arrive as host numpy arrays and
# `ksearch_harness.adapters.device` supplies the harness's device copies, so a timed call times
# the device copy and not the transfers. Outside timed calls (the truth for correctness checks)
# the references return the host copy above.


def reference_torch(inputs, params):
    """The cuda backend's reference: the host copy as the truth, the same device copy as the
    baseline when timed."""
    from ksearch_harness.adapters import device

    if not device.timed():
        return reference(inputs, params)
    return baseline_torch_copy(inputs, params)


def baseline_torch_copy(inputs, params):
    """The cuda backend's baseline: x.clone(), which allocates y from PyTorch's caching
    allocator and copies with one cudaMemcpyAsync device to device on the current stream (the
    harness's): PyTorch copies a contiguous tensor of the same dtype on the same device with
    cudaMemcpyAsync, not a kernel."""
    from ksearch_harness.adapters import device

    x = device.torch_inputs(inputs, params)["x"]
    return {"y": device.host(x.clone())}


def reference_mlx(inputs, params):
    """The mlx backend's reference: the host copy as the truth, the same device copy as the
    baseline when timed."""
    from ksearch_harness.adapters import device

    if not device.timed():
        return reference(inputs, params)
    return baseline_mlx_copy(inputs, params)


def baseline_mlx_copy(inputs, params):
    """The mlx backend's baseline: mx.array(x), a new array that MLX (0.32) computes with its own
    contiguous copy kernel (an AsType node of the same dtype; on the GPU, copy_gpu's vector copy)
    when the harness evaluates it in the timed region. Other spellings of a copy do not copy:
    x.astype(x.dtype), mx.contiguous(x), x[:], mx.flatten(x) and mx.stop_gradient(x) return
    arrays that share x's buffer, and x + 0 or x * 1 run an arithmetic kernel rather than MLX's
    copy (README.md)."""
    import mlx.core as mx
    from ksearch_harness.adapters import device

    x = device.mlx_inputs(inputs, params)["x"]
    return {"y": device.host(mx.array(x))}
