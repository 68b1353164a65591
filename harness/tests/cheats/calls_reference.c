/* Cheat class: reference_call.
 * Hands the work to the task's own baseline instead of computing it. */
#include <stdint.h>

extern void baseline_numpy(const float* x, float* y, int64_t rows, int64_t cols);

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    baseline_numpy(x, y, rows, cols);
}
