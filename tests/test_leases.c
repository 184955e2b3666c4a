/* SPDX-License-Identifier: MIT */
/*
 * test_leases.c - the leased entry points given what is not a lease of
 * theirs, and the waits at their edges: a lease out of range, released
 * already, or a waiter's where an owner's is needed; an error or a length
 * word that a hostile process forged; the data of a query-only handle; a
 * waiter whose owner let go unpublished (it takes the load over); a wait
 * with no deadline, or one already past; the outcomes' errnos; wait_any's
 * refusals, a doorbell alone, and more keys than one futex_waitv takes;
 * a thread's spare entry, which follows the thread to the handle it uses
 * and goes with a handle closed under it; a Get on a cache whose every
 * slot is leased, asleep until a release gives it the released slot.
 */
#include "testutil.h"
#include "cache_i.h" /* a slot's words, forged as a hostile process would */
#include "testpoint_i.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <string.h>
#include <unistd.h>

#define SHARD 4096u

TestSuite(leases, .timeout = 30);

static void refused_everywhere(struct sfs_cache *c, const struct sfs_lease *l, const char *what)
{
    cr_assert_eq(sfs_cache_publish(c, l, SHARD, 0), -EINVAL, "%s", what);
    cr_assert_eq(sfs_cache_settle(c, l, SHARD, SHARD, 0), -EINVAL, "%s", what);
    cr_assert_eq(sfs_cache_fail(c, l, -EIO), -EINVAL, "%s", what);
    cr_assert_eq(sfs_cache_error(c, l), -EINVAL, "%s", what);
    cr_assert_eq(sfs_cache_length(c, l), 0, "%s", what);
    cr_assert_not(sfs_cache_write_wanted(c, l), "%s", what);
    cr_assert_eq(sfs_cache_wait(c, l, 0), -EINVAL, "%s", what);
    cr_assert_eq(sfs_cache_release(c, l), -EINVAL, "%s", what);
}

Test(leases, what_is_not_a_lease_is_refused)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(1, 0);
    struct sfs_lease l;

    cr_assert_not_null(c);
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(NULL, &k, 0, 0, &l), -EINVAL);
    cr_assert_eq(sfs_cache_get(c, NULL, 0, 0, &l), -EINVAL);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, NULL), -EINVAL);

    refused_everywhere(c, NULL, "no lease");
    refused_everywhere(NULL, &(struct sfs_lease){0, 0}, "no cache");
    refused_everywhere(c, &(struct sfs_lease){.slot = c->nslots + 5}, "a slot out of range");
    refused_everywhere(c, &(struct sfs_lease){.entry = c->max_leases}, "an entry out of range");
    cr_assert_null(sfs_cache_data(c, NULL));
    cr_assert_null(sfs_cache_data(NULL, &l));
    cr_assert_null(sfs_cache_data(c, &(struct sfs_lease){.slot = c->nslots}));

    /* A lease released is no lease: a lock-free hit's, and a counted one
     * (the locked path). */
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    refused_everywhere(c, &l, "a hit released");
    cr_assert_eq(sfs_cache_get(c, &k, SFS_GET_PEEK, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), -EINVAL);
    sfs_cache_close(c);
}

Test(leases, only_the_owners_lease_settles_a_load)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(2, 0);
    struct sfs_lease own, w;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &own), SFS_OWNER);
    /* Our own process's second Get: a waiter, not a second owner. */
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &w), SFS_WAITER);
    cr_assert_eq(sfs_cache_publish(c, &w, SHARD, 0), -EPERM);
    cr_assert_eq(sfs_cache_fail(c, &w, -EIO), -EPERM);
    /* An error must be one; a length at most a shard. */
    cr_assert_eq(sfs_cache_fail(c, &own, 0), -EINVAL);
    cr_assert_eq(sfs_cache_fail(c, &own, EIO), -EINVAL);
    cr_assert_eq(sfs_cache_publish(c, &own, SHARD + 1, 0), -EINVAL);
    cr_assert_eq(sfs_cache_error(c, &w), 0, "Loading: no error");
    cr_assert_eq(tu_publish(c, &k, &own), 0);
    cr_assert_eq(sfs_cache_publish(c, &own, SHARD, 0), -EPERM, "published already");
    cr_assert_eq(sfs_cache_fail(c, &own, -EIO), -EPERM, "published already");
    cr_assert_eq(sfs_cache_wait(c, &w, 0), SFS_WAIT_READY);
    cr_assert_eq(sfs_cache_length(c, &w), SHARD);
    /* A length word forged past the shard reads as nothing. */
    uint32_t len = atomic_load(&c->slots[w.slot].length);

    atomic_store(&c->slots[w.slot].length, SHARD + 1);
    cr_assert_eq(sfs_cache_length(c, &w), 0);
    atomic_store(&c->slots[w.slot].length, len);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}

