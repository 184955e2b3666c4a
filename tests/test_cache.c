/* SPDX-License-Identifier: MIT */
/*
 * test_cache.c - CacheBuffer semantics: roles, publish/fail/release, leases
 * against eviction, deadlines, the Get flags, Remove, Touch, stats, lease
 * exhaustion, slot addressing, hex ids and huge pages.
 *
 * Cross-process cases fork real children that attach through the socket;
 * a child never asserts (Criterion's asserts belong to the test process): it
 * exits non-zero, naming the failed check on stderr, and the parent asserts
 * on its exit status. Parent and child meet through pipes.
 */
#include "testutil.h"
#include "cache_i.h" /* refcounts, geometry and the segment fds of a handle */

#include <criterion/criterion.h>
#include <criterion/logging.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SHARD 4096u
#define MS    (1000 * 1000ll)

static void sig(int fd)
{
    char one = 1;

    if (write(fd, &one, 1) != 1)
        abort();
}

static bool await_fd(int fd)
{
    char one;

    return read(fd, &one, 1) == 1;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * MS};

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void fill_publish(struct sfs_cache *c, const struct sfs_key *k, struct sfs_lease *l)
{
    cr_assert_eq(tu_publish(c, k, l), 0);
}

/* Get k, expect a hit with the right bytes, release. */
static void assert_hit(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;

    cr_assert_eq(sfs_cache_get(c, k, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(k, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

/* What a test shares with its children: the socket they attach to, the key
 * they work on, an argument, and two pipes, up (child -> parent) and down
 * (parent -> child). */
struct child {
    const char *path;
    struct sfs_key key;
    int arg;
    int to_parent, from_parent; /* the child's ends */
    int from_child, to_child;   /* the parent's ends */
    int (*body)(struct sfs_cache *c, struct child *a);
};

/* A cache of nslots served at a fresh path for a's children, and their pipes. */
static struct sfs_cache *served(struct child *a, uint32_t nslots)
{
    struct sfs_cache *c = tu_cache(nslots, 0, SHARD);
    int up[2], down[2];

    cr_assert_not_null(c);
    a->path = tu_path("cache");
    cr_assert_eq(sfs_cache_serve(c, a->path), 0);
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(down), 0);
    a->from_child = up[0];
    a->to_parent = up[1];
    a->from_parent = down[0];
    a->to_child = down[1];
    return c;
}

static int run_body(struct sfs_cache *c, void *arg)
{
    struct child *a = arg;

    return a->body(c, a);
}

/* Fork n children that attach to a->path and run body(c, a), then drop the
 * children's ends of the pipes, so a child that dies early is an EOF for the
 * parent, not a hang. A child that fails a check exits non-zero. */
static void fork_children(struct child *a, int (*body)(struct sfs_cache *c, struct child *a),
                          pid_t *pids, int n)
{
    a->body = body;
    for (int i = 0; i < n; i++)
        pids[i] = tu_fork_attached(a->path, 1, run_body, a);
    close(a->to_parent);
    close(a->from_parent);
}

static pid_t fork_child(struct child *a, int (*body)(struct sfs_cache *c, struct child *a))
{
    pid_t pid;

    fork_children(a, body, &pid, 1);
    return pid;
}

/* ---------------------------------------------------------------------------
 * Roles.
 */

/* Waiter in another process: blocks until Ready, then reads, then hits. */
static int roles_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &a->key, 0, 0, &l) == SFS_WAITER);
    sig(a->to_parent);
    TU_CK(sfs_cache_wait(c, &l, sfs_deadline_after(5000 * MS)) == SFS_WAIT_READY);
    TU_CK(sfs_cache_length(c, &l) == SHARD);
    TU_CK(tu_check(&a->key, sfs_cache_data(c, &l), SHARD) == -1);
    TU_CK(sfs_cache_release(c, &l) == 0);
    TU_CK(sfs_cache_get(c, &a->key, 0, 0, &l) == SFS_HIT);
    TU_CK(tu_check(&a->key, sfs_cache_data(c, &l), SHARD) == -1);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(cache, roles_owner_waiter_hit, .timeout = 30)
{
    struct sfs_key X = tu_key(1, 0);
    struct child a = {.key = X};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_lease own, w, h;

    cr_assert_eq(sfs_cache_state(c, &X), -ENOENT);
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_LOADING);
    /* A second Get of a Loading key whose owner lives is a waiter. */
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &w), SFS_WAITER);
    cr_assert_eq(w.slot, own.slot);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    pid_t pid = fork_child(&a, roles_child);
    cr_assert(await_fd(a.from_child));
    sleep_ms(20);
    fill_publish(c, &X, &own);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_READY);
    cr_assert_eq(tu_wait(pid), 0);
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &h), SFS_HIT);
    cr_assert_eq(h.slot, own.slot);
    cr_assert_eq(sfs_cache_release(c, &h), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    /* A lease is released once. */
    cr_assert_eq(sfs_cache_release(c, &own), -EINVAL);
    sfs_cache_close(c);
}

/* Threads of one process: a waiter thread must wait for the owner thread's
 * publish, not be told it owns the slot (one owner per missing key). */
struct thr_arg {
    struct sfs_cache *c;
    struct sfs_key key;
    int role, wait_ret;
    long check;
    int64_t woke_ns;
};

static void *thr_waiter(void *p)
{
    struct thr_arg *t = p;
    struct sfs_lease l;

    t->role = sfs_cache_get(t->c, &t->key, 0, 0, &l);
    if (t->role != SFS_WAITER)
        return NULL;
    t->wait_ret = sfs_cache_wait(t->c, &l, sfs_deadline_after(5000 * MS));
    t->woke_ns = sfs_now_ns();
    if (t->wait_ret == SFS_WAIT_READY)
        t->check = tu_check(&t->key, sfs_cache_data(t->c, &l), SHARD);
    sfs_cache_release(t->c, &l);
    return NULL;
}

Test(cache, waiter_thread_in_owner_process, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct thr_arg t = {.c = c, .key = tu_key(2, 0), .check = -2};
    struct sfs_lease own;
    pthread_t th;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &t.key, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(pthread_create(&th, NULL, thr_waiter, &t), 0);
    sleep_ms(50);
    /* Stamped before the publish: the waiter may wake before this thread
     * returns from it. */
    int64_t pub = sfs_now_ns();
    fill_publish(c, &t.key, &own);
    pthread_join(th, NULL);
    cr_assert_eq(t.role, SFS_WAITER);
    cr_assert_eq(t.wait_ret, SFS_WAIT_READY,
                 "the waiter thread returned %d before the owner thread published", t.wait_ret);
    cr_assert_geq(t.woke_ns, pub);
    cr_assert_eq(t.check, -1);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}

