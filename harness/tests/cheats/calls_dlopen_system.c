/* Cheat class: forbidden_call.
 * Loads another library at run time and shells out: both reach code outside the candidate. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*softmax_fn)(const float*, float*, int64_t, int64_t);

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    void* lib = dlopen("libfastsoftmax.so", RTLD_NOW);
    if (!lib) { system("true"); return; }
    ((softmax_fn)dlsym(lib, "softmax"))(x, y, rows, cols);
}