Test(leases, a_failed_loads_error)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(3, 0);
    struct sfs_lease own, w;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &w), SFS_WAITER);
    /* A short read settles as -EIO; a write's error is the writer's alone. */
    cr_assert_eq(sfs_cache_settle(c, &own, 100, SHARD, SFS_PUBLISH_WRITTEN), -EIO);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_LOADING);
    cr_assert_eq(sfs_cache_settle(c, &own, -ENOENT, SHARD, 0), -ENOENT);
    int st = sfs_cache_wait(c, &w, 0);

    cr_assert_eq(st, SFS_WAIT_FAILED);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, st), -ENOENT);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, SFS_WAIT_READY), 0);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, -ETIMEDOUT), -ETIMEDOUT);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, SFS_WAIT_OWNER), -EINVAL);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, 99), -EINVAL);
    /* An error word forged non-negative still reads as an error. */
    atomic_store(&c->slots[w.slot].error, 5);
    cr_assert_eq(sfs_cache_error(c, &w), -EIO);
    cr_assert_eq(sfs_cache_wait_errno(c, &w, SFS_WAIT_FAILED), -EIO);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}

/* A query-only handle holds leases but no bytes. */
Test(leases, a_query_only_handle_has_no_data)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(4, 0);
    struct sfs_lease l;
    int err = 0;

    cr_assert_not_null(c);
    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    struct sfs_cache *q = sfs_cache_attach_fds(dup(c->ctl_fd), NULL, 0, -1, &err);

    cr_assert_not_null(q, "%s", strerror(-err));
    cr_assert_eq(sfs_cache_get(q, &k, 0, 0, &l), SFS_HIT);
    cr_assert_null(sfs_cache_data(q, &l));
    cr_assert_eq(sfs_cache_length(q, &l), SHARD);
    cr_assert_null(sfs_cache_segment(q, 0, NULL));
    cr_assert_eq(sfs_cache_release(q, &l), 0);
    sfs_cache_close(q);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Waits.
 */

Test(leases, a_waiter_takes_over_a_load_let_go_unpublished)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(5, 0);
    struct sfs_lease own, w;
    struct sfs_stats st;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &w), SFS_WAITER);
    /* A deadline already past: no sleep. */
    cr_assert_eq(sfs_cache_wait(c, &w, 1), -ETIMEDOUT);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_IDLE);
    cr_assert_eq(sfs_cache_wait(c, &w, 0), SFS_WAIT_OWNER);
    cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_LOADING);
    cr_assert_eq(tu_publish(c, &k, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.takeovers, 1);
    cr_assert(sfs_cache_exists(c, &k));
    sfs_cache_close(c);
}

struct publisher {
    struct sfs_cache *c;
    struct sfs_key key;
    struct sfs_lease l;
    int r;
};

static void *publish_later(void *arg)
{
    struct publisher *p = arg;

    usleep(20000); /* not a condition of the test: either order passes */
    p->r = tu_publish(p->c, &p->key, &p->l);
    return NULL;
}

Test(leases, a_wait_without_a_deadline_ends_at_the_publish)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct publisher p = {.c = c, .key = tu_key(6, 0)};
    struct sfs_lease w;
    pthread_t th;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &p.key, 0, 0, &p.l), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &p.key, 0, 0, &w), SFS_WAITER);
    cr_assert_eq(pthread_create(&th, NULL, publish_later, &p), 0);
    cr_assert_eq(sfs_cache_wait(c, &w, 0), SFS_WAIT_READY);
    pthread_join(th, NULL);
    cr_assert_eq(p.r, 0);
    cr_assert_eq(tu_check(&p.key, sfs_cache_data(c, &w), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_release(c, &p.l), 0);
    sfs_cache_close(c);
}

