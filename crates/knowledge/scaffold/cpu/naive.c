// The seed: the plainest correct kernel, where the search starts. Written by `ksearch new-task`
// for a row-wise RMS normalisation; replace it with a plain kernel of your operation.
#include <math.h>
#include <stdint.h>

void @ENTRY@(const float* x, const float* w, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        // Accumulate in double: the sum of squares of a long row in float drifts.
        double ss = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            ss += (double)xr[c] * (double)xr[c];
        }
        float inv = (float)(1.0 / sqrt(ss / (double)cols + 1e-6));
        for (int64_t c = 0; c < cols; c++) {
            yr[c] = xr[c] * inv * w[c];
        }
    }
}
