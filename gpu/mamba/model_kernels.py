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
  instead of MLX matmuls, so nothing else is launched per block;
- `fused_layer_decode(...)`: the same block in ONE launch: a persistent grid (at most one block
  per SM) runs the four phases one after the other, separated by a software grid barrier whose
  state lives in two small arrays the caller keeps (`grid_state()`); `grid_failed(poison)` says
  whether any wait ever timed out (a grid that was not all resident);
- `fused_model_decode(...)`: every block of the model for one token in ONE launch: the same
  phases for each layer in turn (weights, caches and states stacked along a layer axis), a
  grid barrier between layers, so a decode step is one primitive for MLX to dispatch instead
  of one or four per block.

The module imports only `mlx.core` and calls nothing but `mx.fast.cuda_kernel` and the kernels
it makes, so the tests run it on the CPU emulation (emu/fake_mlx.py) unchanged.
"""

from __future__ import annotations

import hashlib
import re

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

// warp_dot of M rows with the row length known when compiling: each lane issues all of its
// 16-byte loads of every row before the first multiply, so the rows cost one memory round trip
// instead of one per 256 columns and row. The one-kernel decodes need this: their grid has one
// block per SM, so a warp walks several rows in turn. Each row is summed in warp_dot's order,
// hence the same result to the bit; rows that are not whole 16-byte pieces go through
// warp_dot.
template <typename T, int COLS, int M>
__device__ __forceinline__ void warp_dots_n(const T* const (&w)[M], const float* v,
                                            const int lane, float (&out)[M]) {
  constexpr int NL = COLS % 256 == 0 ? COLS / 256 : 1;
  bool whole = COLS % 256 == 0;
#pragma unroll
  for (int m = 0; m < M; ++m) whole = whole && reinterpret_cast<unsigned long long>(w[m]) % 16 == 0;
  if (!whole) {
#pragma unroll
    for (int m = 0; m < M; ++m) out[m] = warp_dot(w[m], v, COLS, lane);
    return;
  }
  Vec8<T> pk[M][NL];
#pragma unroll
  for (int i = 0; i < NL; ++i) {
#pragma unroll
    for (int m = 0; m < M; ++m) pk[m][i] = *reinterpret_cast<const Vec8<T>*>(w[m] + i * 256 + lane * 8);
  }
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
#pragma unroll
  for (int i = 0; i < NL; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int m = 0; m < M; ++m) acc[m] += to_f(pk[m][i].x[j]) * v[i * 256 + lane * 8 + j];
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], off);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) out[m] = acc[m];
}

// One row of warp_dots_n.
template <typename T, int COLS>
__device__ __forceinline__ float warp_dot_n(const T* w, const float* v, const int lane) {
  const T* const rows[1] = {w};
  float out[1];
  warp_dots_n<T, COLS, 1>(rows, v, lane, out);
  return out[0];
}

// A conv row's operands (bias, K taps, the K-1 cached inputs), loaded by lane 0 before the
// row's product so that their round trip overlaps the product's.
template <int K>
struct ConvIn {
  float b = 0.f, w[K], c[K - 1];
};

template <typename T, int K>
__device__ __forceinline__ ConvIn<K> conv_in(const T* conv_w, const T* conv_b, const T* cache,
                                             const long long b, const long long DI,
                                             const long long r) {
  ConvIn<K> in;
  in.b = to_f(conv_b[r]);
#pragma unroll
  for (int k = 0; k < K; ++k) in.w[k] = to_f(conv_w[r * K + k]);
#pragma unroll
  for (int k = 0; k < K - 1; ++k) in.c[k] = to_f(cache[(b * (K - 1) + k) * DI + r]);
  return in;
}

// Lane 0's end of in_proj row r with product val: rows < DI through the conv and silu (the
// token's x rounded to T first) with the shifted cache written; rows >= DI are z.
template <typename T, int K>
__device__ __forceinline__ void in_row_out(const float val, const ConvIn<K>& in, T* xcz,
                                           T* new_cache, const long long b, const long long DI,
                                           const long long r) {
  if (r < DI) {
    T xr;
    from_f(val, xr);
    float acc = in.b + in.w[K - 1] * to_f(xr);
#pragma unroll
    for (int k = 0; k < K - 1; ++k) acc += in.w[k] * in.c[k];
    // The cache's values come back exactly: T to float and back is the identity.
#pragma unroll
    for (int k = 0; k < K - 2; ++k) from_f(in.c[k + 1], new_cache[(b * (K - 1) + k) * DI + r]);
    new_cache[(b * (K - 1) + K - 2) * DI + r] = xr;
    from_f(silu(acc), xcz[b * 2 * DI + r]);
  } else {
    from_f(val, xcz[b * 2 * DI + r]);
  }
}

// v[0, N) = src[0, N) as floats, src written by other blocks of this launch (read through
// L2, __ldcg): 16-byte loads, each thread issuing all of its loads (up to 4 per pass) before
// its first store, so a fill costs one L2 round trip per pass instead of one per element a
// thread handles. Falls back to element loads where src is not 16-byte aligned or N is not a
// whole number of 16-byte pieces.
template <typename T, int N>
__device__ __forceinline__ void fill_fresh(float* v, const T* src) {
  constexpr int E = 16 / sizeof(T);
  if (N % E != 0 || reinterpret_cast<unsigned long long>(src) % 16 != 0) {
    for (int c = threadIdx.x; c < N; c += blockDim.x) v[c] = to_f(__ldcg(src + c));
    return;
  }
  constexpr int P = 4;
  const int step = blockDim.x * E;
  for (int base = threadIdx.x * E; base < N; base += P * step) {
    int4 raw[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (base + p * step < N) raw[p] = __ldcg(reinterpret_cast<const int4*>(src + base + p * step));
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (base + p * step >= N) continue;
      const T* e = reinterpret_cast<const T*>(&raw[p]);
#pragma unroll
      for (int j = 0; j < E; ++j) v[base + p * step + j] = to_f(e[j]);
    }
  }
}

// Phase 1 of a block's decode step, the same in the four-launch (IN_CONV_BODY) and the
// one-launch kernels (layer_phases): per batch row, the RMS norm of the residual x into v (every
// block computes it, DM values), then the in_proj rows row0, row0 + stride, ... < 2 DI, one warp
// per row (two at a time: warp_dots_n). Rows < DI go through the causal conv with the cache and
// silu (the token's x rounded to T first, as in_proj's output would be) and shift the cache;
// rows >= DI are z (in_row_out). Writes xcz
// [batch, 2 DI] = [silu(conv), z] and new_cache. v holds DM floats, red 32. FRESH_X: x was
// written by other blocks of this launch (the one-kernel model decode's residual stream), so
// it is read through L2 (__ldcg) like every such value.
template <typename T, int DM, int K, bool FRESH_X = false>
__device__ __forceinline__ void norm_in_conv(const T* x, const T* norm_w, const float* eps,
                                             const T* w_in, const T* cache, const T* conv_w,
                                             const T* conv_b, T* xcz, T* new_cache, float* v,
                                             float* red, const long long batch,
                                             const long long DI, const long long row0,
                                             const long long stride) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (long long b = 0; b < batch; ++b) {
    float ss = 0.f;
    if (FRESH_X) {
      // Filled in 16-byte pieces, summed in the same per-thread order as below.
      fill_fresh<T, DM>(v, x + b * DM);
      __syncthreads();
      for (int c = threadIdx.x; c < DM; c += blockDim.x) ss += v[c] * v[c];
    } else {
      for (int c = threadIdx.x; c < DM; c += blockDim.x) {
        const float xv = to_f(x[b * DM + c]);
        v[c] = xv;
        ss += xv * xv;
      }
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
    // A warp's rows two at a time (r and r + stride): one round trip per pair.
    for (long long r = row0; r < 2 * DI; r += 2 * stride) {
      const long long r1 = r + stride;
      const bool pair = r1 < 2 * DI;  // the same for the whole warp
      ConvIn<K> in0, in1;
      if (lane == 0 && r < DI) in0 = conv_in<T, K>(conv_w, conv_b, cache, b, DI, r);
      if (lane == 0 && pair && r1 < DI) in1 = conv_in<T, K>(conv_w, conv_b, cache, b, DI, r1);
      float val[2];
      if (pair) {
        const T* const rows[2] = {w_in + r * DM, w_in + r1 * DM};
        warp_dots_n<T, DM, 2>(rows, v, lane, val);
      } else {
        val[0] = warp_dot_n<T, DM>(w_in + r * DM, v, lane);
      }
      if (lane != 0) continue;
      in_row_out<T, K>(val[0], in0, xcz, new_cache, b, DI, r);
      if (pair) in_row_out<T, K>(val[1], in1, xcz, new_cache, b, DI, r1);
    }
    __syncthreads();  // v and red are rewritten for the next batch row
  }
}

// ---- The grid barrier of the one-kernel decode ----------------------------------------------
// MLX launches an mx.fast.cuda_kernel as a plain kernel node of its CUDA graph, never as a
// cooperative launch, so cooperative_groups' grid.sync() is not available. This is a software
// grid barrier instead, and like every such barrier it is only correct if all blocks of the
// grid are resident at once: the wrapper launches at most one block per SM (256 threads, ~9 KB
// of shared memory: any recent GPU holds that). So that a grid that is not resident anyway
// (another kernel holding SMs, a wrong SM count) is reported rather than hanging the GPU, a
// wait gives up after LIMIT polls and sets the model's poison flag.
//
// State, zeroed once by the host and then only changed here: bar = {arrivals, generation} of
// one launch site (one per layer), poison = {a wait timed out} of the whole model. A completed
// barrier leaves `arrivals` at 0, so the next launch starts from a clean state; the generation
// only grows (wrapping) and waiters compare it for equality only.
#ifdef KSM_EMULATION
// The CPU emulation runs one fiber at a time and switches only at barriers and polls, so
// plain accesses are atomic and ordered there; poll() lets the other blocks run.
__device__ __forceinline__ unsigned int ld_relaxed(const unsigned int* p) { return *p; }
__device__ __forceinline__ unsigned int ld_acquire(const unsigned int* p) { return *p; }
__device__ __forceinline__ void st_relaxed(unsigned int* p, const unsigned int v) { *p = v; }
__device__ __forceinline__ unsigned int add_acq_rel(unsigned int* p, const unsigned int v) {
  const unsigned int old = *p;
  *p = old + v;
  return old;
}
__device__ __forceinline__ void add_release(unsigned int* p, const unsigned int v) { *p += v; }
__device__ __forceinline__ unsigned long long poll_pause() { return emu::poll(); }
#else
// GPU-scope strong operations in PTX (sm_70 and later), generic addresses. Chosen over
// volatile accesses plus __threadfence() because each states the one ordering its access
// needs: the memory model then guarantees the barrier, where volatile + fences rely on the
// fences' (stronger, slower) sequential consistency.
__device__ __forceinline__ unsigned int ld_relaxed(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned int ld_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed(unsigned int* p, const unsigned int v) {
  asm volatile("st.relaxed.gpu.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned int add_acq_rel(unsigned int* p, const unsigned int v) {
  unsigned int old;
  asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ void add_release(unsigned int* p, const unsigned int v) {
  asm volatile("red.release.gpu.add.u32 [%0], %1;" : : "l"(p), "r"(v) : "memory");
}
// No sleep between polls: a barrier wait is a few microseconds, and a sleep would add its
// wake-up latency to every one of them.
__device__ __forceinline__ unsigned long long poll_pause() { return 1ull; }
#endif

// At kernel start, thread 0: whether an earlier launch of this model timed out. A barrier that
// timed out has lost count for good (the arrival it waited for comes late or never), so later
// launches skip their waits and finish fast, with garbage, until the host reads the flag.
template <bool ON>
__device__ __forceinline__ int grid_begin(const unsigned int* poison) {
  return ON && threadIdx.x == 0 && ld_relaxed(poison) != 0u;
}

// Every thread of every block calls this between two phases. `failed` is thread 0's: set when
// its wait timed out (or the model was poisoned), after which it no longer arrives or waits.
template <bool ON, int LIMIT>
__device__ __forceinline__ void grid_sync(unsigned int* bar, unsigned int* poison, int& failed) {
  // The block's writes of this phase are ordered before thread 0's arrival by bar.sync, and
  // the arrival's release half publishes them at GPU scope (PTX's release is cumulative).
  __syncthreads();
  if (ON && threadIdx.x == 0 && !failed) {
    // The generation is read before arriving: once this block has arrived, the last one may
    // bump it at any moment, and a value read after that would be waited for in vain. The
    // release half of the arrival keeps this load before it.
    const unsigned int gen = ld_relaxed(bar + 1);
    const unsigned int blocks = gridDim.x * gridDim.y * gridDim.z;
    if (add_acq_rel(bar, 1u) == blocks - 1u) {
      // The last arrival has acquired every earlier one (the arrivals are one chain of
      // read-modify-writes on the count). Reset the count for the next barrier first, then
      // publish the new generation with release: waiters that see it see everything above.
      st_relaxed(bar, 0u);
      add_release(bar + 1, 1u);
    } else {
      // The generation is looked at before the limit, so a wait is only given up if it was
      // still unchanged after LIMIT polls.
      for (unsigned long long spins = 0; ld_acquire(bar + 1) == gen; spins += poll_pause()) {
        if (spins >= (unsigned long long)LIMIT) {
          failed = 1;
          st_relaxed(poison, 1u);
          break;
        }
      }
    }
  }
  // The other threads read other blocks' results only after thread 0's acquire; this bar.sync
  // carries that ordering to them.
  __syncthreads();
}
// ---- One residual block's decode step on a persistent grid ----------------------------------
// The four phases of the four-launch decode (IN_CONV_BODY, XPROJ_BODY, STEP_BODY, OUT_BODY),
// each strided over the whole grid (any number of blocks is correct as long as all are
// resident), separated by grid barriers: x_out = x + block(x), new_cache, h_out. xcz [batch,
// 2 DI], dbc [batch, R + 2 NS] and y [batch, DI] are the scratch vectors the phases hand on.
// Used once by the one-block kernel (LAYER_BODY) and once per layer by the whole-model kernel
// (MODEL_BODY), which puts a barrier between layers. FRESH_X: x was written by other blocks of
// this launch (read through L2, as xcz, dbc and y are).
//
// Invariant: shared memory is never read across a grid barrier; every phase fills `v` (and
// `red`) before reading it. The CPU emulation depends on it (its __shared__ is one static
// array for all blocks, and a block resumes from a barrier after others have run); the device
// does not, but a phase must not count on what an earlier one left there.
//
// Values other blocks wrote in this launch (xcz, dbc, y, and x where FRESH_X) are read with
// __ldcg, which caches in L2 only. The barrier's acquire already orders these reads after
// those writes, and on current GPUs a GPU-scope acquire also invalidates the SM's L1; __ldcg
// makes that second point moot (L2 is where all SMs meet) at no cost here, each value being
// read once per block. The kernel's own inputs never change while it runs and use ordinary
// loads.
template <typename T, int DM, int DI, int K, int NS, int R, bool GRID_SYNC, int SPIN_LIMIT,
          bool FRESH_X>
__device__ __forceinline__ void layer_phases(
    const T* x, const T* norm_w, const float* eps, const T* w_in, const T* cache,
    const T* conv_w, const T* conv_b, const T* w_x, const T* w_dt, const float* dt_bias,
    const float* A, const float* D, const T* w_out, const float* h0, T* x_out, T* new_cache,
    float* h_out, T* xcz, T* dbc, T* y, float* v, float* red, const long long batch,
    unsigned int* bar, unsigned int* bad, int& failed) {
  constexpr int RN = R + 2 * NS;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const long long gw = (long long)blockIdx.x * warps + warp, nw = (long long)gridDim.x * warps;

  // A. norm + in_proj + conv (norm_in_conv), in_proj rows over all warps of the grid.
  norm_in_conv<T, DM, K, FRESH_X>(x, norm_w, eps, w_in, cache, conv_w, conv_b, xcz, new_cache,
                                  v, red, batch, DI, gw, nw);
  grid_sync<GRID_SYNC, SPIN_LIMIT>(bar, bad, failed);

  // B. x_proj: dbc [batch, RN] = w_x . u, u the first DI values of xcz.
  for (long long b = 0; b < batch; ++b) {
    fill_fresh<T, DI>(v, xcz + b * 2 * DI);
    __syncthreads();
    for (long long r = gw; r < RN; r += nw) {
      const float val = warp_dot_n<T, DI>(w_x + r * DI, v, lane);
      if (lane == 0) from_f(val, dbc[b * RN + r]);
    }
    __syncthreads();
  }
  grid_sync<GRID_SYNC, SPIN_LIMIT>(bar, bad, failed);

  // C. The step, one thread per (channel, state) as in STEP_BODY, strided over the grid. The
  // stride is a multiple of 32 and NS divides 32, so the NS lanes of a channel stay together
  // and leave the loop together.
  {
    const long long total = batch * DI * NS, stride = (long long)gridDim.x * blockDim.x;
    const unsigned int mask = (unsigned int)((1ull << NS) - 1ull)
                              << ((threadIdx.x & 31u) & ~(unsigned int)(NS - 1));
    for (long long gid = (long long)blockIdx.x * blockDim.x + threadIdx.x; gid < total;
         gid += stride) {
      const long long ch = gid / NS, b = ch / DI, d = ch % DI;
      const int n = (int)(gid % NS);
      const T* row = dbc + b * RN;
      float dt = 0.f;
      for (int r = n; r < R; r += NS) dt += to_f(__ldcg(row + r)) * to_f(w_dt[d * R + r]);
#pragma unroll
      for (int off = NS / 2; off > 0; off >>= 1) dt += __shfl_xor_sync(mask, dt, off, NS);
      dt = softplus(dt + dt_bias[d]);
      const float u = to_f(__ldcg(xcz + b * 2 * DI + d));
      const long long s = ch * NS + n;
      const float h = expf(dt * A[d * NS + n]) * h0[s] + dt * u * to_f(__ldcg(row + R + n));
      h_out[s] = h;
      float part = h * to_f(__ldcg(row + R + NS + n));
#pragma unroll
      for (int off = NS / 2; off > 0; off >>= 1) part += __shfl_xor_sync(mask, part, off, NS);
      if (n == 0) {
        const float z = to_f(__ldcg(xcz + b * 2 * DI + DI + d));
        from_f((part + D[d] * u) * silu(z), y[ch]);
      }
    }
  }
  grid_sync<GRID_SYNC, SPIN_LIMIT>(bar, bad, failed);

  // D. out_proj with the residual: x_out = x + w_out . y.
  for (long long b = 0; b < batch; ++b) {
    fill_fresh<T, DI>(v, y + b * DI);
    __syncthreads();
    for (long long r = gw; r < DM; r += nw) {
      const float val = warp_dot_n<T, DI>(w_out + r * DI, v, lane);
      if (lane == 0) {
        const float res = to_f(FRESH_X ? __ldcg(x + b * DM + r) : x[b * DM + r]);
        from_f(res + val, x_out[b * DM + r]);
      }
    }
    __syncthreads();
  }
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
  const int warps = blockDim.x >> 5;
  const long long row0 = (long long)blockIdx.x * warps + (threadIdx.x >> 5);
  norm_in_conv<T, DM, K>(x, norm_w, eps, w_in, cache, conv_w, conv_b, xcz, new_cache, v, red,
                         x_shape[0], cache_shape[2], row0, (long long)gridDim.x * warps);
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

# The whole block in one launch (fused_layer_decode): layer_phases above once. Extra inputs:
# barrier (uint32 [4]: this layer's arrivals and generation) and poison (uint32 [4]: the model's
# time-out flag), both mutated in place. Extra outputs: the scratch vectors xcz [batch, 2 DI],
# dbc [batch, R + 2 NS], y [batch, DI] that the phases hand on, and status [blocks] (1 where a
# block's barrier wait timed out or the model was already poisoned). GRID_SYNC = false drops
# the barriers (only for the test that shows they are needed).
LAYER_BODY = r"""
  using namespace ksm_model;
  __shared__ float v[DM > DI ? DM : DI];
  __shared__ float red[32];
  // MLX passes inputs as const and treats them as unchanging; these two are changed on purpose
  // (why that is sound: fused_layer_decode in model_kernels.py).
  unsigned int* const bar = const_cast<unsigned int*>(barrier);
  unsigned int* const bad = const_cast<unsigned int*>(poison);
  int failed = ksm_model::grid_begin<GRID_SYNC>(bad);
  layer_phases<T, DM, DI, K, NS, R, GRID_SYNC, SPIN_LIMIT, false>(
      x, norm_w, eps, w_in, cache, conv_w, conv_b, w_x, w_dt, dt_bias, A, D, w_out, h0, x_out,
      new_cache, h_out, xcz, dbc, y, v, red, x_shape[0], bar, bad, failed);
  if (threadIdx.x == 0) status[blockIdx.x] = failed;
