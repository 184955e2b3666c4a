/* SPDX-License-Identifier: MIT */
/*
 * test_rank_deadline.c - libshardfs-rank's deadlines: a task's wait with a
 * timeout, an entry's key_timeout_ms (a key another owner never publishes,
 * a rank out of leases, the rank's own load that the backend answers too
 * late), and where that deadline starts. One rank in the test process, on
 * a cache it serves (rankenv.c).
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

Test(rank_deadline, wait_timeout_holds, .timeout = 60)
{
    struct env e;
    char spec[256];
    uint8_t *bufs = malloc(4 * SHARD);
    int st[4];
    struct sfs_rank_entry ent[2];
    struct sfs_task *t;

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 4, 1, SHARD);
    /* Loads of 400 ms, within the 1 s key timeout (an owner load past it
     * fails: owner_load_past_its_deadline_writes_nothing_late). */
    snprintf(spec, sizeof(spec), "fault:latency_us=400000:%s", e.dir);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 1000);

    for (int i = 0; i < 2; i++)
        ent[i] = (struct sfs_rank_entry){tu_block(i), 0, bufs + i * SHARD};
    cr_assert_eq(sfs_rank_load(rk, ent, 2, &t), 0);
    int64_t t0 = sfs_now_ns();
    cr_assert_eq(sfs_rank_wait(t, 50, st), -ETIMEDOUT);
    int64_t dt = sfs_now_ns() - t0;
    cr_assert(dt >= 45 * 1000000ll && dt < 250 * 1000000ll, "waited %ld ms", (long)(dt / 1000000));
    cr_assert_eq(sfs_rank_wait(t, 0, st), -ETIMEDOUT);
    cr_assert(!sfs_rank_task_done(t));
    cr_assert_eq(sfs_rank_wait(t, -1, st), 0);
    check_bufs(0, 2, 0, bufs, st);
    sfs_rank_task_free(t);

    /* A key whose owner (this process, through the core API) never
     * publishes: the entry times out after key_timeout_ms (1000). */
    struct sfs_key k2 = tu_key(2, 0);
    struct sfs_lease l;
    cr_assert_eq(sfs_cache_get(e.c, &k2, 0, 0, &l), SFS_OWNER);
    t0 = sfs_now_ns();
    cr_assert_eq(load_sync(rk, 2, 2, 0, bufs, st), 0);
    dt = sfs_now_ns() - t0;
    cr_assert_eq(st[0], -ETIMEDOUT);
    cr_assert_eq(st[1], 0);
    cr_assert(dt >= 990 * 1000000ll && dt < 4000 * 1000000ll, "took %ld ms", (long)(dt / 1000000));
    sfs_cache_fail(e.c, &l, -EIO);
    sfs_cache_release(e.c, &l);

    /* A task freed before it is done finishes on its own. */
    cr_assert_eq(sfs_rank_load(rk, ent, 2, &t), 0);
    sfs_rank_task_free(t);
    sfs_rank_close(rk); /* waits for it: nothing writes bufs after this */
    free(bufs);
    env_down(&e);
}

Test(rank_deadline, out_of_leases_waits_no_longer_than_the_key_deadline, .timeout = 30)
{
    /* One lease per process. Key 0 is owned by the test and never published,
     * so the rank's waiter on it holds its only lease until key 0 times out;
     * key 1 then finds no lease (-ENOBUFS). Waiting for one is a wait like
     * any other: it ends at key 1's deadline (invariant 6), with -ENOBUFS. */
    struct sfs_cache_config cc = {.shard_size = SHARD, .nslots = 64, .max_leases = 1};
    struct env e;
    struct sfs_lease l0;
    struct sfs_rank_entry ent[2];
    struct sfs_task *t;
    uint8_t *bufs = calloc(2, SHARD);
    int err = 0, st[2];

    snprintf(e.sock, sizeof(e.sock), "%s", tu_path("sock"));
    e.c = sfs_cache_create(&cc, &err);
    cr_assert_not_null(e.c, "sfs_cache_create: %s", strerror(-err));
    cr_assert_eq(sfs_cache_serve(e.c, e.sock), 0);
    struct sfs_key k0 = tu_key(0, 0);

    cr_assert_eq(sfs_cache_get(e.c, &k0, 0, 0, &l0), SFS_OWNER);
    struct sfs_rank *rk = rank_here(&e, NULL, 0, 300);

    for (int i = 0; i < 2; i++)
        ent[i] = (struct sfs_rank_entry){tu_block(i), 0, bufs + (size_t)i * SHARD};
    int64_t t0 = sfs_now_ns();

    cr_assert_eq(sfs_rank_load(rk, ent, 2, &t), 0);
    cr_assert_eq(sfs_rank_wait(t, 10000, st), 0);
    int64_t dt = sfs_now_ns() - t0;

    sfs_rank_task_free(t);
    cr_assert_eq(st[0], -ETIMEDOUT, "key 0: %d", st[0]);
    cr_assert(st[1] == -ENOBUFS, "key 1: %d", st[1]);
    cr_assert_lt(dt, 5000 * 1000000ll, "took %ld ms", (long)(dt / 1000000));
    sfs_rank_close(rk);
    sfs_cache_fail(e.c, &l0, -EIO);
    sfs_cache_release(e.c, &l0);
    free(bufs);
    assert_no_leases(e.c);
    sfs_cache_close(e.c);
}

