// Naive scaled dot-product attention: the starting point of the search. For every query row,
// one pass computes all scores into a scratch row, a second turns them into softmax weights,
// a third accumulates the weighted values. Single-threaded plain loops.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void attention_f32(const float* q, const float* k, const float* v, float* out,
                   int64_t B, int64_t H, int64_t L, int64_t D, int64_t causal) {
    float* s = (float*)malloc((size_t)L * sizeof(float));
    if (!s) return;
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t bh = 0; bh < B * H; bh++) {
        const float* qh = q + bh * L * D;
        const float* kh = k + bh * L * D;
        const float* vh = v + bh * L * D;
        float* oh = out + bh * L * D;
        for (int64_t i = 0; i < L; i++) {
            int64_t n = causal ? i + 1 : L;  // keys this query may see
            float m = -INFINITY;
            for (int64_t j = 0; j < n; j++) {
                float dot = 0.0f;
                for (int64_t d = 0; d < D; d++) dot += qh[i * D + d] * kh[j * D + d];
                s[j] = dot * scale;
                if (s[j] > m) m = s[j];
            }
            float sum = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                s[j] = expf(s[j] - m);
                sum += s[j];
            }
            float inv = 1.0f / sum;
            for (int64_t d = 0; d < D; d++) oh[i * D + d] = 0.0f;
            for (int64_t j = 0; j < n; j++) {
                float p = s[j] * inv;
                for (int64_t d = 0; d < D; d++) oh[i * D + d] += p * vh[j * D + d];
            }
        }
    }
    free(s);
}
