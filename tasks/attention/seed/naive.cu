// Naive attention for the cuda backend: one thread per query row, an online softmax in float32
// over the keys, the row's output accumulated in registers. Correct for f16 and bf16, head dims
// up to 128 and any length; slow (no tiling, no tensor cores): the search starts here.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

template <typename T>
__device__ __forceinline__ float to_f32(T x);
template <>
__device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

template <typename T, int D>
__global__ void naive_attention(const T* __restrict__ q, const T* __restrict__ k,
                                const T* __restrict__ v, T* __restrict__ out, int64_t rows,
                                int64_t L, int causal, float scale) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int64_t i = row % L;
  const int64_t head = row - i;  // first row of this (b, h)
  float qr[D], acc[D];
#pragma unroll
  for (int d = 0; d < D; ++d) {
    qr[d] = to_f32(q[row * D + d]) * scale;
    acc[d] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int64_t end = causal ? i + 1 : L;
  for (int64_t j = 0; j < end; ++j) {
    const T* kr = k + (head + j) * D;
    const T* vr = v + (head + j) * D;
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < D; ++d) s += qr[d] * to_f32(kr[d]);
    const float m_new = fmaxf(m, s);
    const float c = __expf(m - m_new);
    const float p = __expf(s - m_new);
    l = l * c + p;
#pragma unroll
    for (int d = 0; d < D; ++d) acc[d] = acc[d] * c + p * to_f32(vr[d]);
    m = m_new;
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int d = 0; d < D; ++d) out[row * D + d] = from_f32<T>(acc[d] * inv);
}

template <typename T, int D>
static int launch(const void* q, const void* k, const void* v, void* out, int64_t B, int64_t H,
                  int64_t L, int64_t causal, cudaStream_t stream) {
  const int64_t rows = B * H * L;
  const int threads = 128;
  const int64_t blocks = (rows + threads - 1) / threads;
  naive_attention<T, D><<<(unsigned)blocks, threads, 0, stream>>>(
      (const T*)q, (const T*)k, (const T*)v, (T*)out, rows, L, (int)causal,
      1.f / sqrtf((float)D));
  return (int)cudaGetLastError();
}

template <typename T>
static int dispatch(const void* q, const void* k, const void* v, void* out, int64_t B, int64_t H,
                    int64_t L, int64_t D, int64_t causal, void* stream) {
  cudaStream_t s = (cudaStream_t)stream;
  if (B <= 0 || H <= 0 || L <= 0) return (int)cudaErrorInvalidValue;
  switch (D) {
    case 32: return launch<T, 32>(q, k, v, out, B, H, L, causal, s);
    case 64: return launch<T, 64>(q, k, v, out, B, H, L, causal, s);
    case 128: return launch<T, 128>(q, k, v, out, B, H, L, causal, s);
    default: return (int)cudaErrorInvalidValue;
  }
}

extern "C" int attention_f16(const void* q, const void* k, const void* v, void* out, int64_t B,
                             int64_t H, int64_t L, int64_t D, int64_t causal, void* stream) {
  return dispatch<__half>(q, k, v, out, B, H, L, D, causal, stream);
}

extern "C" int attention_bf16(const void* q, const void* k, const void* v, void* out, int64_t B,
                              int64_t H, int64_t L, int64_t D, int64_t causal, void* stream) {
  return dispatch<__nv_bfloat16>(q, k, v, out, B, H, L, D, causal, stream);
}
