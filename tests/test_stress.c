/* SPDX-License-Identifier: MIT */
/*
 * test_stress.c - many real processes on one CacheBuffer at once.
 *
 * Every process here attaches through the Unix socket, as a rank would, and
 * all of them race on shared memory. The tests count what must never happen
 * (a lost wakeup, a byte of another key, a torn shard, a hang, a lease left
 * behind) and require zero of each; they also require that the race they
 * exist for did happen (waits, evictions, takeovers), or they prove nothing.
 *
 * Lost wakeups are detected by latency, not by timeouts: a waiter sleeps in
 * slices of 100 ms and re-checks the owner at each, so a lost futex wake
 * would show up as a ~100 ms wait, never as a hang. Any wait that returns
 * later than LATE_NS after the publish counts as lost, unless the waiter's
 * own run-queue delay (/proc/self/schedstat) explains the time: on a loaded
 * two-core machine a waiter can be woken at once and still not run.
 */
#include "cache_i.h"
#include "slot_i.h"
#include "testpoint_i.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SHARD   4096u
#define MS      (1000 * 1000ll)
#define SEC     (1000 * MS)
#define LATE_NS (80 * MS) /* well below the waiter's 100 ms owner-check slice */

/* ---------------------------------------------------------------------------
 * Helpers shared by the tests of this file.
 */

static void *shared_page(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    cr_assert(p != MAP_FAILED);
    memset(p, 0, len);
    return p;
}

static void spin_ns(int64_t ns)
{
    int64_t end = sfs_now_ns() + ns;

    while (sfs_now_ns() < end)
        ;
}

static void atomic_max(_Atomic int64_t *m, int64_t v)
{
    int64_t cur = atomic_load(m);

    while (v > cur && !atomic_compare_exchange_weak(m, &cur, v))
        ;
}

/* Serve c at a fresh socket path named for tag, written to path[len] (in a
 * shared page: the children read it). */
static void serve_at(struct sfs_cache *c, char *path, size_t len, const char *tag)
{
    snprintf(path, len, "%s", tu_path(tag));
    cr_assert_eq(sfs_cache_serve(c, path), 0);
}

/* Fork n children running fn; child i sees *index == i. */
static void fork_each(pid_t *kids, int n, int *index, int (*fn)(void *arg))
{
    for (int i = 0; i < n; i++) {
        *index = i;
        kids[i] = tu_fork(fn, NULL);
        cr_assert(kids[i] > 0);
    }
}

/* Every slot free of leases: holding a lease on nslots distinct new keys at
 * once must work, with deadline 0 (no wait), and never give -ENOSPC. */
static void assert_cache_fully_leasable(struct sfs_cache *c, uint64_t base)
{
    struct sfs_lease *l = calloc(c->nslots, sizeof(*l));

    cr_assert(l);
    for (uint32_t i = 0; i < c->nslots; i++) {
        struct sfs_key k = tu_key(base + i, 0);
        int role = sfs_cache_get(c, &k, 0, 0, &l[i]);

        cr_assert_eq(role, SFS_OWNER, "get %u of %u: %d (a lease was left behind)", i, c->nslots,
                     role);
    }
    for (uint32_t i = 0; i < c->nslots; i++) {
        cr_assert_eq(sfs_cache_fail(c, &l[i], -ECANCELED), 0);
        cr_assert_eq(sfs_cache_release(c, &l[i]), 0);
    }
    free(l);
}

/* ---------------------------------------------------------------------------
 * Lost wakeups: publish races wait.
 *
 * Each round has a fresh key. The parent Gets it (owner), the children Get it
 * (waiters) and announce it, and the parent publishes after 0-50 us, often at
 * once, while the children are somewhere between the Get's return and the
 * futex sleep: the window a lost wakeup lives in. Some rounds fail with -EIO.
 */

#define LW_CHILDREN 3
#define LW_ROUNDS   15000

