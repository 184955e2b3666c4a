/* SPDX-License-Identifier: MIT */
/*
 * test_rank_domains.c - eviction domains through the rank API (design.md, section 10):
 * a cache of P domains (sfs_cache_config.partitions; a key's domain is its
 * shard index mod P) served on a socket in this process, and a rank of the
 * rank library attached to it loading from a posix store. The rank fills
 * one domain with its keys, then floods another domain with loads, ten
 * times that domain's slots: every key of the first domain is still
 * resident (sfs_cache_state READY) and sfs_cache_partition_evictions counts
 * no eviction in its domain, all of them in the flooded one.
 *
 * Budgets given per domain (sfs_cache_config.partition_weights) hold at
 * their sizes through the rank: the flooded domain holds exactly its share.
 *
 * With the domains ignored (P forced to 1, -DRD_FORCE_P1) the tests fail:
 * the flood evicts the resident domain's keys.
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NSLOTS 48u /* 16 per domain at P = 3, 24 at P = 2 */
#define TASK   16u /* keys per load task */

/* A cache of NSLOTS SHARD-byte slots in p domains, no reserved pool,
 * served at e->sock; e->dir names a store not yet written. */
static void up_w(struct env *e, uint32_t p, const uint32_t *weights)
{
#ifdef RD_FORCE_P1
    p = 1; /* the check that the tests see domains: they must fail */
    weights = NULL;
#endif
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = NSLOTS,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
        .partitions = p,
        .partition_weights = weights,
    };
    int err = 0;

    snprintf(e->sock, sizeof(e->sock), "%s", tu_path("sock"));
    snprintf(e->dir, sizeof(e->dir), "%s", tu_path("store"));
    e->c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(e->c, "create with %u partitions: %s", p, strerror(-err));
    cr_assert_eq(sfs_cache_serve(e->c, e->sock), 0);
}

static void up(struct env *e, uint32_t p)
{
    up_w(e, p, NULL);
}

static struct sfs_rank *rank_open(struct env *e, bool prealloc)
{
    struct sfs_rank_config cfg;
    struct sfs_rank *rk;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = e->sock;
    cfg.backend = e->dir;
    cfg.copier = SFS_COPIER_HOST;
    cfg.prealloc = prealloc;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    return rk;
}

/* Load shard `shard` of blocks [first, first + n) through the rank, TASK
 * keys a task, and check every byte. */
static void load_range(struct sfs_rank *rk, uint64_t first, uint32_t n, uint32_t shard)
{
    uint8_t *bufs = malloc((size_t)TASK * SHARD);
    struct sfs_rank_entry ent[TASK];
    int st[TASK];

    cr_assert_not_null(bufs);
    for (uint32_t done = 0; done < n; done += TASK) {
        uint32_t m = n - done < TASK ? n - done : TASK;
        struct sfs_task *t;

        for (uint32_t i = 0; i < m; i++)
            ent[i] = (struct sfs_rank_entry){tu_block(first + done + i), shard,
                                             bufs + (size_t)i * SHARD};
        cr_assert_eq(sfs_rank_load(rk, ent, m, &t), 0);
        cr_assert_eq(sfs_rank_wait(t, 30000, st), 0);
        sfs_rank_task_free(t);
        check_bufs(first + done, m, shard, bufs, st);
    }
    free(bufs);
}

static void assert_resident(struct sfs_cache *c, uint64_t first, uint32_t n, uint32_t shard)
{
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(sfs_cache_state(c, &(struct sfs_key){tu_block(first + i), shard}),
                     SFS_STATE_READY, "(%llu, %u) evicted by another domain's flood",
                     (unsigned long long)(first + i), shard);
}

