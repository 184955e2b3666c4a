/* SPDX-License-Identifier: MIT */
/*
 * test_scenarios.c - design.md's scenarios B, C, D and E, reproduced exactly,
 * slot numbers included.
 *
 * The slot a key landed in is observed through lease.slot from
 * sfs_cache_get(). Scenario B runs across real processes: the parent creates
 * and serves the cache, a forked child attaches through the socket, becomes a
 * waiter and sleeps on the shared futex until the parent publishes.
 */
#include "testutil.h"
#include "cache_i.h" /* refcount of a prewarmed slot: Scenario E */

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define SHARD 4096u

/* Load key as owner (it must miss), publish, release. Returns its slot. */
static uint32_t load_slot(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;
    int role = sfs_cache_get(c, k, 0, 0, &l);

    cr_assert_eq(role, SFS_OWNER, "load of shard %u: role %d, want owner", k->shard, role);
    cr_assert_eq(tu_publish(c, k, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    return l.slot;
}

/* A hit on key: returns its slot; checks the bytes. */
static uint32_t hit_slot(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;
    int role = sfs_cache_get(c, k, 0, 0, &l);

    cr_assert_eq(role, SFS_HIT, "hit of shard %u: role %d", k->shard, role);
    cr_assert_eq(tu_check(k, sfs_cache_data(c, &l), SHARD), -1, "wrong bytes in slot %u", l.slot);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    return l.slot;
}

/* Ready, and its bytes are right: a lease-free check through a NOALLOC Get. */
static void assert_ready(struct sfs_cache *c, const struct sfs_key *k, uint32_t slot,
                         const char *name)
{
    struct sfs_lease l;

    cr_assert_eq(sfs_cache_state(c, k), SFS_STATE_READY, "%s: state %d, want Ready", name,
                 sfs_cache_state(c, k));
    cr_assert(sfs_cache_exists(c, k), "%s should exist", name);
    cr_assert_eq(sfs_cache_get(c, k, SFS_GET_NOALLOC, 0, &l), SFS_HIT);
    cr_assert_eq(l.slot, slot, "%s in slot %u, want %u", name, l.slot, slot);
    cr_assert_eq(tu_check(k, sfs_cache_data(c, &l), SHARD), -1, "%s: wrong bytes", name);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

static void assert_absent(struct sfs_cache *c, const struct sfs_key *k, const char *name)
{
    cr_assert_eq(sfs_cache_state(c, k), -ENOENT, "%s should be evicted (state %d)", name,
                 sfs_cache_state(c, k));
    cr_assert_not(sfs_cache_exists(c, k));
}

/* ---------------------------------------------------------------------------
 * Scenario C - CLOCK preserves a hit block.
 */
Test(scenario, C_clock_keeps_hit_block, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_key A = tu_key(0xA, 0), B = tu_key(0xB, 0), C = tu_key(0xC, 0), D = tu_key(0xD, 0),
                   E = tu_key(0xE, 0), F = tu_key(0xF, 0);
    struct sfs_stats st;

    cr_assert_not_null(c);
    /* Loaded A/B/C/D in turn: slots 0..3, every accessed bit 1, hand at 0. */
    cr_assert_eq(load_slot(c, &A), 0);
    cr_assert_eq(load_slot(c, &B), 1);
    cr_assert_eq(load_slot(c, &C), 2);
    cr_assert_eq(load_slot(c, &D), 3);
    /* Miss E: one lap clears all four bits, then the raw hand: slot 0. */
    cr_assert_eq(load_slot(c, &E), 0, "E must replace A in slot 0");
    assert_absent(c, &A, "A");
    /* Get B (slot 1): the hit sets its bit again. */
    cr_assert_eq(hit_slot(c, &B), 1);
    /* Miss F: hand at 1, B's bit is cleared and B skipped; C (bit 0) goes. */
    cr_assert_eq(load_slot(c, &F), 2, "F must replace C in slot 2");

    assert_ready(c, &E, 0, "E");
    assert_ready(c, &B, 1, "B");
    assert_ready(c, &F, 2, "F");
    assert_ready(c, &D, 3, "D");
    assert_absent(c, &C, "C");
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.evictions, 2);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Scenario D - Touch preserves all shards of a block.
 *
 * "One miss sweeps all the new-load bits clear" with T still in slots 0/1/2:
 * every slot is leased while that miss runs, so the hand clears every bit in
 * its first lap, finds nothing unleased in its second, and gives up with
 * -ENOSPC after exactly two laps, back at slot 0.
 */
static void scenario_d(bool touch)
{
    struct sfs_cache *c = tu_cache(6, 0, SHARD);
    struct sfs_key T[3], U = tu_key(0x55, 0), V = tu_key(0x56, 0), W = tu_key(0x57, 0);
    struct sfs_key X = tu_key(0x58, 0), sweep = tu_key(0x59, 0);
    struct sfs_key *all[6] = {&T[0], &T[1], &T[2], &U, &V, &W};
    struct sfs_lease held[6], l;
    struct sfs_block_id tb = tu_block(0x7);

    cr_assert_not_null(c);
    for (uint32_t i = 0; i < 3; i++)
        T[i] = tu_key(0x7, i);
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(load_slot(c, all[i]), i);
    /* Hold a lease on every slot, then miss: two laps, -ENOSPC, no wait. */
    for (uint32_t i = 0; i < 6; i++) {
        cr_assert_eq(sfs_cache_get(c, all[i], 0, 0, &held[i]), SFS_HIT);
        cr_assert_eq(held[i].slot, i);
    }
    cr_assert_eq(sfs_cache_get(c, &sweep, 0, 0, &l), -ENOSPC);
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(sfs_cache_release(c, &held[i]), 0);
    /* Every bit is clear now and the hand is back at slot 0. */
    for (uint32_t i = 0; i < 6; i++)
        cr_assert_eq(atomic_load(&c->slots[i].accessed), 0, "slot %u bit not swept", i);
    cr_assert_eq(atomic_load(&c->hdr->hand) % 6, 0);

    if (touch) {
        struct sfs_stats st;

        cr_assert_eq(sfs_cache_touch(c, &tb, 1), 3, "Touch(T) must mark its 3 shards");
        sfs_cache_stats(c, &st);
        cr_assert_eq(st.touched, 3);
        /* Miss X: T.s0..s2 get their second chance; U in slot 3 goes. */
        cr_assert_eq(load_slot(c, &X), 3, "X must replace U in slot 3");
        for (uint32_t i = 0; i < 3; i++)
            assert_ready(c, &T[i], i, "T.s");
        assert_absent(c, &U, "U");
    } else {
        /* Control: without the Touch, T.s0 at the hand is the victim. */
        cr_assert_eq(load_slot(c, &X), 0, "without Touch X replaces T.s0 in slot 0");
        assert_absent(c, &T[0], "T.s0");
        assert_ready(c, &T[1], 1, "T.s1");
        assert_ready(c, &T[2], 2, "T.s2");
        assert_ready(c, &U, 3, "U");
    }
    assert_ready(c, &V, 4, "V");
    assert_ready(c, &W, 5, "W");
    assert_ready(c, &X, touch ? 3 : 0, "X");
    sfs_cache_close(c);
}

Test(scenario, D_touch_keeps_whole_block, .timeout = 30)
{
    scenario_d(true);
}

Test(scenario, D_control_without_touch, .timeout = 30)
{
    scenario_d(false);
}

/* ---------------------------------------------------------------------------
 * Scenario E - prewarming the next slot.
 */
struct e_child {
    struct sfs_key key;
    uint32_t want_slot;
};

/* Attached, Get a key another process already owns: must be a waiter. */
static int e_waiter(struct sfs_cache *c, void *arg)
{
    struct e_child *a = arg;
    struct sfs_lease l;
    int role = sfs_cache_get(c, &a->key, 0, 0, &l);

    if (role != SFS_WAITER)
        return 20 + (role < 0 ? 0 : role);
    if (l.slot != a->want_slot)
        return 30;
    sfs_cache_release(c, &l);
    return 0;
}

Test(scenario, E_prealloc_reserved_takeover, .timeout = 30)
{
    /* 5 regular slots (0..4), 3 reserved (5..7). */
    struct sfs_cache *c = tu_cache(8, 3, SHARD);
    const uint32_t s = 4;
    struct sfs_key cur[3], next[3], R0 = tu_key(0x100, 0), R1 = tu_key(0x101, 0);
    struct sfs_key B3 = tu_key(0xB3, s), B3n = tu_key(0xB3, s + 1);
    uint32_t pslot[3];
    struct sfs_lease own0, own1;
    struct sfs_stats st;
    const char *path = tu_path("scenE");

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    for (uint32_t i = 0; i < 3; i++) {
        cur[i] = tu_key(0xB0 + i, s);
        next[i] = tu_key(0xB0 + i, s + 1);
        cr_assert_eq(load_slot(c, &cur[i]), i);
    }
    /* Fill the regular pool: no never-used regular slot is left. */
    cr_assert_eq(load_slot(c, &R0), 3);
    cr_assert_eq(load_slot(c, &R1), 4);

    /* Idle window: prewarm (Bi, s+1) from the reserved pool. */
    for (uint32_t i = 0; i < 3; i++) {
        cr_assert_eq(sfs_cache_prealloc(c, &next[i]), 1, "prealloc B%u.s+1", i);
        cr_assert_eq(sfs_cache_state(c, &next[i]), SFS_STATE_IDLE);
    }
    /* Already there: nothing placed. */
    cr_assert_eq(sfs_cache_prealloc(c, &next[0]), 0);
    for (uint32_t i = 0; i < 3; i++) {
        uint32_t found = SFS_NIL;

        for (uint32_t k = 0; k < 8; k++)
            if (atomic_load(&c->slots[k].state) == SFS_STATE_IDLE &&
                memcmp(c->slots[k].block, next[i].block.b, 16) == 0 && c->slots[k].shard == s + 1)
                found = k;
        cr_assert(found >= 5 && found < 8, "B%u.s+1 in slot %u: not the reserved pool", i, found);
        cr_assert_eq(tu_leases_on(c, found), 0, "prewarmed slot is leased");
        pslot[i] = found;
    }
    cr_assert_neq(pslot[0], pslot[1]);
    cr_assert_neq(pslot[1], pslot[2]);
    cr_assert_neq(pslot[0], pslot[2]);
    /* Prealloc never evicts from the regular pool. */
    assert_ready(c, &cur[0], 0, "B0.s");
    assert_ready(c, &cur[1], 1, "B1.s");
    assert_ready(c, &cur[2], 2, "B2.s");
    assert_ready(c, &R0, 3, "R0");
    assert_ready(c, &R1, 4, "R1");

    /* Next task: (B0, s+1) is found on its chain, Idle, ref 0: owner on the
     * prewarmed slot, no eviction. */
    sfs_cache_stats(c, &st);
    uint64_t ev0 = st.evictions, tk0 = st.takeovers;
    cr_assert_eq(st.prealloc, 3);
    cr_assert_eq(sfs_cache_get(c, &next[0], 0, 0, &own0), SFS_OWNER);
    cr_assert_eq(own0.slot, pslot[0], "takeover on another slot than the prewarmed one");
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.takeovers, tk0 + 1);
    cr_assert_eq(st.evictions, ev0, "the fast path must not evict");

    /* (B1, s+1) taken over by us; another process then sees ref > 0: waiter. */
    cr_assert_eq(sfs_cache_get(c, &next[1], 0, 0, &own1), SFS_OWNER);
    cr_assert_eq(own1.slot, pslot[1]);
    struct e_child a = {.key = next[1], .want_slot = pslot[1]};
    pid_t pid = tu_fork_attached(path, 1, e_waiter, &a);
    cr_assert_eq(tu_wait(pid), 0, "the second process must be a waiter on slot %u", pslot[1]);

    cr_assert_eq(tu_publish(c, &next[0], &own0), 0);
    cr_assert_eq(sfs_cache_release(c, &own0), 0);
    cr_assert_eq(tu_publish(c, &next[1], &own1), 0);
    cr_assert_eq(sfs_cache_release(c, &own1), 0);
    assert_ready(c, &next[0], pslot[0], "B0.s+1");
    assert_ready(c, &next[1], pslot[1], "B1.s+1");
    cr_assert_eq(sfs_cache_state(c, &next[2]), SFS_STATE_IDLE);

    /* B3 was not in the task: nothing happened to it. */
    cr_assert_eq(sfs_cache_state(c, &B3), -ENOENT);
    cr_assert_eq(sfs_cache_state(c, &B3n), -ENOENT);
    /* And the regular pool is still whole. */
    for (uint32_t i = 0; i < 3; i++)
        assert_ready(c, &cur[i], i, "Bi.s");
    assert_ready(c, &R0, 3, "R0");
    assert_ready(c, &R1, 4, "R1");
    sfs_cache_close(c);
}

/* With no never-used regular slot and a reserved pool that is all leased,
 * prealloc places nothing (0) rather than evict a regular slot. */
Test(scenario, E_prealloc_never_evicts_regular, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(4, 1, SHARD); /* regular 0..2, reserved 3 */
    struct sfs_key k[3], n0 = tu_key(0xE0, 1), n1 = tu_key(0xE1, 1);
    struct sfs_lease l;

    cr_assert_not_null(c);
    for (uint32_t i = 0; i < 3; i++) {
        k[i] = tu_key(0xE0 + i, 0);
        cr_assert_eq(load_slot(c, &k[i]), i);
    }
    cr_assert_eq(sfs_cache_prealloc(c, &n0), 1);
    cr_assert_eq(sfs_cache_get(c, &n0, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(l.slot, 3);
    /* The only reserved slot is leased; every regular one is evictable. */
    cr_assert_eq(sfs_cache_prealloc(c, &n1), 0);
    cr_assert_eq(sfs_cache_state(c, &n1), -ENOENT);
    for (uint32_t i = 0; i < 3; i++)
        assert_ready(c, &k[i], i, "regular");
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Scenario B - owner/waiter across processes, futex block and wake.
 */
struct b_report {
    int attach_err;
    int role;
    int wait_ret;
    long check;
    int64_t wait_start_ns;
    int64_t wake_ns;
    int64_t cpu_ns;
};

struct b_child {
    const char *path;
    struct sfs_key key;
    int ready_fd;  /* child -> parent: "I am a waiter, about to block" */
    int report_fd; /* child -> parent: struct b_report */
};

static int64_t rusage_ns(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000ll +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000ll;
}

static int b_waiter(void *arg)
{
    struct b_child *a = arg;
    struct b_report rep = {0};
    struct sfs_lease l;
    char one = 1;
    struct sfs_cache *c = sfs_cache_attach(a->path, 2, &rep.attach_err);

    if (c) {
        rep.role = sfs_cache_get(c, &a->key, 0, 0, &l);
        if (write(a->ready_fd, &one, 1) != 1)
            return 3;
        if (rep.role == SFS_WAITER) {
            int64_t cpu0 = rusage_ns();

            rep.wait_start_ns = sfs_now_ns();
            rep.wait_ret = sfs_cache_wait(c, &l, sfs_deadline_after(5000000000ll));
            rep.wake_ns = sfs_now_ns();
            rep.cpu_ns = rusage_ns() - cpu0;
            if (rep.wait_ret == SFS_WAIT_READY)
                rep.check = tu_check(&a->key, sfs_cache_data(c, &l), SHARD);
            sfs_cache_release(c, &l);
        }
        sfs_cache_close(c);
    } else if (write(a->ready_fd, &one, 1) != 1) {
        return 3;
    }
    if (write(a->report_fd, &rep, sizeof(rep)) != sizeof(rep))
        return 4;
    return 0;
}

Test(scenario, B_futex_waiter_wakes_fast, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    const char *path = tu_path("scenB");
    struct sfs_key X = tu_key(0x42, 0);
    struct sfs_lease own;
    int ready[2], report[2];
    struct b_report rep;
    char one;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(report), 0);
    /* Rank 0 wins X as owner. */
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);

    struct b_child a = {.path = path, .key = X, .ready_fd = ready[1], .report_fd = report[1]};
    pid_t pid = tu_fork(b_waiter, &a);
    close(ready[1]); /* a child that dies early is an EOF, not a hang */
    close(report[1]);
    cr_assert_eq(read(ready[0], &one, 1), 1);
    /* The waiter is registered and about to block (or blocked): fill for
     * ~50 ms, then publish. */
    struct timespec ts = {.tv_nsec = 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    tu_fill(&X, sfs_cache_data(c, &own), SHARD);
    int64_t pub_ns = sfs_now_ns();
    cr_assert_eq(sfs_cache_publish(c, &own, SHARD, 0), 0);

    cr_assert_eq(read(report[0], &rep, sizeof(rep)), (ssize_t)sizeof(rep));
    cr_assert_eq(tu_wait(pid), 0);
    cr_assert_eq(rep.attach_err, 0, "attach: %s", strerror(-rep.attach_err));
    cr_assert_eq(rep.role, SFS_WAITER, "rank 2 must be a waiter, got %d", rep.role);
    cr_assert_eq(rep.wait_ret, SFS_WAIT_READY, "wait returned %d", rep.wait_ret);
    cr_assert_eq(rep.check, -1, "waiter read wrong bytes at %ld", rep.check);

    int64_t latency = rep.wake_ns - pub_ns;
    int64_t waited = rep.wake_ns - rep.wait_start_ns;
    cr_log_info("scenario B: waited %.3f ms, wake latency %.1f us, CPU during wait %.1f us",
                waited / 1e6, latency / 1e3, rep.cpu_ns / 1e3);
    /* It blocked until the publish (not before), woke at once (not at a poll
     * tick, nor at the 100 ms owner-check slice), and burnt no CPU. */
    cr_assert_geq(rep.wake_ns, pub_ns, "woke before the publish");
    cr_assert_lt(latency, 20 * 1000 * 1000ll, "wake latency %lld ns", (long long)latency);
    cr_assert_lt(waited, 1000 * 1000 * 1000ll, "wait took %lld ns", (long long)waited);
    cr_assert_lt(rep.cpu_ns, 5 * 1000 * 1000ll, "waiter used %lld ns CPU", (long long)rep.cpu_ns);

    struct sfs_stats st;
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.owner_loads, 1);
    cr_assert_eq(st.waits, 1);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}