struct lw_shared {
    _Atomic uint32_t round;
    _Atomic uint32_t abort; /* the parent gave up: children exit */
    _Atomic uint32_t got[LW_CHILDREN];
    _Atomic uint32_t done[LW_CHILDREN];
    _Atomic int64_t pub_ns;     /* stored before each publish */
    _Atomic uint32_t pub_round; /* stored before each publish, after pub_ns */
    _Atomic uint64_t unpublished_deadlines;
    _Atomic int64_t max_get_ns; /* round start to a waiter's Get done */
    _Atomic uint64_t ready, failed, timeouts, late, late_sched, wrong_role, wrong_bytes,
        wrong_error, other;
    _Atomic int64_t max_lat;
    _Atomic int64_t sum_lat;
    char path[128];
};

static struct sfs_key lw_key(uint32_t r)
{
    return tu_key(1000000 + r, r % 8);
}

static bool lw_fails(uint32_t r)
{
    return r % 7 == 3;
}

static struct lw_shared *lw;
static int lw_index;

static bool lw_wait_eq(_Atomic uint32_t *w, uint32_t v, int64_t deadline)
{
    /* Spin a little first: the parent must see the last `got` at once to
     * race the waiter's path into the futex. Then yield: 2 cores are shared. */
    for (int spins = 0; atomic_load_explicit(w, memory_order_acquire) != v; spins++) {
        if (sfs_now_ns() > deadline || atomic_load(&lw->abort))
            return false;
        if (spins > 2000)
            sched_yield();
    }
    return true;
}

/* Nanoseconds this process has spent runnable but not running (the second
 * field of /proc/self/schedstat), or -1. No stdio: nothing in the children's
 * loop allocates (a child forked from a threaded parent can inherit a locked
 * allocator lock; ASan's did, at a fixed allocation count). */
