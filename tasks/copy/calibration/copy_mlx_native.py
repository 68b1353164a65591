"""Copy for the mlx backend that makes the baseline's own call, `mx.array(x)`: MLX's contiguous
copy kernel into a new array. The task allows that kernel (`allowed_kernels` in task.toml), so
this candidate and the baseline do the same work through the same path, and its score measures
only how alike the evaluator times the two (1.00 when unbiased). The seed, seed/copy_mlx.py,
builds its own kernel and so also weighs mx.fast.cuda_kernel's per-call cost."""

import mlx.core as mx


def copy(*, x, n):
    return mx.array(x)
