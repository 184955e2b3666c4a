/* SPDX-License-Identifier: MIT */
/*
 * test_lookup.c - the cache's entry points that take no lease (State,
 * Exists, Remove, Prealloc, Touch, foreach) at their edges, and the
 * configurations a create refuses: arguments refused with -EINVAL, a key
 * absent, leased, Idle or Loading, a Prealloc with no fresh slot left, a
 * Touch of more blocks than there are buckets or of one block twice, a
 * foreach over a bucket of many keys, one stopped by its callback and one
 * whose callback calls back into the cache.
 */
#include "testutil.h"
#include "slot_i.h"  /* bucket_of: keys that share a bucket */
#include "cache_i.h" /* a creator's control memfd */

#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define SHARD 4096u

TestSuite(lookup, .timeout = 30);

/* ---------------------------------------------------------------------------
 * Configurations a create refuses.
 */

static struct sfs_cache_config base_cfg(void)
{
    return (struct sfs_cache_config){
        .shard_size = SHARD,
        .nslots = 16,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
    };
}

static void refused(const struct sfs_cache_config *cfg, const char *what)
{
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(cfg, &err);

    cr_assert_null(c, "%s: created", what);
    cr_assert_eq(err, -EINVAL, "%s: %d", what, err);
    /* No place for the error: still refused, nothing written. */
    cr_assert_null(sfs_cache_create(cfg, NULL), "%s: created", what);
}

Test(lookup, configurations_a_create_refuses)
{
    static const uint32_t zero_weight[2] = {1, 0};
    static const uint32_t heavy_weight[2] = {1, SFS_PARTITION_WEIGHT_MAX + 1};
    static const uint32_t starved[2] = {1, 1000}; /* domain 0 gets no regular slot */
    struct sfs_cache_config cfg;

#define REFUSED(field, value)                                                                      \
    do {                                                                                           \
        cfg = base_cfg();                                                                          \
        cfg.field = value;                                                                         \
        refused(&cfg, #field " = " #value);                                                        \
    } while (0)
    REFUSED(hugepages, -1);
    REFUSED(hugepages, SFS_HUGEPAGES_OFF + 1);
    REFUSED(admission, SFS_ADMIT_SCAN + 1);
    REFUSED(shard_size, (uint64_t)UINT32_MAX + 1);
    REFUSED(nslots, 1u << 29);
    REFUSED(max_procs, 4097);
    REFUSED(max_leases, (1u << 24) + 1);
    REFUSED(pin_budget_pct, 101);
    REFUSED(pin_user_pct, 101);
    REFUSED(pin_max_seconds, SFS_PIN_MAX_SECONDS + 1);
    REFUSED(partitions, SFS_MAX_PARTITIONS_PUBLIC + 1);
    REFUSED(partitions, 17); /* more domains than regular slots */
    /* A capacity below one shard: no slot at all. */
    cfg = base_cfg();
    cfg.nslots = 0;
    cfg.capacity = SHARD - 1;
    refused(&cfg, "capacity below a shard");
    /* A reserved pool of every slot leaves none regular. */
    cfg = base_cfg();
    cfg.no_reserved = false;
    cfg.nreserved = 16;
    refused(&cfg, "nreserved = nslots");
    /* Weights: none 0, none above the maximum, every domain a slot. */
    cfg = base_cfg();
    cfg.partitions = 2;
    cfg.partition_weights = zero_weight;
    refused(&cfg, "a weight of 0");
    cfg.partition_weights = heavy_weight;
    refused(&cfg, "a weight above the maximum");
    cfg.partition_weights = starved;
    refused(&cfg, "a domain without a regular slot");
#undef REFUSED

    /* The edges themselves are accepted. */
    int err = 0;

    cfg = base_cfg();
    cfg.pin_budget_pct = 100;
    cfg.pin_user_pct = 100;
    cfg.pin_max_seconds = SFS_PIN_MAX_SECONDS;
    cfg.partitions = 16;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "%s", strerror(-err));
    sfs_cache_close(c);
}

