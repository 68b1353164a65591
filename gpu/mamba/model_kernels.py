"""Kernels for the parts of a Mamba block around the scan, built with mx.fast.cuda_kernel.

mlx-lm's block spends most of its launches outside the scan: the causal depthwise convolution
is a concatenate, a grouped conv1d and a silu, and a decode step adds a dt projection, the
softplus and the state update as separate ops. With one launch costing far more than the work
of a single token, decode is bound by the number of launches, so these kernels fold them:

- `conv_silu(xz, cache, weight, bias)`: the convolution over [cache rows, x rows] of the x half
  of in_proj's output, its bias and silu, and the new cache (the last K-1 rows), one launch for
  any number of tokens, reading x straight out of xz (no split copy);
- `ssm_step(xc, dbc, w_dt, dt_bias, A, D, xz, h0)`: one decode step from x_proj's output dbc =
  [delta, B, C]: dt = softplus(delta @ w_dt^T + dt_bias), the state update, y = (h C + D u) *
  silu(z) with z read from xz; one thread per (channel, state), the dt dot product and the
  sum over states reduced with shuffles.

The module imports only `mlx.core` and calls nothing but `mx.fast.cuda_kernel` and the kernels
it makes, so the tests run it on the CPU emulation (emu/fake_mlx.py) unchanged.
"""

from __future__ import annotations

import hashlib

import mlx.core as mx

HEADER = r"""
namespace ksm_model {
__device__ __forceinline__ float to_f(const __half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(const __nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(const float x) { return x; }
__device__ __forceinline__ void from_f(const float v, __half& out) { out = __float2half_rn(v); }
__device__ __forceinline__ void from_f(const float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_f(const float v, float& out) { out = v; }
__device__ __forceinline__ float silu(const float v) { return v / (1.f + expf(-v)); }
__device__ __forceinline__ float softplus(const float v) { return v > 20.f ? v : log1pf(expf(v)); }
}  // namespace ksm_model
"""

# xz: [batch, T, 2 dim] (x then z), cache: [batch, K-1, dim], weight: [dim, K, 1], bias: [dim].
# Threads [0, batch T dim) produce xc = silu(conv + bias); the next batch (K-1) dim threads copy
# the rows that become the new cache. Row j of the full input is cache row j for j < K-1 and
# token j - (K-1) of x otherwise.
CONV_BODY = r"""
  using namespace ksm_model;
  const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long batch = xz_shape[0], steps = xz_shape[1], dim = cache_shape[2];
  const long long n_out = batch * steps * dim;
  if (gid < n_out) {
    const long long d = gid % dim, t = (gid / dim) % steps, b = gid / (dim * steps);
    float acc = to_f(bias[d]);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const long long j = t + k;
      const float v = j < K - 1 ? to_f(cache[(b * (K - 1) + j) * dim + d])
                                : to_f(xz[(b * steps + j - (K - 1)) * 2 * dim + d]);
      acc += to_f(weight[d * K + k]) * v;
    }
    from_f(silu(acc), xc[gid]);
  } else if (gid < n_out + batch * (K - 1) * dim) {
    const long long e = gid - n_out;
    const long long d = e % dim, r = (e / dim) % (K - 1), b = e / (dim * (K - 1));
    const long long j = steps + r;
    new_cache[e] = j < K - 1 ? cache[(b * (K - 1) + j) * dim + d]
                             : xz[(b * steps + j - (K - 1)) * 2 * dim + d];
  }
"""

