/* SPDX-License-Identifier: MIT */
/*
 * bench_cache.c - the hit path: Get+Release of a resident key against an
 * uncontended robust process-shared mutex lock/unlock pair, and how it scales
 * to two processes on distinct keys and on the same keys in the same order.
 *
 * Key idea: the baseline runs in the same process, on the same kind of mutex
 * (robust, pshared, in shared memory) that guards a bucket, interleaved run by
 * run with the measured path, so machine noise hits both alike; the figure
 * that matters is the ratio of the medians. The scaling test forks real
 * processes that attach through the socket, each on keys whose buckets no
 * other process uses (or all on the same keys, in the same order), and
 * compares their aggregate rate with one process's; the same is done for
 * bare mutexes to show what this machine allows. Each child also reports its
 * context switches (getrusage): a voluntary one is a futex sleep on a
 * contended lock, the cost the same-keys row is about.
 *
 * Two options of its own, before the common ones: --pin puts child i on CPU
 * i (so two children never share a CPU while the machine has two), and
 * --trial MODE N MS (MODE: mutex, distinct or same) runs only that one
 * trial, N processes for MS milliseconds, and prints its figures: for
 * counting a trial's system calls from outside (strace -f -c -e futex).
 */
#include "bench_util.h"

#include "cache_i.h" /* sfs_key_hash, sfs_robust_mutex_init: pick disjoint buckets */
#include "testutil.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>

#define NKEYS_PER_PROC 8
#define MAXP           2
#define HOLD           4096 /* leases held at once in the Get-only / Release-only split */
#define CHUNKS         41   /* alternating chunks per run */

struct line_mutex {
    alignas(64) pthread_mutex_t m;
};

struct result {
    alignas(64) double ops_per_s;
    uint64_t ops;
    int64_t wall_ns, cpu_ns; /* the child's own window and its CPU time in it */
    int64_t nvcsw;           /* voluntary context switches in the window */
    int err;
};

/* Shared between the parent and forked children. */
struct shm {
    struct line_mutex mu[MAXP + 1];
    alignas(64) _Atomic int ready;
    _Atomic int start;
    _Atomic int stop;
    struct result res[MAXP];
    struct sfs_key keys[MAXP][NKEYS_PER_PROC];
    char path[108];
};

static struct shm *sh;
static volatile uint64_t sink;
static bool pin_children; /* --pin */

/* ---------------------------------------------------------------------------
 * Single-process timings (ns per operation).
 */

static double time_robust_pair(pthread_mutex_t *m, uint64_t n)
{
    int64_t t0 = bench_now_ns();

    for (uint64_t i = 0; i < n; i++) {
        pthread_mutex_lock(m);
        pthread_mutex_unlock(m);
    }
    return (double)(bench_now_ns() - t0) / (double)n;
}

static double time_get_release(struct sfs_cache *c, const struct sfs_key *k, uint64_t n, int *err);

/* time_get_release on a thread of its own: a thread keeps a spare lease
 * entry of one handle only (lease.c), so two handles compared in one
 * thread would not be on equal footing; a fresh thread each is. */
struct gr_job {
    struct sfs_cache *c;
    const struct sfs_key *k;
    uint64_t n;
    int err;
    double ns;
};

static void *gr_thread(void *arg)
{
    struct gr_job *j = arg;

    j->ns = time_get_release(j->c, j->k, j->n, &j->err);
    return NULL;
}

static double time_gr_thread(struct sfs_cache *c, const struct sfs_key *k, uint64_t n, int *err)
{
    struct gr_job j = {.c = c, .k = k, .n = n};
    pthread_t t;

    if (pthread_create(&t, NULL, gr_thread, &j) != 0) {
        *err = -EAGAIN;
        return 0;
    }
    pthread_join(t, NULL);
    if (j.err)
        *err = j.err;
    return j.ns;
}

