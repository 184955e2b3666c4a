/* SPDX-License-Identifier: MIT */
/*
 * test_rank_inline.c - small tasks on the submitting thread (docs/rank.md,
 * "Small tasks inline"): a load of at most 64 entries and 1 MiB whose keys are all
 * Ready is copied and completed before sfs_rank_load returns; one of at
 * most 64 entries but more bytes has every key Got in the call and is
 * copied by the copier thread; any other task keeps the pipeline, with
 * the keys the inline try already Got handed on (hits, a waiter, an owner)
 * and never Got twice; a load after a dump of
 * the same key from the same rank returns the dump's bytes; inline loads
 * racing an evictor and a writer copy only whole, live versions of their
 * key; a rank whose daemon died fails what waits with -ESHUTDOWN; and, under
 * the fake libcudart (ctest rank_inline_cuda_fake), the CUDA copier gathers
 * a small task on the caller's thread.
 *
 * "Inline" is observed from outside: a task that is complete when
 * sfs_rank_load returns can only have been copied on the submitting thread
 * (the pipeline completes it on another thread, after the call returned and
 * at least two thread wake-ups later). Every byte copied is checked.
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MS  (1000 * 1000ll)
#define SEC (1000 * MS)

static struct sfs_rank *open_rank(const char *sock, const char *spec, int copier, unsigned depth)
{
    struct sfs_rank_config cfg;
    struct sfs_rank *rk;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = sock;
    cfg.device_id = 0;
    cfg.backend = spec;
    cfg.copier = copier;
    cfg.prealloc = false;
    cfg.key_timeout_ms = 20000;
    if (depth)
        cfg.load_depth = depth;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    return rk;
}

/* Entries for blocks first.. (shard 0), into bufs[i * SHARD]. */
static void entries(struct sfs_rank_entry *e, uint64_t first, uint32_t n, uint8_t *bufs)
{
    for (uint32_t i = 0; i < n; i++)
        e[i] = (struct sfs_rank_entry){tu_block(first + i), 0, bufs + (size_t)i * SHARD};
}

/* Make blocks first..first+n-1 (shard 0) Ready in c with tu_fill's bytes. */
static void resident(struct sfs_cache *c, uint64_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(first + i, 0);

        int r = tu_load(c, &k);

        cr_assert(r == SFS_OWNER || r == SFS_HIT, "block %llu: %d", (unsigned long long)(first + i),
                  r);
    }
}

/* ---------------------------------------------------------------------------
 * The inline path is taken, and only for small all-Ready tasks; a larger
 * all-Ready task of at most 64 entries is Got in the call, copied by the
 * copier thread.
 */

