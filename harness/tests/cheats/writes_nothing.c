/* Cheat class: output_not_written.
 * Returns without touching the output, hoping the buffer still holds an earlier answer. */
#include <stdint.h>

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    (void)x; (void)y; (void)rows; (void)cols;
}
