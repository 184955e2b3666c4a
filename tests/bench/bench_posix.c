/* SPDX-License-Identifier: MIT */
/*
 * bench_posix.c - N rank processes loading a posix store from disk, against
 * raw io_uring O_DIRECT reads of the same files, in the same run.
 *
 *   bench_posix [--quick] [--md FILE] [--dir DIR] [--depth D] [--reps R]
 *               [--hugepages N]
 *
 * The store (UCM layout: <dir>/data/<32 hex>, 4 shards per block file) is
 * written to a real disk file system (default: a directory under /var/tmp;
 * the file system type is checked with statfs and printed). Total 1 GiB per
 * shard size (64 MiB with --quick); shard sizes 256 KiB and 1 MiB.
 *
 * Baseline: one thread, one io_uring of N x D entries, O_DIRECT reads of
 * every shard, in block order, into a pre-touched 4 KiB-aligned buffer; each
 * block file is opened once (when its first shard is submitted) and closed
 * after its last shard completes, inside the timed region.
 *
 * Memory matters as much as the I/O path: the disk DMAs into physically
 * contiguous runs of pages, one scatter-gather segment each, and a virtio
 * disk without indirect descriptors (seg_max 254, 256 descriptors a queue,
 * as on Firecracker) pays per segment: fewer bytes per request and fewer
 * requests in flight. 4 KiB pages come wherever the page allocator has them
 * (1-3 pages per run for a fresh memfd, measured; more or less by luck), so
 * without huge pages the ratio measures the allocator, not shardfs. Hence:
 * the baseline's buffer asks for transparent huge pages (MADV_HUGEPAGE: the
 * disk's best case, stable from run to run; SFS_BENCH_RAW_4K=1 leaves it on
 * 4 KiB pages); the data plane is on hugetlb segments when huge pages are
 * reserved (as in production), in 64 MiB segments so that ~610 huge pages
 * hold a 1 GiB store; --hugepages N raises vm.nr_hugepages to N for this run
 * only (root) and writes the old value back at exit. Each run's notes say
 * what the data plane was on and how contiguous both buffers were (from
 * /proc/self/pagemap, root only).
 *
 * shardfs: a cache created here (sfs_cache_create + sfs_cache_serve,
 * populated, room for the whole store so nothing is evicted), N forked rank
 * processes that live for the whole (shard size, N) configuration: each
 * opens a rank on the socket with backend `posix:<dir>?direct=1&depth=D`
 * (load_depth D, host copier, no prealloc) and loads one task of every key
 * into its own pre-touched host buffer. The ranks share the work: each key is
 * loaded from the backend once, by its owner; the other ranks wait and copy.
 * Wall time: first sfs_rank_load to the last rank's wait returning; GB/s =
 * store bytes / wall.
 *
 * Every run starts cold: the parent removes every key from the cache and
 * posix_fadvise(DONTNEED)s every block file (writing 3 to
 * /proc/sys/vm/drop_caches too when it is allowed). Baseline and shardfs runs
 * alternate (the order flips every rep), after one warm-up of each; figures
 * are medians of --reps runs; the ratio is the median of the per-rep ratios.
 * The first 16 bytes of every shard name its key and are checked after every
 * run, in every rank and in the baseline.
 *
 * SFS_BENCH_TRACE=1 prints, per run, the disk's requests (count, mean size,
 * merges, from /sys/dev/block/M:m/stat), its requests in flight sampled every
 * ~100 us, and how long the disk sat idle at the start and the end.
 */
#include "bench_util.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <fcntl.h>
#include <ftw.h>
#include <liburing.h>
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

#define SHARDS_PER_BLOCK BENCH_SHARDS_PER_BLOCK
#define MAXN             8
#define MAXREPS          32
#define ALIGN            4096u

static struct {
    const char *dir;
    unsigned depth;
    int reps;
    uint64_t total;
    long hugepages; /* --hugepages N: vm.nr_hugepages for the run (0: leave it) */
} O = {.depth = 16, .reps = 5};