Test(rank_inline, resident_small_tasks_complete_in_the_call, .timeout = 60)
{
    struct env e;
    uint8_t *bufs = malloc(40 * SHARD);
    struct sfs_rank_entry ent[40];
    struct sfs_rank_stats s0, s;
    struct sfs_stats c0, c1;
    struct sfs_task *t;
    int st[40];

    env_up(&e, 128, 0);
    resident(e.c, 0, 40);
    struct sfs_rank *rk = open_rank(e.sock, NULL, SFS_COPIER_HOST, 0);

    /* One key, then 32 (32 x 32 KiB = 1 MiB, the bound), many times. */
    const uint32_t sizes[] = {1, 32};
    for (int round = 0; round < 50; round++) {
        for (size_t z = 0; z < 2; z++) {
            uint32_t n = sizes[z];

            memset(bufs, 0, (size_t)n * SHARD);
            entries(ent, 0, n, bufs);
            sfs_rank_stats(rk, &s0);
            sfs_cache_stats(e.c, &c0);
            cr_assert_eq(sfs_rank_load(rk, ent, n, &t), 0);
            cr_assert(sfs_rank_task_done(t),
                      "round %d: a resident task of %u was not copied "
                      "in the call",
                      round, n);
            cr_assert_eq(sfs_rank_wait(t, 0, st), 0);
            sfs_rank_task_free(t);
            check_bufs(0, n, 0, bufs, st);
            sfs_rank_stats(rk, &s);
            sfs_cache_stats(e.c, &c1);
            /* Counted as the pipeline counts: a task, n entries, n hits,
             * n copies in one batch; one Get per key in the cache. */
            cr_assert_eq(s.tasks - s0.tasks, 1);
            cr_assert_eq(s.entries - s0.entries, n);
            cr_assert_eq(s.hits - s0.hits, n);
            cr_assert_eq(s.copies - s0.copies, n);
            cr_assert_eq(s.copy_batches - s0.copy_batches, 1);
            cr_assert_eq(s.bytes_copied - s0.bytes_copied, (uint64_t)n * SHARD);
            cr_assert_eq(s.failed, 0);
            cr_assert_eq(c1.requests - c0.requests, n);
        }
    }
    /* Past the bound (40 x 32 KiB > 1 MiB): every key Got in the call, the
     * copy left to the copier thread (sfs_rank_load returns without it). */
    for (int round = 0; round < 50; round++) {
        memset(bufs, 0, 40 * SHARD);
        entries(ent, 0, 40, bufs);
        sfs_rank_stats(rk, &s0);
        sfs_cache_stats(e.c, &c0);
        cr_assert_eq(sfs_rank_load(rk, ent, 40, &t), 0);
        sfs_cache_stats(e.c, &c1);
        cr_assert_eq(c1.requests - c0.requests, 40,
                     "round %d: %lu of 40 keys Got when sfs_rank_load returned", round,
                     (unsigned long)(c1.requests - c0.requests));
        cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
        sfs_rank_task_free(t);
        check_bufs(0, 40, 0, bufs, st);
        sfs_rank_stats(rk, &s);
        cr_assert_eq(s.hits - s0.hits, 40);
        cr_assert_eq(s.copies - s0.copies, 40);
        cr_assert_eq(s.bytes_copied - s0.bytes_copied, (uint64_t)40 * SHARD);
    }
    sfs_rank_close(rk);
    free(bufs);
    env_down(&e);
}

/* A missing key among Ready ones: the pipeline, each key Got once. The
 * missing key is first in the walk, in the middle, and last. */