static double time_get_release(struct sfs_cache *c, const struct sfs_key *k, uint64_t n, int *err)
{
    struct sfs_lease l;
    int64_t t0 = bench_now_ns();

    for (uint64_t i = 0; i < n; i++) {
        int r = sfs_cache_get(c, k, 0, 0, &l);

        if (r != SFS_HIT) {
            *err = r < 0 ? r : -EPROTO;
            return 0;
        }
        sfs_cache_release(c, &l);
    }
    return (double)(bench_now_ns() - t0) / (double)n;
}

/* Get the same key HOLD times, then release all: the two halves apart. */
static int time_split(struct sfs_cache *c, const struct sfs_key *k, uint64_t n, double *get_ns,
                      double *rel_ns)
{
    static struct sfs_lease l[HOLD];
    int64_t tg = 0, tr = 0;
    uint64_t rounds = n / HOLD ? n / HOLD : 1;

    for (uint64_t r = 0; r < rounds; r++) {
        int64_t t0 = bench_now_ns();
        for (int i = 0; i < HOLD; i++)
            if (sfs_cache_get(c, k, 0, 0, &l[i]) != SFS_HIT)
                return -EPROTO;
        int64_t t1 = bench_now_ns();
        for (int i = HOLD - 1; i >= 0; i--)
            sfs_cache_release(c, &l[i]);
        int64_t t2 = bench_now_ns();
        tg += t1 - t0;
        tr += t2 - t1;
    }
    *get_ns = (double)tg / (double)(rounds * HOLD);
    *rel_ns = (double)tr / (double)(rounds * HOLD);
    return 0;
}

/* Two uncontended CASes on one line: the price of the hit path's CASes. */
static double time_cas_pair(uint64_t n)
{
    static _Atomic uint64_t head;
    int64_t t0 = bench_now_ns();

    for (uint64_t i = 0; i < n; i++) {
        uint64_t h = atomic_load_explicit(&head, memory_order_acquire);
        atomic_compare_exchange_weak_explicit(&head, &h, h + 1, memory_order_acquire,
                                              memory_order_relaxed);
        h = atomic_load_explicit(&head, memory_order_relaxed);
        atomic_compare_exchange_weak_explicit(&head, &h, h + 1, memory_order_release,
                                              memory_order_relaxed);
    }
    return (double)(bench_now_ns() - t0) / (double)n;
}

static double time_atomic_rmw(uint64_t n)
{
    static _Atomic int64_t ctr;
    int64_t t0 = bench_now_ns();

    for (uint64_t i = 0; i < n; i++)
        atomic_fetch_add_explicit(&ctr, 1, memory_order_relaxed);
    return (double)(bench_now_ns() - t0) / (double)n;
}

static double time_hash(uint64_t n)
{
    struct sfs_block_id id = tu_block(7);
    uint64_t acc = 0;
    int64_t t0 = bench_now_ns();

    for (uint64_t i = 0; i < n; i++) {
        id.b[0] = (uint8_t)(acc ^ i); /* a dependency chain: no hoisting */
        acc += sfs_key_hash(&id);
    }
    sink = acc;
    return (double)(bench_now_ns() - t0) / (double)n;
}

/* ---------------------------------------------------------------------------
 * Scaling: children attached through the socket, each on its own keys.
 */

enum mode { MODE_MUTEX, MODE_CACHE, MODE_SAME };

struct child_arg {
    int idx;
    enum mode mode;
};

