/* SPDX-License-Identifier: MIT */
/*
 * bench_rank.c - libshardfs-rank against its baselines, in the same run.
 *
 *   bench_rank [--quick] [--ranks 1,2,4,8] [--shards M] [--latency-us L]
 *              [--depth D] [--shard-size BYTES[,BYTES..]] [--reps R] [--out FILE]
 *   bench_rank --small [--quick]
 *   bench_rank --gpu [--quick] [--copier auto|host|cuda] [--out FILE]
 *
 * Default mode, three tables:
 *  1. TP scaling, once per TP shard size (default 16 KiB and 64 KiB; one
 *     --shard-size sets every table's size, a list only the TP sizes):
 *     N rank processes load the same task of M shards through a
 *     fault backend with a fixed latency L and per-rank depth D, RearrangeIndex
 *     order against natural order. Wall time (first start to last finish),
 *     speedup of rotated over natural, scaling over one rank, the backend
 *     concurrency reached (M * L / wall: the mean number of loads in flight;
 *     and the sum of per-rank peaks), and the owner share per rank (min..max
 *     of owner loads, against M/N).
 *  2. Hit path: one rank loads a resident task into host buffers, against a
 *     plain memcpy of the same bytes into the same buffers.
 *  2b. Small tasks (--small runs only this one, to stdout): p50/p99 round
 *     trip (sfs_rank_load + sfs_rank_wait) of a resident task of 1 x 16 KiB
 *     and of 64 x 16 KiB into host buffers -- the inline path, where the
 *     submitting thread copies -- against the core API doing the same
 *     (Get + memcpy + Release per key) and against the pipeline (a rank
 *     opened with the baseline switch SHARDFS_RANK_NO_INLINE), interleaved
 *     in one run; every byte of each path's last task checked.
 * --gpu mode (needs a CUDA device to mean anything; with --copier host it
 * runs the same code on the host copier):
 *  3. Load GB/s of resident tasks of 16 KiB .. 4 MiB shards into device
 *     memory against one big pinned cudaMemcpy; dump likewise; latency of a
 *     resident task of 64 x 16 KiB, p50/p99; every byte of a load checked.
 *  4. Rank attach: sfs_rank_open on a populated 4 GiB data plane (map,
 *     fault in, register) against cudaHostRegister alone, ms per GiB.
 *
 * It links libshardfs-rank-bench (tests/bench/CMakeLists.txt): the product
 * library's sources and compiler flags (no test hooks, no debug checks)
 * plus the baseline switches, environment variables read at
 * sfs_rank_open that only the baseline columns set (BUILD_NOTE, printed
 * with every run).
 *
 * Each figure is the median of --reps runs after a warm-up. Tables go to
 * stdout and, with --out FILE (or --md FILE), replace this program's section
 * of FILE (docs/PERFORMANCE.md): between <!-- bench_rank:begin --> and
 * <!-- bench_rank:end --> (--gpu: bench_rank_gpu), as bench_util.h does for
 * every bench, so the file stays one document.
 */
#include "bench_util.h"
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/cache.h>
#include <shardfs/fault.h>
#include <shardfs/rank.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXR 16

static struct {
    bool quick, gpu, small_only;
    int ranks[MAXR], nranks;
    uint32_t M;
    unsigned lat_us, depth;
    uint32_t shard;            /* the hit path's, and the TP run's at hand */
    uint32_t tp_shard[4], ntp; /* the TP table's shard sizes */
    int reps;
    const char *out;
    int copier;
} O = {
    .ranks = {1, 2, 4, 8},
    .nranks = 4,
    .M = 256,
    .lat_us = 2000,
    .depth = 4,
    .shard = 64 * 1024,
    /* 16 KiB, the smallest shard the GPU targets name, keeps the host copier's
     * memcpy (every rank copies the whole task) from taking the CPUs the
     * ranks' loads need on a small host; 64 KiB shows that cost. */
    .tp_shard = {16 * 1024, 64 * 1024},
    .ntp = 2,
    .reps = 3,
    .copier = SFS_COPIER_AUTO,
};

static FILE *outf;

/* What every figure runs on, said in the output. */
#define BUILD_NOTE                                                                                 \
    "Every figure is of libshardfs-rank-bench: the installed library's sources and compiler "      \
    "flags (no test hooks, no debug checks) plus the benchmarks' baseline switches, environment "  \
    "variables that only the baseline columns set (SHARDFS_RANK_BLOCKING_WAITS, "                  \
    "SHARDFS_RANK_NO_INLINE).\n"

