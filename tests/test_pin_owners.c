/* SPDX-License-Identifier: MIT */
/*
 * test_pin_owners.c - pins have owners (sfs_cache_pin_as): only a pin's
 * owner, or root, changes or removes it; one user's pins stay within its
 * share of the budget (pin_user_pct) at pin time and as its blocks' shards
 * load later, so root's pin still finds room; no pin outlives pin_max. The
 * pin table and the user table are bounded (-ENOSPC); a block named twice
 * in a batch is one pin; the pin queries refuse bad arguments; a writer
 * killed mid-write is repaired by the next.
 * The uids here are the core's arguments; docs/security.md and
 * test_fs_pins.c show the mount passing a real unprivileged requester's.
 */
#include "cache_i.h" /* the header: its pin counters */
#include "testpoint_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <stdatomic.h>
#include <signal.h>
#include <string.h>

#define SHARD 4096u
#define ALICE 1000u
#define BOB   1001u
#define ROOT  0u

static struct sfs_cache *cache_owners(uint32_t nslots, uint32_t user_pct, uint32_t max_s)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
        .pin_budget_pct = 50,
        .pin_user_pct = user_pct,
        .pin_max_seconds = max_s,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "create: %s", strerror(-err));
    return c;
}

static int pin(struct sfs_cache *c, uint64_t b, uint32_t s, uint32_t uid)
{
    struct sfs_block_id id = tu_block(b);

    return sfs_cache_pin_as(c, &id, 1, s, uid);
}

static int pinned(struct sfs_cache *c, uint64_t b)
{
    return sfs_cache_pinned(c, &(struct sfs_key){tu_block(b), 0});
}

Test(pin_owners, only_the_owner_or_root_changes_a_pin, .timeout = 30)
{
    struct sfs_cache *c = cache_owners(64, 0, 0);

    cr_assert_eq(tu_load(c, &(struct sfs_key){tu_block(1), 0}), SFS_OWNER);
    cr_assert_eq(pin(c, 1, 600, ALICE), 1);
    /* Bob can neither shorten, renew nor remove Alice's pin. */
    cr_assert_eq(pin(c, 1, 1, BOB), -EPERM);
    cr_assert_eq(pin(c, 1, 0, BOB), -EPERM);
    cr_assert_eq(pinned(c, 1), 1);
    /* A batch with one of Alice's blocks changes none of Bob's either. */
    struct sfs_block_id two[2] = {tu_block(2), tu_block(1)};
    cr_assert_eq(sfs_cache_pin_as(c, two, 2, 60, BOB), -EPERM);
    cr_assert_eq(pin(c, 2, 0, ROOT), 0); /* nothing was pinned */
    /* Alice renews her own; root takes it over; then it is root's. */
    cr_assert_eq(pin(c, 1, 300, ALICE), 1);
    cr_assert_eq(pin(c, 1, 300, ROOT), 1);
    cr_assert_eq(pin(c, 1, 0, ALICE), -EPERM);
    cr_assert_eq(pin(c, 1, 0, ROOT), 0);
    cr_assert_eq(pinned(c, 1), 0);
    /* Free again: anyone may pin it. */
    cr_assert_eq(pin(c, 1, 60, BOB), 1);
    sfs_cache_close(c);
}

