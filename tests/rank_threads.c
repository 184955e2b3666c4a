/* SPDX-License-Identifier: MIT */
/*
 * rank_threads.c - the rank library's threads (dispatcher, watchers,
 * workers, copier, backend completions) under one roof, for ThreadSanitizer.
 *
 * A plain program, not a Criterion one, so it runs under TSan (Criterion's
 * runner does not start there). One process creates a cache and attaches
 * one rank to it through the socket (NRANKS); application threads load, dump and
 * prefetch overlapping tasks at once over a fault backend with latency, so
 * hits, owners, waiters and hand-offs between the library's threads all
 * happen; the hot phase's dumps are write-behind (the background threads). Small tasks (4 keys) between the big ones take the inline path
 * on the application threads when their keys are Ready, and hand their
 * keys on to the dispatcher when not. Then a rank whose loads outlast its
 * key timeout: entries fail at their deadlines while the backend still
 * holds the loads, whose late completions settle the slots. Every byte
 * copied is verified. Exit status 0 means all held.
 */
#include "testutil.h"

#include <shardfs/backend.h>
#include <shardfs/rank.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHARD   8192
#define NBLOCKS 96
#define ROUNDS  12
/* One rank. Each rank maps the cache's memfds at its own addresses, and
 * TSan knows memory and locks by address: with two ranks in one process, an
 * order that passes through the other rank's mapping (it evicts a slot under
 * its copy of a bucket lock, and this rank takes the slot next) is invisible,
 * and TSan reports the slot's key words as a race (1 run in 4 did). Ranks
 * in separate processes are the crash and stress suites' business. */
#define NRANKS  1
#define LATE0   1000 /* late_loads()'s blocks */

static const char *sock;
static atomic_long wrong, failed;
static atomic_long small_inline, small_tasks; /* small tasks; of those, done in the call */

struct app {
    struct sfs_rank *rank;
    int id;
};

/* A small task: the first 4 entries of e (as set), loaded again into a
 * buffer of its own, checked. */
static void small_load(struct app *a, const struct sfs_rank_entry *e)
{
    struct sfs_rank_entry s[4];
    uint8_t *buf = malloc(4 * SHARD);
    struct sfs_task *t;
    int st[4];

    for (int i = 0; i < 4; i++)
        s[i] = (struct sfs_rank_entry){e[i].block, e[i].shard, buf + (size_t)i * SHARD};
    if (sfs_rank_load(a->rank, s, 4, &t) < 0) {
        atomic_fetch_add(&failed, 1);
        free(buf);
        return;
    }
    if (sfs_rank_task_done(t)) /* complete in the call: inline */
        atomic_fetch_add(&small_inline, 1);
    if (sfs_rank_wait(t, 30000, st) < 0) {
        sfs_rank_task_free(t);
        atomic_fetch_add(&failed, 1);
        free(buf);
        return;
    }
    atomic_fetch_add(&small_tasks, 1);
    sfs_rank_task_free(t);
    for (int i = 0; i < 4; i++) {
        struct sfs_key k = {.block = s[i].block, .shard = s[i].shard};

        if (st[i] < 0)
            atomic_fetch_add(&failed, 1);
        else if (tu_check(&k, s[i].addr, SHARD) >= 0)
            atomic_fetch_add(&wrong, 1);
    }
    free(buf);
}

static void *app_thread(void *arg)
{
    struct app *a = arg;
    struct sfs_rank_entry e[NBLOCKS];
    int st[NBLOCKS];
    uint8_t *buf = malloc((size_t)NBLOCKS * SHARD);

    for (int round = 0; round < ROUNDS; round++) {
        uint32_t shard = (uint32_t)(round % 3);
        struct sfs_task *t;

        for (int i = 0; i < NBLOCKS; i++) {
            e[i].block = tu_block((uint64_t)(i + a->id * 7) % NBLOCKS);
            e[i].shard = shard;
            e[i].addr = buf + (size_t)i * SHARD;
        }
        if (round % 4 == 3) {
            /* Dump what we hold, write-through, then keep loading. */
            for (int i = 0; i < NBLOCKS; i++) {
                struct sfs_key k = {.block = e[i].block, .shard = 50 + (uint32_t)a->id};
                e[i].shard = k.shard;
                tu_fill(&k, e[i].addr, SHARD);
            }
            if (sfs_rank_dump(a->rank, e, NBLOCKS, &t) == 0) {
                small_load(a, e); /* after the dump, before its end */
                sfs_rank_wait(t, 30000, st);
                sfs_rank_task_free(t);
            }
            continue;
        }
        if (round % 5 == 4) {
            struct sfs_key keys[8];
            for (int i = 0; i < 8; i++)
                keys[i] = tu_key((uint64_t)i, 7);
            sfs_rank_prefetch(a->rank, keys, 8);
        }
        if (sfs_rank_load(a->rank, e, NBLOCKS, &t) < 0 || sfs_rank_wait(t, 30000, st) < 0) {
            atomic_fetch_add(&failed, 1);
            continue;
        }
        sfs_rank_task_free(t);
        for (int i = 0; i < NBLOCKS; i++) {
            struct sfs_key k = {.block = e[i].block, .shard = shard};

            if (st[i] < 0)
                atomic_fetch_add(&failed, 1);
            else if (tu_check(&k, e[i].addr, SHARD) >= 0)
                atomic_fetch_add(&wrong, 1);
        }
        small_load(a, e); /* resident now, or evicted meanwhile */
        for (int i = 0; i < 4; i++)
            e[i].shard = (shard + 1) % 3; /* loaded by another thread, or not */
        small_load(a, e);
    }
    free(buf);
    return NULL;
}

