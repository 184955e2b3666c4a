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
 *
 * Below the report: what the store benchmarks (bench_cold, bench_posix)
 * share -- tagged shards, a cold page cache, rank processes driven over
 * pipes, and vm.nr_hugepages for one run.
 */
#ifndef SHARDFS_BENCH_UTIL_H
#define SHARDFS_BENCH_UTIL_H

#include "testutil.h"

#include <shardfs/cache.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <sys/wait.h>
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

/* All n bytes to (tx) or from fd, blocking (the raw TCP baselines): 0, or
 * -1 on an error or end of stream. */
static inline int bench_full_io(int fd, void *b, size_t n, bool tx)
{
    uint8_t *p = b;

    while (n) {
        ssize_t r = tx ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);

        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
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

/* ---------------------------------------------------------------------------
 * Store benchmarks (bench_cold, bench_posix).
 */

/* "PROGRAM: what: strerror(err)" and exit 1; err is an errno of either sign. */
static inline __attribute__((noreturn)) void bench_die(const char *what, int err)
{
    fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
            strerror(err < 0 ? -err : err));
    exit(1);
}

/* The first 16 bytes of a shard of block b: a tag naming its key. */
static inline void bench_key_tag(uint8_t *p, uint32_t b, uint32_t s)
{
    uint64_t v[2] = {0x5346534200000000ull | b, 0x5346534300000000ull | s};

    memcpy(p, v, sizeof(v));
}

static inline bool bench_key_ok(const uint8_t *p, uint32_t b, uint32_t s)
{
    uint8_t want[16];

    bench_key_tag(want, b, s);
    return memcmp(p, want, 16) == 0;
}

/* A shard's bytes (tu_store_write's fill): the block's byte, its key's tag
 * in front. */
static inline void bench_fill_tagged(uint64_t block, uint32_t shard, void *buf, size_t len,
                                     void *arg)
{
    (void)arg;
    memset(buf, (int)(block & 0xff), len);
    bench_key_tag(buf, (uint32_t)block, shard);
}

/* A posix store of nblocks blocks of BENCH_SHARDS_PER_BLOCK tagged shards
 * (bench_fill_tagged), and its block files' paths. */
#define BENCH_SHARDS_PER_BLOCK 4u

struct bench_store {
    char dir[512];
    uint64_t shard;
    uint32_t nblocks, nkeys;
    char (*paths)[600]; /* block file paths */
};

/* Write total bytes of shard-byte shards (whole blocks) into dir. */
static inline void bench_store_write(struct bench_store *st, const char *dir, uint64_t shard,
                                     uint64_t total)
{
    int r;

    st->shard = shard;
    st->nblocks = (uint32_t)(total / (BENCH_SHARDS_PER_BLOCK * shard));
    st->nkeys = st->nblocks * BENCH_SHARDS_PER_BLOCK;
    snprintf(st->dir, sizeof(st->dir), "%s", dir);
    st->paths = calloc(st->nblocks, sizeof(*st->paths));
    if (!st->paths)
        bench_die("calloc", ENOMEM);
    r = tu_store_write(st->dir, 0, st->nblocks, BENCH_SHARDS_PER_BLOCK, (uint32_t)shard,
                       bench_fill_tagged, NULL, true);
    if (r < 0)
        bench_die("write store", r);
    for (uint32_t b = 0; b < st->nblocks; b++)
        tu_store_path(st->dir, b, st->paths[b], sizeof(st->paths[b]));
}

/* A cache for a store of nkeys shard-byte keys (the store, the reserved
 * pool, slack), populated, on huge pages where it can be, in small segments
 * (the data plane is the slots rounded up to 64 MiB, not to 1 GiB: a store
 * of 1 GiB + the pool needs ~610 huge pages, not 1024), served at sock. */
static inline struct sfs_cache *bench_served_cache(uint64_t shard, uint32_t nkeys,
                                                   const char *sock)
{
    struct sfs_cache_config cc = {
        .shard_size = shard,
        .nslots = nkeys + nkeys / 8 + 64,
        .hugepages = SFS_HUGEPAGES_AUTO,
        .populate = true,
        .segment_size = 64ull << 20,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cc, &err);

    if (!c)
        bench_die("sfs_cache_create", err);
    err = sfs_cache_serve(c, sock);
    if (err)
        bench_die("sfs_cache_serve", err);
    return c;
}

