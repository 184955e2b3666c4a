/* SPDX-License-Identifier: MIT */
/*
 * bench_fs.c - reads through a shardfs mount against the same bytes read
 * without it, and through libfuse's passthrough_ll, in the same run.
 *
 *   bench_fs [--quick] [--md FILE]
 *
 * It writes a store of 1 MiB shards (UCM layout) under /tmp and a copy of
 * every shard as a file of its own in a tmpfs directory (/dev/shm), then
 * mounts four ways of reading the same 256 shards:
 *
 *   tmpfs          the files on tmpfs (the baseline);
 *   passthrough_ll libfuse's example (built from /usr/share/doc/libfuse3-dev
 *                  /examples, not our code) over the tmpfs directory with
 *                  -o cache=never: every read a FUSE request, as ours;
 *   default        shardfs, default options (direct_io);
 *   page_cache     shardfs with -o page_cache (the kernel's page cache
 *                  serves resident shards).
 *
 * Workloads, every one resident (after a warm-up pass per mode): `cat` of
 * all shard files; 1 MiB reads of every shard in order (sequential) and in
 * a random order, by 1 and 4 processes (files opened before the clock
 * starts, fio-style); 4 KiB random reads by one process. Each figure is the
 * median of several passes; the run is repeated and every run's ratio is
 * printed. Then cold reads through a fresh mount against raw reads of the
 * store. Exit 77 when FUSE is not usable here.
 */
#include "bench_util.h"
#include "fsfixture.h"
#include "testutil.h"

#include <shardfs/cache.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef SHARDFS_BIN
#error "SHARDFS_BIN must name the daemon binary"
#endif

#define SHARD     (1u << 20)
#define NSHARDS_B 16 /* shards per block */
#define MAX_JOBS  4

enum mode { M_TMPFS, M_PLL, M_DEF, M_PC, NMODES };

enum wl { W_CAT, W_SEQ1, W_RND1, W_SEQ4, W_RND4, W_4K, NWL };
static const char *wl_name[NWL] = {"`cat` of every shard file",   "1 MiB reads, sequential, 1 job",
                                   "1 MiB reads, random, 1 job",  "1 MiB reads, sequential, 4 jobs",
                                   "1 MiB reads, random, 4 jobs", "4 KiB random reads, 1 job"};

struct setup {
    char store[128], shm[128], pll_mnt[128];
    struct fsfx def, pc; /* the two shardfs daemons */
    pid_t pll;           /* passthrough_ll, or 0 */
    unsigned n;          /* shards */
    int ops4k;           /* 4 KiB reads per pass */
    uint8_t *buf;        /* SHARD bytes, aligned */
    double *lat;         /* shared with the jobs: job 0's latency per read, us */
    double p50;          /* of the last pass of a 1-job workload, us */
};

static struct setup S;

static void path_of(enum mode m, unsigned i, char *out, size_t len)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];

    switch (m) {
    case M_TMPFS:
        snprintf(out, len, "%s/%u", S.shm, i);
        return;
    case M_PLL:
        snprintf(out, len, "%s/%u", S.pll_mnt, i);
        return;
    default:
        tu_block_hex(i / NSHARDS_B, hex);
        snprintf(out, len, "%s/block/%s/shard/%u", m == M_DEF ? S.def.mnt : S.pc.mnt, hex,
                 i % NSHARDS_B);
    }
}

/* Shard s of block b: bytes of one value; the same bytes go to the tmpfs
 * file of its global index. */
static void fill_and_mirror(uint64_t b, uint32_t s, void *buf, size_t len, void *arg)
{
    char path[256];
    bool *failed = arg;
    int fd;

    memset(buf, (int)(b * NSHARDS_B + s), len);
    snprintf(path, sizeof(path), "%s/%u", S.shm, (unsigned)(b * NSHARDS_B + s));
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, buf, len) != (ssize_t)len)
        *failed = true;
    if (fd >= 0)
        close(fd);
}

static int make_store(void)
{
    bool failed = false;
    int r;

    if (mkdir(S.shm, 0755) < 0)
        return -1;
    r = tu_store_write(S.store, 0, S.n / NSHARDS_B, NSHARDS_B, SHARD, fill_and_mirror, &failed,
                       true);
    return r < 0 || failed ? -1 : 0;
}

