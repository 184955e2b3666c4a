/* SPDX-License-Identifier: MIT */
/*
 * bench_admit.c - what admission=scan costs when several processes miss at
 * once: the cache's evictor under admission=scan against plain CLOCK, with
 * 1, 2 and 4 forked processes attached through the socket, each replaying a
 * miss-heavy trace of its own keys at the same time.
 *
 * Key idea: bench_clock measures the admission's hit rate and its cost in
 * one thread; what it cannot see is what the admission adds when several
 * hands run at once (the probationary flag written on a hit, the census of
 * each hand step, the plain-CLOCK rescan when a census is stale). Here the
 * same traces run against two caches that differ only in their admission,
 * trial by trial interleaved (CLOCK, scan, CLOCK, ...), so machine noise
 * hits both alike, and the figure that matters is the ratio of the medians:
 * CPU time per access summed over the processes (what the evictors cost,
 * whatever CPU share the loaded machine gives them) and wall time per
 * access of the whole run. Each access is Get, fill, publish, release on a
 * miss (the evictor runs), Get and release on a hit.
 */
#include "bench_util.h"

#include "testutil.h"

#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>

#define SHARD  4096u
#define CAP    1024u /* slots */
#define MAXP   4
#define NTRACE 2

static const char *const trace_name[NTRACE] = {
    "uniform over 8x capacity keys (miss-heavy)",
    "hot set (cap/4 keys) + cyclic scan (8x cap), 50/50",
};

struct result {
    int64_t cpu_ns, wall_ns;
    uint64_t acc, hits;
    int err;
};

/* Shared between the parent and its forked children. */
struct shared {
    char path[108];
    _Atomic int ready, start;
    struct result res[MAXP];
};
static struct shared *sh;

struct child_arg {
    int idx, trace;
    uint32_t n, nacc;
};

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The next key of a trace for one of n processes, in its own key space;
 * each process has 1/n of the keys, so the n together make the trace
 * bench_clock replays in one (8x capacity keys; a hot set of cap/4 keys and
 * a cyclic scan of 8x cap). */
static uint32_t next_key(int trace, uint32_t n, uint64_t *rng, uint32_t *scan)
{
    if (trace == 0)
        return (uint32_t)(lcg(rng) % (8 * CAP / n));
    if (lcg(rng) & 1)
        return (uint32_t)(lcg(rng) % (CAP / 4 / n));
    return CAP / 4 / n + (*scan)++ % (8 * CAP / n);
}

static int child_main(void *p)
{
    const struct child_arg *a = p;
    struct result *res = &sh->res[a->idx];
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(a->idx + 1);
    uint32_t scan = 0;
    int err = 0;
    struct sfs_cache *c = sfs_cache_attach(sh->path, 0, &err);

    if (!c) {
        res->err = err;
        atomic_fetch_add(&sh->ready, 1);
        return 1;
    }
    atomic_fetch_add(&sh->ready, 1);
    while (!atomic_load_explicit(&sh->start, memory_order_acquire))
        ;
    int64_t t0 = bench_now_ns(), c0 = bench_thread_cpu_ns();
    for (uint32_t i = 0; i < a->nacc; i++) {
        struct sfs_key k =
            tu_key(1 + (uint64_t)a->idx * 100000000ull + next_key(a->trace, a->n, &rng, &scan), 0);
        struct sfs_lease l;
        int r = sfs_cache_get(c, &k, 0, sfs_deadline_after(5000000000ll), &l);

        if (r == SFS_HIT)
            res->hits++;
        else if (r == SFS_OWNER)
            r = tu_publish(c, &k, &l);
        else if (r == SFS_WAITER) /* not with keys of our own; harmless */
            r = sfs_cache_wait(c, &l, sfs_deadline_after(5000000000ll));
        if (r < 0) {
            res->err = r;
            break;
        }
        sfs_cache_release(c, &l);
    }
    res->cpu_ns = bench_thread_cpu_ns() - c0;
    res->wall_ns = bench_now_ns() - t0;
    res->acc = a->nacc;
    sfs_cache_close(c);
    return res->err ? 1 : 0;
}

struct trial {
    double cpu_per_acc, wall_per_acc, hit_rate;
};