/* Ownership is the owner's lease, not every lease of the owner's process:
 * another lease the owner's process holds on the slot (a waiter thread's)
 * may neither publish nor, when released, abandon the load. */
Test(cache, owner_is_a_lease_not_a_process, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_key X = tu_key(15, 0);
    struct sfs_lease own, w, w2, retry;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &w), SFS_WAITER);
    cr_assert_eq(sfs_cache_publish(c, &w, SHARD, 0), -EPERM, "a waiter lease published");
    cr_assert_eq(sfs_cache_fail(c, &w, -EIO), -EPERM, "a waiter lease failed the load");
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_LOADING,
                 "releasing a waiter lease abandoned the owner's load");
    /* The owner gives up while a waiter lease of its process remains: Idle,
     * and that waiter takes over. */
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &w), SFS_WAITER);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_IDLE);
    cr_assert_eq(sfs_cache_wait(c, &w, sfs_deadline_after(1000 * MS)), SFS_WAIT_OWNER);
    /* It fails; a retry by another lease of the same process owns it now,
     * and the first lease's release must not abandon that retry. */
    cr_assert_eq(sfs_cache_fail(c, &w, -EIO), 0);
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &retry), SFS_OWNER);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_LOADING, "a stale owner lease reset the retry");
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &w2), SFS_WAITER);
    fill_publish(c, &X, &retry);
    cr_assert_eq(sfs_cache_wait(c, &w2, sfs_deadline_after(1000 * MS)), SFS_WAIT_READY);
    cr_assert_eq(tu_check(&X, sfs_cache_data(c, &w2), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &w2), 0);
    cr_assert_eq(sfs_cache_release(c, &retry), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Publish / fail / release by the owner.
 */

static int eperm_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &a->key, 0, 0, &l) == SFS_WAITER);
    /* Not the owner: may neither publish nor fail. */
    TU_CK(sfs_cache_publish(c, &l, SHARD, 0) == -EPERM);
    TU_CK(sfs_cache_fail(c, &l, -EIO) == -EPERM);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(cache, publish_by_non_owner_is_eperm, .timeout = 30)
{
    struct sfs_key X = tu_key(3, 0);
    struct child a = {.key = X};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_lease own, forged;

    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(tu_wait(fork_child(&a, eperm_child)), 0);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_LOADING, "a non-owner changed the state");
    /* A lease we do not hold is refused; too long a length too. */
    forged = own;
    forged.entry = (own.entry + 1) % 16384;
    cr_assert_eq(sfs_cache_publish(c, &forged, SHARD, 0), -EINVAL);
    cr_assert_eq(sfs_cache_publish(c, &own, SHARD + 1, 0), -EINVAL);
    cr_assert_eq(sfs_cache_fail(c, &own, 5), -EINVAL, "a positive error is not an error");
    fill_publish(c, &X, &own);
    /* Ready: no second publish, no fail. */
    cr_assert_eq(sfs_cache_publish(c, &own, SHARD, 0), -EPERM);
    cr_assert_eq(sfs_cache_fail(c, &own, -EIO), -EPERM);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}

static int fail_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &a->key, 0, 0, &l) == SFS_WAITER);
    sig(a->to_parent);
    TU_CK(sfs_cache_wait(c, &l, sfs_deadline_after(5000 * MS)) == SFS_WAIT_FAILED);
    TU_CK(sfs_cache_error(c, &l) == a->arg);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(cache, fail_reaches_waiters_then_retry, .timeout = 30)
{
    struct sfs_key X = tu_key(4, 0);
    struct child a = {.key = X, .arg = -EREMOTEIO};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_lease own, l;
    struct sfs_stats st;
    pid_t pid[2];

    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);
    fork_children(&a, fail_child, pid, 2);
    for (int i = 0; i < 2; i++)
        cr_assert(await_fd(a.from_child));
    sleep_ms(20);
    cr_assert_eq(sfs_cache_fail(c, &own, -EREMOTEIO), 0);
    cr_assert_eq(sfs_cache_error(c, &own), -EREMOTEIO);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(tu_wait(pid[i]), 0, "waiter %d did not get the owner's error", i);
    cr_assert_eq(sfs_cache_state(c, &X), SFS_STATE_FAILED);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.failures, 1);
    cr_assert_eq(st.waits, 2);

    /* Invariant 5: the next Get takes ownership again and the retry works. */
    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(l.slot, own.slot);
    cr_assert_eq(sfs_cache_error(c, &l), 0, "a retried slot still carries the old error");
    fill_publish(c, &X, &l);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    assert_hit(c, &X);
    sfs_cache_close(c);
}

/* The owner lets go without publishing: a waiter in another process takes
 * the slot over, fills and publishes it. */
static int takeover_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &a->key, 0, 0, &l) == SFS_WAITER);
    sig(a->to_parent);
    TU_CK(sfs_cache_wait(c, &l, sfs_deadline_after(5000 * MS)) == SFS_WAIT_OWNER);
    TU_CK(sfs_cache_state(c, &a->key) == SFS_STATE_LOADING);
    TU_CK(tu_publish(c, &a->key, &l) == 0);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(cache, release_unpublished_goes_idle_waiter_takes_over, .timeout = 30)
{
    struct sfs_key X = tu_key(5, 0), Y = tu_key(6, 0);
    struct child a = {.key = X};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_lease own;
    struct sfs_stats st;

    /* Alone: an owner that releases unpublished leaves the slot Idle. */
    cr_assert_eq(sfs_cache_get(c, &Y, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    cr_assert_eq(sfs_cache_state(c, &Y), SFS_STATE_IDLE);

    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);
    pid_t pid = fork_child(&a, takeover_child);
    cr_assert(await_fd(a.from_child));
    sleep_ms(20);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    cr_assert_eq(tu_wait(pid), 0, "the waiter did not take over and publish");
    assert_hit(c, &X);
    sfs_cache_stats(c, &st);
    cr_assert_geq(st.takeovers, 1);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Leases against eviction, and a full cache.
 */

Test(cache, leased_slot_never_evicted, .timeout = 30)
{
    /* CLOCK's churn must evict K at the end; admission=scan keeps a key read
     * twice against one-time loads by design (test_admission covers it). */
    unsetenv("SHARDFS_TEST_ADMISSION");
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_key K = tu_key(7, 0);
    struct sfs_lease held, l;
    struct sfs_stats st;

    cr_assert_not_null(c);
    cr_assert_eq(tu_load(c, &K), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &K, 0, 0, &held), SFS_HIT);
    void *p = sfs_cache_data(c, &held);
    for (uint64_t i = 0; i < 300; i++) {
        struct sfs_key o = tu_key(1000 + i, (uint32_t)(i % 5));

        cr_assert_eq(tu_load(c, &o), SFS_OWNER, "churn key %llu", (unsigned long long)i);
        cr_assert_eq(sfs_cache_state(c, &K), SFS_STATE_READY, "leased K evicted at churn %llu",
                     (unsigned long long)i);
    }
    sfs_cache_stats(c, &st);
    cr_assert_geq(st.evictions, 297, "the churn did evict (%llu)",
                  (unsigned long long)st.evictions);
    cr_assert_eq(tu_check(&K, p, SHARD), -1, "the leased slot's bytes were overwritten");
    cr_assert_eq(sfs_cache_get(c, &K, 0, 0, &l), SFS_HIT);
    cr_assert_eq(l.slot, held.slot);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &held), 0);
    /* Unleased now: the same churn evicts it. */
    for (uint64_t i = 0; i < 20; i++) {
        struct sfs_key o = tu_key(5000 + i, 0);
        cr_assert_eq(tu_load(c, &o), SFS_OWNER);
    }
    cr_assert_eq(sfs_cache_state(c, &K), -ENOENT);
    sfs_cache_close(c);
}

