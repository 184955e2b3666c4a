/* SPDX-License-Identifier: MIT */
/*
 * bench_cold.c - cold loads with the DEFAULT posix spec: N rank processes
 * loading the same keys through the cache, against N processes each reading
 * those keys themselves, in the same run (docs/PERFORMANCE.md's cold-load target).
 *
 *   bench_cold [--quick] [--md FILE] [--dir DIR] [--reps R] [--mib M]
 *              [--hugepages N]
 *
 * The store (UCM layout, 256 KiB shards, 4 shards per block file; 512 MiB,
 * 64 MiB with --quick) is written to a disk file system (default /var/tmp;
 * its type and device are printed: on tmpfs the figures mean nothing).
 * For N = 2 and 4, every round runs these passes in a rotating order, each
 * cold (keys removed from the cache, `sync`, 3 written to
 * /proc/sys/vm/drop_caches, POSIX_FADV_DONTNEED on every block file):
 *
 *   shardfs   N forked ranks, backend `posix:DIR` (the default spec), host
 *             copier, each loads one task of every key into its own buffer;
 *             each key is loaded from the store once, by its owner.
 *   sync-open the same with SHARDFS_POSIX_SYNC_OPEN=1 in the ranks: block
 *             files opened in the submitter (the old path), not as OPENAT2
 *             ops of the ring. A baseline switch: the ranks run
 *             libshardfs-rank-bench, the product library's sources and
 *             compiler flags plus the baseline switches, no test hooks and
 *             no debug checks (tests/bench/CMakeLists.txt).
 *   direct=0  the same ranks with `posix:DIR?direct=0`: buffered reads (what
 *             a file system without O_DIRECT gets).
 *   pread     N forked processes, each: for every block file open, pread(2)
 *             each shard (buffered), close; one thread.
 *   odirect8  N forked processes, each: 8 threads taking block files in turn,
 *             open O_DIRECT, pread each shard, close.
 *
 * and then two warm passes (keys removed from the cache only: dentries and
 * inodes cached, the page cache as the pread pass left it) of shardfs and
 * sync-open, for the open path's cost where the open does not wait on the
 * disk.
 *
 * Wall time of a pass: the first process's start to the last one's end (the
 * processes are started, their buffers touched, then released together).
 * CPU: getrusage of each process over its pass (all its threads), median
 * over processes and rounds. Device bytes: sectors read from the store's
 * disk (/sys/dev/block/M:m/stat) during the pass, over the store's size.
 * Every shard's first 16 bytes name its key and are checked in every
 * process after every pass. Ranks live for a whole N (one warm-up pass
 * each first, untimed: it faults the data plane into the ranks).
 *
 * --shared (section bench_shared; docs/shared-store.md): the store on a GlusterFS
 * volume (tests/glusterfx.c: a loopback brick under /tmp, mounted twice,
 * two "hosts", each with its own cache and N ranks; 128 MiB, 8 with
 * --quick). Each round: host A's N ranks load every key cold through mount
 * a, and at once after them host B's N ranks load the same keys through
 * mount b into B's own empty cache (what the first host loaded); against
 * the pread and O_DIRECT x8 passes above through mount a, cold, in the same
 * round (order rotating). Exit 77, saying why, where GlusterFS cannot run;
 * the volume and its mounts are removed at exit, on every path (a signal
 * too).
 */
#include "bench_util.h"
#include "testutil.h"
#ifdef BENCH_GLUSTER
#include "fsfixture.h"
#include "glusterfx.h"
#endif

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <fcntl.h>
#include <ftw.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

#define SHARD            (256u << 10)
#define SHARDS_PER_BLOCK BENCH_SHARDS_PER_BLOCK
#define MAXN             4
#define MAXREPS          16
#define OD_THREADS       8

static struct {
    const char *dir;
    int reps;
    uint64_t total;
    long hugepages;
    bool shared;
} O = {.reps = 5};

static char dev_sys[128];

/* --- the store --- */

static bool check_all(const struct bench_store *st, const uint8_t *dst)
{
    for (uint32_t i = 0; i < st->nkeys; i++)
        if (!bench_key_ok(dst + (size_t)i * SHARD, i / SHARDS_PER_BLOCK, i % SHARDS_PER_BLOCK))
            return false;
    return true;
}

static uint64_t dev_read_bytes(void)
{
    unsigned long long ios = 0, merges = 0, sectors = 0;
    char p[160];
    FILE *f;

    snprintf(p, sizeof(p), "%s/stat", dev_sys);
    f = fopen(p, "r");
    if (!f)
        return 0;
    if (fscanf(f, "%llu %llu %llu", &ios, &merges, &sectors) != 3)
        sectors = 0;
    fclose(f);
    return sectors * 512;
}