static void __attribute__((format(printf, 1, 2))) emit(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (outf) {
        va_start(ap, fmt);
        vfprintf(outf, fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
}

static void die(const char *what, int err)
{
    fprintf(stderr, "bench_rank: %s: %s\n", what, strerror(err < 0 ? -err : err));
    exit(1);
}

/* Every entry of a task went well: a failed one would be skipped, not
 * copied, and flatter the figure. */
static void check_status(const int *st, uint32_t n, const char *what)
{
    for (uint32_t i = 0; i < n; i++)
        if (st[i]) {
            fprintf(stderr, "bench_rank: %s: entry %u of %u: %s\n", what, i, n, strerror(-st[i]));
            exit(1);
        }
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n ? v[n / 2] : 0;
}

/* Every shard's bytes: one pattern (the benchmark checks status, not bytes). */
static void fill_5a(uint64_t block, uint32_t shard, void *buf, size_t len, void *arg)
{
    memset(buf, 0x5a, len);
}

static void write_store(const char *dir, uint32_t nblocks, uint32_t shard)
{
    int r = tu_store_write(dir, 0, nblocks, 1, shard, fill_5a, NULL, false);

    if (r < 0)
        die("write store", -r);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    return remove(p);
}

static int drop_key(const struct sfs_key *k, int state, void *arg)
{
    sfs_cache_remove(arg, k);
    return 0;
}

static struct sfs_cache *make_cache(uint64_t shard, uint32_t nslots, const char *sock)
{
    /* Sized for the run's keys: no reserved pool (it would leave fewer
     * slots than keys, and a resident task would not be), and leases for a
     * whole task held at once. */
    struct sfs_cache_config cfg = {
        .shard_size = shard,
        .nslots = nslots,
        .no_reserved = true,
        .max_leases = nslots > 16384 ? nslots : 0,
        .hugepages = SFS_HUGEPAGES_AUTO,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    if (!c)
        die("sfs_cache_create", err);
    err = sfs_cache_serve(c, sock);
    if (err)
        die("sfs_cache_serve", err);
    return c;
}

/* Make keys 0..n-1 resident, key i all bytes (i & 0xff), and point entry i
 * at dst + i * shard. `slot` (optional) gets each key's data-plane address:
 * valid while nothing evicts. */
static void fill_resident(struct sfs_cache *c, uint32_t n, uint64_t shard, uint8_t *dst,
                          struct sfs_rank_entry *e, uint8_t **slot)
{
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = {.block = tu_block(i), .shard = 0};
        struct sfs_lease l;

        if (sfs_cache_get(c, &k, 0, 0, &l) == SFS_OWNER) {
            memset(sfs_cache_data(c, &l), (int)i, shard);
            sfs_cache_publish(c, &l, (uint32_t)shard, 0);
        }
        if (slot)
            slot[i] = sfs_cache_data(c, &l);
        sfs_cache_release(c, &l);
        e[i] = (struct sfs_rank_entry){k.block, 0, dst + (size_t)i * shard};
    }
}

/* A rank of device 0 on the cache at `sock`, without idle-window prealloc
 * (the benches time tasks, not guesses). */
static struct sfs_rank *bench_rank_open(const char *sock, int copier)
{
    struct sfs_rank_config cfg;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = sock;
    cfg.device_id = 0;
    cfg.copier = copier;
    cfg.prealloc = false;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);

    if (!rk)
        die("sfs_rank_open", err);
    return rk;
}

/* ---------------------------------------------------------------------------
 * 1. TP scaling.
 */

struct bres {
    int rc;
    int64_t t0, t1;
    int64_t cpu_ns; /* every thread of the rank's process, t0..t1 */
    uint64_t owner, max_inflight, waits, failed;
};

struct bshared {
    _Atomic int arrived;
    _Atomic int go;
    struct bres r[MAXR];
};

struct bjob {
    const char *sock;
    char spec[512];
    int dev, N;
    bool rotate, blocking;
    struct bshared *sh;
};

static int tp_child(struct bjob *j)
{
    struct bres *res = &j->sh->r[j->dev];
    struct sfs_rank_config cfg;
    struct sfs_rank_entry *e = calloc(O.M, sizeof(*e));
    uint8_t *bufs = malloc((size_t)O.M * O.shard);
    int *st = calloc(O.M, sizeof(*st));
    struct sfs_rank_stats s;
    struct sfs_task *t;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = j->sock;
    cfg.device_id = j->dev;
    cfg.local_rank_size = j->N;
    cfg.backend = j->spec;
    cfg.load_depth = O.depth;
    cfg.rotate = j->rotate;
    /* The old blocking LoadQueue: a baseline switch of
     * libshardfs-rank-bench, read at open (each rank is a process of its
     * own). */
    if (j->blocking)
        setenv("SHARDFS_RANK_BLOCKING_WAITS", "1", 1);
    else
        unsetenv("SHARDFS_RANK_BLOCKING_WAITS");
    cfg.copier = SFS_COPIER_HOST;
    cfg.prealloc = false;
    struct sfs_rank *rk = sfs_rank_open(&cfg, &err);
    if (!rk || !e || !bufs || !st)
        return 2;
    memset(bufs, 0, (size_t)O.M * O.shard); /* first touch outside the timing */
    for (uint32_t i = 0; i < O.M; i++)
        e[i] = (struct sfs_rank_entry){tu_block(i), 0, bufs + (size_t)i * O.shard};
    atomic_fetch_add(&j->sh->arrived, 1);
    while (!atomic_load(&j->sh->go))
        ; /* the start gun: spin briefly so every rank leaves at once */
    res->t0 = sfs_now_ns();
    res->cpu_ns = -bench_process_cpu_ns();
    if (sfs_rank_load(rk, e, O.M, &t) != 0 || sfs_rank_wait(t, 120000, st) != 0)
        return 3;
    res->t1 = sfs_now_ns();
    res->cpu_ns += bench_process_cpu_ns();
    sfs_rank_task_free(t);
    sfs_rank_stats(rk, &s);
    res->owner = s.owner_loads;
    res->max_inflight = s.max_inflight;
    res->waits = s.waits;
    res->failed = s.failed;
    sfs_rank_close(rk);
    return s.failed ? 4 : 0;
}

struct tp_result {
    double wall_ms, conc_mean, conc_peak;
    double cpus; /* CPU time of all ranks / wall: near the CPU count = CPU-bound */
    uint64_t own_min, own_max;
};

static void tp_run(struct sfs_cache *c, const char *sock, const char *dir, int N, bool rotate,
                   bool blocking, struct tp_result *out)
{
    struct bshared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct bjob jobs[MAXR];
    pid_t pids[MAXR];
    int64_t t0 = INT64_MAX, t1 = 0;

    sfs_cache_foreach(c, ~0u, drop_key, c); /* every run starts cold */
    memset(sh, 0, sizeof(*sh));
    for (int i = 0; i < N; i++) {
        jobs[i] = (struct bjob){
            .sock = sock, .dev = i, .N = N, .rotate = rotate, .blocking = blocking, .sh = sh};
        snprintf(jobs[i].spec, sizeof(jobs[i].spec), "fault:latency_us=%u:%s", O.lat_us, dir);
        pids[i] = fork();
        if (pids[i] == 0)
            _exit(tp_child(&jobs[i]));
    }
    while (atomic_load(&sh->arrived) < N)
        usleep(100);
    usleep(2000);
    atomic_store(&sh->go, 1);
    memset(out, 0, sizeof(*out));
    out->own_min = UINT64_MAX;
    for (int i = 0; i < N; i++) {
        int stt;

        waitpid(pids[i], &stt, 0);
        if (!WIFEXITED(stt) || WEXITSTATUS(stt) != 0) {
            fprintf(stderr, "bench_rank: rank %d failed (status %d)\n", i, stt);
            exit(1);
        }
        struct bres *r = &sh->r[i];
        if (r->t0 < t0)
            t0 = r->t0;
        if (r->t1 > t1)
            t1 = r->t1;
        out->conc_peak += (double)r->max_inflight;
        out->cpus += (double)r->cpu_ns;
        if (r->owner < out->own_min)
            out->own_min = r->owner;
        if (r->owner > out->own_max)
            out->own_max = r->owner;
    }
    out->wall_ms = (double)(t1 - t0) / 1e6;
    out->conc_mean = (double)O.M * O.lat_us / 1e3 / out->wall_ms;
    out->cpus /= (double)(t1 - t0);
    munmap(sh, sizeof(*sh));
}

static void bench_tp_one(void)
{
    char sock[128], dir[128];
    struct tp_result rot[MAXR], nat[MAXR];
    double base_ms = 0;

    snprintf(sock, sizeof(sock), "/tmp/bench-rank-%d.sock", getpid());
    snprintf(dir, sizeof(dir), "/tmp/bench-rank-%d-store", getpid());
    write_store(dir, O.M, O.shard);
    struct sfs_cache *c = make_cache(O.shard, O.M * 2 + 64, sock);

    emit("\n### TP scaling: N ranks load one task of %u x %u KiB shards\n\n", O.M, O.shard / 1024);
    emit("fault backend latency %u us, load depth %u per rank; median of %d runs; "
         "ideal wall = M / (N x depth) x latency = %.1f ms at N=1; %ld CPUs online. "
         "Target: rotated >= 0.9 x N faster than the old natural-order LoadQueue. "
         "\"CPUs busy\" is the ranks' CPU time (every thread) over the wall time of "
         "the rotated run: near the CPU count, the run is CPU-bound, not load-bound.\n\n",
         O.lat_us, O.depth, O.reps, (double)O.M / O.depth * O.lat_us / 1e3,
         sysconf(_SC_NPROCESSORS_ONLN));
    emit("| N | old LoadQueue: natural, blocking waits (ms) | natural, waiters handed "
         "off (ms) | rotated (ms) | rotated speedup vs old / vs natural | met (>= 0.9 x N) | "
         "wall N=%d / wall N (rotated) | backend concurrency mean (peak) | CPUs busy "
         "(rotated) | owner share min..max (M/N), rotated; natural |\n",
         O.ranks[0]);
    emit("|---|---|---|---|---|---|---|---|---|---|\n");
    tp_run(c, sock, dir, 1, true, false, &rot[0]); /* warm-up */
    for (int k = 0; k < O.nranks; k++) {
        int N = O.ranks[k];
        double vr[16], vn[16], vb[16];
        struct tp_result r, n, b;

        for (int rep = 0; rep < O.reps; rep++) {
            tp_run(c, sock, dir, N, false, true, &b);
            tp_run(c, sock, dir, N, false, false, &n);
            tp_run(c, sock, dir, N, true, false, &r);
            vb[rep] = b.wall_ms;
            vn[rep] = n.wall_ms;
            vr[rep] = r.wall_ms;
            rot[k] = r;
            nat[k] = n;
        }
        double mr = median(vr, O.reps), mn = median(vn, O.reps), mb = median(vb, O.reps);
        if (k == 0)
            base_ms = mr;
        emit("| %d | %.1f | %.1f | %.1f | %.2fx / %.2fx | %s | %.2fx | %.1f (%.0f) | %.2f | "
             "%lu..%lu (%.0f); %lu..%lu |\n",
             N, mb, mn, mr, mb / mr, mn / mr, mb / mr >= 0.9 * N ? "yes" : "**no**", base_ms / mr,
             (double)O.M * O.lat_us / 1e3 / mr, rot[k].conc_peak, rot[k].cpus,
             (unsigned long)rot[k].own_min, (unsigned long)rot[k].own_max, (double)O.M / N,
             (unsigned long)nat[k].own_min, (unsigned long)nat[k].own_max);
    }
    sfs_cache_close(c);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void bench_tp(void)
{
    uint32_t hit_shard = O.shard;

    for (uint32_t i = 0; i < O.ntp; i++) {
        O.shard = O.tp_shard[i];
        bench_tp_one();
    }
    O.shard = hit_shard;
}

/* ---------------------------------------------------------------------------
 * 2. Hit path into host buffers vs memcpy.
 */

static void bench_hits(void)
{
    char sock[128];
    uint32_t M = O.quick ? 256 : 1024;
    uint64_t shard = O.shard;
    int reps = O.quick ? 5 : 20;
    /* Page-aligned like the slots: glibc copies between buffers of different
     * alignment mod 64 far slower on some CPUs, which is not what we measure. */
    uint8_t *bufs = aligned_alloc(4096, M * shard), *src = aligned_alloc(4096, M * shard);
    struct sfs_rank_entry *e = calloc(M, sizeof(*e));
    int *st = calloc(M, sizeof(*st));
    double vr[64], vm[64];

    snprintf(sock, sizeof(sock), "/tmp/bench-rank-hit-%d.sock", getpid());
    struct sfs_cache *c = make_cache(shard, M + 64, sock);
    struct sfs_cache_info info;
    uint8_t **slot = calloc(M, sizeof(*slot));
    double vs[64];

    sfs_cache_info(c, &info);
    /* Resident: this process owns and fills every key. Nothing evicts in
     * this run, so the slot addresses stay valid for the baseline. */
    fill_resident(c, M, shard, bufs, e, slot);
    memset(bufs, 1, M * shard);
    memset(src, 2, M * shard);
    struct sfs_rank *rk = bench_rank_open(sock, SFS_COPIER_HOST);

    for (int rep = -1; rep < reps; rep++) {
        struct sfs_task *t;
        int64_t t0 = sfs_now_ns();

        if (sfs_rank_load(rk, e, M, &t) || sfs_rank_wait(t, 60000, st))
            die("load", EIO);
        int64_t t1 = sfs_now_ns();
        sfs_rank_task_free(t);
        check_status(st, M, "load");
        for (uint32_t i = 0; i < M; i++)
            memcpy(bufs + (size_t)i * shard, src + (size_t)i * shard, shard);
        int64_t t2 = sfs_now_ns();
        for (uint32_t i = 0; i < M; i++)
            memcpy(bufs + (size_t)i * shard, slot[i], shard);
        int64_t t3 = sfs_now_ns();
        if (rep >= 0) {
            vr[rep] = (double)M * shard / (double)(t1 - t0);
            vm[rep] = (double)M * shard / (double)(t2 - t1);
            vs[rep] = (double)M * shard / (double)(t3 - t2);
        }
    }
    double r = median(vr, reps), m = median(vm, reps), sl = median(vs, reps);
    emit("\n### Hit path: one rank, resident task of %u x %lu KiB into host buffers\n\n", M,
         (unsigned long)(shard / 1024));
    emit("| path | GB/s | ratio |\n|---|---|---|\n");
    emit("| memcpy from the same data-plane slots (baseline) | %.2f | 1.00 |\n", sl);
    emit("| sfs_rank_load + wait (Get, copy, release) | %.2f | %.2f |\n", r, r / sl);
    emit("| memcpy from malloc'd memory (context) | %.2f | %.2f |\n", m, m / sl);
    emit("\ndata plane on huge pages: %s\n", info.hugepages ? "yes" : "no");
    sfs_rank_close(rk);
    sfs_cache_close(c);
    free(bufs);
    free(src);
    free(slot);
    free(e);
    free(st);
}

/* ---------------------------------------------------------------------------
 * 2b. Small tasks: the inline path against the core API and the pipeline.
 */

/* The CPU model, for the record (the figures are per-CPU latencies). */
static void cpu_model(char *out, size_t len)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];

    snprintf(out, len, "unknown CPU");
    while (f && fgets(line, sizeof(line), f)) {
        char *c = strchr(line, ':');

        if (!strncmp(line, "model name", 10) && c) {
            snprintf(out, len, "%s", c + 2);
            out[strcspn(out, "\n")] = '\0';
            break;
        }
    }
    if (f)
        fclose(f);
}