Test(cache, all_leased_get_enospc_within_deadline, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_lease held[4], l;
    struct sfs_key N = tu_key(99, 0);

    cr_assert_not_null(c);
    for (uint32_t i = 0; i < 4; i++) {
        struct sfs_key k = tu_key(80 + i, 0);

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &held[i]), SFS_OWNER);
        fill_publish(c, &k, &held[i]);
    }
    int64_t t0 = sfs_now_ns();
    cr_assert_eq(sfs_cache_get(c, &N, 0, 0, &l), -ENOSPC);
    int64_t t1 = sfs_now_ns();
    cr_assert_lt(t1 - t0, 500 * MS, "deadline 0 must not wait");
    cr_assert_eq(sfs_cache_get(c, &N, 0, sfs_deadline_after(200 * MS), &l), -ENOSPC);
    int64_t t2 = sfs_now_ns();
    cr_assert_geq(t2 - t1, 195 * MS, "gave up before its deadline (%lld ns)", (long long)(t2 - t1));
    cr_assert_lt(t2 - t1, 2000 * MS, "overran its deadline (%lld ns)", (long long)(t2 - t1));
    cr_assert_eq(sfs_cache_state(c, &N), -ENOENT);
    for (uint32_t i = 0; i < 4; i++) {
        struct sfs_key k = tu_key(80 + i, 0);

        cr_assert_eq(sfs_cache_state(c, &k), SFS_STATE_READY);
        cr_assert_eq(sfs_cache_release(c, &held[i]), 0);
    }
    cr_assert_eq(sfs_cache_get(c, &N, 0, 0, &l), SFS_OWNER);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

/* Holds every slot, then lets one go while the parent waits for a slot. */
static int holder_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l[4];

    for (uint32_t i = 0; i < 4; i++) {
        struct sfs_key k = tu_key(200 + i, 0);

        TU_CK(sfs_cache_get(c, &k, 0, 0, &l[i]) == SFS_OWNER);
        TU_CK(tu_publish(c, &k, &l[i]) == 0);
    }
    sig(a->to_parent);
    struct timespec ts = {.tv_nsec = 150 * MS};
    nanosleep(&ts, NULL);
    int64_t released = sfs_now_ns();
    TU_CK(sfs_cache_release(c, &l[2]) == 0);
    TU_CK(write(a->to_parent, &released, sizeof(released)) == sizeof(released));
    TU_CK(await_fd(a->from_parent)); /* keep the other three until told */
    return 0;
}

