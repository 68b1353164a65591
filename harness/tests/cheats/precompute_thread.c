/* Cheat class: lingering_work.
 * From its first call on, a helper thread watches the input buffer (the harness reuses it) and
 * computes the answer as soon as new inputs appear, into a private buffer; the entry point
 * then only copies when the helper was faster. The helper polls without pause, so it keeps a
 * CPU busy after every call returns. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const float* watched;
static int64_t rows_, cols_;
static float *seen, *answer;
static volatile int ready;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

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

static void* helper(void* arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        size_t n = (size_t)(rows_ * cols_);
        if (watched && memcmp(seen, watched, n * sizeof(float)) != 0) {
            memcpy(seen, watched, n * sizeof(float));
            compute(seen, answer, rows_, cols_);
            ready = 1;
        }
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    static pthread_t t;
    size_t n = (size_t)(rows * cols);
    pthread_mutex_lock(&lock);
    if (!seen) pthread_create(&t, NULL, helper, NULL);
    if (x != watched || rows != rows_ || cols != cols_) {
        free(seen); free(answer);
        seen = calloc(n, sizeof(float));
        answer = calloc(n, sizeof(float));
        watched = x; rows_ = rows; cols_ = cols; ready = 0;
    }
    if (ready && memcmp(seen, x, n * sizeof(float)) == 0) memcpy(y, answer, n * sizeof(float));
    else compute(x, y, rows, cols);
    pthread_mutex_unlock(&lock);
}