static int child_main(void *p)
{
    const struct child_arg *a = p;
    struct result *res = &sh->res[a->idx];
    struct sfs_cache *c = NULL;
    pthread_mutex_t *m = &sh->mu[a->idx].m;
    uint64_t ops = 0;
    int err = 0;

    if (a->mode != MODE_MUTEX) {
        c = sfs_cache_attach(sh->path, 0, &err);
        if (!c) {
            res->err = err;
            atomic_fetch_add(&sh->ready, 1);
            return 1;
        }
    }
    /* MODE_SAME: every child on process 0's keys, in the same order. */
    const struct sfs_key *keys = sh->keys[a->mode == MODE_SAME ? 0 : a->idx];
    struct rusage ru0, ru1;

    if (pin_children) {
        cpu_set_t set;

        CPU_ZERO(&set);
        CPU_SET(a->idx % (int)sysconf(_SC_NPROCESSORS_ONLN), &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
            res->err = -errno;
    }

    atomic_fetch_add(&sh->ready, 1);
    while (!atomic_load_explicit(&sh->start, memory_order_acquire))
        usleep(50);
    getrusage(RUSAGE_SELF, &ru0);
    int64_t t0 = bench_now_ns(), c0 = bench_thread_cpu_ns();
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        for (int i = 0; i < 1024; i++) {
            if (a->mode == MODE_MUTEX) {
                pthread_mutex_lock(m);
                pthread_mutex_unlock(m);
            } else {
                struct sfs_lease l;
                int r = sfs_cache_get(c, &keys[i % NKEYS_PER_PROC], 0, 0, &l);

                if (r != SFS_HIT) {
                    res->err = r < 0 ? r : -EPROTO;
                    goto out;
                }
                sfs_cache_release(c, &l);
            }
        }
        ops += 1024;
    }
out:;
    int64_t t1 = bench_now_ns();
    res->cpu_ns = bench_thread_cpu_ns() - c0;
    getrusage(RUSAGE_SELF, &ru1);
    res->nvcsw = ru1.ru_nvcsw - ru0.ru_nvcsw;
    res->wall_ns = t1 - t0;
    res->ops = ops;
    res->ops_per_s = (double)ops * 1e9 / (double)(t1 - t0);
    sfs_cache_close(c);
    return res->err ? 1 : 0;
}

struct trial_out {
    double agg;     /* aggregate ops/s */
    double per_cpu; /* ops per CPU-second of the children: contention, not CPU supply */
    double share;   /* CPUs the children got: their CPU time over their windows */
    double csw_per_op; /* voluntary context switches per Get+Release, all children */
};

/* One trial: n children for dur_ns. Returns aggregate ops/s, or < 0. */
static double trial(int n, enum mode mode, int64_t dur_ns, struct trial_out *out)
{
    double ops = 0, cpu = 0, share = 0, csw = 0;
    struct child_arg args[MAXP];
    pid_t pids[MAXP];
    double agg = 0;
    int bad = 0;

    atomic_store(&sh->ready, 0);
    atomic_store(&sh->start, 0);
    atomic_store(&sh->stop, 0);
    memset(sh->res, 0, sizeof(sh->res));
    for (int i = 0; i < n; i++) {
        args[i] = (struct child_arg){.idx = i, .mode = mode};
        pids[i] = tu_fork(child_main, &args[i]);
    }
    while (atomic_load(&sh->ready) < n)
        usleep(100);
    atomic_store_explicit(&sh->start, 1, memory_order_release);
    bench_sleep_ns(dur_ns);
    atomic_store_explicit(&sh->stop, 1, memory_order_relaxed);
    for (int i = 0; i < n; i++) {
        if (tu_wait(pids[i]) != 0 || sh->res[i].err) {
            fprintf(stderr, "bench_cache: child %d failed: %s\n", i,
                    strerror(-sh->res[i].err ? -sh->res[i].err : EIO));
            bad = 1;
        }
        agg += sh->res[i].ops_per_s;
        ops += (double)sh->res[i].ops;
        cpu += (double)sh->res[i].cpu_ns / 1e9;
        csw += (double)sh->res[i].nvcsw;
        share += (double)sh->res[i].cpu_ns / (double)(sh->res[i].wall_ns ? sh->res[i].wall_ns : 1);
    }
    if (out) {
        out->agg = agg;
        out->per_cpu = cpu > 0 ? ops / cpu : 0;
        out->share = share;
        out->csw_per_op = ops > 0 ? csw / ops : 0;
    }
    return bad ? -1 : agg;
}

/* Keys for each process whose buckets no other key here uses (bucket_of()
 * in cache.c: hash(block) + shard, masked). */
