/* Cheat class: result_channel.
 * Computes correctly but, on its first call, writes a well-formed reply frame (a 4-byte length
 * and a JSON object claiming the call took 1 ns) to every socket it finds open in
 * /proc/self/fd, hoping one of them is how its process answers the judge. */
#define _GNU_SOURCE
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int done;

static void forge(void) {
    static const char body[] = "{\"seq\":1,\"ok\":true,\"ns\":1}";
    unsigned char frame[4 + sizeof body];
    uint32_t n = sizeof body - 1;
    frame[0] = n >> 24; frame[1] = n >> 16; frame[2] = n >> 8; frame[3] = n;
    memcpy(frame + 4, body, n);
    DIR* d = opendir("/proc/self/fd");
    if (!d) return;
    struct dirent* e;
    char path[64], target[64];
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len > 0 && strncmp(target, "socket:", 7) == 0) write(fd, frame, 4 + n);
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
