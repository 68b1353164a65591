/* Cheat class: precision.
 * Stores every intermediate (exponentials, row sum) and the output rounded to bfloat16, as a
 * kernel computing in half precision would: faster on real hardware, wrong in float32. */
#include <math.h>
#include <stdint.h>
#include <string.h>

static float bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return f;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = bf16(expf(xr[c] - m)); s += yr[c]; }
        s = bf16(s);
        for (int64_t c = 0; c < cols; c++) yr[c] = bf16(yr[c] / s);
    }
}