static void pick_keys(uint32_t nbuckets)
{
    uint8_t *used = calloc(nbuckets, 1);
    uint64_t next = 1000;

    for (int p = 0; p < MAXP; p++) {
        for (int i = 0; i < NKEYS_PER_PROC; i++) {
            for (;;) {
                struct sfs_key k = tu_key(next++, 0);
                uint32_t b = (uint32_t)(sfs_key_hash(&k.block) + k.shard) & (nbuckets - 1);

                if (!used[b]) {
                    used[b] = 1;
                    sh->keys[p][i] = k;
                    break;
                }
            }
        }
    }
    free(used);
}

/* --pin and --trial MODE N MS, taken out of argv before bench_init. */
struct own_opts {
    int trial_mode; /* -1: the whole benchmark */
    int trial_n;
    int64_t trial_ms;
};

static int own_options(int *argc, char **argv, struct own_opts *o)
{
    static const char *const modes[] = {"mutex", "distinct", "same"};
    int j = 1;

    *o = (struct own_opts){.trial_mode = -1};
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--pin") == 0) {
            pin_children = true;
        } else if (strcmp(argv[i], "--trial") == 0 && i + 3 < *argc) {
            for (int m = 0; m < 3; m++)
                if (strcmp(argv[i + 1], modes[m]) == 0)
                    o->trial_mode = m; /* enum mode's order */
            o->trial_n = atoi(argv[i + 2]);
            o->trial_ms = atoll(argv[i + 3]);
            if (o->trial_mode < 0 || o->trial_n < 1 || o->trial_n > MAXP || o->trial_ms < 1) {
                fprintf(stderr, "--trial mutex|distinct|same 1|2 MS\n");
                return 2;
            }
            i += 3;
        } else {
            argv[j++] = argv[i];
        }
    }
    *argc = j;
    return 0;
}

/* --trial: one trial alone, its figures on stdout. */
static int one_trial(const struct own_opts *o)
{
    struct trial_out to;
    double agg = trial(o->trial_n, (enum mode)o->trial_mode, o->trial_ms * 1000000ll, &to);
    uint64_t ops = 0;

    if (agg < 0)
        return 1;
    for (int i = 0; i < o->trial_n; i++)
        ops += sh->res[i].ops;
    printf("trial %s x%d%s: %llu Get+Release, %.2fM/s aggregate, %.2f CPUs got, %.1fM per "
           "CPU-second, %.5f voluntary context switches per key\n",
           o->trial_mode == MODE_MUTEX ? "mutex" : o->trial_mode == MODE_CACHE ? "distinct" : "same",
           o->trial_n, pin_children ? " (pinned)" : "", (unsigned long long)ops, agg / 1e6,
           to.share, to.per_cpu / 1e6, to.csw_per_op);
    return 0;
}