static int64_t run_delay(void)
{
    char buf[128];
    long long a, b;
    int fd = open("/proc/self/schedstat", O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -1;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    return sscanf(buf, "%lld %lld", &a, &b) == 2 ? b : -1;
}

static int lw_child(void *arg)
{
    int err = 0;
    struct sfs_cache *c = sfs_cache_attach(lw->path, lw_index, &err);
    uint64_t crng = 0x51ed27ull * (uint64_t)(lw_index + 3) ^ (uint64_t)getpid();

    (void)arg;
    if (!c)
        return 10;
    for (uint32_t r = 1; r <= LW_ROUNDS; r++) {
        struct sfs_key k = lw_key(r);
        struct sfs_lease l;

        if (!lw_wait_eq(&lw->round, r, sfs_deadline_after(20 * SEC)))
            return atomic_load(&lw->abort) ? 0 : 11;
        int64_t rd0 = run_delay(), tg = sfs_now_ns();
        int role = sfs_cache_get(c, &k, 0, sfs_deadline_after(2 * SEC), &l);
        atomic_max(&lw->max_get_ns, sfs_now_ns() - tg);
        if (role != SFS_WAITER) {
            atomic_fetch_add(&lw->wrong_role, 1);
            if (role >= 0)
                sfs_cache_release(c, &l);
            atomic_store_explicit(&lw->got[lw_index], r, memory_order_release);
            atomic_store_explicit(&lw->done[lw_index], r, memory_order_release);
            continue;
        }
        atomic_store_explicit(&lw->got[lw_index], r, memory_order_release);
        uint64_t cx = tu_rng_next(&crng);
        if (cx % 2)
            spin_ns((int64_t)((cx >> 8) % 1500));
        int w;
        for (;;) {
            w = sfs_cache_wait(c, &l, sfs_deadline_after(2 * SEC));
            /* A deadline that passed before the owner even published (it was
             * waiting for a starved sibling) says nothing: wait again. */
            if (w != -ETIMEDOUT || atomic_load(&lw->abort) ||
                atomic_load_explicit(&lw->pub_round, memory_order_acquire) == r)
                break;
            atomic_fetch_add(&lw->unpublished_deadlines, 1);
        }
        int64_t lat = sfs_now_ns() - atomic_load_explicit(&lw->pub_ns, memory_order_acquire);

        if (w == -ETIMEDOUT) {
            atomic_fetch_add(&lw->timeouts, 1);
        } else if (w == SFS_WAIT_READY) {
            atomic_fetch_add(&lw->ready, 1);
            if (lw_fails(r) || sfs_cache_length(c, &l) != SHARD ||
                tu_check(&k, sfs_cache_data(c, &l), SHARD) != -1)
                atomic_fetch_add(&lw->wrong_bytes, 1);
        } else if (w == SFS_WAIT_FAILED) {
            atomic_fetch_add(&lw->failed, 1);
            if (!lw_fails(r) || sfs_cache_error(c, &l) != -EIO)
                atomic_fetch_add(&lw->wrong_error, 1);
        } else {
            atomic_fetch_add(&lw->other, 1);
        }
        if (w == SFS_WAIT_READY || w == SFS_WAIT_FAILED) {
            if (lat > LATE_NS) {
                /* Late, but was it asleep or just not given a CPU? A machine
                 * this loaded is not a lost wakeup. */
                int64_t rd1 = run_delay();
                if (rd0 >= 0 && rd1 >= 0 && lat - (rd1 - rd0) <= LATE_NS)
                    atomic_fetch_add(&lw->late_sched, 1);
                else
                    atomic_fetch_add(&lw->late, 1);
            }
            atomic_max(&lw->max_lat, lat);
            atomic_fetch_add(&lw->sum_lat, lat);
        }
        sfs_cache_release(c, &l);
        atomic_store_explicit(&lw->done[lw_index], r, memory_order_release);
    }
    return 0;
}

Test(stress, lost_wakeup_publish_vs_wait, .timeout = 120)
{
    struct sfs_cache *c = tu_cache(64, 0, SHARD);
    pid_t kids[LW_CHILDREN];
    uint64_t seed = 0x1234567ull ^ (uint64_t)getpid();
    uint64_t owner_errors = 0;
    uint32_t rounds = 0;
    bool stuck = false;

    cr_assert(c);
    lw = shared_page(sizeof(*lw));
    serve_at(c, lw->path, sizeof(lw->path), "lw.sock");
    fork_each(kids, LW_CHILDREN, &lw_index, lw_child);
    int64_t t0 = sfs_now_ns();
    for (uint32_t r = 1; r <= LW_ROUNDS && !stuck; r++) {
        struct sfs_key k = lw_key(r);
        struct sfs_lease l;
        int role = sfs_cache_get(c, &k, 0, sfs_deadline_after(2 * SEC), &l);

        if (role != SFS_OWNER) {
            owner_errors++;
            break;
        }
        if (!lw_fails(r))
            tu_fill(&k, sfs_cache_data(c, &l), SHARD);
        atomic_store_explicit(&lw->round, r, memory_order_release);
        for (int i = 0; i < LW_CHILDREN && !stuck; i++)
            stuck = !lw_wait_eq(&lw->got[i], r, sfs_deadline_after(10 * SEC));
        uint64_t x = tu_rng_next(&seed);
        /* The window a lost wakeup needs is the waiter's path from Get to
         * the futex sleep: about a microsecond. Publish at once in 2/5 of the
         * rounds, after 0-1 us in 2/5, after 0-50 us in the rest; the
         * waiters add their own 0-1.5 us, so the two sweep past each other. */
        if (x % 5 == 1 || x % 5 == 2)
            spin_ns((int64_t)((x >> 8) % 1000));
        else if (x % 5 == 3)
            spin_ns((int64_t)((x >> 8) % 50000));
        atomic_store_explicit(&lw->pub_ns, sfs_now_ns(), memory_order_release);
        atomic_store_explicit(&lw->pub_round, r, memory_order_release);
        if (lw_fails(r))
            role = sfs_cache_fail(c, &l, -EIO);
        else
            role = sfs_cache_publish(c, &l, SHARD, 0);
        if (role != 0)
            owner_errors++;
        for (int i = 0; i < LW_CHILDREN && !stuck; i++)
            stuck = !lw_wait_eq(&lw->done[i], r, sfs_deadline_after(10 * SEC));
        sfs_cache_release(c, &l);
        rounds = r;
        if (atomic_load(&lw->late) > 10 || atomic_load(&lw->timeouts))
            break; /* failing: no need to wait out every round */
    }
    atomic_store(&lw->abort, 1);
    int64_t elapsed = sfs_now_ns() - t0;
    for (int i = 0; i < LW_CHILDREN; i++)
        cr_expect_eq(tu_wait_for(kids[i], 10 * SEC), 0, "child %d", i);

    uint64_t nwaits = atomic_load(&lw->ready) + atomic_load(&lw->failed);
    fprintf(stderr,
            "lost_wakeup: %u rounds x %d waiters in %.2f s: ready %llu failed %llu "
            "timeouts %llu late %llu (late for want of a CPU %llu); wake latency mean %.1f us "
            "max %.1f us; slowest waiter Get %.1f us, deadlines before the publish %llu\n",
            rounds, LW_CHILDREN, elapsed / 1e9, (unsigned long long)atomic_load(&lw->ready),
            (unsigned long long)atomic_load(&lw->failed),
            (unsigned long long)atomic_load(&lw->timeouts),
            (unsigned long long)atomic_load(&lw->late),
            (unsigned long long)atomic_load(&lw->late_sched),
            nwaits ? atomic_load(&lw->sum_lat) / 1e3 / (double)nwaits : 0.0,
            atomic_load(&lw->max_lat) / 1e3, atomic_load(&lw->max_get_ns) / 1e3,
            (unsigned long long)atomic_load(&lw->unpublished_deadlines));
    cr_assert(!stuck, "a round never completed");
    cr_assert_eq(owner_errors, 0);
    cr_assert_eq(atomic_load(&lw->wrong_role), 0);
    cr_assert_eq(atomic_load(&lw->timeouts), 0);
    cr_assert_eq(atomic_load(&lw->late), 0, "waits that took longer than %lld ms: lost wakeups",
                 LATE_NS / MS);
    cr_assert_eq(atomic_load(&lw->wrong_bytes), 0);
    cr_assert_eq(atomic_load(&lw->wrong_error), 0);
    cr_assert_eq(atomic_load(&lw->other), 0);
    cr_assert_eq(nwaits, (uint64_t)LW_ROUNDS * LW_CHILDREN, "rounds left out");
    uint32_t nfail = 0;
    for (uint32_t r = 1; r <= LW_ROUNDS; r++)
        nfail += lw_fails(r);
    cr_assert_eq(atomic_load(&lw->failed), (uint64_t)nfail * LW_CHILDREN);

    struct sfs_stats st;
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.waits, (uint64_t)LW_ROUNDS * LW_CHILDREN);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
    munmap(lw, sizeof(*lw));
}