/* Cold: none of the n files in the page cache (drop_caches where allowed,
 * fadvise on each file, which is enough for O_DIRECT reads, everywhere). */
static inline void bench_drop_page_cache(char (*paths)[600], uint32_t n)
{
    int fd;

    sync();
    fd = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (write(fd, "3", 1) != 1) {
            /* not allowed here (a container): the fadvise below drops the data */
        }
        close(fd);
    }
    for (uint32_t b = 0; b < n; b++) {
        fd = open(paths[b], O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

/* sfs_cache_foreach() callback: remove every key (arg: the cache). */
static inline int bench_drop_key(const struct sfs_key *k, int state, void *arg)
{
    (void)state;
    sfs_cache_remove(arg, k);
    return 0;
}

/* nftw() callback: remove everything (FTW_DEPTH). */
static inline int bench_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}

/* User + system CPU of RUSAGE_SELF or RUSAGE_THREAD. */
static inline int64_t bench_rusage_cpu_ns(int who)
{
    struct rusage ru;

    getrusage(who, &ru);
    return ((int64_t)ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ll +
           ((int64_t)ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ll;
}

/* A child process driven over two pipes: one command byte at a time down
 * cmd, one answer byte up done ('o' once it is ready, then per command). */
struct bench_child {
    pid_t pid;
    int cmd_w, done_r;
};

/* Fork c. True in the child, with its ends in *cmd_r and *done_w (it
 * answers 'o' when ready, runs commands until 'q' and _exits); false in the
 * parent once the child said 'o'. */
static inline bool bench_child_fork(struct bench_child *c, int *cmd_r, int *done_w)
{
    int cmd[2], done[2];
    char o;

    if (pipe2(cmd, O_CLOEXEC) < 0 || pipe2(done, O_CLOEXEC) < 0)
        bench_die("pipe", errno);
    c->pid = fork();
    if (c->pid < 0)
        bench_die("fork", errno);
    if (c->pid == 0) {
        close(cmd[1]);
        close(done[0]);
        *cmd_r = cmd[0];
        *done_w = done[1];
        return true;
    }
    close(cmd[0]);
    close(done[1]);
    c->cmd_w = cmd[1];
    c->done_r = done[0];
    if (read(c->done_r, &o, 1) != 1 || o != 'o')
        bench_die("child start", EIO);
    return false;
}

/* Tell n children to quit ('q') and reap them; one that did not exit 0
 * ends the benchmark. */
static inline void bench_children_stop(int n, struct bench_child *ch)
{
    for (int r = 0; r < n; r++) {
        int stt;

        if (write(ch[r].cmd_w, "q", 1) != 1) {
            /* it is gone already: waitpid reports it */
        }
        close(ch[r].cmd_w);
        close(ch[r].done_r);
        waitpid(ch[r].pid, &stt, 0);
        if (!WIFEXITED(stt) || WEXITSTATUS(stt) != 0) {
            fprintf(stderr, "%s: process %d exited with status %d\n",
                    program_invocation_short_name, r, stt);
            exit(1);
        }
    }
}

/* Send command byte cmd to each of n children. */
static inline void bench_children_send(int n, struct bench_child *ch, char cmd)
{
    for (int r = 0; r < n; r++)
        if (write(ch[r].cmd_w, &cmd, 1) != 1)
            bench_die("child command", errno);
}

/* Wait for child r's answer to the last command; then *rc (its result code
 * in shared memory, written before it answered) must be 0, or the benchmark
 * ends. */
static inline void bench_child_done(struct bench_child *c, int r, const volatile int *rc)
{
    char a;

    if (read(c->done_r, &a, 1) != 1 || *rc != 0) {
        fprintf(stderr, "%s: process %d failed (rc %d)\n", program_invocation_short_name, r,
                *rc);
        exit(1);
    }
}

#if __has_include(<shardfs/rank.h>)
#include <shardfs/rank.h>

/* The configuration of rank r of N on sock over backend spec, host copier;
 * the caller may change more before sfs_rank_open. */
static inline void bench_rank_config(struct sfs_rank_config *cfg, const char *sock, int r, int N,
                                     const char *spec)
{
    sfs_rank_config_init(cfg);
    cfg->socket_path = sock;
    cfg->device_id = r;
    cfg->local_rank_size = N;
    cfg->backend = spec;
    cfg->copier = SFS_COPIER_HOST;
}

/* One entry per key of st, in store order, into dst (st->shard apart). */
static inline void bench_store_entries(const struct bench_store *st, uint8_t *dst,
                                       struct sfs_rank_entry *e)
{
    for (uint32_t i = 0; i < st->nkeys; i++)
        e[i] = (struct sfs_rank_entry){tu_block(i / BENCH_SHARDS_PER_BLOCK),
                                       i % BENCH_SHARDS_PER_BLOCK, dst + (size_t)i * st->shard};
}

/* One timed load of a whole task by a rank process: the first 16 bytes of
 * each of the n destinations (shard bytes apart from dst) are zeroed, the
 * task loaded and waited for (300 s at most), with the wall clock, the
 * process's CPU and the rank's counters before and after. 0, or 5 when the
 * load or its wait failed (then status is not set). */
struct bench_rank_run {
    int64_t t0, t1, cpu_ns;
    struct sfs_rank_stats s0, s1;
};

static inline int bench_rank_load_all(struct sfs_rank *rk, const struct sfs_rank_entry *e,
                                      uint32_t n, uint8_t *dst, size_t shard, int *status,
                                      struct bench_rank_run *o)
{
    struct sfs_task *t;
    int rc = 0;

    for (uint32_t i = 0; i < n; i++)
        memset(dst + (size_t)i * shard, 0, 16);
    sfs_rank_stats(rk, &o->s0);
    int64_t c0 = bench_rusage_cpu_ns(RUSAGE_SELF);
    o->t0 = bench_now_ns();
    if (sfs_rank_load(rk, e, n, &t) != 0 || sfs_rank_wait(t, 300000, status) != 0)
        rc = 5;
    o->t1 = bench_now_ns();
    o->cpu_ns = bench_rusage_cpu_ns(RUSAGE_SELF) - c0;
    if (rc == 0)
        sfs_rank_task_free(t);
    sfs_rank_stats(rk, &o->s1);
    return rc;
}
#endif

/* --hugepages N: vm.nr_hugepages for this run, the old value back at exit,
 * on SIGINT/SIGTERM/SIGHUP too, by the process that reserved (never by a
 * forked child that exits). */
static pid_t bench_hp_owner;
static char bench_hp_old[24]; /* "N\n" to write back; empty: nothing to undo */
static size_t bench_hp_old_len;

static inline long bench_hp_get(void)
{
    long v = -1;
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");

    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = -1;
        fclose(f);
    }
    return v;
}

/* Async-signal-safe: open, write, close. */
static inline bool bench_hp_write(const char *buf, size_t len)
{
    int fd = open("/proc/sys/vm/nr_hugepages", O_WRONLY | O_CLOEXEC);
    bool ok = fd >= 0 && write(fd, buf, len) == (ssize_t)len;

    if (fd >= 0)
        close(fd);
    return ok;
}

static inline void bench_hp_restore(void)
{
    if (bench_hp_old_len && getpid() == bench_hp_owner) {
        bench_hp_write(bench_hp_old, bench_hp_old_len);
        bench_hp_old_len = 0;
    }
}

static inline void bench_hp_signal(int sig)
{
    bench_hp_restore();
    signal(sig, SIG_DFL);
    raise(sig);
}

static inline void bench_hp_reserve(long n)
{
    char buf[24];
    long old = bench_hp_get();
    int len;

    if (old < 0 || old >= n)
        return; /* unreadable, or enough already */
    len = snprintf(buf, sizeof(buf), "%ld\n", n);
    if (!bench_hp_write(buf, (size_t)len)) {
        fprintf(stderr, "%s: --hugepages: cannot write vm.nr_hugepages (%s); running without\n",
                program_invocation_short_name, strerror(errno));
        return;
    }
    bench_hp_owner = getpid();
    bench_hp_old_len = (size_t)snprintf(bench_hp_old, sizeof(bench_hp_old), "%ld\n", old);
    atexit(bench_hp_restore);
    signal(SIGINT, bench_hp_signal);
    signal(SIGTERM, bench_hp_signal);
    signal(SIGHUP, bench_hp_signal);
    fprintf(stderr, "%s: vm.nr_hugepages %ld -> %ld for this run (%ld now)\n",
            program_invocation_short_name, old, n, bench_hp_get());
}

#endif /* SHARDFS_BENCH_UTIL_H */
