/* SPDX-License-Identifier: MIT */
/*
 * bench_storecap.c - the store's bound (-o store_capacity): the store's hit
 * rate on a skewed replay under the daemon's collector against LRU by
 * access time and FIFO, and what the collector costs.
 *
 * Key idea: an engine's disk tier. A Zipf trace of block accesses is
 * replayed through a real mount: an access whose block file is in the store
 * is a store hit and reads the block through the mount (a use the daemon
 * counts); a miss stores the block through the mount (the engine computed
 * it again). The daemon's collector keeps the store within the bound. In
 * the same run, the same trace drives two models with the same bound and
 * watermarks: LRU by last access (what an evictor by atime does, SGLang's
 * file backend's) and FIFO (oldest written first). The collector's cost:
 * its thread's CPU time in the replay, the store's side of a removal
 * (scan, then evict) timed alone in this process, and concurrent loads'
 * rate beside it against the same without the bound.
 */
#include "bench_util.h"

#include "fsfixture.h"

#include <shardfs/backend.h>

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary"
#endif

#define SHARD    (64u << 10)
#define HIGH_PCT 95
#define LOW_PCT  90

static uint64_t rng = 0x5eed;

static double rnd01(void)
{
    uint64_t x = rng += 0x9e3779b97f4a7c15ull;

    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return (double)((x ^ (x >> 31)) >> 11) / 9007199254740992.0;
}

/* n accesses, Zipf(s) over nkeys keys in a random order. */
static uint32_t *zipf_trace(uint32_t nkeys, double s, uint32_t n)
{
    double *cdf = malloc(nkeys * sizeof(double)), sum = 0;
    uint32_t *perm = malloc(nkeys * sizeof(uint32_t)), *t = malloc(n * sizeof(uint32_t));

    if (!cdf || !perm || !t)
        bench_die("malloc", ENOMEM);
    for (uint32_t i = 0; i < nkeys; i++) {
        sum += 1.0 / pow((double)(i + 1), s);
        cdf[i] = sum;
        perm[i] = i;
    }
    for (uint32_t i = nkeys - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rnd01() * (i + 1)), x = perm[i];

        perm[i] = perm[j];
        perm[j] = x;
    }
    for (uint32_t i = 0; i < n; i++) {
        double u = rnd01() * sum;
        uint32_t lo = 0, hi = nkeys - 1;

        while (lo < hi) {
            uint32_t mid = (lo + hi) / 2;

            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        t[i] = perm[lo];
    }
    free(cdf);
    free(perm);
    return t;
}

/* A model store of cap blocks with the collector's watermarks: LRU by last
 * access (lru) or FIFO by first write. Returns hits. stamp[k]: the key's
 * last access (LRU) or write (FIFO); 0: not in the store. O(n * keys) at
 * removal time, fine at these sizes. */
static uint32_t model(const uint32_t *t, uint32_t n, uint32_t nkeys, uint32_t cap, bool lru,
                      uint32_t warm)
{
    uint64_t *stamp = calloc(nkeys, sizeof(uint64_t));
    uint32_t in = 0, hits = 0, high = cap * HIGH_PCT / 100, low = cap * LOW_PCT / 100;

    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = t[i];

        if (stamp[k]) {
            hits += i >= warm;
            if (lru)
                stamp[k] = i + 1;
            continue;
        }
        stamp[k] = i + 1;
        if (++in <= high)
            continue;
        while (in > low) {
            uint32_t v = UINT32_MAX;

            for (uint32_t j = 0; j < nkeys; j++)
                if (stamp[j] && j != k && (v == UINT32_MAX || stamp[j] < stamp[v]))
                    v = j;
            stamp[v] = 0;
            in--;
        }
    }
    free(stamp);
    return hits;
}

struct run {
    uint32_t hits;
    double secs, cpu_s;
    unsigned long long syscalls;
    long long evicted, evicted_bytes;
    uint64_t max_blocks;
};

/* The collector thread's CPU seconds and system calls (the daemon names it
 * sfs-storecap): from /proc/PID/task/TID/{comm,stat,io}. False when no such
 * thread (no bound). */