static void drop_store_cache(void)
{
    char path[256];

    for (unsigned b = 0; b < S.n / NSHARDS_B; b++) {
        int fd;

        tu_store_path(S.store, b, path, sizeof(path));
        fd = open(path, O_RDONLY);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

static int daemon_start(struct fsfx *fx, bool page_cache)
{
    char opts[512];
    uint64_t need = (uint64_t)S.n * SHARD + (64ull << 20);

    /* page_cache may be at most half the capacity, and must hold them all. */
    if (page_cache)
        snprintf(opts, sizeof(opts), "shard_size=1M,capacity=%llu,page_cache=%llu",
                 (unsigned long long)(2 * need), (unsigned long long)need);
    else
        snprintf(opts, sizeof(opts), "shard_size=1M,capacity=%llu", (unsigned long long)need);
    fx->bin = SHARDFS_BIN;
    return fsfx_start(fx, S.store, opts, 20.0, NULL);
}

/* Any file system mounted on mnt (the fixture only knows fuse.shardfs). */
static bool mounted(const char *mnt)
{
    char line[4096], a[1024];
    bool found = false;
    FILE *f = fopen("/proc/self/mountinfo", "re");

    if (!f)
        return false;
    while (!found && fgets(line, sizeof(line), f))
        found = sscanf(line, "%*s %*s %*s %*s %1023s", a) == 1 && strcmp(a, mnt) == 0;
    fclose(f);
    return found;
}

static int pll_start(void)
{
#ifdef PLL_BIN
    char opt[300];

    snprintf(opt, sizeof(opt), "source=%s,cache=never", S.shm);
    mkdir(S.pll_mnt, 0755);
    S.pll = fork();
    if (S.pll < 0)
        return -1;
    if (S.pll == 0) {
        int fd = open("/dev/null", O_RDWR);

        dup2(fd, 1);
        dup2(fd, 2);
        execl(PLL_BIN, "passthrough_ll", "-f", "-o", opt, S.pll_mnt, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {
        if (mounted(S.pll_mnt))
            return 0;
        if (waitpid(S.pll, NULL, WNOHANG) == S.pll) {
            S.pll = 0;
            return -1;
        }
        bench_sleep_ns(50 * 1000 * 1000);
    }
    return -1;
#else
    return -1;
#endif
}

static void pll_stop(void)
{
    char cmd[400];

    if (!S.pll)
        return;
    snprintf(cmd, sizeof(cmd), "fusermount3 -u %s 2>/dev/null || fusermount3 -uz %s", S.pll_mnt,
             S.pll_mnt);
    if (system(cmd) != 0)
        kill(S.pll, SIGTERM);
    waitpid(S.pll, NULL, 0);
    S.pll = 0;
}

/* ---------------------------------------------------------------------------
 * Workloads: each returns its figure for one pass (GB/s; reads/s for 4 KiB),
 * or -1.
 */

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* `cat` of every shard file to /dev/null: one process, as an operator runs it. */
static double run_cat(enum mode m)
{
    char **argv = calloc(S.n + 2, sizeof(char *));
    double r = -1;
    int64_t t0;
    pid_t pid;
    int st;

    if (!argv)
        return -1;
    argv[0] = "cat";
    for (unsigned i = 0; i < S.n; i++) {
        argv[i + 1] = malloc(300);
        if (!argv[i + 1])
            goto out;
        path_of(m, i, argv[i + 1], 300);
    }
    t0 = bench_now_ns();
    pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);

        dup2(fd, 1);
        execvp("cat", argv);
        _exit(127);
    }
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        r = (double)S.n * SHARD / (double)(bench_now_ns() - t0);
out:
    for (unsigned i = 0; i < S.n; i++)
        free(argv[i + 1]);
    free(argv);
    return r;
}

/* One job: open every shard file, say ready, wait for go, then read. */
static int job(enum mode m, enum wl w, unsigned j, unsigned jobs, int rfd, int gfd)
{
    uint8_t *buf = aligned_alloc(4096, SHARD);
    int *fds = calloc(S.n, sizeof(int));
    unsigned *order = calloc(S.n, sizeof(unsigned));
    uint64_t seed = 0x9e3779b97f4a7c15ull * (j + 1);
    char ch = 0;

    if (!buf || !fds || !order)
        return 1;
    for (unsigned i = 0; i < S.n; i++) {
        char path[300];

        path_of(m, i, path, sizeof(path));
        fds[i] = open(path, O_RDONLY);
        if (fds[i] < 0)
            return 2;
        order[i] = (i + j * S.n / jobs) % S.n; /* each job starts elsewhere */
    }
    if (w == W_RND1 || w == W_RND4)
        for (unsigned i = S.n - 1; i > 0; i--) {
            unsigned k = (unsigned)(rng(&seed) % (i + 1)), t = order[i];

            order[i] = order[k];
            order[k] = t;
        }
    if (write(rfd, &ch, 1) != 1 || read(gfd, &ch, 1) != 0)
        return 3;
    if (w == W_4K) {
        for (int k = 0; k < S.ops4k; k++) {
            uint64_t x = rng(&seed);
            unsigned i = (unsigned)(x % S.n);
            off_t off = (off_t)((x >> 32) % (SHARD / 4096)) * 4096;
            int64_t a = bench_now_ns();

            if (pread(fds[i], buf, 4096, off) != 4096)
                return 4;
            if (j == 0)
                S.lat[k] = (double)(bench_now_ns() - a) / 1e3;
        }
    } else {
        for (unsigned i = 0; i < S.n; i++) {
            int64_t a = bench_now_ns();

            if (pread(fds[order[i]], buf, SHARD, 0) != SHARD)
                return 4;
            if (j == 0)
                S.lat[i] = (double)(bench_now_ns() - a) / 1e3;
        }
    }
    return 0;
}

/* The jobs of w run from one go signal (their opens not timed). */
static double run_jobs(enum mode m, enum wl w)
{
    unsigned jobs = (w == W_SEQ4 || w == W_RND4) ? MAX_JOBS : 1;
    int ready[2], go[2], ok = 1;
    pid_t pids[MAX_JOBS];
    int64_t t0;
    char ch;

    if (pipe(ready) < 0 || pipe(go) < 0)
        return -1;
    for (unsigned j = 0; j < jobs; j++) {
        pids[j] = fork();
        if (pids[j] == 0) {
            close(ready[0]);
            close(go[1]);
            _exit(job(m, w, j, jobs, ready[1], go[0]));
        }
    }
    close(ready[1]);
    close(go[0]);
    for (unsigned j = 0; j < jobs; j++)
        if (read(ready[0], &ch, 1) != 1)
            ok = 0;
    t0 = bench_now_ns();
    close(go[1]); /* go */
    for (unsigned j = 0; j < jobs; j++) {
        int st;

        waitpid(pids[j], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    close(ready[0]);
    if (!ok)
        return -1;
    S.p50 = bench_percentile(S.lat, w == W_4K ? (size_t)S.ops4k : S.n, 50);
    if (w == W_4K)
        return (double)S.ops4k / ((double)(bench_now_ns() - t0) / 1e9);
    return (double)S.n * SHARD * jobs / (double)(bench_now_ns() - t0);
}

static double run_wl(enum mode m, enum wl w)
{
    return w == W_CAT ? run_cat(m) : run_jobs(m, w);
}

/* CPU-seconds all CPUs spent busy, from /proc/stat. */
static double cpu_busy_s(void)
{
    unsigned long long u, n, s, idle, io, irq, sirq, st;
    double hz = (double)sysconf(_SC_CLK_TCK), r = 0;
    FILE *f = fopen("/proc/stat", "r");

    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &u, &n, &s, &idle, &io, &irq,
                    &sirq, &st) == 8)
        r = (double)(u + n + s + irq + sirq) / hz;
    if (f)
        fclose(f);
    return r;
}

static void cleanup(void)
{
    char cmd[512];

    pll_stop();
    fsfx_stop(&S.def, true, 10.0);
    fsfx_stop(&S.pc, true, 10.0);
    rmdir(S.def.mnt);
    rmdir(S.pc.mnt);
    rmdir(S.pll_mnt);
    snprintf(cmd, sizeof(cmd), "rm -rf %s %s", S.store, S.shm);
    if (system(cmd) != 0) {
        /* best effort */
    }
}

#define MAX_RUNS 3

int main(int argc, char **argv)
{
    struct bench b;
    static double v[MAX_RUNS][NWL][NMODES], lat[MAX_RUNS][NWL][NMODES];
    double med[NWL][NMODES], medlat[NWL][NMODES], cold_raw, cold_fs, busy0, busy1;
    long long loads_cold, pf_cold, pfh_cold, reads_pc0, reads_pc1, reads_cat;
    int runs, reps;
    int64_t t0, wall0;
    bool have_pll;

    if (bench_init(&b, "bench_fs", argc, argv) != 0)
        return 2;
    if (!fsfx_usable()) {
        fprintf(stderr, "bench_fs: no usable /dev/fuse or fusermount3: skipped\n");
        return 77;
    }
    S.n = b.quick ? 2 * NSHARDS_B : 16 * NSHARDS_B; /* 32 MiB or 256 MiB */
    S.ops4k = b.quick ? 5000 : 20000;
    runs = b.quick ? 1 : MAX_RUNS;
    reps = b.quick ? 1 : 5;
    snprintf(S.store, sizeof(S.store), "/tmp/bench-fs-%d-store", (int)getpid());
    snprintf(S.def.mnt, sizeof(S.def.mnt), "/tmp/bench-fs-%d-mnt", (int)getpid());
    snprintf(S.def.sock, sizeof(S.def.sock), "/tmp/bench-fs-%d.sock", (int)getpid());
    snprintf(S.pc.mnt, sizeof(S.pc.mnt), "/tmp/bench-fs-%d-mnt-pc", (int)getpid());
    snprintf(S.pc.sock, sizeof(S.pc.sock), "/tmp/bench-fs-%d-pc.sock", (int)getpid());
    snprintf(S.pll_mnt, sizeof(S.pll_mnt), "/tmp/bench-fs-%d-mnt-pll", (int)getpid());
    snprintf(S.shm, sizeof(S.shm), "/dev/shm/bench-fs-%d", (int)getpid());
    S.buf = aligned_alloc(4096, SHARD);
    S.lat = mmap(NULL, sizeof(double) * (size_t)(S.ops4k > (int)S.n ? S.ops4k : (int)S.n),
                 PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (S.lat == MAP_FAILED)
        S.lat = NULL;
    if (!S.buf || !S.lat || mkdir(S.def.mnt, 0755) < 0 || mkdir(S.pc.mnt, 0755) < 0 ||
        make_store() < 0) {
        fprintf(stderr, "bench_fs: setup: %s\n", strerror(errno));
        cleanup();
        return 1;
    }

    /* Cold: raw reads of the store, then a fresh mount that loads each shard. */
    drop_store_cache();
    t0 = bench_now_ns();
    {
        long long total = 0;

        for (unsigned i = 0; i < S.n; i++) {
            char path[256];
            int fd;

            tu_store_path(S.store, i / NSHARDS_B, path, sizeof(path));
            fd = open(path, O_RDONLY);
            if (fd >= 0) {
                total += pread(fd, S.buf, SHARD, (off_t)(i % NSHARDS_B) * SHARD);
                close(fd);
            }
        }
        cold_raw = (double)total / (double)(bench_now_ns() - t0);
    }
    drop_store_cache();
    if (daemon_start(&S.def, false) < 0 || daemon_start(&S.pc, true) < 0) {
        fprintf(stderr, "bench_fs: the daemon did not mount\n");
        cleanup();
        return 1;
    }
    cold_fs = run_wl(M_DEF, W_SEQ1);
    loads_cold = fsfx_stat(&S.def, "shardfs_backend_loads_total");
    pf_cold = fsfx_stat(&S.def, "shardfs_prefetched_total");
    pfh_cold = fsfx_stat(&S.def, "shardfs_prefetch_hits_total");
    have_pll = pll_start() == 0;
    if (!have_pll)
        fprintf(stderr, "bench_fs: passthrough_ll not available: its column is empty\n");

    /* Warm-up: every mode reads everything once (page_cache: fills it). */
    for (int m = 0; m < NMODES; m++)
        if (m != M_PLL || have_pll)
            run_wl((enum mode)m, W_SEQ1);

    wall0 = bench_now_ns();
    busy0 = cpu_busy_s();
    reads_pc0 = fsfx_stat(&S.pc, "shardfs_fs_reads_total");
    for (int r = 0; r < runs; r++)
        for (int w = 0; w < NWL; w++)
            for (int m = 0; m < NMODES; m++) {
                double x[8], y[8];

                v[r][w][m] = lat[r][w][m] = -1;
                if (m == M_PLL && !have_pll)
                    continue;
                for (int k = 0; k < reps; k++) {
                    x[k] = run_wl((enum mode)m, (enum wl)w);
                    y[k] = S.p50;
                }
                v[r][w][m] = bench_median(x, (size_t)reps);
                lat[r][w][m] = bench_median(y, (size_t)reps);
            }
    reads_pc1 = fsfx_stat(&S.pc, "shardfs_fs_reads_total");
    busy1 = cpu_busy_s();
    /* What one `cat` costs the default mode in read requests. */
    reads_cat = fsfx_stat(&S.def, "shardfs_fs_reads_total");
    run_cat(M_DEF);
    reads_cat = fsfx_stat(&S.def, "shardfs_fs_reads_total") - reads_cat;
    for (int w = 0; w < NWL; w++)
        for (int m = 0; m < NMODES; m++) {
            double x[MAX_RUNS], y[MAX_RUNS];

            for (int r = 0; r < runs; r++) {
                x[r] = v[r][w][m];
                y[r] = lat[r][w][m];
            }
            med[w][m] = bench_median(x, (size_t)runs);
            medlat[w][m] = bench_median(y, (size_t)runs);
        }

    fprintf(b.out, "### FUSE reads (bench_fs)\n\n");
    bench_stamp(&b);
    fprintf(b.out,
            "%u MiB in 1 MiB shards (%u blocks x %d), resident. Four ways to the same bytes: "
            "the shards as files on tmpfs (baseline), libfuse's `passthrough_ll -o "
            "cache=never` over that tmpfs directory, shardfs in the default mode, shardfs "
            "with `-o page_cache`. Each figure: median of %d passes after a warm-up pass; %d "
            "runs, every mode interleaved within a run; the ratios of each run are listed "
            "(median first). 1 MiB jobs open their files before the clock starts and read "
            "every shard once (sequential: in order, each job from its own start; random: a "
            "shuffled order); %d 4 KiB reads per pass at random shards and offsets.\n\n",
            S.n, S.n / NSHARDS_B, NSHARDS_B, reps, runs, S.ops4k);
    fprintf(b.out, "| workload | tmpfs | passthrough_ll | shardfs default | shardfs page_cache "
                   "| default / tmpfs | default / passthrough_ll | page_cache / tmpfs |\n");
    fprintf(b.out, "|---|---|---|---|---|---|---|---|\n");
    for (int w = 0; w < NWL; w++) {
        const char *unit = w == W_4K ? "k/s" : "GB/s";
        double scale = w == W_4K ? 1e-3 : 1;
        const int cols[3][2] = {{M_DEF, M_TMPFS}, {M_DEF, M_PLL}, {M_PC, M_TMPFS}};

        fprintf(b.out, "| %s |", wl_name[w]);
        for (int m = 0; m < NMODES; m++) {
            if (med[w][m] < 0)
                fprintf(b.out, " - |");
            else
                fprintf(b.out, " %.*f %s |", w == W_4K ? 0 : 2, med[w][m] * scale, unit);
        }
        for (int c = 0; c < 3; c++) {
            int a = cols[c][0], z = cols[c][1];
            double x[MAX_RUNS];

            if (med[w][a] < 0 || med[w][z] < 0) {
                fprintf(b.out, " - |");
                continue;
            }
            for (int r = 0; r < runs; r++)
                x[r] = v[r][w][a] / v[r][w][z];
            fprintf(b.out, " **%.2fx**", med[w][a] / med[w][z]);
            if (runs > 1) {
                fprintf(b.out, " (");
                for (int r = 0; r < runs; r++)
                    fprintf(b.out, "%s%.2f", r ? ", " : "", x[r]);
                fprintf(b.out, ")");
            }
            fprintf(b.out, " |");
        }
        fprintf(b.out, "\n");
    }
    fprintf(b.out,
            "| cold, 1 MiB reads, 1 job, through the backend (default mode) | %.2f GB/s (raw "
            "preads of the store) | | %.2f GB/s | | %.2fx | | |\n\n",
            cold_raw, cold_fs, cold_fs / cold_raw);

    fprintf(b.out,
            "Per-read latency of the 1-job workloads, p50 over every read of a pass (median "
            "of passes and runs; a ratio above 1 is faster than the baseline): what the read "
            "path costs when it runs, less moved than throughput by other work on the "
            "machine preempting a pass.\n\n");
    fprintf(b.out, "| workload | tmpfs p50 | passthrough_ll p50 | default p50 | page_cache p50 | "
                   "tmpfs / default | passthrough_ll / default | tmpfs / page_cache |\n");
    fprintf(b.out, "|---|---|---|---|---|---|---|---|\n");
    for (int w = W_SEQ1; w < NWL; w++) {
        if (w == W_SEQ4 || w == W_RND4)
            continue;
        fprintf(b.out, "| %s |", wl_name[w]);
        for (int m = 0; m < NMODES; m++) {
            if (medlat[w][m] < 0)
                fprintf(b.out, " - |");
            else
                fprintf(b.out, " %.1f us |", medlat[w][m]);
        }
        fprintf(b.out, " %.2fx | ", medlat[w][M_TMPFS] / medlat[w][M_DEF]);
        if (medlat[w][M_PLL] > 0)
            fprintf(b.out, "%.2fx |", medlat[w][M_PLL] / medlat[w][M_DEF]);
        else
            fprintf(b.out, "- |");
        fprintf(b.out, " %.2fx |\n", medlat[w][M_TMPFS] / medlat[w][M_PC]);
    }
    fprintf(b.out, "\n");
    fprintf(b.out, "| target | figure (median of runs) | met |\n");
    fprintf(b.out, "|---|---|---|\n");
    {
        double c_def = med[W_CAT][M_DEF] / med[W_CAT][M_TMPFS];
        double c_pc = med[W_CAT][M_PC] / med[W_CAT][M_TMPFS];
        double lo_def = 1e9, lo_pc = 1e9;

        for (int w = W_SEQ1; w <= W_RND4; w++) {
            double d = med[w][M_DEF] / med[w][M_TMPFS], p = med[w][M_PC] / med[w][M_TMPFS];

            lo_def = d < lo_def ? d : lo_def;
            lo_pc = p < lo_pc ? p : lo_pc;
        }
        fprintf(b.out,
                "| `cat` of all shards >= 0.8x tmpfs | default %.2fx, page_cache %.2fx | "
                "default %s, page_cache %s |\n",
                c_def, c_pc, c_def >= 0.8 ? "yes" : "**no**", c_pc >= 0.8 ? "yes" : "**no**");
        fprintf(b.out,
                "| 1 MiB reads (seq/random, 1 and 4 jobs) >= 0.8x tmpfs | lowest of the four: "
                "default %.2fx, page_cache %.2fx | default %s, page_cache %s |\n",
                lo_def, lo_pc, lo_def >= 0.8 ? "yes" : "**no**", lo_pc >= 0.8 ? "yes" : "**no**");
        if (med[W_4K][M_PLL] > 0) {
            double p = med[W_4K][M_DEF] / med[W_4K][M_PLL];

            fprintf(b.out,
                    "| 4 KiB random, default mode >= 1.0x passthrough_ll cache=never | %.2fx "
                    "(p50 latency: %.2fx) | %s |\n",
                    p, medlat[W_4K][M_PLL] / medlat[W_4K][M_DEF], p >= 1.0 ? "yes" : "**no**");
        }
        fprintf(b.out, "| 4 KiB random, page_cache mode >= 0.8x tmpfs | %.2fx | %s |\n\n",
                med[W_4K][M_PC] / med[W_4K][M_TMPFS],
                med[W_4K][M_PC] / med[W_4K][M_TMPFS] >= 0.8 ? "yes" : "**no**");
    }
    fprintf(b.out,
            "`cat` in the default mode made %.1f read requests per shard file (1 MiB at "
            "st_blksize = 128 KiB, and the read at the end of the file that finds it: "
            "direct_io reads do not stop at the size), besides its LOOKUP (entries live 1 s), "
            "OPEN and RELEASE; tmpfs makes none, the page_cache mode none once cached. "
            "The page_cache mount answered %lld FUSE reads during the measured runs (the "
            "kernel's page cache served the rest). Backend loads for the cold pass: %lld (one "
            "per shard: %u), of them started by the daemon's readahead (default -o "
            "readahead=4): %lld, of which already Ready when read: %lld. During the measured "
            "runs (%.0f s, %ld CPUs) the machine's CPUs were busy %.1f CPU-s (this benchmark "
            "and everything else).\n\n",
            (double)reads_cat / S.n, reads_pc1 - reads_pc0, loads_cold, S.n, pf_cold, pfh_cold,
            (double)(bench_now_ns() - wall0) / 1e9, sysconf(_SC_NPROCESSORS_ONLN), busy1 - busy0);
    fprintf(b.out, "Command: `build/tests/bench/bench_fs --md docs/PERFORMANCE.md`\n");
    cleanup();
    free(S.buf);
    munmap(S.lat, sizeof(double) * (size_t)(S.ops4k > (int)S.n ? S.ops4k : (int)S.n));
    return bench_finish(&b);
}
