/* SPDX-License-Identifier: MIT */
/*
 * test_admission.c - the scan-resistant admission (-o admission=scan,
 * core/cache/admit.c) against plain CLOCK, on real caches.
 *
 * A hot set that was read twice survives a scan of cold keys four times the
 * cache with admission=scan and is flushed by it with CLOCK (the same steps
 * in both modes show the difference); nothing loaded is lost before it was
 * copied, with leases held until the copy and with the copy after the release
 * (half the cache in flight, bench_clock's sweep); a hand on a stale census
 * still finds a victim; an attached process
 * follows the creator's mode; a bad mode is refused. Every test clears
 * SHARDFS_TEST_ADMISSION, which would otherwise turn its CLOCK caches into
 * scan ones (the suite's admission=scan run).
 */
#include "testutil.h"
#include "cache_i.h"     /* SLOT_F_PROBATION: the attached child's view */
#include "testpoint_i.h" /* a point on get:locked forces the locked hit */

#include <criterion/criterion.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SHARD 4096u
#define CAP   64u

static struct sfs_cache *mk(uint32_t nslots, int admission)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
        .admission = admission,
    };
    int err = 0;
    struct sfs_cache *c;

    unsetenv("SHARDFS_TEST_ADMISSION");
    c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c, "create: %s", strerror(-err));
    return c;
}

/* One read: Get (load and publish on a miss), check the bytes, release.
 * Returns the role. */
static int read_key(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;
    int r = sfs_cache_get(c, k, 0, 0, &l);

    cr_assert(r == SFS_HIT || r == SFS_OWNER, "get: %d", r);
    if (r == SFS_OWNER)
        cr_assert_eq(tu_publish(c, k, &l), 0);
    cr_assert_eq(tu_check(k, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    return r;
}

/* Read the hot set (cap/4 keys) twice, then scan 4x cap cold keys once;
 * returns how many hot keys are still resident (state only: no access). */
static unsigned hot_after_scan(int admission)
{
    struct sfs_cache *c = mk(CAP, admission);
    const uint32_t hot = CAP / 4, cold = 4 * CAP;
    unsigned left = 0;

    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < hot; i++)
            cr_assert_eq(read_key(c, &(struct sfs_key){tu_block(1000 + i), 0}),
                         pass ? SFS_HIT : SFS_OWNER);
    for (uint32_t i = 0; i < cold; i++)
        cr_assert_eq(read_key(c, &(struct sfs_key){tu_block(5000 + i), 0}), SFS_OWNER);
    for (uint32_t i = 0; i < hot; i++)
        left += sfs_cache_state(c, &(struct sfs_key){tu_block(1000 + i), 0}) == SFS_STATE_READY;
    sfs_cache_close(c);
    return left;
}

Test(admission, scan_keeps_hot_set_through_full_scan, .timeout = 30)
{
    unsigned left = hot_after_scan(SFS_ADMIT_SCAN);

    cr_assert_eq(left, CAP / 4, "admission=scan: %u of %u hot keys survived a 4x cap scan", left,
                 CAP / 4);
}

Test(admission, clock_loses_hot_set_to_full_scan, .timeout = 30)
{
    /* The same steps with CLOCK: the scan flushes the hot set. This is the
     * behaviour admission=scan exists to change. */
    unsigned left = hot_after_scan(SFS_ADMIT_CLOCK);

    cr_assert_eq(left, 0, "CLOCK: %u hot keys survived a 4x cap scan", left);
}

/* Deterministic keys from a space of 8x cap, skewed: low numbers often. */
static uint32_t skewed(uint64_t *rng)
{
    uint64_t x = tu_rng_next(rng);
    uint32_t span = 8 * CAP;

    /* Square of a uniform: density falls with the key number. */
    double u = (double)(x >> 11) / 9007199254740992.0;
    return (uint32_t)(u * u * span);
}

/* A batch of B distinct keys. */
static void batch_keys(uint64_t *rng, uint32_t *out, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k;
        bool dup;

        do {
            k = skewed(rng);
            dup = false;
            for (uint32_t j = 0; j < i; j++)
                dup |= out[j] == k;
        } while (dup);
        out[i] = k;
    }
}