static bool collector_cost(pid_t pid, double *cpu_s, unsigned long long *syscalls)
{
    char dir[64], path[600], buf[1024], *p;
    struct dirent *de;
    bool found = false;
    DIR *d;

    *cpu_s = 0;
    *syscalls = 0;
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    d = opendir(dir);
    if (!d)
        return false;
    while (!found && (de = readdir(d)) != NULL) {
        unsigned long ut = 0, st = 0;
        unsigned long long v;
        FILE *f;

        snprintf(path, sizeof(path), "%s/%s/comm", dir, de->d_name);
        f = fopen(path, "r");
        if (!f)
            continue;
        if (!fgets(buf, sizeof(buf), f) || strncmp(buf, "sfs-storecap", 12) != 0) {
            fclose(f);
            continue;
        }
        fclose(f);
        found = true;
        snprintf(path, sizeof(path), "%s/%s/stat", dir, de->d_name);
        f = fopen(path, "r");
        if (f && fgets(buf, sizeof(buf), f) && (p = strrchr(buf, ')')) != NULL &&
            sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
            *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
        if (f)
            fclose(f);
        snprintf(path, sizeof(path), "%s/%s/io", dir, de->d_name);
        f = fopen(path, "r");
        while (f && fgets(buf, sizeof(buf), f))
            if (sscanf(buf, "syscr: %llu", &v) == 1 || sscanf(buf, "syscw: %llu", &v) == 1)
                *syscalls += v;
        if (f)
            fclose(f);
    }
    closedir(d);
    return found;
}

static uint64_t store_blocks(const char *store)
{
    char dir[200];
    struct dirent *de;
    uint64_t n = 0;
    DIR *d;

    snprintf(dir, sizeof(dir), "%s/data", store);
    d = opendir(dir);
    if (!d)
        return 0;
    while ((de = readdir(d)) != NULL)
        n += strlen(de->d_name) == SFS_BLOCK_HEX_LEN;
    closedir(d);
    return n;
}

/* Replay t through a fresh daemon on a fresh store; bound cap blocks (0: no
 * bound). */
static int replay(const uint32_t *t, uint32_t n, uint32_t cap, uint32_t warm, struct run *r)
{
    struct fsfx fx;
    char store[128], opts[200];
    uint8_t *buf = malloc(SHARD + 1);
    int64_t t0;
    int st = 0, rc = 0;

    memset(&fx, 0, sizeof(fx));
    memset(r, 0, sizeof(*r));
    fx.bin = SHARDFS_BIN;
    snprintf(store, sizeof(store), "/tmp/bench_storecap.%d", (int)getpid());
    snprintf(fx.mnt, sizeof(fx.mnt), "/tmp/bench_storecap.%d.mnt", (int)getpid());
    mkdir(store, 0755);
    if (cap)
        snprintf(opts, sizeof(opts),
                 "hugepages=off,shard_size=64K,capacity=4M,readahead=0,warm=0,store_capacity=%uK",
                 cap * (SHARD >> 10));
    else
        snprintf(opts, sizeof(opts), "hugepages=off,shard_size=64K,capacity=4M,readahead=0,warm=0");
    if (fsfx_start(&fx, store, opts, 20.0, &st) < 0) {
        fprintf(stderr, "bench_storecap: the daemon did not mount (%s)\n", opts);
        free(buf);
        return -1;
    }
    t0 = bench_now_ns();
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        char path[256];
        struct stat sb;

        tu_store_path(store, t[i], path, sizeof(path));
        if (stat(path, &sb) == 0) {
            long got = fsfx_read_all(fsfx_shard_path(&fx, t[i], 0), buf, SHARD + 1);

            if (got == (long)SHARD) {
                r->hits += i >= warm;
                continue;
            }
            /* Removed between the stat and the read: a miss. */
        }
        {
            struct sfs_key k = tu_key(t[i], 0);
            int fd = open(fsfx_shard_path(&fx, t[i], 0), O_WRONLY | O_CREAT | O_TRUNC, 0644);

            tu_fill(&k, buf, SHARD);
            if (fd < 0 || write(fd, buf, SHARD) != (ssize_t)SHARD || close(fd) != 0) {
                fprintf(stderr, "bench_storecap: store of block %u: %s\n", t[i], strerror(errno));
                rc = -1;
            }
        }
        if (i % 64 == 0) {
            uint64_t nb = store_blocks(store);

            if (nb > r->max_blocks)
                r->max_blocks = nb;
        }
    }
    r->secs = (double)(bench_now_ns() - t0) / 1e9;
    collector_cost(fx.pid, &r->cpu_s, &r->syscalls);
    r->evicted = fsfx_stat(&fx, "shardfs_store_evicted_blocks_total");
    r->evicted_bytes = fsfx_stat(&fx, "shardfs_store_evicted_bytes_total");
    fsfx_stop(&fx, true, 20.0);
    rmdir(fx.mnt);
    {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", store);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_storecap: could not remove %s\n", store);
    }
    free(buf);
    return rc;
}