/* What each shard size ran on, for the notes under the table. */
struct mem_note {
    unsigned long shard_kib;
    bool huge;
    double dp_run, raw_run; /* 4 KiB pages per physically contiguous run */
    uint64_t dp_bytes;
};
static struct mem_note notes[2];
static int nnotes;

static char dev_sys[128]; /* "/sys/dev/block/M:m" of the store */
static bool trace_on;     static const char *fs_name(long type)
{
    switch ((unsigned long)type) {
    case EXT4_SUPER_MAGIC:
        return "ext2/3/4";
    case XFS_SUPER_MAGIC:
        return "xfs";
    case BTRFS_SUPER_MAGIC:
        return "btrfs";
    case TMPFS_MAGIC:
        return "tmpfs";
    case OVERLAYFS_SUPER_MAGIC:
        return "overlayfs";
    case 0x65735546:
        return "fuse";
    case NFS_SUPER_MAGIC:
        return "nfs";
    default:
        return "other";
    }
}

/* "ext2/3/4 on vda (253:0)" */
static void describe_fs(const char *dir, char *out, size_t len, bool *is_tmpfs)
{
    struct statfs sf;
    struct stat sb;
    char link[256], target[512] = "";
    const char *dev = "?";

    if (statfs(dir, &sf) < 0 || stat(dir, &sb) < 0)
        bench_die(dir, errno);
    *is_tmpfs = (unsigned long)sf.f_type == TMPFS_MAGIC || (unsigned long)sf.f_type == RAMFS_MAGIC;
    snprintf(link, sizeof(link), "/sys/dev/block/%u:%u", major(sb.st_dev), minor(sb.st_dev));
    ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n > 0) {
        target[n] = 0;
        dev = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    }
    snprintf(dev_sys, sizeof(dev_sys), "/sys/dev/block/%u:%u", major(sb.st_dev), minor(sb.st_dev));
    snprintf(out, len, "%s (f_type 0x%lx) on %s (%u:%u)", fs_name((long)sf.f_type),
             (unsigned long)sf.f_type, dev, major(sb.st_dev), minor(sb.st_dev));
}

/* ---------------------------------------------------------------------------
 * Diagnostics (SFS_BENCH_TRACE=1): the disk's request count and size per run
 * from /sys/dev/block/M:m/stat, and its requests in flight sampled every
 * ~100 us from .../inflight by a thread of the parent.
 */

struct dev_snap {
    unsigned long long ios, merges, sectors;
};

static void dev_stat(struct dev_snap *s)
{
    char p[160];
    FILE *f;

    memset(s, 0, sizeof(*s));
    snprintf(p, sizeof(p), "%s/stat", dev_sys);
    f = fopen(p, "r");
    if (!f)
        return;
    if (fscanf(f, "%llu %llu %llu", &s->ios, &s->merges, &s->sectors) != 3)
        memset(s, 0, sizeof(*s));
    fclose(f);
}

static struct {
    pthread_t th;
    atomic_bool run;
    uint64_t samples, sum, zero;
    int64_t t_start, first_busy, last_busy; /* ns */
} smp;

static void *sampler_main(void *arg)
{
    char p[160], b[64];
    int fd;

    snprintf(p, sizeof(p), "%s/inflight", dev_sys);
    fd = open(p, O_RDONLY | O_CLOEXEC);
    while (fd >= 0 && atomic_load(&smp.run)) {
        ssize_t n = pread(fd, b, sizeof(b) - 1, 0);
        unsigned r = 0, w = 0;

        if (n > 0) {
            b[n] = 0;
            if (sscanf(b, "%u %u", &r, &w) == 2) {
                smp.samples++;
                smp.sum += r;
                smp.zero += r == 0;
                if (r) {
                    int64_t now = bench_now_ns();

                    if (!smp.first_busy)
                        smp.first_busy = now;
                    smp.last_busy = now;
                }
            }
        }
        bench_sleep_ns(100000);
    }
    if (fd >= 0)
        close(fd);
    return arg;
}