/* ---------------------------------------------------------------------------
 * The last release against a new waiter, made to happen.
 *
 * A lock-free release that drops a slot's last lease is done with the slot
 * at its decrement: from then on another Get may evict the slot for a new
 * key, and a waiter of that key counts itself in nwaiters and sleeps. No
 * step of the release after the decrement may touch what the slot's next
 * key relies on: a late clear of nwaiters erased the sleeping waiter, the
 * publish saw no one to wake, and the waiter slept out its 100 ms slice.
 * The test point "release:dropped" holds the releaser in that window while
 * the slot is reused and the waiter goes to sleep (seen in
 * /proc/self/task/TID/syscall: futex on the slot's version word); then the
 * publish must make its wake call ("state:wake") and the count must end at 0.
 */

static struct lr_state {
    struct sfs_cache *c;
    struct sfs_lease la;
    struct sfs_key kb;
    _Atomic int stalled, go, waiter_tid, wait_result;
} lr;

static void lr_hold(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    if (atomic_exchange(&lr.stalled, 1))
        return; /* only the first release is held */
    while (!atomic_load(&lr.go))
        sched_yield();
}

static void *lr_releaser(void *arg)
{
    (void)arg;
    sfs_cache_release(lr.c, &lr.la);
    return NULL;
}

static void *lr_waiter(void *arg)
{
    struct sfs_lease l;
    int r;

    (void)arg;
    atomic_store(&lr.waiter_tid, (int)syscall(SYS_gettid));
    r = sfs_cache_get(lr.c, &lr.kb, 0, sfs_deadline_after(10 * SEC), &l);
    if (r == SFS_WAITER) {
        r = sfs_cache_wait(lr.c, &l, sfs_deadline_after(10 * SEC));
        sfs_cache_release(lr.c, &l);
    } else {
        r = r >= 0 ? -EPROTO : r; /* not a waiter: the setup went wrong */
    }
    atomic_store(&lr.wait_result, r);
    return NULL;
}