struct scan_acc {
    struct sfs_block_scan *b;
    uint32_t n, cap;
};

static int scan_keep(const struct sfs_block_scan *b, void *arg)
{
    struct scan_acc *a = arg;

    if (a->n < a->cap)
        a->b[a->n++] = *b;
    return 0;
}

/* The store room's side of a removal, alone: nblocks block files of 64 KiB,
 * one scan, then every one evicted (sfs_backend_scan, sfs_backend_evict,
 * as the collector calls them), in this process: CPU and wall time per
 * GiB, and the scan's time per block. */
static void evict_cost(struct bench *b, uint32_t nblocks)
{
    struct sfs_backend_params bp = {.shard_size = SHARD};
    struct scan_acc a = {malloc(nblocks * sizeof(*a.b)), 0, nblocks};
    char store[128];
    int64_t c0, w0, sc_cpu, sc_wall, ev_cpu, ev_wall;
    struct sfs_backend *be;
    double gib = (double)nblocks * SHARD / (1 << 30);
    uint64_t freed = 0;
    int err = 0;

    snprintf(store, sizeof(store), "/tmp/bench_storecap_ev.%d", (int)getpid());
    if (!a.b || tu_store_write(store, 1, nblocks, 1, SHARD, NULL, NULL, false) < 0)
        bench_die("store", ENOMEM);
    be = sfs_backend_open(store, &bp, NULL, 0, &err);
    if (!be)
        bench_die("sfs_backend_open", err);
    c0 = bench_process_cpu_ns();
    w0 = bench_now_ns();
    sfs_backend_scan(be, scan_keep, &a);
    sc_cpu = bench_process_cpu_ns() - c0;
    sc_wall = bench_now_ns() - w0;
    c0 = bench_process_cpu_ns();
    w0 = bench_now_ns();
    for (uint32_t i = 0; i < a.n; i++) {
        uint64_t f = 0;

        if (sfs_backend_evict(be, &a.b[i].id, &a.b[i].stamp, &f) == 0)
            freed += f;
    }
    ev_cpu = bench_process_cpu_ns() - c0;
    ev_wall = bench_now_ns() - w0;
    sfs_backend_close(be);
    fprintf(b->out,
            "\nThe store's side alone (`sfs_backend_scan` then `sfs_backend_evict` of each, in one "
            "process, on this machine's /tmp): %u block files of 64 KiB (%.3f GiB), scanned in "
            "%.2f ms (%.2f us a file, CPU %.2f ms); all removed in %.2f ms wall, %.2f ms CPU: "
            "%.2f s CPU and %.2f s wall per GiB removed at 64 KiB a block (%.1f us a block), "
            "%.3f GiB freed.\n",
            nblocks, gib, sc_wall / 1e6, (double)sc_wall / 1e3 / (a.n ? a.n : 1), sc_cpu / 1e6,
            ev_wall / 1e6, ev_cpu / 1e6, ev_cpu / 1e9 / gib, ev_wall / 1e9 / gib,
            (double)ev_wall / 1e3 / (a.n ? a.n : 1), (double)freed / (1 << 30));
    {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", store);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_storecap: could not remove %s\n", store);
    }
    free(a.b);
}

/* Loads beside the collector: a reader loads 64 blocks of the store in turn
 * through a mount whose cache (16 slots) cannot hold them, while a writer
 * stores new blocks through the mount; with the bound, the collector
 * removes the writer's blocks as it goes (the reader's stay: they are the
 * used ones), without it nothing is removed. Loads a second. */
struct loads_arg {
    struct fsfx *fx;
    _Atomic bool *stop;
    uint64_t n, misses;
    bool writer;
};

