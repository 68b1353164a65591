/* Cheat class: forbidden_call.
 * Defines clock_gettime so that, were the symbol to win the lookup, the harness clock would
 * stand still and every call would look instantaneous. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <time.h>

int clock_gettime(clockid_t clk, struct timespec* ts) {
    (void)clk;
    ts->tv_sec = 0;
    ts->tv_nsec = 1;
    return 0;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