Test(cache, get_with_deadline_waits_for_release, .timeout = 30)
{
    struct child a = {0};
    struct sfs_cache *c = served(&a, 4);
    struct sfs_key N = tu_key(299, 0), freed = tu_key(202, 0);
    struct sfs_lease l;

    pid_t pid = fork_child(&a, holder_child);
    cr_assert(await_fd(a.from_child));
    cr_assert_eq(sfs_cache_get(c, &N, 0, 0, &l), -ENOSPC, "every slot should be leased");
    int r = sfs_cache_get(c, &N, 0, sfs_deadline_after(5000 * MS), &l);
    int64_t got = sfs_now_ns(), released = 0;
    cr_assert_eq(read(a.from_child, &released, sizeof(released)), (ssize_t)sizeof(released));
    sig(a.to_child);
    cr_assert_eq(tu_wait(pid), 0);
    cr_assert_eq(r, SFS_OWNER, "the Get did not get the released slot: %d", r);
    /* Causal: the slot came from the release, promptly (not at the deadline). */
    cr_assert_geq(got, released, "got a slot before anyone released one");
    cr_assert_lt(got - released, 2000 * MS, "took %lld ns after the release",
                 (long long)(got - released));
    cr_assert_eq(sfs_cache_state(c, &freed), -ENOENT, "the released key was the victim");
    fill_publish(c, &N, &l);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Deadlines on wait.
 */

static int timeout_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &a->key, 0, 0, &l) == SFS_WAITER);
    int64_t t0 = sfs_now_ns();
    TU_CK(sfs_cache_wait(c, &l, 1) == -ETIMEDOUT); /* long past */
    TU_CK(sfs_now_ns() - t0 < 500 * MS);
    t0 = sfs_now_ns();
    TU_CK(sfs_cache_wait(c, &l, sfs_deadline_after(150 * MS)) == -ETIMEDOUT);
    int64_t dt = sfs_now_ns() - t0;
    TU_CK(dt >= 145 * MS);
    TU_CK(dt < 2000 * MS);
    TU_CK(sfs_cache_state(c, &a->key) == SFS_STATE_LOADING);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(cache, wait_deadline_times_out, .timeout = 30)
{
    struct sfs_key X = tu_key(8, 0);
    struct child a = {.key = X};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_lease own;

    cr_assert_eq(sfs_cache_get(c, &X, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(tu_wait(fork_child(&a, timeout_child)), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Get flags.
 */

static struct sfs_cache *cache_cfg(uint32_t nslots, uint32_t max_leases)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = nslots,
        .no_reserved = true,
        .max_leases = max_leases,
        .hugepages = SFS_HUGEPAGES_OFF,
    };
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "create: %s", strerror(-err));
    return c;
}

Test(cache, get_noalloc, .timeout = 30)
{
    struct sfs_cache *c = cache_cfg(8, 2);
    struct sfs_key K = tu_key(9, 0), A = tu_key(10, 0);
    struct sfs_lease l[2];

    cr_assert_eq(tu_load(c, &K), SFS_OWNER);
    /* Misses do not allocate, and do not leak lease entries (only 2). */
    for (int i = 0; i < 10; i++)
        cr_assert_eq(sfs_cache_get(c, &A, SFS_GET_NOALLOC, 0, &l[0]), -ENOENT);
    cr_assert_eq(sfs_cache_state(c, &A), -ENOENT);
    cr_assert_eq(sfs_cache_get(c, &K, SFS_GET_NOALLOC, 0, &l[0]), SFS_HIT);
    cr_assert_eq(sfs_cache_get(c, &A, 0, 0, &l[1]), SFS_OWNER);
    cr_assert_eq(sfs_cache_release(c, &l[1]), 0);
    /* Idle (an owner let go): NOALLOC finds it, and takes it over. */
    cr_assert_eq(sfs_cache_state(c, &A), SFS_STATE_IDLE);
    cr_assert_eq(sfs_cache_get(c, &A, SFS_GET_NOALLOC, 0, &l[1]), SFS_OWNER);
    cr_assert_eq(sfs_cache_release(c, &l[1]), 0);
    cr_assert_eq(sfs_cache_release(c, &l[0]), 0);
    sfs_cache_close(c);
}

Test(cache, get_write, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_key K = tu_key(11, 0), other = tu_key(12, 3), fresh = tu_key(13, 0);
    struct sfs_lease held, w, l;
    struct sfs_stats st0, st1;

    cr_assert_not_null(c);
    cr_assert_eq(tu_load(c, &K), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &K, 0, 0, &held), SFS_HIT);
    cr_assert_eq(sfs_cache_get(c, &K, SFS_GET_WRITE, 0, &w), -EBUSY);
    cr_assert_eq(sfs_cache_release(c, &held), 0);
    sfs_cache_stats(c, &st0);
    cr_assert_eq(sfs_cache_get(c, &K, SFS_GET_WRITE, 0, &w), SFS_OWNER);
    cr_assert_eq(w.slot, held.slot, "a rewrite takes the key's own slot");
    cr_assert_eq(sfs_cache_state(c, &K), SFS_STATE_LOADING);
    /* While it is being rewritten, a second writer is refused. */
    cr_assert_eq(sfs_cache_get(c, &K, SFS_GET_WRITE, 0, &l), -EBUSY);
    tu_fill(&other, sfs_cache_data(c, &w), SHARD); /* new contents */
    cr_assert_eq(sfs_cache_publish(c, &w, SHARD, SFS_PUBLISH_WRITTEN), 0);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    sfs_cache_stats(c, &st1);
    cr_assert_eq(st1.bytes_read, st0.bytes_read, "written bytes counted as backend reads");
    cr_assert_eq(st1.resident_bytes, st0.resident_bytes, "rewrite double-counted residency");
    cr_assert_eq(sfs_cache_get(c, &K, 0, 0, &l), SFS_HIT);
    cr_assert_eq(tu_check(&other, sfs_cache_data(c, &l), SHARD), -1, "the rewrite was lost");
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    /* Absent: a write Get is an ordinary owner. */
    cr_assert_eq(sfs_cache_get(c, &fresh, SFS_GET_WRITE, 0, &w), SFS_OWNER);
    cr_assert_eq(sfs_cache_release(c, &w), 0);
    sfs_cache_close(c);
}

Test(cache, get_prefetch, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(4, 2, SHARD); /* regular 0..1, reserved 2..3 */
    struct sfs_key P = tu_key(20, 0), Q = tu_key(21, 0), R = tu_key(22, 0);
    struct sfs_lease l, lp, lq;
    struct sfs_stats st;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_get(c, &P, SFS_GET_PREFETCH, 0, &l), SFS_OWNER);
    cr_assert_lt(l.slot, 2u);
    fill_publish(c, &P, &l);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(tu_leases_on(c, l.slot), 0, "prefetch left a lease");
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.prefetched, 1);
    cr_assert_eq(st.prefetch_hits, 0);
    cr_assert_eq(st.hits, 0);
    /* Present: nothing to prefetch. */
    cr_assert_eq(sfs_cache_get(c, &P, SFS_GET_PREFETCH, 0, &l), -EEXIST);
    /* The first hit counts as a prefetch hit, once. */
    cr_assert_eq(sfs_cache_get(c, &P, 0, 0, &lp), SFS_HIT);
    cr_assert_eq(tu_check(&P, sfs_cache_data(c, &lp), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &lp), 0);
    cr_assert_eq(sfs_cache_get(c, &P, 0, 0, &lp), SFS_HIT);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.prefetch_hits, 1);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.prefetched, 1);
    /* Prefetches are loads, not lookups: requests are the two demand Gets. */
    cr_assert_eq(st.requests, 2);
    cr_assert_eq(st.misses, 0);
    cr_assert_eq(st.owner_loads, 1);

    /* Regular pool all leased (P, Q): prefetch gives up rather than take a
     * reserved slot or a leased one. */
    cr_assert_eq(sfs_cache_get(c, &Q, 0, 0, &lq), SFS_OWNER);
    cr_assert_lt(lq.slot, 2u);
    fill_publish(c, &Q, &lq);
    cr_assert_eq(sfs_cache_get(c, &R, SFS_GET_PREFETCH, 0, &l), -ENOSPC);
    cr_assert_eq(sfs_cache_state(c, &R), -ENOENT);
    cr_assert_eq(atomic_load(&c->hdr->fresh_reserved), 0, "prefetch touched the reserved pool");
    /* A demand Get in the same state does use the reserved pool. */
    cr_assert_eq(sfs_cache_get(c, &R, 0, 0, &l), SFS_OWNER);
    cr_assert_geq(l.slot, 2u);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &lp), 0);
    cr_assert_eq(sfs_cache_release(c, &lq), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Remove, Touch.
 */

Test(cache, remove, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_key K = tu_key(30, 0);
    struct sfs_lease l;
    struct sfs_stats st;

    cr_assert_not_null(c);
    cr_assert_eq(sfs_cache_remove(c, &K), -ENOENT);
    cr_assert_eq(tu_load(c, &K), SFS_OWNER);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.resident_bytes, SHARD);
    cr_assert_eq(sfs_cache_get(c, &K, 0, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_remove(c, &K), -EBUSY);
    cr_assert_eq(sfs_cache_state(c, &K), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_remove(c, &K), 0);
    cr_assert_eq(sfs_cache_state(c, &K), -ENOENT);
    cr_assert_eq(sfs_cache_remove(c, &K), -ENOENT);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.resident_bytes, 0);
    cr_assert_eq(sfs_cache_get(c, &K, 0, 0, &l), SFS_OWNER, "removed key must miss");
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_close(c);
}