"""

# A whole decode step of the model in one launch (fused_model_decode): layer_phases for each
# of the NL layers, a grid barrier between layers (the next layer's norm reads every row of the
# residual stream the last phase wrote). The weights, conv caches and states are stacked along
# a leading layer axis; the residual stream between layers lives in xs [2, batch, DM] (layer l
# writes half l % 2 and reads the other), the last layer writes x_out. One barrier state for
# the launch site: consecutive tokens' launches are ordered by their data (each reads the
# caches and states the one before wrote), so two launches never share it at once.
MODEL_BODY = r"""
  using namespace ksm_model;
  __shared__ float v[DM > DI ? DM : DI];
  __shared__ float red[32];
  unsigned int* const bar = const_cast<unsigned int*>(barrier);
  unsigned int* const bad = const_cast<unsigned int*>(poison);
  constexpr long long RN = R + 2 * NS;
  const long long batch = x_shape[0];
  int failed = ksm_model::grid_begin<GRID_SYNC>(bad);
  for (int l = 0; l < NL; ++l) {
    T* const out = l == NL - 1 ? x_out : xs + (long long)(l & 1) * batch * DM;
    const T* const in = l == 0 ? x : xs + (long long)((l + 1) & 1) * batch * DM;
    const long long cache_at = l * batch * (K - 1) * DI, state_at = l * batch * DI * NS;
#define KSM_LAYER_ARGS                                                                        \
    in, norm_w + l * DM, eps + l, w_in + l * 2LL * DI * DM, cache + cache_at,               \
        conv_w + l * (long long)DI * K, conv_b + l * DI, w_x + l * RN * DI,                   \
        w_dt + l * (long long)DI * R, dt_bias + l * DI, A + l * (long long)DI * NS,           \
        D + l * DI, w_out + l * (long long)DM * DI, h0 + state_at, out,                       \
        new_cache + cache_at, h_out + state_at, xcz, dbc, y, v, red, batch, bar, bad, failed
    if (l == 0) {
      layer_phases<T, DM, DI, K, NS, R, GRID_SYNC, SPIN_LIMIT, false>(KSM_LAYER_ARGS);
    } else {
      layer_phases<T, DM, DI, K, NS, R, GRID_SYNC, SPIN_LIMIT, true>(KSM_LAYER_ARGS);
    }
#undef KSM_LAYER_ARGS
    if (l + 1 < NL) ksm_model::grid_sync<GRID_SYNC, SPIN_LIMIT>(bar, bad, failed);
  }
  if (threadIdx.x == 0) status[blockIdx.x] = failed;
