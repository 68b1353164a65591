// Naive batched GQA decode over a paged KV cache (page size 1), for the task that
// `ksearch import flashinfer` writes from definitions/gqa_paged/gqa_paged_decode_h32_kv4_d128_ps1.json
// (pass this file as --seed). One block per (request, query head), one thread per head-dim
// element: each token's logit is a shared-memory tree sum, and an online softmax in float32
// accumulates the output in a register per thread. Correct for any batch and lengths; slow
// (one token at a time, a block barrier per step, no reuse of K/V across the query heads that
// share them): the search starts here.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

constexpr int kHeadDim = 128;

__global__ void gqa_decode_naive(const __nv_bfloat16* __restrict__ q,
                                 const __nv_bfloat16* __restrict__ k_cache,
                                 const __nv_bfloat16* __restrict__ v_cache,
                                 const int32_t* __restrict__ kv_indptr,
                                 const int32_t* __restrict__ kv_indices,
                                 const float* __restrict__ sm_scale,
                                 __nv_bfloat16* __restrict__ output, float* __restrict__ lse,
                                 int num_qo_heads, int num_kv_heads) {
  __shared__ float partial[kHeadDim];
  const int b = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const int kv_head = h / (num_qo_heads / num_kv_heads);
  const int64_t row = (int64_t)b * num_qo_heads + h;
  const float qd = __bfloat162float(q[row * kHeadDim + d]);
  const float scale = *sm_scale;
  const int start = kv_indptr[b], end = kv_indptr[b + 1];
  float m = -INFINITY, l = 0.f, acc = 0.f;
  for (int i = start; i < end; ++i) {
    const int64_t at = ((int64_t)kv_indices[i] * num_kv_heads + kv_head) * kHeadDim + d;
    partial[d] = qd * __bfloat162float(k_cache[at]);
    __syncthreads();
    for (int s = kHeadDim / 2; s > 0; s >>= 1) {
      if (d < s) partial[d] += partial[d + s];
      __syncthreads();
    }
    const float logit = partial[0] * scale;
    __syncthreads();  // partial[0] is read by every thread before the next token overwrites it
    const float m_new = fmaxf(m, logit);
    const float c = expf(m - m_new);  // 0 on the first token (m = -inf)
    const float p = expf(logit - m_new);
    acc = acc * c + p * __bfloat162float(v_cache[at]);
    l = l * c + p;
    m = m_new;
  }
  output[row * kHeadDim + d] = __float2bfloat16_rn(l > 0.f ? acc / l : 0.f);
  if (d == 0) lse[row] = l > 0.f ? (m + logf(l)) * 1.4426950408889634f : -INFINITY;
}

extern "C" int gqa_paged_decode_h32_kv4_d128_ps1(
    const void* q, const void* k_cache, const void* v_cache, const void* kv_indptr,
    const void* kv_indices, const void* sm_scale, void* output, void* lse, int64_t batch_size,
    int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, int64_t num_pages,
    int64_t page_size, int64_t len_indptr, int64_t num_kv_indices, void* stream) {
  (void)num_pages;
  (void)len_indptr;
  (void)num_kv_indices;
  if (head_dim != kHeadDim || page_size != 1 || num_kv_heads <= 0 ||
      num_qo_heads % num_kv_heads != 0 || batch_size <= 0)
    return (int)cudaErrorInvalidValue;
  const dim3 grid((unsigned)batch_size, (unsigned)num_qo_heads);
  gqa_decode_naive<<<grid, kHeadDim, 0, (cudaStream_t)stream>>>(
      (const __nv_bfloat16*)q, (const __nv_bfloat16*)k_cache, (const __nv_bfloat16*)v_cache,
      (const int32_t*)kv_indptr, (const int32_t*)kv_indices, (const float*)sm_scale,
      (__nv_bfloat16*)output, (float*)lse, (int)num_qo_heads, (int)num_kv_heads);
  return (int)cudaGetLastError();
}