struct hook_rec {
    int calls;
    size_t n;
    struct sfs_block_id ids[8];
};

static void touch_hook(const struct sfs_block_id *blocks, size_t n, void *arg)
{
    struct hook_rec *h = arg;

    h->calls++;
    h->n = n;
    memcpy(h->ids, blocks, sizeof(*blocks) * (n < 8 ? n : 8));
}

Test(cache, touch_marks_and_cascades, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);
    struct sfs_block_id blocks[3] = {tu_block(1), tu_block(2), tu_block(3)};
    struct hook_rec h = {0};
    struct sfs_stats st;
    uint32_t shards1[] = {0, 1, 2}, shards2[] = {0, 5};

    cr_assert_not_null(c);
    for (int i = 0; i < 3; i++) {
        struct sfs_key k = tu_key(1, shards1[i]);
        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }
    for (int i = 0; i < 2; i++) {
        struct sfs_key k = tu_key(2, shards2[i]);
        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }
    struct sfs_key other = tu_key(4, 0);
    cr_assert_eq(tu_load(c, &other), SFS_OWNER);
    for (uint32_t s = 0; s < 16; s++)
        atomic_store(&c->slots[s].accessed, 0);
    sfs_cache_set_touch_hook(c, touch_hook, &h);
    /* Blocks 1 and 2 have 5 resident shards; block 3 none. */
    cr_assert_eq(sfs_cache_touch(c, blocks, 3), 5);
    cr_assert_eq(h.calls, 1);
    cr_assert_eq(h.n, 3);
    cr_assert_eq(memcmp(h.ids, blocks, sizeof(blocks)), 0, "the hook got another batch");
    uint32_t marked = 0;
    for (uint32_t s = 0; s < 16; s++)
        marked += atomic_load(&c->slots[s].accessed);
    cr_assert_eq(marked, 5, "Touch marked %u slots", marked);
    struct sfs_lease l;
    cr_assert_eq(sfs_cache_get(c, &other, SFS_GET_NOALLOC, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(atomic_load(&c->slots[l.slot].accessed), 1);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.touched, 5);
    /* A far shard index is still found (the walk covers max_shard). */
    struct sfs_key far = tu_key(3, 100);
    cr_assert_eq(tu_load(c, &far), SFS_OWNER);
    cr_assert_eq(sfs_cache_touch(c, &blocks[2], 1), 1);
    cr_assert_eq(sfs_cache_touch(c, blocks, 0), 0);
    cr_assert_eq(h.calls, 2, "an empty batch is not forwarded");
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Stats across two processes.
 */
struct stats_report {
    struct sfs_stats local, summed;
};

static int stats_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l;
    struct stats_report rep;
    struct sfs_key K1 = tu_key(40, 0), K2 = tu_key(41, 0), K3 = tu_key(42, 0), K4 = tu_key(43, 0);

    TU_CK(sfs_cache_get(c, &K1, 0, 0, &l) == SFS_HIT);
    TU_CK(sfs_cache_release(c, &l) == 0);
    TU_CK(tu_load(c, &K2) == SFS_OWNER);
    TU_CK(sfs_cache_get(c, &K3, 0, 0, &l) == SFS_WAITER);
    TU_CK(sfs_cache_release(c, &l) == 0);
    TU_CK(sfs_cache_get(c, &K4, 0, 0, &l) == SFS_OWNER);
    TU_CK(sfs_cache_fail(c, &l, -EIO) == 0);
    TU_CK(sfs_cache_release(c, &l) == 0);
    sfs_cache_stats_local(c, &rep.local);
    sfs_cache_stats(c, &rep.summed);
    TU_CK(write(a->to_parent, &rep, sizeof(rep)) == sizeof(rep));
    return 0;
}

Test(cache, stats_per_process_and_summed, .timeout = 30)
{
    struct child a = {0};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_key K1 = tu_key(40, 0), K3 = tu_key(42, 0);
    struct sfs_lease l, own3;
    struct stats_report rep;
    struct sfs_stats mine, all, before;

    cr_assert_eq(tu_load(c, &K1), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &K1, 0, 0, &l), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_get(c, &K3, 0, 0, &own3), SFS_OWNER);
    sfs_cache_stats_local(c, &before);
    pid_t pid = fork_child(&a, stats_child);
    cr_assert_eq(read(a.from_child, &rep, sizeof(rep)), (ssize_t)sizeof(rep));
    cr_assert_eq(tu_wait(pid), 0);
    fill_publish(c, &K3, &own3);
    cr_assert_eq(sfs_cache_release(c, &own3), 0);

    /* The child's own counters. */
    cr_assert_eq(rep.local.requests, 4);
    cr_assert_eq(rep.local.hits, 1);
    cr_assert_eq(rep.local.misses, 3);
    cr_assert_eq(rep.local.owner_loads, 2);
    cr_assert_eq(rep.local.waits, 1);
    cr_assert_eq(rep.local.failures, 1);
    cr_assert_eq(rep.local.bytes_read, SHARD);
    /* While both were attached, the sum was parent-so-far + child. */
    cr_assert_eq(rep.summed.requests, before.requests + rep.local.requests);
    cr_assert_eq(rep.summed.hits, before.hits + rep.local.hits);
    cr_assert_eq(rep.summed.misses, before.misses + rep.local.misses);
    cr_assert_eq(rep.summed.bytes_read, before.bytes_read + rep.local.bytes_read);

    sfs_cache_stats_local(c, &mine);
    cr_assert_eq(mine.requests, 3);
    cr_assert_eq(mine.hits, 1);
    cr_assert_eq(mine.misses, 2);
    cr_assert_eq(mine.owner_loads, 2);
    cr_assert_eq(mine.waits, 0);
    cr_assert_eq(mine.failures, 0);
    cr_assert_eq(mine.bytes_read, 2 * SHARD);

    /* The child has detached: its counters stay in the sum. */
    sfs_cache_stats(c, &all);
    cr_assert_eq(all.requests, 7);
    cr_assert_eq(all.hits, 2);
    cr_assert_eq(all.misses, 5);
    cr_assert_eq(all.requests, all.hits + all.misses);
    cr_assert_eq(all.owner_loads, 4);
    cr_assert_eq(all.waits, 1);
    cr_assert_eq(all.failures, 1);
    cr_assert_eq(all.bytes_read, 3 * SHARD);
    cr_assert_eq(all.resident_bytes, 3 * SHARD, "K1, K2, K3 are resident");
    cr_assert_eq(all.capacity_bytes, 8 * SHARD);
    cr_assert_eq(all.prefetched, 0);
    cr_assert_eq(all.prefetch_hits, 0);
    cr_assert_eq(all.evictions, 0);
    cr_assert_eq(all.requests, mine.requests + rep.local.requests);
    cr_assert_eq(all.hits, mine.hits + rep.local.hits);
    cr_assert_eq(all.misses, mine.misses + rep.local.misses);
    cr_assert_eq(all.owner_loads, mine.owner_loads + rep.local.owner_loads);
    cr_assert_eq(all.bytes_read, mine.bytes_read + rep.local.bytes_read);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Lease table exhaustion.
 */

