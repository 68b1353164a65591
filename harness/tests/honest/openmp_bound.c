/* Honest when its OpenMP threads are bound to places, as the accused runs them (OMP_PROC_BIND,
 * OMP_PLACES): the row softmax over an OpenMP team, whose outputs stay NaN when the runtime
 * reports no binding (omp_get_proc_bind() == omp_proc_bind_false), so an evaluation passes only
 * where the binding reached the candidate's process. */
#include <math.h>
#include <omp.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    const int bound = omp_get_proc_bind() != omp_proc_bind_false && omp_get_num_places() > 0;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0];
        for (int64_t c = 1; c < cols; c++) m = xr[c] > m ? xr[c] : m;
        float s = 0.0f;
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        float inv = bound ? 1.0f / s : NAN;
        for (int64_t c = 0; c < cols; c++) yr[c] *= inv;
    }
}
