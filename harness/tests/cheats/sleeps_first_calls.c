/* Cheat class: deferred_work (with phase detection).
 * Always computes on a background thread. During the first 20 calls (the correctness phase of
 * the test request has 18) it sleeps until the thread is done, so every check after return
 * sees finished outputs; afterwards it returns at once and the timer sees almost nothing. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

struct job { const float* x; float* y; int64_t rows, cols; volatile int done; };
static int64_t calls;

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
    __atomic_store_n(&j->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    struct job* j = malloc(sizeof *j);  /* leaked on purpose: the thread may outlive the call */
    j->x = x; j->y = y; j->rows = rows; j->cols = cols; j->done = 0;
    pthread_t t;
    pthread_create(&t, NULL, work, j);
    pthread_detach(t);
    if (++calls <= 20) {
        struct timespec nap = {0, 1000000};
        while (!__atomic_load_n(&j->done, __ATOMIC_ACQUIRE)) nanosleep(&nap, NULL);
    }
}
