/* Cheat class: stale_output.
 * Keeps the previous call's answer in a static buffer and returns it whenever the shape
 * repeats (computing the new answer into the buffer for next time): a benchmark that calls
 * twice on the same data sees correct outputs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static float* last;
static int64_t last_rows = -1, last_cols = -1;

static void compute(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    if (rows == last_rows && cols == last_cols) {
        memcpy(y, last, n * sizeof(float));
        compute(x, last, rows, cols);
        return;
    }
    free(last);
    last = malloc(n * sizeof(float));
    compute(x, y, rows, cols);
    memcpy(last, y, n * sizeof(float));
    last_rows = rows;
    last_cols = cols;
}