/* Key i is all (i & 0xff): every byte of n entries of shard bytes. */
static bool small_check(const uint8_t *buf, uint32_t n, uint64_t shard)
{
    for (uint32_t i = 0; i < n; i++)
        for (uint64_t b = 0; b < shard; b++)
            if (buf[i * shard + b] != (uint8_t)i)
                return false;
    return true;
}

static int64_t small_core(struct sfs_cache *c, const struct sfs_rank_entry *e, uint32_t n,
                          uint64_t shard)
{
    int64_t t0 = sfs_now_ns();

    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = {e[i].block, e[i].shard};
        struct sfs_lease l;

        if (sfs_cache_get(c, &k, 0, 0, &l) != SFS_HIT)
            die("core Get: not a hit", EIO);
        memcpy(e[i].addr, sfs_cache_data(c, &l), shard);
        sfs_cache_release(c, &l);
    }
    return sfs_now_ns() - t0;
}

static int64_t small_rank(struct sfs_rank *rk, const struct sfs_rank_entry *e, uint32_t n, int *st)
{
    struct sfs_task *t;
    int64_t t0 = sfs_now_ns();

    if (sfs_rank_load(rk, e, n, &t) || sfs_rank_wait(t, 60000, st))
        die("small load", EIO);
    int64_t dt = sfs_now_ns() - t0;

    sfs_rank_task_free(t);
    check_status(st, n, "small load");
    return dt;
}

