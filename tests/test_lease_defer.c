/* SPDX-License-Identifier: MIT */
/*
 * test_lease_defer.c - a release that cannot reach its bucket's lock
 * (a holder stopped inside it) is recorded, not waited for and not lost.
 *
 * Key idea: a thread of this process takes a bucket's lock in a Get and
 * stays there (held at the "get:locked" test point, which also forces the
 * locked paths); a release of a lease on a key of that bucket then gives
 * up after its bounded wait, marks its entry dropped and returns 0. The
 * lease stays counted on the slot until a later release of this process,
 * or its close, drops it under the lock: the slot must then be free of it
 * exactly once (the key removable), and the dropped lease must no longer
 * be a lease its holder may release. The server's reaper meets the same
 * held lock when a dead process's lease sits behind it: it leaves the
 * record DEAD and finishes it on its next periodic pass; an eviction
 * tries the victim's held lock, never waits for it, and so does the
 * hot-set sampler.
 */
#include "cache_i.h"
#include "slot_i.h"
#include "testpoint_i.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <unistd.h>

#define SHARD 4096u

TestSuite(lease_defer, .timeout = 30);

/* The Get holding the bucket lock: the holder's thread stays at the point
 * until let go; the test's own Gets pass it (taking counted leases on the
 * locked path, not lock-free hits, which a release frees without a lock). */
struct holder {
    struct sfs_cache *c;
    struct sfs_key key;
    struct sfs_lease l;
    int r;
    _Atomic int arrived;
    sem_t in_lock, go;
};

static _Thread_local bool am_holder;

static void hold_in_lock(const char *name, void *arg)
{
    struct holder *h = arg;

    (void)name;
    if (am_holder && atomic_fetch_add(&h->arrived, 1) == 0) {
        sem_post(&h->in_lock);
        while (sem_wait(&h->go) < 0)
            ;
    }
}

static void *holder_get(void *arg)
{
    struct holder *h = arg;

    am_holder = true;
    h->r = sfs_cache_get(h->c, &h->key, 0, 0, &h->l);
    return NULL;
}

/* Arm the point: from now on Gets and releases take their locked paths. */
static void arm(struct holder *h, struct sfs_cache *c, const struct sfs_key *key)
{
    *h = (struct holder){.c = c, .key = *key};
    cr_assert_eq(sem_init(&h->in_lock, 0, 0), 0);
    cr_assert_eq(sem_init(&h->go, 0, 0), 0);
    cr_assert_eq(sfs_testpoint_arm("get:locked", SFS_TP_CALL, hold_in_lock, h), 0);
}

/* Start a Get of h's key on another thread and return once it holds the
 * key's bucket lock. */
static pthread_t hold_bucket(struct holder *h)
{
    pthread_t th;

    cr_assert_eq(pthread_create(&th, NULL, holder_get, h), 0);
    while (sem_wait(&h->in_lock) < 0)
        ;
    return th;
}

static void let_go(struct holder *h, pthread_t th)
{
    sem_post(&h->go);
    pthread_join(th, NULL);
    sfs_testpoint_disarm_all();
    sem_destroy(&h->in_lock);
    sem_destroy(&h->go);
}

/* Deferred, then finished by this process's next release. */
Test(lease_defer, release_past_a_held_lock_is_dropped_by_the_next_release)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_key k = tu_key(1, 0);
    struct sfs_lease a, b;
    struct holder h;

    cr_assert(c);
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    arm(&h, c, &k);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &a), SFS_HIT);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &b), SFS_HIT);
    uint32_t s = a.slot;
    cr_assert_eq(tu_leases_on(c, s), 2);

    pthread_t th = hold_bucket(&h);
    /* The locked path (forced by the armed point) finds the lock held. */
    cr_assert_eq(sfs_cache_release(c, &a), 0, "a release past a held lock is recorded");
    cr_assert_eq(atomic_load(&c->deferred), 1u);
    cr_assert(atomic_load(&c->leases[a.entry]) & ENTRY_DROP);
    cr_assert_eq(tu_leases_on(c, s), 2, "still counted until dropped under the lock");
    cr_assert_eq(sfs_cache_release(c, &a), -EINVAL, "a dropped lease is no longer ours");
    cr_assert_eq(atomic_load(&c->deferred), 1u, "the second release changed nothing");
    let_go(&h, th);
    cr_assert_eq(h.r, SFS_HIT);
    cr_assert_eq(tu_leases_on(c, s), 3, "b, the holder's, and the deferred one");

    /* The holder's release finishes ours first. */
    cr_assert_eq(sfs_cache_release(c, &h.l), 0);
    cr_assert_eq(atomic_load(&c->deferred), 0u);
    cr_assert_eq(atomic_load(&c->leases[a.entry]), SFS_ENTRY_FREE);
    cr_assert_eq(tu_leases_on(c, s), 1, "only b is left");
    cr_assert_eq(sfs_cache_remove(c, &k), -EBUSY);
    cr_assert_eq(sfs_cache_release(c, &b), 0);
    cr_assert_eq(tu_leases_on(c, s), 0);
    cr_assert_eq(sfs_cache_remove(c, &k), 0);
    sfs_cache_close(c);
}

