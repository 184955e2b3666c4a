/* SPDX-License-Identifier: MIT */
/*
 * test_crash.c - invariant 7: a rank killed at any instant never wedges the
 * cache.
 *
 * Every test kills a real attached process with SIGKILL: mid-fill, while it
 * holds a bucket lock (robust mutex: EOWNERDEAD and repair), while it holds
 * leases (the reaper), and at random instants of a busy loop. After each
 * death the survivors must get every key within a second, with the right
 * bytes, and no lease of the dead process may outlive its reaping.
 *
 * A killed child is left a zombie (not waited for) wherever the test allows:
 * a rank's parent is often busy, and a zombie is as dead as a reaped process.
 */
#include "cache_i.h"
#include "testpoint_i.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARD 4096u
#define MS    (1000 * 1000ll)
#define SEC   (1000 * MS)

struct shm {
    char path[128];
    _Atomic uint32_t step; /* child -> parent: how far the child got */
    _Atomic uint32_t go;   /* parent -> child */
    _Atomic int32_t rc;    /* a child's result code */
    _Atomic int32_t proc_index;
    _Atomic int64_t t_kill, t_ret;
    uint32_t slot; /* parameters for a child */
    uint32_t bucket;
    uint32_t slot2, slot3;
    struct sfs_key key;
    struct sfs_key keys[16];
    uint32_t nkeys;
};

static struct shm *sh;

