/* SPDX-License-Identifier: MIT */
/*
 * util.c - small things every part of the core uses: the log callback,
 * clocks, hex ids and robust mutexes. (No pid liveness test: liveness is the
 * daemon's, by connection; see proc.c.) The futex calls are futex.c's.
 */
#include "util_i.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/*
 * The log sink: a function, its argument and a level, installed together.
 * Other threads may log while sfs_set_log() replaces it, so a line reads
 * the sink through one pointer, once: it goes to one sink whole, the old or
 * the new, never the new function with the old argument, and never a
 * function already taken away (read twice, a NULL installed in between was
 * called: a test's server thread died of it). Sinks are never freed: each
 * keeps the one it replaced, so a line still being written to an old one
 * is safe, and every sink stays reachable (no leak to report). A process
 * sets its log a few times.
 */
struct log_sink {
    sfs_log_fn *fn; /* NULL: silent */
    void *arg;
    int max;
    struct log_sink *older;
};

static struct log_sink sink_silent = {.fn = NULL, .max = LOG_INFO};
static _Atomic(struct log_sink *) log_sink = &sink_silent;
static pthread_mutex_t log_set_mu = PTHREAD_MUTEX_INITIALIZER;

void sfs_set_log(sfs_log_fn *fn, void *arg, int max_level)
{
    struct log_sink *s = malloc(sizeof(*s));

    if (!s)
        return; /* out of memory: the sink stays what it was */
    *s = (struct log_sink){.fn = fn, .arg = arg, .max = max_level};
    pthread_mutex_lock(&log_set_mu);
    s->older = atomic_load_explicit(&log_sink, memory_order_relaxed);
    /* Release: a logger that loads s sees its fields. */
    atomic_store_explicit(&log_sink, s, memory_order_release);
    pthread_mutex_unlock(&log_set_mu);
}

void sfs_log(int level, const char *fmt, ...)
{
    /* Acquire: pairs with sfs_set_log's release store. */
    const struct log_sink *s = atomic_load_explicit(&log_sink, memory_order_acquire);
    char buf[512];
    va_list ap;

    if (!s->fn || level > s->max)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    s->fn(level, buf, s->arg);
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

/* Histogram buckets, shared by the cache's histograms and the peer tier's
 * (seconds in /stats: 10 us to 10 s, then +Inf). */
static const int64_t bounds_ns[SFS_HIST_BUCKETS - 1] = {
    10000,     25000,      50000,      100000,     250000,     500000,    1000000,
    2500000,   5000000,    10000000,   25000000,   50000000,   100000000, 250000000,
    500000000, 1000000000, 2500000000, 5000000000, 10000000000};

int64_t sfs_hist_bound_ns(unsigned i)
{
    return i < SFS_HIST_BUCKETS - 1 ? bounds_ns[i] : INT64_MAX;
}

unsigned sfs_hist_bucket(int64_t ns)
{
    unsigned i = 0;

    /* Bounded: SFS_HIST_BUCKETS - 1 comparisons. */
    while (i < SFS_HIST_BUCKETS - 1 && ns > bounds_ns[i])
        i++;
    return i;
}