Test(leases, wait_any_refusals_and_a_doorbell_alone)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_key k = tu_key(7, 0);
    struct sfs_lease l[2];
    uint32_t bell = 0;
    int out = -1;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l[0]), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l[1]), SFS_WAITER);
    cr_assert_eq(sfs_cache_wait_any(NULL, l, 1, 0, &out), -EINVAL);
    cr_assert_eq(sfs_cache_wait_any(c, NULL, 1, 0, &out), -EINVAL);
    cr_assert_eq(sfs_cache_wait_any(c, &l[1], 1, 0, NULL), -EINVAL);
    cr_assert_eq(sfs_cache_wait_any_bell(c, NULL, 0, 0, &out, NULL, 0), -EINVAL,
                 "nothing to wait for");
    cr_assert_eq(sfs_cache_wait_any(c, l, SFS_WAIT_ANY_MAX + 1, 0, &out), -EINVAL);
    struct sfs_lease bad[2] = {l[1], {.slot = c->nslots}};

    cr_assert_eq(sfs_cache_wait_any(c, bad, 2, 0, &out), -EINVAL);
    /* A bell alone: rung already, the wait returns n at once; not rung, it
     * ends at its deadline. */
    cr_assert_eq(sfs_cache_wait_any_bell(c, NULL, 0, 1, &out, &bell, 0), -ETIMEDOUT);
    sfs_bell_ring(&bell);
    cr_assert_eq(sfs_cache_wait_any_bell(c, NULL, 0, 0, &out, &bell, 0), 0);
    cr_assert_eq(sfs_cache_wait_any_bell(c, &l[1], 1, 0, &out, &bell, 0), 1);
    /* A deadline already past. */
    cr_assert_eq(sfs_cache_wait_any(c, &l[1], 1, 1, &out), -ETIMEDOUT);
    cr_assert_eq(sfs_cache_fail(c, &l[0], -EIO), 0);
    cr_assert_eq(sfs_cache_wait_any(c, &l[1], 1, 0, &out), 0);
    cr_assert_eq(out, SFS_WAIT_FAILED);
    cr_assert_eq(sfs_cache_release(c, &l[1]), 0);
    cr_assert_eq(sfs_cache_release(c, &l[0]), 0);
    sfs_cache_close(c);
}

/* SFS_WAIT_ANY_MAX keys and a bell: more words than one futex_waitv takes.
 * The wait sleeps on a window of them that rotates, and every pass looks
 * at all: the last key's publish ends it. */
struct many {
    struct sfs_cache *c;
    struct sfs_key keys[SFS_WAIT_ANY_MAX];
    struct sfs_lease own[SFS_WAIT_ANY_MAX], w[SFS_WAIT_ANY_MAX];
};

static void *publish_last(void *arg)
{
    struct many *m = arg;

    usleep(20000); /* not a condition of the test: either order passes */
    tu_publish(m->c, &m->keys[SFS_WAIT_ANY_MAX - 1], &m->own[SFS_WAIT_ANY_MAX - 1]);
    return NULL;
}

Test(leases, wait_any_over_more_keys_than_one_futex_call)
{
    static struct many m;
    uint32_t bell = 0;
    int out = -1;
    pthread_t th;

    m.c = tu_cache(2 * SFS_WAIT_ANY_MAX, 0, SHARD);
    cr_assert_not_null(m.c);
    for (int i = 0; i < SFS_WAIT_ANY_MAX; i++) {
        m.keys[i] = tu_key(100 + (uint64_t)i, 0);
        cr_assert_eq(sfs_cache_get(m.c, &m.keys[i], 0, 0, &m.own[i]), SFS_OWNER);
        cr_assert_eq(sfs_cache_get(m.c, &m.keys[i], 0, 0, &m.w[i]), SFS_WAITER);
    }
    cr_assert_eq(pthread_create(&th, NULL, publish_last, &m), 0);
    int r = sfs_cache_wait_any_bell(m.c, m.w, SFS_WAIT_ANY_MAX,
                                    sfs_deadline_after(10ll * 1000000000), &out, &bell, 0);
    pthread_join(th, NULL);
    cr_assert_eq(r, SFS_WAIT_ANY_MAX - 1);
    cr_assert_eq(out, SFS_WAIT_READY);
    for (int i = 0; i < SFS_WAIT_ANY_MAX; i++) {
        if (i < SFS_WAIT_ANY_MAX - 1)
            cr_assert_eq(sfs_cache_fail(m.c, &m.own[i], -EIO), 0);
        cr_assert_eq(sfs_cache_release(m.c, &m.w[i]), 0);
        cr_assert_eq(sfs_cache_release(m.c, &m.own[i]), 0);
    }
    sfs_cache_close(m.c);
}

