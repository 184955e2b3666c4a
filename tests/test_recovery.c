/* SPDX-License-Identifier: MIT */
/*
 * test_recovery.c - recovery in the core (docs/recovery.md): waits that sleep, locks
 * with deadlines, an evictor's window, a lost wakeup, hostile headers and
 * impossible states, and leases counted exactly once.
 *
 * The races are made deterministic with the crash/fault points of
 * core/base/testpoint_i.h (this program links the hooks build of the core): a
 * forked child dies (SIGKILL) or stops (SIGSTOP) at one named instruction, or
 * a callback opens a race window on purpose. The server (a thread of this
 * test process) reaps a child's record when its connection closes; tests
 * that time a reap hold that reaper (tu_hold_reaper) and reap from the
 * test's own thread. Each section names the finding its tests hold; each
 * test failed on the code before its fix, except
 * orphan_of_a_killed_evictor_is_reclaimed_unleased, which pins down the
 * behaviour the evictor's fix keeps (docs/recovery.md lists them).
 */
#include "slot_i.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHARD 4096u
#define MS    (1000 * 1000ll)
#define SEC   (1000 * MS)

/* Parent <-> children, in shared anonymous memory. */
struct shm {
    char path[128];
    _Atomic uint32_t step; /* child -> parent */
    _Atomic uint32_t go;   /* parent -> child */
    _Atomic int32_t rc;
    _Atomic int64_t ns;
    struct sfs_key key, key2, key3;
    uint32_t slot;
};

static struct shm *sh;

static void shm_new(const char *tag)
{
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    snprintf(sh->path, sizeof(sh->path), "%s", tu_path(tag));
}

static bool wait_until(_Atomic uint32_t *w, uint32_t at_least, int64_t timeout_ns)
{
    int64_t end = sfs_now_ns() + timeout_ns;

    while (atomic_load(w) < at_least) {
        if (sfs_now_ns() > end)
            return false;
        usleep(200);
    }
    return true;
}

static struct sfs_cache *served(uint32_t nslots, const char *tag)
{
    struct sfs_cache *c = tu_cache(nslots, 0, SHARD);

    cr_assert(c);
    shm_new(tag);
    cr_assert_eq(sfs_cache_serve(c, sh->path), 0);
    return c;
}

static int run_body(struct sfs_cache *c, void *arg)
{
    return ((int (*)(struct sfs_cache *))arg)(c);
}

/* A child attached to sh->path running body(c); exit 10 if it cannot attach. */
static pid_t child(int (*body)(struct sfs_cache *c))
{
    return tu_fork_attached(sh->path, 1, run_body, (void *)body);
}

/* The slot key k is on (lock-free read: call when quiet), or SFS_NIL. */
static uint32_t slot_of(struct sfs_cache *c, const struct sfs_key *k)
{
    for (uint32_t s = 0; s < c->nslots; s++) {
        struct sfs_slot_rec *sl = &c->slots[s];

        if (atomic_load(&sl->bucket) != SFS_NIL && atomic_load(&sl->state) != SFS_STATE_FREE &&
            sl->shard == k->shard && memcmp(sl->block, k->block.b, SFS_BLOCK_ID_LEN) == 0)
            return s;
    }
    return SFS_NIL;
}

/* A key numbered from `from` whose bucket differs from k's. */
static struct sfs_key key_elsewhere(struct sfs_cache *c, const struct sfs_key *k, uint64_t from)
{
    for (uint64_t i = from;; i++) {
        struct sfs_key o = tu_key(i, 0);

        if (bucket_of(c, &o) != bucket_of(c, k))
            return o;
    }
}

/* ---------------------------------------------------------------------------
 * Finding 7: a process stopped inside a bucket's critical section blocked
 * every Get past its deadline, and the reaper with it. Also finding 12: a
 * lease whose lock is out of reach is neither leaked nor waited for.
 */

/* Takes A's bucket lock in a Get and stops there (SIGSTOP). */
static int stop_in_get(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_testpoint_arm("get:locked", SFS_TP_STOP, NULL, NULL);
    sfs_cache_get(c, &sh->key, 0, 0, &l);
    return 0;
}

static void tp_nothing(const char *name, void *arg)
{
    (void)name;
    (void)arg;
}

/* Holds a lease on A, then dies (its lease is for the reaper). */
static int lease_and_die(struct sfs_cache *c)
{
    struct sfs_lease l;

    /* A counted lease (the locked path's): one a reap must take the bucket
     * lock to drop (a lock-free hit's is freed without it). */
    sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL);
    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &l) == SFS_HIT);
    sfs_testpoint_disarm_all();
    atomic_store(&sh->step, 1);
    for (;;)
        pause();
}

/* With A's lock held by a stopped process: a Get with a 0.5 s deadline,
 * timed, on the locked path (armed "get:locked" forces it); then the
 * lock-free hit, which needs no lock at all. */
static int get_past_stopped(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL);
    int64_t t0 = sfs_now_ns();
    int r = sfs_cache_get(c, &sh->key, 0, t0 + 500 * MS, &l);

    atomic_store(&sh->ns, sfs_now_ns() - t0);
    atomic_store(&sh->rc, r);
    TU_CK(r == -ETIMEDOUT);
    sfs_testpoint_arm("get:locked", SFS_TP_OFF, NULL, NULL);
    TU_CK(sfs_cache_get(c, &sh->key, 0, sfs_now_ns() + 500 * MS, &l) == SFS_HIT);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

