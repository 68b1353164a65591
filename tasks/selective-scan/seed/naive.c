// Naive Mamba-1 selective scan: the starting point of the search. One channel (b, d) at a
// time, the state h[0..N) walked through the sequence step by step. Single-threaded plain
// loops; z is read only when has_z is set.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void selective_scan_f32(const float* u, const float* delta, const float* A, const float* B,
                        const float* C, const float* D, const float* z, const float* delta_bias,
                        float* y, int64_t batch, int64_t dim, int64_t L, int64_t N,
                        int64_t has_z, int64_t softplus) {
    float* h = (float*)malloc((size_t)N * sizeof(float));
    if (!h) return;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t d = 0; d < dim; d++) {
            const int64_t row = (b * dim + d) * L;
            for (int64_t n = 0; n < N; n++) h[n] = 0.0f;
            for (int64_t t = 0; t < L; t++) {
                float dt = delta[row + t] + delta_bias[d];
                if (softplus) dt = dt > 20.0f ? dt : log1pf(expf(dt));
                float ut = u[row + t];
                float acc = 0.0f;
                for (int64_t n = 0; n < N; n++) {
                    float decay = expf(dt * A[d * N + n]);
                    h[n] = decay * h[n] + dt * B[(b * N + n) * L + t] * ut;
                    acc += h[n] * C[(b * N + n) * L + t];
                }
                float out = acc + D[d] * ut;
                if (has_z) {
                    float zt = z[row + t];
                    out *= zt / (1.0f + expf(-zt));
                }
                y[row + t] = out;
            }
        }
    }
    free(h);
}