Test(rank_deadline, wait_deadline_starts_at_the_get, .timeout = 60)
{
    /* A key another process loads gets key_timeout_ms from the Get that made
     * the entry a waiter, not from before the dispatcher waited for a load
     * slot. Depth 1: entry 0 is ours (400 ms load) and holds the only slot
     * until the backend answers (its entry fails at its own 300 ms
     * deadline, the load goes on); entry 1 is absent when the dispatcher
     * peeks at it, so it waits for the slot (~400 ms, longer than the 300 ms
     * key timeout). Meanwhile this process becomes entry 1's owner and
     * publishes it at ~550 ms: ~150 ms after the rank's Get, well within its
     * 300 ms. */
    struct env e;
    char spec[256];
    uint8_t *bufs = malloc(2 * SHARD);
    int st[2];
    struct sfs_rank_entry ent[2];
    struct sfs_task *t;
    struct sfs_lease l;

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 2, 1, SHARD);
    snprintf(spec, sizeof(spec), "fault:latency_us=400000:%s", e.dir);
    struct sfs_rank *rk = rank_depth(&e, spec, 0, 300, 1);

    for (int i = 0; i < 2; i++)
        ent[i] = (struct sfs_rank_entry){tu_block(i), 0, bufs + i * SHARD};
    int64_t t0 = sfs_now_ns();
    cr_assert_eq(sfs_rank_load(rk, ent, 2, &t), 0);
    usleep(100 * 1000);
    struct sfs_key k1 = tu_key(1, 0);
    cr_assert_eq(sfs_cache_get(e.c, &k1, 0, 0, &l), SFS_OWNER);
    int64_t until = t0 + 550 * 1000000ll;
    while (sfs_now_ns() < until)
        usleep(5000);
    publish_owned(e.c, 1, &l); /* and releases */
    cr_assert_eq(sfs_rank_wait(t, 20000, st), 0);
    sfs_rank_task_free(t);
    cr_assert_eq(st[0], -ETIMEDOUT, "entry 0, a 400 ms load of ours: %d", st[0]);
    check_bufs(1, 1, 0, bufs + SHARD, st + 1);
    sfs_rank_close(rk);
    free(bufs);
    env_down(&e);
}

Test(rank_deadline, owner_load_past_its_deadline_writes_nothing_late, .timeout = 60)
{
    /* The rank's own load of key 0 takes 1.5 s, its key timeout is 300 ms:
     * the entry fails with -ETIMEDOUT at its deadline and the task
     * completes while the load is still in the backend. When the load does
     * come back its bytes fill the slot (Ready, for whoever reads next) and
     * nothing reaches the entry's destination; the rank goes on (a later
     * task hits the slot), and close finds no lease left. */
    struct env e;
    char spec[256];
    uint8_t *bufs = malloc(2 * SHARD);
    struct sfs_rank_stats s0, s1;
    struct sfs_key k0 = tu_key(0, 0);
    int st[1];

    env_up(&e, 64, 0);
    write_store(e.dir, 0, 1, 1, SHARD);
    snprintf(spec, sizeof(spec), "fault:latency_us=1500000:%s", e.dir);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 300);

    memset(bufs, 0xa5, 2 * SHARD);
    cr_assert_eq(load_sync(rk, 0, 1, 0, bufs, st), 0, "the task did not complete");
    cr_assert_eq(st[0], -ETIMEDOUT, "entry 0: %d", st[0]);
    cr_assert_eq(sfs_cache_state(e.c, &k0), SFS_STATE_LOADING, "the load must still be ours");
    sfs_rank_stats(rk, &s0);
    cr_assert_eq(s0.failed, 1);

    /* The late load settles the slot; the destination stays untouched. */
    for (int i = 0; i < 500 && sfs_cache_state(e.c, &k0) == SFS_STATE_LOADING; i++)
        usleep(10 * 1000);
    cr_assert_eq(sfs_cache_state(e.c, &k0), SFS_STATE_READY, "the late load was not published");
    usleep(50 * 1000);
    cr_assert(tu_all_bytes(bufs, SHARD, 0xa5), "late bytes reached a failed entry's destination");

    cr_assert_eq(load_sync(rk, 0, 1, 0, bufs + SHARD, st), 0);
    check_bufs(0, 1, 0, bufs + SHARD, st);
    sfs_rank_stats(rk, &s1);
    cr_assert_eq(s1.hits, s0.hits + 1, "the late bytes should be a hit");
    cr_assert_eq(s1.owner_loads, s0.owner_loads);
    sfs_rank_close(rk);
    free(bufs);
    env_down(&e);
}
