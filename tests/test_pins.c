/* SPDX-License-Identifier: MIT */
/*
 * test_pins.c - pins with a time to live and a budget (design.md, section 10), through
 * the core (sfs_cache_pin) and the rank API (sfs_rank_pin): a pinned block
 * survives a flood, its shards loaded while the pin lasts too; expiry frees
 * it with no thread to time it; unpin frees it at once; a batch over the
 * budget is refused whole with EDQUOT and never takes another pin's slots;
 * a process killed while holding pins leaves no pin beyond its TTL.
 *
 * Invariant (docs/invariants.md): a pinned slot is never evicted before its
 * pin's expiry (every test here floods the cache while a pin lasts).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dlvsym */
#endif
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SHARD 4096u

static struct sfs_cache *cache_pins(uint32_t nslots, int pct)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
        .pin_budget_pct = pct,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "create: %s", strerror(-err));
    return c;
}

static void load(struct sfs_cache *c, uint64_t b, uint32_t s)
{
    cr_assert_eq(tu_load(c, &(struct sfs_key){tu_block(b), s}), SFS_OWNER);
}

static int state(struct sfs_cache *c, uint64_t b, uint32_t s)
{
    return sfs_cache_state(c, &(struct sfs_key){tu_block(b), s});
}

/* Load (and hit once) `n` distinct keys of blocks from `first`: a flood
 * several times the cache. */
static void flood(struct sfs_cache *c, uint64_t first, int n)
{
    for (int i = 0; i < n; i++) {
        struct sfs_key k = tu_key(first + (uint64_t)i, 0);
        struct sfs_lease l;
        int role = sfs_cache_get(c, &k, 0, 0, &l);

        cr_assert_eq(role, SFS_OWNER, "flood key %d: %d", i, role);
        cr_assert_eq(tu_publish(c, &k, &l), 0);
        cr_assert_eq(sfs_cache_release(c, &l), 0);
    }
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

Test(pins, pinned_block_survives_a_flood, .timeout = 30)
{
    struct sfs_cache *c = cache_pins(16, 0); /* budget 25 %: 4 slots */
    struct sfs_block_id x = tu_block(7);

    for (uint32_t s = 0; s < 3; s++)
        load(c, 7, s);
    cr_assert_eq(sfs_cache_pin(c, &x, 1, 600), 3);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 3ull * SHARD);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){x, 1}), 1);
    flood(c, 1000, 200);
    for (uint32_t s = 0; s < 3; s++) {
        cr_assert_eq(state(c, 7, s), SFS_STATE_READY, "pinned shard %u evicted", s);
        cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){x, s}), 1);
    }
    /* A shard of the pinned block loaded now is pinned too (budget: 4). */
    load(c, 7, 3);
    flood(c, 2000, 200);
    cr_assert_eq(state(c, 7, 3), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 4ull * SHARD);
    /* Unpin: ordinary slots again, evicted by the next flood. */
    cr_assert_eq(sfs_cache_pin(c, &x, 1, 0), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 0);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){x, 0}), 0);
    flood(c, 3000, 200);
    for (uint32_t s = 0; s < 4; s++)
        cr_assert_eq(state(c, 7, s), -ENOENT);
    sfs_cache_close(c);
}

Test(pins, expiry_frees_with_no_timer, .timeout = 30)
{
    struct sfs_cache *c = cache_pins(16, 0);
    struct sfs_block_id x = tu_block(7);

    load(c, 7, 0);
    load(c, 7, 1);
    cr_assert_eq(sfs_cache_pin(c, &x, 1, 1), 2);
    flood(c, 1000, 100);
    cr_assert_eq(state(c, 7, 0), SFS_STATE_READY);
    sleep_ms(1500); /* past the expiry: nothing runs at it */
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){x, 0}), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 0);
    flood(c, 2000, 100);
    cr_assert_eq(state(c, 7, 0), -ENOENT);
    cr_assert_eq(state(c, 7, 1), -ENOENT);
    sfs_cache_close(c);
}

Test(pins, over_budget_refused_whole, .timeout = 30)
{
    struct sfs_cache *c = cache_pins(16, 25); /* 4 slots */
    struct sfs_block_id a = tu_block(1), b[2] = {tu_block(2), tu_block(3)};

    for (uint32_t s = 0; s < 3; s++)
        load(c, 1, s);
    load(c, 2, 0);
    load(c, 3, 0);
    cr_assert_eq(sfs_cache_pin(c, &a, 1, 600), 3);
    /* 3 + 2 > 4: refused, nothing of the batch pinned, a's pin intact. */
    cr_assert_eq(sfs_cache_pin(c, b, 2, 600), -EDQUOT);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){b[0], 0}), 0);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){b[1], 0}), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 3ull * SHARD);
    flood(c, 1000, 100);
    for (uint32_t s = 0; s < 3; s++)
        cr_assert_eq(state(c, 1, s), SFS_STATE_READY);
    /* One more fits exactly. */
    load(c, 2, 0);
    cr_assert_eq(sfs_cache_pin(c, b, 1, 600), 1);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 4ull * SHARD);
    /* A shard of a pinned block loaded with the budget spent stays
     * unpinned (and evictable); the pins hold. */
    load(c, 2, 1);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){b[0], 1}), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 4ull * SHARD);
    sfs_cache_close(c);
}