static void bench_small(void)
{
    const uint64_t shard = 16 * 1024;
    const uint32_t sizes[2] = {1, 64};
    int iters = O.quick ? 300 : 5000;
    char sock[128], cpu[256];
    uint8_t *bufs[3];
    struct sfs_rank_entry *e[3];
    double *v[3];
    int st[64];

    for (int p = 0; p < 3; p++) {
        bufs[p] = aligned_alloc(4096, 64 * shard);
        e[p] = calloc(64, sizeof(*e[p]));
        v[p] = calloc((size_t)iters, sizeof(*v[p]));
    }
    snprintf(sock, sizeof(sock), "/tmp/bench-rank-small-%d.sock", getpid());
    struct sfs_cache *c = make_cache(shard, 64 + 64, sock);

    for (int p = 0; p < 3; p++)
        fill_resident(c, 64, shard, bufs[p], e[p], NULL);
    struct sfs_rank *rk = bench_rank_open(sock, SFS_COPIER_HOST);
    setenv("SHARDFS_RANK_NO_INLINE", "1", 1); /* a baseline switch, read by sfs_rank_open */
    struct sfs_rank *pipe = bench_rank_open(sock, SFS_COPIER_HOST);
    unsetenv("SHARDFS_RANK_NO_INLINE");

    cpu_model(cpu, sizeof(cpu));
    emit("\n### Small tasks: resident 16 KiB shards into host buffers, round trip\n\n");
    emit("sfs_rank_load + sfs_rank_wait of a task whose keys are all Ready (the inline path: "
         "the submitting thread copies), against the core API doing the same (sfs_cache_get + "
         "memcpy + sfs_cache_release per key) and against the pipeline (dispatcher, copier "
         "threads; a rank of libshardfs-rank-bench opened with its baseline switch "
         "SHARDFS_RANK_NO_INLINE); %d tasks each, interleaved; "
         "every byte of each path's last task checked. CPU: %s, %ld online.\n\n",
         iters, cpu, sysconf(_SC_NPROCESSORS_ONLN));
    emit(
        "| task | core Get+memcpy+Release p50 / p99 (us) | sfs_rank_load inline p50 / p99 (us) "
        "| inline / core (p50) | pipeline p50 / p99 (us) | checked |\n|---|---|---|---|---|---|\n");
    for (int z = 0; z < 2; z++) {
        uint32_t n = sizes[z];
        double p50[3], p99[3];

        for (int i = -50; i < iters; i++) {
            int64_t d[3];

            /* Rotate which path goes first: none always pays for a cold line. */
            for (int k = 0; k < 3; k++) {
                int p = (i + k) % 3;

                if (p < 0)
                    p += 3;
                d[p] = p == 0   ? small_core(c, e[0], n, shard)
                       : p == 1 ? small_rank(rk, e[1], n, st)
                                : small_rank(pipe, e[2], n, st);
            }
            if (i >= 0)
                for (int p = 0; p < 3; p++)
                    v[p][i] = (double)d[p] / 1e3;
        }
        for (int p = 0; p < 3; p++) {
            p99[p] = bench_percentile(v[p], (size_t)iters, 99);
            p50[p] = bench_percentile(v[p], (size_t)iters, 50);
        }
        bool ok = small_check(bufs[0], n, shard) && small_check(bufs[1], n, shard) &&
                  small_check(bufs[2], n, shard);
        fprintf(stderr,
                "small %u x 16 KiB: core p50 %.2f p99 %.2f; inline p50 %.2f p99 %.2f; "
                "pipeline p50 %.2f p99 %.2f us\n",
                n, p50[0], p99[0], p50[1], p99[1], p50[2], p99[2]);
        emit("| %u x 16 KiB | %.2f / %.2f | %.2f / %.2f | %.2fx | %.2f / %.2f | %s |\n", n, p50[0],
             p99[0], p50[1], p99[1], p50[1] / p50[0], p50[2], p99[2], ok ? "all" : "**WRONG**");
        if (!ok)
            die("small tasks: wrong bytes", EIO);
    }
    sfs_rank_close(rk);
    sfs_rank_close(pipe);
    sfs_cache_close(c);
    for (int p = 0; p < 3; p++) {
        free(bufs[p]);
        free(e[p]);
        free(v[p]);
    }
}