static pid_t stopped_pid;

/* A failed assertion must not leave a stopped child holding our stderr. */
static void kill_stopped(void)
{
    if (stopped_pid > 0)
        kill(stopped_pid, SIGKILL);
    stopped_pid = 0;
}

/* Stop a child running body (which stops itself holding a lock). */
static pid_t stopped_child(int (*body)(struct sfs_cache *c))
{
    pid_t s = child(body);
    int st;

    stopped_pid = s;
    cr_assert_eq(waitpid(s, &st, WUNTRACED), s);
    cr_assert(WIFSTOPPED(st), "the holder did not stop (status %#x)", st);
    return s;
}

/* Stop a child inside A's bucket lock; returns its pid. */
static pid_t stopped_holder(void)
{
    return stopped_child(stop_in_get);
}

struct watchdog {
    _Atomic bool done, fired;
};

/* Kills the stopped holder if the reap it watches is still running after
 * 10 s, so that the reap can end and the test fail with a message. */
static void *watchdog_main(void *arg)
{
    struct watchdog *w = arg;

    for (int i = 0; i < 10000 && !atomic_load(&w->done); i++)
        usleep(1000);
    if (!atomic_load(&w->done)) {
        atomic_store(&w->fired, true);
        if (stopped_pid > 0)
            kill(stopped_pid, SIGKILL);
    }
    return NULL;
}

/*
 * One pass of the server's reaper, from the test's own thread in this
 * process (the server's), timed: its result, *ns the time it took. With the
 * reaper thread held (tu_hold_reaper), this is the only reap.
 */
static int reap_now(struct sfs_cache *c, int64_t *ns)
{
    struct watchdog w = {false, false};
    pthread_t th;

    cr_assert_eq(pthread_create(&th, NULL, watchdog_main, &w), 0);
    int64_t t0 = sfs_now_ns();
    int r = sfs_cache_reap(c);

    *ns = sfs_now_ns() - t0;
    atomic_store(&w.done, true);
    pthread_join(th, NULL);
    cr_assert(!atomic_load(&w.fired), "the reaper waited on the stopped holder (%.1f s)",
              *ns / 1e9);
    return r;
}

/* The state of the record that a killed child held: the one record neither
 * FREE nor ALIVE. */
static uint32_t dead_record_state(struct sfs_cache *c)
{
    uint32_t st = PROC_FREE;

    for (uint32_t i = 0; i < c->max_procs; i++) {
        uint32_t s = atomic_load(&c->procs[i].state);

        if (s != PROC_FREE && s != PROC_ALIVE)
            st = s;
    }
    return st;
}

Test(recovery, stopped_lock_holder_delays_nobody_past_deadline, .timeout = 60, .fini = kill_stopped)
{
    struct sfs_cache *c = served(8, "stop.sock");
    struct sfs_lease l;
    int64_t reap_ns;

    sh->key = tu_key(7, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    tu_hold_reaper(true); /* the reap timed below is the only one */
    pid_t dead = child(lease_and_die);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC));
    kill(dead, SIGKILL);
    cr_assert_eq(tu_wait(dead), 128 + SIGKILL);
    tu_wait_marked_dead(c, 1);
    pid_t s = stopped_holder();

    pid_t m = child(get_past_stopped);
    int st = tu_wait_for(m, 10 * SEC);
    int reaped = reap_now(c, &reap_ns);
    fprintf(stderr, "stopped holder: Get returned %d after %.1f ms, reap took %.1f ms\n",
            atomic_load(&sh->rc), atomic_load(&sh->ns) / 1e6, reap_ns / 1e6);
    cr_assert_eq(st, 0, "measuring child: %d (-1: it hung on the lock)", st);
    cr_assert_lt(atomic_load(&sh->ns), 3 * SEC);
    cr_assert_lt(reap_ns, SEC, "the reaper waited on the stopped holder");
    /* Part-way: not counted, and declared dead still, for the next pass. */
    cr_assert_eq(reaped, 0, "a record freed with a lease behind the stopped holder's lock");
    cr_assert_eq(dead_record_state(c), PROC_DEAD);

    /* The holder dies: the next locker repairs, and the server's reaper
     * finishes the dead lease holder's record that the busy lock had held
     * back. */
    kill(s, SIGKILL);
    cr_assert_eq(tu_wait(s), 128 + SIGKILL);
    tu_hold_reaper(false);
    tu_wait_reaped(c, 2);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l), SFS_HIT);
    cr_assert_eq(tu_check(&sh->key, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    struct sfs_stats stats;
    sfs_cache_stats(c, &stats);
    cr_assert_eq(stats.reaped, 2); /* the dead lease holder and the stopped one */
    sfs_cache_close(c);
}

/* Holds a lease on A; releases it while A's lock is held by a stopped
 * process (timed), then after the holder died releases another lease and
 * checks A's count went down. */
static int release_behind_stopped(struct sfs_cache *c)
{
    struct sfs_lease l, o;

    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &l) == SFS_HIT);
    atomic_store(&sh->step, 1);
    TU_CK(wait_until(&sh->go, 1, 10 * SEC));
    int64_t t0 = sfs_now_ns();
    int r = sfs_cache_release(c, &l);

    atomic_store(&sh->ns, sfs_now_ns() - t0);
    TU_CK(r == 0);
    TU_CK(sfs_cache_release(c, &l) == -EINVAL); /* released: no longer a lease */
    atomic_store(&sh->step, 2);
    TU_CK(wait_until(&sh->go, 2, 10 * SEC));
    TU_CK(sfs_cache_get(c, &sh->key2, 0, 0, &o) == SFS_HIT);
    TU_CK(sfs_cache_release(c, &o) == 0); /* finishes the deferred one */
    TU_CK(tu_leases_on(c, sh->slot) == 0);
    TU_CK(atomic_load(&c->deferred) == 0);
    return 0;
}