/* Phase 2: small tasks over 16 keys (shard 6) that stay resident, from
 * several threads of both ranks at once, while one thread dumps the same
 * keys (the same bytes) through rank 0: inline tries racing each other, the
 * dispatcher's dump walks and the copier. */
#define HOT 16

static void *hot_loader(void *arg)
{
    struct app *a = arg;
    struct sfs_rank_entry e[4];
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(a->id + 1);

    for (int i = 0; i < 200; i++) {
        for (int j = 0; j < 4; j++)
            e[j] = (struct sfs_rank_entry){tu_block(tu_rng_next(&rng) % HOT), 6, NULL};
        small_load(a, e);
    }
    return NULL;
}

static void *hot_dumper(void *arg)
{
    struct app *a = arg;
    struct sfs_rank_entry e[HOT];
    uint8_t *buf = malloc((size_t)HOT * SHARD);
    int st[HOT];

    for (int i = 0; i < HOT; i++) {
        struct sfs_key k = tu_key((uint64_t)i, 6);

        e[i] = (struct sfs_rank_entry){k.block, 6, buf + (size_t)i * SHARD};
        tu_fill(&k, e[i].addr, SHARD);
    }
    for (int round = 0; round < 10; round++) {
        struct sfs_task *t;

        if (sfs_rank_dump(a->rank, e, HOT, &t) < 0) {
            atomic_fetch_add(&failed, 1);
            continue;
        }
        small_load(a, e); /* after the dump: waits for it */
        if (sfs_rank_wait(t, 30000, st) < 0)
            atomic_fetch_add(&failed, 1);
        sfs_rank_task_free(t);
    }
    free(buf);
    return NULL;
}

/* Late loads: a rank whose key timeout (100 ms) is shorter than its
 * backend's latency (400 ms). Every entry fails -ETIMEDOUT while its load is
 * still in the backend (the expirer thread), the loads' completions then
 * settle the slots on the backend's thread, and nothing reaches the failed
 * entries' buffers; a second task hits the late bytes. 0 when all held. */
static int late_loads(struct sfs_cache *c, const char *dir)
{
    enum { N = 16 };
    struct sfs_rank_config cfg;
    struct sfs_rank_entry e[N];
    struct sfs_task *t;
    char spec[256];
    uint8_t *buf = malloc((size_t)N * SHARD);
    int st[N], err = 0, bad = 0;
    struct sfs_rank *rk;

    if (!buf)
        return 1;
    snprintf(spec, sizeof(spec), "fault:latency_us=400000:%s", dir);
    sfs_rank_config_init(&cfg);
    cfg.socket_path = sock;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    cfg.key_timeout_ms = 100;
    rk = sfs_rank_open(&cfg, &err);
    if (!rk) {
        fprintf(stderr, "rank_threads: open: %s\n", strerror(-err));
        free(buf);
        return 1;
    }
    memset(buf, 0x5a, (size_t)N * SHARD);
    for (int i = 0; i < N; i++)
        e[i] = (struct sfs_rank_entry){tu_block(LATE0 + i), 0, buf + (size_t)i * SHARD};
    if (sfs_rank_load(rk, e, N, &t) < 0 || sfs_rank_wait(t, -1, st) < 0)
        bad++;
    else
        for (int i = 0; i < N; i++)
            bad += st[i] != -ETIMEDOUT;
    sfs_rank_task_free(t);
    for (int i = 0; i < N; i++) {
        struct sfs_key k = tu_key(LATE0 + i, 0);

        for (int w = 0; w < 500 && sfs_cache_state(c, &k) != SFS_STATE_READY; w++)
            usleep(10 * 1000);
    }
    bad += !tu_all_bytes(buf, (size_t)N * SHARD, 0x5a);
    if (sfs_rank_load(rk, e, N, &t) < 0 || sfs_rank_wait(t, -1, st) < 0) {
        bad++;
    } else {
        for (int i = 0; i < N; i++) {
            struct sfs_key k = tu_key(LATE0 + i, 0);

            bad += st[i] != 0 || tu_check(&k, buf + (size_t)i * SHARD, SHARD) != -1;
        }
    }
    sfs_rank_task_free(t);
    sfs_rank_close(rk);
    free(buf);
    if (bad)
        fprintf(stderr, "rank_threads: late loads: %d wrong\n", bad);
    return bad ? 1 : 0;
}

