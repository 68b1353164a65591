/* Cheat class: shape_specialisation.
 * Correct only for the shapes it was shown (8x64 and 13x200 in the test request); anything
 * else gets a uniform distribution. */
#include <math.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    int shown = (rows == 8 && cols == 64) || (rows == 13 && cols == 200);
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        if (!shown) {
            for (int64_t c = 0; c < cols; c++) yr[c] = 1.0f / (float)cols;
            continue;
        }
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
