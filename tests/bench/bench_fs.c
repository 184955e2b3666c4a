/* SPDX-License-Identifier: MIT */
/*
 * bench_fs.c - reads through a shardfs mount against the same bytes read
 * without it, in the same run.
 *
 *   bench_fs [--quick] [--md FILE]
 *
 * It writes a store of 1 MiB shards (UCM layout) under /tmp and a copy of
 * the same bytes in a tmpfs file (/dev/shm), starts the daemon in the
 * foreground, and measures:
 *
 *   - cold: every shard once through a fresh mount (backend loads), against
 *     raw 1 MiB preads of the store files; the store's page cache is dropped
 *     before each side with POSIX_FADV_DONTNEED (these files only);
 *   - resident, one reader: dd-style 1 MiB reads of every shard, against
 *     1 MiB reads of the tmpfs file (target >= 0.8x);
 *   - resident, four reader processes, aggregate;
 *   - 4 KiB random reads per second (one process), resident.
 *
 * Each figure is the median of several passes after a warm-up pass. Exit 77
 * when FUSE is not usable here.
 */
#include "bench_util.h"
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary"
#endif

#define SHARD     (1u << 20)
#define NSHARDS_B 16 /* shards per block */

struct setup {
    char store[128], shm[128];
    struct fsfx fx; /* the daemon: mount point, socket, pid */
    unsigned nblocks;
    uint8_t *buf; /* SHARD bytes, aligned */
};

static struct setup S;

static void shard_path(unsigned b, unsigned s, char *out, size_t len)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];

    tu_block_hex(b, hex);
    snprintf(out, len, "%s/block/%s/shard/%u", S.fx.mnt, hex, s);
}

static void store_path(unsigned b, char *out, size_t len)
{
    tu_store_path(S.store, b, out, len);
}

/* Shard s of block b: bytes of one value, b * NSHARDS_B + s; the same
 * bytes go to the shm mirror (the baseline), at the shard's index. */
struct mirror {
    int fd;
    bool failed;
};

static void fill_and_mirror(uint64_t b, uint32_t s, void *buf, size_t len, void *arg)
{
    struct mirror *m = arg;

    memset(buf, (int)(b * NSHARDS_B + s), len);
    if (pwrite(m->fd, buf, len, ((off_t)b * NSHARDS_B + s) * (off_t)len) != (ssize_t)len)
        m->failed = true;
}

static int make_store(void)
{
    struct mirror m = {.fd = open(S.shm, O_WRONLY | O_CREAT | O_TRUNC, 0644)};
    int r;

    if (m.fd < 0)
        return -1;
    r = tu_store_write(S.store, 0, S.nblocks, NSHARDS_B, SHARD, fill_and_mirror, &m, true);
    close(m.fd);
    return r < 0 || m.failed ? -1 : 0;
}