static struct shm *shm_new(const char *tag)
{
    struct shm *p =
        mmap(NULL, sizeof(*p), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    cr_assert(p != MAP_FAILED);
    memset(p, 0, sizeof(*p));
    snprintf(p->path, sizeof(p->path), "%s", tu_path(tag));
    return p;
}

static bool wait_step(uint32_t at_least, int64_t timeout_ns)
{
    int64_t end = sfs_now_ns() + timeout_ns;

    while (atomic_load(&sh->step) < at_least) {
        if (sfs_now_ns() > end)
            return false;
        usleep(200);
    }
    return true;
}

static void park(void)
{
    for (;;)
        pause();
}

static uint32_t bucket_of_key(const struct sfs_cache *c, const struct sfs_key *k)
{
    /* As cache.c computes it. */
    return (uint32_t)(sfs_key_hash(&k->block) + k->shard) & c->bucket_mask;
}

/* The slot key k is on, or SFS_NIL (racy read: call when quiet). */
static uint32_t slot_of(const struct sfs_cache *c, const struct sfs_key *k)
{
    for (uint32_t s = 0; s < c->nslots; s++) {
        const struct sfs_slot_rec *sl = &c->slots[s];

        if (atomic_load(&sl->bucket) != SFS_NIL && atomic_load(&sl->state) != SFS_STATE_FREE &&
            sl->shard == k->shard && memcmp(sl->block, k->block.b, SFS_BLOCK_ID_LEN) == 0)
            return s;
    }
    return SFS_NIL;
}

/* Wait until the child is dead, but leave it a zombie (WNOWAIT). */
static void wait_dead_unreaped(pid_t child)
{
    siginfo_t si;

    cr_assert_eq(waitid(P_PID, (id_t)child, &si, WEXITED | WNOWAIT), 0);
}

static void fill_publish(struct sfs_cache *c, const struct sfs_key *k, struct sfs_lease *l)
{
    cr_assert_eq(tu_publish(c, k, l), 0);
}

/* Get k, expect a hit with the right bytes, release. */
static void assert_hit(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;
    int role = sfs_cache_get(c, k, 0, sfs_deadline_after(SEC), &l);

    cr_assert_eq(role, SFS_HIT, "role %d", role);
    cr_assert_eq(sfs_cache_length(c, &l), SHARD);
    cr_assert_eq(tu_check(k, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

static struct sfs_cache *served_cache(uint32_t nslots, uint32_t nreserved, const char *tag)
{
    struct sfs_cache *c = tu_cache(nslots, nreserved, SHARD);

    cr_assert(c);
    sh = shm_new(tag);
    cr_assert_eq(sfs_cache_serve(c, sh->path), 0);
    return c;
}

/* What a child of this file runs once attached. */
struct child_body {
    int (*run)(struct sfs_cache *c);
};

static int attached_child(struct sfs_cache *c, void *arg)
{
    struct sfs_cache_info info;

    sfs_cache_info(c, &info);
    atomic_store(&sh->proc_index, info.proc_index);
    return ((const struct child_body *)arg)->run(c);
}

/* Fork a child that attaches to sh->path as device 1 (exit 10 when it cannot),
 * records its process index in sh->proc_index and runs run(c). */
static pid_t fork_attached(int (*run)(struct sfs_cache *c))
{
    struct child_body b = {.run = run};

    return tu_fork_attached(sh->path, 1, attached_child, &b);
}

/* ---------------------------------------------------------------------------
 * Owner killed mid-fill.
 */

/* Gets sh->key as owner, writes half of it, reports, and waits to die. */
static int owner_half_fill(struct sfs_cache *c)
{
    struct sfs_lease l;
    uint8_t buf[SHARD];

    if (sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l) != SFS_OWNER)
        return 11;
    tu_fill(&sh->key, buf, SHARD);
    memcpy(sfs_cache_data(c, &l), buf, SHARD / 2);
    atomic_store(&sh->step, 1);
    park();
    return 0;
}

/* Waits on sh->key; expects to take it over when the owner dies. */
static int waiter_takes_over(struct sfs_cache *c)
{
    struct sfs_lease l;

    if (sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l) != SFS_WAITER)
        return 11;
    atomic_store(&sh->step, 2);
    int w = sfs_cache_wait(c, &l, sfs_deadline_after(5 * SEC));
    atomic_store(&sh->t_ret, sfs_now_ns());
    atomic_store(&sh->rc, w);
    if (w != SFS_WAIT_OWNER)
        return 12;
    if (tu_publish(c, &sh->key, &l) != 0)
        return 13;
    sfs_cache_release(c, &l);
    if (sfs_cache_get(c, &sh->key, 0, 0, &l) != SFS_HIT)
        return 14;
    if (tu_check(&sh->key, sfs_cache_data(c, &l), SHARD) != -1)
        return 15;
    sfs_cache_release(c, &l);
    return 0;
}

Test(crash, owner_killed_mid_fill_waiter_takes_over, .timeout = 30)
{
    struct sfs_cache *c = served_cache(16, 0, "own.sock");

    sh->key = tu_key(42, 3);
    pid_t owner = fork_attached(owner_half_fill);
    cr_assert(wait_step(1, 5 * SEC), "owner never started");
    pid_t waiter = fork_attached(waiter_takes_over);
    cr_assert(wait_step(2, 5 * SEC), "waiter never started");
    usleep(30 * 1000); /* let the waiter fall asleep on the futex */
    cr_assert_eq(sfs_cache_state(c, &sh->key), SFS_STATE_LOADING);

    atomic_store(&sh->t_kill, sfs_now_ns());
    kill(owner, SIGKILL);
    /* The owner stays a zombie until the waiter is done. */
    int st = tu_wait_for(waiter, 10 * SEC);
    int64_t lat = atomic_load(&sh->t_ret) - atomic_load(&sh->t_kill);

    fprintf(stderr, "owner_killed: waiter took over %.1f ms after the kill (wait rc %d)\n",
            lat / 1e6, atomic_load(&sh->rc));
    cr_assert_eq(st, 0, "waiter exit %d, wait returned %d", st, atomic_load(&sh->rc));
    cr_assert_eq(atomic_load(&sh->rc), SFS_WAIT_OWNER);
    cr_assert_lt(lat, SEC, "takeover took %lld ms", (long long)(lat / MS));
    assert_hit(c, &sh->key);
    cr_assert_eq(tu_wait(owner), 128 + SIGKILL);

    struct sfs_stats s;
    tu_wait_reaped(c, 1);
    sfs_cache_stats(c, &s);
    cr_assert_eq(s.reaped, 1);
    cr_assert_geq(s.takeovers, 1);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

Test(crash, owner_killed_mid_fill_next_get_owns, .timeout = 30)
{
    struct sfs_cache *c = served_cache(16, 0, "own2.sock");
    struct sfs_lease l;

    sh->key = tu_key(43, 0);
    pid_t owner = fork_attached(owner_half_fill);
    cr_assert(wait_step(1, 5 * SEC), "owner never started");
    kill(owner, SIGKILL);
    /* Not waited for: the dead owner is a zombie. Give the kernel time to
     * tear it down, then measure from the death. */
    usleep(20 * 1000);
    int64_t t0 = sfs_now_ns();
    int role = sfs_cache_get(c, &sh->key, 0, t0 + SEC, &l);

    cr_assert(role == SFS_OWNER || role == SFS_WAITER, "role %d", role);
    if (role == SFS_WAITER) /* the dead owner's record is not reaped yet */
        role = sfs_cache_wait(c, &l, t0 + SEC) == SFS_WAIT_OWNER ? SFS_OWNER : -1;
    int64_t lat = sfs_now_ns() - t0;
    fprintf(stderr, "owner_killed (no waiter): owner again after %.1f ms\n", lat / 1e6);
    cr_assert_eq(role, SFS_OWNER);
    cr_assert_lt(lat, SEC);
    fill_publish(c, &sh->key, &l);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    assert_hit(c, &sh->key);
    cr_assert_eq(tu_wait(owner), 128 + SIGKILL);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A process dies holding a bucket lock, with half-done work under it.
 */

static int log_repairs;

static void count_repairs(int level, const char *msg, void *arg)
{
    (void)level;
    (void)arg;
    if (strstr(msg, "repaired"))
        log_repairs++;
}

/*
 * Locks bucket sh->bucket directly and leaves it in a state no completed
 * operation leaves: a lease entry on slot sh->slot with no refcount for it
 * (lease_take cut between its two stores), a made-up refcount on the
 * unleased slot sh->slot2, and a wrong bucket hint on slot sh->slot3.
 */
static int die_holding_bucket_lock(struct sfs_cache *c)
{
    if (pthread_mutex_lock(&c->buckets[sh->bucket].lock) != 0)
        return 11;
    atomic_store(&c->self->lease_hwm, 1); /* as sfs_entry_pop() does before use */
    atomic_store(&c->leases[0], sh->slot + 1);
    atomic_store(&c->slots[sh->slot2].refcount, 7);
    atomic_store(&c->slots[sh->slot3].bucket, (sh->bucket + 1) & c->bucket_mask);
    atomic_store(&sh->step, 1);
    park();
    return 0;
}

Test(crash, bucket_lock_holder_killed, .timeout = 30)
{
    struct sfs_cache *c = served_cache(32, 0, "lock.sock");
    struct sfs_key same[4];
    struct sfs_lease la, lc;
    uint32_t n = 0;

    sfs_set_log(count_repairs, NULL, LOG_DEBUG);
    tu_hold_reaper(true); /* the dead entry is counted before it is reaped */
    /* Four keys in one bucket: A (leased by us), B (unleased), C (new), D. */
    same[n++] = tu_key(1, 0);
    uint32_t b = bucket_of_key(c, &same[0]);
    for (uint64_t i = 2; n < 4; i++) {
        struct sfs_key k = tu_key(i, 0);

        if (bucket_of_key(c, &k) == b)
            same[n++] = k;
    }
    cr_assert_eq(tu_load(c, &same[0]), SFS_OWNER);
    cr_assert_eq(tu_load(c, &same[1]), SFS_OWNER);
    cr_assert_eq(tu_load(c, &same[3]), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &same[0], 0, 0, &la), SFS_HIT);
    sh->bucket = b;
    sh->slot = slot_of(c, &same[0]);
    sh->slot2 = slot_of(c, &same[1]);
    sh->slot3 = slot_of(c, &same[3]);
    cr_assert(sh->slot != SFS_NIL && sh->slot2 != SFS_NIL && sh->slot3 != SFS_NIL);

    pid_t child = fork_attached(die_holding_bucket_lock);
    cr_assert(wait_step(1, 5 * SEC));
    kill(child, SIGKILL); /* left a zombie: the robust list is handled at exit */

    int64_t t0 = sfs_now_ns();
    int role = sfs_cache_get(c, &same[2], 0, t0 + SEC, &lc);
    int64_t lat = sfs_now_ns() - t0;
    fprintf(stderr, "bucket_lock: Get in the dead holder's bucket took %.2f ms\n", lat / 1e6);
    cr_assert_eq(role, SFS_OWNER, "get after EOWNERDEAD: %d", role);
    cr_assert_lt(lat, SEC);
    cr_assert_eq(log_repairs, 1, "the EOWNERDEAD repair did not run");

    /* Refcounts recounted from the lease tables: ours and the dead entry. */
    cr_assert_eq(tu_leases_on(c, sh->slot), 2);
    cr_assert_eq(tu_leases_on(c, sh->slot2), 0);
    cr_assert_eq(atomic_load(&c->slots[sh->slot3].bucket), b, "bucket hint not repaired");
    /* The unleased slot is evictable, the leased one is not. */
    cr_assert_eq(sfs_cache_remove(c, &same[1]), 0);
    cr_assert_eq(sfs_cache_remove(c, &same[0]), -EBUSY);
    cr_assert_eq(sfs_cache_state(c, &same[3]), SFS_STATE_READY);
    assert_hit(c, &same[3]);

    /* Reaping drops the dead entry; our lease still pins the slot. The
     * mutex is released early in the kernel's exit path: wait until the
     * child is all the way dead (a zombie, not waited for) before reaping. */
    wait_dead_unreaped(child);
    tu_wait_marked_dead(c, 1);
    cr_assert_eq(sfs_cache_reap(c), 1);
    tu_hold_reaper(false);
    cr_assert_eq(tu_leases_on(c, sh->slot), 1);
    cr_assert_eq(sfs_cache_remove(c, &same[0]), -EBUSY);
    cr_assert_eq(tu_check(&same[0], sfs_cache_data(c, &la), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &la), 0);
    cr_assert_eq(sfs_cache_remove(c, &same[0]), 0);

    fill_publish(c, &same[2], &lc);
    cr_assert_eq(sfs_cache_release(c, &lc), 0);
    assert_hit(c, &same[2]);
    cr_assert_eq(tu_wait(child), 128 + SIGKILL);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_set_log(NULL, NULL, 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A process dies holding leases.
 */

/* Leases sh->keys[0..nkeys) (all Ready), reports, waits to die. */
static int die_holding_leases(struct sfs_cache *c)
{
    struct sfs_lease l;

    for (uint32_t i = 0; i < sh->nkeys; i++) {
        if (sfs_cache_get(c, &sh->keys[i], 0, 0, &l) != SFS_HIT)
            return 11;
        if (tu_check(&sh->keys[i], sfs_cache_data(c, &l), SHARD) != -1)
            return 12;
    }
    atomic_store(&sh->step, 1);
    park();
    return 0;
}

/* Attached (which records its process index) and closes again at once. */
static int attach_and_leave(struct sfs_cache *c)
{
    return 0;
}

Test(crash, lease_holder_killed, .timeout = 30)
{
    struct sfs_cache *c = served_cache(16, 0, "lease.sock");
    struct sfs_lease held[16];
    struct sfs_stats s;

    tu_hold_reaper(true); /* the Get below, not the server, reaps */
    sh->nkeys = 8;
    for (uint32_t i = 0; i < sh->nkeys; i++) {
        sh->keys[i] = tu_key(100 + i, 0);
        cr_assert_eq(tu_load(c, &sh->keys[i]), SFS_OWNER);
    }
    pid_t child = fork_attached(die_holding_leases);
    cr_assert(wait_step(1, 5 * SEC));
    int32_t dead_index = atomic_load(&sh->proc_index);
    kill(child, SIGKILL);
    /* Dead, but left a zombie until the end of this phase. */
    wait_dead_unreaped(child);
    tu_wait_marked_dead(c, 1);

    /* Before reaping: the dead leases pin their slots. */
    for (uint32_t i = 0; i < sh->nkeys; i++) {
        uint32_t sl = slot_of(c, &sh->keys[i]);

        cr_assert_neq(sl, SFS_NIL);
        cr_assert_eq(tu_leases_on(c, sl), 1);
        cr_assert_eq(sfs_cache_remove(c, &sh->keys[i]), -EBUSY);
    }
    /* Fill the other 8 slots and hold them: the cache is all leased. */
    for (uint32_t i = 0; i < 8; i++) {
        struct sfs_key k = tu_key(200 + i, 0);

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &held[i]), SFS_OWNER);
        fill_publish(c, &k, &held[i]);
    }
    sfs_cache_stats(c, &s);
    cr_assert_eq(s.reaped, 0);
    cr_assert_eq(s.evictions, 0, "a leased slot was evicted");
    for (uint32_t i = 0; i < sh->nkeys; i++)
        assert_hit(c, &sh->keys[i]);

    /* A Get that needs space reaps the dead process and evicts. */
    struct sfs_key k9 = tu_key(300, 0);
    struct sfs_lease l9;
    cr_assert_eq(sfs_cache_get(c, &k9, 0, 0, &l9), SFS_OWNER);
    fill_publish(c, &k9, &l9);
    cr_assert_eq(sfs_cache_release(c, &l9), 0);
    sfs_cache_stats(c, &s);
    cr_assert_eq(s.reaped, 1);
    cr_assert_eq(s.evictions, 1);
    for (uint32_t i = 0; i < 8; i++)
        cr_assert_eq(sfs_cache_release(c, &held[i]), 0);
    cr_assert_eq(tu_wait(child), 128 + SIGKILL);
    /* A cache-filling workload proceeds. */
    for (uint32_t i = 0; i < 48; i++) {
        struct sfs_key k = tu_key(400 + i, 1);

        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }

    /* The record is reused; this time the reaper is called directly. */
    sh->step = 0;
    sh->nkeys = 4;
    for (uint32_t i = 0; i < sh->nkeys; i++) {
        sh->keys[i] = tu_key(500 + i, 0);
        cr_assert_eq(tu_load(c, &sh->keys[i]), SFS_OWNER);
    }
    child = fork_attached(die_holding_leases);
    cr_assert(wait_step(1, 5 * SEC));
    cr_assert_eq(atomic_load(&sh->proc_index), dead_index, "dead record not reused");
    kill(child, SIGKILL);
    cr_assert_eq(tu_wait(child), 128 + SIGKILL);
    for (uint32_t i = 0; i < sh->nkeys; i++)
        cr_assert_eq(sfs_cache_remove(c, &sh->keys[i]), -EBUSY);
    tu_wait_marked_dead(c, 1);
    cr_assert_eq(sfs_cache_reap(c), 1);
    cr_assert_eq(sfs_cache_reap(c), 0);
    tu_hold_reaper(false);
    for (uint32_t i = 0; i < sh->nkeys; i++)
        cr_assert_eq(sfs_cache_remove(c, &sh->keys[i]), 0);
    sfs_cache_stats(c, &s);
    cr_assert_eq(s.reaped, 2);
    cr_assert_eq(tu_leases_left(c, NULL), 0);

    atomic_store(&sh->proc_index, -1);
    child = fork_attached(attach_and_leave);
    cr_assert_eq(tu_wait(child), 0);
    cr_assert_eq(atomic_load(&sh->proc_index), dead_index);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Killed at a random instant of a busy Get/fill/publish/release loop.
 */

#define RK_ITERS 60
#define RK_SLOTS 16
#define RK_KEYS  48

static struct sfs_key rk_key(uint64_t i)
{
    return tu_key(7000 + i % (RK_KEYS / 2), (uint32_t)(i / (RK_KEYS / 2)) % 2);
}

/* Fill as owner in 8 pieces (a kill can land between any two). */
static int rk_fill(struct sfs_cache *c, const struct sfs_key *k, struct sfs_lease *l, uint64_t *rng)
{
    uint8_t buf[SHARD], *d = sfs_cache_data(c, l);

    if (tu_rng_next(rng) % 8 == 0)
        return sfs_cache_fail(c, l, -EIO);
    tu_fill(k, buf, SHARD);
    for (int p = 0; p < 8; p++)
        memcpy(d + p * (SHARD / 8), buf + p * (SHARD / 8), SHARD / 8);
    return sfs_cache_publish(c, l, SHARD, 0);
}

static int busy_until_killed(struct sfs_cache *c)
{
    uint64_t rng = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull;
    struct sfs_lease hold[2];
    bool held[2] = {false, false};

    atomic_store(&sh->step, 1);
    for (uint64_t op = 0;; op++) {
        struct sfs_key k = rk_key(tu_rng_next(&rng));
        struct sfs_lease l;
        int role = sfs_cache_get(c, &k, 0, sfs_deadline_after(2 * SEC), &l);

        if (role == SFS_WAITER) {
            int w = sfs_cache_wait(c, &l, sfs_deadline_after(2 * SEC));

            if (w == SFS_WAIT_OWNER)
                role = SFS_OWNER;
            else if (w == SFS_WAIT_READY)
                role = SFS_HIT;
            else if (w != SFS_WAIT_FAILED)
                return 20; /* a hang or an error: the parent sees the exit */
        }
        if (role == SFS_OWNER && rk_fill(c, &k, &l, &rng) < 0)
            return 21;
        if (role == SFS_HIT && tu_check(&k, sfs_cache_data(c, &l), SHARD) != -1)
            return 22;
        if (role < 0)
            return 23;
        /* Keep a couple of leases across iterations, so a kill leaves some. */
        int slot = (int)(op % 2);
        if (held[slot])
            sfs_cache_release(c, &hold[slot]);
        hold[slot] = l;
        held[slot] = true;
        if (op % 64 == 0) {
            struct sfs_key p = rk_key(tu_rng_next(&rng));
            sfs_cache_prealloc(c, &p);
        }
    }
}

/* Every key Gets within a second, with the right bytes. Returns the number
 * of keys that failed that. */
static int verify_all(struct sfs_cache *c, uint64_t *takeovers, int64_t *max_ns)
{
    int bad = 0;

    for (uint64_t i = 0; i < RK_KEYS; i++) {
        struct sfs_key k = rk_key(i);
        struct sfs_lease l;
        int64_t t0 = sfs_now_ns(), dl = t0 + SEC;
        int role = sfs_cache_get(c, &k, 0, dl, &l);

        if (role == SFS_WAITER) {
            int w = sfs_cache_wait(c, &l, dl);

            if (w == SFS_WAIT_OWNER) {
                (*takeovers)++;
                role = SFS_OWNER;
            } else if (w == SFS_WAIT_READY) {
                role = SFS_HIT;
            } else if (w == SFS_WAIT_FAILED) {
                /* An owner alive at our Get published Failed: retry once. */
                sfs_cache_release(c, &l);
                role = sfs_cache_get(c, &k, 0, dl, &l);
            } else {
                fprintf(stderr, "verify: key %llu wait %d\n", (unsigned long long)i, w);
                sfs_cache_release(c, &l);
                bad++;
                continue;
            }
        }
        if (role < 0 || role == SFS_WAITER) {
            fprintf(stderr, "verify: key %llu get %d\n", (unsigned long long)i, role);
            if (role >= 0)
                sfs_cache_release(c, &l);
            bad++;
            continue;
        }
        if (role == SFS_OWNER) {
            tu_fill(&k, sfs_cache_data(c, &l), SHARD);
            if (sfs_cache_publish(c, &l, SHARD, 0) != 0)
                bad++;
        }
        if (sfs_cache_length(c, &l) != SHARD || tu_check(&k, sfs_cache_data(c, &l), SHARD) != -1) {
            fprintf(stderr, "verify: key %llu wrong bytes\n", (unsigned long long)i);
            bad++;
        }
        sfs_cache_release(c, &l);
        int64_t el = sfs_now_ns() - t0;
        if (el > *max_ns)
            *max_ns = el;
        if (el >= SEC)
            bad++;
    }
    return bad;
}

Test(crash, killed_at_random_instants, .timeout = 120)
{
    struct sfs_cache *c = served_cache(RK_SLOTS, 2, "rand.sock");
    uint64_t rng = 0xabcdef12345ull ^ (uint64_t)getpid(), takeovers = 0;
    int64_t max_ns = 0;
    int bad = 0, early = 0;

    sfs_set_log(count_repairs, NULL, LOG_DEBUG);
    log_repairs = 0;
    for (int it = 0; it < RK_ITERS; it++) {
        atomic_store(&sh->step, 0);
        pid_t child = fork_attached(busy_until_killed);
        cr_assert(wait_step(1, 5 * SEC), "child %d never attached", it);
        usleep((useconds_t)(tu_rng_next(&rng) % 20000));
        kill(child, SIGKILL);
        int st = tu_wait(child);
        if (st != 128 + SIGKILL) {
            fprintf(stderr, "iteration %d: child exited with %d before the kill\n", it, st);
            early++;
        }
        bad += verify_all(c, &takeovers, &max_ns);
    }
    tu_wait_reaped(c, RK_ITERS); /* the server reaps each as its connection closes */
    unsigned entries = 0, rc = tu_leases_left(c, &entries);
    struct sfs_stats s;
    sfs_cache_stats(c, &s);
    fprintf(stderr,
            "random kills: %d iterations, %llu takeovers in verification, bucket repairs %d, "
            "reaped %llu, slowest verified Get %.1f ms\n",
            RK_ITERS, (unsigned long long)takeovers, log_repairs, (unsigned long long)s.reaped,
            max_ns / 1e6);
    sfs_set_log(NULL, NULL, 0);
    cr_assert_eq(early, 0, "a child saw a hang, an error or wrong bytes");
    cr_assert_eq(bad, 0, "keys that did not Get within 1 s with the right bytes");
    cr_assert_eq(rc, 0, "slots still leased at the end");
    cr_assert_eq(entries, 0, "lease entries left at the end");
    cr_assert_eq(s.reaped, RK_ITERS);
    for (uint32_t i = 0; i < c->max_procs; i++)
        if (i != c->me)
            cr_assert_eq(atomic_load(&c->procs[i].state), PROC_FREE, "record %u", i);
    sfs_cache_close(c);
}