/* --- processes: what each one reports, in shared memory --- */

struct pres {
    int rc;
    int64_t t0, t1, cpu_ns;
    uint64_t owner;
};

struct shared {
    struct pres r[MAXN];
};

static uint8_t *touch_buf(size_t bytes)
{
    uint8_t *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

/* A rank: waits for 'r', loads every key, reports, until 'q'. */
static int rank_main(const struct bench_store *st, const char *sock, int r, int N, bool sync_open,
                     bool buffered, struct pres *res, int cmd_r, int done_w)
{
    struct sfs_rank_config cfg;
    char spec[700];
    size_t bytes = (size_t)st->nkeys * SHARD;
    uint8_t *dst = touch_buf(bytes);
    struct sfs_rank_entry *e = calloc(st->nkeys, sizeof(*e));
    int *status = calloc(st->nkeys, sizeof(*status));
    struct sfs_rank *rk;
    int err = 0;
    char c;

    if (!dst || !e || !status)
        return 2;
    if (sync_open)
        setenv("SHARDFS_POSIX_SYNC_OPEN", "1", 1);
    snprintf(spec, sizeof(spec), "posix:%s%s", st->dir, buffered ? "?direct=0" : "");
    bench_rank_config(&cfg, sock, r, N, spec);
    rk = sfs_rank_open(&cfg, &err);
    if (!rk) {
        fprintf(stderr, "bench_cold: rank %d: sfs_rank_open: %s\n", r, strerror(-err));
        return 3;
    }
    bench_store_entries(st, dst, e);
    if (write(done_w, "o", 1) != 1)
        return 4;
    while (read(cmd_r, &c, 1) == 1 && c == 'r') {
        struct bench_rank_run run;
        int rc = bench_rank_load_all(rk, e, st->nkeys, dst, SHARD, status, &run);

        res->t0 = run.t0;
        res->t1 = run.t1;
        res->cpu_ns = run.cpu_ns;
        for (uint32_t i = 0; rc == 0 && i < st->nkeys; i++)
            if (status[i] != 0)
                rc = 6;
        if (rc == 0 && !check_all(st, dst))
            rc = 7;
        res->owner = run.s1.owner_loads - run.s0.owner_loads;
        res->rc = rc;
        if (write(done_w, "d", 1) != 1)
            break;
    }
    sfs_rank_close(rk);
    return 0;
}

/* odirect8: threads take block files in turn. */
struct od {
    const struct bench_store *st;
    uint8_t *dst;
    atomic_uint next;
    atomic_int err;
};

static void *od_main(void *arg)
{
    struct od *o = arg;
    unsigned b;

    /* Relaxed: a work counter; the bytes are read after pthread_join. */
    while ((b = atomic_fetch_add_explicit(&o->next, 1, memory_order_relaxed)) < o->st->nblocks) {
        int fd = open(o->st->paths[b], O_RDONLY | O_DIRECT | O_CLOEXEC);

        if (fd < 0) {
            atomic_store_explicit(&o->err, errno, memory_order_relaxed);
            continue;
        }
        for (uint32_t s = 0; s < SHARDS_PER_BLOCK; s++) {
            size_t k = (size_t)b * SHARDS_PER_BLOCK + s;

            if (pread(fd, o->dst + k * SHARD, SHARD, (off_t)s * SHARD) != (ssize_t)SHARD)
                atomic_store_explicit(&o->err, EIO, memory_order_relaxed);
        }
        close(fd);
    }
    return NULL;
}

/* A baseline process: touches its buffer, says 'o', waits for 'r', reads. */
static int base_main(const struct bench_store *st, bool direct, struct pres *res, int cmd_r, int done_w)
{
    size_t bytes = (size_t)st->nkeys * SHARD;
    uint8_t *dst = touch_buf(bytes);
    char c;

    if (!dst)
        return 2;
    if (write(done_w, "o", 1) != 1 || read(cmd_r, &c, 1) != 1)
        return 4;
    int64_t c0 = bench_rusage_cpu_ns(RUSAGE_SELF);
    res->t0 = bench_now_ns();
    if (direct) {
        struct od o = {.st = st, .dst = dst};
        pthread_t th[OD_THREADS];

        atomic_init(&o.next, 0);
        atomic_init(&o.err, 0);
        for (int i = 0; i < OD_THREADS; i++)
            pthread_create(&th[i], NULL, od_main, &o);
        for (int i = 0; i < OD_THREADS; i++)
            pthread_join(th[i], NULL);
        res->rc = atomic_load(&o.err) ? 8 : 0;
    } else {
        for (uint32_t b = 0; b < st->nblocks && res->rc == 0; b++) {
            int fd = open(st->paths[b], O_RDONLY | O_CLOEXEC);

            if (fd < 0) {
                res->rc = 8;
                break;
            }
            for (uint32_t s = 0; s < SHARDS_PER_BLOCK; s++) {
                size_t k = (size_t)b * SHARDS_PER_BLOCK + s;

                if (pread(fd, dst + k * SHARD, SHARD, (off_t)s * SHARD) != (ssize_t)SHARD)
                    res->rc = 9;
            }
            close(fd);
        }
    }
    res->t1 = bench_now_ns();
    res->cpu_ns = bench_rusage_cpu_ns(RUSAGE_SELF) - c0;
    if (res->rc == 0 && !check_all(st, dst))
        res->rc = 7;
    return write(done_w, "d", 1) == 1 ? 0 : 4;
}

enum kind { K_SFS, K_SYNC, K_BUF, K_PREAD, K_OD8, K_N };
#define K_RANKS K_BUF /* the last kind that is ranks */
static const char *kind_name[K_N] = {"shardfs (default spec)", "shardfs, sync open",
                                     "shardfs `direct=0` (buffered)", "per-process pread",
                                     "per-process O_DIRECT, 8 threads"};

static void spawn(const struct bench_store *st, const char *sock, enum kind k, int N, struct shared *sh,
                  struct bench_child *ch)
{
    for (int r = 0; r < N; r++) {
        int cmd_r, done_w;

        if (!bench_child_fork(&ch[r], &cmd_r, &done_w))
            continue;
        if (k <= K_RANKS)
            _exit(rank_main(st, sock, r, N, k == K_SYNC, k == K_BUF, &sh->r[r], cmd_r, done_w));
        _exit(base_main(st, k == K_OD8, &sh->r[r], cmd_r, done_w));
    }
}

struct pass {
    double wall_ms, cpu_ms, dev; /* cpu: median per process; dev: device bytes / store */
    uint64_t owner;
};

/* One pass of N processes: release them together, collect. */
static void run_pass(const struct bench_store *st, int N, struct shared *sh, struct bench_child *ch,
                     struct pass *out)
{
    int64_t t0 = INT64_MAX, t1 = 0;
    double cpu[MAXN];
    uint64_t d0 = dev_read_bytes();

    memset(sh, 0, sizeof(*sh));
    memset(out, 0, sizeof(*out));
    bench_children_send(N, ch, 'r');
    for (int r = 0; r < N; r++) {
        struct pres *p = &sh->r[r];

        bench_child_done(&ch[r], r, &p->rc);
        t0 = p->t0 < t0 ? p->t0 : t0;
        t1 = p->t1 > t1 ? p->t1 : t1;
        cpu[r] = (double)p->cpu_ns / 1e6;
        out->owner += p->owner;
    }
    out->dev = (double)(dev_read_bytes() - d0) / ((double)st->nkeys * SHARD);
    out->wall_ms = (double)(t1 - t0) / 1e6;
    out->cpu_ms = bench_median(cpu, (size_t)N);
}

static double med(const double *v, int n)
{
    double t[MAXREPS];

    memcpy(t, v, (size_t)n * sizeof(*t));
    return bench_median(t, (size_t)n);
}

static double maxof(const double *v, int n)
{
    double m = v[0];

    for (int i = 1; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

static double minof(const double *v, int n)
{
    double m = v[0];

    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static void bench_n(struct bench *b, struct sfs_cache *c, const struct bench_store *st, const char *sock,
                    int N, FILE *open_tab)
{
    struct shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct bench_child rk[K_RANKS + 1][MAXN];
    double wall[K_N][MAXREPS], cpu[K_N][MAXREPS], dev[K_N][MAXREPS];
    double rp[MAXREPS], rd[MAXREPS], rs[MAXREPS], warm[2][MAXREPS], wcpu[2][MAXREPS];
    struct pass p;

    if (sh == MAP_FAILED)
        bench_die("mmap", errno);
    for (int k = K_SFS; k <= K_RANKS; k++) {
        spawn(st, sock, (enum kind)k, N, sh, rk[k]);
        sfs_cache_foreach(c, ~0u, bench_drop_key, c);
        run_pass(st, N, sh, rk[k], &p); /* warm-up, untimed */
    }
    for (int rep = 0; rep < O.reps; rep++) {
        for (int i = 0; i < K_N; i++) {
            enum kind k = (enum kind)((i + rep) % K_N);
            struct bench_child bch[MAXN];

            if (k == K_PREAD || k == K_OD8)
                spawn(st, sock, k, N, sh, bch);
            sfs_cache_foreach(c, ~0u, bench_drop_key, c);
            bench_drop_page_cache(st->paths, st->nblocks);
            run_pass(st, N, sh, k <= K_RANKS ? rk[k] : bch, &p);
            if (k == K_PREAD || k == K_OD8)
                bench_children_stop(N, bch);
            wall[k][rep] = p.wall_ms;
            cpu[k][rep] = p.cpu_ms;
            dev[k][rep] = p.dev;
            if (k <= K_RANKS && p.owner != st->nkeys)
                fprintf(stderr, "bench_cold: N=%d: %llu owner loads for %u keys\n", N,
                        (unsigned long long)p.owner, st->nkeys);
        }
        for (int k = K_SFS; k <= K_SYNC; k++) {
            sfs_cache_foreach(c, ~0u, bench_drop_key, c);
            run_pass(st, N, sh, rk[k], &p);
            warm[k][rep] = p.wall_ms;
            wcpu[k][rep] = p.cpu_ms;
        }
        rp[rep] = wall[K_SFS][rep] / wall[K_PREAD][rep];
        rd[rep] = wall[K_SFS][rep] / wall[K_OD8][rep];
        rs[rep] = wall[K_SFS][rep] / wall[K_SYNC][rep];
        fprintf(stderr,
                "bench_cold: N=%d round %d: shardfs %.0f ms, sync-open %.0f, pread %.0f, "
                "odirect8 %.0f, direct=0 %.0f (vs pread %.2fx, vs odirect8 %.2fx); warm %.0f / "
                "%.0f ms\n",
                N, rep, wall[K_SFS][rep], wall[K_SYNC][rep], wall[K_PREAD][rep], wall[K_OD8][rep],
                wall[K_BUF][rep], rp[rep], rd[rep], warm[0][rep], warm[1][rep]);
    }
    for (int k = K_SFS; k <= K_RANKS; k++)
        bench_children_stop(N, rk[k]);
    munmap(sh, sizeof(*sh));

    for (int k = 0; k < K_N; k++) {
        double mb = (double)st->nkeys * SHARD / (1 << 20);

        fprintf(b->out, "| %d | %s | %.0f | %.0f | %.2f | ", N, kind_name[k], med(wall[k], O.reps),
                maxof(wall[k], O.reps), mb / med(wall[k], O.reps) * 1000 / 1024);
        if (k == K_SFS)
            fprintf(b->out, "%.2fx (max %.2fx) | %.2fx (max %.2fx) | ", med(rp, O.reps),
                    maxof(rp, O.reps), med(rd, O.reps), maxof(rd, O.reps));
        else
            fprintf(b->out, "%.2fx | %.2fx | ", med(wall[k], O.reps) / med(wall[K_PREAD], O.reps),
                    med(wall[k], O.reps) / med(wall[K_OD8], O.reps));
        fprintf(b->out, "%.2f (%.2f..%.2f) | %.0f |\n", med(dev[k], O.reps), minof(dev[k], O.reps),
                maxof(dev[k], O.reps), med(cpu[k], O.reps));
    }
    fprintf(open_tab,
            "| %d | %.0f | %.0f | %.2fx (%.2f..%.2f) | %.0f / %.0f | %.0f | %.0f | %.2fx | "
            "%.0f / %.0f |\n",
            N, med(wall[K_SFS], O.reps), med(wall[K_SYNC], O.reps), med(rs, O.reps),
            minof(rs, O.reps), maxof(rs, O.reps), med(cpu[K_SFS], O.reps), med(cpu[K_SYNC], O.reps),
            med(warm[0], O.reps), med(warm[1], O.reps), med(warm[0], O.reps) / med(warm[1], O.reps),
            med(wcpu[0], O.reps), med(wcpu[1], O.reps));
    fflush(b->out);
}

#ifdef BENCH_GLUSTER
/* --- --shared: two hosts on one GlusterFS volume --- */

static struct glfx G = {.lock_fd = -1};
static pid_t G_owner; /* the process that made the volume: it alone removes it */

static void gl_cleanup(void)
{
    if (G_owner && getpid() == G_owner)
        glfx_down(&G);
}

/* Not async-signal-safe (glfx_down runs system(3)), but the run ends here
 * and a volume left behind would outlive it. */
static void gl_signal(int sig)
{
    gl_cleanup();
    bench_hp_signal(sig);
}

/* The first line of a command's output, into out (empty when none). */
static void sh_line(const char *cmd, char *out, size_t len)
{
    FILE *f = popen(cmd, "r");

    out[0] = '\0';
    if (!f)
        return;
    if (!fgets(out, (int)len, f))
        out[0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    pclose(f);
}

enum spass { S_A, S_B, S_PREAD, S_OD8, S_N };
static const char *spass_name[S_N] = {
    "host A: shardfs, N ranks (cold)", "host B: shardfs, N ranks, after host A (B's cache empty)",
    "host A: per-process pread", "host A: per-process O_DIRECT, 8 threads"};

/* One N: host A's and B's ranks live for all rounds; each round runs the
 * two hosts' loads back to back and the two raw passes, order rotating. */
static void shared_n(struct bench *b, struct sfs_cache *const c[2], const struct bench_store *st,
                     const char *const sock[2], int N)
{
    struct shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    struct bench_child rk[2][MAXN];
    double wall[S_N][MAXREPS], cpu[S_N][MAXREPS], dev[S_N][MAXREPS], own[2][MAXREPS];
    double rp[MAXREPS], rd[MAXREPS], rab[MAXREPS];
    double mb = (double)st[0].nkeys * SHARD / (1 << 20);
    struct pass p;

    if (sh == MAP_FAILED)
        bench_die("mmap", errno);
    for (int h = 0; h < 2; h++) {
        spawn(&st[h], sock[h], K_SFS, N, sh, rk[h]);
        sfs_cache_foreach(c[h], ~0u, bench_drop_key, c[h]);
        run_pass(&st[h], N, sh, rk[h], &p); /* warm-up, untimed */
    }
    for (int rep = 0; rep < O.reps; rep++) {
        for (int i = 0; i < 3; i++) {
            int which = (i + rep) % 3;
            struct bench_child bch[MAXN];

            for (int h = 0; h < 2; h++) {
                sfs_cache_foreach(c[h], ~0u, bench_drop_key, c[h]);
                bench_drop_page_cache(st[h].paths, st[h].nblocks);
            }
            if (which == 0) {
                for (int h = 0; h < 2; h++) {
                    run_pass(&st[h], N, sh, rk[h], &p);
                    wall[S_A + h][rep] = p.wall_ms;
                    cpu[S_A + h][rep] = p.cpu_ms;
                    dev[S_A + h][rep] = p.dev;
                    own[h][rep] = (double)p.owner / st[h].nkeys;
                }
                continue;
            }
            spawn(&st[0], sock[0], which == 1 ? K_PREAD : K_OD8, N, sh, bch);
            run_pass(&st[0], N, sh, bch, &p);
            bench_children_stop(N, bch);
            wall[which == 1 ? S_PREAD : S_OD8][rep] = p.wall_ms;
            cpu[which == 1 ? S_PREAD : S_OD8][rep] = p.cpu_ms;
            dev[which == 1 ? S_PREAD : S_OD8][rep] = p.dev;
        }
        /* Throughput ratios: the baseline's wall over shardfs's. */
        rp[rep] = wall[S_PREAD][rep] / wall[S_A][rep];
        rd[rep] = wall[S_OD8][rep] / wall[S_A][rep];
        rab[rep] = wall[S_A][rep] / wall[S_B][rep];
        fprintf(stderr,
                "bench_shared: N=%d round %d: host A %.0f ms, host B %.0f ms, pread %.0f, "
                "odirect8 %.0f (A vs pread %.2fx, vs odirect8 %.2fx, B vs A %.2fx)\n",
                N, rep, wall[S_A][rep], wall[S_B][rep], wall[S_PREAD][rep], wall[S_OD8][rep],
                rp[rep], rd[rep], rab[rep]);
    }
    for (int h = 0; h < 2; h++)
        bench_children_stop(N, rk[h]);
    munmap(sh, sizeof(*sh));

    for (int k = 0; k < S_N; k++) {
        double m = med(wall[k], O.reps);

        fprintf(b->out, "| %d | %s | %.0f | %.0f | %.2f | ", N, spass_name[k], m,
                maxof(wall[k], O.reps), mb / m * 1000 / 1024);
        if (k == S_A)
            fprintf(b->out, "**%.2fx** (worst %.2fx) | %.2fx (worst %.2fx) | ", med(rp, O.reps),
                    minof(rp, O.reps), med(rd, O.reps), minof(rd, O.reps));
        else
            fprintf(b->out, "%.2fx | %.2fx | ", med(wall[S_PREAD], O.reps) / m,
                    med(wall[S_OD8], O.reps) / m);
        if (k <= S_B)
            fprintf(b->out, "%.2f | ", med(own[k], O.reps));
        else
            fprintf(b->out, "%d (each process) | ", N);
        fprintf(b->out, "%.2f (%.2f..%.2f) | %.0f |\n", med(dev[k], O.reps), minof(dev[k], O.reps),
                maxof(dev[k], O.reps), med(cpu[k], O.reps));
    }
    fprintf(stderr, "bench_shared: N=%d: host B / host A throughput %.2fx (%.2f..%.2f)\n", N,
            med(rab, O.reps), minof(rab, O.reps), maxof(rab, O.reps));
    fflush(b->out);
}

static int shared_main(struct bench *b)
{
    char why[300], line[256], gver[128], sockp[2][128], storedir[300];
    struct bench_store st[2];
    struct sfs_cache *c[2];
    const char *sock[2] = {sockp[0], sockp[1]};
    struct sfs_cache_info info;
    struct stat sb;
    int r;

    memset(st, 0, sizeof(st));
    G_owner = getpid();
    atexit(gl_cleanup);
    signal(SIGINT, gl_signal);
    signal(SIGTERM, gl_signal);
    signal(SIGHUP, gl_signal);
    r = glfx_up(&G, 1, why, sizeof(why));
    if (r == -1) {
        fprintf(stderr, "bench_shared: skipped: GlusterFS: %s\n", why);
        return 77;
    }
    if (r < 0)
        bench_die(why, EIO);
    /* Device bytes: the brick's disk. */
    snprintf(storedir, sizeof(storedir), "%s/brick", G.work);
    if (stat(storedir, &sb) < 0)
        bench_die(storedir, errno);
    snprintf(dev_sys, sizeof(dev_sys), "/sys/dev/block/%u:%u", major(sb.st_dev), minor(sb.st_dev));

    snprintf(storedir, sizeof(storedir), "%s/store", glfx_mount(&G, 0));
    bench_store_write(&st[0], storedir, SHARD, O.total);
    st[1] = st[0];
    snprintf(st[1].dir, sizeof(st[1].dir), "%s/store", glfx_mount(&G, 1));
    st[1].paths = calloc(st[1].nblocks, sizeof(*st[1].paths));
    if (!st[1].paths)
        bench_die("calloc", ENOMEM);
    for (uint32_t i = 0; i < st[1].nblocks; i++)
        tu_store_path(st[1].dir, i, st[1].paths[i], sizeof(st[1].paths[i]));
    fsfx_sleep_ms(1500); /* host b's lookup caches: the visibility bound */
    for (int h = 0; h < 2; h++) {
        snprintf(sockp[h], sizeof(sockp[h]), "/tmp/bench-shared-%d-%c.sock", (int)getpid(),
                 "ab"[h]);
        c[h] = bench_served_cache(SHARD, st[h].nkeys, sock[h]);
    }
    sfs_cache_info(c[0], &info);
    sh_line("glusterfs --version 2>/dev/null", gver, sizeof(gver));
    snprintf(why, sizeof(why),
             "gluster volume get %s all 2>/dev/null | awk '$1 ~ "
             "/^performance\\.(io-cache|read-ahead|quick-read)$/ {printf \"%%s=%%s \", $1, $2}'",
             G.vol);
    sh_line(why, line, sizeof(line));

    fprintf(b->out, "## Two hosts on one GlusterFS store (`bench_cold --shared`)\n\n");
    bench_stamp(b);
    fprintf(b->out,
            "Store: %lu MiB of 256 KiB shards (blocks of %u shards, UCM layout) on a GlusterFS "
            "volume (%s; one brick on this host's disk, under /tmp; volume options %s) mounted "
            "twice by its FUSE client: two \"hosts\", A and B, each with its own cache (data "
            "plane on %s) and N forked ranks (backend `posix:MOUNT/store`, the default spec: "
            "O_DIRECT, which GlusterFS's client accepts; host copier), each rank loading every "
            "key into its own buffer. Each round: caches emptied, `sync`, `drop_caches` = 3, "
            "`POSIX_FADV_DONTNEED` on every block file through both mounts; then host A's "
            "ranks load every key, and at once after them host B's ranks load the same keys "
            "into B's empty cache (nothing dropped between the two; the brick served "
            "both from its disk, see the device column); or N processes each `pread` every block file through mount A "
            "(buffered); or N processes each reading every file O_DIRECT with %d threads. %d "
            "rounds, the order rotating; ratios per round (median, worst). Throughput ratio = "
            "the baseline's wall / this row's (>= 1: faster than the baseline). Store loads per "
            "key: owner loads / keys of that host's pass. Device: the brick disk's bytes read "
            "during the pass / store bytes (the disk is shared: others' reads count). CPU: per "
            "process, median, ms (GlusterFS's client and brick processes not included).\n\n",
            (unsigned long)(O.total >> 20), SHARDS_PER_BLOCK, gver[0] ? gver : "version unknown",
            line[0] ? line : "(unknown)", info.hugepages ? "huge pages" : "4 KiB pages",
            OD_THREADS, O.reps);
    fprintf(b->out, "| N | pass | wall ms (median) | worst ms | GiB/s | throughput vs pread "
                    "| vs O_DIRECT x8 | store loads per key | device bytes / store (min..max) "
                    "| CPU ms per process |\n|---|---|---|---|---|---|---|---|---|---|\n");
    int64_t w0 = bench_now_ns();
    shared_n(b, c, st, sock, 2);
    if (!b->quick)
        shared_n(b, c, st, sock, 4);
    {
        double la[3] = {0};

        if (getloadavg(la, 3) != 3)
            la[0] = la[1] = la[2] = -1;
        fprintf(b->out,
                "\nDuring the run: %.0f s wall, %ld CPUs online, load average at the end "
                "(1, 5, 15 min) %.2f %.2f %.2f (other agents share the machine).\n",
                (double)(bench_now_ns() - w0) / 1e9, sysconf(_SC_NPROCESSORS_ONLN), la[0], la[1],
                la[2]);
    }
    fprintf(b->out,
            "\nHost B reads the store once more: each host's cache loads every key from the "
            "store once (store loads per key 1.00 on each host), so H hosts read the store H "
            "times, and B's load costs what A's did. The peer tier (`-o peer_listen`, "
            "[peer.md](peer.md)) changes that: B's miss asks the key's owner host first and "
            "reads it from that host's memory over TCP (`bench_peer`: 0.8-0.9x of raw TCP per "
            "256 KiB page), so the store is read about once per cluster, not per host.\n");
    fprintf(b->out, "\nCommand: `build/tests/bench/bench_cold --shared --md docs/PERFORMANCE.md` "
                    "(as root: glusterd, mounts, drop_caches)\n");
    for (int h = 0; h < 2; h++) {
        sfs_cache_close(c[h]);
        unlink(sock[h]);
        free(st[h].paths);
    }
    return bench_finish(b);
}
#endif

int main(int argc, char **argv)
{
    struct bench b;
    char *args[8] = {argv[0]};
    int nargs = 1;
    char root[400], sock[128], fsdesc[256], storedir[512];
    struct bench_store st = {0};
    struct statfs sf;
    struct stat sb;
    char *obuf = NULL;
    size_t olen = 0;

    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(argv[i], "--dir") && v)
            O.dir = v, i++;
        else if (!strcmp(argv[i], "--reps") && v)
            O.reps = atoi(v), i++;
        else if (!strcmp(argv[i], "--mib") && v)
            O.total = (uint64_t)atol(v) << 20, i++;
        else if (!strcmp(argv[i], "--hugepages") && v)
            O.hugepages = atol(v), i++;
        else if (!strcmp(argv[i], "--shared"))
            O.shared = true;
        else if (nargs < 7)
            args[nargs++] = argv[i];
    }
    if (bench_init(&b, O.shared ? "bench_shared" : "bench_cold", nargs, args) != 0) {
        fprintf(stderr, "       bench_cold options: [--dir DIR] [--reps R] [--mib M] "
                        "[--hugepages N] [--shared]\n");
        return 2;
    }
    if (O.reps == 5 && (b.quick || O.shared))
        O.reps = b.quick ? (O.shared ? 1 : 2) : 3;
    if (!O.total)
        O.total = O.shared ? (b.quick ? (8ull << 20) : (128ull << 20))
                  : b.quick ? (64ull << 20)
                            : (512ull << 20);
    if (O.reps < 1 || O.reps > MAXREPS || O.total < SHARDS_PER_BLOCK * SHARD) {
        fprintf(stderr, "bench_cold: bad --reps or --mib\n");
        return 2;
    }
    if (O.hugepages > 0)
        bench_hp_reserve(O.hugepages);
    signal(SIGPIPE, SIG_IGN);
    if (O.shared) {
#ifdef BENCH_GLUSTER
        return shared_main(&b);
#else
        fprintf(stderr, "bench_shared: skipped: built without the FUSE fixture (no daemon)\n");
        return 77;
#endif
    }

    snprintf(root, sizeof(root), "%s/shardfs-bench-cold-%d", O.dir ? O.dir : "/var/tmp",
             (int)getpid());
    if (mkdir(root, 0755) < 0)
        bench_die(root, errno);
    if (statfs(root, &sf) < 0 || stat(root, &sb) < 0)
        bench_die(root, errno);
    snprintf(dev_sys, sizeof(dev_sys), "/sys/dev/block/%u:%u", major(sb.st_dev), minor(sb.st_dev));
    {
        char link[600] = "";
        ssize_t n = readlink(dev_sys, link, sizeof(link) - 1);
        const char *dev = n > 0 ? (link[n] = 0, strrchr(link, '/') ? strrchr(link, '/') + 1 : link)
                                : "no block device";
        bool mem =
            (unsigned long)sf.f_type == TMPFS_MAGIC || (unsigned long)sf.f_type == RAMFS_MAGIC;

        snprintf(fsdesc, sizeof(fsdesc), "f_type 0x%lx%s on %s (%u:%u)", (unsigned long)sf.f_type,
                 (unsigned long)sf.f_type == EXT4_SUPER_MAGIC ? " (ext2/3/4)"
                 : mem                                        ? " (**memory: figures meaningless**)"
                                                              : "",
                 dev, major(sb.st_dev), minor(sb.st_dev));
    }
    fprintf(stderr, "bench_cold: store under %s: %s\n", root, fsdesc);

    snprintf(storedir, sizeof(storedir), "%s/store", root);
    bench_store_write(&st, storedir, SHARD, O.total);

    snprintf(sock, sizeof(sock), "/tmp/bench-cold-%d.sock", (int)getpid());
    struct sfs_cache *c = bench_served_cache(SHARD, st.nkeys, sock);
    struct sfs_cache_info info;
    sfs_cache_info(c, &info);

    fprintf(b.out, "## Cold loads with the default posix spec (`bench_cold`)\n\n");
    bench_stamp(&b);
    fprintf(b.out,
            "Store: %lu MiB of 256 KiB shards (blocks of %u shards, UCM layout) on %s; data "
            "plane on %s. Every pass cold (keys removed from the cache, `sync`, "
            "`drop_caches` = 3, `POSIX_FADV_DONTNEED` on every block file). shardfs: N forked "
            "ranks, backend `posix:DIR` (the default spec), host copier, each loads every key "
            "into its own buffer (each key read from the store once, by its owner); `direct=0`: "
            "the same, buffered (the fallback's path). pread: N "
            "processes each opening every block file and `pread`ing its shards, buffered. "
            "O_DIRECT: N processes each with %d threads doing the same O_DIRECT. Wall: first "
            "start to last end of the N processes; %d rounds, the order rotating each round; "
            "ratios are per round (median, worst). Device: bytes read from the disk during "
            "the pass / store bytes. CPU: per process, median, ms. Ranks: "
            "libshardfs-rank-bench, the installed library's sources and compiler flags (no "
            "test hooks, no debug checks) plus the benchmarks' baseline switches, which only "
            "the sync-open rows set.\n\n",
            (unsigned long)(O.total >> 20), SHARDS_PER_BLOCK, fsdesc,
            info.hugepages ? "huge pages" : "4 KiB pages", OD_THREADS, O.reps);
    fprintf(b.out, "| N | reader | wall ms (median) | worst ms | GiB/s | vs pread (per round) | "
                   "vs O_DIRECT x8 | device bytes / store (min..max) | CPU ms per process |\n");
    fprintf(b.out, "|---|---|---|---|---|---|---|---|---|\n");

    FILE *open_tab = open_memstream(&obuf, &olen);
    int64_t w0 = bench_now_ns();
    bench_n(&b, c, &st, sock, 2, open_tab);
    bench_n(&b, c, &st, sock, 4, open_tab);
    fclose(open_tab);

    fprintf(b.out,
            "\nThe open path: block files opened as OPENAT2 ops of the ring (io-wq), then "
            "STATX (the default) vs opened in the submitter (`SHARDFS_POSIX_SYNC_OPEN=1`, a "
            "baseline switch of libshardfs-rank-bench: the old path), same spec, same rounds. "
            "Cold as above; warm: keys removed from the cache only (dentries, inodes and the "
            "page cache kept; the data is still read O_DIRECT).\n\n");
    fprintf(b.out, "| N | cold ring ms | cold sync ms | ring / sync (min..max) | CPU ms ring / "
                   "sync | warm ring ms | warm sync ms | ring / sync | warm CPU ms ring / sync "
                   "|\n|---|---|---|---|---|---|---|---|---|\n");
    fputs(obuf, b.out);
    free(obuf);
    {
        double la[3] = {0};

        if (getloadavg(la, 3) != 3)
            la[0] = la[1] = la[2] = -1;
        fprintf(b.out,
                "\nDuring the run: %.0f s wall, %ld CPUs online, load average at the end "
                "(1, 5, 15 min) %.2f %.2f %.2f (other agents share the machine).\n",
                (double)(bench_now_ns() - w0) / 1e9, sysconf(_SC_NPROCESSORS_ONLN), la[0], la[1],
                la[2]);
    }
    if (O.hugepages)
        fprintf(b.out,
                "\nCommand: `build/tests/bench/bench_cold --hugepages %ld --md "
                "docs/PERFORMANCE.md` (as root: drop_caches)\n",
                O.hugepages);
    else
        fprintf(b.out, "\nCommand: `build/tests/bench/bench_cold --md docs/PERFORMANCE.md` (as "
                       "root: drop_caches)\n");
    sfs_cache_close(c);
    unlink(sock);
    nftw(root, bench_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(st.paths);
    return bench_finish(&b);
}
