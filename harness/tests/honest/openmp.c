/* Honest: the three-pass row softmax with its rows split over an OpenMP team. Must pass, and
 * its team (idle or spinning between calls) must not slow the judge's baseline. */
#include <math.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0];
        for (int64_t c = 1; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        float inv = 1.0f / s;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