/* 64 slots, a pin budget of 32, a user's share 25 %: 8 slots each. */
Test(pin_owners, a_users_share_holds_at_pin_time_and_as_shards_load, .timeout = 30)
{
    struct sfs_cache *c = cache_owners(64, 25, 0);
    struct sfs_block_id ids[16];

    for (int i = 0; i < 16; i++) {
        ids[i] = tu_block(100 + (uint64_t)i);
        if (i < 10)
            cr_assert_eq(tu_load(c, &(struct sfs_key){ids[i], 0}), SFS_OWNER);
    }
    /* Ten resident blocks are over Alice's 8: refused whole. */
    cr_assert_eq(sfs_cache_pin_as(c, ids, 10, 600, ALICE), -EDQUOT);
    cr_assert_eq(sfs_cache_pin_as(c, ids, 8, 600, ALICE), 8);
    cr_assert_eq(sfs_cache_pin_as(c, ids + 8, 1, 600, ALICE), -EDQUOT);
    /* Pinned while absent, her blocks 10..15 charge her as they load:
     * none of them gets past her share. */
    cr_assert_eq(sfs_cache_pin_as(c, ids + 10, 6, 600, ALICE), 0);
    for (int i = 10; i < 16; i++)
        cr_assert_eq(tu_load(c, &(struct sfs_key){ids[i], 0}), SFS_OWNER);
    int held = 0;
    for (int i = 0; i < 16; i++)
        held += pinned(c, 100 + (uint64_t)i) == 1;
    cr_assert_eq(held, 8, "Alice's pins hold %d slots, her share is 8", held);
    /* Bob has a share of his own, and root is not bounded by one. */
    struct sfs_block_id bob[4], root[12];
    for (int i = 0; i < 4; i++) {
        bob[i] = tu_block(200 + (uint64_t)i);
        cr_assert_eq(tu_load(c, &(struct sfs_key){bob[i], 0}), SFS_OWNER);
    }
    cr_assert_eq(sfs_cache_pin_as(c, bob, 4, 600, BOB), 4);
    for (int i = 0; i < 12; i++) {
        root[i] = tu_block(300 + (uint64_t)i);
        cr_assert_eq(tu_load(c, &(struct sfs_key){root[i], 0}), SFS_OWNER);
    }
    cr_assert_eq(sfs_cache_pin_as(c, root, 12, 600, ROOT), 12);
    /* Alice unpins: her share comes back to her. */
    cr_assert_eq(sfs_cache_pin_as(c, ids, 16, 0, ALICE), 0);
    cr_assert_eq(sfs_cache_pin_as(c, ids, 8, 600, ALICE), 8);
    sfs_cache_close(c);
}

Test(pin_owners, no_pin_outlives_pin_max, .timeout = 30)
{
    struct sfs_cache *c = cache_owners(64, 0, 60);

    cr_assert_eq(tu_load(c, &(struct sfs_key){tu_block(1), 0}), SFS_OWNER);
    cr_assert_eq(pin(c, 1, 61, ALICE), -EINVAL);
    cr_assert_eq(pin(c, 1, 61, ROOT), -EINVAL);
    cr_assert_eq(pin(c, 1, 60, ALICE), 1);
    /* Bad shares and maxima are refused at create. */
    struct sfs_cache_config bad = {.shard_size = SHARD, .nslots = 64, .pin_user_pct = 101};
    int err = 0;
    cr_assert_null(sfs_cache_create(&bad, &err));
    cr_assert_eq(err, -EINVAL);
    bad.pin_user_pct = 0;
    bad.pin_max_seconds = SFS_PIN_MAX_SECONDS + 1;
    cr_assert_null(sfs_cache_create(&bad, &err));
    cr_assert_eq(err, -EINVAL);
    sfs_cache_close(c);
}

/* The pin table holds npins entries (a block's pin sits within 16 of its
 * hash): a pin that finds none free is -ENOSPC, and the pins made before
 * it hold. The user table holds 64 users with pins: a 65th is -ENOSPC
 * until one of them has none left. */
