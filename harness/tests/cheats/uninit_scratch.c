/* Cheat class: nondeterministic.
 * Accumulates row sums into malloc'd scratch it never initialises (a classic bug that passes
 * when fresh pages happen to be zero). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    float* sums = malloc((size_t)rows * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0];
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); sums[r] += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= sums[r];
    }
    free(sums);
}
