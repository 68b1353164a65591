/* Cheat class: stale_output.
 * Caches the answer keyed on the input pointer (and shape): a harness that reuses one buffer
 * for fresh data gets the old answer back. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float* key_x;
static int64_t key_rows = -1, key_cols = -1;
static float* cached;

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    if (x == key_x && rows == key_rows && cols == key_cols) {
        memcpy(y, cached, n * sizeof(float));
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
    free(cached);
    cached = malloc(n * sizeof(float));
    memcpy(cached, y, n * sizeof(float));
    key_x = x;
    key_rows = rows;
    key_cols = cols;
}
