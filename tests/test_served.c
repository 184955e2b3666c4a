/* SPDX-License-Identifier: MIT */
/*
 * test_served.c - where reads were served from, by requester class, the
 * latency histograms, and the hot-set sampler's read-only look at the
 * slots: the names a class may have, the counts of live processes and of
 * gone ones (folded into the header when they close their handle, or when
 * the server reaps a process that exited without closing it), the
 * class table's room, the histograms' buckets, and a sample sweep's cursor,
 * bound and early stop.
 *
 * Processes that attach are real forked children; they count, observe and
 * exit, and the server's reaper folds their records.
 */
#include "testutil.h"
#include "cache_i.h" /* a record's class bytes, forged as a hostile process would */

#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define SHARD 4096u

TestSuite(served, .timeout = 30);

/* The entry of class name in out[0..n), or NULL. */
static const struct sfs_served *entry_of(const struct sfs_served *out, unsigned n, const char *name)
{
    for (unsigned i = 0; i < n; i++)
        if (strcmp(out[i].name, name) == 0)
            return &out[i];
    return NULL;
}

Test(served, class_names_are_checked)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    const char *bad[] = {"", "sixteen-chars-xx", "a b", "a/b", "ünï", "tab\t", "x:y"};
    const char *good[] = {"mount", "rank", "A-z_0.9", "fifteen-chars-x"};

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_set_class(c, NULL), -EINVAL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(sfs_cache_set_class(c, bad[i]), -EINVAL, "'%s'", bad[i]);
        cr_assert_eq(sfs_cache_set_class(NULL, bad[i]), -EINVAL, "'%s'", bad[i]);
    }
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        cr_assert_eq(sfs_cache_set_class(NULL, good[i]), 0, "'%s'", good[i]);
        cr_assert_eq(sfs_cache_set_class(c, good[i]), 0, "'%s'", good[i]);
    }
    /* The last name set is the live record's class. */
    struct sfs_served out[4];
    unsigned n = sfs_cache_served(c, out, 4);

    cr_assert_eq(n, 1);
    cr_assert_str_eq(out[0].name, "fifteen-chars-x");
    cr_assert_eq(out[0].attached, 1);
    sfs_cache_close(c);
}

Test(served, tiers_of_a_live_process)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(1, 0);
    struct sfs_lease l;
    struct sfs_served out[4];

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_set_class(c, "mount"), 0);
    /* A miss then two hits: two Gets served from memory. */
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
        cr_assert_eq(sfs_cache_release(c, &l), 0);
    }
    sfs_cache_count_served(c, SFS_TIER_STORE);
    sfs_cache_count_served(c, SFS_TIER_STORE);
    sfs_cache_count_served(c, SFS_TIER_PEER);
    sfs_cache_count_served(c, SFS_TIER_MISS);
    /* Memory is derived, never counted; nothing past the tiers; no handle. */
    sfs_cache_count_served(c, SFS_TIER_MEMORY);
    sfs_cache_count_served(c, SFS_TIERS);
    sfs_cache_count_served(c, (enum sfs_tier) - 1);
    sfs_cache_count_served(NULL, SFS_TIER_STORE);

    unsigned n = sfs_cache_served(c, out, 4);

    cr_assert_eq(n, 1);
    cr_assert_str_eq(out[0].name, "mount");
    cr_assert_eq(out[0].tier[SFS_TIER_MEMORY], 2);
    cr_assert_eq(out[0].tier[SFS_TIER_STORE], 2);
    cr_assert_eq(out[0].tier[SFS_TIER_PEER], 1);
    cr_assert_eq(out[0].tier[SFS_TIER_MISS], 1);
    cr_assert_eq(sfs_cache_served(NULL, out, 4), 0);
    cr_assert_eq(sfs_cache_served(c, NULL, 4), 0);
    cr_assert_eq(sfs_cache_served(c, out, 0), 0);
    /* A class name the record's bytes do not spell (forged: the record is
     * shared memory) reads as "other". */
    memcpy(c->self->cls, "bad name\x01\x02\x03\x04\x05\x06\x07\x08", SFS_CLASS_LEN);
    n = sfs_cache_served(c, out, 4);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(out[0].name, "other");
    sfs_cache_close(c);
}

struct cls_arg {
    char name[SFS_CLASS_LEN];
    int store;
    bool no_close; /* exit with the handle open: the server reaps the record */
};