/* ---------------------------------------------------------------------------
 * 3. GPU: load / dump GB/s by shard size, and small-task latency.
 */

struct cudart {
    void *h;
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*malloc_host)(void **, size_t);
    int (*free_host)(void *);
    int (*sync)(void);
    int (*host_register)(void *, size_t, unsigned); /* optional */
    int (*host_unregister)(void *);                 /* optional */
};

static bool cudart_open(struct cudart *c)
{
    const char *names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};

    for (int i = 0; i < 3 && !c->h; i++)
        c->h = dlopen(names[i], RTLD_NOW);
    if (!c->h)
        return false;
    c->malloc_ = (int (*)(void **, size_t))dlsym(c->h, "cudaMalloc");
    c->free_ = (int (*)(void *))dlsym(c->h, "cudaFree");
    c->memcpy_ = (int (*)(void *, const void *, size_t, int))dlsym(c->h, "cudaMemcpy");
    c->malloc_host = (int (*)(void **, size_t))dlsym(c->h, "cudaMallocHost");
    c->free_host = (int (*)(void *))dlsym(c->h, "cudaFreeHost");
    c->sync = (int (*)(void))dlsym(c->h, "cudaDeviceSynchronize");
    c->host_register = (int (*)(void *, size_t, unsigned))dlsym(c->h, "cudaHostRegister");
    c->host_unregister = (int (*)(void *))dlsym(c->h, "cudaHostUnregister");
    return c->malloc_ && c->free_ && c->memcpy_ && c->malloc_host && c->free_host && c->sync;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? -1 : x > y;
}

