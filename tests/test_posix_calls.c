/* SPDX-License-Identifier: MIT */
/*
 * test_posix_calls.c - the deadlines of the posix backend's synchronous
 * calls (posix_call.c): each runs on a helper thread and its caller waits
 * at most the backend's timeout. With every helper stuck, a call still
 * queued at its deadline answers -ETIMEDOUT and never runs; a commit
 * stuck before its commit point stores nothing once its caller gave up;
 * one stuck past it is waited for once more, then given up; an eviction
 * or a remove whose caller gave up removes nothing; a process that
 * cannot start a helper answers -EAGAIN at once. A call runs at its
 * caller's nice value, whatever helpers earlier calls started, and one
 * of another nice is taken by an idle helper when all are of others.
 *
 * Key idea: a commit is held in its helper at a test point
 * ("commit:written", before the commit point; "commit:pending", past it)
 * until the test lets it go, which it does only once the callers have
 * their answers: a hung store on demand, without timing in the asserts.
 * "call:helper" fails the helper's start (a process out of threads).
 */
#include "backendfx.h"
#include "testpoint_i.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>

TestSuite(posix_calls, .init = mkroot, .fini = rmroot, .timeout = 60);

#define HELPERS 8 /* POSIX_HELPERS_MAX */

static atomic_int held, go, left;

/* The point's action: count this helper as held, wait for go, count it as
 * gone on. */
static void hold_here(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    atomic_fetch_add(&held, 1);
    while (!atomic_load(&go))
        usleep(1000);
    atomic_fetch_add(&left, 1);
}

static struct sfs_backend *open_posix(uint32_t timeout_ms)
{
    struct sfs_backend_params bp = {.shard_size = S_SMALL, .timeout_ms = timeout_ms};
    char err[256] = "";
    int e = 0;

    setenv("SHARDFS_POSIX_REMOTE", "0", 1);
    struct sfs_backend *be = sfs_backend_open(g_root, &bp, err, sizeof(err), &e);

    unsetenv("SHARDFS_POSIX_REMOTE");
    cr_assert_not_null(be, "open: %d %s", e, err);
    return be;
}

static int dump(struct sfs_backend *be, uint64_t b, uint32_t s)
{
    struct sfs_key k = mkkey(b, s);
    char *buf = xalloc(S_SMALL);
    int r;

    fill(&k.block, s, 1, buf, S_SMALL);
    r = sfs_backend_dump_sync(be, &k, buf, S_SMALL);
    free(buf);
    return r;
}

struct dumper {
    struct sfs_backend *be;
    uint64_t block;
    int r;
};

static void *dump_thread(void *arg)
{
    struct dumper *d = arg;

    d->r = dump(d->be, d->block, 0);
    return NULL;
}

/*
 * Every helper stuck in a commit (a hung store): their callers get
 * -ETIMEDOUT at their deadline, a further call waits in the queue and
 * gets -ETIMEDOUT too, without ever running; when the store answers
 * again, the stuck commits find their callers gone and store nothing.
 * Every caller told -ETIMEDOUT finds its block absent.
 */
Test(posix_calls, with_every_helper_stuck_calls_time_out_and_store_nothing)
{
    struct sfs_backend *be = open_posix(2000);
    static struct dumper d[HELPERS];
    pthread_t t[HELPERS];

    atomic_store(&held, 0);
    atomic_store(&go, 0);
    cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, hold_here, NULL), 0);
    for (int i = 0; i < HELPERS; i++) {
        d[i] = (struct dumper){.be = be, .block = 100 + (uint64_t)i};
        cr_assert_eq(pthread_create(&t[i], NULL, dump_thread, &d[i]), 0);
    }
    while (atomic_load(&held) < HELPERS)
        usleep(1000);
    /* Queued behind eight stuck helpers: never started. */
    cr_assert_eq(dump(be, 200, 0), -ETIMEDOUT);
    for (int i = 0; i < HELPERS; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(d[i].r, -ETIMEDOUT, "caller %d: %d", i, d[i].r);
    }
    atomic_store(&go, 1);
    sfs_backend_close(be); /* waits a grace for the helpers, now free */
    sfs_testpoint_disarm_all();
    cr_assert_eq(atomic_load(&held), HELPERS, "the queued call ran");
    for (int i = 0; i < HELPERS; i++)
        cr_assert_eq(file_size(0, 100 + (uint64_t)i), -1, "block %d stored after a timeout", i);
    cr_assert_eq(file_size(0, 200), -1);
}

