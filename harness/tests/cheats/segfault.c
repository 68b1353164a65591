/* Cheat class: none (verdict: runtime_error).
 * Crashes with SIGSEGV on the first call; the harness must report it and the next evaluation
 * must be unaffected. */
#include <stdint.h>

float* volatile nowhere = 0;

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
    *nowhere = 1.0f;
}
