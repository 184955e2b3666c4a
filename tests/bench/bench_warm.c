/* SPDX-License-Identifier: MIT */
/*
 * bench_warm.c - warm restart (design.md, section 10): the hit rate of the first 10 % of
 * a skewed workload replayed after a restart, with -o warm against a cold
 * restart, in the same run; and what the hot-set sampler costs per second.
 *
 *   bench_warm [--quick] [--md FILE]
 *
 * A posix store of NB one-shard blocks (64 KiB shards) under /tmp; a cache
 * of a quarter of them. A Zipf (s = 1) trace over the blocks in a random
 * order. First mount (warm=0): replay trace A whole, SIGTERM: the daemon
 * writes STORE/.shardfs_usage. Then, with that same file in place each
 * time, two restarts replay trace B (the same distribution, another seed):
 *   - cold: -o warm=0;
 *   - warm: -o warm=100 (at most the regular pool), the replay started
 *     once the warm-up has logged its end (its time is reported).
 * Hit rates are from /stats (hits / requests) over the first 10 % of trace
 * B, and over all of it. Readahead is off, so every read is one Get.
 *
 * The sampler's cost: one sfs_cache_sample() pass over a full cache of N
 * Ready slots (in this process), the median of several passes; the daemon
 * makes one pass a second. Exit 77 when FUSE is not usable here.
 */
#include "bench_util.h"
#include "fsfixture.h"
#include "fswarm.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary"
#endif

#define SHARD (64u << 10)

struct setup {
    char store[128], usage[200];
    struct fsfx fx;
    unsigned nblocks;
    uint8_t *buf;
};

static struct setup S;

static int start(const char *warm)
{
    char o[256];
    int st = 0;

    snprintf(o, sizeof(o), "hugepages=off,shard_size=64K,capacity=%uK,readahead=0,%s",
             S.nblocks / 4 * (SHARD >> 10), warm);
    return fsfx_start(&S.fx, S.store, o, 20.0, &st);
}

/* SIGTERM (the daemon writes the usage file): its exit status, or < 0. */
static int stop_term(void)
{
    return fswarm_stop_term(&S.fx, 60.0);
}

/* A Zipf(1) trace of n block numbers over a random order of the blocks. */
static unsigned *trace(size_t n, uint64_t seed)
{
    static unsigned *perm;
    static double *cdf;
    unsigned *t = malloc(n * sizeof(*t));
    uint64_t rng = seed;

    if (!perm) {
        uint64_t r2 = 12345;
        double sum = 0;

        perm = malloc(S.nblocks * sizeof(*perm));
        cdf = malloc(S.nblocks * sizeof(*cdf));
        for (unsigned i = 0; i < S.nblocks; i++)
            perm[i] = i;
        for (unsigned i = S.nblocks - 1; i > 0; i--) {
            unsigned j = (unsigned)(tu_rng_next(&r2) % (i + 1)), x = perm[i];

            perm[i] = perm[j];
            perm[j] = x;
        }
        for (unsigned i = 0; i < S.nblocks; i++)
            cdf[i] = (sum += 1.0 / (i + 1));
        for (unsigned i = 0; i < S.nblocks; i++)
            cdf[i] /= sum;
    }
    for (size_t i = 0; i < n; i++) {
        double u = (double)(tu_rng_next(&rng) >> 11) / 9007199254740992.0;
        unsigned lo = 0, hi = S.nblocks - 1;

        while (lo < hi) {
            unsigned mid = (lo + hi) / 2;

            if (cdf[mid] < u)
                lo = mid + 1;
            else
                hi = mid;
        }
        t[i] = perm[lo];
    }
    return t;
}

static void replay(const unsigned *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char hex[SFS_BLOCK_HEX_LEN + 1], p[256];
        int fd;

        tu_block_hex(t[i], hex);
        snprintf(p, sizeof(p), "%s/block/%s/shard/0", S.fx.mnt, hex);
        fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            if (pread(fd, S.buf, SHARD, 0) != (ssize_t)SHARD)
                fprintf(stderr, "bench_warm: short read of %s\n", p);
            close(fd);
        }
    }
}

/* Hit rate over the replay of t[0, n), from /stats. */
static double hit_rate(const unsigned *t, size_t n)
{
    long long h0 = fsfx_stat(&S.fx, "shardfs_hits_total"),
              r0 = fsfx_stat(&S.fx, "shardfs_requests_total");

    replay(t, n);
    return (double)(fsfx_stat(&S.fx, "shardfs_hits_total") - h0) /
           (double)(fsfx_stat(&S.fx, "shardfs_requests_total") - r0);
}