/* A pin counts only the shards it holds: a Prealloc'd slot (Idle, of a
 * shard the store may not have: the rank preallocates shard + 1 of each
 * load) and a failed load are no pin's, neither charged to the budget nor
 * kept from the evictor; a Prealloc'd shard loaded while the pin lasts is
 * pinned by its load. (Before, the pin charged and kept every slot of the
 * block in any state: 3 pinned here, and the Idle slots outlived floods.) */
Test(pins, pins_count_only_shards_they_hold, .timeout = 30)
{
    struct sfs_cache *c = cache_pins(16, 25); /* 4 slots */
    struct sfs_block_id x = tu_block(7);
    struct sfs_lease l;

    load(c, 7, 0);
    cr_assert_eq(sfs_cache_prealloc(c, &(struct sfs_key){x, 1}), 1);
    cr_assert_eq(sfs_cache_prealloc(c, &(struct sfs_key){x, 2}), 1);
    cr_assert_eq(sfs_cache_pin(c, &x, 1, 600), 1, "the pin counted Prealloc'd slots");
    cr_assert_eq(sfs_cache_pinned_bytes(c), 1ull * SHARD);
    /* Prealloc while the pin lasts: still nothing held. */
    cr_assert_eq(sfs_cache_prealloc(c, &(struct sfs_key){x, 3}), 1);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 1ull * SHARD);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){x, 3}), 0);
    /* A load of a missing shard: pinned while it loads, not once it failed. */
    cr_assert_eq(sfs_cache_get(c, &(struct sfs_key){x, 4}, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 2ull * SHARD);
    cr_assert_eq(sfs_cache_fail(c, &l, -ENOENT), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 1ull * SHARD);
    /* A Prealloc'd shard that is loaded now is the pin's. */
    cr_assert_eq(tu_load(c, &(struct sfs_key){x, 2}), SFS_OWNER);
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){x, 2}), 1);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 2ull * SHARD);
    /* A flood takes the slots that hold nothing, never the held ones. */
    flood(c, 1000, 200);
    cr_assert_eq(state(c, 7, 0), SFS_STATE_READY);
    cr_assert_eq(state(c, 7, 2), SFS_STATE_READY);
    for (uint32_t s = 1; s < 5; s++)
        if (s != 2)
            cr_assert_eq(state(c, 7, s), -ENOENT, "shard %u, holding nothing, outlived a flood",
                         s);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 2ull * SHARD);
    sfs_cache_close(c);
}

Test(pins, pins_off_and_bad_arguments, .timeout = 30)
{
    struct sfs_cache *c = cache_pins(16, -1);
    struct sfs_block_id x = tu_block(1);

    cr_assert_eq(sfs_cache_pin(c, &x, 1, 10), -EPERM);
    cr_assert_eq(sfs_cache_pin(c, &x, 1, 0), 0);
    sfs_cache_close(c);
    c = cache_pins(16, 0);
    cr_assert_eq(sfs_cache_pin(c, &x, 1, SFS_PIN_MAX_SECONDS + 1), -EINVAL);
    cr_assert_eq(sfs_cache_pin(c, NULL, 1, 10), -EINVAL);
    cr_assert_eq(sfs_cache_pin(NULL, &x, 1, 10), -EINVAL);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Through the rank API, and a process killed while holding pins.
 */

struct pin_job {
    const char *sock;
    uint64_t block;
    uint32_t seconds;
};

static struct sfs_rank *open_rank(const char *sock)
{
    struct sfs_rank_config cfg;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = sock;
    cfg.device_id = 0;
    cfg.copier = SFS_COPIER_HOST;
    return sfs_rank_open(&cfg, &err);
}

/* A child: pin through the rank API, then die by SIGKILL holding it. */
static int pin_and_die(void *arg)
{
    struct pin_job *j = arg;
    struct sfs_rank *rk = open_rank(j->sock);
    struct sfs_block_id x = tu_block(j->block);

    if (!rk)
        return 10;
    if (sfs_rank_pin(rk, &x, 1, j->seconds) != 2)
        return 11;
    raise(SIGKILL);
    return 12;
}

Test(pins, rank_api_pin_and_a_killed_pinner, .timeout = 60)
{
    struct sfs_cache *c = cache_pins(16, 0);
    const char *sock = tu_path("sock");
    struct pin_job j = {.sock = sock, .block = 7, .seconds = 2};

    cr_assert_eq(sfs_cache_serve(c, sock), 0);
    load(c, 7, 0);
    load(c, 7, 1);
    pid_t pid = tu_fork(pin_and_die, &j);
    cr_assert_eq(tu_wait(pid), 128 + SIGKILL, "the pinner did not pin and die");
    /* The pin outlives its maker, until its TTL. */
    int64_t t0 = sfs_now_ns();
    cr_assert_eq(sfs_cache_pinned(c, &(struct sfs_key){tu_block(7), 0}), 1);
    flood(c, 1000, 100);
    if (sfs_now_ns() - t0 < 1500000000ll)
        cr_assert_eq(state(c, 7, 0), SFS_STATE_READY);
    /* And not beyond it. */
    sleep_ms(2500);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 0);
    flood(c, 2000, 100);
    cr_assert_eq(state(c, 7, 0), -ENOENT, "a dead pinner's pin outlived its TTL");
    cr_assert_eq(state(c, 7, 1), -ENOENT);

    /* The rank API's pin, unpin and refusal, from this process. */
    struct sfs_rank *rk = open_rank(sock);
    cr_assert_not_null(rk);
    struct sfs_block_id bs[2] = {tu_block(20), tu_block(21)};
    for (uint32_t s = 0; s < 3; s++) {
        load(c, 20, s);
        load(c, 21, s);
    }
    cr_assert_eq(sfs_rank_pin(rk, bs, 2, 600), -EDQUOT); /* 6 > 4 */
    cr_assert_eq(sfs_rank_pin(rk, bs, 1, 600), 3);
    flood(c, 3000, 100);
    cr_assert_eq(state(c, 20, 2), SFS_STATE_READY);
    cr_assert_eq(sfs_rank_pin(rk, bs, 1, 0), 0);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 0);
    cr_assert_eq(sfs_rank_pin(NULL, bs, 1, 1), -EINVAL);
    sfs_rank_close(rk);
    sfs_cache_close(c);
}