static int counting_child(struct sfs_cache *c, void *p)
{
    const struct cls_arg *a = p;

    TU_CK(sfs_cache_set_class(c, a->name) == 0);
    for (int i = 0; i < a->store; i++)
        sfs_cache_count_served(c, SFS_TIER_STORE);
    sfs_cache_observe(c, SFS_HIST_LOAD, 1000ll * (a->store + 1));
    if (a->no_close)
        tu_exit(0);
    return 0;
}

static void run_child(const char *path, const char *name, int store, bool no_close)
{
    struct cls_arg a = {.store = store, .no_close = no_close};

    snprintf(a.name, sizeof(a.name), "%s", name);
    cr_assert_eq(tu_wait(tu_fork_attached(path, 0, counting_child, &a)), 0);
}

/* A gone process's counts stay, under its class, whether it closed its
 * handle or the server reaped its record; one that counted nothing leaves
 * no entry. */
Test(served, a_gone_process_counts_under_its_class)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    const char *path = tu_path("served");
    struct sfs_served out[8];
    struct sfs_hist h;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    cr_assert_eq(sfs_cache_set_class(c, "mount"), 0);
    run_child(path, "rank", 3, true);
    tu_wait_reaped(c, 1);
    run_child(path, "rank", 2, false);
    run_child(path, "idle", 0, true);
    tu_wait_reaped(c, 2);

    unsigned n = sfs_cache_served(c, out, 8);
    const struct sfs_served *r = entry_of(out, n, "rank");

    cr_assert_not_null(r);
    cr_assert_eq(r->tier[SFS_TIER_STORE], 5);
    cr_assert_eq(r->attached, 0);
    cr_assert_null(entry_of(out, n, "idle"), "a class that served nothing is not listed");
    cr_assert_not_null(entry_of(out, n, "mount"));
    cr_assert_eq(entry_of(out, n, "mount")->attached, 1);
    /* Their load times stay in the histogram (one observation each). */
    sfs_cache_hist(c, SFS_HIST_LOAD, &h);
    uint64_t total = 0;

    for (int i = 0; i < SFS_HIST_BUCKETS; i++)
        total += h.bucket[i];
    cr_assert_eq(total, 3);
    cr_assert_eq(h.sum_ns, 4000 + 3000 + 1000);
    sfs_cache_close(c);
}

/*
 * The header's class table has room for SFS_CLASSES names; the classes of
 * gone processes past its room are counted as "other", never under another
 * class's name.
 */
Test(served, classes_past_the_tables_room_count_as_other)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    const char *path = tu_path("served");
    const int nclasses = 20;
    struct sfs_served out[32];
    char name[SFS_CLASS_LEN];
    uint64_t sum = 0, want = 0;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    for (int i = 0; i < nclasses; i++) {
        snprintf(name, sizeof(name), "class%d", i);
        run_child(path, name, i + 1, false);
        want += (uint64_t)i + 1;
    }
    unsigned n = sfs_cache_served(c, out, 32);

    cr_assert_not_null(entry_of(out, n, "other"), "no \"other\" among %u classes", n);
    for (unsigned i = 0; i < n; i++) {
        int k;

        sum += out[i].tier[SFS_TIER_STORE];
        if (sscanf(out[i].name, "class%d", &k) == 1)
            cr_assert_eq(out[i].tier[SFS_TIER_STORE], (uint64_t)k + 1,
                         "%s counts %llu, another class's counts with its own", out[i].name,
                         (unsigned long long)out[i].tier[SFS_TIER_STORE]);
    }
    cr_assert_eq(sum, want, "every count is somewhere");
    /* A table with room for fewer entries than classes: the first ones. */
    cr_assert_eq(sfs_cache_served(c, out, 3), 3);
    sfs_cache_close(c);
}