int main(void)
{
    static char dir[128], spec[256];
    struct sfs_rank *ranks[NRANKS];
    struct app apps[4];
    pthread_t th[4];
    int err = 0;

    struct sfs_cache *c = tu_cache(NBLOCKS * 2, 8, SHARD);
    if (!c)
        return 1;
    sock = strdup(tu_path("sock"));
    if (sfs_cache_serve(c, sock) < 0)
        return 1;
    /* A posix store of 3 shards per block, written through a backend. */
    snprintf(dir, sizeof(dir), "%s", tu_path("store"));
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s/data", dir);
    if (system(cmd) != 0)
        return 1;
    struct sfs_backend_params bp = {.shard_size = SHARD};
    struct sfs_backend *be = sfs_backend_open(dir, &bp, NULL, 0, &err);
    uint8_t *buf = malloc(SHARD);
    for (int b = 0; b < NBLOCKS && be; b++)
        for (uint32_t s = 0; s < 8; s++) {
            struct sfs_key k = tu_key((uint64_t)b, s);
            tu_fill(&k, buf, SHARD);
            if (sfs_backend_dump_sync(be, &k, buf, SHARD) != SHARD)
                return 1;
        }
    for (int b = LATE0; b < LATE0 + 16 && be; b++) { /* late_loads()'s */
        struct sfs_key k = tu_key((uint64_t)b, 0);
        tu_fill(&k, buf, SHARD);
        if (sfs_backend_dump_sync(be, &k, buf, SHARD) != SHARD)
            return 1;
    }
    sfs_backend_close(be);
    free(buf);
    snprintf(spec, sizeof(spec), "fault:latency_us=300,jitter_us=300:%s", dir);

    for (int r = 0; r < NRANKS; r++) {
        struct sfs_rank_config cfg;

        sfs_rank_config_init(&cfg);
        cfg.socket_path = sock;
        cfg.device_id = r;
        cfg.local_rank_size = NRANKS;
        cfg.backend = spec;
        cfg.copier = SFS_COPIER_HOST;
        cfg.load_depth = 8;
        ranks[r] = sfs_rank_open(&cfg, &err);
        if (!ranks[r]) {
            fprintf(stderr, "rank_threads: open: %s\n", strerror(-err));
            return 1;
        }
    }
    for (int i = 0; i < 4; i++) {
        apps[i] = (struct app){.rank = ranks[i % NRANKS], .id = i};
        pthread_create(&th[i], NULL, app_thread, &apps[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    /* The hot phase's dumps are write-behind: their store writes run on
     * the background threads, after each task's end is seen or its grace. */
    for (int r = 0; r < NRANKS; r++)
        if (sfs_rank_set_dump_mode(ranks[r], SFS_DUMP_WRITE_BEHIND) < 0)
            return 1;
    for (int i = 0; i < 4; i++) {
        apps[i] = (struct app){.rank = ranks[i % NRANKS], .id = i};
        pthread_create(&th[i], NULL, i == 3 ? hot_dumper : hot_loader, &apps[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    struct sfs_stats st;
    sfs_cache_stats(c, &st);
    for (int r = 0; r < NRANKS; r++)
        sfs_rank_close(ranks[r]);
    /* After the others are closed: one rank at a time (NRANKS). */
    int late = late_loads(c, dir);
    sfs_cache_close(c);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "rank_threads: could not remove %s\n", dir);
    printf("rank_threads: owner loads %llu, waits %llu, hits %llu; small tasks %ld (%ld done in "
           "the call); wrong %ld, failed %ld\n",
           (unsigned long long)st.owner_loads, (unsigned long long)st.waits,
           (unsigned long long)st.hits, atomic_load(&small_tasks), atomic_load(&small_inline),
           atomic_load(&wrong), atomic_load(&failed));
    bool ok = atomic_load(&wrong) == 0 && atomic_load(&failed) == 0 && st.owner_loads > 0 &&
              atomic_load(&small_inline) > 0 && late == 0;
    printf("%d passed, %d failed\n", ok ? 1 : 0, ok ? 0 : 1);
    return ok ? 0 : 1;
}