Test(rank_inline, a_missing_key_goes_the_pipeline, .timeout = 60)
{
    struct env e;
    char spec[256];
    uint8_t *bufs = malloc(8 * SHARD);
    struct sfs_rank_entry ent[8];
    struct sfs_rank_stats s0, s;
    struct sfs_stats c0, c1;
    struct sfs_task *t;
    int st[8];

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 8, 1, SHARD);
    snprintf(spec, sizeof(spec), "posix:%s", e.dir);
    struct sfs_rank *rk = open_rank(e.sock, spec, SFS_COPIER_HOST, 0);
    const uint32_t missing[] = {0, 3, 7};

    for (size_t m = 0; m < 3; m++) {
        struct sfs_key gone = tu_key(missing[m], 0);

        resident(e.c, 0, 8);
        assert_no_leases(e.c); /* removes every key: make them Ready again */
        resident(e.c, 0, 8);
        cr_assert_eq(sfs_cache_remove(e.c, &gone), 0);
        memset(bufs, 0, 8 * SHARD);
        entries(ent, 0, 8, bufs);
        sfs_rank_stats(rk, &s0);
        sfs_cache_stats(e.c, &c0);
        cr_assert_eq(sfs_rank_load(rk, ent, 8, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
        sfs_rank_task_free(t);
        check_bufs(0, 8, 0, bufs, st);
        sfs_rank_stats(rk, &s);
        sfs_cache_stats(e.c, &c1);
        cr_assert_eq(s.hits - s0.hits, 7, "missing %u", missing[m]);
        cr_assert_eq(s.owner_loads - s0.owner_loads, 1);
        cr_assert_eq(s.copies - s0.copies, 8);
        /* Every key Got once: the try's Gets were handed on, not redone. */
        cr_assert_eq(c1.requests - c0.requests, 8, "missing %u: %llu Gets", missing[m],
                     (unsigned long long)(c1.requests - c0.requests));
    }
    sfs_rank_close(rk);
    free(bufs);
    env_down(&e);
}

/* A key another owner is loading (the try's Get made it a waiter), and an
 * ownership the try cannot serve (depth 1, its one token held by a slow
 * load): both reach the pipeline and end right. */
Test(rank_inline, waiter_and_owner_without_a_token_are_handed_on, .timeout = 60)
{
    struct env e;
    char spec[256];
    uint8_t *bufs = malloc(4 * SHARD), *slow = malloc(SHARD);
    struct sfs_rank_entry ent[4], se;
    struct sfs_rank_stats s0, s;
    struct sfs_task *t, *ts;
    struct sfs_lease l;
    int st[4], sst;

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 4, 1, SHARD);
    write_store(e.dir, 100, 1, 1, SHARD);
    snprintf(spec, sizeof(spec), "fault:latency_us=300000:%s", e.dir);
    struct sfs_rank *rk = open_rank(e.sock, spec, SFS_COPIER_HOST, 1);

    /* Blocks 0, 1 Ready; block 2 is being loaded by the test (its owner). */
    resident(e.c, 0, 2);
    struct sfs_key k2 = tu_key(2, 0);
    cr_assert_eq(sfs_cache_get(e.c, &k2, 0, 0, &l), SFS_OWNER);
    entries(ent, 0, 3, bufs);
    sfs_rank_stats(rk, &s0);
    cr_assert_eq(sfs_rank_load(rk, ent, 3, &t), 0);
    usleep(50 * 1000);
    cr_assert_not(sfs_rank_task_done(t), "a task waiting on another owner completed");
    cr_assert_eq(tu_publish(e.c, &k2, &l), 0);
    sfs_cache_release(e.c, &l);
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    sfs_rank_task_free(t);
    check_bufs(0, 3, 0, bufs, st);
    sfs_rank_stats(rk, &s);
    cr_assert_eq(s.hits - s0.hits, 2);
    cr_assert_eq(s.waits - s0.waits, 1);

    /* Depth 1: a slow load of block 100 holds the one token... */
    entries(&se, 100, 1, slow);
    cr_assert_eq(sfs_rank_load(rk, &se, 1, &ts), 0);
    /* ...so the try's ownership of block 3 is let go (Idle), and the
     * dispatcher takes it over once the token is back. */
    entries(ent, 0, 4, bufs);
    ent[2].block = tu_block(3); /* 0, 1 Ready; 3 missing */
    memset(bufs, 0, 4 * SHARD);
    cr_assert_eq(sfs_rank_load(rk, ent, 3, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    cr_assert_eq(sfs_rank_wait(ts, 20000, &sst), 0);
    sfs_rank_task_free(t);
    sfs_rank_task_free(ts);
    cr_assert_eq(sst, 0);
    check_bufs(100, 1, 0, slow, &sst);
    check_bufs(0, 2, 0, bufs, st);
    struct sfs_key k3 = tu_key(3, 0);
    cr_assert_eq(st[2], 0);
    cr_assert_eq(tu_check(&k3, bufs + 2 * SHARD, SHARD), -1);
    sfs_rank_close(rk);
    free(bufs);
    free(slow);
    env_down(&e);
}

/* ---------------------------------------------------------------------------
 * A dump, then a load of the same key from the same rank: the dump's bytes.
 * The load is small and the key Ready (the old bytes) when it is submitted;
 * it must not overtake the dump, which the dispatcher has not walked yet.
 */

Test(rank_inline, load_after_dump_sees_the_dump, .timeout = 120)
{
    struct env e;
    char spec[256];
    uint8_t *src = malloc(SHARD), *dst = malloc(SHARD), *want = malloc(SHARD);
    struct sfs_rank_entry de, le;
    struct sfs_task *td, *tl;
    int sd, sl;

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 1, 1, SHARD);
    /* A slow store: the dump is in flight long after the load's submit. */
    snprintf(spec, sizeof(spec), "fault:latency_us=2000:%s", e.dir);
    struct sfs_rank *rk = open_rank(e.sock, spec, SFS_COPIER_HOST, 0);
    struct sfs_key k = tu_key(0, 0);

    resident(e.c, 0, 1);
    for (int v = 1; v <= 60; v++) {
        /* Ready with the previous version: a load alone would be inline. */
        cr_assert_eq(sfs_cache_state(e.c, &k), SFS_STATE_READY);
        tu_fill(&k, want, SHARD);
        for (uint32_t i = 0; i < SHARD; i++)
            want[i] ^= (uint8_t)v;
        memcpy(src, want, SHARD);
        memset(dst, 0, SHARD);
        de = (struct sfs_rank_entry){k.block, 0, src};
        le = (struct sfs_rank_entry){k.block, 0, dst};
        cr_assert_eq(sfs_rank_dump(rk, &de, 1, &td), 0);
        cr_assert_eq(sfs_rank_load(rk, &le, 1, &tl), 0);
        cr_assert_eq(sfs_rank_wait(tl, 20000, &sl), 0);
        cr_assert_eq(sfs_rank_wait(td, 20000, &sd), 0);
        sfs_rank_task_free(td);
        sfs_rank_task_free(tl);
        cr_assert_eq(sd, 0, "version %d: dump %d", v, sd);
        cr_assert_eq(sl, 0, "version %d: load %d", v, sl);
        cr_assert_eq(memcmp(dst, want, SHARD), 0,
                     "version %d: the load did not return the dump's bytes", v);
    }
    sfs_rank_close(rk);
    free(src);
    free(dst);
    free(want);
    env_down(&e);
}

/* ---------------------------------------------------------------------------
 * Inline loads racing an evictor and a writer of the same keys. Each key's
 * bytes are tu_fill's XOR a version byte (0: as the store has them); a
 * writer rewrites keys with new versions through the core's SFS_GET_WRITE
 * (the mount's way), an evictor removes keys and churns filler keys through
 * a small cache so slots are reused for other keys. Every copied shard must
 * be one whole version of its own key: bytes of a slot released before the
 * copy (or reused meanwhile) would not be.
 */

#define RACE_KEYS   12
#define RACE_SLOTS  24
#define RACE_TASKS  1500
#define RACE_FILLER 1000

struct race {
    struct env *e;
    struct sfs_rank *rk;
    _Atomic int stop;
    _Atomic long inline_done, checked, enoent, bad;
    char why[256];
};

/* 0 when buf is key k's bytes in one version (any); -1 otherwise. */
static int one_version(const struct sfs_key *k, const uint8_t *buf, uint8_t *scratch)
{
    tu_fill(k, scratch, SHARD);
    uint8_t v = buf[0] ^ scratch[0];

    for (uint32_t i = 0; i < SHARD; i++)
        if ((uint8_t)(buf[i] ^ v) != scratch[i])
            return -1;
    return 0;
}

static void *race_loader(void *arg)
{
    struct race *r = arg;
    uint8_t *bufs = malloc(4 * SHARD), *scratch = malloc(SHARD);
    uint64_t rng = (uint64_t)(uintptr_t)pthread_self() | 1;

    for (int i = 0; i < RACE_TASKS; i++) {
        struct sfs_rank_entry ent[4];
        uint32_t n = 1 + (uint32_t)(tu_rng_next(&rng) % 4);
        struct sfs_task *t;
        int st[4];

        for (uint32_t j = 0; j < n; j++)
            ent[j] = (struct sfs_rank_entry){tu_block(tu_rng_next(&rng) % RACE_KEYS), 0,
                                             bufs + (size_t)j * SHARD};
        memset(bufs, 0xee, 4 * SHARD);
        if (sfs_rank_load(r->rk, ent, n, &t) < 0) {
            atomic_fetch_add(&r->bad, 1);
            snprintf(r->why, sizeof(r->why), "load refused");
            continue;
        }
        if (sfs_rank_task_done(t))
            atomic_fetch_add(&r->inline_done, 1);
        if (sfs_rank_wait(t, 20000, st) < 0) {
            atomic_fetch_add(&r->bad, 1);
            snprintf(r->why, sizeof(r->why), "a task hung");
            sfs_rank_task_free(t);
            continue;
        }
        sfs_rank_task_free(t);
        for (uint32_t j = 0; j < n; j++) {
            struct sfs_key k = {ent[j].block, 0};

            if (st[j] != 0) {
                atomic_fetch_add(&r->bad, 1);
                snprintf(r->why, sizeof(r->why), "entry status %d", st[j]);
            } else if (one_version(&k, bufs + (size_t)j * SHARD, scratch) < 0) {
                atomic_fetch_add(&r->bad, 1);
                snprintf(r->why, sizeof(r->why), "entry %u: not one version of its key", j);
            } else {
                atomic_fetch_add(&r->checked, 1);
            }
        }
    }
    free(bufs);
    free(scratch);
    return NULL;
}

static void *race_writer(void *arg)
{
    struct race *r = arg;
    uint64_t rng = 77;
    uint8_t v = 0;

    while (!atomic_load(&r->stop)) {
        struct sfs_key k = tu_key(tu_rng_next(&rng) % RACE_KEYS, 0);
        struct sfs_lease l;
        int role = sfs_cache_get(r->e->c, &k, SFS_GET_WRITE, sfs_deadline_after(SEC), &l);

        if (role == -EBUSY || role == -ENOSPC) {
            sched_yield();
            continue;
        }
        if (role != SFS_OWNER) {
            if (role >= 0)
                sfs_cache_release(r->e->c, &l);
            continue;
        }
        uint8_t *d = sfs_cache_data(r->e->c, &l);

        v = (uint8_t)(v + 1) ? (uint8_t)(v + 1) : 1;
        tu_fill(&k, d, SHARD);
        for (uint32_t i = 0; i < SHARD; i++)
            d[i] ^= v;
        sfs_cache_publish(r->e->c, &l, SHARD, SFS_PUBLISH_WRITTEN);
        sfs_cache_release(r->e->c, &l);
    }
    return NULL;
}

static void *race_evictor(void *arg)
{
    struct race *r = arg;
    uint64_t rng = 99;

    while (!atomic_load(&r->stop)) {
        struct sfs_key k = tu_key(tu_rng_next(&rng) % RACE_KEYS, 0);
        struct sfs_key f = tu_key(RACE_FILLER + tu_rng_next(&rng) % 64, 0);

        sfs_cache_remove(r->e->c, &k); /* -EBUSY while leased: fine */
        tu_load(r->e->c, &f);          /* reuses a slot, maybe k's */
        sched_yield();
    }
    return NULL;
}

Test(rank_inline, inline_loads_race_an_evictor_and_a_writer, .timeout = 240)
{
    struct env e;
    char spec[256];
    struct race r = {.e = &e};
    pthread_t th[4];

    env_up(&e, RACE_SLOTS, 0);
    write_store(e.dir, 0, RACE_KEYS, 1, SHARD);
    snprintf(spec, sizeof(spec), "posix:%s", e.dir);
    resident(e.c, 0, RACE_KEYS);
    r.rk = open_rank(e.sock, spec, SFS_COPIER_HOST, 0);
    pthread_create(&th[0], NULL, race_loader, &r);
    pthread_create(&th[1], NULL, race_loader, &r);
    pthread_create(&th[2], NULL, race_writer, &r);
    pthread_create(&th[3], NULL, race_evictor, &r);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    atomic_store(&r.stop, 1);
    pthread_join(th[2], NULL);
    pthread_join(th[3], NULL);
    fprintf(stderr, "race: %ld entries checked, %ld of %d tasks inline, %ld bad\n",
            atomic_load(&r.checked), atomic_load(&r.inline_done), 2 * RACE_TASKS,
            atomic_load(&r.bad));
    cr_assert_eq(atomic_load(&r.bad), 0, "%ld bad entries; the last: %s", atomic_load(&r.bad),
                 r.why);
    cr_assert_gt(atomic_load(&r.inline_done), 0, "no task took the inline path");
    sfs_rank_close(r.rk);
    env_down(&e);
}

/* ---------------------------------------------------------------------------
 * The daemon dies: a small task whose try stopped at a key the daemon owns
 * fails that entry with -ESHUTDOWN (and its hit is copied, or fails so too);
 * a small task submitted after it attaches again or fails at once, and
 * never returns stale or foreign bytes.
 */

struct daemon_shm {
    char path[108];
    _Atomic int step;
};

/* Creates a cache, makes blocks 0..3 Ready, owns block 4 (never published),
 * serves path until killed (20 s at most). */
static int daemon_main(void *arg)
{
    struct daemon_shm *d = arg;
    struct sfs_cache *c = tu_cache(32, 0, SHARD);
    struct sfs_lease l;

    if (!c || sfs_cache_serve(c, d->path) < 0)
        return 10;
    for (uint64_t b = 0; b < 4; b++) {
        struct sfs_key k = tu_key(b, 0);

        if (tu_load(c, &k) < 0)
            return 11;
    }
    struct sfs_key k4 = tu_key(4, 0);
    if (sfs_cache_get(c, &k4, 0, 0, &l) != SFS_OWNER)
        return 12;
    atomic_store(&d->step, 1);
    for (int i = 0; i < 2000; i++)
        usleep(10 * 1000);
    return 0;
}

Test(rank_inline, daemon_death_fails_a_small_task_with_eshutdown, .timeout = 60)
{
    struct daemon_shm *d =
        mmap(NULL, sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    uint8_t *bufs = malloc(2 * SHARD);
    struct sfs_rank_entry ent[2];
    struct sfs_task *t;
    int st[2];

    cr_assert(d != MAP_FAILED);
    memset(d, 0, sizeof(*d));
    snprintf(d->path, sizeof(d->path), "%s", tu_path("daemon"));
    pid_t pid = tu_fork(daemon_main, d);
    for (int i = 0; i < 500 && !atomic_load(&d->step); i++)
        usleep(10 * 1000);
    cr_assert(atomic_load(&d->step), "the daemon never served (%d)", tu_wait_for(pid, 0));
    struct sfs_rank *rk = open_rank(d->path, NULL, SFS_COPIER_HOST, 0);

    /* Resident: inline. */
    entries(ent, 0, 2, bufs);
    cr_assert_eq(sfs_rank_load(rk, ent, 2, &t), 0);
    cr_assert(sfs_rank_task_done(t));
    cr_assert_eq(sfs_rank_wait(t, 0, st), 0);
    sfs_rank_task_free(t);
    check_bufs(0, 2, 0, bufs, st);

    /* Block 0 Ready, block 4 the daemon's own load: the try hands both on. */
    memset(bufs, 0, 2 * SHARD);
    ent[1].block = tu_block(4);
    cr_assert_eq(sfs_rank_load(rk, ent, 2, &t), 0);
    usleep(100 * 1000);
    cr_assert_not(sfs_rank_task_done(t), "a task waiting on the daemon's load completed");
    kill(pid, SIGKILL);
    cr_assert_eq(sfs_rank_wait(t, 5000, st), 0, "the task hung after the daemon died");
    sfs_rank_task_free(t);
    cr_assert_eq(st[1], -ESHUTDOWN, "block 4: %d", st[1]);
    cr_assert(st[0] == 0 || st[0] == -ESHUTDOWN, "block 0: %d", st[0]);
    if (st[0] == 0) {
        struct sfs_key k0 = tu_key(0, 0);

        cr_assert_eq(tu_check(&k0, bufs, SHARD), -1);
    }
    cr_assert_eq(tu_wait(pid), 128 + SIGKILL);

    /* After: no daemon. The call fails (attach error) or the task ends. */
    for (int i = 0; i < 20; i++) {
        int r;

        memset(bufs, 0, SHARD);
        r = sfs_rank_load(rk, ent, 1, &t);
        if (r < 0) {
            cr_assert(r == -ECONNREFUSED || r == -ENOENT, "load: %s", strerror(-r));
            continue;
        }
        cr_assert_eq(sfs_rank_wait(t, 5000, st), 0);
        sfs_rank_task_free(t);
        cr_assert(st[0] == 0 || st[0] == -ESHUTDOWN, "block 0: %d", st[0]);
        if (st[0] == 0) {
            struct sfs_key k0 = tu_key(0, 0);

            cr_assert_eq(tu_check(&k0, bufs, SHARD), -1);
        }
    }
    sfs_rank_close(rk);
    free(bufs);
    munmap(d, sizeof(*d));
}

/* ---------------------------------------------------------------------------
 * The CUDA copier (under the fake libcudart: ctest rank_inline_cuda_fake;
 * skipped without a device). The runtime is reached with dlopen, as in
 * test_rank_cuda.c.
 */

struct cudart {
    void *h;
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*memcpy_)(void *, const void *, size_t, int);
    int (*set_device)(int);
};

#define CUDA_D2H 2

static void cuda_need(struct cudart *c)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                        "libcudart.so"};
    const char *req = getenv("SHARDFS_TEST_REQUIRE_CUDA");

    if (sfs_rank_cuda_devices() <= 0) {
        cr_assert(!req || atoi(req) <= 0, "no CUDA device, and SHARDFS_TEST_REQUIRE_CUDA=%s", req);
        cr_skip_test("no CUDA device (or built without CUDA): the inline gather not tested");
    }
    c->h = NULL;
    for (size_t i = 0; i < 4 && !c->h; i++)
        c->h = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    cr_assert_not_null(c->h, "libcudart not loaded");
    c->malloc_ = (__typeof__(c->malloc_))dlsym(c->h, "cudaMalloc");
    c->free_ = (__typeof__(c->free_))dlsym(c->h, "cudaFree");
    c->memcpy_ = (__typeof__(c->memcpy_))dlsym(c->h, "cudaMemcpy");
    c->set_device = (__typeof__(c->set_device))dlsym(c->h, "cudaSetDevice");
    cr_assert(c->malloc_ && c->free_ && c->memcpy_ && c->set_device);
}