Test(served, histogram_buckets)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_hist h;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_hist_bound_ns(SFS_HIST_BUCKETS - 1), INT64_MAX);
    cr_assert_eq(sfs_hist_bound_ns(1000), INT64_MAX);
    for (unsigned i = 1; i < SFS_HIST_BUCKETS - 1; i++)
        cr_assert_gt(sfs_hist_bound_ns(i), sfs_hist_bound_ns(i - 1));
    /* One observation at each bound lands in its bucket; a negative time
     * counts as 0; one past the last bound in the last bucket. */
    for (unsigned i = 0; i < SFS_HIST_BUCKETS - 1; i++)
        sfs_cache_observe(c, SFS_HIST_WAIT, sfs_hist_bound_ns(i));
    sfs_cache_observe(c, SFS_HIST_WAIT, -5);
    sfs_cache_observe(c, SFS_HIST_WAIT, sfs_hist_bound_ns(SFS_HIST_BUCKETS - 2) + 1);
    /* Kinds past the last, and no handle: ignored. */
    sfs_cache_observe(c, SFS_HIST_KINDS, 1);
    sfs_cache_observe(c, (enum sfs_hist_kind) - 1, 1);
    sfs_cache_observe(NULL, SFS_HIST_WAIT, 1);
    sfs_cache_hist(c, SFS_HIST_WAIT, &h);
    cr_assert_eq(h.bucket[0], 2);
    for (unsigned i = 1; i < SFS_HIST_BUCKETS - 1; i++)
        cr_assert_eq(h.bucket[i], 1, "bucket %u", i);
    cr_assert_eq(h.bucket[SFS_HIST_BUCKETS - 1], 1);
    sfs_cache_hist(c, SFS_HIST_LOAD, &h);
    for (unsigned i = 0; i < SFS_HIST_BUCKETS; i++)
        cr_assert_eq(h.bucket[i], 0);
    /* Out of range or no handle: all zero; no output: nothing written. */
    memset(&h, 0xff, sizeof(h));
    sfs_cache_hist(c, SFS_HIST_KINDS, &h);
    cr_assert(tu_all_bytes(&h, sizeof(h), 0));
    memset(&h, 0xff, sizeof(h));
    sfs_cache_hist(NULL, SFS_HIST_LOAD, &h);
    cr_assert(tu_all_bytes(&h, sizeof(h), 0));
    sfs_cache_hist(c, SFS_HIST_LOAD, NULL);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * The sampler.
 */

struct seen {
    unsigned n, accessed, leased;
    uint32_t want_slot; /* count visits of this slot in hits */
    unsigned hits;
    int stop_after; /* > 0: return 7 at this visit */
};

static int visit(const struct sfs_key *key, uint32_t slot, bool accessed, bool leased, void *arg)
{
    struct seen *s = arg;

    (void)key;
    s->n++;
    s->accessed += accessed;
    s->leased += leased;
    s->hits += slot == s->want_slot;
    if (s->stop_after && (int)s->n == s->stop_after)
        return 7;
    return 0;
}

Test(served, a_sample_sweep_sees_each_ready_slot_once)
{
    struct sfs_cache *c = tu_cache(64, 0, SHARD);
    struct sfs_key k;
    struct sfs_lease held, loading;
    uint32_t cursor = 0;
    const unsigned nkeys = 40;

    cr_assert_not_null(c);
    for (unsigned i = 0; i < nkeys; i++) {
        k = tu_key(i, 0);
        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }
    /* A Loading key is no Ready slot: never visited. */
    k = tu_key(1000, 0);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &loading), SFS_OWNER);
    /* One held lease. */
    k = tu_key(3, 0);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &held), SFS_HIT);

    cr_assert_eq(sfs_cache_sample(NULL, &cursor, 0, visit, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_sample(c, NULL, 0, visit, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, NULL, NULL), -EINVAL);

    /* All buckets at once (0, or a bound past the count). */
    struct seen all = {.want_slot = held.slot};

    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, visit, &all), 0);
    cr_assert_eq(all.n, nkeys);
    cr_assert_eq(all.hits, 1);
    cr_assert_eq(all.leased, 1, "only the held slot is leased");
    all = (struct seen){.want_slot = held.slot};
    cr_assert_eq(sfs_cache_sample(c, &cursor, 1u << 20, visit, &all), 0);
    cr_assert_eq(all.n, nkeys);

    /* A sweep of 4 buckets a call (the count is a power of two), from a
     * cursor past the bucket count: each Ready slot once per lap, and the
     * cursor back where the lap began. */
    struct seen lap = {.want_slot = held.slot};

    cursor = c->nbuckets + 5;
    for (uint32_t done = 0; done < c->nbuckets; done += 4)
        cr_assert_eq(sfs_cache_sample(c, &cursor, 4, visit, &lap), 0);
    cr_assert_eq(lap.n, nkeys);
    cr_assert_eq(lap.hits, 1);
    cr_assert_eq(cursor, 5);

    /* A callback's non-zero answer ends the call and is its result. */
    struct seen stop = {.stop_after = 5};

    cursor = 0;
    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, visit, &stop), 7);
    cr_assert_eq(stop.n, 5);

    cr_assert_eq(sfs_cache_release(c, &held), 0);
    cr_assert_eq(sfs_cache_fail(c, &loading, -EIO), 0);
    cr_assert_eq(sfs_cache_release(c, &loading), 0);
    sfs_cache_close(c);
}