# xc: [batch, dim] (the conv output u), dbc: [batch, R + 2 NS] (delta, B, C), w_dt: [dim, R],
# dt_bias, D: [dim] f32, A: [dim, NS] f32 (negative), xz: [batch, 2 dim] (z is the second half),
# h0: [batch, dim, NS] f32. The NS lanes of a channel are adjacent (NS a power of two <= 32).
STEP_BODY = r"""
  using namespace ksm_model;
  const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long batch = h0_shape[0], dim = h0_shape[1];
  const long long ch = gid / NS;
  const int n = (int)(gid % NS);
  if (ch >= batch * dim) return;
  const unsigned int mask = (unsigned int)((1ull << NS) - 1ull) << ((threadIdx.x & 31u) & ~(unsigned int)(NS - 1));
  const long long b = ch / dim, d = ch % dim;
  const long long row = b * (R + 2 * NS);
  float dt = 0.f;
  for (int r = n; r < R; r += NS) dt += to_f(dbc[row + r]) * to_f(w_dt[d * R + r]);
#pragma unroll
  for (int off = NS / 2; off > 0; off >>= 1) dt += __shfl_xor_sync(mask, dt, off, NS);
  dt = softplus(dt + dt_bias[d]);
  const float u = to_f(xc[ch]);
  const long long s = ch * NS + n;
  const float h = expf(dt * A[d * NS + n]) * h0[s] + dt * u * to_f(dbc[row + R + n]);
  h_out[s] = h;
  float part = h * to_f(dbc[row + R + NS + n]);
#pragma unroll
  for (int off = NS / 2; off > 0; off >>= 1) part += __shfl_xor_sync(mask, part, off, NS);
  if (n == 0) {
    const float out = (part + D[d] * u) * silu(to_f(xz[b * 2 * dim + dim + d]));
    from_f(out, y[ch]);
  }
"""

_TAG = hashlib.sha256((HEADER + CONV_BODY + STEP_BODY).encode()).hexdigest()[:12]
THREADS = 256

_CONV = mx.fast.cuda_kernel(
    name=f"ksm_conv_silu_{_TAG}", input_names=["xz", "cache", "weight", "bias"],
    output_names=["xc", "new_cache"], source=CONV_BODY, header=HEADER,
    ensure_row_contiguous=True)
_STEP = mx.fast.cuda_kernel(
    name=f"ksm_ssm_step_{_TAG}",
    input_names=["xc", "dbc", "w_dt", "dt_bias", "A", "D", "xz", "h0"],
    output_names=["y", "h_out"], source=STEP_BODY, header=HEADER, ensure_row_contiguous=True)


def _grid(threads: int) -> tuple[int, int, int]:
    return ((threads + THREADS - 1) // THREADS * THREADS, 1, 1)


def conv_silu(xz, cache, weight, bias):
    """(silu(causal depthwise conv of xz's x half after `cache`), new cache). xz: [batch, T,
    2 dim]; cache: [batch, K-1, dim] (zeros before the first token); weight: [dim, K, 1]
    (mlx-lm's Conv1d layout); bias: [dim]. All in the activation dtype."""
    batch, steps, two_dim = xz.shape
    dim = two_dim // 2
    K = weight.shape[1]
    if cache.shape != (batch, K - 1, dim):
        raise ValueError(f"conv cache {cache.shape} does not fit xz {xz.shape} and K = {K}")
    t = xz.dtype
    xc, new_cache = _CONV(
        inputs=[xz, cache, weight, bias], template=[("T", t), ("K", K)],
        grid=_grid(batch * (steps + K - 1) * dim), threadgroup=(THREADS, 1, 1),
        output_shapes=[(batch, steps, dim), (batch, K - 1, dim)], output_dtypes=[t, t])
    return xc, new_cache


def ssm_step(xc, dbc, w_dt, dt_bias, A, D, xz, h0):
    """One decode step: (y [batch, dim], h [batch, dim, N]). xc: [batch, dim]; dbc: [batch,
    R + 2N]; w_dt: [dim, R]; dt_bias, D: [dim] f32; A: [dim, N] f32; xz: [batch, 2 dim]; h0:
    [batch, dim, N] f32."""
    batch, dim = xc.shape
    N = A.shape[1]
    R = w_dt.shape[1]
    if N > 32 or N & (N - 1):
        raise ValueError(f"ssm_step needs a power-of-two state size up to 32, got {N}")
    if dbc.shape != (batch, R + 2 * N):
        raise ValueError(f"x_proj output {dbc.shape} is not [batch, {R} + 2 x {N}]")
    t = xc.dtype
    return _STEP(
        inputs=[xc, dbc, w_dt, dt_bias, A, D, xz, h0],
        template=[("T", t), ("NS", N), ("R", R)],
        grid=_grid(batch * dim * N), threadgroup=(THREADS, 1, 1),
        output_shapes=[(batch, dim), (batch, dim, N)], output_dtypes=[t, mx.float32])