struct trace {
    struct dev_snap a;
};

/* Pages of [p, p + len) per physically contiguous run (from
 * /proc/self/pagemap; 0 when the PFNs are hidden, i.e. without
 * CAP_SYS_ADMIN). The disk is read by DMA into such runs: each run is one
 * scatter-gather segment of a request. */
static double phys_pages_per_run(const void *p, size_t len)
{
    size_t np = len / 4096, runs = 0, got = 0;
    uint64_t prev = 0, buf[512];
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return 0;
    for (size_t i = 0; i < np; i += 512) {
        size_t k = np - i < 512 ? np - i : 512;

        if (pread(fd, buf, k * 8, (off_t)(((uintptr_t)p / 4096 + i) * 8)) != (ssize_t)(k * 8))
            break;
        for (size_t j = 0; j < k; j++) {
            uint64_t pfn = buf[j] & ((1ull << 55) - 1);

            if (!(buf[j] >> 63) || pfn == 0) {
                close(fd);
                return 0;
            }
            if (got == 0 || pfn != prev + 1)
                runs++;
            prev = pfn;
            got++;
        }
    }
    close(fd);
    return runs ? (double)got / (double)runs : 0;
}

static void trace_begin(struct trace *t)
{
    if (!trace_on)
        return;
    smp.samples = smp.sum = smp.zero = 0;
    smp.first_busy = smp.last_busy = 0;
    smp.t_start = bench_now_ns();
    atomic_store(&smp.run, true);
    pthread_create(&smp.th, NULL, sampler_main, NULL);
    dev_stat(&t->a);
}

static void trace_end(struct trace *t, const char *what)
{
    struct dev_snap b;

    if (!trace_on)
        return;
    dev_stat(&b);
    int64_t t_end = bench_now_ns();
    atomic_store(&smp.run, false);
    pthread_join(smp.th, NULL);
    unsigned long long ios = b.ios - t->a.ios;
    fprintf(stderr,
            "  trace %-7s: disk reads %llu (%.0f KiB avg), merges %llu; in flight mean %.1f, "
            "idle %.0f%% of %llu samples; disk first busy after %.1f ms, last busy %.1f ms "
            "before the end\n",
            what, ios, ios ? (double)(b.sectors - t->a.sectors) * 512 / 1024 / (double)ios : 0,
            b.merges - t->a.merges, smp.samples ? (double)smp.sum / (double)smp.samples : 0,
            smp.samples ? 100.0 * (double)smp.zero / (double)smp.samples : 0,
            (unsigned long long)smp.samples,
            smp.first_busy ? (double)(smp.first_busy - smp.t_start) / 1e6 : 0,
            smp.last_busy ? (double)(t_end - smp.last_busy) / 1e6 : 0);
}

/* ---------------------------------------------------------------------------
 * Baseline: raw io_uring O_DIRECT reads, one thread.
 */

struct base_result {
    double gbps;
    double cpu_s;
};

/* CPU-seconds all CPUs spent busy (user, nice, system, irq, softirq), and
 * steal, from /proc/stat. */
static void proc_stat_busy(double *busy, double *steal)
{
    unsigned long long u = 0, n = 0, sy = 0, id = 0, io = 0, irq = 0, sirq = 0, st = 0;
    FILE *f = fopen("/proc/stat", "r");

    *busy = *steal = 0;
    if (!f)
        return;
    if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &u, &n, &sy, &id, &io, &irq, &sirq,
               &st) == 8) {
        double hz = (double)sysconf(_SC_CLK_TCK);

        *busy = (double)(u + n + sy + irq + sirq) / hz;
        *steal = (double)st / hz;
    }
    fclose(f);
}