"""


_TAG = hashlib.sha256((HEADER + CONV_BODY + STEP_BODY + IN_CONV_BODY + XPROJ_BODY
                       + OUT_BODY + LAYER_BODY + MODEL_BODY).encode()).hexdigest()[:12]
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
_LAYER = mx.fast.cuda_kernel(
    name=f"ksm_layer_{_TAG}",
    input_names=["x", "norm_w", "eps", "w_in", "cache", "conv_w", "conv_b", "w_x", "w_dt",
                 "dt_bias", "A", "D", "w_out", "h0", "barrier", "poison"],
    output_names=["x_out", "new_cache", "h_out", "xcz", "dbc", "y", "status"],
    source=LAYER_BODY, header=HEADER, ensure_row_contiguous=True)
_MODEL = mx.fast.cuda_kernel(
    name=f"ksm_model_{_TAG}",
    input_names=["x", "norm_w", "eps", "w_in", "cache", "conv_w", "conv_b", "w_x", "w_dt",
                 "dt_bias", "A", "D", "w_out", "h0", "barrier", "poison"],
    output_names=["x_out", "new_cache", "h_out", "xs", "xcz", "dbc", "y", "status"],
    source=MODEL_BODY, header=HEADER, ensure_row_contiguous=True)
ROWS_PER_BLOCK = THREADS // 32  # one warp per output row
# Polls before a grid-barrier wait gives up: a GPU-scope load per poll, ~0.3-0.5 us on an H200
# (an estimate, not measured), so about 1-2 s, against a few microseconds for a normal wait.
SPIN_LIMIT = 1 << 22
# Blocks of the one-kernel decode when the SM count cannot be found out.
DEFAULT_BLOCKS = 64
# SM counts by device name, for MLX versions whose mx.device_info() does not report it (0.32
# reports name and architecture only); the first listed substring found in the name wins.
_KNOWN_SMS = (("GH200", 132), ("H200", 132), ("H100 PCIe", 114), ("H100", 132), ("H800", 132),
              ("A100", 108), ("L40S", 142), ("L40", 142), ("RTX 4090", 128))


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
    batch, d_model, dim, N, K, R = _decode_shapes("fused_decode", x, w_in, cache, conv_w, w_x,
                                                  w_dt, A, w_out)
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


def _decode_shapes(name, x, w_in, cache, conv_w, w_x, w_dt, A, w_out):
    return _decode_dims(name, *(tuple(a.shape) for a in (x, w_in, cache, conv_w, w_x, w_dt, A,
                                                          w_out)))


def _decode_dims(name, x, w_in, cache, conv_w, w_x, w_dt, A, w_out):
    """(batch, d_model, dim, N, K, R) from one block's decode shapes, or ValueError."""
    batch, d_model = x
    dim, N = A
    K = conv_w[1]
    R = w_dt[1]
    if N > 32 or N & (N - 1):
        raise ValueError(f"{name} needs a power-of-two state size up to 32, got {N}")
    if w_in != (2 * dim, d_model) or w_out != (d_model, dim):
        raise ValueError(f"projections {w_in}, {w_out} do not fit x {x} and dim {dim}")
    if w_x != (R + 2 * N, dim) or cache != (batch, K - 1, dim) or K < 2:
        raise ValueError(f"x_proj {w_x} or conv cache {cache} do not fit dim {dim}, N {N}, "
                         f"rank {R}, K {K}")
    return batch, d_model, dim, N, K, R


