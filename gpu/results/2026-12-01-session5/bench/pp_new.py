"""Attention forward for the mlx backend: family attention-mlx, target mlx-cuda.

Knobs: algo="wgmma" block_m=128 block_n=128 causal_skip=true cp_async=true exp2=true k_transposed=false overlap=false pingpong=true q_in_regs=false schedule="heavy_first" stages=3 warps=8
q, k, v: [B, H, L, D] in f16 or bf16; returns out in q's dtype; scale 1/sqrt(D); with causal,
query i sees keys j <= i.
"""

import hashlib

import mlx.core as mx

# Device code: the same as the cuda backend's (namespace ksa), given to MLX as the header.
HEADER = r"""
namespace ksa {

constexpr int BLOCK_M = 128;
constexpr int BLOCK_N = 128;
constexpr int WARPS = 8;
constexpr int THREADS = 256;
constexpr int STAGES = 3;
constexpr bool USE_EXP2 = true;
constexpr bool CAUSAL_SKIP = true;
constexpr bool HEAVY_FIRST = true;
constexpr float LOG2E = 1.4426950408889634f;
// No <cstdint> or <cmath> here: NVRTC (the mlx backend) does not promise either.
using u32 = unsigned int;
using i64 = long long;
#define KSA_NEG_INF (__int_as_float(static_cast<int>(0xff800000u)))

__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void store_f32(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store_f32(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// Two floats to one 32-bit register of two 16-bit values, the lower column in the low half
// (the order mma.sync fragments and row-major memory both expect).
__device__ __forceinline__ u32 pack2(float lo, float hi, __half) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}
__device__ __forceinline__ u32 pack2(float lo, float hi, __nv_bfloat16) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<u32*>(&h);
}
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8], __half) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __half22float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8], __nv_bfloat16) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// NVRTC (MLX) gets no -use_fast_math, so the fast path names its instruction explicitly.
__device__ __forceinline__ float softmax_exp(float x) {
  if constexpr (USE_EXP2) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
  } else {
    return expf(x);
  }
}

// Multiplier that takes a raw q.k score to the exponent domain of softmax_exp.
template <int D>
__device__ __forceinline__ float score_scale() {
  return rsqrtf(static_cast<float>(D)) * (USE_EXP2 ? LOG2E : 1.0f);
}

// Maps the launch (x: query block, y: head, z: batch) to the work item. Causal blocks differ
// in cost by up to L / BLOCK_N tiles; handing the longest out first evens the tail.
template <bool CAUSAL>
__device__ __forceinline__ void block_coords(int& qblk, int& bh) {
  if constexpr (CAUSAL && HEAVY_FIRST) {
    const int nbh = gridDim.y * gridDim.z;
    const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    qblk = gridDim.x - 1 - lin / nbh;
    bh = lin % nbh;
  } else {
    qblk = blockIdx.x;
    bh = blockIdx.y + gridDim.y * blockIdx.z;
  }
}

__device__ __forceinline__ u32 smem_u32(const void* p) {
  return static_cast<u32>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int src_bytes) {
  // src_bytes == 0 zero-fills the 16 bytes: rows past L become zeros, never garbage.
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// ---------------------------------------------------------------------------------------------
// wgmma: Hopper warpgroup MMA. Each warpgroup (4 warps) owns 64 query rows. S = Q K^T reads Q and
// K from shared memory through descriptors (both K-major); O += P V takes P from registers (the
// S accumulators, re-packed) and V from shared memory as an MN-major operand (trans-b). Tiles are
// stored as [D/64][rows][64] with the 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8)),
// written by cp.async, STAGES deep.
constexpr int WG = BLOCK_M / 64;
static_assert(THREADS == WG * 128, "one warpgroup per 64 rows");
using u64 = unsigned long long;

// The tiles, the slack that aligns them to 1024 bytes, and the ping-pong schedule's mbarriers
// (a "full" and an "empty" one per stage, 8 bytes each) after the last stage.
template <int D>
constexpr int smem_bytes() { return (BLOCK_M + 2 * STAGES * BLOCK_N) * D * 2 + 1024 + 16 * STAGES; }

// Shared-memory matrix descriptor: start, leading and stride byte offsets (all >> 4), 128B swizzle.
__device__ __forceinline__ u64 make_desc(u32 addr, u32 lbo, u32 sbo) {
  return static_cast<u64>((addr >> 4) & 0x3FFFu) | (static_cast<u64>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<u64>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// wgmma exists only in the arch-specific target (sm_90a). nvcc's -arch=sm_90a also embeds
// compute_90 PTX, which ptxas checks too: there these instructions would not assemble, so that
// pass gets traps. A compute capability 9.0 GPU runs the sm_90a code, never that PTX.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KSA_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define KSA_WGMMA_ASM(...) __trap()
#endif
__device__ __forceinline__ void wg_fence() { KSA_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { KSA_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { KSA_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// cp.async writes are generic-proxy writes; wgmma reads through the async proxy.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d (+)= A[64x16] * B[16x64], A and B K-major in shared memory; scale_d == 0 overwrites d.
__device__ __forceinline__ void wgmma_ss(float (&d)[32], u64 da, u64 db, int scale_d, __half) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 }, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}
// d += A[64x16] (registers, mma.m16n8k16 A layout per warp) * B[16x64] (MN-major in shared memory).
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const u32 (&a)[4], u64 db, __half) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 }, "
      "{ %32, %33, %34, %35 }, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// d (+)= A[64x16] * B[16x64], A and B K-major in shared memory; scale_d == 0 overwrites d.
__device__ __forceinline__ void wgmma_ss(float (&d)[32], u64 da, u64 db, int scale_d, __nv_bfloat16) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 }, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(scale_d));
}
// d += A[64x16] (registers, mma.m16n8k16 A layout per warp) * B[16x64] (MN-major in shared memory).
__device__ __forceinline__ void wgmma_rs(float (&d)[32], const u32 (&a)[4], u64 db, __nv_bfloat16) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31 }, "
      "{ %32, %33, %34, %35 }, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// d (+)= A[64x16] * B[16x128], A and B K-major in shared memory; scale_d == 0 overwrites d.
__device__ __forceinline__ void wgmma_ss(float (&d)[64], u64 da, u64 db, int scale_d, __half) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
// d += A[64x16] (registers, mma.m16n8k16 A layout per warp) * B[16x128] (MN-major in shared memory).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const u32 (&a)[4], u64 db, __half) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, "
      "{ %64, %65, %66, %67 }, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
// d (+)= A[64x16] * B[16x128], A and B K-major in shared memory; scale_d == 0 overwrites d.
__device__ __forceinline__ void wgmma_ss(float (&d)[64], u64 da, u64 db, int scale_d, __nv_bfloat16) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(scale_d));
}
// d += A[64x16] (registers, mma.m16n8k16 A layout per warp) * B[16x128] (MN-major in shared memory).
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const u32 (&a)[4], u64 db, __nv_bfloat16) {
  KSA_WGMMA_ASM(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{ %0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63 }, "
      "{ %64, %65, %66, %67 }, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// Copies rows [row0, row0 + ROWS) of a [L][D] matrix into a swizzled [D/64][ROWS][64] tile at
// shared address dst (1024-aligned); rows past L are zero-filled.
// Thread tid always moves 16-byte chunk tid % CH of a row, and one pass of the block covers
// RSTEP rows, a multiple of 8, so the chunk's swizzled column is the same in every pass: a
// thread keeps one source pointer and one shared address per tile. (Written per chunk index,
// ptxas kept three to four registers per pass alive across the KV loop, ~30 in all, and the
// ping-pong softmax then borrowed the P registers of the running P V, which made it wait for
// that P V first.)
template <typename T, int D, int ROWS>
__device__ __forceinline__ void load_tile_sw(u32 dst, const T* __restrict__ g, int row0, int L, int tid) {
  constexpr int CH = D / 8;
  constexpr int RSTEP = THREADS / CH;
  static_assert(THREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "whole passes, swizzle-invariant");
  const int c = tid % CH, r0 = tid / CH;
  const u32 d0 = dst + (c / 8) * (ROWS * 128) + r0 * 128 + (((c % 8) ^ (r0 % 8)) * 16);
  if (row0 + ROWS <= L) {  // the same for the whole block: no per-chunk bound
    const T* s0 = g + static_cast<i64>(row0 + r0) * D + c * 8;
#pragma unroll
    for (int it = 0; it < ROWS / RSTEP; ++it) cp_async16(d0 + it * RSTEP * 128, s0 + it * RSTEP * D, 16);
  } else {
#pragma unroll
    for (int it = 0; it < ROWS / RSTEP; ++it) {
      const int gr = row0 + r0 + it * RSTEP;
      const bool ok = gr < L;
      // A 32-bit element index, not a selected pointer: one select instead of two plus moves.
      cp_async16(d0 + it * RSTEP * 128, g + (ok ? gr * D + c * 8 : 0), ok ? 16 : 0);
    }
  }
}

constexpr bool OVERLAP = false;
constexpr bool PINGPONG = true;

// mbarriers (shared::cta, 8 bytes each) and named barriers for the ping-pong schedule.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// The arrival happens once every cp.async this thread has issued so far has landed; .noinc makes
// it one of the arrivals the barrier was initialised to expect (not an extra pending one).
__device__ __forceinline__ void mbar_arrive_cp_async(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase with the given parity has completed (acquire, CTA scope). The retry
// loop lives inside the asm block (its labels are local to the braces), so the compiler sees
// one convergent instruction, not a per-thread loop in front of the .aligned wgmma and bar.sync.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred p;\nKSA_MBAR_RETRY:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra KSA_MBAR_RETRY;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void named_sync(int id) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory"); }
__device__ __forceinline__ void named_arrive(int id) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(THREADS) : "memory"); }
// Keeps the next wgmma.wait_group below the code that computed a and b. ptxas schedules a wait
// as early as the instruction order allows (it has no inputs), so without this the wait for the
// running P V went up to just after the wait for S, and a warpgroup's softmax ran only after its
// own P V had finished (Nsight Compute on the H200: tensor pipe busy 54% of the time). A branch
// on the softmax's row sums pins the order; it is never taken (0xffffffff is not a value
// arithmetic produces: NaN results are canonical), and if it were, it would only sleep.
// Operand fences (empty asm on the registers, as CUTLASS does) order the compiler front end
// but not ptxas, and a branch to __trap() makes ptxas serialise every wgmma (C7518).
__device__ __forceinline__ void keep_wait_below(float a, float b) {
  if (__float_as_uint(a) == 0xffffffffu || __float_as_uint(b) == 0xffffffffu) asm volatile("nanosleep.u32 1;");
}
// A compile-time bool passed as a value (no <type_traits> under NVRTC).
template <bool B>
struct flag {
  static constexpr bool value = B;
};

// S = Q K^T for this warpgroup's 64 rows (issued, committed, not waited for).
template <typename T, int D>
__device__ __forceinline__ void issue_qk(float (&s)[BLOCK_N / 2], u32 q_wg, u32 ks) {
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const u64 da = make_desc(q_wg + (kk / 4) * BLOCK_M * 128 + (kk % 4) * 32, 16, 1024);
    const u64 db = make_desc(ks + (kk / 4) * BLOCK_N * 128 + (kk % 4) * 32, 16, 1024);
    wgmma_ss(s, da, db, kk > 0 ? 1 : 0, T{});
  }
  wg_commit();
}

// Masks and exponentiates a finished S tile in place and updates the running max and sum of
// each row half; corr is the factor O must be multiplied by before this tile's P V is added.
// With NO > 0 the NO accumulators at o are rescaled here, row half by row half (the order the
// measured kernels were compiled with); the ping-pong schedule passes NO = 0 and rescales later,
// because its previous P V may still be running on O.
template <bool CAUSAL, int NO>
__device__ __forceinline__ void softmax_tile(float (&s)[BLOCK_N / 2], float* o, float (&mrow)[2],
                                             float (&lrow)[2], float (&corr)[2], int n0, int trow0, int L,
                                             float sc) {
  constexpr int NS = BLOCK_N / 2;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool need_mask = (n0 + BLOCK_N > L) || (CAUSAL && n0 + BLOCK_N - 1 > trow0);
  if (need_mask) {
#pragma unroll
    for (int i = 0; i < NS; ++i) {
      const int row = trow0 + g + ((i % 4) >= 2 ? 8 : 0);
      const int key = n0 + 8 * (i / 4) + 2 * t + (i & 1);
      if (key >= L || (CAUSAL && key > row)) s[i] = KSA_NEG_INF;
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = KSA_NEG_INF;
#pragma unroll
    for (int c = 0; c < NS / 4; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(mrow[h], mx);
    const float m_sc = (m_new == KSA_NEG_INF) ? 0.f : m_new * sc;
    corr[h] = softmax_exp(fmaf(mrow[h], sc, -m_sc));
    float ps = 0.f;
#pragma unroll
    for (int c = 0; c < NS / 4; ++c)
#pragma unroll
      for (int e = 2 * h; e < 2 * h + 2; ++e) {
        const float p = softmax_exp(fmaf(s[4 * c + e], sc, -m_sc));
        s[4 * c + e] = p;
        ps += p;
      }
    lrow[h] = lrow[h] * corr[h] + ps;
    mrow[h] = m_new;
#pragma unroll
    for (int c = 0; c < NO / 4; ++c) {
      o[4 * c + 2 * h] *= corr[h];
      o[4 * c + 2 * h + 1] *= corr[h];
    }
  }
}

template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 2], const float (&corr)[2]) {
#pragma unroll
  for (int c = 0; c < D / 8; ++c) {
    o[4 * c] *= corr[0];
    o[4 * c + 1] *= corr[0];
    o[4 * c + 2] *= corr[1];
    o[4 * c + 3] *= corr[1];
  }
}

// The exponentiated S tile as the register A fragments of P V.
template <typename T>
__device__ __forceinline__ void pack_p(const float (&s)[BLOCK_N / 2], u32 (&pa)[BLOCK_N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
    pa[kk][0] = pack2(s[8 * kk + 0], s[8 * kk + 1], T{});
    pa[kk][1] = pack2(s[8 * kk + 2], s[8 * kk + 3], T{});
    pa[kk][2] = pack2(s[8 * kk + 4], s[8 * kk + 5], T{});
    pa[kk][3] = pack2(s[8 * kk + 6], s[8 * kk + 7], T{});
  }
}

// O += P V for the V tile at vs (issued, committed, not waited for).
template <typename T, int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const u32 (&pa)[BLOCK_N / 16][4], u32 vs) {
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < BLOCK_N / 16; ++kk) wgmma_rs(o, pa[kk], make_desc(vs + kk * 2048, BLOCK_N * 128, 1024), T{});
  wg_commit();
}

// Softmax of a finished S tile, O rescaled, then O += P V issued (committed, not waited for).
template <typename T, int D, bool CAUSAL>
__device__ __forceinline__ void softmax_pv(float (&s)[BLOCK_N / 2], float (&o)[D / 2], float (&mrow)[2],
                                           float (&lrow)[2], u32 vs, int n0, int trow0, int L, float sc) {
  float corr[2];
  softmax_tile<CAUSAL, D / 2>(s, o, mrow, lrow, corr, n0, trow0, L, sc);
  u32 pa[BLOCK_N / 16][4];
  pack_p<T>(s, pa);
  issue_pv<T, D>(o, pa, vs);
}

template <typename T, int D, bool CAUSAL>
__device__ __forceinline__ void attn_body(const T* __restrict__ q, const T* __restrict__ k,
                                          const T* __restrict__ v, T* __restrict__ out, int L,
                                          unsigned char* smem) {
  constexpr int NS = BLOCK_N / 2;  // S accumulator registers per thread
  constexpr int NO = D / 2;        // O accumulator registers per thread
  constexpr u32 TILE = BLOCK_N * D * 2;
  static_assert((BLOCK_N == 64 || BLOCK_N == 128) && (D == 64 || D == 128), "wgmma shapes instantiated");
  static_assert(!OVERLAP || STAGES == 2, "the overlapped schedule uses two K and two V buffers");
  static_assert(PINGPONG && WG == 2 && STAGES >= 2 && !OVERLAP, "ping-pong: two warpgroups, two or more stages");

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
  const int g = lane / 4, t = lane % 4;
  // Swizzle atoms are 1024 bytes and must start 1024-aligned.
  const u32 raw = smem_u32(smem);
  const u32 q_s = (raw + 1023u) & ~1023u;  // [D/64][BLOCK_M][64]
  const u32 kv_s = q_s + BLOCK_M * D * 2;  // STAGES x {K, V}, each [D/64][BLOCK_N][64]

  int qblk, bh;
  block_coords<CAUSAL>(qblk, bh);
  const int m0 = qblk * BLOCK_M;
  const int trow0 = m0 + warp * 16;  // this warp's first row
  const u32 q_wg = q_s + wg * 64 * 128;
  const i64 base = static_cast<i64>(bh) * L * D;
  const T* qg = q + base;
  const T* kg = k + base;
  const T* vg = v + base;
  const float sc = score_scale<D>();

  const int n_stop = (CAUSAL && CAUSAL_SKIP) ? (L < m0 + BLOCK_M ? L : m0 + BLOCK_M) : L;
  const int n_blocks = (n_stop + BLOCK_N - 1) / BLOCK_N;

  float o[NO];
#pragma unroll
  for (int i = 0; i < NO; ++i) o[i] = 0.f;
  float mrow[2] = {KSA_NEG_INF, KSA_NEG_INF}, lrow[2] = {0.f, 0.f};

  // Ping-pong: the two warpgroups take turns on the tensor cores, so that one's softmax runs
  // while the other's GEMMs execute. Iteration i (0..n) issues S(i) = Q K(i)^T and, deferred by
  // one tile, O += P(i-1) V(i-1): the two GEMMs of a turn are back to back, and the softmax of
  // tile i overlaps this warpgroup's own P V and the other warpgroup's turn. Stage i % STAGES
  // holds what iteration i reads: K(i) and V(i-1).
  //
  // Turns: named barrier 1 + w is "warpgroup w may issue". A warpgroup waits on its own
  // (bar.sync, its 128 threads) and, once its GEMMs are issued, releases the other (bar.arrive,
  // the other 128 threads; 256 complete a barrier). Warpgroup 1 releases warpgroup 0 once up
  // front and not after its last turn, so each barrier sees as many arrivals as syncs, and since
  // a warpgroup cannot arrive twice before the other has synced the order is strictly
  // 0, 1, 0, 1, ... Both warpgroups run the same n + 1 iterations and nothing in them is
  // skipped per warpgroup (see step below), so every thread arrives on and waits at every
  // barrier equally often; a warpgroup that sat a turn out would leave the other one waiting.
  //
  // Stages: full[s] expects THREADS arrivals, one per thread through cp.async.mbarrier.arrive
  // (it fires when the thread's copies have landed), so it completes once per load of stage s.
  // empty[s] expects one arrival per warp (lane 0, after the warp's wgmma.wait_group 0: every
  // GEMM that read the stage is finished), so it completes once per iteration on stage s.
  // Iteration i is the (i / STAGES)-th use of stage i % STAGES, so both barriers are waited on
  // with parity (i / STAGES) & 1. Parity only tells the last two phases apart, which is enough
  // because no barrier can run two phases ahead of a waiter: full[s] is refilled only after
  // empty[s] completed, which needs every warp past its wait on full[s]; and empty[s] completes
  // again only after a refill every thread issues after its own wait on empty[s].
  //
  // Refills: iteration i + STAGES - 1 is loaded into the stage iteration i - 1 used, right after
  // this warpgroup's turn in iteration i, so that the copies fly during the softmax. For
  // warpgroup 1 the wait on empty there costs nothing (warpgroup 0 finished iteration i - 1
  // before it handed over the turn). Warpgroup 0 may wait for warpgroup 1's softmax of tile
  // i - 1, but its own S(i) is queued behind warpgroup 1's GEMMs meanwhile. Waiting any earlier
  // would serialise the warpgroups again; waiting later would leave the copies less time.
  // Q is loaded ahead of stage 0, so full[0]'s first phase covers it too.
  const u32 full_bar = kv_s + STAGES * 2 * TILE;  // 1024-aligned, so 8-aligned
  const u32 empty_bar = full_bar + STAGES * 8;
  if (tid == 0) {
#pragma unroll
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full_bar + st * 8, THREADS);
      mbar_init(empty_bar + st * 8, THREADS / 32);
    }
  }
  __syncthreads();  // the barriers are initialised before anyone arrives on them
  const int n = n_blocks;
  // Every thread copies its share of what iteration it reads (K(it) unless it == n, V(it - 1)
  // unless it == 0) into stage st, then arrives on full[st] once its copies have landed.
  auto load_iter = [&](int it, int st) {
    const u32 dst = kv_s + st * 2 * TILE;
    if (it < n) load_tile_sw<T, D, BLOCK_N>(dst, kg, it * BLOCK_N, L, tid);
    if (it > 0) load_tile_sw<T, D, BLOCK_N>(dst + TILE, vg, (it - 1) * BLOCK_N, L, tid);
    mbar_arrive_cp_async(full_bar + st * 8);
  };
  load_tile_sw<T, D, BLOCK_M>(q_s, qg, m0, L, tid);
#pragma unroll
  for (int st = 0; st < STAGES; ++st)
    if (st <= n) load_iter(st, st);
  if (wg == 1) named_arrive(1);  // warpgroup 0 takes the first turn

  float s[NS];
  u32 pa[BLOCK_N / 16][4];
  float corr[2];
  int st = 0, pst = 0;    // stage of iteration i, and of iteration i - 1
  u32 ph = 0u, pph = 0u;  // their parities
  // One iteration; QK and PV say whether it has S(i) (not the last) and P V(i-1) (not the
  // first). They are compile-time so that the first and last iterations are peeled: ptxas
  // serialises every wgmma of the kernel if whether a group was issued is only known at run
  // time when it is waited for (C7518). For the same reason a warpgroup computes every tile of
  // its block, even one wholly above its rows under causal skipping (masked to zeros).
  auto step = [&](int i, auto qk_flag, auto pv_flag) {
    constexpr bool QK = decltype(qk_flag)::value, PV = decltype(pv_flag)::value;
    mbar_wait(full_bar + st * 8, ph);
    fence_proxy_async();  // the cp.async (generic proxy) writes, before wgmma reads them (async proxy)
    named_sync(1 + wg);
    const u32 ks = kv_s + st * 2 * TILE;
    if constexpr (QK) issue_qk<T, D>(s, q_wg, ks);
    if constexpr (PV) issue_pv<T, D>(o, pa, ks + TILE);
    if (QK || wg == 0) named_arrive(2 - wg);
    if (i >= 1 && i - 1 + STAGES <= n) {
      mbar_wait(empty_bar + pst * 8, pph);
      load_iter(i - 1 + STAGES, pst);
    }
    if constexpr (QK) {
      wg_wait<PV ? 1 : 0>();  // S(i) was committed first: all but the newest group is S
      softmax_tile<CAUSAL, 0>(s, o, mrow, lrow, corr, i * BLOCK_N, trow0, L, sc);  // leaves O alone
      keep_wait_below(lrow[0], lrow[1]);  // lrow sums every P of the tile
    }
    wg_wait<0>();  // P V(i-1) has finished with pa and O
    if constexpr (QK) {
      // O holds the tiles before i, relative to the previous max. Rescaled here and not in the
      // turn: touching O between the two issues also makes ptxas serialise the wgmmas.
      rescale_o<D>(o, corr);
      pack_p<T>(s, pa);
    }
    if (lane == 0) mbar_arrive(empty_bar + st * 8);
    pst = st;
    pph = ph;
    if (++st == STAGES) {
      st = 0;
      ph ^= 1u;
    }
  };
  step(0, flag<true>{}, flag<false>{});
  for (int i = 1; i < n; ++i) step(i, flag<true>{}, flag<true>{});
  step(n, flag<false>{}, flag<true>{});
  cp_async_wait<0>();

  T* og = out + base;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = lrow[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const float inv = 1.f / l;
    const int row = trow0 + g + 8 * h;
    if (row < L) {
      T* orow = og + static_cast<i64>(row) * D + 2 * t;
#pragma unroll
      for (int c = 0; c < NO / 4; ++c)
        *reinterpret_cast<u32*>(orow + 8 * c) = pack2(o[4 * c + 2 * h] * inv, o[4 * c + 2 * h + 1] * inv, T{});
    }
  }
}

}  // namespace ksa
"""

