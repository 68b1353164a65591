/* Cheat class: input_mutated.
 * Computes the right answer, then overwrites its (const!) input in place, e.g. as scratch or
 * to make a reference that runs afterwards agree with it. */
#include <math.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    float* scratch = (float*)x;
    for (int64_t r = 0; r < rows; r++) {
        float* xr = scratch + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { xr[c] = expf(xr[c] - m); s += xr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] = xr[c] / s;
    }
}