Test(recovery, release_behind_stopped_holder_is_deferred_not_leaked, .timeout = 60,
     .fini = kill_stopped)
{
    struct sfs_cache *c = served(8, "defer.sock");

    sh->key = tu_key(7, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    sh->key2 = key_elsewhere(c, &sh->key, 100);
    cr_assert_eq(tu_load(c, &sh->key2), SFS_OWNER);
    sh->slot = slot_of(c, &sh->key);
    pid_t r = child(release_behind_stopped);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC));
    pid_t s = stopped_holder();

    atomic_store(&sh->go, 1);
    bool released = wait_until(&sh->step, 2, 5 * SEC);
    fprintf(stderr, "release behind a stopped holder returned after %.1f ms\n",
            atomic_load(&sh->ns) / 1e6);
    kill(s, SIGKILL);
    cr_assert_eq(tu_wait(s), 128 + SIGKILL);
    cr_assert(released, "the release blocked on the stopped holder");
    cr_assert_lt(atomic_load(&sh->ns), 3 * SEC);
    atomic_store(&sh->go, 2);
    cr_assert_eq(tu_wait_for(r, 10 * SEC), 0);
    tu_wait_reaped(c, 1); /* the stopped holder's record */
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* Owns A (Loading) and waits to be killed. */
static int own_and_park(struct sfs_cache *c)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &l) == SFS_OWNER);
    atomic_store(&sh->step, 1);
    for (;;)
        pause();
}

/* Waits on A once told to; its owner is dead and A's lock is held by a
 * stopped process, so the takeover cannot happen before the deadline. */
static int wait_past_dead_owner(struct sfs_cache *c)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &l) == SFS_WAITER);
    atomic_store(&sh->step, 2);
    TU_CK(wait_until(&sh->go, 1, 10 * SEC));
    int64_t t0 = sfs_now_ns();
    int r = sfs_cache_wait(c, &l, t0 + 500 * MS);

    atomic_store(&sh->ns, sfs_now_ns() - t0);
    atomic_store(&sh->rc, r);
    return 2; /* no close: it would wait for the stopped holder's lock */
}

Test(recovery, takeover_behind_a_stopped_holder_ends_at_the_deadline, .timeout = 60,
     .fini = kill_stopped)
{
    struct sfs_cache *c = served(8, "takeover.sock");

    sh->key = tu_key(11, 0);
    pid_t o = child(own_and_park);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC));
    pid_t w = child(wait_past_dead_owner);
    cr_assert(wait_until(&sh->step, 2, 5 * SEC));
    kill(o, SIGKILL);
    cr_assert_eq(tu_wait(o), 128 + SIGKILL);
    pid_t s = stopped_holder();
    atomic_store(&sh->go, 1);
    int st = tu_wait_for(w, 10 * SEC);

    fprintf(stderr, "takeover behind a stopped holder: wait returned %d after %.1f ms\n",
            atomic_load(&sh->rc), atomic_load(&sh->ns) / 1e6);
    cr_assert_eq(st, 2, "waiter: %d (-1: it hung)", st);
    cr_assert_eq(atomic_load(&sh->rc), -ETIMEDOUT);
    cr_assert_lt(atomic_load(&sh->ns), 3 * SEC);
    kill(s, SIGKILL);
    cr_assert_eq(tu_wait(s), 128 + SIGKILL);
    tu_wait_reaped(c, 3); /* the owner, the waiter (it exits without a close), the holder */
    struct sfs_lease l;
    int role = sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l);
    cr_assert_eq(role, SFS_OWNER, "A is taken over after all: %d", role);
    cr_assert_eq(tu_publish(c, &sh->key, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* Closes its handle and stops inside the fold of its counters, holding the
 * header's proc_lock. */
static int stop_in_fold(struct sfs_cache *c)
{
    sfs_testpoint_arm("proc:fold", SFS_TP_STOP, NULL, NULL);
    return 0; /* tu_fork_attached closes the handle: the fold stops there */
}

Test(recovery, reaper_passes_a_stopped_proc_lock_holder, .timeout = 60, .fini = kill_stopped)
{
    struct sfs_cache *c = served(8, "fold.sock");
    struct sfs_stats stats;
    int64_t reap_ns;

    sh->key = tu_key(7, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    tu_hold_reaper(true); /* the reap timed below is the only one */
    pid_t dead = child(lease_and_die);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC));
    kill(dead, SIGKILL);
    cr_assert_eq(tu_wait(dead), 128 + SIGKILL);
    tu_wait_marked_dead(c, 1);
    pid_t s = stopped_child(stop_in_fold);

    int reaped = reap_now(c, &reap_ns);
    fprintf(stderr, "stopped proc_lock holder: reap returned %d after %.2f ms\n", reaped,
            reap_ns / 1e6);
    cr_assert_lt(reap_ns, SEC, "the reaper waited on the stopped proc_lock holder");
    cr_assert_eq(reaped, 0, "a record freed without its counters folded");
    cr_assert_eq(dead_record_state(c), PROC_DEAD); /* for the next pass */

    kill(s, SIGKILL);
    cr_assert_eq(tu_wait(s), 128 + SIGKILL);
    tu_hold_reaper(false);
    tu_wait_reaped(c, 2); /* the lease holder, the stopped one */
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_stats(c, &stats);
    cr_assert_eq(stats.reaped, 2);
    sfs_cache_close(c);
}

/*
 * The merge of the liveness model with the lock deadlines: a reap that a
 * busy lock stops part-way puts the record back to DEAD, and the server's
 * reaper comes back to it on its own (no connection closes to tell it), so
 * a dead rank's leases never leak.
 */

/* Holds a lease on sh->key (Ready) and owns sh->key2 (Loading, another
 * bucket), then parks, to be killed. */
static int lease_own_and_park(struct sfs_cache *c)
{
    struct sfs_lease a, b;

    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &a) == SFS_HIT);
    TU_CK(sfs_cache_get(c, &sh->key2, 0, 0, &b) == SFS_OWNER);
    atomic_store(&sh->step, 1);
    for (;;)
        pause();
}

