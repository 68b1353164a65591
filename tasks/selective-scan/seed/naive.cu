// Selective scan (Mamba-1 forward), family "selective-scan-cuda" (cuda backend).
// Knobs: algo="sequential" channels=32 exp2=false fold="serial" fuse_epilogue=false items=1 prefetch=false state_lanes=1 threads=128 vec=1
// u, delta, z, y: [batch, dim, L]; B, C: [batch, N, L] (f16 or bf16); A: [dim, N], D and
// delta_bias: [dim] (f32). State and arithmetic in f32. The device code (namespace ksm) is the
// same as in the mlx family's mx.fast.cuda_kernel; what follows it is the cuda host side.
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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

}  // namespace ksm

// ---------------------------------------------------------------------------------------------
// cuda backend: extern "C" entry points, launched on the caller's stream.
template <typename T, int NMAX>
__global__ void __launch_bounds__(ksm::THREADS) ksm_scan_kernel(const ksm::ScanArgs<T> p) {
  ksm::scan_body<T, NMAX>(p);
}

template <typename T>
__global__ void __launch_bounds__(256) ksm_epilogue_kernel(const ksm::ScanArgs<T> p) {
  ksm::epilogue_body<T>(p, p.y);
}

template <typename T>
static int ksm_selective_scan(const void* u, const void* delta, const void* A, const void* B,
                              const void* C, const void* D, const void* z, const void* delta_bias,
                              void* y, int64_t batch, int64_t dim, int64_t L, int64_t N,
                              int64_t has_z, int64_t softplus, cudaStream_t stream) {
  if (batch < 0 || dim < 0 || L < 0 || N < 0) return static_cast<int>(cudaErrorInvalidValue);
  if (batch == 0 || dim == 0 || L == 0) return 0;
  // States live in registers (sequential, tiled, staged) or a fixed shared array (chunked): at
  // most 64. The chunked grid is (dim, batch) blocks, the tiled and staged (channel tiles,
  // batch).
  if (N < 1 || N > 64 || batch > 65535 || dim > 0x7fffffffLL) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  ksm::ScanArgs<T> p;
  p.u = static_cast<const T*>(u);
  p.delta = static_cast<const T*>(delta);
  p.A = static_cast<const float*>(A);
  p.B = static_cast<const T*>(B);
  p.C = static_cast<const T*>(C);
  p.D = static_cast<const float*>(D);
  p.z = static_cast<const T*>(z);
  p.delta_bias = static_cast<const float*>(delta_bias);
  p.y = static_cast<T*>(y);
  p.h0 = nullptr;
  p.h_last = nullptr;
  p.batch = batch; p.dim = dim; p.L = L; p.N = N;
  p.has_z = has_z != 0;
  p.softplus = softplus != 0;
  ksm::set_layout(p, false);
  const ksm::Launch l = ksm::scan_launch(batch, dim);
  const dim3 grid(l.grid_x, l.grid_y);
  if (N <= 16) {
    ksm_scan_kernel<T, 16><<<grid, l.block, 0, stream>>>(p);
  } else {
    ksm_scan_kernel<T, 64><<<grid, l.block, 0, stream>>>(p);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return static_cast<int>(e);
  const int64_t total = batch * dim * L;
  ksm_epilogue_kernel<T><<<static_cast<unsigned int>((total + 255) / 256), 256, 0, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

extern "C" int selective_scan_f16(const void* u, const void* delta, const void* A, const void* B,
                                  const void* C, const void* D, const void* z,
                                  const void* delta_bias, void* y, int64_t batch, int64_t dim,
                                  int64_t L, int64_t N, int64_t has_z, int64_t softplus,
                                  void* stream) {
  return ksm_selective_scan<__half>(u, delta, A, B, C, D, z, delta_bias, y, batch, dim, L, N,
                                    has_z, softplus, static_cast<cudaStream_t>(stream));
}

extern "C" int selective_scan_bf16(const void* u, const void* delta, const void* A, const void* B,
                                   const void* C, const void* D, const void* z,
                                   const void* delta_bias, void* y, int64_t batch, int64_t dim,
                                   int64_t L, int64_t N, int64_t has_z, int64_t softplus,
                                   void* stream) {
  return ksm_selective_scan<__nv_bfloat16>(u, delta, A, B, C, D, z, delta_bias, y, batch, dim, L,
                                           N, has_z, softplus, static_cast<cudaStream_t>(stream));
}
