// Unit probe for the wgmma building blocks of tasks/attention/templates-cuda/device.cuh.j2 (algo = "wgmma"): one
// warpgroup computes S = Q K^T (descriptors, K-major, 128B swizzle) and O = P V (P from registers,
// V MN-major), for D in {64, 128} and BLOCK_N in {64, 128}; the host compares with float math.
// Build: python build.py --out <dir> --probe (renders wg_m64n64s2, one warpgroup, as wgmma_device.cuh),
// then run <dir>/wgmma_probe on the GPU.
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <vector>
#include "wgmma_device.cuh"

using namespace ksa;

template <int D, int BN>
__global__ void probe_qk(const __half* q, const __half* k, float* s_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const u32 raw = smem_u32(smem);
  const u32 q_s = (raw + 1023u) & ~1023u;
  const u32 k_s = q_s + 64 * D * 2;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  load_tile_sw<__half, D, 64>(q_s, q, 0, 64, tid);
  load_tile_sw<__half, D, BN>(k_s, k, 0, BN, tid);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  float s[BN / 2];
  wg_fence();
  for (int kk = 0; kk < D / 16; ++kk) {
    const u64 da = make_desc(q_s + (kk / 4) * 64 * 128 + (kk % 4) * 32, 16, 1024);
    const u64 db = make_desc(k_s + (kk / 4) * BN * 128 + (kk % 4) * 32, 16, 1024);
    wgmma_ss(s, da, db, kk > 0 ? 1 : 0, __half{});
  }
  wg_commit();
  wg_wait<0>();
  for (int i = 0; i < BN / 2; ++i) {
    const int row = warp * 16 + g + ((i % 4) >= 2 ? 8 : 0), col = 8 * (i / 4) + 2 * t + (i & 1);
    s_out[row * BN + col] = s[i];
  }
}

template <int D, int BN>
__global__ void probe_pv(const __half* p, const __half* v, float* o_out) {
  extern __shared__ __align__(16) unsigned char smem[];
  const u32 raw = smem_u32(smem);
  const u32 v_s = (raw + 1023u) & ~1023u;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  load_tile_sw<__half, D, BN>(v_s, v, 0, BN, tid);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  float o[D / 2];
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  const int r0 = warp * 16 + g;
  u32 pa[BN / 16][4];
  for (int kk = 0; kk < BN / 16; ++kk) {
    const __half* pr = p + r0 * BN + kk * 16 + 2 * t;
    pa[kk][0] = *reinterpret_cast<const u32*>(pr);
    pa[kk][1] = *reinterpret_cast<const u32*>(pr + 8 * BN);
    pa[kk][2] = *reinterpret_cast<const u32*>(pr + 8);
    pa[kk][3] = *reinterpret_cast<const u32*>(pr + 8 * BN + 8);
  }
  wg_fence();
  for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs(o, pa[kk], make_desc(v_s + kk * 2048, BN * 128, 1024), __half{});
  wg_commit();
  wg_wait<0>();
  for (int i = 0; i < D / 2; ++i) {
    const int row = r0 + ((i % 4) >= 2 ? 8 : 0), col = 8 * (i / 4) + 2 * t + (i & 1);
    o_out[row * D + col] = o[i];
  }
}

static int check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) { std::printf("CUDA error %s: %s\n", what, cudaGetErrorString(e)); std::exit(2); }
  return 0;
}

template <int D, int BN>
static int run() {
  const int nq = 64 * D, nk = BN * D, np = 64 * BN;
  std::vector<__half> hq(nq), hk(nk), hp(np);
  std::vector<float> fq(nq), fk(nk), fp(np);
  srand(D * 1000 + BN);
  auto rnd = [] { return (rand() % 2001 - 1000) / 1000.0f; };
  for (int i = 0; i < nq; ++i) { hq[i] = __float2half(rnd()); fq[i] = __half2float(hq[i]); }
  for (int i = 0; i < nk; ++i) { hk[i] = __float2half(rnd()); fk[i] = __half2float(hk[i]); }
  for (int i = 0; i < np; ++i) { hp[i] = __float2half(rnd()); fp[i] = __half2float(hp[i]); }
  __half *dq, *dk, *dp;
  float *ds, *dout;
  check(cudaMalloc(&dq, nq * 2), "malloc"); check(cudaMalloc(&dk, nk * 2), "malloc"); check(cudaMalloc(&dp, np * 2), "malloc");
  check(cudaMalloc(&ds, 64 * BN * 4), "malloc"); check(cudaMalloc(&dout, 64 * D * 4), "malloc");
  cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dp, hp.data(), np * 2, cudaMemcpyHostToDevice);
  const int smem = (64 + BN) * D * 2 + 1024;
  check(cudaFuncSetAttribute(probe_qk<D, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attr");
  check(cudaFuncSetAttribute(probe_pv<D, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "attr");
  probe_qk<D, BN><<<1, 128, smem>>>(dq, dk, ds);
  check(cudaDeviceSynchronize(), "qk");
  // V := K reinterpreted as [BN][D]
  probe_pv<D, BN><<<1, 128, smem>>>(dp, dk, dout);
  check(cudaDeviceSynchronize(), "pv");
  std::vector<float> s(64 * BN), o(64 * D);
  cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost);
  double es = 0, eo = 0;
  int bad_s = -1, bad_o = -1;
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < BN; ++c) {
      double ref = 0;
      for (int d = 0; d < D; ++d) ref += fq[r * D + d] * fk[c * D + d];
      const double e = std::fabs(ref - s[r * BN + c]);
      if (e > es) { es = e; if (e > 1e-2 && bad_s < 0) bad_s = r * BN + c; }
    }
  for (int r = 0; r < 64; ++r)
    for (int c = 0; c < D; ++c) {
      double ref = 0;
      for (int n = 0; n < BN; ++n) ref += fp[r * BN + n] * fk[n * D + c];
      const double e = std::fabs(ref - o[r * D + c]);
      if (e > eo) { eo = e; if (e > 1e-2 && bad_o < 0) bad_o = r * D + c; }
    }
  std::printf("probe D=%d BN=%d: QK^T max|err| %.3g %s (first bad %d)   PV max|err| %.3g %s (first bad %d)\n", D, BN, es,
              es < 1e-2 ? "ok" : "WRONG", bad_s, eo, eo < 1e-2 ? "ok" : "WRONG", bad_o);
  cudaFree(dq); cudaFree(dk); cudaFree(dp); cudaFree(ds); cudaFree(dout);
  return (es < 1e-2 && eo < 1e-2) ? 0 : 1;
}

int main() {
  int bad = run<64, 64>() + run<64, 128>() + run<128, 64>() + run<128, 128>();
  return bad;
}