Test(rank_domains, flood_of_one_domain_keeps_the_other_resident, .timeout = 60)
{
    struct env e;
    struct sfs_rank *rk;
    uint64_t ev[2] = {0, 0};

    up(&e, 2); /* 24 slots a domain */
    write_store(e.dir, 0, 24, 2, SHARD);    /* blocks 0..23, shards 0 and 1 */
    write_store(e.dir, 100, 240, 1, SHARD); /* the flood: 240 shards 0 */
    rk = rank_open(&e, false); /* no Prealloc: the flood's keys are shard 0's only */
    /* Domain 1: shard 1 of 24 blocks, exactly its slots. */
    load_range(rk, 0, 24, 1);
    assert_resident(e.c, 0, 24, 1);
    /* Domain 0 floods: ten times its slots, each key hit once more. */
    load_range(rk, 100, 240, 0);
    load_range(rk, 100 + 240 - TASK, TASK, 0);
    assert_resident(e.c, 0, 24, 1);
    cr_assert_eq(sfs_cache_partition_evictions(e.c, ev, 2), 2, "the cache has not 2 domains");
    cr_assert_eq(ev[1], 0, "domain 1: %llu evictions", (unsigned long long)ev[1]);
    cr_assert_eq(ev[0], 240 - 24, "domain 0: %llu evictions", (unsigned long long)ev[0]);
    sfs_rank_close(rk);
    env_down(&e);
}

/* With Prealloc on (the rank's default), the flood of shard 0's also
 * preallocates shard 1's (domain 1 of 3): domain 2 stays untouched. */
Test(rank_domains, flood_with_prealloc_keeps_a_third_domain_resident, .timeout = 60)
{
    struct env e;
    struct sfs_rank *rk;
    uint64_t ev[3] = {0, 0, 0};

    up(&e, 3); /* 16 slots a domain */
    write_store(e.dir, 0, 16, 3, SHARD);    /* blocks 0..15, shards 0..2 */
    write_store(e.dir, 100, 160, 2, SHARD); /* the flood: shards 0 and 1 */
    rk = rank_open(&e, true);
    load_range(rk, 0, 16, 2); /* domain 2: exactly its slots */
    assert_resident(e.c, 0, 16, 2);
    load_range(rk, 100, 160, 0);
    assert_resident(e.c, 0, 16, 2);
    cr_assert_eq(sfs_cache_partition_evictions(e.c, ev, 3), 3, "the cache has not 3 domains");
    cr_assert_eq(ev[2], 0, "domain 2: %llu evictions", (unsigned long long)ev[2]);
    cr_assert_geq(ev[0], 160 - 16, "domain 0: %llu evictions", (unsigned long long)ev[0]);
    sfs_rank_close(rk);
    env_down(&e);
}

/* Budgets 1:2 of 48 slots: domain 0 owns 16, domain 1 owns 32. The rank
 * fills domain 1's 32, then floods domain 0: domain 1 keeps all 32, domain
 * 0 holds exactly its 16 (equal shares would be 24 and 24). */
Test(rank_domains, given_budgets_hold_through_the_rank, .timeout = 60)
{
    const uint32_t w[2] = {1, 2};
    struct env e;
    struct sfs_rank *rk;
    uint64_t ev[2] = {0, 0};
    int resident = 0;

    up_w(&e, 2, w);
    write_store(e.dir, 0, 32, 2, SHARD);    /* blocks 0..31, shards 0 and 1 */
    write_store(e.dir, 100, 240, 1, SHARD); /* the flood: 240 shards 0 */
    rk = rank_open(&e, false);
    load_range(rk, 0, 32, 1);
    assert_resident(e.c, 0, 32, 1);
    load_range(rk, 100, 240, 0);
    assert_resident(e.c, 0, 32, 1);
    for (uint64_t b = 100; b < 340; b++)
        resident += sfs_cache_state(e.c, &(struct sfs_key){tu_block(b), 0}) == SFS_STATE_READY;
    cr_assert_eq(resident, 16, "domain 0 (budget 1 of 3: 16 slots) holds %d", resident);
    cr_assert_eq(sfs_cache_partition_evictions(e.c, ev, 2), 2, "the cache has not 2 domains");
    cr_assert_eq(ev[1], 0, "domain 1: %llu evictions", (unsigned long long)ev[1]);
    cr_assert_eq(ev[0], 240 - 16, "domain 0: %llu evictions", (unsigned long long)ev[0]);
    sfs_rank_close(rk);
    env_down(&e);
}