static void baseline_run(const struct bench_store *st, unsigned qd, uint8_t *dst, struct base_result *r)
{
    struct io_uring ring;
    int *fds = malloc(st->nblocks * sizeof(*fds));
    uint8_t *left = malloc(st->nblocks); /* shards of the block still in flight or unsent */
    uint32_t next = 0, done = 0;
    unsigned inflight = 0;
    int ret;

    if (!fds || !left)
        bench_die("malloc", ENOMEM);
    ret = io_uring_queue_init(qd, &ring, 0);
    if (ret < 0)
        bench_die("io_uring_queue_init", ret);
    memset(left, SHARDS_PER_BLOCK, st->nblocks);
    for (uint32_t i = 0; i < st->nkeys; i++)
        memset(dst + (size_t)i * st->shard, 0, 16);

    struct trace tr;
    trace_begin(&tr);
    int64_t c0 = bench_rusage_cpu_ns(RUSAGE_THREAD), t0 = bench_now_ns();
    while (done < st->nkeys) {
        while (next < st->nkeys && inflight < qd) {
            uint32_t b = next / SHARDS_PER_BLOCK, s = next % SHARDS_PER_BLOCK;
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);

            if (!sqe)
                break;
            if (s == 0) {
                fds[b] = open(st->paths[b], O_RDONLY | O_DIRECT | O_CLOEXEC);
                if (fds[b] < 0)
                    bench_die(st->paths[b], errno);
            }
            io_uring_prep_read(sqe, fds[b], dst + (size_t)next * st->shard, (unsigned)st->shard,
                               (uint64_t)s * st->shard);
            io_uring_sqe_set_data64(sqe, next);
            next++;
            inflight++;
        }
        ret = io_uring_submit_and_wait(&ring, 1);
        if (ret < 0 && ret != -EINTR)
            bench_die("io_uring_submit_and_wait", ret);
        struct io_uring_cqe *cqe;
        unsigned head, count = 0;
        io_uring_for_each_cqe(&ring, head, cqe)
        {
            uint32_t k = (uint32_t)io_uring_cqe_get_data64(cqe), b = k / SHARDS_PER_BLOCK;

            if (cqe->res != (int)st->shard)
                bench_die("baseline read", cqe->res < 0 ? cqe->res : EIO);
            if (--left[b] == 0)
                close(fds[b]);
            count++;
        }
        io_uring_cq_advance(&ring, count);
        inflight -= count;
        done += count;
    }
    int64_t t1 = bench_now_ns(), c1 = bench_rusage_cpu_ns(RUSAGE_THREAD);
    trace_end(&tr, "raw");
    io_uring_queue_exit(&ring);
    for (uint32_t i = 0; i < st->nkeys; i++)
        if (!bench_key_ok(dst + (size_t)i * st->shard, i / SHARDS_PER_BLOCK, i % SHARDS_PER_BLOCK))
            bench_die("baseline: wrong bytes", EIO);
    r->gbps = (double)st->nkeys * (double)st->shard / (double)(t1 - t0);
    r->cpu_s = (double)(c1 - c0) / 1e9;
    free(fds);
    free(left);
}

/* ---------------------------------------------------------------------------
 * shardfs: forked ranks.
 */

enum { CMD_RUN = 'r', CMD_QUIT = 'q' };

struct rank_res {
    int rc;
    int64_t t0, t1;
    uint64_t owner, waits, hits, failed, max_inflight;
    int64_t cpu_ns;
};

struct shared {
    struct rank_res r[MAXN];
};