/* One trial: a fresh cache with `admission`, n processes on `trace`. */
static int trial(int admission, int n, int trace, uint32_t nacc, struct trial *out)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = CAP, .hugepages = SFS_HUGEPAGES_OFF, .admission = admission};
    struct child_arg args[MAXP];
    pid_t pids[MAXP];
    int err = 0, bad = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    if (!c || (err = sfs_cache_serve(c, sh->path)) < 0) {
        fprintf(stderr, "bench_admit: create/serve: %s\n", strerror(-err));
        return -1;
    }
    atomic_store(&sh->ready, 0);
    atomic_store(&sh->start, 0);
    memset(sh->res, 0, sizeof(sh->res));
    for (int i = 0; i < n; i++) {
        args[i] = (struct child_arg){.idx = i, .trace = trace, .n = (uint32_t)n, .nacc = nacc};
        pids[i] = tu_fork(child_main, &args[i]);
    }
    while (atomic_load(&sh->ready) < n)
        bench_sleep_ns(100000);
    int64_t t0 = bench_now_ns();
    atomic_store_explicit(&sh->start, 1, memory_order_release);
    double cpu = 0, acc = 0, hits = 0;
    for (int i = 0; i < n; i++) {
        if (tu_wait(pids[i]) != 0 || sh->res[i].err) {
            fprintf(stderr, "bench_admit: child %d: %s\n", i,
                    strerror(sh->res[i].err ? -sh->res[i].err : EIO));
            bad = 1;
        }
        cpu += (double)sh->res[i].cpu_ns;
        acc += (double)sh->res[i].acc;
        hits += (double)sh->res[i].hits;
    }
    int64_t wall = bench_now_ns() - t0;
    sfs_cache_close(c);
    out->cpu_per_acc = acc > 0 ? cpu / acc : 0;
    out->wall_per_acc = acc > 0 ? (double)wall / acc : 0;
    out->hit_rate = acc > 0 ? 100.0 * hits / acc : 0;
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    struct bench b;
    int rc = bench_init(&b, "bench_admit", argc, argv);
    if (rc)
        return rc;
    const int rounds = b.quick ? 2 : 5;
    const uint32_t nacc = b.quick ? 20000 : 200000;
    const int nprocs[] = {1, 2, 4};

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    snprintf(sh->path, sizeof(sh->path), "%s", tu_path("sock"));

    FILE *o = b.out;
    fprintf(o, "## admission=scan with several evictors (`bench_admit`)\n\n");
    bench_stamp(&b);
    fprintf(o,
            "A cache of %u slots of %u KiB, created with admission=clock or admission=scan; "
            "N forked processes attached through the socket replay %u accesses each of their "
            "own keys at once (Get, fill, publish, release on a miss); each has 1/N of the "
            "trace's keys, so together they make the trace of bench_clock's row. Trials alternate "
            "CLOCK and scan, %d rounds; medians. CPU: the processes' CPU time per access, "
            "summed (what the evictors cost, whatever CPU share the machine gives them); "
            "wall: the run's wall time per access.\n\n",
            CAP, SHARD >> 10, nacc, rounds);
    fprintf(o, "| trace | N | CLOCK: CPU ns/access | scan: CPU ns/access | ratio | CLOCK: wall "
               "ns/access | scan: wall ns/access | ratio | hit rate CLOCK / scan |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    for (int t = 0; t < NTRACE; t++) {
        for (size_t ni = 0; ni < sizeof(nprocs) / sizeof(nprocs[0]); ni++) {
            double cpu[2][8], wall[2][8], hr[2] = {0, 0};

            for (int r = 0; r < rounds; r++)
                for (int adm = 0; adm < 2; adm++) {
                    struct trial x;

                    if (trial(adm ? SFS_ADMIT_SCAN : SFS_ADMIT_CLOCK, nprocs[ni], t, nacc, &x) < 0)
                        return 1;
                    cpu[adm][r] = x.cpu_per_acc;
                    wall[adm][r] = x.wall_per_acc;
                    hr[adm] = x.hit_rate; /* deterministic but for interleaving */
                }
            double mc[2], mw[2];
            for (int adm = 0; adm < 2; adm++) {
                mc[adm] = bench_median(cpu[adm], (size_t)rounds);
                mw[adm] = bench_median(wall[adm], (size_t)rounds);
            }
            fprintf(o,
                    "| %s | %d | %.0f | %.0f | %.3f | %.0f | %.0f | %.3f | %.2f%% / %.2f%% "
                    "|\n",
                    trace_name[t], nprocs[ni], mc[0], mc[1], mc[1] / mc[0], mw[0], mw[1],
                    mw[1] / mw[0], hr[0], hr[1]);
            fflush(o);
        }
    }
    fprintf(o, "\n");
    munmap(sh, sizeof(*sh));
    return bench_finish(&b);
}