/* ---------------------------------------------------------------------------
 * A thread's spare entry. Each thread keeps one freed entry of the last
 * handle it used; a thread that moved to another handle gives it back
 * after SPARE_SWITCH frees there, and one whose handle was closed by
 * another thread lets it go with the handle.
 */

struct spare_thread {
    struct sfs_cache *c[2];
    struct sfs_key k[2];
    int phase; /* which handle the next step uses; -1: exit */
    int fails;
    sem_t go, done;
};

static void *spare_main(void *arg)
{
    struct spare_thread *t = arg;

    for (;;) {
        while (sem_wait(&t->go) < 0)
            ;
        if (t->phase < 0)
            break;
        /* Once on handle 0 (keeps a spare of it); 64 times on handle 1. */
        int n = t->phase == 0 ? 1 : 64;

        for (int i = 0; i < n; i++) {
            struct sfs_lease l;

            if (sfs_cache_get(t->c[t->phase], &t->k[t->phase], 0, 0, &l) != SFS_HIT ||
                sfs_cache_release(t->c[t->phase], &l) != 0)
                t->fails++;
        }
        sem_post(&t->done);
    }
    return NULL;
}

static void step(struct spare_thread *t, int phase)
{
    t->phase = phase;
    sem_post(&t->go);
    while (phase >= 0 && sem_wait(&t->done) < 0)
        ;
}

/* Two leases of c at once, as this thread: true when both are had. */
static bool two_leases(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease a, b;

    cr_assert_eq(sfs_cache_get(c, k, 0, 0, &a), SFS_HIT);
    int r = sfs_cache_get(c, k, 0, 0, &b);

    cr_assert(r == SFS_HIT || r == -ENOBUFS, "%d", r);
    if (r == SFS_HIT)
        cr_assert_eq(sfs_cache_release(c, &b), 0);
    cr_assert_eq(sfs_cache_release(c, &a), 0);
    return r == SFS_HIT;
}

static struct sfs_cache *two_entry_cache(void)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 8,
                                   .no_reserved = true,
                                   .max_leases = 2, /* no hit lines: every lease counted */
                                   .hugepages = SFS_HUGEPAGES_OFF};
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "%s", strerror(-err));
    return c;
}

static void spare_start(struct spare_thread *t, pthread_t *th)
{
    t->fails = 0;
    cr_assert_eq(sem_init(&t->go, 0, 0), 0);
    cr_assert_eq(sem_init(&t->done, 0, 0), 0);
    cr_assert_eq(pthread_create(th, NULL, spare_main, t), 0);
}

static void spare_stop(struct spare_thread *t, pthread_t th)
{
    step(t, -1);
    pthread_join(th, NULL);
    cr_assert_eq(t->fails, 0);
    sem_destroy(&t->go);
    sem_destroy(&t->done);
}

Test(leases, a_threads_spare_entry_follows_it_or_goes_with_its_handle)
{
    struct spare_thread t = {.k = {tu_key(1, 0), tu_key(2, 0)}};
    pthread_t th;

    for (int i = 0; i < 2; i++) {
        t.c[i] = two_entry_cache();
        cr_assert_eq(tu_load(t.c[i], &t.k[i]), SFS_OWNER);
    }
    cr_assert(two_leases(t.c[0], &t.k[0]));
    /* A thread keeps one of handle 0's two entries: we get one. */
    spare_start(&t, &th);
    step(&t, 0);
    cr_assert_not(two_leases(t.c[0], &t.k[0]), "the thread's spare was not kept");
    /* It moves to handle 1: after SPARE_SWITCH frees there, handle 0's
     * entry is back, and the thread keeps one of handle 1's. */
    step(&t, 1);
    cr_assert(two_leases(t.c[0], &t.k[0]), "the spare did not follow the thread");
    cr_assert_not(two_leases(t.c[1], &t.k[1]));
    spare_stop(&t, th);
    cr_assert(two_leases(t.c[1], &t.k[1]), "an exited thread kept handle 1's entry");
    /* Another thread's spare of handle 0; handle 0 closed under it: when
     * the thread moves on, its spare goes with the closed handle. */
    spare_start(&t, &th);
    step(&t, 0);
    sfs_cache_close(t.c[0]);
    step(&t, 1);
    cr_assert_not(two_leases(t.c[1], &t.k[1]), "the thread keeps a spare of handle 1 now");
    spare_stop(&t, th);
    cr_assert(two_leases(t.c[1], &t.k[1]), "an exited thread kept handle 1's entry");
    sfs_cache_close(t.c[1]);
}

