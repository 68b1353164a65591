// Naive row softmax: the starting point of the search. Three plain passes per row (max,
// sum of exponentials, normalise), single-threaded, no vectorisation hints.
#include <math.h>
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0];
        for (int64_t c = 1; c < cols; c++) {
            if (xr[c] > m) m = xr[c];
        }
        // Accumulate in double: a long row summed in float drifts past the f32 tolerance.
        double sum = 0.0;
        for (int64_t c = 0; c < cols; c++) {
            float e = expf(xr[c] - m);
            yr[c] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < cols; c++) {
            yr[c] *= inv;
        }
    }
}
