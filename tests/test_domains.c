/* SPDX-License-Identifier: MIT */
/*
 * test_domains.c - eviction domains (issue 12, -o partitions=P): a key's
 * domain is its shard index mod P, each domain owns 1/P of each pool with
 * its own CLOCK hands, so a flood of one domain's keys never evicts
 * another's, a domain's budget holds, Prealloc and the reserved pool keep
 * to the key's domain, and the evictions are counted by domain. (P = 1 is
 * the seed 000 scenarios, test_scenarios.c, unchanged.)
 */
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>

#define SHARD 4096u

static struct sfs_cache *cache_p(uint32_t nslots, uint32_t nreserved, uint32_t p)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .nreserved = nreserved,
        .no_reserved = nreserved == 0,
        .hugepages = SFS_HUGEPAGES_OFF,
        .partitions = p,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "create with %u partitions: %s", p, strerror(-err));
    return c;
}

/* Load key (it must miss), publish, release; returns its slot. */
static uint32_t load(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;
    int role = sfs_cache_get(c, k, 0, 0, &l);

    cr_assert_eq(role, SFS_OWNER, "shard %u: role %d", k->shard, role);
    cr_assert_eq(tu_publish(c, k, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    return l.slot;
}

static void hit(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;

    cr_assert_eq(sfs_cache_get(c, k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

Test(domains, flood_of_one_domain_never_evicts_another, .timeout = 30)
{
    struct sfs_cache *c = cache_p(16, 0, 2);
    uint64_t ev[2];

    /* Domain 1 (odd shards): 8 keys fill its 8 slots. */
    for (uint64_t b = 0; b < 8; b++)
        load(c, &(struct sfs_key){tu_block(b), 1});
    /* A flood of domain 0's keys, 20 times its size, hot keys of its own
     * hit in between. */
    for (uint64_t b = 100; b < 260; b++) {
        struct sfs_key k = tu_key(b, 0);

        load(c, &k);
        hit(c, &k);
    }
    for (uint64_t b = 0; b < 8; b++)
        cr_assert_eq(sfs_cache_state(c, &(struct sfs_key){tu_block(b), 1}), SFS_STATE_READY,
                     "domain 1's block %lu was evicted by domain 0's flood", (unsigned long)b);
    cr_assert_eq(sfs_cache_partition_evictions(c, ev, 2), 2);
    cr_assert_eq(ev[1], 0);
    cr_assert_eq(ev[0], 160 - 8, "domain 0 evictions %lu", (unsigned long)ev[0]);
    sfs_cache_close(c);
}

Test(domains, budget_is_a_hard_bound, .timeout = 30)
{
    struct sfs_cache *c = cache_p(16, 0, 4);

    /* Domain 2 owns slots [8, 12): its keys land there and nowhere else,
     * and at most 4 of them are resident. */
    for (uint64_t b = 0; b < 40; b++) {
        uint32_t s = load(c, &(struct sfs_key){tu_block(b), 2 + 4 * (uint32_t)(b % 3)});

        cr_assert(s >= 8 && s < 12, "domain 2's key in slot %u", s);
    }
    int resident = 0;
    for (uint64_t b = 0; b < 40; b++)
        resident += sfs_cache_state(c, &(struct sfs_key){tu_block(b), 2 + 4 * (uint32_t)(b % 3)}) ==
                    SFS_STATE_READY;
    cr_assert_eq(resident, 4);
    sfs_cache_close(c);
}

Test(domains, full_domain_is_enospc_while_others_are_free, .timeout = 30)
{
    struct sfs_cache *c = cache_p(8, 0, 2);
    struct sfs_lease l[4], x;

    /* Lease all four of domain 0's slots. */
    for (int i = 0; i < 4; i++) {
        struct sfs_key k = tu_key((uint64_t)i, 0);

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l[i]), SFS_OWNER);
        cr_assert_eq(tu_publish(c, &k, &l[i]), 0);
    }
    struct sfs_key k0 = tu_key(50, 2), k1 = tu_key(50, 1);
    cr_assert_eq(sfs_cache_get(c, &k0, 0, 0, &x), -ENOSPC,
                 "domain 0 full of leases: a miss there must not take domain 1's slots");
    cr_assert_eq(sfs_cache_get(c, &k1, 0, 0, &x), SFS_OWNER);
    cr_assert(x.slot >= 4, "domain 1's key in slot %u", x.slot);
    cr_assert_eq(tu_publish(c, &k1, &x), 0);
    cr_assert_eq(sfs_cache_release(c, &x), 0);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
    sfs_cache_close(c);
}

Test(domains, prealloc_and_reserved_keep_to_the_domain, .timeout = 30)
{
    /* 12 regular slots ([0,6) and [6,12)), 4 reserved ([12,14), [14,16)). */
    struct sfs_cache *c = cache_p(16, 4, 2);
    struct sfs_lease l[8], x;

    /* Prealloc of domain 1's keys: fresh regular slots of domain 1, then
     * its reserved ones, never domain 0's. */
    for (uint64_t b = 0; b < 8; b++) {
        struct sfs_key k = tu_key(b, 1);
        int r = sfs_cache_prealloc(c, &k);

        cr_assert_eq(r, 1, "prealloc %lu: %d", (unsigned long)b, r);
        cr_assert_eq(sfs_cache_get(c, &k, SFS_GET_NOALLOC, 0, &x), SFS_OWNER);
        cr_assert((x.slot >= 6 && x.slot < 12) || (x.slot >= 14 && x.slot < 16),
                  "domain 1's prealloc in slot %u", x.slot);
        cr_assert_eq(tu_publish(c, &k, &x), 0);
        cr_assert_eq(sfs_cache_release(c, &x), 0);
    }
    /* No fresh regular slot left: the next one takes one of domain 1's
     * reserved slots (its CLOCK), never a slot of domain 0. */
    struct sfs_key k9 = tu_key(9, 1);
    cr_assert_eq(sfs_cache_prealloc(c, &k9), 1);
    cr_assert_eq(sfs_cache_get(c, &k9, SFS_GET_NOALLOC, 0, &x), SFS_OWNER);
    cr_assert(x.slot >= 14 && x.slot < 16, "slot %u", x.slot);
    cr_assert_eq(tu_publish(c, &k9, &x), 0);
    cr_assert_eq(sfs_cache_release(c, &x), 0);
    /* Domain 0's loads, with its regular pool leased, take its reserved
     * slots [12, 14) only. */
    for (int i = 0; i < 8; i++) {
        struct sfs_key k = tu_key(100 + (uint64_t)i, 0);

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l[i]), SFS_OWNER);
        cr_assert(l[i].slot < 6 || (l[i].slot >= 12 && l[i].slot < 14), "slot %u", l[i].slot);
        cr_assert_eq(tu_publish(c, &k, &l[i]), 0);
    }
    struct sfs_key k = tu_key(200, 0);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &x), -ENOSPC);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
    sfs_cache_close(c);
}

Test(domains, bad_partitions_refused, .timeout = 30)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = 8, .no_reserved = true, .hugepages = SFS_HUGEPAGES_OFF};
    int err = 0;

    cfg.partitions = 65;
    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
    cfg.partitions = 9; /* more domains than slots */
    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
    cfg.partitions = 8;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_partition_evictions(c, NULL, 0), 8);
    sfs_cache_close(c);
}
