"""Selective scan (Mamba-1 forward) for the mlx backend: family selective-scan-mlx, target mlx-cuda.

Knobs: algo="sequential" channels=32 exp2=false fold="serial" fuse_epilogue=false items=1 prefetch=false state_lanes=1 threads=128 vec=1
selective_scan: the task's entry; u, delta, z: [batch, dim, L], B, C: [batch, N, L] (f16 or
bf16), A: [dim, N], D, delta_bias: [dim] (f32); returns y [batch, dim, L] in u's dtype.
selective_scan_state: the same scan for a model, channel-last ([batch, L, dim], B and C
[batch, L, N]) or not, from a state h0 [batch, dim, N] (f32), returning (y, h_last).
decode_step: one step (L = 1) fused with the state update; x, dt, z: [batch, dim].
"""

import hashlib

import mlx.core as mx

# Device code: the same as the cuda backend's (namespace ksm), given to MLX as the header.
HEADER = r"""
// Mamba-1 selective scan, algo="sequential" channels=32 exp2=false fold="serial" fuse_epilogue=false items=1 prefetch=false state_lanes=1 threads=128 vec=1
// f16/bf16 inputs and outputs, f32 arithmetic and state.
namespace ksm {

constexpr int THREADS = 128;
constexpr int LANES = 1;     // threads that share one channel's states

struct Launch {
  unsigned int grid_x, grid_y, block;
};

template <typename T>
struct ScanArgs {
  const T* u;
  const T* delta;
  const float* A;           // [dim, N], negative
  const T* B;
  const T* C;
  const float* D;           // [dim]
  const T* z;
  const float* delta_bias;  // [dim]
  T* y;
  const float* h0;          // [batch, dim, N] state before the first step, or null (zeros)
  float* h_last;            // [batch, dim, N] state after the last step, or null
  long long batch, dim, L, N;
  long long su_b, su_d, su_t;  // element strides of u, delta, z, y
  long long sb_b, sb_n, sb_t;  // element strides of B, C
  int has_z, softplus;
};

// Strides of the two layouts a caller can hand over: the task's (mamba_ssm's) [batch, dim, L]
// with B, C as [batch, N, L], or mlx-lm's channel-last [batch, L, dim] with B, C as
// [batch, L, N]. Kernels only see strides.
template <typename T>
__host__ __device__ inline void set_layout(ScanArgs<T>& p, bool channel_last) {
  if (channel_last) {
    p.su_b = p.L * p.dim; p.su_d = 1; p.su_t = p.dim;
    p.sb_b = p.L * p.N;   p.sb_n = 1; p.sb_t = p.N;
  } else {
    p.su_b = p.dim * p.L; p.su_d = p.L; p.su_t = 1;
    p.sb_b = p.N * p.L;   p.sb_n = p.L; p.sb_t = 1;
  }
}

// Blocks and threads of one scan launch (the grid counts blocks here; MLX's counts threads).
__host__ __device__ inline Launch scan_launch(long long batch, long long dim) {
  Launch l;
  const long long threads = batch * dim * LANES;
  l.grid_x = (unsigned int)((threads + THREADS - 1) / THREADS);
  l.grid_y = 1;
  l.block = THREADS;
  return l;
}

__device__ __forceinline__ float to_f(const __half x) { return __half2float(x); }
__device__ __forceinline__ float to_f(const __nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(const float x) { return x; }
__device__ __forceinline__ void from_f(const float v, __half& out) { out = __float2half_rn(v); }
__device__ __forceinline__ void from_f(const float v, __nv_bfloat16& out) { out = __float2bfloat16_rn(v); }
__device__ __forceinline__ void from_f(const float v, float& out) { out = v; }

__device__ __forceinline__ float decay(const float dt, const float a) { return expf(dt * a); }
__device__ __forceinline__ float silu(const float z) { return z / (1.f + expf(-z)); }
// Per (t, channel), not per state: the accurate functions cost little here, and tiny steps
// (dt ~ 1e-4, long memory) need log1p's relative accuracy.
__device__ __forceinline__ float softplus(const float x) { return x > 20.f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float load_a(const float* A, long long i) { return A[i]; }



// Sequential recurrence, as mlx-lm computes it: each channel walks its time steps one at a
// time. LANES threads share a channel, each holding every LANES-th state in registers; the
// output sum over states is reduced across them with shuffles.
template <typename T, int NMAX>
__device__ __forceinline__ void scan_body(const ScanArgs<T>& p) {
  constexpr int S = (NMAX + LANES - 1) / LANES;  // states per thread
  const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long ch = gid / LANES;
  const int sub = (int)(gid % LANES);
  // A channel's LANES threads are adjacent in one warp and leave together, so the shuffles
  // below only ever wait for threads that are still running.
  if (ch >= p.batch * p.dim) return;
  const long long b = ch / p.dim, d = ch % p.dim;
  const long long row = b * p.su_b + d * p.su_d;
  const T* u = p.u + row;
  const T* delta = p.delta + row;
  const T* Bp = p.B + b * p.sb_b;
  const T* Cp = p.C + b * p.sb_b;
  const float bias = p.delta_bias[d];
  const long long state = (b * p.dim + d) * p.N;
  float a[S], h[S];
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const long long n = sub + (long long)k * LANES;
    const bool on = n < p.N;
    a[k] = on ? load_a(p.A, d * p.N + n) : 0.f;
    h[k] = (on && p.h0) ? p.h0[state + n] : 0.f;
  }
  for (long long t = 0; t < p.L; ++t) {
    const float uu = to_f(u[t * p.su_t]);
    float dt = to_f(delta[t * p.su_t]) + bias;
    if (p.softplus) dt = softplus(dt);
    const float du = dt * uu;
    float part = 0.f;
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const long long n = sub + (long long)k * LANES;
      if (n < p.N) {
        const long long o = n * p.sb_n + t * p.sb_t;
        h[k] = decay(dt, a[k]) * h[k] + du * to_f(Bp[o]);
        part += h[k] * to_f(Cp[o]);
      }
    }
    if (sub == 0) {
      from_f(part, p.y[row + t * p.su_t]);
    }
  }
  if (p.h_last) {
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const long long n = sub + (long long)k * LANES;
      if (n < p.N) p.h_last[state + n] = h[k];
    }
  }
}

// The separate output pass: y = (y_scan + D u) * silu(z), one thread per element, in memory
// order of either layout.
__device__ __forceinline__ float silu_gate(const float v, const float z) { return v * (z / (1.f + expf(-z))); }

template <typename T>
__device__ __forceinline__ void epilogue_body(const ScanArgs<T>& p, const T* y_scan) {
  const long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= p.batch * p.dim * p.L) return;
  long long b, d, t;
  if (p.su_t == 1) {
    t = e % p.L; d = (e / p.L) % p.dim; b = e / (p.L * p.dim);
  } else {
    d = e % p.dim; t = (e / p.dim) % p.L; b = e / (p.L * p.dim);
  }
  const long long o = b * p.su_b + d * p.su_d + t * p.su_t;
  float v = to_f(y_scan[o]) + p.D[d] * to_f(p.u[o]);
  if (p.has_z) v = silu_gate(v, to_f(p.z[o]));
  from_f(v, p.y[o]);
}

// One decode step (L = 1) fused with the state update: one thread per (channel, state), the
// state read and written in place of mlx-lm's ~10 separate ops; NS states of a channel are
// adjacent lanes (NS <= 32, a power of two), reduced with shuffles. Inputs are channel-last
// rows [batch, dim] (x, dt before bias and softplus, z) and [batch, N] (B, C).
template <typename T, int NS>
__device__ __forceinline__ void decode_body(const ScanArgs<T>& p) {
  const long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long ch = gid / NS;
  const int n = (int)(gid % NS);
  if (ch >= p.batch * p.dim) return;
  // A 64-bit shift, so NS = 32 needs no special case.
  const unsigned int mask = (unsigned int)((1ull << NS) - 1ull) << ((threadIdx.x & 31u) & ~(unsigned int)(NS - 1));
  const long long b = ch / p.dim, d = ch % p.dim;
  const float uu = to_f(p.u[ch]);
  float dt = to_f(p.delta[ch]) + p.delta_bias[d];
  if (p.softplus) dt = softplus(dt);
  const long long s = ch * NS + n;
  const float h = decay(dt, load_a(p.A, d * NS + n)) * (p.h0 ? p.h0[s] : 0.f) +
                  dt * uu * to_f(p.B[b * NS + n]);
  p.h_last[s] = h;
  float part = h * to_f(p.C[b * NS + n]);
#pragma unroll
  for (int off = NS / 2; off > 0; off >>= 1) part += __shfl_xor_sync(mask, part, off, NS);
  if (n == 0) {
    float out = part + p.D[d] * uu;
    if (p.has_z) {
      const float z = to_f(p.z[ch]);
      out *= z / (1.f + expf(-z));
    }
    from_f(out, p.y[ch]);
  }
}

}  // namespace ksm
"""

