/* Cheat class: stale_output.
 * Caches the answer keyed on a hash of the shape and the first four input values, which is
 * cheap and survives input copies and fresh buffers. An input set that differs elsewhere gets
 * the cached answer. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t key = 0;
static float* cached;

static uint64_t hash(const float* x, int64_t rows, int64_t cols) {
    uint64_t h = 1469598103934665603ull ^ (uint64_t)rows ^ ((uint64_t)cols << 32);
    for (int i = 0; i < 4; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], 4);
        h = (h ^ bits) * 1099511628211ull;
    }
    return h | 1;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    size_t n = (size_t)(rows * cols);
    uint64_t h = hash(x, rows, cols);
    if (h == key) {
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
    key = h;
}