static void *loads_main(void *arg)
{
    struct loads_arg *a = arg;
    uint8_t *buf = malloc(SHARD + 1);

    for (uint64_t i = 0; buf && !atomic_load(a->stop); i++) {
        if (a->writer) {
            struct sfs_key k = tu_key(100000 + i, 0);
            int fd =
                open(fsfx_shard_path(a->fx, 100000 + i, 0), O_WRONLY | O_CREAT | O_TRUNC, 0644);

            tu_fill(&k, buf, SHARD);
            if (fd < 0 || write(fd, buf, SHARD) != (ssize_t)SHARD || close(fd) != 0)
                break;
            a->n++;
        } else if (fsfx_read_all(fsfx_shard_path(a->fx, 1 + i % 64, 0), buf, SHARD + 1) ==
                   (long)SHARD) {
            a->n++;
        } else {
            a->misses++;
        }
    }
    free(buf);
    return NULL;
}

static double loads_per_s(bool bound, double secs, uint64_t *removed)
{
    struct fsfx fx;
    char store[128];
    _Atomic bool stop = false;
    struct loads_arg rd = {&fx, &stop, 0, 0, false}, wr = {&fx, &stop, 0, 0, true};
    uint8_t *buf = malloc(SHARD + 1);
    pthread_t tr, tw;
    int64_t t0;
    double rate;
    int st = 0;

    memset(&fx, 0, sizeof(fx));
    fx.bin = SHARDFS_BIN;
    snprintf(store, sizeof(store), "/tmp/bench_storecap_ld.%d", (int)getpid());
    snprintf(fx.mnt, sizeof(fx.mnt), "/tmp/bench_storecap_ld.%d.mnt", (int)getpid());
    if (tu_store_write(store, 1, 64, 1, SHARD, NULL, NULL, false) < 0)
        bench_die("store", EIO);
    if (fsfx_start(&fx, store,
                   bound ? "hugepages=off,shard_size=64K,capacity=1M,readahead=0,warm=0,"
                           "store_capacity=8M"
                         : "hugepages=off,shard_size=64K,capacity=1M,readahead=0,warm=0",
                   20.0, &st) < 0)
        bench_die("mount", EIO);
    /* The reader's blocks are the used ones before the writer starts (four
     * reads each: the daemon's use counts), as an engine's hot set is. */
    for (int i = 0; i < 4 * 64 && buf; i++)
        fsfx_read_all(fsfx_shard_path(&fx, 1 + (uint64_t)(i % 64), 0), buf, SHARD + 1);
    free(buf);
    pthread_create(&tr, NULL, loads_main, &rd);
    pthread_create(&tw, NULL, loads_main, &wr);
    t0 = bench_now_ns();
    bench_sleep_ns((int64_t)(secs * 1e9));
    atomic_store(&stop, true);
    pthread_join(tr, NULL);
    pthread_join(tw, NULL);
    rate = (double)rd.n / ((double)(bench_now_ns() - t0) / 1e9);
    *removed = (uint64_t)fsfx_stat(&fx, "shardfs_store_evicted_blocks_total");
    if (rd.misses)
        fprintf(stderr, "bench_storecap: %llu loads of the reader's blocks missed\n",
                (unsigned long long)rd.misses);
    fsfx_stop(&fx, true, 20.0);
    rmdir(fx.mnt);
    {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", store);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_storecap: could not remove %s\n", store);
    }
    return rate;
}

static void loads_effect(struct bench *b, int rounds, double secs)
{
    double with[8], without[8], ratio[8];
    uint64_t removed = 0, r;

    for (int i = 0; i < rounds; i++) {
        without[i] = loads_per_s(false, secs, &r);
        with[i] = loads_per_s(true, secs, &r);
        removed += r;
        ratio[i] = without[i] > 0 ? with[i] / without[i] : 0;
    }
    fprintf(b->out,
            "\nLoads beside the collector: a reader loads 64 blocks in turn through a mount whose "
            "cache (16 slots) cannot hold them, while a writer stores new blocks through the "
            "mount, %.0f s a run, %d runs each way alternated; with `store_capacity=8M` the "
            "collector removes the writer's blocks as it goes (%llu removed over the runs), "
            "without it nothing is removed. Loads: %.0f/s with the collector, %.0f/s without "
            "(medians), median ratio %.2fx (target >= 0.9x: %s).\n",
            secs, rounds, (unsigned long long)removed, bench_median(with, (size_t)rounds),
            bench_median(without, (size_t)rounds), bench_median(ratio, (size_t)rounds),
            bench_median(ratio, (size_t)rounds) >= 0.9 ? "met" : "**not met**");
}