# The bodies MLX wraps in its generated __global__ function. Inputs and outputs are named as in
# input_names / output_names; T, NS, CHANNEL_LAST, HAS_Z and SOFTPLUS come from `template`.
_ARGS = r"""
  ksm::ScanArgs<T> p;
  p.u = u; p.delta = delta; p.A = A; p.B = B; p.C = C; p.D = D; p.z = z;
  p.delta_bias = delta_bias;
  p.batch = u_shape[0];
  p.dim = CHANNEL_LAST ? u_shape[2] : u_shape[1];
  p.L = CHANNEL_LAST ? u_shape[1] : u_shape[2];
  p.N = NS;
  p.has_z = HAS_Z;
  p.softplus = SOFTPLUS;
  ksm::set_layout(p, CHANNEL_LAST);
"""
SCAN_BODY = _ARGS + r"""
  p.y = y; p.h0 = nullptr; p.h_last = nullptr;
  ksm::scan_body<T, NS>(p);
"""
SCAN_STATE_BODY = _ARGS + r"""
  p.y = y; p.h0 = h0; p.h_last = h_last;
  ksm::scan_body<T, NS>(p);
"""
EPILOGUE_BODY = _ARGS + r"""
  p.y = y;
  ksm::epilogue_body<T>(p, y_scan);
"""
DECODE_BODY = r"""
  ksm::ScanArgs<T> p;
  p.u = u; p.delta = delta; p.A = A; p.B = B; p.C = C; p.D = D; p.z = z;
  p.delta_bias = delta_bias; p.y = y; p.h0 = h0; p.h_last = h_last;
  p.batch = u_shape[0]; p.dim = u_shape[1]; p.L = 1; p.N = NS;
  p.has_z = HAS_Z; p.softplus = SOFTPLUS;
  ksm::decode_body<T, NS>(p);
"""