/* The geometry a create derives: buckets rounded up to a power of two;
 * a segment of a slot count that is not a power of two holds the power of
 * two below it, unless one segment holds every slot. */
Test(lookup, geometry_a_create_derives)
{
    struct sfs_cache_config cfg = base_cfg();
    struct sfs_cache_info info;
    int err = 0;

    cfg.nbuckets = 100;
    cfg.segment_size = 3 * SHARD; /* 3 slots a segment: 2 */
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "%s", strerror(-err));
    sfs_cache_info(c, &info);
    cr_assert_eq(info.nbuckets, 128);
    cr_assert_eq(info.nsegments, 8);
    sfs_cache_close(c);
    cfg.segment_size = 16 * SHARD + 1; /* every slot in one segment */
    c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c, "%s", strerror(-err));
    sfs_cache_info(c, &info);
    cr_assert_eq(info.nsegments, 1);
    sfs_cache_close(c);
    cfg.nslots = 12;
    cfg.segment_size = 0; /* the default: one segment of 12 slots */
    c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c, "%s", strerror(-err));
    sfs_cache_info(c, &info);
    cr_assert_eq(info.nsegments, 1);
    sfs_cache_close(c);
}

/* Only the serving process reaps: it alone saw the processes go. */
Test(lookup, reap_is_the_creators)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    int err = 0;

    cr_assert_not_null(c);
    struct sfs_cache *a = sfs_cache_attach_fds(dup(c->ctl_fd), NULL, 0, -1, &err);

    cr_assert_not_null(a, "%s", strerror(-err));
    cr_assert_eq(sfs_cache_reap(NULL), -EINVAL);
    cr_assert_eq(sfs_cache_reap(a), 0);
    cr_assert_eq(sfs_cache_reap(c), 0, "nothing dead");
    sfs_cache_close(a);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * State, Exists, Remove, Prealloc.
 */

Test(lookup, state_names)
{
    cr_assert_str_eq(sfs_state_name(SFS_STATE_FREE), "absent");
    cr_assert_str_eq(sfs_state_name(SFS_STATE_IDLE), "idle");
    cr_assert_str_eq(sfs_state_name(SFS_STATE_LOADING), "loading");
    cr_assert_str_eq(sfs_state_name(SFS_STATE_READY), "ready");
    cr_assert_str_eq(sfs_state_name(SFS_STATE_FAILED), "failed");
    cr_assert_str_eq(sfs_state_name(-ENOENT), "absent");
    cr_assert_str_eq(sfs_state_name(99), "absent");
}