Test(admission, held_loads_never_lost_before_copy, .timeout = 60)
{
    /* Batch b is loaded and held while batch b + 1 loads (evicting), then
     * copied: every byte is still the key's, in both modes. */
    for (int mode = SFS_ADMIT_CLOCK; mode <= SFS_ADMIT_SCAN; mode++) {
        struct sfs_cache *c = mk(CAP, mode);
        const uint32_t B = CAP / 8;
        uint32_t keys[2][CAP / 8];
        struct sfs_lease held[2][CAP / 8];
        uint64_t rng = 7;

        for (uint32_t b = 0; b < 200; b++) {
            uint32_t *k = keys[b & 1];
            struct sfs_lease *h = held[b & 1];

            batch_keys(&rng, k, B);
            for (uint32_t i = 0; i < B; i++) {
                struct sfs_key key = tu_key(k[i] + 1, 0);
                int r = sfs_cache_get(c, &key, 0, 0, &h[i]);

                if (r == SFS_OWNER)
                    cr_assert_eq(tu_publish(c, &key, &h[i]), 0);
                else
                    cr_assert_eq(r, SFS_HIT, "mode %d: get: %d", mode, r);
            }
            if (b == 0)
                continue;
            /* Copy batch b - 1, then drop its leases. */
            uint32_t *pk = keys[(b - 1) & 1];
            struct sfs_lease *ph = held[(b - 1) & 1];
            for (uint32_t i = 0; i < B; i++) {
                struct sfs_key key = tu_key(pk[i] + 1, 0);

                cr_assert_eq(tu_check(&key, sfs_cache_data(c, &ph[i]), SHARD), -1,
                             "mode %d: batch %u key %u lost before its copy", mode, b - 1, pk[i]);
                cr_assert_eq(sfs_cache_release(c, &ph[i]), 0);
            }
        }
        for (uint32_t i = 0; i < B; i++)
            cr_assert_eq(sfs_cache_release(c, &held[199 & 1][i]), 0);
        sfs_cache_close(c);
    }
}

Test(admission, released_loads_survive_until_copy_half_cache_in_flight, .timeout = 60)
{
    /* bench_clock's sweep: batches of cap/8 loaded and released, copied
     * three batches later (half the cache in flight): only the accessed bit
     * and the admission's share protect them. None may be gone, in either
     * mode. A probationary share below one half fails here (docs/eviction.md). */
    for (int mode = SFS_ADMIT_CLOCK; mode <= SFS_ADMIT_SCAN; mode++) {
        struct sfs_cache *c = mk(CAP, mode);
        const uint32_t B = CAP / 8, lag = 3, nb = 300;
        uint32_t(*keys)[CAP / 8] = calloc(nb, sizeof(*keys));
        uint8_t(*loaded)[CAP / 8] = calloc(nb, sizeof(*loaded));
        uint64_t rng = 11, lost = 0, copied = 0;

        cr_assert(keys && loaded);
        for (uint32_t b = 0; b < nb + lag; b++) {
            if (b < nb) {
                batch_keys(&rng, keys[b], B);
                for (uint32_t i = 0; i < B; i++)
                    loaded[b][i] =
                        read_key(c, &(struct sfs_key){tu_block(keys[b][i] + 1), 0}) == SFS_OWNER;
            }
            if (b < lag)
                continue;
            for (uint32_t i = 0; i < B; i++) {
                struct sfs_key key = tu_key(keys[b - lag][i] + 1, 0);
                struct sfs_lease l;
                int r = sfs_cache_get(c, &key, SFS_GET_NOALLOC, 0, &l);

                if (r == SFS_HIT) {
                    cr_assert_eq(tu_check(&key, sfs_cache_data(c, &l), SHARD), -1);
                    cr_assert_eq(sfs_cache_release(c, &l), 0);
                } else {
                    cr_assert_eq(r, -ENOENT);
                }
                if (loaded[b - lag][i]) {
                    copied++;
                    lost += r != SFS_HIT;
                }
            }
        }
        cr_assert_gt(copied, 500);
        cr_assert_eq(lost, 0, "mode %d: %llu of %llu released loads evicted before their copy",
                     mode, (unsigned long long)lost, (unsigned long long)copied);
        free(keys);
        free(loaded);
        sfs_cache_close(c);
    }
}

static void noop_point(const char *name, void *arg)
{
    (void)name;
    (void)arg;
}