Test(cache, max_leases_enobufs, .timeout = 30)
{
    struct sfs_cache *c = cache_cfg(16, 4);
    struct sfs_lease l[5];

    for (int i = 0; i < 4; i++) {
        struct sfs_key k = tu_key(50 + i, 0);
        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &l[i]), SFS_OWNER);
    }
    struct sfs_key k5 = tu_key(60, 0), k0 = tu_key(50, 0);
    cr_assert_eq(sfs_cache_get(c, &k5, 0, 0, &l[4]), -ENOBUFS);
    cr_assert_eq(sfs_cache_get(c, &k0, 0, 0, &l[4]), -ENOBUFS, "a hit needs a lease too");
    cr_assert_eq(sfs_cache_state(c, &k5), -ENOENT);
    cr_assert_eq(sfs_cache_release(c, &l[1]), 0);
    cr_assert_eq(sfs_cache_get(c, &k5, 0, 0, &l[1]), SFS_OWNER);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Slot addressing.
 */

/* Load one key per slot through c, then check every slot holds its own
 * pattern at the address `expect` computes, with no two slots overlapping. */
static void check_addressing(struct sfs_cache *c, uint32_t nslots, uint32_t per_seg,
                             const int *seg_fds)
{
    struct sfs_lease l[16];
    struct sfs_key k[16];
    struct sfs_cache_info info;

    cr_assert_leq(nslots, 16u);
    sfs_cache_info(c, &info);
    for (uint32_t i = 0; i < nslots; i++) {
        k[i] = tu_key(700 + i, i);
        cr_assert_eq(sfs_cache_get(c, &k[i], 0, 0, &l[i]), SFS_OWNER);
        cr_assert_eq(l[i].slot, i);
        tu_fill(&k[i], sfs_cache_data(c, &l[i]), SHARD);
        cr_assert_eq(sfs_cache_publish(c, &l[i], SHARD, 0), 0);
    }
    for (uint32_t i = 0; i < nslots; i++) {
        uint8_t *p = sfs_cache_data(c, &l[i]);
        size_t len = 0;
        uint8_t *seg = sfs_cache_segment(c, i / per_seg, &len);

        cr_assert_not_null(seg);
        cr_assert_eq(p, seg + (uint64_t)(i % per_seg) * SHARD, "slot %u at the wrong address", i);
        cr_assert_leq((uint64_t)(i % per_seg + 1) * SHARD, len);
        for (uint32_t j = 0; j < i; j++) {
            uint8_t *q = sfs_cache_data(c, &l[j]);
            cr_assert(p + SHARD <= q || q + SHARD <= p, "slots %u and %u overlap", i, j);
        }
        cr_assert_eq(tu_check(&k[i], p, SHARD), -1, "slot %u overwritten", i);
        if (seg_fds) {
            /* The bytes are in the right memfd at the right offset. */
            uint8_t buf[SHARD];
            cr_assert_eq(pread(seg_fds[i / per_seg], buf, SHARD, (off_t)(i % per_seg) * SHARD),
                         (ssize_t)SHARD);
            cr_assert_eq(tu_check(&k[i], buf, SHARD), -1, "slot %u not in its segment", i);
        }
    }
    for (uint32_t i = 0; i < nslots; i++)
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
}

Test(cache, addressing_power_of_two_segments, .timeout = 30)
{
    struct sfs_cache_config cfg = {.shard_size = SHARD,
                                   .nslots = 8,
                                   .no_reserved = true,
                                   .segment_size = 2 * SHARD,
                                   .hugepages = SFS_HUGEPAGES_OFF};
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);
    struct sfs_cache_info info;

    cr_assert_not_null(c, "%s", strerror(-err));
    sfs_cache_info(c, &info);
    cr_assert_eq(info.nsegments, 4);
    cr_assert_eq(c->slots_per_seg, 2);
    cr_assert_eq(c->seg_shift, 1, "shift + mask path expected");
    check_addressing(c, 8, 2, c->seg_fds);
    sfs_cache_close(c);
}

Test(cache, addressing_non_power_of_two_one_segment, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(6, 0, SHARD);

    cr_assert_not_null(c);
    cr_assert_eq(c->slots_per_seg, 6);
    cr_assert_eq(c->seg_shift, 0, "div/mod path expected");
    check_addressing(c, 6, 6, c->seg_fds);
    sfs_cache_close(c);
}

/*
 * Three slots per segment over two segments: the creator rounds a
 * multi-segment geometry to a power of two, so build the layout by hand in
 * the header (6 slots, 3 per segment) and attach to it with two fresh
 * segment memfds. The attacher validates the header, then addresses with
 * div/mod.
 */