/* After a dump (which leaves dev as it was) and the baseline copies (which
 * overwrite it), load once more and check every byte in host memory. */
static bool verify_loaded(struct cudart *cu, bool gpu, void *dev, void *pinned, uint64_t shard,
                          uint32_t n)
{
    const uint8_t *p = pinned;

    if (gpu) {
        if (cu->memcpy_(pinned, dev, (size_t)n * shard, 2))
            return false;
        cu->sync();
    } else {
        p = dev;
    }
    for (uint32_t i = 0; i < n; i++)
        for (uint64_t b = 0; b < shard; b++)
            if (p[(size_t)i * shard + b] != (uint8_t)i) {
                fprintf(stderr, "bench_rank: shard %u of %u, byte %lu: %u, not %u\n", i, n,
                        (unsigned long)b, p[(size_t)i * shard + b], i & 0xffu);
                return false;
            }
    return true;
}

/*
 * Rank attach: sfs_rank_open on a cache whose data plane the daemon has
 * populated (the rank maps every segment, faults its page tables in and, with
 * CUDA, registers it), against cudaHostRegister alone of as many touched
 * bytes (without a GPU: against nothing; the figure is the mapping's cost).
 */
static void bench_attach(struct cudart *cu, bool gpu)
{
    const uint64_t gib = O.quick ? 1 : 4, bytes = gib << 30, shard = 1 << 20;
    const int reps = O.quick ? 2 : 3;
    struct sfs_cache_config cc = {
        .shard_size = shard,
        .nslots = (uint32_t)(bytes / shard),
        .no_reserved = true,
        .populate = true,
        .hugepages = SFS_HUGEPAGES_AUTO,
    };
    char sock[128];
    int err = 0;
    double vo[8], vr[8];
    struct sfs_cache_info info;

    snprintf(sock, sizeof(sock), "/tmp/bench-rank-attach-%d.sock", getpid());
    struct sfs_cache *c = sfs_cache_create(&cc, &err);
    if (!c)
        die("sfs_cache_create", err);
    if ((err = sfs_cache_serve(c, sock)))
        die("sfs_cache_serve", err);
    sfs_cache_info(c, &info);
    for (int rep = 0; rep < reps; rep++) {
        int64_t t0 = sfs_now_ns();
        struct sfs_rank *rk = bench_rank_open(sock, O.copier);
        int64_t t1 = sfs_now_ns();

        vo[rep] = (double)(t1 - t0) / 1e6;
        sfs_rank_close(rk);
    }
    sfs_cache_close(c);
    bool base = gpu && cu->host_register && cu->host_unregister;

    for (int rep = 0; base && rep < reps; rep++) {
        void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

        if (buf == MAP_FAILED)
            die("mmap", errno);
        memset(buf, 1, bytes); /* touched, as the daemon's data plane is */
        int64_t t0 = sfs_now_ns();
        int r = cu->host_register(buf, bytes, 3 /* portable | mapped */);
        int64_t t1 = sfs_now_ns();

        if (r)
            base = false;
        else
            cu->host_unregister(buf);
        vr[rep] = (double)(t1 - t0) / 1e6;
        munmap(buf, bytes);
    }
    double mo = median(vo, reps), mr = base ? median(vr, reps) : 0;

    emit("\n### Rank attach: %lu GiB data plane (%s), median of %d\n\n", (unsigned long)gib,
         info.hugepages ? "huge pages" : "4 KiB pages", reps);
    emit("| what | ms | ms per GiB | target |\n|---|---|---|---|\n");
    emit("| sfs_rank_open (%s copier): map, fault in, %s | %.1f | %.1f | <= 60 |\n",
         gpu ? "cuda" : "host", gpu ? "register" : "no registration", mo, mo / (double)gib);
    if (base)
        emit("| cudaHostRegister alone (baseline) | %.1f | %.1f | |\n", mr, mr / (double)gib);
}

