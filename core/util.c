/* SPDX-License-Identifier: MIT */
/*
 * util.c - small things every part of the core uses: the log callback,
 * clocks, hex ids, robust mutexes, and the pid liveness test that survives
 * pid reuse (pid + start time, as LMDB does). The futex calls are futex.c's.
 */
#include "cache_i.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include "layout_i.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static sfs_log_fn *log_fn;
static void *log_arg;
static int log_max = LOG_INFO;

void sfs_set_log(sfs_log_fn *fn, void *arg, int max_level)
{
    log_fn = fn;
    log_arg = arg;
    log_max = max_level;
}

void sfs_log(int level, const char *fmt, ...)
{
    char buf[512];
    va_list ap;

    if (!log_fn || level > log_max)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    log_fn(level, buf, log_arg);
}

int64_t sfs_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t sfs_deadline_after(int64_t ns)
{
    return sfs_now_ns() + ns;
}

void sfs_block_to_hex(const struct sfs_block_id *id, char out[SFS_BLOCK_HEX_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";

    for (int i = 0; i < SFS_BLOCK_ID_LEN; i++) {
        out[2 * i] = hex[id->b[i] >> 4];
        out[2 * i + 1] = hex[id->b[i] & 15];
    }
    out[SFS_BLOCK_HEX_LEN] = '\0';
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

int sfs_block_from_hex(const char *hex, size_t len, struct sfs_block_id *id)
{
    if (!hex || len != SFS_BLOCK_HEX_LEN)
        return -EINVAL;
    for (int i = 0; i < SFS_BLOCK_ID_LEN; i++) {
        int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);

        if (hi < 0 || lo < 0)
            return -EINVAL;
        id->b[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

const char *sfs_state_name(int state)
{
    switch (state) {
    case SFS_STATE_FREE:
        return "absent";
    case SFS_STATE_IDLE:
        return "idle";
    case SFS_STATE_LOADING:
        return "loading";
    case SFS_STATE_READY:
        return "ready";
    case SFS_STATE_FAILED:
        return "failed";
    default:
        return "absent";
    }
}

/*
 * Fields of /proc/pid/stat: state (field 3), num_threads (20), start time
 * (22). comm may contain spaces and parentheses: fields start after the last
 * ')'.
 */
static int proc_stat(int pid, char *state, long *nthreads, uint64_t *start)
{
    char path[64], buf[1024];
    ssize_t n;
    int fd;
    char *p;

    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -EIO;
    buf[n] = '\0';
    p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return -EIO;
    *state = p[2];
    p++;
    /* After ")": field 3 (state) is the first. */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (!p)
            return -EIO;
        if (field == 19)
            *nthreads = strtol(p + 1, NULL, 10);
    }
    *start = strtoull(p + 1, NULL, 10);
    return 0;
}

int sfs_proc_start_time(int pid, uint64_t *out)
{
    char state;
    long nthreads;

    return proc_stat(pid, &state, &nthreads, out);
}

/*
 * A zombie is dead for us: the kernel released its robust mutexes and its
 * mappings before it became one, and its parent may be slow to reap it (or be
 * a rank blocked on a key the dead one owned). A thread-group leader that
 * exited while other threads run also shows 'Z', but with num_threads > 1.
 */
bool sfs_pid_alive(int pid, uint64_t start_time)
{
    uint64_t st;
    long nthreads = 0;
    char state;

    if (pid <= 0)
        return false;
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return false;
    if (proc_stat(pid, &state, &nthreads, &st) < 0)
        return false; /* gone between the two checks (or a zombie reaped) */
    if (state == 'X' || (state == 'Z' && nthreads <= 1))
        return false;
    return st == start_time;
}

int sfs_robust_mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t a;
    int r;

    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    r = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    return -r;
}

/* True when pid is gone or a zombie (no start-time check: for the short
 * windows in which a record names a claimer or reaper). */
bool sfs_pid_gone(int pid)
{
    uint64_t st;
    long nthreads = 0;
    char state;

    if (pid <= 0)
        return false;
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return true;
    if (proc_stat(pid, &state, &nthreads, &st) < 0)
        return true;
    return state == 'X' || (state == 'Z' && nthreads <= 1);
}