static int noop(const struct sfs_key *k, uint32_t slot, bool acc, bool leased, void *arg)
{
    (void)k;
    (void)slot;
    (void)acc;
    (void)leased;
    ++*(uint64_t *)arg;
    return 0;
}

/* Median microseconds of one sample pass over a full cache of n slots
 * (*tick_us: of one daemon tick, the first 16384 buckets). */
static double sample_us(uint32_t n, int reps, double *tick_us)
{
    struct sfs_cache *c = tu_cache(n, 0, 512);
    double *v = calloc((size_t)reps, sizeof(*v));
    double r;

    if (!c || !v)
        return -1;
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(i, 0);

        tu_load(c, &k);
    }
    for (int i = 0; i < reps; i++) {
        uint64_t seen = 0;
        uint32_t cursor = 0;
        int64_t t0 = bench_now_ns();

        sfs_cache_sample(c, &cursor, 0, noop, &seen);
        v[i] = (double)(bench_now_ns() - t0) / 1000.0;
        if (seen != n)
            fprintf(stderr, "bench_warm: sample saw %llu of %u\n", (unsigned long long)seen, n);
    }
    r = bench_median(v, (size_t)reps);
    for (int i = 0; i < reps; i++) {
        uint64_t seen = 0;
        uint32_t cursor = 0;
        int64_t t0 = bench_now_ns();

        sfs_cache_sample(c, &cursor, 16384, noop, &seen);
        v[i] = (double)(bench_now_ns() - t0) / 1000.0;
    }
    *tick_us = bench_median(v, (size_t)reps);
    free(v);
    sfs_cache_close(c);
    return r;
}