static void drop_store_cache(void)
{
    char path[256];

    for (unsigned b = 0; b < S.nblocks; b++) {
        int fd;

        store_path(b, path, sizeof(path));
        fd = open(path, O_RDONLY);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

static int daemon_start(void)
{
    char opts[512];
    uint64_t cap = (uint64_t)S.nblocks * NSHARDS_B * SHARD + (64ull << 20);

    snprintf(opts, sizeof(opts), "shard_size=1M,capacity=%llu", (unsigned long long)cap);
    S.fx.bin = SHARDFS_BIN;
    return fsfx_start(&S.fx, S.store, opts, 20.0, NULL);
}

static void daemon_stop(void)
{
    fsfx_stop(&S.fx, true, 10.0);
}

/* Read shards [first, first+n) of the global order through the mount with
 * 1 MiB reads; returns bytes, or -1. */
static long long read_mount(unsigned first, unsigned n, uint8_t *buf)
{
    long long total = 0;

    for (unsigned i = first; i < first + n; i++) {
        char path[300];
        int fd;
        ssize_t r;

        shard_path(i / NSHARDS_B, i % NSHARDS_B, path, sizeof(path));
        fd = open(path, O_RDONLY);
        if (fd < 0)
            return -1;
        while ((r = read(fd, buf, SHARD)) > 0)
            total += r;
        close(fd);
        if (r < 0)
            return -1;
    }
    return total;
}

/* The same bytes from the tmpfs file (or, raw=true, the store files). */
static long long read_plain(unsigned first, unsigned n, uint8_t *buf, bool raw)
{
    long long total = 0;
    int fd = raw ? -1 : open(S.shm, O_RDONLY);

    if (!raw && fd < 0)
        return -1;
    for (unsigned i = first; i < first + n; i++) {
        ssize_t r;

        if (raw) {
            char path[256];
            int sfd;

            store_path(i / NSHARDS_B, path, sizeof(path));
            sfd = open(path, O_RDONLY);
            if (sfd < 0)
                return -1;
            r = pread(sfd, buf, SHARD, (off_t)(i % NSHARDS_B) * SHARD);
            close(sfd);
        } else {
            r = pread(fd, buf, SHARD, (off_t)i * SHARD);
        }
        if (r != SHARD) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        total += r;
    }
    if (fd >= 0)
        close(fd);
    return total;
}

/* GB/s of one pass. */
static double pass_gbs(bool mount, uint8_t *buf)
{
    unsigned n = S.nblocks * NSHARDS_B;
    int64_t t0 = bench_now_ns();
    long long bytes = mount ? read_mount(0, n, buf) : read_plain(0, n, buf, false);
    int64_t dt = bench_now_ns() - t0;

    return bytes < 0 ? -1 : (double)bytes / (double)dt;
}

/* GB/s of one pass over shard files opened beforehand: the data path alone
 * (what a long-lived reader sees), against the same preads of the tmpfs file. */
static double pass_open_gbs(bool mount, uint8_t *buf)
{
    unsigned n = S.nblocks * NSHARDS_B;
    int *fds = calloc(n, sizeof(int));
    double r = -1;
    int64_t t0;

    if (!fds)
        return -1;
    if (!mount) {
        free(fds);
        return pass_gbs(false, buf);
    }
    for (unsigned i = 0; i < n; i++) {
        char path[300];

        shard_path(i / NSHARDS_B, i % NSHARDS_B, path, sizeof(path));
        fds[i] = open(path, O_RDONLY);
        if (fds[i] < 0)
            goto out;
    }
    t0 = bench_now_ns();
    for (unsigned i = 0; i < n; i++)
        if (pread(fds[i], buf, SHARD, 0) != SHARD)
            goto out;
    r = (double)n * SHARD / (double)(bench_now_ns() - t0);
out:
    for (unsigned i = 0; i < n; i++)
        if (fds[i] > 0)
            close(fds[i]);
    free(fds);
    return r;
}

/* Aggregate GB/s of `procs` processes, each reading every shard once
 * starting at its own offset. */
static double parallel_gbs(bool mount, int procs)
{
    unsigned n = S.nblocks * NSHARDS_B;
    pid_t pids[16];
    int64_t t0 = bench_now_ns();
    int ok = 1;

    for (int p = 0; p < procs; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            uint8_t *buf = aligned_alloc(4096, SHARD);
            unsigned start = (unsigned)p * n / (unsigned)procs;
            long long a, b;

            if (!buf)
                _exit(1);
            a = mount ? read_mount(start, n - start, buf)
                      : read_plain(start, n - start, buf, false);
            b = mount ? read_mount(0, start, buf) : read_plain(0, start, buf, false);
            _exit(a < 0 || b < 0);
        }
    }
    for (int p = 0; p < procs; p++) {
        int st;

        waitpid(pids[p], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    if (!ok)
        return -1;
    return (double)n * SHARD * procs / (double)(bench_now_ns() - t0);
}

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* 4 KiB random reads: ops/s, and p50/p99 latency in us. */
static double rand4k(bool mount, int ops, double *p50, double *p99)
{
    unsigned n = S.nblocks * NSHARDS_B;
    double *lat = malloc(sizeof(double) * (size_t)ops);
    int *fds = calloc(n, sizeof(int));
    int shm = mount ? -1 : open(S.shm, O_RDONLY);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    char buf[4096];
    int64_t t0;
    double r = -1;

    if (!lat || !fds || (!mount && shm < 0))
        goto out;
    for (unsigned i = 0; mount && i < n; i++) {
        char path[300];

        shard_path(i / NSHARDS_B, i % NSHARDS_B, path, sizeof(path));
        fds[i] = open(path, O_RDONLY);
        if (fds[i] < 0)
            goto out;
    }
    t0 = bench_now_ns();
    for (int k = 0; k < ops; k++) {
        uint64_t x = rng(&seed);
        unsigned i = (unsigned)(x % n);
        off_t off = (off_t)((x >> 32) % (SHARD / 4096)) * 4096;
        int64_t a = bench_now_ns();
        ssize_t got = mount ? pread(fds[i], buf, sizeof(buf), off)
                            : pread(shm, buf, sizeof(buf), (off_t)i * SHARD + off);

        if (got != (ssize_t)sizeof(buf))
            goto out;
        lat[k] = (double)(bench_now_ns() - a) / 1000.0;
    }
    r = (double)ops / ((double)(bench_now_ns() - t0) / 1e9);
    *p99 = bench_percentile(lat, (size_t)ops, 99);
    *p50 = bench_percentile(lat, (size_t)ops, 50);
out:
    for (unsigned i = 0; mount && fds && i < n; i++)
        if (fds[i] > 0)
            close(fds[i]);
    if (shm >= 0)
        close(shm);
    free(fds);
    free(lat);
    return r;
}

static double median_of(double (*fn)(bool, uint8_t *), bool mount, uint8_t *buf, int reps)
{
    double v[16];

    for (int i = 0; i < reps; i++) {
        v[i] = fn(mount, buf);
        if (v[i] < 0)
            return -1;
    }
    return bench_median(v, (size_t)reps);
}

static double median_parallel(bool mount, int procs, int reps)
{
    double v[16];

    for (int i = 0; i < reps; i++) {
        v[i] = parallel_gbs(mount, procs);
        if (v[i] < 0)
            return -1;
    }
    return bench_median(v, (size_t)reps);
}

static void cleanup(void)
{
    char cmd[512];

    daemon_stop();
    rmdir(S.fx.mnt);
    unlink(S.shm);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", S.store);
    if (system(cmd) != 0) {
        /* best effort */
    }
}

int main(int argc, char **argv)
{
    struct bench b;
    int reps, ops;
    double cold_raw, cold_fs, res_fs, res_shm, par_fs, par_shm, r_fs, r_shm, open_fs;
    double p50_fs = 0, p99_fs = 0, p50_shm = 0, p99_shm = 0;
    long long loads_cold, pf_cold, pfh_cold;
    int64_t t0;

    if (bench_init(&b, "bench_fs", argc, argv) != 0)
        return 2;
    if (!fsfx_usable()) {
        fprintf(stderr, "bench_fs: no usable /dev/fuse or fusermount3: skipped\n");
        return 77;
    }
    S.nblocks = b.quick ? 2 : 16; /* 32 MiB or 256 MiB */
    reps = b.quick ? 3 : 5;
    ops = b.quick ? 5000 : 50000;
    snprintf(S.store, sizeof(S.store), "/tmp/bench-fs-%d-store", (int)getpid());
    snprintf(S.fx.mnt, sizeof(S.fx.mnt), "/tmp/bench-fs-%d-mnt", (int)getpid());
    snprintf(S.fx.sock, sizeof(S.fx.sock), "/tmp/bench-fs-%d.sock", (int)getpid());
    snprintf(S.shm, sizeof(S.shm), "/dev/shm/bench-fs-%d", (int)getpid());
    S.buf = aligned_alloc(4096, SHARD);
    if (!S.buf || mkdir(S.fx.mnt, 0755) < 0 || make_store() < 0) {
        fprintf(stderr, "bench_fs: setup: %s\n", strerror(errno));
        cleanup();
        return 1;
    }

    /* Cold: raw reads of the store, then a fresh mount that loads each shard. */
    drop_store_cache();
    t0 = bench_now_ns();
    cold_raw =
        (double)read_plain(0, S.nblocks * NSHARDS_B, S.buf, true) / (double)(bench_now_ns() - t0);
    drop_store_cache();
    if (daemon_start() < 0) {
        fprintf(stderr, "bench_fs: the daemon did not mount\n");
        cleanup();
        return 1;
    }
    cold_fs = pass_gbs(true, S.buf);
    loads_cold = fsfx_stat(&S.fx, "shardfs_backend_loads_total");
    pf_cold = fsfx_stat(&S.fx, "shardfs_prefetched_total");
    pfh_cold = fsfx_stat(&S.fx, "shardfs_prefetch_hits_total");

    /* Resident: warm-up passes, then medians. */
    pass_gbs(true, S.buf);
    pass_gbs(false, S.buf);
    res_fs = median_of(pass_gbs, true, S.buf, reps);
    res_shm = median_of(pass_gbs, false, S.buf, reps);
    open_fs = median_of(pass_open_gbs, true, S.buf, reps);
    par_fs = median_parallel(true, 4, reps);
    par_shm = median_parallel(false, 4, reps);
    r_fs = rand4k(true, ops, &p50_fs, &p99_fs);
    r_shm = rand4k(false, ops, &p50_shm, &p99_shm);

    fprintf(b.out, "### FUSE reads (bench_fs)\n\n");
    bench_stamp(&b);
    fprintf(b.out,
            "%u MiB in 1 MiB shards (%u blocks x %d); resident figures are medians of %d "
            "passes after a warm-up; baseline in the same run.\n\n",
            S.nblocks * NSHARDS_B, S.nblocks, NSHARDS_B, reps);
    fprintf(b.out, "| benchmark | shardfs | baseline | ratio | target |\n");
    fprintf(b.out, "|---|---|---|---|---|\n");
    fprintf(b.out,
            "| resident, 1 reader, open + 1 MiB reads to EOF + close per shard | %.2f GB/s | "
            "%.2f GB/s (tmpfs file) | %.2fx | |\n",
            res_fs, res_shm, res_fs / res_shm);
    fprintf(b.out,
            "| resident, 1 reader, files open beforehand, 1 MiB preads | %.2f GB/s | %.2f GB/s "
            "(tmpfs file) | %.2fx | >= 0.8x |\n",
            open_fs, res_shm, open_fs / res_shm);
    fprintf(b.out,
            "| resident, 4 reader processes, aggregate | %.2f GB/s | %.2f GB/s (tmpfs file) | "
            "%.2fx | |\n",
            par_fs, par_shm, par_fs / par_shm);
    fprintf(b.out,
            "| resident, 4 KiB random reads | %.0f /s (p50 %.1f us, p99 %.1f us) | %.0f /s "
            "(p50 %.1f us, p99 %.1f us) | %.2fx | |\n",
            r_fs, p50_fs, p99_fs, r_shm, p50_shm, p99_shm, r_fs / r_shm);
    fprintf(b.out,
            "| cold, 1 reader, through the backend | %.2f GB/s | %.2f GB/s (raw preads of the "
            "store) | %.2fx | |\n\n",
            cold_fs, cold_raw, cold_fs / cold_raw);
    fprintf(b.out,
            "Backend loads for the cold pass: %lld (one per shard: %u), of them started by "
            "the daemon's readahead (default -o readahead=4): %lld, of which already Ready "
            "when read: %lld. Counters after the run: hits %lld, misses %lld, "
            "evictions %lld.\n",
            loads_cold, S.nblocks * NSHARDS_B, pf_cold, pfh_cold,
            fsfx_stat(&S.fx, "shardfs_hits_total"), fsfx_stat(&S.fx, "shardfs_misses_total"),
            fsfx_stat(&S.fx, "shardfs_evictions_total"));
    cleanup();
    free(S.buf);
    return bench_finish(&b);
}
