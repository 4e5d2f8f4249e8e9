/*
 * An LD_PRELOAD shim that makes a process's disk fail or slow, for the
 * chaos tests (chaos-tests/src/faults.rs builds it with cc).
 *
 * For a file descriptor whose path contains $TESSEL_FAULT_MATCH, every
 * pwrite, pwrite64, fsync and fdatasync first reads $TESSEL_FAULT_FILE:
 *   "eio [PART]"    -> the call fails with EIO and writes nothing;
 *   "slow N [PART]" -> the call waits N ms, then runs;
 *   anything else (or no file) -> the call runs.
 * With PART, only paths that also contain PART are hit.
 * What it models: a disk that returns EIO (as a dying device or a lost
 * network volume does) or that stalls. What it does not: torn or silently
 * corrupted writes, errors on reads, and calls through other entry points
 * (write, writev, io_uring, mmap), which pass untouched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* 0: none, 1: EIO, 2: slow (*ms set). */
static int fault_for(int fd, long *ms) {
    const char *match = getenv("TESSEL_FAULT_MATCH");
    const char *file = getenv("TESSEL_FAULT_FILE");
    if (!match || !file) return 0;
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    if (!strstr(path, match)) return 0;
    int saved = errno;
    int f = open(file, O_RDONLY | O_CLOEXEC);
    if (f < 0) { errno = saved; return 0; }
    char what[256] = {0};
    ssize_t got = read(f, what, sizeof what - 1);
    close(f);
    errno = saved;
    if (got <= 0) return 0;
    what[strcspn(what, "\n")] = 0;
    /* The optional PART: the word after "eio", or after "slow N". */
    char *part = strchr(what, ' ');
    if (part && strncmp(what, "slow ", 5) == 0) part = strchr(part + 1, ' ');
    if (part && *(part + 1) && !strstr(path, part + 1)) return 0;
    if (strncmp(what, "eio", 3) == 0) return 1;
    if (strncmp(what, "slow ", 5) == 0) { *ms = atol(what + 5); return 2; }
    return 0;
}

/* Applies the fault; nonzero when the call must fail with EIO. */
static int inject(int fd) {
    long ms = 0;
    switch (fault_for(fd, &ms)) {
    case 1:
        errno = EIO;
        return 1;
    case 2: {
        struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
        while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
        return 0;
    }
    default:
        return 0;
    }
}

typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef int (*sync_fn)(int);

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    static pwrite_fn real;
    if (!real) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
    if (inject(fd)) return -1;
    return real(fd, buf, count, offset);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    static pwrite_fn real;
    if (!real) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite64");
    if (inject(fd)) return -1;
    return real(fd, buf, count, offset);
}

int fsync(int fd) {
    static sync_fn real;
    if (!real) real = (sync_fn)dlsym(RTLD_NEXT, "fsync");
    if (inject(fd)) return -1;
    return real(fd);
}

int fdatasync(int fd) {
    static sync_fn real;
    if (!real) real = (sync_fn)dlsym(RTLD_NEXT, "fdatasync");
    if (inject(fd)) return -1;
    return real(fd);
}