int main(int argc, char **argv)
{
    struct bench b;
    size_t n, n1, n10;
    unsigned *ta, *tb;
    double cold1, warm1, cold10, warm10, cold_all, warm_all, warm_s = 0;
    long long warmed = 0;
    uint8_t *saved = NULL;
    size_t saved_len = 0;
    uint32_t sizes[] = {4096, 65536, 262144};
    double us[3], tick[3];
    int nsizes;
    bool failed = false;

    if (bench_init(&b, "bench_warm", argc, argv) != 0)
        return 2;
    if (!fsfx_usable()) {
        fprintf(stderr, "bench_warm: FUSE not usable here\n");
        return 77;
    }
    S.nblocks = b.quick ? 512 : 2048;
    n = b.quick ? 5000 : 40000;
    n10 = n / 10;
    n1 = n / 100;
    nsizes = b.quick ? 2 : 3;
    snprintf(S.store, sizeof(S.store), "/tmp/bench_warm_store.%d", (int)getpid());
    snprintf(S.usage, sizeof(S.usage), "%s/.shardfs_usage", S.store);
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "/tmp/bench_warm_mnt.%d", (int)getpid());
    snprintf(S.fx.sock, sizeof(S.fx.sock), "/tmp/bench_warm_sock.%d", (int)getpid());
    snprintf(S.fx.log, sizeof(S.fx.log), "/tmp/bench_warm_log.%d", (int)getpid());
    S.fx.bin = SHARDFS_BIN;
    mkdir(S.fx.mnt, 0755);
    S.buf = malloc(SHARD);
    if (!S.buf || tu_store_write(S.store, 0, S.nblocks, 1, SHARD, NULL, NULL, false) != 0) {
        fprintf(stderr, "bench_warm: cannot write the store\n");
        return 1;
    }
    ta = trace(n, 1);
    tb = trace(n, 2);

    /* Learn: trace A on a cold mount, then SIGTERM writes the usage file. */
    if (start("warm=0") != 0)
        goto fail;
    replay(ta, n);
    if (stop_term() != 0)
        goto fail;
    saved = fswarm_slurp(S.usage, &saved_len);
    if (!saved)
        goto fail;

    /* Cold restart. */
    if (start("warm=0") != 0)
        goto fail;
    cold1 = hit_rate(tb, n1);
    cold10 = (cold1 * (double)n1 + hit_rate(tb + n1, n10 - n1) * (double)(n10 - n1)) / (double)n10;
    cold_all = hit_rate(tb + n10, n - n10);
    cold_all = (cold10 * (double)n10 + cold_all * (double)(n - n10)) / (double)n;
    stop_term();

    /* Warm restart, from the same file as the cold one had. */
    if (fswarm_spit(S.usage, saved, saved_len) != 0)
        goto fail;
    {
        int64_t t0 = bench_now_ns();

        if (start("warm=100") != 0)
            goto fail;
        while (fsfx_log_lines_with(&S.fx, "warm restart:") == 0 &&
               bench_now_ns() - t0 < 60000000000ll)
            bench_sleep_ns(5000000);
        /* Its loads may still be in flight: wait until they settle. */
        for (long long last = -1; last != fsfx_stat(&S.fx, "shardfs_resident_bytes");) {
            last = fsfx_stat(&S.fx, "shardfs_resident_bytes");
            bench_sleep_ns(50000000);
        }
        warm_s = (double)(bench_now_ns() - t0) / 1e9;
        warmed = fsfx_stat(&S.fx, "shardfs_warmed_total");
    }
    warm1 = hit_rate(tb, n1);
    warm10 = (warm1 * (double)n1 + hit_rate(tb + n1, n10 - n1) * (double)(n10 - n1)) / (double)n10;
    warm_all = hit_rate(tb + n10, n - n10);
    warm_all = (warm10 * (double)n10 + warm_all * (double)(n - n10)) / (double)n;
    stop_term();

    for (int i = 0; i < nsizes; i++)
        us[i] = sample_us(sizes[i], b.quick ? 5 : 11, &tick[i]);

    fprintf(b.out, "### Warm restart (bench_warm)\n\n");
    bench_stamp(&b);
    fprintf(b.out,
            "%u one-shard blocks of 64 KiB in a posix store, a cache of a quarter of them "
            "(%u slots); Zipf(1) traces of %zu reads in a random block order. The usage "
            "file comes from trace A; both restarts replay trace B (same distribution, "
            "another seed) with that file in place; readahead off.\n\n",
            S.nblocks, S.nblocks / 4, n);
    fprintf(b.out, "| restart | hit rate, first 1 %% | first 10 %% of requests | all |\n");
    fprintf(b.out, "|---|---|---|---|\n");
    fprintf(b.out, "| cold (`-o warm=0`) | %.1f %% | %.1f %% | %.1f %% |\n", cold1 * 100,
            cold10 * 100, cold_all * 100);
    fprintf(b.out, "| warm (`-o warm=100`) | %.1f %% | %.1f %% | %.1f %% |\n\n", warm1 * 100,
            warm10 * 100, warm_all * 100);
    fprintf(b.out,
            "Warm minus cold: first 1 %%: %+.1f points; first 10 %%: %+.1f points. The warm-up "
            "loaded %lld shards and "
            "had settled %.2f s after the mount started (the replay began then).\n\n",
            (warm1 - cold1) * 100, (warm10 - cold10) * 100, warmed, warm_s);
    fprintf(b.out, "The hot-set sampler: `sfs_cache_sample()` over a full cache of Ready "
                   "slots (half as many buckets), medians. The daemon samples at most "
                   "16384 buckets a second (one tick), so its cost per second is the tick's; "
                   "a whole sweep takes nbuckets / 16384 s.\n\n");
    fprintf(b.out, "| slots | whole sweep | one tick (16384 buckets) | tick, share of one core "
                   "|\n|---|---|---|---|\n");
    for (int i = 0; i < nsizes; i++)
        fprintf(b.out, "| %u | %.0f us | %.0f us | %.2f %% |\n", sizes[i], us[i], tick[i],
                tick[i] / 1e4);
    fprintf(b.out, "\nCommand: `build-rel/tests/bench/bench_warm --md docs/PERFORMANCE.md` "
                   "(a Release build with -DSHARDFS_BENCH=ON; as root, for the mounts)\n\n");
cleanup:
    if (S.fx.pid > 0)
        stop_term();
    rmdir(S.fx.mnt);
    {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf %s", S.store);
        if (system(cmd) != 0)
            fprintf(stderr, "bench_warm: could not remove %s\n", S.store);
    }
    free(saved);
    free(ta);
    free(tb);
    free(S.buf);
    if (failed)
        return 1;
    unlink(S.fx.log);
    return bench_finish(&b);
fail:
    fprintf(stderr, "bench_warm: a step failed (the daemon's log: %s)\n", S.fx.log);
    failed = true;
    goto cleanup;
}
