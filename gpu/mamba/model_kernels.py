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
  sum over states reduced with shuffles;
- `fused_decode(...)`: a whole residual block for one token in four launches (norm + in_proj +
  conv, x_proj, the step above, out_proj + residual), the projections as warp-per-row products
  instead of MLX matmuls, so nothing else is launched per block.

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

template <typename T>
struct alignas(16) Vec8 {
  T x[8];
};

// The dot product of a weight row with v (float32, in shared memory) by one warp, 16-byte
// loads of the row where it is aligned; every lane returns the total.
template <typename T>
__device__ __forceinline__ float warp_dot(const T* w, const float* v, const long long cols,
                                          const int lane) {
  float acc = 0.f;
  if (cols % 8 == 0 && reinterpret_cast<unsigned long long>(w) % 16 == 0) {
    for (long long c = lane * 8; c < cols; c += 256) {
      const Vec8<T> pk = *reinterpret_cast<const Vec8<T>*>(w + c);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc += to_f(pk.x[j]) * v[c + j];
    }
  } else {
    for (long long c = lane; c < cols; c += 32) acc += to_f(w[c]) * v[c];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  return acc;
}
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

# xc: rows of XS elements whose first dim are the conv output u, dbc: [batch, R + 2 NS] (delta,
# B, C), w_dt: [dim, R], dt_bias, D: [dim] f32, A: [dim, NS] f32 (negative), xz: [batch, 2 dim]
# (z is the second half), h0: [batch, dim, NS] f32. The NS lanes of a channel are adjacent (NS a
# power of two <= 32).
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
  const float u = to_f(xc[b * XS + d]);
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

# The decode step of a whole block in four launches (fused_decode): warp-per-row products with
# the operand vector in shared memory, each fused with what surrounds it.
# 1. rms norm of the residual x [batch, DM] (every block recomputes it: 2 DM values) and in_proj
#    (w_in [2 dim, DM]); rows < dim go through the causal conv with the cache and silu (the new
#    token's x rounded to the activation dtype first, as in_proj's output would be), rows >= dim
#    are z. Out: xcz [batch, 2 dim] = [silu(conv), z], and the shifted conv cache.
IN_CONV_BODY = r"""
  using namespace ksm_model;
  __shared__ float v[DM];
  __shared__ float red[32];
  const long long batch = x_shape[0], dim = cache_shape[2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (long long b = 0; b < batch; ++b) {
    float ss = 0.f;
    for (int c = threadIdx.x; c < DM; c += blockDim.x) {
      const float xv = to_f(x[b * DM + c]);
      v[c] = xv;
      ss += xv * xv;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < warps; ++w) total += red[w];
    const float inv = rsqrtf(total / DM + eps[0]);
    for (int c = threadIdx.x; c < DM; c += blockDim.x) v[c] = v[c] * inv * to_f(norm_w[c]);
    __syncthreads();
    for (long long r = (long long)blockIdx.x * warps + warp; r < 2 * dim;
         r += (long long)gridDim.x * warps) {
      const float val = warp_dot(w_in + r * DM, v, DM, lane);
      if (lane != 0) continue;
      if (r < dim) {
        T xr;
        from_f(val, xr);
        float acc = to_f(conv_b[r]) + to_f(conv_w[r * K + K - 1]) * to_f(xr);
        for (int k = 0; k < K - 1; ++k) {
          acc += to_f(conv_w[r * K + k]) * to_f(cache[(b * (K - 1) + k) * dim + r]);
        }
        for (int k = 0; k < K - 2; ++k) {
          new_cache[(b * (K - 1) + k) * dim + r] = cache[(b * (K - 1) + k + 1) * dim + r];
        }
        new_cache[(b * (K - 1) + K - 2) * dim + r] = xr;
        from_f(silu(acc), xcz[b * 2 * dim + r]);
      } else {
        from_f(val, xcz[b * 2 * dim + r]);
      }
    }
    __syncthreads();  // v and red are rewritten for the next batch row
  }
"""

# 2. x_proj: dbc [batch, RN] = w_x [RN, DI] . u, u the first DI values of each xcz row.
XPROJ_BODY = r"""
  using namespace ksm_model;
  __shared__ float v[DI];
  const long long batch = xcz_shape[0], rows = w_x_shape[0];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (long long b = 0; b < batch; ++b) {
    for (int c = threadIdx.x; c < DI; c += blockDim.x) v[c] = to_f(xcz[b * 2 * DI + c]);
    __syncthreads();
    for (long long r = (long long)blockIdx.x * warps + warp; r < rows;
         r += (long long)gridDim.x * warps) {
      const float val = warp_dot(w_x + r * DI, v, DI, lane);
      if (lane == 0) from_f(val, dbc[b * rows + r]);
    }
    __syncthreads();
  }
"""

# 4. out_proj with the residual: x_out [batch, DM] = x + w_out [DM, DI] . y.
OUT_BODY = r"""
  using namespace ksm_model;
  __shared__ float v[DI];
  const long long batch = x_shape[0];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (long long b = 0; b < batch; ++b) {
    for (int c = threadIdx.x; c < DI; c += blockDim.x) v[c] = to_f(y[b * DI + c]);
    __syncthreads();
    for (long long r = (long long)blockIdx.x * warps + warp; r < DM;
         r += (long long)gridDim.x * warps) {
      const float val = warp_dot(w_out + r * DI, v, DI, lane);
      if (lane == 0) from_f(to_f(x[b * DM + r]) + val, x_out[b * DM + r]);
    }
    __syncthreads();
  }
"""

_TAG = hashlib.sha256((HEADER + CONV_BODY + STEP_BODY + IN_CONV_BODY + XPROJ_BODY
                       + OUT_BODY).encode()).hexdigest()[:12]
THREADS = 256

_CONV = mx.fast.cuda_kernel(
    name=f"ksm_conv_silu_{_TAG}", input_names=["xz", "cache", "weight", "bias"],
    output_names=["xc", "new_cache"], source=CONV_BODY, header=HEADER,
    ensure_row_contiguous=True)
_STEP = mx.fast.cuda_kernel(
    name=f"ksm_ssm_step_{_TAG}",
    input_names=["xc", "dbc", "w_dt", "dt_bias", "A", "D", "xz", "h0"],
    output_names=["y", "h_out"], source=STEP_BODY, header=HEADER, ensure_row_contiguous=True)


_IN_CONV = mx.fast.cuda_kernel(
    name=f"ksm_in_conv_{_TAG}",
    input_names=["x", "norm_w", "eps", "w_in", "cache", "conv_w", "conv_b"],
    output_names=["xcz", "new_cache"], source=IN_CONV_BODY, header=HEADER,
    ensure_row_contiguous=True)
_XPROJ = mx.fast.cuda_kernel(
    name=f"ksm_xproj_{_TAG}", input_names=["xcz", "w_x"], output_names=["dbc"],
    source=XPROJ_BODY, header=HEADER, ensure_row_contiguous=True)
_OUT = mx.fast.cuda_kernel(
    name=f"ksm_out_res_{_TAG}", input_names=["x", "y", "w_out"], output_names=["x_out"],
    source=OUT_BODY, header=HEADER, ensure_row_contiguous=True)
ROWS_PER_BLOCK = THREADS // 32  # one warp per output row


def _rows_grid(rows: int) -> tuple[int, int, int]:
    return ((rows + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK * THREADS, 1, 1)


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
    return _step(xc, dim, dbc, w_dt, dt_bias, A, D, xz, h0)


def _step(xc, xc_row, dbc, w_dt, dt_bias, A, D, xz, h0):
    batch, dim, N = h0.shape
    R = w_dt.shape[1]
    t = xz.dtype
    return _STEP(
        inputs=[xc, dbc, w_dt, dt_bias, A, D, xz, h0],
        template=[("T", t), ("NS", N), ("R", R), ("XS", xc_row)],
        grid=_grid(batch * dim * N), threadgroup=(THREADS, 1, 1),
        output_shapes=[(batch, dim), (batch, dim, N)], output_dtypes=[t, mx.float32])


def fused_decode(x, norm_w, eps, w_in, cache, conv_w, conv_b, w_x, w_dt, dt_bias, A, D, w_out,
                 h0):
    """One token through a whole residual block in four launches: x [batch, DM] (the residual
    stream, before the block's norm) -> (x + block(x) [batch, DM], new conv cache [batch, K-1,
    dim], new state [batch, dim, N] f32). norm_w [DM] and eps [1] f32 are the block's RMSNorm;
    w_in [2 dim, DM], conv_w [dim, K, 1], conv_b [dim], w_x [R + 2N, dim], w_dt [dim, R],
    w_out [DM, dim] are mlx-lm's weights (no in/out projection biases); dt_bias, D [dim] and A
    [dim, N] f32."""
    batch, d_model = x.shape
    dim, N = A.shape
    K = conv_w.shape[1]
    R = w_dt.shape[1]
    if N > 32 or N & (N - 1):
        raise ValueError(f"fused_decode needs a power-of-two state size up to 32, got {N}")
    if w_in.shape != (2 * dim, d_model) or w_out.shape != (d_model, dim):
        raise ValueError(f"projections {w_in.shape}, {w_out.shape} do not fit x {x.shape} and "
                         f"dim {dim}")
    if w_x.shape != (R + 2 * N, dim) or cache.shape != (batch, K - 1, dim) or K < 2:
        raise ValueError(f"x_proj {w_x.shape} or conv cache {cache.shape} do not fit dim {dim}, "
                         f"N {N}, rank {R}, K {K}")
    t = x.dtype
    xcz, new_cache = _IN_CONV(
        inputs=[x, norm_w, eps, w_in, cache, conv_w, conv_b],
        template=[("T", t), ("DM", d_model), ("K", K)], grid=_rows_grid(2 * dim),
        threadgroup=(THREADS, 1, 1), output_shapes=[(batch, 2 * dim), (batch, K - 1, dim)],
        output_dtypes=[t, t])
    (dbc,) = _XPROJ(inputs=[xcz, w_x], template=[("T", t), ("DI", dim)],
                    grid=_rows_grid(R + 2 * N), threadgroup=(THREADS, 1, 1),
                    output_shapes=[(batch, R + 2 * N)], output_dtypes=[t])
    y, h = _step(xcz, 2 * dim, dbc, w_dt, dt_bias, A, D, xcz, h0)
    (x_out,) = _OUT(inputs=[x, y, w_out], template=[("T", t), ("DM", d_model), ("DI", dim)],
                    grid=_rows_grid(d_model), threadgroup=(THREADS, 1, 1),
                    output_shapes=[(batch, d_model)], output_dtypes=[t])
    return x_out, new_cache, h
