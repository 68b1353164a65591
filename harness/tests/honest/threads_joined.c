/* Honest: splits the rows over four pthreads it creates and joins in every call, with a
 * scratch buffer per thread from malloc, freed before return. Nothing runs after the call
 * returns. Must pass. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

struct part { const float* x; float* y; int64_t r0, r1, cols; };

static void* rows(void* arg) {
    struct part* p = arg;
    float* e = malloc((size_t)p->cols * sizeof(float));
    for (int64_t r = p->r0; r < p->r1; r++) {
        const float* xr = p->x + r * p->cols;
        float* yr = p->y + r * p->cols;
        float m = -INFINITY;
        for (int64_t c = 0; c < p->cols; c++) m = fmaxf(m, xr[c]);
        double s = 0.0;
        for (int64_t c = 0; c < p->cols; c++) { e[c] = expf(xr[c] - m); s += e[c]; }
        for (int64_t c = 0; c < p->cols; c++) yr[c] = (float)(e[c] / s);
    }
    free(e);
    return NULL;
}

void softmax_f32(const float* x, float* y, int64_t nrows, int64_t cols) {
    enum { T = 4 };
    pthread_t t[T];
    struct part p[T];
    for (int i = 0; i < T; i++) {
        p[i] = (struct part){x, y, nrows * i / T, nrows * (i + 1) / T, cols};
        pthread_create(&t[i], NULL, rows, &p[i]);
    }
    for (int i = 0; i < T; i++) pthread_join(t[i], NULL);
}