def sm_count(default: int = DEFAULT_BLOCKS) -> int:
    """The GPU's SM count as far as MLX tells it: a count key of mx.device_info() if there is
    one, else the count of a known device name, else `default`."""
    try:
        info = dict(mx.device_info())
    except Exception:
        return default
    for key in ("multi_processor_count", "multiprocessor_count", "num_sms", "sm_count"):
        if isinstance(info.get(key), int) and info[key] > 0:
            return int(info[key])
    name = str(info.get("device_name", ""))
    for part, sms in _KNOWN_SMS:
        # Whole words: "A100" must not match "RTX A1000" (20 SMs).
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(part)}(?![A-Za-z0-9])", name):
            return sms
    return default


def grid_state():
    """A zeroed uint32 [4] for fused_layer_decode: one per launch site (the barrier) and one per
    model (the poison flag), created once and kept. Built from a list so that it is a real
    buffer: mx.zeros may be a broadcast scalar, which a kernel input gets as a fresh copy each
    call, and then the kernel's changes would be lost."""
    return mx.array([0, 0, 0, 0], dtype=mx.uint32)


def grid_failed(poison) -> bool:
    """Whether any grid-barrier wait of the model owning `poison` has timed out since it was
    created. Waits for the device (one synchronisation): call it once, not per token."""
    mx.synchronize()
    return bool(poison.tolist()[0])


