/* SPDX-License-Identifier: MIT */
/*
 * wait.c - waiting for a Loading key: Wait, WaitAny (with a process-private
 * bell), and the takeover of a slot whose owner is gone.
 *
 * No lost wakeups. Whoever changes a slot's state stores the state, then
 * bumps `version`, then wakes. A waiter reads `version` before it reads the
 * state and sleeps only if `version` still holds what it read: a publish in
 * between changes the word and the futex returns at once (cache.c).
 */
#include "slot_i.h"

#include <errno.h>

/* A waiter on more keys than one futex_waitv holds moves its sleep window
 * this often: a key outside the window is seen within this long. */
#define WAITV_ROTATE_NS (2 * 1000 * 1000ll)

/*
 * Under the lock: take a slot whose owner is gone (or that was reset).
 * 1: ours now; 0: someone else settled it first (look again); -ETIMEDOUT
 * when its bucket lock stayed out of reach until the deadline; -EBADMSG for
 * a state a leased slot cannot be in.
 */
static int try_takeover(struct sfs_cache *c, uint32_t s, uint32_t e, int64_t deadline_ns)
{
    struct sfs_slot_rec *sl = &c->slots[s];
    uint32_t b = atomic_load_explicit(&sl->bucket, memory_order_relaxed);
    int r;

    if (b >= c->nbuckets)
        return -EBADMSG; /* a leased slot is on a chain */
    r = bucket_lock(c, b, deadline_ns);
    if (r < 0)
        return r;
    uint32_t st = atomic_load_explicit(&sl->state, memory_order_acquire);
    if (st == SFS_STATE_IDLE || (st == SFS_STATE_LOADING && !owner_alive_rec(c, sl))) {
        make_owner(c, sl);
        lease_mark_owner(c, s, e);
        set_state(sl, SFS_STATE_LOADING);
        sfs_pin_on_load(c, sl);
        sfs_ctr_add(c, CTR_TAKEOVERS, 1);
        sfs_ctr_add(c, CTR_OWNER_LOADS, 1);
        r = 1;
    } else {
        r = st == SFS_STATE_FREE || st > SFS_STATE_FAILED ? -EBADMSG : 0;
    }
    bucket_unlock(c, b);
    return r;
}

/*
 * Where a waiter stands with its slot: SFS_WAIT_READY or SFS_WAIT_FAILED
 * when it settled, SFS_WAIT_OWNER when it took the load over, -1 to keep waiting, or
 * -errno: -EBADMSG for a state no leased slot can be in (Free: only a bad
 * write puts a leased slot there; out of range), -ETIMEDOUT from a takeover
 * whose lock stayed busy to the deadline.
 */
static int settled(struct sfs_cache *c, const struct sfs_lease *l, struct sfs_slot_rec *sl,
                   int64_t deadline_ns)
{
    uint32_t st = atomic_load_explicit(&sl->state, memory_order_acquire);

    if (st == SFS_STATE_READY)
        return SFS_WAIT_READY;
    if (st == SFS_STATE_FAILED)
        return SFS_WAIT_FAILED;
    if (st == SFS_STATE_FREE || st > SFS_STATE_FAILED)
        return -EBADMSG;
    if (st == SFS_STATE_IDLE || !owner_alive_rec(c, sl)) {
        int r = try_takeover(c, l->slot, l->entry, deadline_ns);

        if (r == 1)
            return SFS_WAIT_OWNER;
        if (r < 0)
            return r;
    }
    return -1;
}

/* The futex errors a wait loop re-checks after; anything else is returned. */
static bool wait_again(int r)
{
    return r == 0 || r == -EAGAIN || r == -ETIMEDOUT || r == -EINTR;
}

int sfs_cache_wait(struct sfs_cache *c, const struct sfs_lease *lease, int64_t deadline_ns)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);

    if (!sl)
        return -EINVAL;
    for (;;) {
        /* Acquire: version first, then state (the no-lost-wakeup order). */
        uint32_t v = atomic_load_explicit(&sl->version, memory_order_acquire);
        int st = settled(c, lease, sl, deadline_ns);

        if (st >= 0 || st < -1)
            return st;
        /* Still Loading under a live owner, or a takeover lost to another
         * waiter: the deadline first, so no state can keep us past it. */
        int64_t now = sfs_now_ns();
        if (deadline_ns > 0 && now >= deadline_ns)
            return -ETIMEDOUT;
        int64_t slice = now + OWNER_CHECK_NS;
        if (deadline_ns > 0 && deadline_ns < slice)
            slice = deadline_ns;
        /* seq_cst pairs with set_state's bump-then-read of nwaiters. */
        atomic_fetch_add_explicit(&sl->nwaiters, 1, memory_order_seq_cst);
        int r = 0;
        if (atomic_load_explicit(&sl->version, memory_order_seq_cst) == v)
            r = sfs_futex_wait(&sl->version, v, slice);
        atomic_fetch_sub_explicit(&sl->nwaiters, 1, memory_order_seq_cst);
        if (!wait_again(r))
            return r;
        /* Woken, timed out or interrupted: the loop re-reads the state, and
         * owner_alive_rec sees a record the daemon declared dead. */
    }
}