/* Get key with flags (a hit or a wait expected), release; returns the role. */
static int get_release(struct sfs_cache *c, const struct sfs_key *k, unsigned flags)
{
    struct sfs_lease l;
    int r = sfs_cache_get(c, k, flags, 0, &l);

    cr_assert(r == SFS_HIT || r == SFS_WAITER, "get %#x: %d", flags, r);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    return r;
}

Test(admission, peek_is_not_a_use, .timeout = 30)
{
    /* SFS_GET_PEEK (a copy of a key the caller loaded and released) sets no
     * CLOCK bit and keeps a probationary key on probation, on the lock-free
     * hit, on the locked one (a point armed on it forces that path) and on
     * a wait; a plain Get does both. */
    for (int locked = 0; locked < 2; locked++) {
        struct sfs_cache *c = mk(8, SFS_ADMIT_SCAN);
        struct sfs_key k = tu_key(5, 0), w = tu_key(6, 0);
        struct sfs_lease l;

        if (locked)
            cr_assert_eq(sfs_testpoint_arm("get:locked", SFS_TP_CALL, noop_point, NULL), 0);
        cr_assert_eq(read_key(c, &k), SFS_OWNER);
        cr_assert_eq(sfs_cache_get(c, &k, SFS_GET_NOALLOC, 0, &l), SFS_HIT);
        uint32_t s = l.slot;
        cr_assert_eq(sfs_cache_release(c, &l), 0);
        /* That hit promoted it; make it a fresh load again, as the hand
         * left it: bit clear, on probation. */
        atomic_store(&c->slots[s].accessed, 0);
        atomic_fetch_or(&c->slots[s].flags, (uint8_t)SLOT_F_PROBATION);
        cr_assert_eq(get_release(c, &k, SFS_GET_PEEK | SFS_GET_NOALLOC), SFS_HIT);
        cr_assert_eq(atomic_load(&c->slots[s].accessed), 0, "locked %d: a peek set the bit",
                     locked);
        cr_assert(atomic_load(&c->slots[s].flags) & SLOT_F_PROBATION,
                  "locked %d: a peek promoted the key", locked);
        cr_assert_eq(get_release(c, &k, 0), SFS_HIT);
        cr_assert_eq(atomic_load(&c->slots[s].accessed), 1);
        cr_assert_eq(atomic_load(&c->slots[s].flags) & SLOT_F_PROBATION, 0);

        /* A wait on a load (this process owns it, so the Get waits). */
        struct sfs_lease o;
        cr_assert_eq(sfs_cache_get(c, &w, 0, 0, &o), SFS_OWNER);
        atomic_store(&c->slots[o.slot].accessed, 0);
        cr_assert_eq(get_release(c, &w, SFS_GET_PEEK), SFS_WAITER);
        cr_assert_eq(atomic_load(&c->slots[o.slot].accessed), 0);
        cr_assert(atomic_load(&c->slots[o.slot].flags) & SLOT_F_PROBATION);
        cr_assert_eq(get_release(c, &w, 0), SFS_WAITER);
        cr_assert_eq(atomic_load(&c->slots[o.slot].accessed), 1);
        cr_assert_eq(atomic_load(&c->slots[o.slot].flags) & SLOT_F_PROBATION, 0);
        cr_assert_eq(tu_publish(c, &w, &o), 0);
        cr_assert_eq(sfs_cache_release(c, &o), 0);
        sfs_testpoint_disarm_all();
        sfs_cache_close(c);
    }
}

Test(admission, a_peeked_hot_set_is_scanned_out, .timeout = 30)
{
    /* What the flag is for: keys read once, then peeked (their copies), are
     * one-shot keys to the admission, and a scan takes them as it would
     * any; read twice (scan_keeps_hot_set_through_full_scan) they survive. */
    struct sfs_cache *c = mk(CAP, SFS_ADMIT_SCAN);
    const uint32_t hot = CAP / 4;
    unsigned left = 0;

    for (uint32_t i = 0; i < hot; i++) {
        struct sfs_key k = tu_key(1000 + i, 0);

        cr_assert_eq(read_key(c, &k), SFS_OWNER);
        cr_assert_eq(get_release(c, &k, SFS_GET_PEEK | SFS_GET_NOALLOC), SFS_HIT);
    }
    for (uint32_t i = 0; i < 4 * CAP; i++)
        cr_assert_eq(read_key(c, &(struct sfs_key){tu_block(5000 + i), 0}), SFS_OWNER);
    for (uint32_t i = 0; i < hot; i++)
        left += sfs_cache_state(c, &(struct sfs_key){tu_block(1000 + i), 0}) == SFS_STATE_READY;
    cr_assert_eq(left, 0, "%u of %u peeked keys outlived a 4x cap scan", left, hot);
    sfs_cache_close(c);
}