def fused_layer_decode(x, norm_w, eps, w_in, cache, conv_w, conv_b, w_x, w_dt, dt_bias, A, D,
                       w_out, h0, barrier, poison, *, blocks: int | None = None,
                       spin_limit: int = SPIN_LIMIT, grid_sync: bool = True,
                       with_status: bool = False):
    """fused_decode's block in one launch: the same arguments and results, plus `barrier` (this
    launch site's grid-barrier state) and `poison` (the model's time-out flag), both from
    grid_state(). `blocks`: the grid (default: one per SM, sm_count()); every phase strides over
    it, so any count is correct as long as all blocks are resident at once. with_status also
    returns status [blocks] int32 (1: that block's wait timed out, or the model was poisoned).
    grid_sync=False drops the barriers: wrong results, for the test that shows they matter.

    The two state arrays are inputs that the kernel changes through a const_cast, against
    MLX's view of inputs as unchanging. This is sound here because:
    - outputs cannot carry state: MLX allocates them afresh for every call, and init_value
      would add a fill launch per output, which is what this kernel exists to avoid;
    - a completed barrier leaves its count at 0 (the generation only has to change), so the
      zeros the array was created with stay a valid start for every later launch;
    - launches sharing `barrier` never overlap: MLX's CUDA graphs order nodes by data
      dependence, and each launch of a layer reads the conv cache and state the previous one
      of that layer wrote (hence one `barrier` per layer, not one per model: two layers of
      different tokens can be independent, one layer of consecutive tokens cannot);
    - `poison` is shared by all layers, but only ever set, and read at the start of a launch.
    The arrays must be real buffers, row-contiguous and kept alive (grid_state()), or MLX would
    hand the kernel a copy."""
    batch, d_model, dim, N, K, R = _decode_shapes("fused_layer_decode", x, w_in, cache, conv_w,
                                                  w_x, w_dt, A, w_out)
    blocks = _grid_args(barrier, poison, blocks, spin_limit)
    t = x.dtype
    x_out, new_cache, h, _xcz, _dbc, _y, status = _LAYER(
        inputs=[x, norm_w, eps, w_in, cache, conv_w, conv_b, w_x, w_dt, dt_bias, A, D, w_out, h0,
                barrier, poison],
        template=[("T", t), ("DM", d_model), ("DI", dim), ("K", K), ("NS", N), ("R", R),
                  ("SPIN_LIMIT", int(spin_limit)), ("GRID_SYNC", bool(grid_sync))],
        grid=(blocks * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(batch, d_model), (batch, K - 1, dim), (batch, dim, N), (batch, 2 * dim),
                       (batch, R + 2 * N), (batch, dim), (blocks,)],
        output_dtypes=[t, t, mx.float32, t, t, t, mx.int32])
    if with_status:
        return x_out, new_cache, h, status
    return x_out, new_cache, h


