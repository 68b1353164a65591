/* Cheat class: none (sandbox escapes).
 * Computes correctly and, on its first call, tries what a confined process must not manage,
 * printing one line per attempt ("ESCAPE <what> ok" or "ESCAPE <what> denied"): start a child
 * process (which would outlive the call), open an internet socket and a unix socket, read the
 * environment of every other process it can see (looking for secrets), write a file in /tmp,
 * append to the harness's own source (found through PYTHONPATH), reserve 64 GiB of address
 * space, and signal process 1 and its parent. The test reads the lines. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <unistd.h>

#define J(a, b) a##b
int J(fo, rk)(void);

static void report(const char* what, int ok) {
    printf("ESCAPE %s %s\n", what, ok ? "ok" : "denied");
}

static int read_secrets(void) {
    int found = 0;
    DIR* d = opendir("/proc");
    if (!d) return 0;
    struct dirent* e;
    char path[300], buf[65536];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        if (atoi(e->d_name) == getpid()) continue;
        snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
        int fd = open(path, O_RDONLY);
        if (fd < 0) continue;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0) continue;
        for (ssize_t i = 0; i < n; i += strlen(buf + i) + 1) {
            buf[n] = 0;
            if (strstr(buf + i, "SECRET") || strstr(buf + i, "API_KEY")) {
                printf("LEAKED %s\n", buf + i);
                found = 1;
            }
        }
    }
    closedir(d);
    return found;
}

static void attempts(void) {
    pid_t child = J(fo, rk)();
    if (child == 0) { sleep(30); _exit(0); }
    report("fork", child > 0);

    int s = socket(AF_INET, SOCK_STREAM, 0);
    int connected = 0;
    if (s >= 0) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_port = htons(22);
        a.sin_addr.s_addr = htonl(0x7f000001);
        connected = connect(s, (struct sockaddr*)&a, sizeof a) == 0;
        close(s);
    }
    report("inet_socket", s >= 0);
    report("inet_connect", connected);
    int u = socket(AF_UNIX, SOCK_STREAM, 0);
    report("unix_socket", u >= 0);
    if (u >= 0) close(u);

    report("read_environ", read_secrets());

    char tmp[128];
    snprintf(tmp, sizeof tmp, "/tmp/ksearch-escape-%d", (int)getpid());
    int t = open(tmp, O_WRONLY | O_CREAT, 0644);
    report("write_tmp", t >= 0);
    if (t >= 0) { close(t); unlink(tmp); }

    const char* pp = getenv("PYTHONPATH");
    int wrote_harness = 0;
    if (pp) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", pp);
        char* colon = strchr(dir, ':');
        if (colon) *colon = 0;
        char file[4200];
        snprintf(file, sizeof file, "%s/ksearch_harness/core.py", dir);
        int h = open(file, O_WRONLY | O_APPEND);
        wrote_harness = h >= 0;
        if (h >= 0) close(h);  /* opened for writing is enough: nothing is written */
    }
    report("write_harness", wrote_harness);

    void* big = mmap(NULL, (size_t)64 << 30, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    report("reserve_64gib", big != MAP_FAILED);
    if (big != MAP_FAILED) munmap(big, (size_t)64 << 30);

    report("signal_init", kill(1, 0) == 0 && getpid() != 1);
    report("signal_parent", kill(getppid(), 0) == 0 && getppid() != 0);
    fflush(stdout);
}

void softmax_f32(const float* x, float* y, int64_t rows, int64_t cols) {
    static int done;
    if (!done) { done = 1; attempts(); }
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * cols;
        float* yr = y + r * cols;
        float m = xr[0], s = 0.0f;
        for (int64_t c = 1; c < cols; c++) m = fmaxf(m, xr[c]);
        for (int64_t c = 0; c < cols; c++) { yr[c] = expf(xr[c] - m); s += yr[c]; }
        for (int64_t c = 0; c < cols; c++) yr[c] /= s;
    }
}