BODY = r"""
// Body of the mx.fast.cuda_kernel, family attention-mlx, knobs algo="wgmma" block_m=128 block_n=128 causal_skip=true cp_async=true exp2=true k_transposed=false overlap=false pingpong=true q_in_regs=false schedule="heavy_first" stages=3 warps=8.
// MLX supplies q, k, v, out, q_shape and the template constants T, HEAD_DIM, CAUSAL; the grid is
// (ceil(L / 128) * 256, H, B) threads in blocks of 256, so blockIdx
// means the same as under the cuda entry point.
extern __shared__ __align__(16) unsigned char ksa_smem[];
::ksa::attn_body<T, HEAD_DIM, CAUSAL>(q, k, v, out, q_shape[2], ksa_smem);
"""

THREADS = 256
BLOCK_M = 128
# Dynamic shared memory of one block, by head dim (the kernel's ksa::smem_bytes<D>()).
SMEM = {
    64: 115760,
    128: 230448,
}
# MLX before 0.32.1 reused the first kernel compiled under a name: the name carries the source.
_TAG = hashlib.sha256((HEADER + BODY).encode()).hexdigest()[:12]


def _build(head_dim):
    return mx.fast.cuda_kernel(
        name=f"ksa_attention_{_TAG}_d{head_dim}",
        input_names=["q", "k", "v"],
        output_names=["out"],
        source=BODY,
        header=HEADER,
        ensure_row_contiguous=True,
        shared_memory=SMEM[head_dim],
    )


_KERNELS = {d: _build(d) for d in SMEM}


def attention(*, q, k, v, B, H, L, D, causal):
    kernel = _KERNELS.get(D)
    if kernel is None:
        raise ValueError(f"head dim {D} is not supported (only {sorted(_KERNELS)})")
    blocks = (L + BLOCK_M - 1) // BLOCK_M
    (out,) = kernel(
        inputs=[q, k, v],
        template=[("T", q.dtype), ("HEAD_DIM", D), ("CAUSAL", bool(causal))],
        grid=(blocks * THREADS, H, B),  # MLX's grid counts threads
        threadgroup=(THREADS, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    return out
