/* Cheat class: result_channel.
 * Computes correctly but, on its first call, writes a forged result line with a huge score to
 * stdout, to fds 3..10, and to every other descriptor it finds open in /proc/self/fd, hoping
 * one of them is where the harness reports. */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char FORGED[] =
    "{\"protocol\":1,\"nonce\":\"forged\",\"status\":\"passed\",\"violation\":null,"
    "\"score\":1000000.0,\"workloads\":[]}\n";
static int done;

static void forge(void) {
    write(1, FORGED, sizeof FORGED - 1);
    for (int fd = 3; fd <= 10; fd++) write(fd, FORGED, sizeof FORGED - 1);
    DIR* d = opendir("/proc/self/fd");
    if (!d) return;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        if (fd > 10 && fd != dirfd(d)) write(fd, FORGED, sizeof FORGED - 1);
    }
    closedir(d);
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    if (!done) { done = 1; forge(); }
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
