/* SPDX-License-Identifier: MIT */
/*
 * test_domains.c - eviction domains (design.md, section 10; -o partitions=P): a key's
 * domain is its shard index mod P, each domain owns 1/P of each pool with
 * its own CLOCK hands, so a flood of one domain's keys never evicts
 * another's, a domain's budget holds, Prealloc and the reserved pool keep
 * to the key's domain, and the evictions are counted by domain. (P = 1 is
 * design.md's scenarios, test_scenarios.c, unchanged.) Budgets given per
 * domain (sfs_cache_config.partition_weights) hold at their sizes.
 */
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>

#define SHARD 4096u

static struct sfs_cache *cache_w(uint32_t nslots, uint32_t nreserved, uint32_t p,
                                 const uint32_t *weights)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .nreserved = nreserved,
        .no_reserved = nreserved == 0,
        .hugepages = SFS_HUGEPAGES_OFF,
        .partitions = p,
        .partition_weights = weights,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "create with %u partitions: %s", p, strerror(-err));
    return c;
}

static struct sfs_cache *cache_p(uint32_t nslots, uint32_t nreserved, uint32_t p)
{
    return cache_w(nslots, nreserved, p, NULL);
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

/* Given budgets: 3:1 of 16 regular slots is [0, 12) and [12, 16), and of 4
 * reserved slots [16, 19) and [19, 20). Each domain's keys land only in its
 * ranges and, flooded, fill exactly its budget. (With the weights ignored,
 * equal halves: domain 0 would hold 8 and domain 1 8.) */
Test(domains, given_budgets_hold_at_their_sizes, .timeout = 30)
{
    const uint32_t w[2] = {3, 1};
    struct sfs_cache *c = cache_w(20, 4, 2, w);
    struct sfs_lease x;
    int resident[2] = {0, 0};

    for (uint64_t b = 0; b < 80; b++)
        for (uint32_t sh = 0; sh < 2; sh++) {
            uint32_t s = load(c, &(struct sfs_key){tu_block(b), sh});

            cr_assert(sh == 0 ? s < 12 : s >= 12 && s < 16, "shard %u's key in slot %u", sh, s);
        }
    for (uint64_t b = 0; b < 80; b++)
        for (uint32_t sh = 0; sh < 2; sh++)
            resident[sh] +=
                sfs_cache_state(c, &(struct sfs_key){tu_block(b), sh}) == SFS_STATE_READY;
    cr_assert_eq(resident[0], 12, "domain 0 (weight 3 of 4) holds %d", resident[0]);
    cr_assert_eq(resident[1], 4, "domain 1 (weight 1 of 4) holds %d", resident[1]);
    /* Its regular slots leased, domain 1 takes its one reserved slot, then
     * is full while domain 0 has three reserved slots free. */
    struct sfs_lease l[5];
    for (int i = 0; i < 5; i++) {
        struct sfs_key k = tu_key(500 + (uint64_t)i, 1);

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l[i]), SFS_OWNER);
        cr_assert(i < 4 ? l[i].slot >= 12 && l[i].slot < 16 : l[i].slot == 19, "slot %u",
                  l[i].slot);
        cr_assert_eq(tu_publish(c, &k, &l[i]), 0);
    }
    struct sfs_key full = tu_key(600, 1);
    cr_assert_eq(sfs_cache_get(c, &full, 0, 0, &x), -ENOSPC);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
    /* Prealloc keeps to the weighted ranges too: domain 0's fresh reserved. */
    struct sfs_key k = tu_key(700, 0);
    cr_assert_eq(sfs_cache_prealloc(c, &k), 1);
    cr_assert_eq(sfs_cache_get(c, &k, SFS_GET_NOALLOC, 0, &x), SFS_OWNER);
    cr_assert(x.slot >= 16 && x.slot < 19, "domain 0's prealloc in slot %u", x.slot);
    cr_assert_eq(tu_publish(c, &k, &x), 0);
    cr_assert_eq(sfs_cache_release(c, &x), 0);
    sfs_cache_close(c);
}

Test(domains, bad_budgets_refused, .timeout = 30)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 16,
                                   .no_reserved = true,
                                   .hugepages = SFS_HUGEPAGES_OFF,
                                   .partitions = 2};
    const uint32_t zero[2] = {0, 1}, tiny[2] = {1, 100}, big[2] = {SFS_PARTITION_WEIGHT_MAX + 1, 1},
                   ok[2] = {15, 1};
    int err = 0;

    cfg.partition_weights = zero;
    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
    cfg.partition_weights = tiny; /* domain 0: 16 / 101 of a slot */
    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
    cfg.partition_weights = big;
    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
    cfg.partition_weights = ok; /* 15 and 1 */
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c, "15:1 of 16 slots: %s", strerror(-err));
    for (uint64_t b = 0; b < 8; b++)
        cr_assert_eq(load(c, &(struct sfs_key){tu_block(b), 1}), 15);
    sfs_cache_close(c);
}