struct late_commit {
    struct sfs_backend *be;
    int r;
    atomic_bool done;
};

static void *late_dump(void *arg)
{
    struct late_commit *c = arg;

    c->r = dump(c->be, 300, 0);
    atomic_store(&c->done, true);
    return NULL;
}

/*
 * A commit stuck past its commit point (the rename under way) is waited
 * for once more than the deadline, since its answer must say what
 * happened; stuck past that too, its caller gets -ETIMEDOUT (the outcome
 * unknown: docs/fs.md), and the commit, once the store answers, ends as
 * it began: the block stored.
 */
Test(posix_calls, a_commit_stuck_past_its_commit_point_is_waited_for_once_more)
{
    struct sfs_backend *be = open_posix(1000);
    static struct late_commit c;
    pthread_t t;

    atomic_store(&held, 0);
    atomic_store(&go, 0);
    c.be = be;
    cr_assert_eq(sfs_testpoint_arm("commit:pending", SFS_TP_CALL, hold_here, NULL), 0);
    cr_assert_eq(pthread_create(&t, NULL, late_dump, &c), 0);
    pthread_join(t, NULL);
    cr_assert_eq(c.r, -ETIMEDOUT);
    cr_assert_eq(atomic_load(&held), 1, "the commit did not reach its commit point");
    atomic_store(&go, 1);
    while (file_size(0, 300) != (off_t)S_SMALL) /* bounded by the test's timeout */
        usleep(1000);
    sfs_backend_close(be);
    sfs_testpoint_disarm_all();
}

/*
 * A process out of threads: a call that finds no helper and cannot start
 * one answers -EAGAIN at once (nothing stored), and the next call, with
 * threads again, goes through.
 */
Test(posix_calls, no_helper_to_start_is_eagain)
{
    struct sfs_backend *be = open_posix(30000);
    char *buf = xalloc(S_SMALL);
    struct sfs_key k = mkkey(400, 0);

    cr_assert_eq(sfs_testpoint_arm_fail("call:helper", EAGAIN, 1), 0);
    cr_assert_eq(dump(be, 400, 0), -EAGAIN);
    cr_assert_eq(sfs_testpoint_hits("call:helper"), 1);
    sfs_testpoint_disarm_all();
    cr_assert_eq(file_size(0, 400), -1);
    cr_assert_eq(dump(be, 400, 0), (int)S_SMALL);
    cr_assert_eq(sfs_backend_load_sync(be, &k, buf, S_SMALL), (int)S_SMALL);
    cr_assert(matches(&k.block, 0, 1, buf, S_SMALL));
    free(buf);
    sfs_backend_close(be);
}

/* The stamp of block b as a scan gives it. */
static struct sfs_block_stamp stamp_of(struct sfs_backend *be, uint64_t b)
{
    struct sfs_block_id id = mkid(b);
    struct sfs_block_stamp st;

    cr_assert_eq(sfs_backend_stamp(be, &id, &st), 0);
    return st;
}

/*
 * An eviction held under the block's lock past its caller's deadline (a
 * hung store), and a remove of a block's shard 0 (an unlink of the whole
 * file) held before it: the caller gets -ETIMEDOUT, told nothing was
 * removed, and nothing is, once the store answers.
 */
Test(posix_calls, an_eviction_or_a_remove_whose_caller_gave_up_removes_nothing)
{
    struct sfs_backend *be = open_posix(1000);
    struct sfs_block_id id = mkid(500);
    struct sfs_key k = mkkey(500, 0);
    struct sfs_block_stamp st;

    cr_assert_eq(dump(be, 500, 0), (int)S_SMALL);
    st = stamp_of(be, 500);
    atomic_store(&held, 0);
    atomic_store(&go, 0);
    cr_assert_eq(sfs_testpoint_arm("evict:locked", SFS_TP_CALL, hold_here, NULL), 0);
    cr_assert_eq(sfs_backend_evict(be, &id, &st, NULL), -ETIMEDOUT);
    while (!atomic_load(&held)) /* held there, however slow the machine */
        usleep(1000);
    atomic_store(&left, 0);
    atomic_store(&go, 1);
    while (!atomic_load(&left)) /* it holds the block's lock until it goes on */
        usleep(1000);
    sfs_testpoint_disarm_all();

    atomic_store(&held, 0);
    atomic_store(&go, 0);
    cr_assert_eq(sfs_testpoint_arm("commit:open_committed", SFS_TP_CALL, hold_here, NULL), 0);
    cr_assert_eq(sfs_backend_remove(be, &k), -ETIMEDOUT);
    while (!atomic_load(&held))
        usleep(1000);
    atomic_store(&go, 1);
    sfs_backend_close(be); /* waits a grace for both helpers, now free */
    sfs_testpoint_disarm_all();
    cr_assert_eq(file_size(0, 500), (off_t)S_SMALL, "removed after its caller gave up");
}