static void bench_gpu(void)
{
    static const uint64_t sizes[] = {16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
    uint64_t total = O.quick ? (64ull << 20) : (512ull << 20);
    int reps = O.quick ? 3 : 7;
    struct cudart cu = {0};
    bool gpu = sfs_rank_cuda_devices() > 0 && O.copier != SFS_COPIER_HOST;

    if (!gpu && O.copier == SFS_COPIER_CUDA) {
        emit("\n### GPU: skipped (no CUDA device, or built without CUDA)\n");
        return;
    }
    if (gpu && !cudart_open(&cu)) {
        emit("\n### GPU: skipped (libcudart not loadable)\n");
        return;
    }
    if (!gpu)
        emit("\n(no GPU: the GPU table below runs the host copier into host memory)\n");
    /* Destination/baseline buffers: device + pinned with a GPU, host without. */
    void *dev = NULL, *pinned = NULL;
    if (gpu) {
        if (cu.malloc_(&dev, total) || cu.malloc_host(&pinned, total))
            die("cudaMalloc", ENOMEM);
    } else {
        dev = malloc(total);
        pinned = malloc(total);
        memset(dev, 0, total);
        memset(pinned, 0, total);
    }
    emit("\n### GPU copy: resident task of %lu MiB, median of %d runs (%s copier)\n\n",
         (unsigned long)(total >> 20), reps, gpu ? "cuda" : "host");
    emit("| shard | load GB/s | dump GB/s | one big pinned copy H2D / D2H GB/s | load ratio | "
         "dump ratio | copies per batch | bytes checked |\n|---|---|---|---|---|---|---|---|\n");
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        uint64_t shard = sizes[si];
        uint32_t n = (uint32_t)(total / shard);
        char sock[128];
        double vl[16], vd[16], vh[16], vdh[16];

        snprintf(sock, sizeof(sock), "/tmp/bench-rank-gpu-%d-%zu.sock", getpid(), si);
        struct sfs_cache *c = make_cache(shard, n + 64, sock);
        struct sfs_rank_entry *e = calloc(n, sizeof(*e));
        int *st = calloc(n, sizeof(*st));

        fill_resident(c, n, shard, dev, e, NULL);
        struct sfs_rank *rk = bench_rank_open(sock, O.copier);
        for (int rep = -1; rep < reps; rep++) {
            struct sfs_task *t;
            int64_t t0 = sfs_now_ns();

            if (sfs_rank_load(rk, e, n, &t) || sfs_rank_wait(t, 60000, st))
                die("load", EIO);
            int64_t t1 = sfs_now_ns();
            sfs_rank_task_free(t);
            check_status(st, n, "load");
            if (sfs_rank_dump(rk, e, n, &t) || sfs_rank_wait(t, 60000, st))
                die("dump", EIO);
            check_status(st, n, "dump");
            int64_t t2 = sfs_now_ns();
            sfs_rank_task_free(t);
            if (gpu) {
                cu.memcpy_(dev, pinned, total, 1);
                cu.sync();
            } else {
                memcpy(dev, pinned, total);
            }
            int64_t t3 = sfs_now_ns();
            if (gpu) {
                cu.memcpy_(pinned, dev, total, 2);
                cu.sync();
            } else {
                memcpy(pinned, dev, total);
            }
            int64_t t4 = sfs_now_ns();
            if (rep >= 0) {
                vl[rep] = (double)total / (double)(t1 - t0);
                vd[rep] = (double)total / (double)(t2 - t1);
                vh[rep] = (double)total / (double)(t3 - t2);
                vdh[rep] = (double)total / (double)(t4 - t3);
            }
        }
        double l = median(vl, reps), d = median(vd, reps), h = median(vh, reps),
               dh = median(vdh, reps);
        struct sfs_rank_stats rs;

        sfs_rank_stats(rk, &rs);
        /* The timed loads' bytes were overwritten by the baseline: load
         * once more and check every byte (shard i is all i & 0xff). */
        struct sfs_task *vt;

        if (sfs_rank_load(rk, e, n, &vt) || sfs_rank_wait(vt, 60000, st))
            die("load", EIO);
        sfs_rank_task_free(vt);
        check_status(st, n, "load");
        const char *checked = verify_loaded(&cu, gpu, dev, pinned, shard, n) ? "all" : "**WRONG**";
        emit("| %lu KiB | %.1f | %.1f | %.1f / %.1f | %.2f | %.2f | %.0f | %s |\n",
             (unsigned long)(shard >> 10), l, d, h, dh, l / h, d / dh,
             rs.copy_batches ? (double)rs.copies / (double)rs.copy_batches : 0.0, checked);

        if (shard == (16 << 10)) {
            /* Latency: a resident task of 64 x 16 KiB, end to end. */
            int iters = O.quick ? 200 : 2000;
            int64_t *lat = malloc(iters * sizeof(*lat));

            for (int i = -20; i < iters; i++) {
                struct sfs_task *t;
                int64_t t0 = sfs_now_ns();

                if (sfs_rank_load(rk, e, 64, &t) || sfs_rank_wait(t, 60000, st))
                    die("load", EIO);
                int64_t t1 = sfs_now_ns();
                sfs_rank_task_free(t);
                check_status(st, 64, "load");
                if (i >= 0)
                    lat[i] = t1 - t0;
            }
            qsort(lat, iters, sizeof(*lat), cmp_i64);
            fprintf(stderr, "64 x 16 KiB resident task: p50 %.1f us, p99 %.1f us\n",
                    lat[iters / 2] / 1e3, lat[iters * 99 / 100] / 1e3);
            emit("| 64 x 16 KiB task latency | p50 %.1f us | p99 %.1f us | | | |\n",
                 lat[iters / 2] / 1e3, lat[iters * 99 / 100] / 1e3);
            free(lat);
        }
        sfs_rank_close(rk);
        sfs_cache_close(c);
        free(e);
        free(st);
    }
    if (gpu) {
        cu.free_(dev);
        cu.free_host(pinned);
    } else {
        free(dev);
        free(pinned);
    }
    bench_attach(&cu, gpu);
}