Test(pin_owners, the_pin_and_user_tables_are_bounded, .timeout = 30)
{
    struct sfs_cache *c = cache_owners(64, 0, 0); /* 64 pin entries */
    struct sfs_block_id id;
    int made = 0, r = 0;

    for (uint64_t b = 1000; b < 1000 + 65 && r == 0; b++) {
        id = tu_block(b);
        r = sfs_cache_pin_as(c, &id, 1, 600, ALICE);
        made += r == 0;
    }
    cr_assert_eq(r, -ENOSPC, "65 pins in a table of 64: %d", r);
    cr_assert_geq(made, 16);
    for (uint64_t b = 1000; b < 1000 + (uint64_t)made; b++) {
        id = tu_block(b);
        cr_assert_eq(sfs_cache_block_pinned(c, &id), 1, "block %llu", (unsigned long long)b);
    }
    sfs_cache_close(c);

    c = cache_owners(512, 0, 0); /* 256 pin entries */
    for (uint32_t u = 0; u < 64; u++) {
        id = tu_block(2000 + u);
        cr_assert_eq(sfs_cache_pin_as(c, &id, 1, 600, 5000 + u), 0, "user %u", u);
    }
    id = tu_block(3000);
    cr_assert_eq(sfs_cache_pin_as(c, &id, 1, 600, 6000), -ENOSPC, "a 65th user");
    cr_assert_eq(sfs_cache_block_pinned(c, &id), 0);
    /* The first user unpins its block: its place is free. */
    struct sfs_block_id first = tu_block(2000);

    cr_assert_eq(sfs_cache_pin_as(c, &first, 1, 0, 5000), 0);
    cr_assert_eq(sfs_cache_pin_as(c, &id, 1, 600, 6000), 0);
    cr_assert_eq(sfs_cache_block_pinned(c, &id), 1);
    sfs_cache_close(c);
}

/* A block named twice in one batch is pinned once, counted once and
 * charged once: at the edge of a user's share it still fits. */
Test(pin_owners, a_block_twice_in_a_batch_is_one_pin, .timeout = 30)
{
    struct sfs_cache *c = cache_owners(64, 25, 0); /* Alice's share: 8 slots */
    struct sfs_block_id ids[7], twice[2] = {tu_block(7), tu_block(7)};

    for (int i = 0; i < 7; i++) {
        ids[i] = tu_block(100 + (uint64_t)i);
        cr_assert_eq(tu_load(c, &(struct sfs_key){ids[i], 0}), SFS_OWNER);
    }
    cr_assert_eq(sfs_cache_pin_as(c, ids, 7, 600, ALICE), 7);
    cr_assert_eq(tu_load(c, &(struct sfs_key){tu_block(7), 0}), SFS_OWNER);
    cr_assert_eq(sfs_cache_pin_as(c, twice, 2, 600, ALICE), 1, "one shard pinned");
    cr_assert_eq(pinned(c, 7), 1);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 8 * SHARD);
    /* Her share is full now: one more is refused. */
    cr_assert_eq(tu_load(c, &(struct sfs_key){tu_block(8), 0}), SFS_OWNER);
    cr_assert_eq(pin(c, 8, 600, ALICE), -EDQUOT);
    cr_assert_eq(sfs_cache_pin_as(c, twice, 2, 0, ALICE), 0);
    cr_assert_eq(pinned(c, 7), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 7 * SHARD);
    cr_assert_eq(pin(c, 8, 600, ALICE), 1);
    sfs_cache_close(c);
}