def _grid_args(barrier, poison, blocks, spin_limit) -> int:
    """The one-launch decodes' grid arguments checked; returns the block count (default: one
    per SM)."""
    for name, arr in (("barrier", barrier), ("poison", poison)):
        if arr.dtype != mx.uint32 or tuple(arr.shape) != (4,):
            raise ValueError(f"{name} must be a uint32 [4] from grid_state(), got "
                             f"{arr.dtype} {tuple(arr.shape)}")
    blocks = int(blocks or sm_count())
    if blocks < 1 or not 1 <= spin_limit < 2 ** 31:
        raise ValueError(f"need blocks >= 1 and 1 <= spin_limit < 2^31, got {blocks}, {spin_limit}")
    return blocks


def fused_model_decode(x, norm_w, eps, w_in, cache, conv_w, conv_b, w_x, w_dt, dt_bias, A, D,
                       w_out, h0, barrier, poison, *, blocks: int | None = None,
                       spin_limit: int = SPIN_LIMIT, grid_sync: bool = True,
                       with_status: bool = False):
    """One token through every residual block of the model in ONE launch: fused_layer_decode's
    arguments with each block's weights, conv cache and state stacked along a leading layer
    axis (norm_w [NL, DM], eps [NL] f32, w_in [NL, 2 dim, DM], cache [NL, batch, K-1, dim],
    conv_w [NL, dim, K, 1], conv_b [NL, dim], w_x [NL, R + 2N, dim], w_dt [NL, dim, R],
    dt_bias and D [NL, dim] f32, A [NL, dim, N] f32, w_out [NL, DM, dim], h0 [NL, batch, dim,
    N] f32); x [batch, DM] is the residual stream entering the first block. Returns (the
    stream after the last block [batch, DM], the new caches and states, stacked), plus status
    [blocks] with with_status. `barrier` is this launch site's grid_state() (one per model:
    consecutive tokens' launches are ordered by their data), `poison` the model's.

    Same phases and order of summation as fused_layer_decode, layer after layer: the same bits
    as NL launches of it. What it saves is the launches and MLX's work around them: one
    primitive per token instead of one (or four) per block. The soundness of changing the two
    state arrays in place is argued at fused_layer_decode."""
    layers = int(A.shape[0]) if A.ndim == 3 else 0
    stacked = {"norm_w": norm_w, "eps": eps, "w_in": w_in, "cache": cache, "conv_w": conv_w,
               "conv_b": conv_b, "w_x": w_x, "w_dt": w_dt, "dt_bias": dt_bias, "A": A, "D": D,
               "w_out": w_out, "h0": h0}
    bad = [k for k, a in stacked.items() if a.ndim < 1 or a.shape[0] != layers]
    if layers < 1 or bad:
        raise ValueError(f"fused_model_decode needs every stacked argument's first axis to be "
                         f"the layer count {layers}: {', '.join(bad) or 'no layers'}")
    batch, d_model, dim, N, K, R = _decode_dims(
        "fused_model_decode", tuple(x.shape), *(tuple(a.shape[1:]) for a in (
            w_in, cache, conv_w, w_x, w_dt, A, w_out)))
    want = {"norm_w": (layers, d_model), "eps": (layers,), "conv_b": (layers, dim),
            "dt_bias": (layers, dim), "D": (layers, dim), "h0": (layers, batch, dim, N)}
    wrong = [f"{k} {tuple(stacked[k].shape)} (want {w})" for k, w in want.items()
             if tuple(stacked[k].shape) != w]
    if wrong:
        raise ValueError("fused_model_decode: " + "; ".join(wrong))
    blocks = _grid_args(barrier, poison, blocks, spin_limit)
    t = x.dtype
    x_out, new_cache, h, _xs, _xcz, _dbc, _y, status = _MODEL(
        inputs=[x, norm_w, eps, w_in, cache, conv_w, conv_b, w_x, w_dt, dt_bias, A, D, w_out, h0,
                barrier, poison],
        template=[("T", t), ("NL", layers), ("DM", d_model), ("DI", dim), ("K", K), ("NS", N),
                  ("R", R), ("SPIN_LIMIT", int(spin_limit)), ("GRID_SYNC", bool(grid_sync))],
        grid=(blocks * THREADS, 1, 1), threadgroup=(THREADS, 1, 1),
        output_shapes=[(batch, d_model), (layers, batch, K - 1, dim), (layers, batch, dim, N),
                       (2, batch, d_model), (batch, 2 * dim), (batch, R + 2 * N), (batch, dim),
                       (blocks,)],
        output_dtypes=[t, t, mx.float32, t, t, t, t, mx.int32])
    if with_status:
        return x_out, new_cache, h, status
    return x_out, new_cache, h