static int rank_main(const struct bench_store *st, const char *sock, int r, int N, struct shared *sh,
                     int cmd_r, int done_w)
{
    struct sfs_rank_config cfg;
    char spec[700];
    size_t bytes = (size_t)st->nkeys * st->shard;
    uint8_t *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct sfs_rank_entry *e = calloc(st->nkeys, sizeof(*e));
    int *status = calloc(st->nkeys, sizeof(*status));
    struct sfs_rank *rk;
    int err = 0;
    char c;

    if (dst == MAP_FAILED || !e || !status)
        return 2;
    memset(dst, 0, bytes); /* first touch outside the timing */
    snprintf(spec, sizeof(spec), "posix:%s?direct=1&depth=%u", st->dir, O.depth);
    bench_rank_config(&cfg, sock, r, N, spec);
    cfg.load_depth = O.depth;
    cfg.prealloc = false;
    rk = sfs_rank_open(&cfg, &err);
    if (!rk) {
        fprintf(stderr, "bench_posix: rank %d: sfs_rank_open: %s\n", r, strerror(-err));
        return 3;
    }
    bench_store_entries(st, dst, e);
    if (write(done_w, "o", 1) != 1)
        return 4;
    while (read(cmd_r, &c, 1) == 1 && c == CMD_RUN) {
        struct rank_res *res = &sh->r[r];
        struct bench_rank_run run;
        int rc = bench_rank_load_all(rk, e, st->nkeys, dst, st->shard, status, &run);
        const struct sfs_rank_stats s0 = run.s0, s1 = run.s1;

        res->t0 = run.t0;
        res->t1 = run.t1;
        res->cpu_ns = run.cpu_ns;
        for (uint32_t i = 0; rc == 0 && i < st->nkeys; i++) {
            if (status[i] != 0) {
                fprintf(stderr, "bench_posix: rank %d: entry %u: %s\n", r, i, strerror(-status[i]));
                rc = 6;
            } else if (!bench_key_ok(dst + (size_t)i * st->shard, i / SHARDS_PER_BLOCK,
                               i % SHARDS_PER_BLOCK)) {
                fprintf(stderr, "bench_posix: rank %d: entry %u: wrong bytes\n", r, i);
                rc = 7;
            }
        }
        res->owner = s1.owner_loads - s0.owner_loads;
        res->waits = s1.waits - s0.waits;
        res->hits = s1.hits - s0.hits;
        res->failed = s1.failed - s0.failed;
        res->max_inflight = s1.max_inflight;
        res->rc = rc;
        if (write(done_w, "d", 1) != 1)
            break;
    }
    sfs_rank_close(rk);
    return 0;
}

static void spawn_ranks(const struct bench_store *st, const char *sock, int N, struct shared *sh,
                        struct bench_child *ch)
{
    for (int r = 0; r < N; r++) {
        int cmd_r, done_w;

        if (bench_child_fork(&ch[r], &cmd_r, &done_w))
            _exit(rank_main(st, sock, r, N, sh, cmd_r, done_w));
    }
}

struct sfs_result {
    double gbps;
    uint64_t loads, own_min, own_max, waits, hits, peak_inflight;
    double cpu_s;
};

static void sfs_run(struct sfs_cache *c, const struct bench_store *st, int N, struct shared *sh,
                    struct bench_child *ch, struct sfs_result *out)
{
    int64_t t0 = INT64_MAX, t1 = 0;

    memset(out, 0, sizeof(*out));
    out->own_min = UINT64_MAX;
    memset(sh, 0, sizeof(*sh));
    struct trace tr;
    trace_begin(&tr);
    bench_children_send(N, ch, CMD_RUN);
    for (int r = 0; r < N; r++) {
        struct rank_res *rr = &sh->r[r];

        bench_child_done(&ch[r], r, &rr->rc);
        t0 = rr->t0 < t0 ? rr->t0 : t0;
        t1 = rr->t1 > t1 ? rr->t1 : t1;
        out->loads += rr->owner;
        out->own_min = rr->owner < out->own_min ? rr->owner : out->own_min;
        out->own_max = rr->owner > out->own_max ? rr->owner : out->own_max;
        out->waits += rr->waits;
        out->hits += rr->hits;
        out->peak_inflight += rr->max_inflight;
        out->cpu_s += (double)rr->cpu_ns / 1e9;
    }
    trace_end(&tr, "shardfs");
    out->gbps = (double)st->nkeys * (double)st->shard / (double)(t1 - t0);
}

/* ---------------------------------------------------------------------------
 * One shard size: the store, the cache, N = 1 and 2.
 */