/* ---------------------------------------------------------------------------
 * Options.
 */

static void usage(void)
{
    fprintf(stderr, "usage: bench_rank [--quick] [--gpu | --small] [--ranks 1,2,4,8] [--shards M] "
                    "[--latency-us L] [--depth D] [--shard-size BYTES[,BYTES..]] [--reps R] "
                    "[--copier auto|host|cuda] [--out FILE]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(a, "--quick")) {
            O.quick = true;
            O.M = 64;
            O.reps = 1;
            O.nranks = 3;
        } else if (!strcmp(a, "--gpu")) {
            O.gpu = true;
        } else if (!strcmp(a, "--small")) {
            O.small_only = true;
        } else if (!strcmp(a, "--ranks") && v) {
            char *s = strdup(v), *tok, *save;

            O.nranks = 0;
            for (tok = strtok_r(s, ",", &save); tok && O.nranks < MAXR;
                 tok = strtok_r(NULL, ",", &save)) {
                int n = atoi(tok);
                if (n < 1 || n > MAXR)
                    usage();
                O.ranks[O.nranks++] = n;
            }
            free(s);
            i++;
        } else if (!strcmp(a, "--shards") && v) {
            O.M = (uint32_t)atoi(v), i++;
        } else if (!strcmp(a, "--latency-us") && v) {
            O.lat_us = (unsigned)atoi(v), i++;
        } else if (!strcmp(a, "--depth") && v) {
            O.depth = (unsigned)atoi(v), i++;
        } else if (!strcmp(a, "--shard-size") && v) {
            /* One size: for every table. A list: the TP table's sizes. */
            char *sv = strdup(v), *tok, *save;

            O.ntp = 0;
            for (tok = strtok_r(sv, ",", &save); tok && O.ntp < 4; tok = strtok_r(NULL, ",", &save))
                O.tp_shard[O.ntp++] = (uint32_t)strtoul(tok, NULL, 0);
            if (O.ntp == 1)
                O.shard = O.tp_shard[0];
            free(sv);
            i++;
        } else if (!strcmp(a, "--reps") && v) {
            O.reps = atoi(v), i++;
        } else if ((!strcmp(a, "--out") || !strcmp(a, "--md")) && v) {
            O.out = v, i++;
        } else if (!strcmp(a, "--copier") && v) {
            O.copier = !strcmp(v, "host")   ? SFS_COPIER_HOST
                       : !strcmp(v, "cuda") ? SFS_COPIER_CUDA
                                            : SFS_COPIER_AUTO;
            i++;
        } else {
            usage();
        }
    }
    if (O.M == 0 || O.depth == 0 || O.reps < 1 || O.reps > 16 || O.shard == 0 || O.ntp == 0)
        usage();
    for (uint32_t i = 0; i < O.ntp; i++)
        if (O.tp_shard[i] == 0)
            usage();
    struct bench b = {
        .name = O.gpu ? "bench_rank_gpu" : "bench_rank", .quick = O.quick, .md = O.out};

    if (O.out) {
        /* The section is collected here and replaces the old one at the end. */
        outf = open_memstream(&b.buf, &b.len);
        if (!outf)
            die("open_memstream", errno);
        b.out = outf;
        fprintf(outf, "## libshardfs-rank: %s (`bench_rank%s`)\n\n",
                O.gpu ? "GPU copies" : "TP scaling and the hit path", O.gpu ? " --gpu" : "");
        bench_stamp(&b);
    }
    if (O.small_only && O.out)
        usage(); /* the section is the whole default run's */
    emit("%s", BUILD_NOTE);
    if (O.gpu) {
        bench_gpu();
    } else if (O.small_only) {
        bench_small();
    } else {
        bench_tp();
        bench_hits();
        bench_small();
    }
    if (outf) {
        int rc;

        emit("\nCommand: `build/tests/bench/bench_rank%s --out docs/PERFORMANCE.md`\n",
             O.gpu ? " --gpu" : "");
        fclose(outf);
        outf = NULL;
        rc = bench_write_md(&b);
        free(b.buf);
        if (rc < 0)
            return 1;
        fprintf(stderr, "bench_rank: section written to %s\n", O.out);
    }
    return 0;
}
