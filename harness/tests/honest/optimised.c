/* Honest: OpenMP over rows, vectorisable inner loops, per-thread scratch freed before return.
 * A comment that talks about the reference implementation or baseline_numpy, or says
 * "system(" and dlopen, must not trip the static checks. Must pass. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char* NOTE = "uses no reference, no dlopen, no system()";

void softmax_f32(const float* restrict x, float* restrict y, int64_t rows, int64_t cols) {
    (void)NOTE;
    #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float* e = malloc((size_t)cols * sizeof(float));
        float m = -INFINITY;
        for (int64_t c = 0; c < cols; c++) m = fmaxf(m, xr[c]);
        double s = 0.0;
        for (int64_t c = 0; c < cols; c++) { e[c] = expf(xr[c] - m); s += e[c]; }
        const float inv = (float)(1.0 / s);
        for (int64_t c = 0; c < cols; c++) yr[c] = e[c] * inv;
        free(e);
    }
}