static void stop_once(const char *name, void *arg)
{
    static bool stopped;

    (void)name;
    (void)arg;
    if (!stopped) {
        stopped = true;
        raise(SIGSTOP);
    }
}

/* Stops holding sh->key3's bucket lock (in a Get of it); continued, it
 * finishes that Get, lets go of the key and stays attached. */
static int stop_in_get_then_stay(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_testpoint_arm("get:locked", SFS_TP_CALL, stop_once, NULL);
    int r = sfs_cache_get(c, &sh->key3, 0, sfs_deadline_after(5 * SEC), &l);
    TU_CK(r == SFS_OWNER);
    TU_CK(tu_publish(c, &sh->key3, &l) == 0);
    TU_CK(sfs_cache_release(c, &l) == 0);
    atomic_store(&sh->step, 2);
    for (;;)
        pause();
}

/* A key numbered from `from` in bucket b, other than k. */
static struct sfs_key key_in_bucket(struct sfs_cache *c, uint32_t b, const struct sfs_key *k,
                                    uint64_t from)
{
    for (uint64_t i = from;; i++) {
        struct sfs_key o = tu_key(i, 0);

        if (bucket_of(c, &o) == b && memcmp(&o, k, sizeof(o)) != 0)
            return o;
    }
}

Test(recovery, partial_reap_is_finished_when_the_lock_holder_goes_on, .timeout = 60,
     .fini = kill_stopped)
{
    struct sfs_cache *c = served(16, "partial.sock");
    struct sfs_stats stats;
    struct sfs_lease l;
    unsigned entries;

    sh->key = tu_key(7, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    sh->key2 = key_elsewhere(c, &sh->key, 100);
    sh->key3 = key_in_bucket(c, bucket_of(c, &sh->key2), &sh->key2, 1000);
    pid_t d = child(lease_own_and_park);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC));
    uint32_t sa = slot_of(c, &sh->key), sb = slot_of(c, &sh->key2);
    cr_assert(sa != SFS_NIL && sb != SFS_NIL);
    pid_t s = stopped_child(stop_in_get_then_stay); /* holds key2's bucket lock */

    kill(d, SIGKILL);
    cr_assert_eq(tu_wait(d), 128 + SIGKILL);
    /* The server reaps at once: key's lease goes, key2's stays behind the
     * stopped holder's lock, and so does the record. */
    for (int i = 0; i < 3000 && tu_leases_on(c, sa) != 0; i++)
        usleep(1000);
    cr_assert_eq(tu_leases_on(c, sa), 0, "the reap did not start");
    usleep(500 * 1000); /* the reaper's retries meet the busy lock */
    cr_assert_eq(tu_leases_on(c, sb), 1);
    sfs_cache_stats(c, &stats);
    cr_assert_eq(stats.reaped, 0, "a record freed with a lease left");
    uint32_t st = dead_record_state(c);
    cr_assert(st == PROC_DEAD || st == PROC_REAPING, "record state %u", st);

    /* The holder goes on and stays attached: no connection closes, and
     * only the reaper's own retry can finish the dead record. */
    kill(s, SIGCONT);
    cr_assert(wait_until(&sh->step, 2, 5 * SEC), "the holder did not go on");
    tu_wait_reaped(c, 1);
    cr_assert_eq(tu_leases_on(c, sb), 0, "the dead rank's lease leaked");
    /* Its half-filled key2 is served again (taken over), key as before. */
    int role = sfs_cache_get(c, &sh->key2, 0, sfs_deadline_after(SEC), &l);
    cr_assert_eq(role, SFS_OWNER, "key2 after the reap: %d", role);
    cr_assert_eq(tu_publish(c, &sh->key2, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_get(c, &sh->key2, 0, sfs_deadline_after(SEC), &l), SFS_HIT);
    cr_assert_eq(tu_check(&sh->key2, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l), SFS_HIT);
    cr_assert_eq(tu_check(&sh->key, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);

    kill_stopped(); /* the holder, running now */
    cr_assert_eq(tu_wait(s), 128 + SIGKILL);
    tu_wait_reaped(c, 2);
    cr_assert_eq(tu_leases_left(c, &entries), 0);
    cr_assert_eq(entries, 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Finding 12: a lease released twice by two threads counts once.
 */

struct double_release {
    struct sfs_cache *c;
    struct sfs_lease l;
    _Atomic int arrived;
    int r;
};

static void *release_racer(void *arg)
{
    struct double_release *d = arg;

    d->r = sfs_cache_release(d->c, &d->l);
    return NULL;
}

/* Hold the first releaser inside its critical section until the second
 * has checked the lease outside it: both passed the lock-free check. */
static void hold_first_releaser(const char *name, void *arg)
{
    struct double_release *d = arg;

    (void)name;
    if (atomic_fetch_add(&d->arrived, 1) == 0)
        usleep(50 * 1000); /* well inside the other's RELEASE_LOCK_NS wait */
}

Test(recovery, lease_released_twice_counts_once, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_key a = tu_key(1, 0);
    struct sfs_lease keep;
    struct double_release d[2];
    pthread_t th[2];

    cr_assert(c);
    cr_assert_eq(tu_load(c, &a), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &a, 0, 0, &keep), SFS_HIT);
    struct sfs_lease l;
    cr_assert_eq(sfs_cache_get(c, &a, 0, 0, &l), SFS_HIT);
    uint32_t s = l.slot;
    cr_assert_eq(tu_leases_on(c, s), 2);
    d[0] = (struct double_release){.c = c, .l = l};
    d[1] = (struct double_release){.c = c, .l = l};
    sfs_testpoint_arm("release:locked", SFS_TP_CALL, hold_first_releaser, &d[0]);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(pthread_create(&th[i], NULL, release_racer, &d[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    sfs_testpoint_disarm_all();
    fprintf(stderr, "double release: %d and %d\n", d[0].r, d[1].r);
    cr_assert((d[0].r == 0 && d[1].r == -EINVAL) || (d[0].r == -EINVAL && d[1].r == 0));
    cr_assert_eq(tu_leases_on(c, s), 1, "one lease dropped twice");
    cr_assert_eq(sfs_cache_remove(c, &a), -EBUSY);
    cr_assert_eq(sfs_cache_release(c, &keep), 0);
    cr_assert_eq(sfs_cache_remove(c, &a), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Finding 9: a leased slot that reads Free (only a bad write does that) is
 * an error, not a loop past the deadline.
 */

static int wait_on_corrupt_free(struct sfs_cache *c)
{
    struct sfs_lease own, w;
    int st;

    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &own) == SFS_OWNER);
    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &w) == SFS_WAITER);
    atomic_store(&c->slots[w.slot].state, SFS_STATE_FREE); /* the bad write */
    TU_CK(sfs_cache_wait(c, &w, sfs_deadline_after(200 * MS)) == -EBADMSG);
    TU_CK(sfs_cache_wait_any(c, &w, 1, sfs_deadline_after(200 * MS), &st) == -EBADMSG);
    atomic_store(&c->slots[w.slot].state, 77); /* out of range */
    TU_CK(sfs_cache_wait(c, &w, sfs_deadline_after(200 * MS)) == -EBADMSG);
    atomic_store(&c->slots[w.slot].state, SFS_STATE_LOADING);
    TU_CK(sfs_cache_wait(c, &w, sfs_deadline_after(50 * MS)) == -ETIMEDOUT);
    TU_CK(tu_publish(c, &sh->key, &own) == 0);
    TU_CK(sfs_cache_wait(c, &w, sfs_deadline_after(SEC)) == SFS_WAIT_READY);
    sfs_cache_release(c, &w);
    sfs_cache_release(c, &own);
    return 0;
}

Test(recovery, leased_slot_reading_free_is_ebadmsg, .timeout = 30)
{
    struct sfs_cache *c = served(8, "free.sock");

    sh->key = tu_key(9, 0);
    /* In a child: the code before the fix spun here forever. */
    pid_t w = child(wait_on_corrupt_free);
    cr_assert_eq(tu_wait_for(w, 5 * SEC), 0, "the waiter spun or failed");
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Finding 8: a crafted header is refused at attach, not trusted.
 */

/* Attach through the fds with the header patched by patch(); restore. */
static int attach_patched(struct sfs_cache *c, void (*patch)(struct sfs_header *h))
{
    struct sfs_header saved = *c->hdr;
    int fds[8], err = 0;

    cr_assert_leq(c->nsegments, 8);
    for (uint32_t i = 0; i < c->nsegments; i++)
        fds[i] = dup(c->seg_fds[i]);
    patch(c->hdr);
    struct sfs_cache *a = sfs_cache_attach_fds(dup(c->ctl_fd), fds, c->nsegments, 0, &err);
    *c->hdr = saved;
    if (a) {
        sfs_cache_close(a);
        return 0;
    }
    return err;
}

static void patch_none(struct sfs_header *h)
{
    (void)h;
}

static void patch_huge_stride(struct sfs_header *h)
{
    h->stride = 1ull << 61; /* slots_per_segment * stride wraps */
}

static void patch_double_stride(struct sfs_header *h)
{
    h->stride *= 2; /* still fits the segment: only equality refuses it */
}

static void patch_big_segment(struct sfs_header *h)
{
    h->segment_size *= 2;
}

static void patch_sps_beyond_slots(struct sfs_header *h)
{
    h->slots_per_segment = h->nslots * 4;
}

Test(recovery, crafted_header_is_refused, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(16, 0, SHARD);

    cr_assert(c);
    cr_assert_eq(attach_patched(c, patch_none), 0, "the genuine header is refused");
    cr_assert_eq(attach_patched(c, patch_huge_stride), -EBADMSG);
    cr_assert_eq(attach_patched(c, patch_double_stride), -EBADMSG);
    cr_assert_eq(attach_patched(c, patch_big_segment), -EBADMSG);
    cr_assert_eq(attach_patched(c, patch_sps_beyond_slots), -EBADMSG);
    cr_assert_eq(attach_patched(c, patch_none), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Finding 3: an evictor killed inside its unlink/relink left a leased slot
 * off every chain, and the next Get of its key became a second owner.
 */

static void candidate_leased_now(const char *name, void *arg)
{
    static bool once;

    (void)name;
    (void)arg;
    if (once)
        return;
    once = true;
    /* The scan saw the victim unleased; the parent leases it now. */
    atomic_store(&sh->step, 1);
    for (int i = 0; i < 25000 && !atomic_load(&sh->go); i++)
        usleep(200);
}

/* Evicts for sh->key2 with A's slot the only candidate; dies if it unlinks. */
static int evict_with_kill_at_unlink(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_testpoint_arm("evict:candidate", SFS_TP_CALL, candidate_leased_now, NULL);
    sfs_testpoint_arm("evict:unlinked", SFS_TP_KILL, NULL, NULL);
    int r = sfs_cache_get(c, &sh->key2, 0, 0, &l);
    atomic_store(&sh->rc, r);
    TU_CK(r == -ENOSPC); /* every slot leased: nothing to evict */
    return 0;
}

Test(recovery, evictor_never_unlinks_a_leased_slot, .timeout = 30)
{
    struct sfs_cache *c = served(2, "evict.sock");
    struct sfs_key a = tu_key(1, 0), k = tu_key(2, 0);
    struct sfs_lease la, lk, l2;

    cr_assert_eq(tu_load(c, &a), SFS_OWNER); /* Ready, unleased */
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &lk), SFS_OWNER);
    sh->key2 = key_elsewhere(c, &a, 100);
    uint32_t sa = slot_of(c, &a);

    pid_t ev = child(evict_with_kill_at_unlink);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC), "the evictor never chose a victim");
    cr_assert_eq(sfs_cache_get(c, &a, 0, 0, &la), SFS_HIT);
    atomic_store(&sh->go, 1);
    int st = tu_wait_for(ev, 10 * SEC);

    /* A is where it was, on its chain, leased once: one owner, one slot
     * (before the fix: off every chain, -ENOENT, and the next Get an owner). */
    cr_assert_eq(sfs_cache_state(c, &a), SFS_STATE_READY);
    cr_assert_eq(st, 0, "evictor exit %d (137: killed between unlink and relink)", st);
    cr_assert_eq(slot_of(c, &a), sa);
    cr_assert_eq(tu_leases_on(c, sa), 1);
    cr_assert_eq(sfs_cache_get(c, &a, 0, 0, &l2), SFS_HIT);
    cr_assert_eq(sfs_cache_release(c, &l2), 0);
    cr_assert_eq(sfs_cache_release(c, &la), 0);
    cr_assert_eq(tu_publish(c, &k, &lk), 0);
    cr_assert_eq(sfs_cache_release(c, &lk), 0);
    struct sfs_stats stats;
    sfs_cache_stats(c, &stats);
    cr_assert_eq(stats.reaped, 0); /* the evictor detached cleanly: nothing to reap */
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

static int evict_and_die_at_unlink(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_testpoint_arm("evict:unlinked", SFS_TP_KILL, NULL, NULL);
    sfs_cache_get(c, &sh->key2, 0, 0, &l);
    return 1; /* not reached */
}

Test(recovery, orphan_of_a_killed_evictor_is_reclaimed_unleased, .timeout = 30)
{
    struct sfs_cache *c = served(2, "orphan.sock");
    struct sfs_key a = tu_key(1, 0), k = tu_key(2, 0);
    struct sfs_lease lk, lb;

    cr_assert_eq(tu_load(c, &a), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &lk), SFS_OWNER);
    sh->key2 = key_elsewhere(c, &a, 100);
    uint32_t sa = slot_of(c, &a);

    pid_t ev = child(evict_and_die_at_unlink);
    cr_assert_eq(tu_wait_for(ev, 10 * SEC), 128 + SIGKILL);
    /* A's slot is off its chain and names no new one: an orphan. */
    cr_assert_eq(sfs_cache_state(c, &a), -ENOENT);
    /* The next evictor takes the orphan (unleased): B gets a slot. */
    cr_assert_eq(sfs_cache_get(c, &sh->key2, 0, sfs_deadline_after(SEC), &lb), SFS_OWNER);
    cr_assert_eq(lb.slot, sa);
    cr_assert_eq(tu_publish(c, &sh->key2, &lb), 0);
    cr_assert_eq(sfs_cache_release(c, &lb), 0);
    cr_assert_eq(tu_publish(c, &k, &lk), 0);
    cr_assert_eq(sfs_cache_release(c, &lk), 0);
    tu_wait_reaped(c, 1); /* the killed evictor, by the server */
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Finding 4: a release between a full-cache Get's scan and its sleep was
 * lost (release_seq bumped only when a waiter was already counted).
 */

struct release_arg {
    struct sfs_cache *c;
    struct sfs_lease l;
    bool done;
};

static void release_in_window(const char *name, void *arg)
{
    struct release_arg *ra = arg;

    (void)name;
    if (ra->done)
        return;
    ra->done = true;
    cr_assert_eq(sfs_cache_release(ra->c, &ra->l), 0);
}

Test(recovery, release_before_a_full_get_sleeps_is_not_lost, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(1, 0, SHARD);
    struct sfs_key a = tu_key(1, 0), b = tu_key(2, 0);
    struct release_arg ra = {.c = c};
    struct sfs_lease lb;

    cr_assert(c);
    cr_assert_eq(sfs_cache_get(c, &a, 0, 0, &ra.l), SFS_OWNER);
    cr_assert_eq(tu_publish(c, &a, &ra.l), 0);
    /* The only slot is leased: B's Get finds none, and the lease goes in
     * the window between its scan and its sleep. */
    sfs_testpoint_arm("get:full", SFS_TP_CALL, release_in_window, &ra);
    sfs_testpoint_arm("evict:release_sleep", SFS_TP_CALL, NULL, NULL);
    int64_t t0 = sfs_now_ns();
    int role = sfs_cache_get(c, &b, 0, t0 + 5 * SEC, &lb);
    int64_t lat = sfs_now_ns() - t0;
    unsigned slept = sfs_testpoint_hits("evict:release_sleep");

    sfs_testpoint_disarm_all();
    fprintf(stderr, "full Get after a release in the window: %.2f ms, %u sleeps\n", lat / 1e6,
            slept);
    cr_assert(ra.done);
    cr_assert_eq(role, SFS_OWNER);
    cr_assert_eq(slept, 0, "the Get slept a slice after the release it had missed");
    cr_assert_eq(tu_publish(c, &b, &lb), 0);
    cr_assert_eq(sfs_cache_release(c, &lb), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Finding 12, continued: a waiter killed in its sleep, and the bound of a
 * repair under a bucket lock.
 */

static int wait_forever(struct sfs_cache *c)
{
    struct sfs_lease l;

    TU_CK(sfs_cache_get(c, &sh->key, 0, 0, &l) == SFS_WAITER);
    sh->slot = l.slot;
    atomic_store(&sh->step, 1);
    sfs_cache_wait(c, &l, 0);
    return 1;
}

Test(recovery, waiter_killed_in_its_sleep_leaves_no_waiter_count, .timeout = 30)
{
    struct sfs_cache *c = served(8, "nwait.sock");
    struct sfs_lease own;

    sh->key = tu_key(5, 0);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, 0, &own), SFS_OWNER);
    pid_t w = child(wait_forever);
    cr_assert(wait_until(&sh->step, 1, 5 * SEC));
    struct sfs_slot_rec *sl = &c->slots[own.slot];
    for (int i = 0; i < 5000 && atomic_load(&sl->nwaiters) == 0; i++)
        usleep(1000);
    cr_assert_eq(atomic_load(&sl->nwaiters), 1, "the waiter never slept");
    kill(w, SIGKILL);
    cr_assert_eq(tu_wait(w), 128 + SIGKILL);
    tu_wait_reaped(c, 1); /* by the server, as the waiter's connection closes */
    cr_assert_eq(tu_publish(c, &sh->key, &own), 0);
    cr_assert_eq(sfs_cache_release(c, &own), 0);
    /* Nobody leases the slot: nobody can be asleep on it. */
    cr_assert_eq(atomic_load(&sl->nwaiters), 0, "a dead waiter is still counted");
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* Gets sh->key2 in a cache whose only slot is leased: asleep for a free
 * slot (release_waiters raised) until killed. */
static int sleep_for_a_free_slot(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_cache_get(c, &sh->key2, 0, sfs_deadline_after(30 * SEC), &l);
    return 1;
}

Test(recovery, get_killed_asleep_for_a_free_slot_leaves_no_release_waiter, .timeout = 30)
{
    struct sfs_cache *c = served(1, "relwait.sock");
    struct sfs_lease la;

    sh->key = tu_key(1, 0);
    sh->key2 = tu_key(2, 0);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, 0, &la), SFS_OWNER);
    pid_t w = child(sleep_for_a_free_slot);
    for (int i = 0; i < 5000 && atomic_load(&c->hdr->release_waiters) == 0; i++)
        usleep(1000);
    cr_assert_eq(atomic_load(&c->hdr->release_waiters), 1, "the Get never slept");
    kill(w, SIGKILL);
    cr_assert_eq(tu_wait(w), 128 + SIGKILL);
    tu_wait_reaped(c, 1);
    /* Every later last release would make a wake call for nobody. */
    cr_assert_eq(atomic_load(&c->hdr->release_waiters), 0, "a dead Get is still counted");
    cr_assert_eq(tu_publish(c, &sh->key, &la), 0);
    cr_assert_eq(sfs_cache_release(c, &la), 0);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* Dies inside a Get holding sh->key's bucket lock. */
static int die_in_get(struct sfs_cache *c)
{
    struct sfs_lease l;

    sfs_testpoint_arm("get:locked", SFS_TP_KILL, NULL, NULL);
    sfs_cache_get(c, &sh->key, 0, 0, &l);
    return 1;
}

Test(recovery, repair_reads_only_entries_ever_used, .timeout = 30)
{
    struct sfs_cache *c = served(8, "hwm.sock");
    struct sfs_lease l[3], m;

    sh->key = tu_key(3, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    /* Three counted leases (the locked path's: a hit's is in no count). */
    sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sfs_cache_get(c, &sh->key, 0, 0, &l[i]), SFS_HIT);
    sfs_testpoint_disarm_all();
    cr_assert_eq(atomic_load(&c->self->lease_hwm), c->nhit + 3,
                 "high-water mark: the hit lines and 3 leases");
    /* An entry beyond our mark (never written by a Get) and one in a free
     * record's table: repair must not read either. */
    uint32_t s = l[0].slot;
    atomic_store(&c->leases[c->max_leases - 1], s + 1);
    uint32_t free_rec = c->max_procs - 1;
    cr_assert_eq(atomic_load(&c->procs[free_rec].state), PROC_FREE);
    atomic_store(&lease_table(c, free_rec)[c->nhit], s + 1);

    tu_hold_reaper(true); /* the Get below repairs, not the server's reaper */
    pid_t d = child(die_in_get);
    cr_assert_eq(tu_wait_for(d, 10 * SEC), 128 + SIGKILL);
    /* A Ready hit takes no lock: State does, and repairs. */
    cr_assert_eq(sfs_cache_state(c, &sh->key), SFS_STATE_READY);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &m), SFS_HIT);
    cr_assert_eq(tu_leases_on(c, s), 4, "repair counted what no lease holds");
    atomic_store(&c->leases[c->max_leases - 1], SFS_ENTRY_FREE);
    atomic_store(&lease_table(c, free_rec)[c->nhit], SFS_ENTRY_FREE);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
    cr_assert_eq(sfs_cache_release(c, &m), 0);
    tu_hold_reaper(false);
    tu_wait_reaped(c, 1);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}
static int64_t thread_cpu_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * SEC + ts.tv_nsec;
}