struct cuda_job {
    struct cudart *cu;
    struct sfs_rank *rk;
    uint8_t *dev;
    int current; /* the device this thread makes current first */
    bool done_in_call;
    int st[8];
    int rc;
};

/* One small resident load into device memory from a thread whose current
 * device is j->current. */
static void *cuda_load_from(void *arg)
{
    struct cuda_job *j = arg;
    struct sfs_rank_entry ent[8];
    struct sfs_task *t;

    j->rc = j->cu->set_device(j->current);
    if (j->rc)
        return NULL;
    entries(ent, 0, 8, j->dev);
    j->rc = sfs_rank_load(j->rk, ent, 8, &t);
    if (j->rc)
        return NULL;
    j->done_in_call = sfs_rank_task_done(t);
    j->rc = sfs_rank_wait(t, 20000, j->st);
    sfs_rank_task_free(t);
    return NULL;
}

Test(rank_inline, cuda_small_task_is_gathered_on_the_callers_thread, .timeout = 60)
{
    struct cudart cu;
    struct env e;
    uint8_t *dev = NULL, *host = malloc(8 * SHARD);
    struct sfs_rank_stats s0, s;
    pthread_t th;

    cuda_need(&cu);
    env_up(&e, 64, 0);
    resident(e.c, 0, 8);
    struct sfs_rank *rk = open_rank(e.sock, NULL, SFS_COPIER_CUDA, 0);
    cr_assert_str_eq(sfs_rank_copier_name(rk), "cuda");
    cr_assert_eq(cu.set_device(0), 0);
    cr_assert_eq(cu.malloc_((void **)&dev, 8 * SHARD), 0);

    /* This thread's current device is the rank's: one launch, here. */
    for (int round = 0; round < 20; round++) {
        struct cuda_job j = {.cu = &cu, .rk = rk, .dev = dev, .current = 0};

        sfs_rank_stats(rk, &s0);
        pthread_create(&th, NULL, cuda_load_from, &j);
        pthread_join(th, NULL);
        cr_assert_eq(j.rc, 0);
        cr_assert(j.done_in_call, "round %d: the gather did not run in the call", round);
        memset(host, 0, 8 * SHARD);
        cr_assert_eq(cu.memcpy_(host, dev, 8 * SHARD, CUDA_D2H), 0);
        check_bufs(0, 8, 0, host, j.st);
        sfs_rank_stats(rk, &s);
        cr_assert_eq(s.copy_batches - s0.copy_batches, 1, "one launch per small task");
        cr_assert_eq(s.copies - s0.copies, 8);
    }
    /* A thread whose current device is another: the copier thread gathers
     * it (the caller's device is never changed), still right. */
    if (sfs_rank_cuda_devices() > 1) {
        struct cuda_job j = {.cu = &cu, .rk = rk, .dev = dev, .current = 1};

        pthread_create(&th, NULL, cuda_load_from, &j);
        pthread_join(th, NULL);
        cr_assert_eq(j.rc, 0);
        memset(host, 0, 8 * SHARD);
        cr_assert_eq(cu.memcpy_(host, dev, 8 * SHARD, CUDA_D2H), 0);
        check_bufs(0, 8, 0, host, j.st);
    }
    sfs_rank_close(rk);
    cu.free_(dev);
    free(host);
    env_down(&e);
}
