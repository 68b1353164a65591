/* Cheat class: lingering_work.
 * Starts two threads on its first call that spin for ever, so that whatever the harness times
 * next on this machine (the baseline, another candidate) runs slower. Computes correctly. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>

static volatile uint64_t sink;

static void* spin(void* arg) {
    (void)arg;
    for (;;) sink++;
    return NULL;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    static int started;
    if (!started) {
        started = 1;
        pthread_t t;
        for (int i = 0; i < 2; i++) pthread_create(&t, NULL, spin, NULL);
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
