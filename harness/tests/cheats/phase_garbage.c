/* Cheat class: phase_dependent.
 * Counts its calls: correct for the first 20 (more than the 18 correctness calls of the test
 * request: 3 workloads x (2 trials x 2 calls + 2 near-duplicates)), garbage once timing has
 * begun, when it believes nobody checks. */
#include <math.h>
#include <stdint.h>

static int64_t calls;

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    if (++calls > 20) {
        for (int64_t i = 0; i < rows * cols; i++) y[i] = 1.0f / (float)cols;
        return;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