Test(admission, stale_census_still_finds_a_victim, .timeout = 30)
{
    /* The census says probation is over its share (the hand saw only new
     * keys), then every key is read again (all main). The next load's hand
     * passes over main slots until its census window closes on a lap of main
     * slots, then takes one: a full cache of unleased slots is never -ENOSPC.
     * (Single-threaded the window always closes within the scan's two laps;
     * evict.c's plain rescan covers what concurrent hands can do to it.) */
    const uint32_t n = 16;
    struct sfs_cache *c = mk(n, SFS_ADMIT_SCAN);

    for (uint32_t i = 0; i < 2 * n; i++)
        cr_assert_eq(read_key(c, &(struct sfs_key){tu_block(100 + i), 0}), SFS_OWNER);
    for (uint32_t i = n; i < 2 * n; i++)
        cr_assert_eq(read_key(c, &(struct sfs_key){tu_block(100 + i), 0}), SFS_HIT);
    for (uint32_t s = 0; s < n; s++)
        cr_assert_eq(atomic_load(&c->slots[s].flags) & SLOT_F_PROBATION, 0);
    cr_assert_eq(read_key(c, &(struct sfs_key){tu_block(999), 0}), SFS_OWNER);
    sfs_cache_close(c);
}

static int attached_child(struct sfs_cache *c, void *arg)
{
    (void)arg;
    struct sfs_key k = tu_key(77, 0);
    struct sfs_lease l;

    TU_CK(c->admit_scan);
    TU_CK(sfs_cache_get(c, &k, 0, 0, &l) == SFS_OWNER);
    TU_CK(atomic_load(&c->slots[l.slot].flags) & SLOT_F_PROBATION);
    TU_CK(tu_publish(c, &k, &l) == 0);
    TU_CK(sfs_cache_release(c, &l) == 0);
    /* The second read promotes it. */
    TU_CK(sfs_cache_get(c, &k, 0, 0, &l) == SFS_HIT);
    TU_CK(!(atomic_load(&c->slots[l.slot].flags) & SLOT_F_PROBATION));
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(admission, attached_process_follows_the_creators_mode, .timeout = 30)
{
    struct sfs_cache *c = mk(8, SFS_ADMIT_SCAN);
    const char *path = tu_path("admission");

    cr_assert_eq(sfs_cache_serve(c, path), 0);
    cr_assert_eq(tu_wait(tu_fork_attached(path, 1, attached_child, NULL)), 0);
    sfs_cache_close(c);
}

Test(admission, bad_mode_refused, .timeout = 10)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = 8, .hugepages = SFS_HUGEPAGES_OFF, .admission = 2};
    int err = 0;

    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
}

/* The suite's switch (SHARDFS_TEST_ADMISSION=scan, test builds only):
 * a CLOCK cache is created SCAN; one asked for SCAN stays so; any other
 * value changes nothing. */
Test(admission, the_suites_switch_to_scan, .timeout = 10)
{
    struct sfs_cache *c;

    cr_assert_eq(setenv("SHARDFS_TEST_ADMISSION", "scan", 1), 0);
    c = tu_cache(8, 0, SHARD);
    cr_assert(c->admit_scan, "a CLOCK cache under the switch is not SCAN");
    sfs_cache_close(c);
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 8,
                                   .no_reserved = true,
                                   .hugepages = SFS_HUGEPAGES_OFF,
                                   .admission = SFS_ADMIT_SCAN};
    int err = 0;

    c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c, "%s", strerror(-err));
    cr_assert(c->admit_scan);
    sfs_cache_close(c);
    cr_assert_eq(setenv("SHARDFS_TEST_ADMISSION", "clock", 1), 0);
    c = tu_cache(8, 0, SHARD);
    cr_assert_not(c->admit_scan);
    sfs_cache_close(c);
    cr_assert_eq(unsetenv("SHARDFS_TEST_ADMISSION"), 0);
}