Test(lookup, arguments_refused)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(1, 0);

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_state(NULL, &k), -EINVAL);
    cr_assert_eq(sfs_cache_state(c, NULL), -EINVAL);
    cr_assert_not(sfs_cache_exists(NULL, &k));
    cr_assert_eq(sfs_cache_remove(NULL, &k), -EINVAL);
    cr_assert_eq(sfs_cache_remove(c, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_prealloc(NULL, &k), -EINVAL);
    cr_assert_eq(sfs_cache_prealloc(c, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_touch(NULL, &k.block, 1), -EINVAL);
    cr_assert_eq(sfs_cache_touch(c, NULL, 1), -EINVAL);
    cr_assert_eq(sfs_cache_touch(c, NULL, 0), 0);
    cr_assert_eq(sfs_cache_foreach(NULL, ~0u, NULL, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_foreach(c, ~0u, NULL, NULL), -EINVAL);
    sfs_cache_close(c);
}

Test(lookup, remove_of_each_state)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key ready = tu_key(1, 0), idle = tu_key(2, 0), loading = tu_key(3, 0);
    struct sfs_lease l, own;
    struct sfs_stats st;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_remove(c, &ready), -ENOENT);
    cr_assert_eq(tu_load(c, &ready), SFS_OWNER);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.resident_bytes, SHARD);
    /* Leased: refused, and the holder is told a writer wants the key. */
    cr_assert_eq(sfs_cache_get(c, &ready, 0, 0, &l), SFS_HIT);
    cr_assert_not(sfs_cache_write_wanted(c, &l));
    cr_assert_eq(sfs_cache_remove(c, &ready), -EBUSY);
    cr_assert(sfs_cache_write_wanted(c, &l));
    cr_assert_eq(sfs_cache_state(c, &ready), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    /* Free: gone, its bytes no longer resident. */
    cr_assert_eq(sfs_cache_remove(c, &ready), 0);
    cr_assert_eq(sfs_cache_state(c, &ready), -ENOENT);
    cr_assert_not(sfs_cache_exists(c, &ready));
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.resident_bytes, 0);
    /* Idle (preallocated): removed, nothing was resident. */
    cr_assert_eq(sfs_cache_prealloc(c, &idle), 1);
    cr_assert_eq(sfs_cache_state(c, &idle), SFS_STATE_IDLE);
    cr_assert_eq(sfs_cache_remove(c, &idle), 0);
    cr_assert_eq(sfs_cache_state(c, &idle), -ENOENT);
    /* Loading: its owner's lease holds it. */
    cr_assert_eq(sfs_cache_get(c, &loading, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_remove(c, &loading), -EBUSY);
    cr_assert_eq(sfs_cache_fail(c, &own, -EIO), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    cr_assert_eq(sfs_cache_state(c, &loading), SFS_STATE_FAILED);
    cr_assert_eq(sfs_cache_remove(c, &loading), 0);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.resident_bytes, 0);
    sfs_cache_close(c);
}