Test(pins, rank_pin_is_in_the_current_symbol_version, .timeout = 30)
{
    /* ABI: a new symbol goes in the map's current node (SHARDFS_RANK_0.2). */
    void *f = dlvsym(RTLD_DEFAULT, "sfs_rank_pin", "SHARDFS_RANK_0.2");

    cr_assert_not_null(f, "no sfs_rank_pin@SHARDFS_RANK_0.2: %s", dlerror());
    cr_assert_eq(f, (void *)sfs_rank_pin);
}

/* Two threads flood the cache while this one pins, checks and unpins
 * another block, over and over: the long pin never loses a shard, the
 * short ones' charges all come back. */
struct flooder {
    struct sfs_cache *c;
    uint64_t first;
    int n;
    int err;
};

static void *flood_thread(void *arg)
{
    struct flooder *f = arg;

    for (int i = 0; i < f->n && !f->err; i++) {
        struct sfs_key k = tu_key(f->first + (uint64_t)i, (uint32_t)i & 3);
        struct sfs_lease l;
        int role = sfs_cache_get(f->c, &k, 0, sfs_deadline_after(5000000000ll), &l);

        if (role < 0) {
            f->err = role;
            break;
        }
        if (role == SFS_OWNER)
            tu_publish(f->c, &k, &l);
        else if (role == SFS_WAITER)
            sfs_cache_wait(f->c, &l, sfs_deadline_after(5000000000ll));
        sfs_cache_release(f->c, &l);
    }
    return NULL;
}

Test(pins, concurrent_floods_never_evict_a_live_pin, .timeout = 120)
{
    struct sfs_cache *c = cache_pins(64, 25); /* 16 slots of pins */
    struct sfs_block_id x = tu_block(7), y = tu_block(8);
    struct flooder f[2] = {{c, 100000, 20000, 0}, {c, 200000, 20000, 0}};
    pthread_t t[2];

    for (uint32_t s = 0; s < 4; s++)
        load(c, 7, s);
    cr_assert_eq(sfs_cache_pin(c, &x, 1, 600), 4);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, flood_thread, &f[i]), 0);
    for (int round = 0; round < 300; round++) {
        for (uint32_t s = 0; s < 2; s++)
            tu_load(c, &(struct sfs_key){y, s});
        int r = sfs_cache_pin(c, &y, 1, 600);
        cr_assert(r >= 0 && r <= 2, "pin y: %d", r);
        for (uint32_t s = 0; s < 4; s++)
            cr_assert_eq(state(c, 7, s), SFS_STATE_READY, "round %d: pinned shard %u gone", round,
                         s);
        cr_assert_eq(sfs_cache_pin(c, &y, 1, 0), 0);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(f[i].err, 0, "flooder %d: %s", i, strerror(-f[i].err));
    }
    for (uint32_t s = 0; s < 4; s++)
        cr_assert_eq(state(c, 7, s), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_pinned_bytes(c), 4ull * SHARD);
    sfs_cache_close(c);
}