Test(cache, addressing_non_power_of_two_segments, .timeout = 30)
{
    struct sfs_cache *c0 = tu_cache(6, 0, SHARD);
    int fds[2], mine[2], err = 0;

    cr_assert_not_null(c0);
    cr_assert_geq(c0->seg_size, 3 * SHARD);
    c0->hdr->slots_per_segment = 3;
    c0->hdr->nsegments = 2;
    for (int i = 0; i < 2; i++) {
        fds[i] = memfd_create("test-seg", MFD_CLOEXEC);
        cr_assert_geq(fds[i], 0);
        cr_assert_eq(ftruncate(fds[i], (off_t)c0->seg_size), 0);
        mine[i] = dup(fds[i]);
    }
    struct sfs_cache *c = sfs_cache_attach_fds(dup(c0->ctl_fd), mine, 2, 0, &err);
    cr_assert_not_null(c, "attach: %s", strerror(-err));
    cr_assert_eq(c->slots_per_seg, 3);
    cr_assert_eq(c->nsegments, 2);
    cr_assert_eq(c->seg_shift, 0, "div/mod path expected");
    check_addressing(c, 6, 3, fds);
    sfs_cache_close(c);
    close(fds[0]);
    close(fds[1]);
    sfs_cache_close(c0);
}

/* sfs_dp_addr itself: both paths against the arithmetic, with fake bases. */
Test(cache, addressing_function_both_paths, .timeout = 30)
{
    static uint8_t segs[4][1 << 16];
    uint8_t *bases[4] = {segs[0], segs[1], segs[2], segs[3]};
    struct sfs_cache f = {.seg_base = bases, .stride = 4096};

    f.slots_per_seg = 3; /* div/mod */
    for (uint32_t s = 0; s < 12; s++)
        cr_assert_eq(sfs_dp_addr(&f, s), bases[s / 3] + (s % 3) * 4096u, "div/mod slot %u", s);
    f.slots_per_seg = 4; /* shift + mask */
    f.seg_shift = 2;
    f.seg_mask = 3;
    for (uint32_t s = 0; s < 16; s++)
        cr_assert_eq(sfs_dp_addr(&f, s), bases[s / 4] + (s % 4) * 4096u, "shift slot %u", s);
}

/* ---------------------------------------------------------------------------
 * Hex ids.
 */

Test(cache, block_hex_round_trip, .timeout = 30)
{
    char hex[SFS_BLOCK_HEX_LEN + 1];
    struct sfs_block_id id = tu_block(77), back;

    for (int n = 0; n < 100; n++) {
        id = tu_block((uint64_t)n * 7919);
        sfs_block_to_hex(&id, hex);
        cr_assert_eq(strlen(hex), SFS_BLOCK_HEX_LEN);
        for (int i = 0; i < SFS_BLOCK_HEX_LEN; i++)
            cr_assert((hex[i] >= '0' && hex[i] <= '9') || (hex[i] >= 'a' && hex[i] <= 'f'),
                      "not lowercase hex: %s", hex);
        memset(&back, 0, sizeof(back));
        cr_assert_eq(sfs_block_from_hex(hex, SFS_BLOCK_HEX_LEN, &back), 0);
        cr_assert_eq(memcmp(&back, &id, sizeof(id)), 0);
    }
    struct sfs_block_id z = {{0x00, 0x01, 0xab, 0xff}};
    sfs_block_to_hex(&z, hex);
    cr_assert_str_eq(hex, "0001abff000000000000000000000000");
    cr_assert_eq(sfs_block_from_hex("0001ABFF000000000000000000000000", 32, &back), 0);
    cr_assert_eq(memcmp(&back, &z, sizeof(z)), 0);
    /* Rejected: wrong length, non-hex, NULL. */
    cr_assert_eq(sfs_block_from_hex(hex, 31, &back), -EINVAL);
    cr_assert_eq(sfs_block_from_hex("0001abff0000000000000000000000000", 33, &back), -EINVAL);
    cr_assert_eq(sfs_block_from_hex("0001abff00000000000000000000000g", 32, &back), -EINVAL);
    cr_assert_eq(sfs_block_from_hex("0001abff00000000 000000000000000", 32, &back), -EINVAL);
    cr_assert_eq(sfs_block_from_hex("-001abff000000000000000000000000", 32, &back), -EINVAL);
    cr_assert_eq(sfs_block_from_hex(NULL, 32, &back), -EINVAL);
}

/* ---------------------------------------------------------------------------
 * Huge pages.
 */

static long hugepages_free(void)
{
    FILE *f = fopen("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "r");
    long n = 0;

    if (!f)
        return 0;
    if (fscanf(f, "%ld", &n) != 1)
        n = 0;
    fclose(f);
    return n;
}

static void check_data_works(struct sfs_cache *c)
{
    struct sfs_key k = tu_key(900, 1);

    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    assert_hit(c, &k);
}

Test(cache, hugepages_on, .timeout = 30)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = 8, .no_reserved = true, .hugepages = SFS_HUGEPAGES_ON};
    struct sfs_cache_info info;
    int err = 0;
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    if (!c && err == -ENOMEM)
        cr_skip_test("no huge pages reserved (vm.nr_hugepages, %ld free): "
                     "SFS_HUGEPAGES_ON correctly refused with -ENOMEM",
                     hugepages_free());
    cr_assert_not_null(c, "create with huge pages: %s", strerror(-err));
    sfs_cache_info(c, &info);
    cr_assert(info.hugepages, "ON must give a huge-page data plane");
    check_data_works(c);
    sfs_cache_close(c);
}

Test(cache, hugepages_auto_falls_back, .timeout = 30)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD, .nslots = 8, .no_reserved = true, .hugepages = SFS_HUGEPAGES_AUTO};
    struct sfs_cache_info info;
    int err = 0;
    long free0 = hugepages_free();
    struct sfs_cache *c = sfs_cache_create(&cfg, &err);

    cr_assert_not_null(c, "AUTO must always work: %s", strerror(-err));
    sfs_cache_info(c, &info);
    if (free0 == 0)
        cr_assert_not(info.hugepages, "no huge pages free, yet the data plane claims them");
    check_data_works(c);
    sfs_cache_close(c);

    cfg.hugepages = SFS_HUGEPAGES_OFF;
    c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(c);
    sfs_cache_info(c, &info);
    cr_assert_not(info.hugepages);
    sfs_cache_close(c);
    cfg.hugepages = 7;
    cr_assert_null(sfs_cache_create(&cfg, &err));
    cr_assert_eq(err, -EINVAL);
}

/* ---------------------------------------------------------------------------
 * Waiting on many keys at once: one sleep, woken by whichever is published
 * first, never held behind a slow key.
 */

