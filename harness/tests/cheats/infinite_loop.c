/* Cheat class: none (verdict: timeout).
 * Never returns. The harness must not hang: the evaluation ends in a timeout verdict and the
 * whole process group dies. */
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    volatile int spin = 1;
    while (spin) { }
}