Test(lookup, prealloc_takes_fresh_slots_only)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_key k;
    struct sfs_stats st;

    cr_assert_not_null(c);
    k = tu_key(1, 0);
    cr_assert_eq(sfs_cache_prealloc(c, &k), 1);
    cr_assert_eq(sfs_cache_prealloc(c, &k), 0, "already there");
    /* An Idle key's Get makes its caller the owner (a takeover). */
    struct sfs_lease l;

    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(tu_publish(c, &k, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    for (uint64_t i = 2; i <= 4; i++) {
        k = tu_key(i, 0);
        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }
    /* Every slot has been used once: a Prealloc evicts nothing. */
    k = tu_key(100, 0);
    cr_assert_eq(sfs_cache_prealloc(c, &k), 0);
    cr_assert_eq(sfs_cache_state(c, &k), -ENOENT);
    for (uint64_t i = 1; i <= 4; i++) {
        k = tu_key(i, 0);
        cr_assert(sfs_cache_exists(c, &k), "key %llu was evicted", (unsigned long long)i);
    }
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.prealloc, 1);
    cr_assert_eq(st.takeovers, 1);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Touch.
 */

Test(lookup, touch_of_many_blocks_and_of_one_block_twice)
{
    struct sfs_cache *c = tu_cache(256, 0, SHARD);
    struct sfs_block_id blocks[200];
    struct sfs_stats st;
    struct sfs_lease l;

    cr_assert_not_null(c);
    /* 100 blocks of 2 shards Ready, one more Loading. */
    for (uint64_t i = 0; i < 100; i++)
        for (uint32_t s = 0; s < 2; s++) {
            struct sfs_key k = tu_key(i, s);

            cr_assert_eq(tu_load(c, &k), SFS_OWNER);
        }
    struct sfs_key lk = tu_key(100, 0);

    cr_assert_eq(sfs_cache_get(c, &lk, 0, 0, &l), SFS_OWNER);
    /* More blocks than buckets: every bucket once. Absent blocks mark
     * nothing. */
    for (uint64_t i = 0; i < 200; i++)
        blocks[i] = tu_block(i);
    cr_assert_geq(200 * 2, c->nbuckets);
    cr_assert_eq(sfs_cache_touch(c, blocks, 200), 201);
    /* A few blocks: their buckets only; a block named twice marks its
     * shards once. */
    blocks[0] = tu_block(7);
    blocks[1] = tu_block(7);
    blocks[2] = tu_block(100);
    blocks[3] = tu_block(5000);
    cr_assert_eq(sfs_cache_touch(c, blocks, 4), 3);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.touched, 204);
    cr_assert_eq(sfs_cache_fail(c, &l, -EIO), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    /* A Failed key is not touched. */
    cr_assert_eq(sfs_cache_touch(c, &blocks[2], 1), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * foreach.
 */

struct visits {
    unsigned n, ready, loading;
    unsigned stop_at;    /* > 0: return -ECANCELED at this visit */
    struct sfs_cache *c; /* non-NULL: remove each key visited */
    unsigned removed;
};

static int count_visit(const struct sfs_key *key, int state, void *arg)
{
    struct visits *v = arg;

    v->n++;
    v->ready += state == SFS_STATE_READY;
    v->loading += state == SFS_STATE_LOADING;
    if (v->c && sfs_cache_remove(v->c, key) == 0)
        v->removed++;
    if (v->stop_at && v->n == v->stop_at)
        return -ECANCELED;
    return 0;
}

Test(lookup, foreach_over_a_crowded_bucket)
{
    struct sfs_cache *c = tu_cache(64, 0, SHARD);
    struct sfs_key crowd[40];
    struct sfs_lease l;
    unsigned n = 0;
    uint32_t b0;

    cr_assert_not_null(c);
    /* 40 keys of one bucket (more than a visit's first batch holds). */
    b0 = bucket_of(c, &(struct sfs_key){tu_block(0), 0});
    for (uint64_t i = 0; n < 40 && i < 1000000; i++) {
        struct sfs_key k = tu_key(i, 0);

        if (bucket_of(c, &k) == b0)
            crowd[n++] = k;
    }
    cr_assert_eq(n, 40);
    for (unsigned i = 0; i < 39; i++)
        cr_assert_eq(tu_load(c, &crowd[i]), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &crowd[39], 0, 0, &l), SFS_OWNER);

    struct visits all = {0}, ready = {0}, loading = {0}, stop = {.stop_at = 3};
    unsigned ready_bit = 1u << SFS_STATE_READY, loading_bit = 1u << SFS_STATE_LOADING;

    cr_assert_eq(sfs_cache_foreach(c, ~0u, count_visit, &all), 0);
    cr_assert_eq(all.n, 40);
    cr_assert_eq(sfs_cache_foreach(c, ready_bit, count_visit, &ready), 0);
    cr_assert_eq(ready.n, 39);
    cr_assert_eq(ready.ready, 39);
    cr_assert_eq(sfs_cache_foreach(c, loading_bit, count_visit, &loading), 0);
    cr_assert_eq(loading.n, 1);
    cr_assert_eq(loading.loading, 1);
    cr_assert_eq(sfs_cache_foreach(c, 0, count_visit, &all), 0);
    cr_assert_eq(all.n, 40, "an empty mask visits nothing");
    /* The callback's non-zero answer ends the walk and is its result. */
    cr_assert_eq(sfs_cache_foreach(c, ~0u, count_visit, &stop), -ECANCELED);
    cr_assert_eq(stop.n, 3);
    /* Callbacks run with no lock held: they may remove what they visit. */
    struct visits rm = {.c = c};

    cr_assert_eq(sfs_cache_foreach(c, ready_bit, count_visit, &rm), 0);
    cr_assert_eq(rm.removed, 39);
    cr_assert_eq(sfs_cache_state(c, &crowd[0]), -ENOENT);
    cr_assert_eq(sfs_cache_fail(c, &l, -EIO), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}