static int wait_any_child(struct sfs_cache *c, struct child *a)
{
    struct sfs_lease l[3];
    int st = -1;

    for (int i = 0; i < 3; i++) {
        struct sfs_key k = tu_key(40 + i, 0);
        TU_CK(sfs_cache_get(c, &k, 0, 0, &l[i]) == SFS_WAITER);
    }
    sig(a->to_parent);
    /* The parent publishes key 2 first, then key 0 (failed), and key 1 late. */
    TU_CK(sfs_cache_wait_any(c, l, 3, sfs_deadline_after(5000 * MS), &st) == 2);
    TU_CK(st == SFS_WAIT_READY);
    struct sfs_key k2 = tu_key(42, 0);
    TU_CK(tu_check(&k2, sfs_cache_data(c, &l[2]), SHARD) == -1);
    sig(a->to_parent);
    TU_CK(sfs_cache_wait_any(c, l, 2, sfs_deadline_after(5000 * MS), &st) == 0);
    TU_CK(st == SFS_WAIT_FAILED && sfs_cache_error(c, &l[0]) == -EIO);
    /* Key 1 is still loading: a short deadline times out. */
    int64_t t0 = sfs_now_ns();
    TU_CK(sfs_cache_wait_any(c, &l[1], 1, sfs_deadline_after(100 * MS), &st) == -ETIMEDOUT);
    TU_CK(sfs_now_ns() - t0 >= 90 * MS);
    sig(a->to_parent);
    TU_CK(sfs_cache_wait_any(c, &l[1], 1, sfs_deadline_after(5000 * MS), &st) == 0);
    TU_CK(st == SFS_WAIT_READY);
    for (int i = 0; i < 3; i++)
        TU_CK(sfs_cache_release(c, &l[i]) == 0);
    TU_CK(sfs_cache_wait_any(c, l, 0, 0, &st) == -EINVAL);
    return 0;
}

Test(cache, wait_any_wakes_on_first_published, .timeout = 30)
{
    struct child a = {0};
    struct sfs_cache *c = served(&a, 8);
    struct sfs_lease own[3];

    for (int i = 0; i < 3; i++) {
        struct sfs_key k = tu_key(40 + i, 0);
        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &own[i]), SFS_OWNER);
    }
    pid_t pid = fork_child(&a, wait_any_child);
    cr_assert(await_fd(a.from_child));
    sleep_ms(30);
    struct sfs_key k2 = tu_key(42, 0);
    fill_publish(c, &k2, &own[2]);
    cr_assert(await_fd(a.from_child), "the child woke for key 2 alone");
    cr_assert_eq(sfs_cache_fail(c, &own[0], -EIO), 0);
    cr_assert(await_fd(a.from_child));
    struct sfs_key k1 = tu_key(41, 0);
    fill_publish(c, &k1, &own[1]);
    cr_assert_eq(tu_wait(pid), 0);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sfs_cache_release(c, &own[i]), 0);
    sfs_cache_close(c);
}

/* A thread keeps one spare lease entry; when it exits the entry goes back to
 * its cache, so short-lived threads (FUSE workers) never leak entries. */
static void *get_release_thread(void *p)
{
    struct sfs_cache *c = p;
    struct sfs_key k = tu_key(77, 0);
    struct sfs_lease l;

    if (sfs_cache_get(c, &k, 0, 0, &l) < 0)
        return (void *)1;
    return (void *)(intptr_t)sfs_cache_release(c, &l);
}

Test(cache, thread_exit_returns_spare_entry, .timeout = 30)
{
    struct sfs_cache *c = cache_cfg(8, 2);
    struct sfs_key k = tu_key(77, 0);
    struct sfs_lease a, b;
    void *ret;

    cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    for (int i = 0; i < 8; i++) {
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, get_release_thread, c), 0);
        cr_assert_eq(pthread_join(t, &ret), 0);
        cr_assert_null(ret);
    }
    /* Both entries are free again: two leases at once. */
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &a), SFS_HIT);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &b), SFS_HIT, "an exited thread kept an entry");
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &(struct sfs_lease){0}), -ENOBUFS);
    cr_assert_eq(sfs_cache_release(c, &a), 0);
    cr_assert_eq(sfs_cache_release(c, &b), 0);
    sfs_cache_close(c);
}

/* A doorbell in the waiter's own memory wakes wait_any_bell, so another
 * thread can hand it more work without a publish. */
struct bell_arg {
    struct sfs_cache *c;
    struct sfs_lease l;
    uint32_t bell;
    int first, second, state;
    int64_t rung_ns, woke_ns;
};

static void *bell_waiter(void *p)
{
    struct bell_arg *a = p;
    uint32_t seen = __atomic_load_n(&a->bell, __ATOMIC_ACQUIRE);

    a->first = sfs_cache_wait_any_bell(a->c, &a->l, 1, sfs_deadline_after(5000 * MS), &a->state,
                                       &a->bell, seen);
    a->woke_ns = sfs_now_ns();
    seen = __atomic_load_n(&a->bell, __ATOMIC_ACQUIRE);
    a->second = sfs_cache_wait_any_bell(a->c, &a->l, 1, sfs_deadline_after(5000 * MS),
                                        &a->state, &a->bell, seen);
    return NULL;
}

Test(cache, wait_any_bell_wakes_on_ring_then_publish, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_key k = tu_key(91, 0);
    struct sfs_lease own;
    struct bell_arg a = {.c = c};
    pthread_t t;
    int st;

    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &own), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &a.l), SFS_WAITER);
    cr_assert_eq(pthread_create(&t, NULL, bell_waiter, &a), 0);
    sleep_ms(50);
    a.rung_ns = sfs_now_ns();
    sfs_bell_ring(&a.bell);
    sleep_ms(50);
    cr_assert_eq(a.first, 1, "the ring is reported as index n");
    cr_assert(a.woke_ns - a.rung_ns < 20 * MS, "woke %lld us after the ring",
              (long long)(a.woke_ns - a.rung_ns) / 1000);
    fill_publish(c, &k, &own);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert_eq(a.second, 0);
    cr_assert_eq(a.state, SFS_WAIT_READY);
    /* A bell alone: times out, or returns 0 (= n) when rung before. */
    uint32_t bell = 0;
    cr_assert_eq(sfs_cache_wait_any_bell(c, NULL, 0, sfs_deadline_after(20 * MS), &st, &bell, 0),
                 -ETIMEDOUT);
    sfs_bell_ring(&bell);
    cr_assert_eq(sfs_cache_wait_any_bell(c, NULL, 0, sfs_deadline_after(20 * MS), &st, &bell, 0),
                 0);
    cr_assert_eq(sfs_cache_wait_any_bell(c, NULL, 0, 0, &st, NULL, 0), -EINVAL);
    cr_assert_eq(sfs_cache_release(c, &a.l), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    sfs_cache_close(c);
}