/* A thread that exits holding a spare of a handle closed before it. */
Test(leases, a_spare_of_a_closed_handle_at_thread_exit)
{
    struct spare_thread t = {.k = {tu_key(1, 0), tu_key(2, 0)}};
    pthread_t th;

    t.c[0] = two_entry_cache();
    cr_assert_eq(tu_load(t.c[0], &t.k[0]), SFS_OWNER);
    spare_start(&t, &th);
    step(&t, 0);
    sfs_cache_close(t.c[0]);
    spare_stop(&t, th);
    /* A new handle (maybe at the closed one's address) is whole. */
    struct sfs_cache *c = two_entry_cache();

    cr_assert_eq(tu_load(c, &t.k[0]), SFS_OWNER);
    cr_assert(two_leases(c, &t.k[0]));
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A Get on a cache whose every slot is leased sleeps for a release (the
 * "evict:release_sleep" point says it is about to), and the release wakes
 * it: it takes the released slot, evicting that key.
 */

struct full_get {
    struct sfs_cache *c;
    struct sfs_key key;
    struct sfs_lease l;
    int r;
    sem_t asleep;
};

static void about_to_sleep(const char *name, void *arg)
{
    (void)name;
    sem_post(&((struct full_get *)arg)->asleep);
}

static void *get_on_full(void *arg)
{
    struct full_get *g = arg;

    g->r = sfs_cache_get(g->c, &g->key, 0, sfs_deadline_after(20ll * 1000000000), &g->l);
    return NULL;
}

Test(leases, a_get_on_a_full_cache_sleeps_until_a_release)
{
    struct full_get g = {.c = tu_cache(4, 0, SHARD), .key = tu_key(99, 0)};
    struct sfs_lease held[4];
    struct sfs_key k[4];
    pthread_t th;

    cr_assert_not_null(g.c);
    for (int i = 0; i < 4; i++) {
        k[i] = tu_key(80 + (uint64_t)i, 0);
        cr_assert_eq(sfs_cache_get(g.c, &k[i], 0, 0, &held[i]), SFS_OWNER);
        cr_assert_eq(tu_publish(g.c, &k[i], &held[i]), 0);
    }
    cr_assert_eq(sem_init(&g.asleep, 0, 0), 0);
    cr_assert_eq(sfs_testpoint_arm("get:full", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(sfs_testpoint_arm("evict:release_sleep", SFS_TP_CALL, about_to_sleep, &g), 0);
    cr_assert_eq(pthread_create(&th, NULL, get_on_full, &g), 0);
    while (sem_wait(&g.asleep) < 0)
        ;
    cr_assert_geq(sfs_testpoint_hits("get:full"), 1);
    cr_assert_eq(sfs_cache_state(g.c, &g.key), -ENOENT, "a slot was found full");
    cr_assert_eq(sfs_cache_release(g.c, &held[2]), 0);
    pthread_join(th, NULL);
    sfs_testpoint_disarm_all();
    cr_assert_eq(g.r, SFS_OWNER, "%d", g.r);
    cr_assert_eq(sfs_cache_state(g.c, &k[2]), -ENOENT, "the released key was the victim");
    cr_assert_eq(tu_publish(g.c, &g.key, &g.l), 0);
    cr_assert_eq(sfs_cache_release(g.c, &g.l), 0);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            cr_assert_eq(sfs_cache_release(g.c, &held[i]), 0);
    sem_destroy(&g.asleep);
    sfs_cache_close(g.c);
}