/* The waiter thread sleeps in futex(2) on `word`. */
static bool asleep_on(int tid, const void *word)
{
    char path[64], buf[256];
    long nr = -1;
    unsigned long a0 = 0;
    int fd;
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return sscanf(buf, "%ld %lx", &nr, &a0) == 2 && nr == SYS_futex && a0 == (uintptr_t)word;
}

Test(stress, last_release_never_erases_a_new_keys_waiter, .timeout = 60)
{
    struct sfs_cache *c = tu_cache(1, 0, SHARD);
    struct sfs_key ka = tu_key(71, 0);
    struct sfs_lease lb;
    pthread_t rel, wai;

    cr_assert(c);
    lr.c = c;
    lr.kb = tu_key(72, 0);
    cr_assert_eq(sfs_cache_get(c, &ka, 0, sfs_deadline_after(SEC), &lr.la), SFS_OWNER);
    cr_assert_eq(sfs_cache_publish(c, &lr.la, SHARD, 0), 0);
    struct sfs_slot_rec *sl = &c->slots[lr.la.slot];

    cr_assert_eq(sfs_testpoint_arm("release:dropped", SFS_TP_CALL, lr_hold, NULL), 0);
    cr_assert_eq(sfs_testpoint_arm("state:wake", SFS_TP_CALL, NULL, NULL), 0);
    cr_assert_eq(pthread_create(&rel, NULL, lr_releaser, NULL), 0);
    while (!atomic_load(&lr.stalled))
        sched_yield();
    /* The slot's last lease is gone (the releaser is held after its
     * decrement): the one slot takes the new key, we own its load. */
    cr_assert_eq(sfs_cache_get(c, &lr.kb, 0, sfs_deadline_after(SEC), &lb), SFS_OWNER);
    cr_assert_eq(lb.slot, lr.la.slot);
    cr_assert_eq(pthread_create(&wai, NULL, lr_waiter, NULL), 0);
    int64_t until = sfs_now_ns() + 20 * SEC;
    while (!(atomic_load(&lr.waiter_tid) && asleep_on(atomic_load(&lr.waiter_tid), &sl->version)))
    {
        cr_assert(sfs_now_ns() < until, "the waiter never slept on the slot's version word");
        sched_yield();
    }
    atomic_store(&lr.go, 1);
    pthread_join(rel, NULL);
    cr_expect_eq(atomic_load(&sl->nwaiters), 1, "the releaser erased the sleeping waiter");
    unsigned wakes = sfs_testpoint_hits("state:wake");

    cr_assert_eq(sfs_cache_publish(c, &lb, SHARD, 0), 0);
    cr_expect_eq(sfs_testpoint_hits("state:wake"), wakes + 1, "the publish woke no one");
    pthread_join(wai, NULL);
    cr_expect_eq(atomic_load(&lr.wait_result), SFS_WAIT_READY);
    cr_expect_eq(atomic_load(&sl->nwaiters), 0, "the waiter count ends where it began");
    sfs_testpoint_disarm_all();
    sfs_cache_release(c, &lb);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * Content stress: 4 processes, random keys over 4x the slots.
 *
 * Each worker keeps up to HOLD leases open at once and checks the bytes of a
 * slot again when it lets go, so an eviction of a leased slot (invariant 2)
 * shows up as wrong bytes too. Owners fill in two halves with a yield between
 * and sometimes fail with -EIO; a reader that saw a half-filled or reused
 * slot counts a wrong byte (invariant 1).
 */

#define CS_WORKERS 4
#define CS_SLOTS   64
#define CS_RESV    4
#define CS_BLOCKS  64
#define CS_SHARDS  4 /* 256 keys */
#define CS_RUN_NS  (4 * SEC)
#define CS_MAXOPS  400000
#define HOLD       3

struct cs_shared {
    _Atomic uint32_t stop;
    _Atomic uint64_t ops, hits, owners, waits, ready_waits, failed_waits, takeovers, published,
        fails_injected, wrong_bytes, wrong_error, wrong_len, hangs, get_errors, other;
    _Atomic uint64_t touched, prealloc, removed, touch_errors;
    char path[128];
};

static struct cs_shared *cs;
static int cs_index;

static struct sfs_key cs_key(uint64_t x)
{
    return tu_key(x % CS_BLOCKS, (uint32_t)((x / CS_BLOCKS) % CS_SHARDS));
}

struct held {
    bool used;
    struct sfs_key k;
    struct sfs_lease l;
};

static void cs_check(struct sfs_cache *c, struct held *h)
{
    if (sfs_cache_length(c, &h->l) != SHARD)
        atomic_fetch_add(&cs->wrong_len, 1);
    if (tu_check(&h->k, sfs_cache_data(c, &h->l), SHARD) != -1)
        atomic_fetch_add(&cs->wrong_bytes, 1);
}

static void cs_drop(struct sfs_cache *c, struct held *h)
{
    if (!h->used)
        return;
    cs_check(c, h); /* still ours: the bytes cannot have changed */
    if (sfs_cache_release(c, &h->l) != 0)
        atomic_fetch_add(&cs->other, 1);
    h->used = false;
}

/* Fill as owner: two halves with a yield between; fail 1 in 16. Returns true
 * when the slot is Ready (readable). */
static bool cs_fill(struct sfs_cache *c, const struct sfs_key *k, struct sfs_lease *l,
                    uint64_t *rng)
{
    uint8_t *d = sfs_cache_data(c, l);
    uint8_t buf[SHARD];

    if (tu_rng_next(rng) % 16 == 0) {
        atomic_fetch_add(&cs->fails_injected, 1);
        if (sfs_cache_fail(c, l, -EIO) != 0)
            atomic_fetch_add(&cs->other, 1);
        return false;
    }
    if (tu_rng_next(rng) % 8 == 0)
        spin_ns((int64_t)(tu_rng_next(rng) % 200000)); /* a slow load: waiters pile up */
    tu_fill(k, buf, SHARD);
    memcpy(d, buf, SHARD / 2);
    if (tu_rng_next(rng) % 4 == 0)
        sched_yield();
    memcpy(d + SHARD / 2, buf + SHARD / 2, SHARD / 2);
    if (sfs_cache_publish(c, l, SHARD, 0) != 0) {
        atomic_fetch_add(&cs->other, 1);
        return false;
    }
    atomic_fetch_add(&cs->published, 1);
    return true;
}

static int cs_worker(void *arg)
{
    int err = 0;
    struct sfs_cache *c = sfs_cache_attach(cs->path, cs_index, &err);
    struct held held[HOLD] = {{0}};
    uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(cs_index + 1) ^ (uint64_t)getpid();
    unsigned next = 0;

    (void)arg;
    if (!c)
        return 10;
    for (uint64_t op = 0; op < CS_MAXOPS && !atomic_load(&cs->stop); op++) {
        struct held *h = &held[next++ % HOLD];
        struct sfs_key k = cs_key(tu_rng_next(&rng));
        struct sfs_lease l;
        bool readable = false;

        cs_drop(c, h);
        atomic_fetch_add(&cs->ops, 1);
        int role = sfs_cache_get(c, &k, 0, sfs_deadline_after(2 * SEC), &l);
        switch (role) {
        case SFS_HIT:
            atomic_fetch_add(&cs->hits, 1);
            readable = true;
            break;
        case SFS_OWNER:
            atomic_fetch_add(&cs->owners, 1);
            readable = cs_fill(c, &k, &l, &rng);
            break;
        case SFS_WAITER: {
            atomic_fetch_add(&cs->waits, 1);
            int w = sfs_cache_wait(c, &l, sfs_deadline_after(2 * SEC));
            if (w == SFS_WAIT_READY) {
                atomic_fetch_add(&cs->ready_waits, 1);
                readable = true;
            } else if (w == SFS_WAIT_FAILED) {
                atomic_fetch_add(&cs->failed_waits, 1);
                if (sfs_cache_error(c, &l) != -EIO)
                    atomic_fetch_add(&cs->wrong_error, 1);
            } else if (w == SFS_WAIT_OWNER) {
                atomic_fetch_add(&cs->takeovers, 1);
                readable = cs_fill(c, &k, &l, &rng);
            } else if (w == -ETIMEDOUT) {
                atomic_fetch_add(&cs->hangs, 1);
            } else {
                atomic_fetch_add(&cs->other, 1);
            }
            break;
        }
        default:
            atomic_fetch_add(&cs->get_errors, 1);
            continue;
        }
        h->k = k;
        h->l = l;
        h->used = true;
        if (readable)
            cs_check(c, h);
        else {
            sfs_cache_release(c, &l);
            h->used = false;
        }
    }
    for (int i = 0; i < HOLD; i++)
        cs_drop(c, &held[i]);
    /* No sfs_cache_close(): the test checks that Release alone left nothing. */
    return 0;
}

/* The parent's side job in the Touch/Prealloc variant. */
static void cs_touch_prealloc(struct sfs_cache *c, uint64_t *rng)
{
    uint64_t x = tu_rng_next(rng);

    switch (x % 8) {
    case 0:
    case 1:
    case 2: {
        struct sfs_block_id b[8];
        size_t n = 1 + (x >> 8) % 8;

        for (size_t i = 0; i < n; i++)
            b[i] = tu_block(tu_rng_next(rng) % CS_BLOCKS);
        int r = sfs_cache_touch(c, b, n);
        if (r < 0)
            atomic_fetch_add(&cs->touch_errors, 1);
        else
            atomic_fetch_add(&cs->touched, (uint64_t)r);
        break;
    }
    case 3:
    case 4:
    case 5:
    case 6: {
        /* The next shard of a block, as the dispatcher's idle window does. */
        struct sfs_key k = cs_key(tu_rng_next(rng));
        int r = sfs_cache_prealloc(c, &k);
        if (r < 0)
            atomic_fetch_add(&cs->touch_errors, 1);
        else
            atomic_fetch_add(&cs->prealloc, (uint64_t)r);
        break;
    }
    default: {
        struct sfs_key k = cs_key(tu_rng_next(rng));
        int r = sfs_cache_remove(c, &k);
        if (r == 0)
            atomic_fetch_add(&cs->removed, 1);
        else if (r != -EBUSY && r != -ENOENT)
            atomic_fetch_add(&cs->touch_errors, 1);
        break;
    }
    }
}

static void content_stress(bool side_jobs)
{
    struct sfs_cache *c = tu_cache(CS_SLOTS, CS_RESV, SHARD);
    pid_t kids[CS_WORKERS];
    uint64_t rng = 0xfeedfaceull ^ (uint64_t)getpid();

    cr_assert(c);
    cs = shared_page(sizeof(*cs));
    serve_at(c, cs->path, sizeof(cs->path), "cs.sock");
    fork_each(kids, CS_WORKERS, &cs_index, cs_worker);
    int64_t end = sfs_now_ns() + CS_RUN_NS;
    while (sfs_now_ns() < end) {
        if (side_jobs) {
            cs_touch_prealloc(c, &rng);
            if (tu_rng_next(&rng) % 4 == 0)
                usleep(100);
        } else {
            usleep(10000);
        }
    }
    atomic_store(&cs->stop, 1);
    int hung = 0;
    for (int i = 0; i < CS_WORKERS; i++) {
        int st = tu_wait_for(kids[i], 10 * SEC);

        cr_expect_eq(st, 0, "worker %d exit %d", i, st);
        hung += st == -1;
    }

    struct sfs_stats s;
    unsigned entries = 0, rc;
    sfs_cache_stats(c, &s);
    rc = tu_leases_left(c, &entries);
    fprintf(stderr,
            "content%s: ops %llu hits %llu owners %llu waits %llu (ready %llu failed %llu "
            "takeover %llu) fails %llu | stats: requests %llu hits %llu owner_loads %llu "
            "waits %llu evictions %llu takeovers %llu prealloc %llu touched %llu | side: "
            "touched %llu prealloc %llu removed %llu\n",
            side_jobs ? "+touch/prealloc" : "", (unsigned long long)cs->ops,
            (unsigned long long)cs->hits, (unsigned long long)cs->owners,
            (unsigned long long)cs->waits, (unsigned long long)cs->ready_waits,
            (unsigned long long)cs->failed_waits, (unsigned long long)cs->takeovers,
            (unsigned long long)cs->fails_injected, (unsigned long long)s.requests,
            (unsigned long long)s.hits, (unsigned long long)s.owner_loads,
            (unsigned long long)s.waits, (unsigned long long)s.evictions,
            (unsigned long long)s.takeovers, (unsigned long long)s.prealloc,
            (unsigned long long)s.touched, (unsigned long long)cs->touched,
            (unsigned long long)cs->prealloc, (unsigned long long)cs->removed);
    cr_assert_eq(hung, 0, "a worker hung");
    cr_assert_eq(atomic_load(&cs->wrong_bytes), 0, "invariant 1: wrong or torn bytes");
    cr_assert_eq(atomic_load(&cs->wrong_len), 0);
    cr_assert_eq(atomic_load(&cs->wrong_error), 0);
    cr_assert_eq(atomic_load(&cs->hangs), 0, "a wait ran into its deadline");
    cr_assert_eq(atomic_load(&cs->get_errors), 0);
    cr_assert_eq(atomic_load(&cs->other), 0);
    cr_assert_eq(atomic_load(&cs->touch_errors), 0);
    cr_assert_eq(rc, 0, "slots with a refcount after every lease was released");
    cr_assert_eq(entries, 0, "lease-table entries after every lease was released");
    /* The races this test exists for happened. */
    cr_assert_gt(s.evictions, 0);
    cr_assert_gt(s.hits, 0);
    cr_assert_gt(s.waits, 0);
    cr_assert_gt(s.failures, 0);
    cr_assert_eq(s.requests, atomic_load(&cs->ops));
    if (side_jobs) {
        cr_assert_gt(s.prealloc, 0);
        cr_assert_gt(s.touched, 0);
        /* An Idle slot placed by Prealloc was taken over by a later Get. */
        cr_assert_gt(s.takeovers, 0);
    }
    /* The workers never closed: the server reaped each record when its
     * connection closed at exit (at most 3 s to see them all). */
    for (int64_t until = sfs_now_ns() + 3000000000ll;;) {
        struct sfs_stats r;

        sfs_cache_stats(c, &r);
        if (r.reaped >= CS_WORKERS)
            break;
        cr_assert_lt(sfs_now_ns(), until, "reaped %llu of %d", (unsigned long long)r.reaped,
                     CS_WORKERS);
        usleep(1000);
    }
    assert_cache_fully_leasable(c, 5000000);
    sfs_cache_close(c);
    munmap(cs, sizeof(*cs));
}

Test(stress, content_four_processes, .timeout = 60)
{
    content_stress(false);
}

Test(stress, touch_prealloc_remove_concurrent, .timeout = 60)
{
    content_stress(true);
}