/* ---------------------------------------------------------------------------
 * Finding 2: a wait on 128 keys and a bell sleeps (129 futex words > the
 * kernel's 128: every futex_waitv failed with EINVAL and the loop spun).
 */

#define NKEYS SFS_WAIT_ANY_MAX

struct publisher {
    struct sfs_cache *c;
    struct sfs_key key;
    struct sfs_lease lease;
};

static void *publish_later(void *arg)
{
    struct publisher *p = arg;

    usleep(50 * 1000);
    tu_publish(p->c, &p->key, &p->lease);
    return NULL;
}

Test(recovery, wait_on_128_keys_and_a_bell_sleeps, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(2 * NKEYS, 0, SHARD);
    static struct sfs_lease own[NKEYS], wait[NKEYS];
    uint32_t bell = 0;
    int st = -1;

    cr_assert(c);
    /* Our own loads (the owner is alive: us), and a waiter's lease on each. */
    for (uint32_t i = 0; i < NKEYS; i++) {
        struct sfs_key k = tu_key(1000 + i, 0);

        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &own[i]), SFS_OWNER);
        cr_assert_eq(sfs_cache_get(c, &k, 0, 0, &wait[i]), SFS_WAITER);
    }
    int64_t cpu0 = thread_cpu_ns(), t0 = sfs_now_ns();
    int r = sfs_cache_wait_any_bell(c, wait, NKEYS, t0 + 500 * MS, &st, &bell, 0);
    int64_t cpu = thread_cpu_ns() - cpu0, wall = sfs_now_ns() - t0;

    fprintf(stderr, "wait on %d keys + bell: %.1f ms CPU in %.1f ms\n", NKEYS, cpu / 1e6,
            wall / 1e6);
    cr_assert_eq(r, -ETIMEDOUT);
    cr_assert_lt(cpu, wall / 5, "the wait spun: %lld ms CPU in %lld ms", (long long)(cpu / MS),
                 (long long)(wall / MS));

    /* Every key is still seen, the last one (outside the first window) too. */
    struct publisher p = {.c = c, .key = tu_key(1000 + NKEYS - 1, 0), .lease = own[NKEYS - 1]};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, publish_later, &p), 0);
    r = sfs_cache_wait_any_bell(c, wait, NKEYS, sfs_deadline_after(5 * SEC), &st, &bell, 0);
    pthread_join(th, NULL);
    cr_assert_eq(r, NKEYS - 1);
    cr_assert_eq(st, SFS_WAIT_READY);
    /* And the bell. */
    sfs_bell_ring(&bell);
    cr_assert_eq(
        sfs_cache_wait_any_bell(c, wait, NKEYS - 1, sfs_deadline_after(5 * SEC), &st, &bell, 0),
        NKEYS - 1);
    for (uint32_t i = 0; i < NKEYS; i++) {
        cr_assert_eq(sfs_cache_release(c, &wait[i]), 0);
        cr_assert_eq(sfs_cache_release(c, &own[i]), 0);
    }
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}