/* A deferred release whose lock is still held at the next release stays
 * deferred (tried, never waited for); the one after the holder let go
 * drops it. */
Test(lease_defer, deferred_release_waits_for_a_reachable_lock)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_key k = tu_key(2, 0);
    struct sfs_key other;
    struct sfs_lease a, o1, o2;
    struct holder h;

    cr_assert(c);
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    arm(&h, c, &k);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &a), SFS_HIT);
    uint32_t bk = atomic_load(&c->slots[a.slot].bucket);
    /* A key of another bucket. */
    for (uint64_t n = 3;; n++) {
        cr_assert_lt(n, 64, "no key of another bucket");
        other = tu_key(n, 0);
        cr_assert_eq(tu_load(c, &other), SFS_OWNER);
        cr_assert_eq(sfs_cache_get(c, &other, 0, 0, &o1), SFS_HIT);
        if (atomic_load(&c->slots[o1.slot].bucket) != bk)
            break;
        cr_assert_eq(sfs_cache_release(c, &o1), 0);
        cr_assert_eq(sfs_cache_remove(c, &other), 0);
    }
    cr_assert_eq(sfs_cache_get(c, &other, 0, 0, &o2), SFS_HIT);

    pthread_t th = hold_bucket(&h);
    cr_assert_eq(sfs_cache_release(c, &a), 0);
    cr_assert_eq(atomic_load(&c->deferred), 1u);
    /* Another bucket's release: the deferred one's lock is still held. */
    cr_assert_eq(sfs_cache_release(c, &o1), 0);
    cr_assert_eq(atomic_load(&c->deferred), 1u, "a held lock is tried, not waited for");
    cr_assert_eq(tu_leases_on(c, a.slot), 1);
    let_go(&h, th);
    cr_assert_eq(h.r, SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &o2), 0);
    cr_assert_eq(atomic_load(&c->deferred), 0u);
    cr_assert_eq(tu_leases_on(c, a.slot), 1, "the holder's lease alone");
    cr_assert_eq(sfs_cache_release(c, &h.l), 0);
    cr_assert_eq(sfs_cache_remove(c, &k), 0);
    cr_assert_eq(sfs_cache_remove(c, &other), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A reap whose bucket lock is out of reach: the server's reaper tries each
 * lock, never waits; the record stays DEAD, and the reaper's next pass
 * (every 200 ms, with no connection closing to prompt it) finishes it.
 */

struct owner_child {
    struct sfs_key key;
    int up[2], down[2];
};

/* Own the key (a counted lease), say so, and exit holding it when told. */
static int own_and_exit(struct sfs_cache *c, void *arg)
{
    struct owner_child *o = arg;
    struct sfs_lease l;
    char b = 1;

    TU_CK(sfs_cache_get(c, &o->key, 0, 0, &l) == SFS_OWNER);
    TU_CK(write(o->up[1], &b, 1) == 1);
    TU_CK(read(o->down[0], &b, 1) == 1);
    tu_exit(0); /* the handle, its lease and its record left to the server */
}

Test(lease_defer, a_reap_past_a_held_lock_is_finished_by_the_next_pass)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    const char *path = tu_path("defer");
    struct owner_child o = {.key = tu_key(9, 0)};
    struct holder h;
    struct sfs_stats st;
    char b = 1;

    cr_assert(c);
    cr_assert_eq(sfs_cache_serve(c, path), 0);
    cr_assert_eq(pipe(o.up), 0);
    cr_assert_eq(pipe(o.down), 0);
    pid_t pid = tu_fork_attached(path, 0, own_and_exit, &o);
    cr_assert_eq(read(o.up[0], &b, 1), 1, "the child did not take the key");
    uint32_t s = SFS_NIL;
    for (uint32_t i = 0; i < c->nslots; i++)
        if (atomic_load(&c->slots[i].state) == SFS_STATE_LOADING)
            s = i;
    cr_assert_neq(s, SFS_NIL);

    /* A thread of ours holds the key's bucket lock; the child exits. */
    arm(&h, c, &o.key);
    cr_assert_eq(sfs_testpoint_arm("reap:record", SFS_TP_CALL, NULL, NULL), 0);
    pthread_t th = hold_bucket(&h);
    cr_assert_eq(write(o.down[1], &b, 1), 1);
    cr_assert_eq(tu_wait(pid), 0);
    for (int i = 0; sfs_testpoint_hits("reap:record") == 0; i++) {
        cr_assert_lt(i, 3000, "the server never tried to reap the record");
        usleep(1000);
    }
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.reaped, 0, "reaped past a held bucket lock");
    cr_assert_eq(tu_leases_on(c, s), 1, "the dead owner's lease is still counted");

    /* The lock is free again: the next pass reaps, and nothing else asks. */
    let_go(&h, th);
    cr_assert_eq(h.r, SFS_OWNER, "the holder takes the dead owner's load over");
    tu_wait_reaped(c, 1);
    cr_assert_eq(tu_leases_on(c, s), 1, "the holder's lease alone");
    cr_assert_eq(sfs_cache_fail(c, &h.l, -EIO), 0);
    cr_assert_eq(sfs_cache_release(c, &h.l), 0);
    cr_assert_eq(tu_leases_on(c, s), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * An eviction whose victim's bucket lock is out of reach: the victim is
 * tried, never waited for; a Get with no deadline gives up -ENOSPC, and
 * takes the slot once the lock is free.
 */
Test(lease_defer, a_victim_behind_a_held_lock_is_not_waited_for)
{
    struct sfs_cache *c = tu_cache(1, 0, SHARD);
    struct sfs_key victim = tu_key(1, 0), fresh;
    struct sfs_lease l;
    struct holder h;

    cr_assert(c);
    cr_assert_eq(tu_load(c, &victim), SFS_OWNER);
    uint32_t bv = atomic_load(&c->slots[0].bucket);
    for (uint64_t n = 2;; n++) {
        cr_assert_lt(n, 1000, "no key of another bucket");
        fresh = tu_key(n, 0);
        if (bucket_of(c, &fresh) != bv)
            break;
    }
    arm(&h, c, &victim);
    pthread_t th = hold_bucket(&h);
    cr_assert_eq(sfs_cache_get(c, &fresh, 0, 0, &l), -ENOSPC,
                 "the only victim's lock is held: no slot now");
    let_go(&h, th);
    cr_assert_eq(h.r, SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &h.l), 0);
    cr_assert_eq(sfs_cache_get(c, &fresh, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(sfs_cache_state(c, &victim), -ENOENT, "the victim was evicted");
    cr_assert_eq(tu_publish(c, &fresh, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

/* The hot-set sampler never queues behind a Get: a bucket whose lock is
 * held is skipped (seen at the next sample), the others are visited. */
static int count_ready(const struct sfs_key *k, uint32_t s, bool acc, bool leased, void *arg)
{
    unsigned *n = arg;

    (void)k;
    (void)s;
    (void)acc;
    n[0]++;
    n[1] += leased;
    return 0;
}

Test(lease_defer, the_sampler_skips_a_bucket_whose_lock_is_held)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key held = tu_key(1, 0), other;
    struct sfs_lease l;
    struct holder h;
    uint32_t cursor = 0;
    unsigned n[2] = {0, 0};

    cr_assert(c);
    cr_assert_eq(tu_load(c, &held), SFS_OWNER);
    for (uint64_t i = 2;; i++) {
        cr_assert_lt(i, 1000, "no key of another bucket");
        other = tu_key(i, 0);
        if (bucket_of(c, &other) != bucket_of(c, &held))
            break;
    }
    cr_assert_eq(tu_load(c, &other), SFS_OWNER);
    arm(&h, c, &held);
    /* A counted lease (the armed point forces the locked path) on other. */
    cr_assert_eq(sfs_cache_get(c, &other, 0, 0, &l), SFS_HIT);
    pthread_t th = hold_bucket(&h);
    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, count_ready, n), 0);
    cr_assert_eq(n[0], 1, "the held bucket's key was visited, or the other was not");
    cr_assert_eq(n[1], 1, "the counted lease is a lease");
    let_go(&h, th);
    cr_assert_eq(sfs_cache_release(c, &h.l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    n[0] = n[1] = 0;
    cr_assert_eq(sfs_cache_sample(c, &cursor, 0, count_ready, n), 0);
    cr_assert_eq(n[0], 2);
    cr_assert_eq(n[1], 0);
    sfs_cache_close(c);
}