int sfs_cache_wait_any_bell(struct sfs_cache *c, const struct sfs_lease *leases, size_t n,
                            int64_t deadline_ns, int *outcome, uint32_t *bell_word,
                            uint32_t bell_seen)
{
    /* The public type is plain uint32_t (C++ includes the header); every
     * access here is atomic. */
    _Atomic uint32_t *bell = (_Atomic uint32_t *)bell_word;
    struct sfs_slot_rec *sls[SFS_WAIT_ANY_MAX];
    _Atomic uint32_t *words[SFS_WAIT_ANY_MAX];
    uint32_t v[SFS_WAIT_ANY_MAX];
    size_t first = 0; /* start of the sleep window when it cannot hold all */

    if (!c || (!leases && n) || !outcome || (n == 0 && !bell) || n > SFS_WAIT_ANY_MAX)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        sls[i] = lease_slot(c, &leases[i]);
        if (!sls[i])
            return -EINVAL;
        words[i] = &sls[i]->version;
    }
    for (;;) {
        for (size_t i = 0; i < n; i++) {
            /* Acquire: version first, then state (the no-lost-wakeup order). */
            v[i] = atomic_load_explicit(&sls[i]->version, memory_order_acquire);
            int st = settled(c, &leases[i], sls[i], deadline_ns);

            if (st >= 0) {
                *outcome = st;
                return (int)i;
            }
            if (st < -1)
                return st;
        }
        /* Acquire: pairs with the ringer's release bump. */
        if (bell && atomic_load_explicit(bell, memory_order_acquire) != bell_seen)
            return (int)n;
        int64_t now = sfs_now_ns();
        if (deadline_ns > 0 && now >= deadline_ns)
            return -ETIMEDOUT;
        /* One futex_waitv takes SFS_FUTEX_WAITV_MAX words, the bell
         * included: with more keys, sleep on a window of them that rotates
         * every WAITV_ROTATE_NS (each pass above looks at all n). */
        size_t room = SFS_FUTEX_WAITV_MAX - (bell != NULL);
        size_t k = n <= room ? n : room;
        int64_t slice = now + (k < n ? WAITV_ROTATE_NS : OWNER_CHECK_NS);
        if (deadline_ns > 0 && deadline_ns < slice)
            slice = deadline_ns;
        _Atomic uint32_t *ww[SFS_FUTEX_WAITV_MAX];
        uint32_t wv[SFS_FUTEX_WAITV_MAX];

        SFS_ASSERT(k + (bell != NULL) <= SFS_FUTEX_WAITV_MAX);
        for (size_t j = 0; j < k; j++) {
            size_t i = (first + j) % n;

            ww[j] = words[i];
            wv[j] = v[i];
            /* seq_cst pairs with set_state's bump-then-read of nwaiters. */
            atomic_fetch_add_explicit(&sls[i]->nwaiters, 1, memory_order_seq_cst);
        }
        int r = sfs_futex_waitv(ww, wv, k, bell, bell_seen, slice);
        for (size_t j = 0; j < k; j++)
            atomic_fetch_sub_explicit(&sls[(first + j) % n]->nwaiters, 1, memory_order_seq_cst);
        if (k < n)
            first = (first + k) % n;
        if (!wait_again(r))
            return r; /* -ENOSYS (before Linux 5.16), or an error: never spin on it */
        /* A timeout re-reads every state: see sfs_cache_wait. */
    }
}

int sfs_cache_wait_any(struct sfs_cache *c, const struct sfs_lease *leases, size_t n,
                       int64_t deadline_ns, int *outcome)
{
    if (n == 0)
        return -EINVAL;
    return sfs_cache_wait_any_bell(c, leases, n, deadline_ns, outcome, NULL, 0);
}

int sfs_cache_wait_errno(struct sfs_cache *c, const struct sfs_lease *lease, int outcome)
{
    if (outcome < 0)
        return outcome;
    if (outcome == SFS_WAIT_READY)
        return 0;
    if (outcome != SFS_WAIT_FAILED)
        return -EINVAL; /* SFS_WAIT_OWNER is no error, anything else no outcome */
    /* Failed, then retried by another Get meanwhile: the error is gone. */
    int e = sfs_cache_error(c, lease);
    return e < 0 ? e : -EIO;
}

void sfs_bell_ring(uint32_t *bell_word)
{
    _Atomic uint32_t *bell = (_Atomic uint32_t *)bell_word;

    /* Release: what the ringer queued is visible to whoever sees the bump.
     * The bell is process-private memory: a private futex wake. */
    atomic_fetch_add_explicit(bell, 1, memory_order_release);
    sfs_futex_wake_private(bell, INT32_MAX);
}