int main(int argc, char **argv)
{
    struct bench b;
    struct own_opts oo;
    int rc = own_options(&argc, argv, &oo);
    if (rc)
        return rc;
    rc = bench_init(&b, "bench_cache", argc, argv);
    if (rc)
        return rc;

    const int runs = b.quick ? 3 : 9;
    const uint64_t n = b.quick ? 200000 : 2000000;
    const int64_t dur = b.quick ? 100000000ll : 200000000ll;
    const int strials = b.quick ? 2 : 15;
    int err = 0;

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(sh, 0, sizeof(*sh));
    for (int i = 0; i <= MAXP; i++)
        if (sfs_robust_mutex_init(&sh->mu[i].m) < 0) {
            fprintf(stderr, "robust mutex init failed\n");
            return 1;
        }

    struct sfs_cache *c = tu_cache(1024, 0, 4096);
    if (!c)
        return 1;
    snprintf(sh->path, sizeof(sh->path), "%s", tu_path("bench-cache.sock"));
    if ((err = sfs_cache_serve(c, sh->path)) < 0) {
        fprintf(stderr, "serve: %s\n", strerror(-err));
        return 1;
    }
    struct sfs_cache_info info;
    sfs_cache_info(c, &info);
    pick_keys(info.nbuckets);
    for (int p = 0; p < MAXP; p++)
        for (int i = 0; i < NKEYS_PER_PROC; i++)
            if (tu_load(c, &sh->keys[p][i]) < 0) {
                fprintf(stderr, "preload failed\n");
                return 1;
            }
    if (oo.trial_mode >= 0) {
        rc = one_trial(&oo);
        sfs_cache_close(c);
        return rc;
    }
    const struct sfs_key *k0 = &sh->keys[0][0];
    pthread_mutex_t *bm = &sh->mu[MAXP].m;

    /* 1. Get+Release against the robust pair. Each run alternates CHUNKS short
     * chunks of each (shorter than a time slice) and keeps each one's median
     * chunk, so a preemption by another tenant spoils a chunk, not the run. */
    double pair[16], gr[16], ratio[16], ca[CHUNKS], cb[CHUNKS], cc[CHUNKS], cd[CHUNKS], ce[CHUNKS];
    const uint64_t m = n / CHUNKS;
    time_robust_pair(bm, n / 4); /* warm-up */
    time_get_release(c, k0, n / 4, &err);
    for (int r = 0; r < runs; r++) {
        for (int j = 0; j < CHUNKS; j++) {
            ca[j] = time_robust_pair(bm, m);
            cb[j] = time_get_release(c, k0, m, &err);
        }
        if (err) {
            fprintf(stderr, "get/release: %s\n", strerror(-err));
            return 1;
        }
        pair[r] = bench_median(ca, CHUNKS);
        gr[r] = bench_median(cb, CHUNKS);
        ratio[r] = gr[r] / pair[r];
    }
    double pair_lo = bench_percentile(pair, runs, 0), pair_med = bench_median(pair, runs);
    double gr_lo = bench_percentile(gr, runs, 0), gr_med = bench_median(gr, runs);
    double ratio_lo = bench_percentile(ratio, runs, 0),
           ratio_hi = bench_percentile(ratio, runs, 100);
    double ratio_med = bench_median(ratio, runs);

    /* 1b. The same hit with the policies on (design.md, section 10): a second cache of
     * the same geometry with 8 eviction domains, the hit key's block pinned
     * and other blocks pinned too, against the plain cache, interleaved
     * chunk by chunk. The hit never looks at domains or pins (a miss does),
     * so the target is noise: <= 1.05. */
    struct sfs_cache_config pcfg = {.shard_size = 4096,
                                    .nslots = 1024,
                                    .no_reserved = true,
                                    .hugepages = SFS_HUGEPAGES_OFF,
                                    .partitions = 8};
    struct sfs_cache *cp = sfs_cache_create(&pcfg, &err);
    if (!cp || tu_load(cp, k0) < 0) {
        fprintf(stderr, "policy cache: %s\n", strerror(-err));
        return 1;
    }
    struct sfs_block_id pinned[16];
    pinned[0] = k0->block;
    for (int i = 1; i < 16; i++) {
        pinned[i] = tu_block(900000 + (uint64_t)i);
        tu_load(cp, &(struct sfs_key){pinned[i], (uint32_t)i});
    }
    if (sfs_cache_pin(cp, pinned, 16, 3600) < 16) {
        fprintf(stderr, "policy cache: pin failed\n");
        return 1;
    }
    double pol[16], plain[16], pratio[16];
    time_gr_thread(cp, k0, n / 4, &err);
    for (int r = 0; r < runs; r++) {
        for (int j = 0; j < CHUNKS; j++) {
            ca[j] = time_gr_thread(c, k0, m, &err);
            cb[j] = time_gr_thread(cp, k0, m, &err);
        }
        if (err) {
            fprintf(stderr, "get/release (policies): %s\n", strerror(-err));
            return 1;
        }
        plain[r] = bench_median(ca, CHUNKS);
        pol[r] = bench_median(cb, CHUNKS);
        pratio[r] = pol[r] / plain[r];
    }
    double plain_med = bench_median(plain, runs), pol_med = bench_median(pol, runs);
    double pratio_med = bench_median(pratio, runs);
    double pratio_lo = bench_percentile(pratio, runs, 0),
           pratio_hi = bench_percentile(pratio, runs, 100);
    sfs_cache_close(cp);

    /* 2. Where the hit path's time goes. */
    double g1[16], r1[16], priv[16], rmw[16], hsh[16], bpair[16], bgr[16], cf[CHUNKS], cg[CHUNKS];
    for (int r = 0; r < runs; r++) {
        for (int j = 0; j < CHUNKS; j++) {
            if (time_split(c, k0, m, &ca[j], &cb[j]) < 0) {
                fprintf(stderr, "split: not a hit\n");
                return 1;
            }
            cc[j] = time_cas_pair(m);
            cd[j] = time_atomic_rmw(m);
            ce[j] = time_hash(m);
            cf[j] = time_robust_pair(bm, m);
            cg[j] = time_get_release(c, k0, m, &err);
        }
        g1[r] = bench_median(ca, CHUNKS);
        r1[r] = bench_median(cb, CHUNKS);
        priv[r] = bench_median(cc, CHUNKS);
        rmw[r] = bench_median(cd, CHUNKS);
        hsh[r] = bench_median(ce, CHUNKS);
        if (err) {
            fprintf(stderr, "get/release: %s\n", strerror(-err));
            return 1;
        }
        bpair[r] = bench_median(cf, CHUNKS);
        bgr[r] = bench_median(cg, CHUNKS);
    }
    double get_med = bench_median(g1, runs), rel_med = bench_median(r1, runs);
    double priv_med = bench_median(priv, runs), rmw_med = bench_median(rmw, runs);
    double hash_med = bench_median(hsh, runs);
    double bpair_med = bench_median(bpair, runs), bgr_med = bench_median(bgr, runs);

    struct sfs_stats st;
    sfs_cache_stats(c, &st);
    uint64_t req_single = st.requests, hit_single = st.hits;

    /* 3. Scaling: 1 vs 2 processes, bare mutexes and the cache, interleaved. */
    double m1[16], m2[16], c1[16], c2[16], pc1[16], pc2[16], pm1[16], pm2[16], sh2[16], shm2[16];
    double sh1[16], shm1[16], scale[16], s2[16], ps2[16], shs2[16], sscale[16], cs1[16], cs2[16];
    double css2[16];
    struct trial_out to;
    trial(1, MODE_CACHE, dur / 5, NULL); /* warm-up: page in, attach path */
    for (int r = 0; r < strials; r++) {
        m1[r] = trial(1, MODE_MUTEX, dur, &to);
        pm1[r] = to.per_cpu;
        shm1[r] = to.share;
        c1[r] = trial(1, MODE_CACHE, dur, &to);
        pc1[r] = to.per_cpu;
        sh1[r] = to.share;
        cs1[r] = to.csw_per_op;
        m2[r] = trial(2, MODE_MUTEX, dur, &to);
        pm2[r] = to.per_cpu;
        shm2[r] = to.share;
        c2[r] = trial(2, MODE_CACHE, dur, &to);
        pc2[r] = to.per_cpu;
        sh2[r] = to.share;
        cs2[r] = to.csw_per_op;
        s2[r] = trial(2, MODE_SAME, dur, &to);
        ps2[r] = to.per_cpu;
        shs2[r] = to.share;
        css2[r] = to.csw_per_op;
        if (m1[r] < 0 || m2[r] < 0 || c1[r] < 0 || c2[r] < 0 || s2[r] < 0)
            return 1;
        scale[r] = c2[r] / c1[r];
        sscale[r] = s2[r] / c1[r];
    }
    double scale_lo = bench_percentile(scale, strials, 0);
    double scale_hi = bench_percentile(scale, strials, 100);
    double m1m = bench_median(m1, strials), m2m = bench_median(m2, strials);
    double c1m = bench_median(c1, strials), c2m = bench_median(c2, strials);
    double pm1m = bench_median(pm1, strials), pm2m = bench_median(pm2, strials);
    double pc1m = bench_median(pc1, strials), pc2m = bench_median(pc2, strials);
    double sh2m = bench_median(sh2, strials), shm2m = bench_median(shm2, strials);
    double sh1m = bench_median(sh1, strials), shm1m = bench_median(shm1, strials);
    double s2m = bench_median(s2, strials), ps2m = bench_median(ps2, strials);
    double shs2m = bench_median(shs2, strials);
    double sscale_lo = bench_percentile(sscale, strials, 0);
    double sscale_hi = bench_percentile(sscale, strials, 100);
    double cs1m = bench_median(cs1, strials), cs2m = bench_median(cs2, strials);
    double css2m = bench_median(css2, strials);
    sfs_cache_stats(c, &st);

    /* Report. */
    FILE *o = b.out;
    fprintf(o, "## Hit path: Get+Release of a resident key (`bench_cache`)\n\n");
    bench_stamp(&b);
    fprintf(o,
            "Baseline in the same run: an uncontended robust process-shared mutex "
            "lock/unlock pair (the kind that guards a bucket), in shared memory. "
            "%d runs of %llu operations each after a warm-up; within a run the two "
            "alternate in %d chunks and the run's figure is the median chunk; then the "
            "median over runs (min in brackets).\n\n",
            runs, (unsigned long long)n, CHUNKS);
    fprintf(o, "| what | ns/op | ratio to the pair | target | met |\n|---|---|---|---|---|\n");
    fprintf(o, "| robust mutex lock+unlock pair (baseline) | %.1f (%.1f) | 1.00 | | |\n", pair_med,
            pair_lo);
    fprintf(o,
            "| `sfs_cache_get` + `sfs_cache_release`, hit | %.1f (%.1f) | %.2f (runs: %.2f-%.2f) | "
            "<= 1.50 | %s |\n\n",
            gr_med, gr_lo, ratio_med, ratio_lo, ratio_hi, ratio_med <= 1.5 ? "yes" : "**no**");
    fprintf(o, "Policies on vs off, interleaved in the same run: the same hit on a "
               "cache with 8 eviction domains (`-o partitions=8`) and the key's block and 15 "
               "others pinned, against the plain cache above; each chunk on a fresh thread "
               "(a thread keeps a spare lease entry of one handle only).\n\n");
    fprintf(o, "| what | ns/op | ratio to policies off | target | met |\n|---|---|---|---|---|\n");
    fprintf(o, "| Get+Release, hit, policies off (partitions=1, no pins) | %.1f | 1.00 | | |\n",
            plain_med);
    fprintf(o,
            "| Get+Release, hit, 8 domains, block pinned | %.1f | %.3f (runs: %.3f-%.3f) | "
            "<= 1.05 | %s |\n\n",
            pol_med, pratio_med, pratio_lo, pratio_hi, pratio_med <= 1.05 ? "yes" : "**no**");
    fprintf(o, "Every Get here was a hit: %llu requests, %llu hits, before the scaling runs.\n\n",
            (unsigned long long)req_single, (unsigned long long)hit_single);

    fprintf(o,
            "Where the time goes (medians of %d runs, every part timed in the same "
            "alternating chunks, so this table has its own pair and total). Get and Release "
            "apart: the same key Get %d times, then released %d times; with that many leases "
            "of one key held at once its hit line takes 16 and the rest take the locked path "
            "(counted leases), so those two rows show mostly the locked path. A hit takes no "
            "lock (docs/recovery.md, \"Lock-free hits\"): it walks the chain, claims an entry "
            "of the slot's hit line in its own lease table by one CAS (seq_cst), reads the "
            "slot's word and checks the key and state; a release frees the entry by one CAS. "
            "So a Get+Release makes two locked instructions, both on a line only its process "
            "writes, and writes nothing on the slot's line (layout 7). The request is counted "
            "on the entry's own hit counter by a plain load and store (the entry's holder is "
            "its one writer); an atomic add on the process's counter line is shown for "
            "reference; hits are derived. The bucket-lock pair is shown for reference too: the "
            "locked path, not the hit, takes it.\n\n",
            runs, HOLD, HOLD);
    fprintf(o, "| part | ns | times per Get+Release | ns in total |\n|---|---|---|---|\n");
    fprintf(o, "| Get+Release, hit (as above, this phase) | %.1f | 1 | %.1f |\n", bgr_med, bgr_med);
    fprintf(o, "| `sfs_cache_get` alone (hit) | %.1f | 1 | %.1f |\n", get_med, get_med);
    fprintf(o, "| `sfs_cache_release` alone | %.1f | 1 | %.1f |\n", rel_med, rel_med);
    fprintf(o, "| robust pshared mutex pair (bucket lock; not on the hit path) | %.1f | 0 | 0 |\n",
            bpair_med);
    fprintf(o,
            "| two uncontended CAS (the hit's claim of its entry; the release's free) | "
            "%.1f | 1 | %.1f |\n",
            priv_med, priv_med);
    fprintf(o,
            "| relaxed atomic fetch_add (the old request counter; not on the hit path) | %.1f | "
            "0 | 0 |\n",
            rmw_med);
    fprintf(o, "| `sfs_key_hash` | %.1f | 1 | %.1f |\n", hash_med, hash_med);
    double parts = priv_med + hash_med;
    fprintf(o,
            "| rest (chain walk, key compare and re-check, entry stores, call overhead) | | | "
            "%.1f |\n\n",
            bgr_med - parts);

    fprintf(o,
            "Scaling: forked processes attached through the socket, each on %d resident "
            "keys in buckets no other process uses (distinct keys), or both on the same %d "
            "keys in the same order (same keys), for %.1f s per trial; %d trials, "
            "interleaved; medians. The bare-mutex row is this machine's own ceiling "
            "(one mutex per process, on its own cache line). The machine has %ld CPUs.\n\n",
            NKEYS_PER_PROC, NKEYS_PER_PROC, (double)dur / 1e9, strials,
            sysconf(_SC_NPROCESSORS_ONLN));
    fprintf(o, "| workload | 1 process, ops/s | 2 processes, aggregate ops/s | scaling | "
               "target | met | CPUs got, 1 / 2 processes | ops per CPU-second, 2 vs 1 | "
               "voluntary context switches per key, 1 / 2 processes |\n"
               "|---|---|---|---|---|---|---|---|---|\n");
    fprintf(o,
            "| robust mutex pair (baseline) | %.2fM | %.2fM | %.2fx | | | %.2f / %.2f | %.2f | |\n",
            m1m / 1e6, m2m / 1e6, m2m / m1m, shm1m, shm2m, pm2m / pm1m);
    fprintf(o,
            "| Get+Release, hit, distinct keys | %.2fM | %.2fM | %.2fx (trials %.2f-%.2f) | "
            ">= 1.80x | %s | %.2f / %.2f | %.2f | %.4f / %.4f |\n",
            c1m / 1e6, c2m / 1e6, c2m / c1m, scale_lo, scale_hi,
            c2m / c1m >= 1.8 ? "yes" : "**no**", sh1m, sh2m, pc2m / pc1m, cs1m, cs2m);
    fprintf(o,
            "| Get+Release, hit, same keys in the same order | %.2fM | %.2fM | %.2fx (trials "
            "%.2f-%.2f) | >= 1.80x | %s | %.2f / %.2f | %.2f | %.4f / %.4f |\n\n",
            c1m / 1e6, s2m / 1e6, s2m / c1m, sscale_lo, sscale_hi,
            s2m / c1m >= 1.8 ? "yes" : "**no**", sh1m, shs2m, ps2m / pc1m, cs1m, css2m);
    fprintf(o, "\"CPUs got\" is the children's CPU time over their windows (2.00: two "
               "whole CPUs); when other load on the machine takes one, scaling drops for the "
               "baseline too. \"Ops per CPU-second, 2 vs 1\" is the cost of sharing the cache "
               "apart from the CPU supply: 1.00 means no contention slowdown at all. "
               "Children %s. `--trial MODE N MS` runs one trial alone (for `strace -f -c -e "
               "futex`), `--pin` puts child i on CPU i.\n\n",
            pin_children ? "pinned, child i on CPU i (`--pin`)" : "not pinned");
    fprintf(o, "Counters after all runs: %llu requests, %llu hits, %llu misses.\n\n",
            (unsigned long long)st.requests, (unsigned long long)st.hits,
            (unsigned long long)st.misses);

    sfs_cache_close(c);
    return bench_finish(&b);
}