THREADS = 128
CHUNKED = False
TILED = False
STAGED = False
LANES = 1
# Adjacent channels per block (tiled and staged).
CHANNELS = 1
FUSED = False
DECODE_THREADS = 128
_IN = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias"]
# MLX before 0.32.1 reused the first kernel compiled under a name: names carry the source.
_TAG = hashlib.sha256(HEADER.encode()).hexdigest()[:12]


def _kernel(name, body, inputs, outputs):
    return mx.fast.cuda_kernel(
        name=f"ksm_{name}_{_TAG}_" + hashlib.sha256(body.encode()).hexdigest()[:8],
        input_names=inputs,
        output_names=outputs,
        source=body,
        header=HEADER,
        ensure_row_contiguous=True,
    )


_SCAN = _kernel("scan", SCAN_BODY, _IN, ["y"])
_SCAN_STATE = _kernel("scan_state", SCAN_STATE_BODY, _IN + ["h0"], ["y", "h_last"])
_EPILOGUE = _kernel("epilogue", EPILOGUE_BODY, _IN + ["y_scan"], ["y"])
_DECODE = _kernel("decode", DECODE_BODY, _IN + ["h0"], ["y", "h_last"])


def _grid(batch, dim):
    """MLX's grid counts threads, rounded up to whole blocks."""
    if CHUNKED:
        return (dim * THREADS, batch, 1)
    if TILED or STAGED:
        return ((dim + CHANNELS - 1) // CHANNELS * THREADS, batch, 1)
    blocks = (batch * dim * LANES + THREADS - 1) // THREADS
    return (blocks * THREADS, 1, 1)


def _run(u, delta, A, B, C, D, z, delta_bias, h0, channel_last, has_z, softplus):
    if channel_last:
        batch, L, dim = u.shape
    else:
        batch, dim, L = u.shape
    N = A.shape[1]
    if N < 1 or N > 64:
        raise ValueError(f"state size {N} is not supported (1..64)")
    io = u.dtype
    inputs = [u, delta.astype(io), A.astype(mx.float32), B.astype(io), C.astype(io),
              D.astype(mx.float32), z.astype(io), delta_bias.astype(mx.float32)]
    template = [("T", io), ("NS", N), ("CHANNEL_LAST", bool(channel_last)),
                ("HAS_Z", bool(has_z)), ("SOFTPLUS", bool(softplus))]
    launch = dict(template=template, grid=_grid(batch, dim), threadgroup=(THREADS, 1, 1))
    if h0 is None:
        (y,) = _SCAN(inputs=inputs, output_shapes=[u.shape], output_dtypes=[io], **launch)
        h_last = None
    else:
        y, h_last = _SCAN_STATE(inputs=inputs + [h0.astype(mx.float32)],
                                output_shapes=[u.shape, (batch, dim, N)],
                                output_dtypes=[io, mx.float32], **launch)
    total = batch * dim * L
    (y,) = _EPILOGUE(inputs=inputs + [y], template=template,
                     grid=((total + 255) // 256 * 256, 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[u.shape], output_dtypes=[io])
    return y, h_last


def selective_scan(*, u, delta, A, B, C, D, z, delta_bias, batch, dim, L, N, has_z, softplus):
    if batch == 0 or dim == 0 or L == 0:
        return mx.zeros(u.shape, dtype=u.dtype)
    y, _ = _run(u, delta, A, B, C, D, z, delta_bias, None, False, has_z, softplus)
    return y


def selective_scan_state(u, delta, A, B, C, D, z, delta_bias, h0=None, *, channel_last=True,
                         has_z=True, softplus=True):
    """(y, h_last): the scan from state h0 (zeros when None) in either layout."""
    if channel_last:
        batch, L, dim = u.shape
    else:
        batch, dim, L = u.shape
    N = A.shape[1]
    if h0 is None:
        h0 = mx.zeros((batch, dim, N), dtype=mx.float32)
    if batch == 0 or dim == 0 or L == 0:
        return mx.zeros(u.shape, dtype=u.dtype), h0
    return _run(u, delta, A, B, C, D, z, delta_bias, h0, channel_last, has_z, softplus)


def decode_step(x, dt, A, B, C, D, z, delta_bias, h0, *, has_z=True, softplus=True):
    """One step: x, dt (before bias and softplus), z: [batch, dim]; B, C: [batch, N];
    h0: [batch, dim, N] f32. Returns (y [batch, dim], h [batch, dim, N])."""
    batch, dim = x.shape
    N = A.shape[1]
    if N > 32 or N & (N - 1):
        raise ValueError(f"decode_step needs a power-of-two state size up to 32, got {N}")
    t = x.dtype
    threads = batch * dim * N
    return _DECODE(
        inputs=[x, dt.astype(t), A.astype(mx.float32), B.astype(t), C.astype(t),
                D.astype(mx.float32), z.astype(t), delta_bias.astype(mx.float32),
                h0.astype(mx.float32)],
        template=[("T", t), ("NS", N), ("CHANNEL_LAST", True), ("HAS_Z", bool(has_z)),
                  ("SOFTPLUS", bool(softplus))],
        grid=((threads + DECODE_THREADS - 1) // DECODE_THREADS * DECODE_THREADS, 1, 1),
        threadgroup=(DECODE_THREADS, 1, 1),
        output_shapes=[(batch, dim), (batch, dim, N)],
        output_dtypes=[t, mx.float32],
    )