static void bench_shard(struct bench *b, const char *root, uint64_t shard, bool *hdr)
{
    static const int Ns[] = {1, 2};
    struct bench_store st = {0};
    char sock[128], storedir[512];

    snprintf(storedir, sizeof(storedir), "%s/%luk", root, (unsigned long)(shard >> 10));
    bench_store_write(&st, storedir, shard, O.total);
    snprintf(sock, sizeof(sock), "/tmp/bench-posix-%d-%luk.sock", (int)getpid(),
             (unsigned long)(shard >> 10));
    struct sfs_cache *c = bench_served_cache(shard, st.nkeys, sock);
    struct sfs_cache_info info;
    sfs_cache_info(c, &info);
    /* How the data plane lies in physical memory: see the notes. */
    double dp_run = 0;
    uint64_t dp_bytes = 0;
    {
        size_t sl = 0, np = 0;
        double runs = 0;
        void *sp;

        for (uint32_t i = 0; (sp = sfs_cache_segment(c, i, &sl)) != NULL; i++) {
            double r = phys_pages_per_run(sp, sl);

            dp_bytes += sl;
            if (r == 0) {
                runs = -1; /* PFNs hidden: unknown */
            } else if (runs >= 0) {
                runs += (double)(sl / 4096) / r;
                np += sl / 4096;
            }
        }
        dp_run = runs > 0 ? (double)np / runs : 0;
    }

    size_t bytes = (size_t)st.nkeys * shard;
    uint8_t *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dst == MAP_FAILED)
        bench_die("mmap", errno);
    madvise(dst, bytes, MADV_DONTFORK); /* no copy-on-write after the ranks fork */
    if (!getenv("SFS_BENCH_RAW_4K"))
        madvise(dst, bytes, MADV_HUGEPAGE); /* see the notes under the table */
    memset(dst, 0, bytes);
    double raw_run = phys_pages_per_run(dst, bytes);
    if (nnotes < 2)
        notes[nnotes++] = (struct mem_note){.shard_kib = (unsigned long)(shard >> 10),
                                            .huge = info.hugepages,
                                            .dp_run = dp_run,
                                            .raw_run = raw_run,
                                            .dp_bytes = dp_bytes};
    struct shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        bench_die("mmap", errno);

    if (!*hdr) {
        fprintf(b->out, "| shard | N ranks | depth per rank (total) | raw io_uring GB/s | "
                        "shardfs GB/s | ratio (min..max) | met (>= 0.9x) | backend loads "
                        "(keys) | owner loads per rank | CPU s per pass: ranks / raw |\n");
        fprintf(b->out, "|---|---|---|---|---|---|---|---|---|---|\n");
        *hdr = true;
    }
    for (size_t k = 0; k < sizeof(Ns) / sizeof(Ns[0]); k++) {
        int N = Ns[k];
        unsigned qd = O.depth * (unsigned)N;
        struct bench_child ch[MAXN];
        struct base_result br = {0};
        struct sfs_result sr = {0};
        double vb[MAXREPS], vs[MAXREPS], vr[MAXREPS], cb[MAXREPS], cs[MAXREPS];
        uint64_t loads = 0, omin = UINT64_MAX, omax = 0;
        bool loads_ok = true;

        spawn_ranks(&st, sock, N, sh, ch);
        /* Warm-up passes: the first loads of a rank fault the data-plane
         * pages into its mapping (slow GUP in the O_DIRECT submit); the
         * cache hands out its spare slots in the following passes too. */
        int warm = b->quick ? 1 : 3;
        for (int rep = -warm; rep < O.reps; rep++) {
            bool base_first = rep < 0 || rep % 2 == 0;

            for (int pass = 0; pass < 2; pass++) {
                sfs_cache_foreach(c, ~0u, bench_drop_key, c);
                bench_drop_page_cache(st.paths, st.nblocks);
                if ((pass == 0) == base_first)
                    baseline_run(&st, qd, dst, &br);
                else
                    sfs_run(c, &st, N, sh, ch, &sr);
            }
            if (rep < 0)
                continue; /* warm-up */
            vb[rep] = br.gbps;
            vs[rep] = sr.gbps;
            vr[rep] = sr.gbps / br.gbps;
            cb[rep] = br.cpu_s;
            cs[rep] = sr.cpu_s;
            loads = sr.loads;
            loads_ok = loads_ok && sr.loads == st.nkeys;
            omin = sr.own_min < omin ? sr.own_min : omin;
            omax = sr.own_max > omax ? sr.own_max : omax;
            fprintf(stderr,
                    "bench_posix: %4lu KiB N=%d rep %d: raw %.2f GB/s, shardfs %.2f GB/s "
                    "(%.2fx), loads %lu, waits %lu, hits %lu, peak in flight %lu\n",
                    (unsigned long)(shard >> 10), N, rep, br.gbps, sr.gbps, sr.gbps / br.gbps,
                    (unsigned long)sr.loads, (unsigned long)sr.waits, (unsigned long)sr.hits,
                    (unsigned long)sr.peak_inflight);
        }
        bench_children_stop(N, ch);
        double mb = bench_median(vb, (size_t)O.reps), ms = bench_median(vs, (size_t)O.reps);
        double mr = bench_median(vr, (size_t)O.reps);
        double lo = vr[0], hi = vr[O.reps - 1]; /* sorted by bench_median */
        fprintf(b->out,
                "| %lu KiB | %d | %u (%u) | %.2f | %.2f | %.2fx (%.2f..%.2f) | %s | %lu%s (%u) | "
                "%lu..%lu | %.2f / %.2f |\n",
                (unsigned long)(shard >> 10), N, O.depth, qd, mb, ms, mr, lo, hi,
                mr >= 0.9 ? "yes" : "**no**", (unsigned long)loads, loads_ok ? "" : " (!)",
                st.nkeys, (unsigned long)omin, (unsigned long)omax,
                bench_median(cs, (size_t)O.reps), bench_median(cb, (size_t)O.reps));
        fflush(b->out);
    }
    fprintf(stderr,
            "bench_posix: %lu KiB: data plane on huge pages: %s; 4 KiB pages per physically "
            "contiguous run: data plane %.1f, raw buffer %.1f\n",
            (unsigned long)(shard >> 10), info.hugepages ? "yes" : "no", dp_run, raw_run);
    munmap(sh, sizeof(*sh));
    munmap(dst, bytes);
    sfs_cache_close(c);
    unlink(sock);
    nftw(st.dir, bench_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    free(st.paths);
}

