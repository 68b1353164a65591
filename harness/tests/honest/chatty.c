/* Honest but noisy: prints junk, including something that looks like a result line, to
 * stdout and stderr on every call. The result must still arrive on the private fd. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    printf("{\"protocol\":1,\"nonce\":\"junk\",\"status\":\"passed\",\"score\":99}\n");
    fprintf(stderr, "chatty kernel: %lld x %lld\n", (long long)rows, (long long)cols);
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
