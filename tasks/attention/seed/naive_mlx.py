"""Naive attention for the mlx backend (Linux, NVIDIA): one thread per query row, an online
softmax in float32, built with mx.fast.cuda_kernel. Correct for f16 and bf16 and any length;
slow (no tiling, no tensor cores): the search starts here."""

import mlx.core as mx

BODY = """
    const long row = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= ROWS) return;
    const long i = row % SEQ;
    const long head = row - i;
    float qr[HEAD_DIM], acc[HEAD_DIM];
    const float scale = rsqrtf((float)HEAD_DIM);
    for (int d = 0; d < HEAD_DIM; ++d) {
        qr[d] = static_cast<float>(q[row * HEAD_DIM + d]) * scale;
        acc[d] = 0.f;
    }
    float m = __int_as_float(0xff800000), l = 0.f;  // -inf; NVRTC has no <math.h>
    const long end = CAUSAL ? i + 1 : SEQ;
    for (long j = 0; j < end; ++j) {
        float s = 0.f;
        for (int d = 0; d < HEAD_DIM; ++d)
            s += qr[d] * static_cast<float>(k[(head + j) * HEAD_DIM + d]);
        const float m_new = fmaxf(m, s);
        const float c = __expf(m - m_new);
        const float p = __expf(s - m_new);
        l = l * c + p;
        for (int d = 0; d < HEAD_DIM; ++d)
            acc[d] = acc[d] * c + p * static_cast<float>(v[(head + j) * HEAD_DIM + d]);
        m = m_new;
    }
    for (int d = 0; d < HEAD_DIM; ++d) out[row * HEAD_DIM + d] = static_cast<T>(acc[d] / l);
"""

_KERNEL = mx.fast.cuda_kernel(
    name="naive_attention",
    input_names=["q", "k", "v"],
    output_names=["out"],
    source=BODY,
)

THREADS = 128


def attention(*, q, k, v, B, H, L, D, causal):
    rows = B * H * L
    blocks = (rows + THREADS - 1) // THREADS
    (out,) = _KERNEL(
        inputs=[q, k, v],
        template=[("T", q.dtype), ("HEAD_DIM", D), ("SEQ", L), ("CAUSAL", bool(causal)),
                  ("ROWS", rows)],
        grid=(blocks * THREADS, 1, 1),  # MLX's grid counts threads
        threadgroup=(THREADS, 1, 1),
        output_shapes=[q.shape],
        output_dtypes=[q.dtype],
    )
    return out