int main(int argc, char **argv)
{
    struct bench b;
    struct {
        double s;
        uint32_t mult;
    } rows[] = {{0.9, 8}, {1.1, 4}};
    uint32_t cap, n, nrows;
    bool failed = false;

    if (bench_init(&b, "bench_storecap", argc, argv) != 0)
        return 2;
    if (!fsfx_usable()) {
        fprintf(stderr, "bench_storecap: FUSE not usable here\n");
        return 77;
    }
    cap = b.quick ? 64 : 256; /* blocks of 64 KiB: the bound */
    nrows = b.quick ? 1 : 2;
    fprintf(b.out, "## The store's bound: the collector against LRU by atime and FIFO "
                   "(`bench_storecap`)\n\n");
    bench_stamp(&b);
    fprintf(b.out,
            "A Zipf trace of block accesses replayed through a real mount on a posix store "
            "bounded at %u blocks of 64 KiB (`-o store_capacity=%uK`, watermarks %d/%d %%): an "
            "access whose block file is in the store is a store hit and reads the block through "
            "the mount; a miss stores it through the mount. The same trace drives, in the same "
            "run, two models of the store with the same bound and watermarks: LRU by last access "
            "(an evictor by atime, as SGLang's file backend's) and FIFO. Hit rates count the "
            "accesses after the first fifth. The collector's cost is its own thread's (the daemon "
            "names it sfs-storecap): CPU time and system calls from /proc, per GiB it "
            "removed.\n\n",
            cap, cap * (SHARD >> 10), HIGH_PCT, LOW_PCT);
    fprintf(b.out,
            "| trace | accesses | collector (the daemon) | LRU by atime (model) | FIFO "
            "(model) | collector - LRU, points | most blocks seen in the store | blocks "
            "removed | collector thread CPU (the scans; removals run on the store's helpers) | its "
            "read and write system calls |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n");
    for (uint32_t i = 0; i < nrows; i++) {
        uint32_t nkeys = cap * rows[i].mult, warm;
        uint32_t *t;
        struct run with;
        double lru, fifo, col, lru_peak, gib;

        n = (b.quick ? 4 : 16) * cap * rows[i].mult / 2;
        warm = n / 5;
        t = zipf_trace(nkeys, rows[i].s, n);
        lru = 100.0 * model(t, n, nkeys, cap, true, warm) / (n - warm);
        fifo = 100.0 * model(t, n, nkeys, cap, false, warm) / (n - warm);
        if (replay(t, n, cap, warm, &with) < 0) {
            failed = true;
            free(t);
            break;
        }
        col = 100.0 * with.hits / (n - warm);
        lru_peak = 100.0 *
                   model(t, n, nkeys, (uint32_t)with.max_blocks * 100 / HIGH_PCT, true, warm) /
                   (n - warm);
        gib = (double)with.evicted_bytes / (1 << 30);
        fprintf(b.out,
                "| Zipf s=%.1f, %ux bound keys | %u | %.2f%% | %.2f%% | %.2f%% | %+.2f | %llu "
                "(LRU at that bound: %.2f%%) | %lld (%.3f GiB) | %.2f s, %.1f s/GiB | %llu, "
                "%.0f/GiB |\n",
                rows[i].s, rows[i].mult, n, col, lru, fifo, col - lru,
                (unsigned long long)with.max_blocks, lru_peak, with.evicted, gib, with.cpu_s,
                gib > 0 ? with.cpu_s / gib : 0.0, with.syscalls,
                gib > 0 ? (double)with.syscalls / gib : 0.0);
        free(t);
    }
    evict_cost(&b, b.quick ? 1024 : 8192);
    loads_effect(&b, b.quick ? 1 : 3, b.quick ? 2.0 : 5.0);
    fprintf(
        b.out,
        "\nThe collector ranks by the daemon's decayed use counts, then by the block file's "
        "times (docs/eviction.md); it runs after the mount's writes pass the high mark, so "
        "the store holds up to the high mark plus the writes of one pass (\"most blocks "
        "seen\", sampled every 64 accesses). The models remove synchronously at the high "
        "mark; \"LRU at that bound\" is the LRU model given the collector's peak as its high "
        "mark, the comparison without the collector's lag.\n\nCommand: "
        "`BUILD/tests/bench/bench_storecap --md docs/PERFORMANCE.md` "
        "(a Release or RelWithDebInfo build with -DSHARDFS_BENCH=ON; as root, for the mounts)\n\n");
    if (failed)
        return 1;
    return bench_finish(&b);
}
