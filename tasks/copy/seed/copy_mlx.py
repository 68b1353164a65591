"""Copy for the mlx backend (Linux, NVIDIA): one kernel built with mx.fast.cuda_kernel that reads
x and writes a new array, 16 bytes per thread (4 float32 or 8 float16 values) with the tail
element by element, the way MLX's own contiguous copy kernel (the baseline's mx.array(x)) works.

A candidate cannot simply call MLX's copy: on the GPU the harness records which kernels a call
runs and accepts only the candidate's own (built here) and library memcpy/memset, so MLX's copy
or arithmetic kernels reached through mx.array(x) or x + 0 would be `forbidden_kernel`."""

import mlx.core as mx

BODY = """
    const long n = N;
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    if (i >= n) return;
    // Whole 16-byte vectors where both pointers allow them; MLX's buffers are aligned, but an
    // input may be a view that starts anywhere.
    const bool aligned = ((reinterpret_cast<unsigned long long>(x) |
                           reinterpret_cast<unsigned long long>(y)) & 15ull) == 0;
    if (aligned && i + VEC <= n) {
        *reinterpret_cast<uint4*>(y + i) = *reinterpret_cast<const uint4*>(x + i);
    } else {
        for (long j = i; j < n && j < i + VEC; ++j) y[j] = x[j];
    }
"""

_KERNEL = mx.fast.cuda_kernel(
    name="copy_vec16",
    input_names=["x"],
    output_names=["y"],
    source=BODY,
)

THREADS = 256


def copy(*, x, n):
    vec = 16 // x.itemsize
    threads = (n + vec - 1) // vec
    blocks = (threads + THREADS - 1) // THREADS
    (y,) = _KERNEL(
        inputs=[x],
        template=[("N", n), ("VEC", vec)],
        grid=(blocks * THREADS, 1, 1),  # MLX's grid counts threads
        threadgroup=(THREADS, 1, 1),
        output_shapes=[x.shape],
        output_dtypes=[x.dtype],
    )
    return y