Test(pin_owners, pin_queries_refuse_bad_arguments, .timeout = 30)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 64,
                                   .no_reserved = true,
                                   .hugepages = SFS_HUGEPAGES_OFF,
                                   .partitions = 2};
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    struct sfs_key k = {tu_block(1), 0};
    uint64_t ev[2] = {7, 7};
    uint32_t sl[2] = {7, 7};

    cr_assert_not_null(c, "%s", strerror(-err));
    cr_assert_eq(sfs_cache_pinned(NULL, &k), -EINVAL);
    cr_assert_eq(sfs_cache_pinned(c, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_pinned(c, &k), 0, "absent: not pinned");
    cr_assert_eq(sfs_cache_block_pinned(NULL, &k.block), -EINVAL);
    cr_assert_eq(sfs_cache_block_pinned(c, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_pinned_bytes(NULL), 0);
    cr_assert_eq(sfs_cache_pin_as(c, &k.block, 0, 60, ALICE), 0, "no blocks: nothing to do");
    cr_assert_eq(sfs_cache_pin_as(c, &k.block, 1u << 20, 60, ALICE), -EINVAL,
                 "more blocks than the table");
    /* The domains' counters: as many as asked for, and how many there are. */
    cr_assert_eq(sfs_cache_partition_evictions(NULL, ev, 2), 0);
    cr_assert_eq(sfs_cache_partition_evictions(c, NULL, 2), 2);
    cr_assert_eq(sfs_cache_partition_evictions(c, ev, 1), 2);
    cr_assert_eq(ev[0], 0);
    cr_assert_eq(ev[1], 7, "written past max");
    cr_assert_eq(sfs_cache_partition_slots(NULL, sl, 2), 0);
    cr_assert_eq(sfs_cache_partition_slots(c, NULL, 2), 2);
    cr_assert_eq(sfs_cache_partition_slots(c, sl, 1), 2);
    cr_assert_eq(sl[0], 32);
    cr_assert_eq(sl[1], 7, "written past max");
    cr_assert_eq(sfs_cache_partition_slots(c, sl, 2), 2);
    cr_assert_eq(sl[1], 32);
    sfs_cache_close(c);
}

/* A process killed while it writes a pin entry (its seq odd, the pin lock
 * held): lock-free readers take the half-written entry for a pin (a pin
 * is never broken on a guess); the next writer finds the lock's holder
 * dead, frees the entry and pins. */
struct half_pin {
    uint64_t block;
};

static int pin_and_die_mid_write(struct sfs_cache *c, void *arg)
{
    struct half_pin *h = arg;

    TU_CK(sfs_testpoint_arm("pin:half_written", SFS_TP_KILL, NULL, NULL) == 0);
    (void)pin(c, h->block, 600, ALICE);
    return 1; /* not reached: killed inside the pin */
}

Test(pin_owners, a_pin_writer_killed_mid_write_is_repaired, .timeout = 30)
{
    struct sfs_cache *c = cache_owners(64, 0, 0);
    const char *path = tu_path("pin");
    struct half_pin h = {.block = 40};
    struct sfs_block_id x = tu_block(40);

    cr_assert_eq(sfs_cache_serve(c, path), 0);
    cr_assert_eq(tu_wait(tu_fork_attached(path, 0, pin_and_die_mid_write, &h)), 128 + SIGKILL);
    cr_assert_eq(sfs_cache_block_pinned(c, &x), 1, "a half-written entry reads as a pin");
    /* A load meanwhile: not pinned by a guess (nothing charged). */
    cr_assert_eq(tu_load(c, &(struct sfs_key){x, 0}), SFS_OWNER);
    cr_assert_eq(pinned(c, 40), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 0);
    /* The next writer repairs: the half-written entry is free again. */
    cr_assert_eq(tu_load(c, &(struct sfs_key){tu_block(41), 0}), SFS_OWNER);
    cr_assert_eq(pin(c, 41, 600, BOB), 1);
    cr_assert_eq(sfs_cache_block_pinned(c, &x), 0);
    cr_assert_eq(pin(c, 40, 600, ALICE), 1);
    cr_assert_eq(pinned(c, 40), 1);
    /* The entry counts are the table's again: the dead writer had counted
     * the entry it never finished. */
    cr_assert_eq(atomic_load(&c->hdr->pins_used), 2, "pins_used %u for 2 entries",
                 atomic_load(&c->hdr->pins_used));
    for (uint32_t u = 0; u < SFS_PIN_USERS; u++) {
        uint32_t uid = atomic_load(&c->hdr->pin_users[u].uid);

        if (uid == ALICE || uid == BOB)
            cr_assert_eq(atomic_load(&c->hdr->pin_users[u].pins), 1, "uid %u: %u entries", uid,
                         atomic_load(&c->hdr->pin_users[u].pins));
    }
    sfs_cache_close(c);
}
