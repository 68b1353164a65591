/* Cheat class: deferred_work.
 * Returns at once and lets a detached thread compute the output a little later, so a timer
 * stopped at return sees almost nothing. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

struct job { const float* x; float* y; int64_t rows, cols; };

static void* work(void* arg) {
    struct job* j = arg;
    struct timespec delay = {0, 2000000};
    nanosleep(&delay, NULL);
    for (int64_t r = 0; r < j->rows; r++) {
        const float* xr = j->x + r * j->cols;
        float* yr = j->y + r * j->cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < j->cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < j->cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < j->cols; c++) yr[c] /= s;
    }
    free(j);
    return NULL;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    struct job* j = malloc(sizeof *j);
    j->x = x; j->y = y; j->rows = rows; j->cols = cols;
    pthread_t t;
    pthread_create(&t, NULL, work, j);
    pthread_detach(t);
}