static atomic_int nice_seen;

static void record_nice(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    atomic_store(&nice_seen, getpriority(PRIO_PROCESS, 0)); /* Linux: this thread's */
}

struct nice_dumper {
    struct sfs_backend *be;
    uint64_t block;
    int nice, r;
};

static void *nice_dump_thread(void *arg)
{
    struct nice_dumper *d = arg;

    d->r = setpriority(PRIO_PROCESS, 0, d->nice) == 0 ? dump(d->be, d->block, 0) : -errno;
    return NULL;
}

/*
 * A rank's background store writes call from threads it runs nicer than
 * the application's: their commits must run at that nice on the helper,
 * and a call of the application's after them at its own, in whichever
 * order the helpers were started.
 */
Test(posix_calls, a_call_runs_at_its_callers_nice)
{
    struct sfs_backend *be = open_posix(5000);
    int base = getpriority(PRIO_PROCESS, 0);
    int nicer = base + 5 > 19 ? 19 : base + 5;

    cr_assert_neq(nicer, base, "the test runs at nice 19 already");
    cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, record_nice, NULL), 0);
    for (uint64_t b = 400; b < 404; b++) {
        struct nice_dumper d = {.be = be, .block = b, .nice = b % 2 ? base : nicer};
        pthread_t t;

        atomic_store(&nice_seen, 99);
        cr_assert_eq(pthread_create(&t, NULL, nice_dump_thread, &d), 0);
        pthread_join(t, NULL);
        cr_assert_geq(d.r, 0, "block %lu: %d", (unsigned long)b, d.r);
        cr_assert_eq(atomic_load(&nice_seen), d.nice, "block %lu: a caller at nice %d, its commit at %d",
                     (unsigned long)b, d.nice, atomic_load(&nice_seen));
    }
    sfs_testpoint_disarm_all();
    sfs_backend_close(be);
}

/*
 * With all 8 helpers started by calls of one nice value and idle, a call of
 * another nice can start none: an idle helper takes it (at the helper's
 * nice) rather than let it wait for its deadline.
 */
Test(posix_calls, with_every_helper_of_another_nice_one_takes_the_call)
{
    struct sfs_backend *be = open_posix(2000);
    static struct dumper d[HELPERS];
    pthread_t t[HELPERS];
    int base = getpriority(PRIO_PROCESS, 0);
    int nicer = base + 5 > 19 ? 19 : base + 5;

    cr_assert_neq(nicer, base, "the test runs at nice 19 already");
    /* Eight calls at once, each held in its helper: eight helpers of our
     * nice, idle once let go (for 5 s, far longer than this test). */
    atomic_store(&held, 0);
    atomic_store(&go, 0);
    cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, hold_here, NULL), 0);
    for (int i = 0; i < HELPERS; i++) {
        d[i] = (struct dumper){.be = be, .block = 500 + (uint64_t)i};
        cr_assert_eq(pthread_create(&t[i], NULL, dump_thread, &d[i]), 0);
    }
    while (atomic_load(&held) < HELPERS)
        usleep(1000);
    atomic_store(&go, 1);
    for (int i = 0; i < HELPERS; i++) {
        pthread_join(t[i], NULL);
        cr_assert_geq(d[i].r, 0, "caller %d: %d", i, d[i].r);
    }
    cr_assert_eq(sfs_testpoint_arm("commit:written", SFS_TP_CALL, record_nice, NULL), 0);
    struct nice_dumper n = {.be = be, .block = 510, .nice = nicer};
    pthread_t nt;

    atomic_store(&nice_seen, 99);
    cr_assert_eq(pthread_create(&nt, NULL, nice_dump_thread, &n), 0);
    pthread_join(nt, NULL);
    cr_assert_geq(n.r, 0, "a call of another nice with every helper idle: %d", n.r);
    cr_assert_eq(atomic_load(&nice_seen), base, "run by one of the idle helpers");
    sfs_testpoint_disarm_all();
    sfs_backend_close(be);
}
