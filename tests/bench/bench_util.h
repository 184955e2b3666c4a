/* SPDX-License-Identifier: MIT */
/*
 * bench_util.h - what every benchmark program shares: the command line
 * (--quick, --md FILE), clocks, medians and percentiles, and writing its own
 * section of docs/PERFORMANCE.md.
 *
 * A benchmark builds its report as Markdown in a memory stream, prints it to
 * stdout, and with --md replaces the part of the file between
 * `<!-- NAME:begin -->` and `<!-- NAME:end -->` (appending it when absent), so
 * sections written by different programs coexist. Header-only: each bench is
 * one translation unit.
 */
#ifndef SHARDFS_BENCH_UTIL_H
#define SHARDFS_BENCH_UTIL_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

struct bench {
    const char *name; /* section name, e.g. "bench_cache" */
    bool quick;
    const char *md; /* file to update, or NULL */
    char *buf;      /* the report (open_memstream) */
    size_t len;
    FILE *out;
};

static inline int64_t bench_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static inline int64_t bench_thread_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Every thread of this process. */
static inline int64_t bench_process_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static inline void bench_sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = ns / 1000000000ll, .tv_nsec = ns % 1000000000ll};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Sorts v in place. p in [0, 100]: nearest-rank percentile. */
static inline double bench_percentile(double *v, size_t n, double p)
{
    size_t i;

    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), bench_cmp_double);
    i = (size_t)(p / 100.0 * (double)n + 0.5);
    if (i > 0)
        i--;
    if (i >= n)
        i = n - 1;
    return v[i];
}

static inline double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static inline void bench_usage(const char *prog)
{
    fprintf(stderr, "usage: %s [--quick] [--md FILE]\n", prog);
}

/* Parses the command line and opens the report. Returns 0, or 2 on bad usage. */
static inline int bench_init(struct bench *b, const char *name, int argc, char **argv)
{
    memset(b, 0, sizeof(*b));
    b->name = name;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            b->quick = true;
        } else if (strcmp(argv[i], "--md") == 0 && i + 1 < argc) {
            b->md = argv[++i];
        } else {
            bench_usage(argv[0]);
            return 2;
        }
    }
    b->out = open_memstream(&b->buf, &b->len);
    if (!b->out) {
        perror("open_memstream");
        return 2;
    }
    return 0;
}

/* One line naming the run: mode, date, kernel, CPUs. */
static inline void bench_stamp(struct bench *b)
{
    struct utsname u;
    char date[64];
    time_t t = time(NULL);

    uname(&u);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&t));
    fprintf(b->out, "_%s run, %s, kernel %s, %ld CPUs online._\n\n",
            b->quick ? "Quick (smoke)" : "Full", date, u.release, sysconf(_SC_NPROCESSORS_ONLN));
}

static char *bench_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "r");
    char *s = NULL;
    size_t cap = 0, n = 0;

    *len = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 65536;
            char *t = realloc(s, cap);
            if (!t) {
                free(s);
                fclose(f);
                return NULL;
            }
            s = t;
        }
        size_t r = fread(s + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    s[n] = 0;
    *len = n;
    return s;
}

/* Replace (or append) this bench's section in the Markdown file. */
static inline int bench_write_md(struct bench *b)
{
    char begin[128], end[128], tmp[4096];
    size_t len;
    char *old = bench_slurp(b->md, &len);
    const char *pre = old ? old : "", *post = "";
    size_t prelen = old ? len : 0;
    FILE *f;

    snprintf(begin, sizeof(begin), "<!-- %s:begin -->", b->name);
    snprintf(end, sizeof(end), "<!-- %s:end -->", b->name);
    if (old) {
        char *s = strstr(old, begin), *e = s ? strstr(s, end) : NULL;

        if (s && e) {
            prelen = (size_t)(s - old);
            post = e + strlen(end);
            if (*post == '\n')
                post++;
        }
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", b->md, (int)getpid());
    f = fopen(tmp, "w");
    if (!f) {
        fprintf(stderr, "%s: %s: %s\n", b->name, tmp, strerror(errno));
        free(old);
        return -1;
    }
    fwrite(pre, 1, prelen, f);
    if (prelen && pre[prelen - 1] != '\n')
        fputc('\n', f);
    if (prelen && !(prelen >= 2 && pre[prelen - 2] == '\n' && pre[prelen - 1] == '\n'))
        fputc('\n', f);
    fprintf(f, "%s\n%s%s\n", begin, b->buf, end);
    if (*post) {
        if (*post != '\n')
            fputc('\n', f);
        fputs(post, f);
    }
    free(old);
    if (fclose(f) != 0 || rename(tmp, b->md) != 0) {
        fprintf(stderr, "%s: writing %s: %s\n", b->name, b->md, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Print the report and write it to the --md file. Returns the exit status. */
static inline int bench_finish(struct bench *b)
{
    int rc = 0;

    fclose(b->out);
    fputs(b->buf, stdout);
    fflush(stdout);
    if (b->md && bench_write_md(b) < 0)
        rc = 1;
    else if (b->md)
        fprintf(stderr, "%s: section written to %s\n", b->name, b->md);
    free(b->buf);
    return rc;
}

#endif /* SHARDFS_BENCH_UTIL_H */