int main(int argc, char **argv)
{
    struct bench b;
    char *args[8] = {argv[0]};
    int nargs = 1;
    char root[512], fsdesc[256];
    bool tmpfs = false, hdr = false;

    /* Our own options first; the rest goes to bench_init. */
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(argv[i], "--dir") && v) {
            O.dir = v, i++;
        } else if (!strcmp(argv[i], "--depth") && v) {
            O.depth = (unsigned)atoi(v), i++;
        } else if (!strcmp(argv[i], "--reps") && v) {
            O.reps = atoi(v), i++;
        } else if (!strcmp(argv[i], "--hugepages") && v) {
            O.hugepages = atol(v), i++;
        } else if (nargs < 7) {
            args[nargs++] = argv[i];
        }
    }
    if (bench_init(&b, "bench_posix", nargs, args) != 0) {
        fprintf(stderr, "       bench_posix options: [--dir DIR] [--depth D] [--reps R] "
                        "[--hugepages N]\n");
        return 2;
    }
    if (b.quick && O.reps == 5)
        O.reps = 2;
    if (O.depth == 0 || O.depth > 4096 || O.reps < 1 || O.reps > MAXREPS || O.hugepages < 0 ||
        O.hugepages > (1l << 20)) {
        fprintf(stderr, "bench_posix: bad --depth, --reps or --hugepages\n");
        return 2;
    }
    O.total = b.quick ? (64ull << 20) : (1ull << 30);
    trace_on = getenv("SFS_BENCH_TRACE") != NULL;
    if (O.hugepages)
        bench_hp_reserve(O.hugepages);
    signal(SIGPIPE, SIG_IGN);

    snprintf(root, sizeof(root), "%s/shardfs-bench-posix-%d", O.dir ? O.dir : "/var/tmp",
             (int)getpid());
    if (mkdir(root, 0755) < 0)
        bench_die(root, errno);
    describe_fs(root, fsdesc, sizeof(fsdesc), &tmpfs);
    fprintf(stderr, "bench_posix: store under %s: %s\n", root, fsdesc);

    fprintf(b.out, "## N ranks loading from the posix backend vs raw io_uring (`bench_posix`)\n\n");
    bench_stamp(&b);
    fprintf(b.out,
            "Store: %lu MiB per shard size (blocks of %u shards, UCM layout) on %s%s. "
            "Every pass cold (keys removed from the cache, `posix_fadvise(DONTNEED)` on every "
            "block file). Raw: one thread, one io_uring of N x depth entries, O_DIRECT reads "
            "into a pre-touched aligned buffer on transparent huge pages, each block file "
            "opened once. shardfs: N forked "
            "rank processes, backend `posix:DIR?direct=1&depth=D`, load_depth D, host copier, "
            "each rank loads the task of every key into its own host buffer (each key loaded "
            "from the backend once, by its owner). Median of %d interleaved runs after %d "
            "warm-up pairs; ratio = median of per-run ratios (min..max).\n\n",
            (unsigned long)(O.total >> 20), SHARDS_PER_BLOCK, fsdesc,
            tmpfs ? " (**tmpfs: not a disk, figures meaningless**)" : "", O.reps, b.quick ? 1 : 3);

    double busy0, steal0, busy1, steal1;
    int64_t wall0 = bench_now_ns();
    proc_stat_busy(&busy0, &steal0);
    bench_shard(&b, root, 256u << 10, &hdr);
    bench_shard(&b, root, 1u << 20, &hdr);
    proc_stat_busy(&busy1, &steal1);
    rmdir(root);
    fprintf(b.out, "\nMemory the disk reads into (4 KiB pages per physically contiguous run: "
                   "each run is one scatter-gather segment of a request; 512 = 2 MiB pages):");
    for (int i = 0; i < nnotes; i++) {
        const struct mem_note *n = &notes[i];

        fprintf(b.out, "%s %lu KiB: data plane %.0f MiB on %s, ", i ? ";" : "", n->shard_kib,
                (double)n->dp_bytes / (1 << 20), n->huge ? "huge pages" : "**4 KiB pages**");
        if (n->dp_run > 0)
            fprintf(b.out, "%.1f pages per run, raw buffer %.1f", n->dp_run, n->raw_run);
        else
            fprintf(b.out, "contiguity unknown (no CAP_SYS_ADMIN)");
    }
    fprintf(b.out, ".%s\n",
            nnotes && !notes[0].huge
                ? " Without huge pages the data plane is wherever the page allocator scattered "
                  "it, and on a disk that pays per segment the ratio measures that, not "
                  "shardfs: run with `--hugepages N` (root) or reserve them first."
                : "");
    {
        double wall = (double)(bench_now_ns() - wall0) / 1e9;
        double ours = (double)(bench_rusage_cpu_ns(RUSAGE_SELF) + bench_rusage_cpu_ns(RUSAGE_CHILDREN)) / 1e9;
        double others = busy1 - busy0 - ours;
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);

        fprintf(b.out,
                "\nDuring the run (%.0f s, %ld CPUs): this program used %.1f CPU-s; other work "
                "on the machine %.1f CPU-s (%.0f%% of all CPUs); steal %.1f CPU-s.\n",
                wall, ncpu, ours, others > 0 ? others : 0,
                others > 0 ? 100.0 * others / (wall * (double)ncpu) : 0, steal1 - steal0);
    }
    if (O.hugepages)
        fprintf(b.out,
                "\nCommand: `build/tests/bench/bench_posix --hugepages %ld --md "
                "docs/PERFORMANCE.md`\n",
                O.hugepages);
    else
        fprintf(b.out, "\nCommand: `build/tests/bench/bench_posix --md docs/PERFORMANCE.md`\n");
    return bench_finish(&b);
}
