/* SPDX-License-Identifier: MIT */
/*
 * cache.c - the CacheBuffer's entry points: Get, Wait, Publish, Fail,
 * Release, and the lookups without leases (State, Remove, Prealloc, Touch,
 * foreach), all on shared memory.
 *
 * The slot lifecycle. A slot is FREE (on no chain) until a Get that misses
 * claims it: the claimer becomes the owner, the slot goes on its key's bucket
 * chain as LOADING with the owner's lease on it. The owner fills the bytes and
 * publishes READY (or FAILED with an error). Other Gets of the key take a
 * lease and either read (READY) or wait (LOADING) on the slot's version word,
 * a shared futex. A Get of a FAILED or IDLE key takes ownership again. When
 * the last lease goes, the slot stays resident until the CLOCK hand evicts it.
 *
 * No lost wakeups. Whoever changes a slot's state stores the state, then
 * bumps `version`, then wakes. A waiter reads `version` before it reads the
 * state and sleeps only if `version` still holds what it read: a publish in
 * between changes the word and the futex returns at once.
 *
 * The rest of the protocol lives beside this file (map: slot_i.h): bucket.c
 * holds the robust bucket locks and their repair after a dead holder,
 * lease.c the lease tables, evict.c CLOCK eviction and the wait for a free
 * slot, proc.c process records and reaping, ctl.c the region's geometry.
 */
#include "admit_i.h"
#include "slot_i.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* A release waits this long for its bucket lock, then defers (lease.c). */
#define RELEASE_LOCK_NS (200 * 1000 * 1000ll)
/* A waiter on more keys than one futex_waitv holds moves its sleep window
 * this often: a key outside the window is seen within this long. */
#define WAITV_ROTATE_NS (2 * 1000 * 1000ll)

/* ---------------------------------------------------------------------------
 * State changes and wakes (set_state, make_owner: slot_i.h).
 */

static bool owner_alive_rec(struct sfs_cache *c, const struct sfs_slot_rec *s)
{
    uint32_t o = atomic_load_explicit(&s->owner, memory_order_acquire);
    uint32_t gen = atomic_load_explicit(&s->owner_gen, memory_order_acquire);

    if (o >= c->max_procs)
        return false;
    return atomic_load_explicit(&c->procs[o].state, memory_order_acquire) == PROC_ALIVE &&
           atomic_load_explicit(&c->procs[o].gen, memory_order_acquire) == gen;
}

/* ---------------------------------------------------------------------------
 * Get / Wait / Publish / Release.
 */

/*
 * The lock-free hit (docs/recovery.md, "Lock-free hits", argues each step).
 * Walk the chain without the lock to a slot that carries the key, then:
 *   1. read its refcount word; closed (not Ready, or being changed under
 *      the lock): take the locked path;
 *   2. write our entry as an intent (slot + 1 | ENTRY_TRANSIT);
 *   3. CAS the word to one more lease, only while it is still open: no
 *      evictor, remover or writer can have closed it in between, since each
 *      closes it by a CAS that needs the count at 0 (and a recount closes it
 *      too);
 *   4. confirm the entry (slot + 1);
 *   5. check the key and the state again: the slot may have been evicted
 *      and reloaded with another key between the walk and the CAS (the CAS
 *      then pinned the wrong key): let go of it and take the locked path.
 * A death at any step leaves the entry in transit (2-3) or held (4-5), and
 * the reaper settles either exactly. 1: a hit, the lease in *out; 0: take
 * the locked path (entry e is free again); -1: take the locked path with
 * another entry (e went back with the lease let go in step 5).
 */
static int release_lease(struct sfs_cache *c, const struct sfs_lease *lease, bool free_entry);

static int hit_fast(struct sfs_cache *c, uint32_t b, const struct sfs_key *key, uint32_t e,
                    struct sfs_lease *out)
{
    /* Acquire: the slot's key and state were written before it was linked. */
    uint32_t s = atomic_load_explicit(&c->buckets[b].head, memory_order_acquire);

    SFS_ASSERT(e < c->max_leases);
    /* Bounded: at most nslots steps (the chain may change under us; a walk
     * that strays gives up, the locked path decides). */
    for (uint32_t n = 0; s != SFS_NIL; n++) {
        if (!slot_ok(c, s) || n >= c->nslots)
            return 0;
        if (key_eq_atomic(&c->slots[s], key))
            break;
        s = atomic_load_explicit(&c->slots[s].next, memory_order_acquire);
    }
    if (s == SFS_NIL)
        return 0;
    struct sfs_slot_rec *sl = &c->slots[s];
    uint32_t w = atomic_load_explicit(&sl->refcount, memory_order_relaxed);

    if (!(w & SLOT_REF_OPEN))
        return 0;
    /* The intent before the CAS; relaxed: the CAS below releases it. */
    atomic_store_explicit(&c->leases[e], (s + 1) | ENTRY_TRANSIT, memory_order_relaxed);
    SFS_TEST_POINT("hit:intent");
    /* acq_rel: our intent is seen by whoever closes the slot after us, and
     * the key, state and bytes published before the open are seen by us. */
    while (!atomic_compare_exchange_weak_explicit(&sl->refcount, &w, w + 1, memory_order_acq_rel,
                                                  memory_order_relaxed)) {
        if (!(w & SLOT_REF_OPEN) || SLOT_REF_COUNT(w + 1) == 0) {
            atomic_store_explicit(&c->leases[e], SFS_ENTRY_FREE, memory_order_relaxed);
            return 0; /* closed meanwhile: the locked path */
        }
    }
    SFS_TEST_POINT("hit:counted");
    atomic_store_explicit(&c->leases[e], s + 1, memory_order_relaxed);
    SFS_TEST_POINT("hit:confirmed");
    out->slot = s;
    out->entry = e;
    /* Pinned now (open with a lease on it: no one can close it to change
     * its key or state): the check is stable. */
    if (!key_eq_atomic(sl, key) ||
        atomic_load_explicit(&sl->state, memory_order_acquire) != SFS_STATE_READY) {
        release_lease(c, out, true);
        return -1;
    }
    if (!atomic_load_explicit(&sl->accessed, memory_order_relaxed))
        atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
    uint8_t f = atomic_load_explicit(&sl->flags, memory_order_relaxed);

    sfs_admit_hit(sl, f); /* a second access: out of probation */
    if (f & SLOT_F_PREFETCHED) {
        /* Once per prefetched load: the fetch_and says who cleared it. */
        if (atomic_fetch_and_explicit(&sl->flags, (uint8_t)~SLOT_F_PREFETCHED,
                                      memory_order_relaxed) &
            SLOT_F_PREFETCHED)
            sfs_ctr_add(c, CTR_PREFETCH_HITS, 1);
    }
    return 1;
}

/* A Get on a full cache that waits for a release: registered (counted in
 * release_waiters) from its first failed scan to its return. */
struct release_wait {
    bool registered;
    uint32_t seq; /* release_seq as read after registering or waking */
};

static int get_impl(struct sfs_cache *c, const struct sfs_key *key, unsigned flags,
                    int64_t deadline_ns, struct sfs_lease *lease, struct release_wait *rw)
{
    uint32_t b, s, e;
    int r, role, err = 0;
    bool reaped = false;
    int busy_retries = 0;

    if (!c || !key || !lease)
        return -EINVAL;
    r = entry_alloc(c, &e);
    if (r < 0)
        return r;
    b = bucket_of(c, key);
    /* A prefetch is not a lookup: it counts as a load (owner_loads,
     * prefetched), never as a request, miss or unserved Get. */
    const bool lookup = !(flags & SFS_GET_PREFETCH);
    if (lookup)
        sfs_ctr_add(c, CTR_REQUESTS, 1);
    if (!(flags & (SFS_GET_PREFETCH | SFS_GET_WRITE)) && !SFS_TEST_FORCE_LOCKED()) {
        int h = hit_fast(c, b, key, e, lease);

        if (h > 0)
            return SFS_HIT;
        if (h < 0 && (r = entry_alloc(c, &e)) < 0) {
            sfs_ctr_add(c, CTR_UNSERVED, 1);
            return r;
        }
    }
retry:
    r = bucket_lock(c, b, deadline_ns);
    if (r < 0)
        goto out_free;
    SFS_TEST_POINT("get:locked");
    s = chain_find(c, b, key, &err);
    if (err) {
        r = err;
        goto out_unlock;
    }
    if (s != SFS_NIL) {
        struct sfs_slot_rec *sl = &c->slots[s];
        uint32_t st = atomic_load_explicit(&sl->state, memory_order_acquire);

        if (flags & SFS_GET_PREFETCH) {
            r = -EEXIST; /* already there: nothing to prefetch */
            goto out_unlock;
        }
        if (flags & SFS_GET_WRITE) {
            /* Closing the slot is the check for no lease (a lock-free hit
             * that got in first makes the CAS fail). */
            if (st == SFS_STATE_LOADING || !slot_close_unleased(sl)) {
                /* Relaxed: a hint for a holder that polls (the mount's
                 * page-cache pins); the writer retries either way. */
                atomic_fetch_or_explicit(&sl->flags, (uint8_t)SLOT_F_WRITE_WANTED,
                                         memory_order_relaxed);
                r = -EBUSY;
                goto out_unlock;
            }
            if (st == SFS_STATE_READY)
                sfs_ctr_add(c, CTR_RESIDENT_DELTA,
                            -(int64_t)atomic_load_explicit(&sl->length, memory_order_relaxed));
            make_owner(c, sl);
            /* The pin flag stays: the key stays (and its charge with it). */
            atomic_fetch_and_explicit(&sl->flags, (uint8_t)(SLOT_F_RESERVED | SLOT_F_PINNED),
                                      memory_order_relaxed);
            set_state(sl, SFS_STATE_LOADING);
            atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
            lease_take(c, s, e, lease);
            role = SFS_OWNER;
            goto out_owner;
        }
        switch (st) {
        case SFS_STATE_READY:
            lease_take(c, s, e, lease);
            /* Closed by a recount cut short (a death): open it again. */
            slot_open(sl);
            atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
            sfs_admit_hit(sl, atomic_load_explicit(&sl->flags, memory_order_relaxed));
            if (atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PREFETCHED) {
                atomic_fetch_and_explicit(&sl->flags, (uint8_t)~SLOT_F_PREFETCHED,
                                          memory_order_relaxed);
                sfs_ctr_add(c, CTR_PREFETCH_HITS, 1);
            }
            bucket_unlock(c, b);
            return SFS_HIT;
        case SFS_STATE_LOADING:
            if (owner_alive_rec(c, sl)) {
                lease_take(c, s, e, lease);
                atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
                sfs_admit_hit(sl, atomic_load_explicit(&sl->flags, memory_order_relaxed));
                sfs_ctr_add(c, CTR_MISSES, 1);
                sfs_ctr_add(c, CTR_WAITS, 1);
                bucket_unlock(c, b);
                return SFS_WAITER;
            }
            sfs_ctr_add(c, CTR_TAKEOVERS, 1);
            /* The owner is gone: take it over. */
            __attribute__((fallthrough));
        case SFS_STATE_IDLE:
        case SFS_STATE_FAILED:
        default:
            if (st == SFS_STATE_IDLE)
                sfs_ctr_add(c, CTR_TAKEOVERS, 1);
            make_owner(c, sl);
            atomic_fetch_and_explicit(&sl->flags, (uint8_t)(SLOT_F_RESERVED | SLOT_F_PINNED),
                                      memory_order_relaxed);
            set_state(sl, SFS_STATE_LOADING);
            pin_on_load(c, sl); /* a Prealloc'd or failed slot was no pin's */
            atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
            lease_take(c, s, e, lease);
            sfs_ctr_add(c, CTR_MISSES, 1);
            role = SFS_OWNER;
            goto out_owner;
        }
    }
    if (flags & SFS_GET_NOALLOC) {
        r = -ENOENT;
        goto out_unlock;
    }
    r = alloc_slot(c, b, sfs_domain_of(c, key->shard),
                   (flags & SFS_GET_PREFETCH) ? POOL_REGULAR : POOL_REGULAR | POOL_RESERVED, &s);
    if (r == -EAGAIN && busy_retries++ < 64) {
        /* A victim's bucket was busy: let its holder finish, then rescan. */
        bucket_unlock(c, b);
        sched_yield();
        goto retry;
    }
    if (r < 0) {
        r = -ENOSPC;
        bucket_unlock(c, b);
        if (flags & SFS_GET_PREFETCH)
            goto out_free;
        if (!reaped) {
            reaped = true;
            if (sfs_cache_reap(c) > 0)
                goto retry;
        }
        if (deadline_ns <= 0 || sfs_now_ns() >= deadline_ns)
            goto out_free;
        SFS_TEST_POINT("get:full");
        if (!rw->registered) {
            /* Register, then rescan before any sleep (Dekker with
             * refcount_drop): a release before our registration is seen by
             * the rescan, one after it sees us and bumps release_seq. So a
             * release never writes a shared line unless someone waits. */
            rw->seq = release_wait_begin(c);
            rw->registered = true;
            goto retry;
        }
        r = wait_for_release(c, rw->seq, deadline_ns);
        if (r < 0)
            goto out_free;
        rw->seq = atomic_load_explicit(&c->hdr->release_seq, memory_order_seq_cst);
        reaped = false;
        goto retry;
    }
    install(c, b, s, key, SFS_STATE_LOADING, !lookup);
    lease_take(c, s, e, lease);
    if (lookup)
        sfs_ctr_add(c, CTR_MISSES, 1);
    role = SFS_OWNER;
out_owner:
    lease_mark_owner(c, lease->slot, e);
    sfs_ctr_add(c, CTR_OWNER_LOADS, 1);
    bucket_unlock(c, b);
    return role;

out_unlock:
    bucket_unlock(c, b);
out_free:
    entry_free(c, e);
    if (lookup)
        sfs_ctr_add(c, CTR_UNSERVED, 1);
    return r;
}

int sfs_cache_get(struct sfs_cache *c, const struct sfs_key *key, unsigned flags,
                  int64_t deadline_ns, struct sfs_lease *lease)
{
    struct release_wait rw = {0};
    int r = get_impl(c, key, flags, deadline_ns, lease, &rw);

    if (rw.registered)
        release_wait_end(c);
    return r;
}

/* The lease must be ours: checked against our table, never trusted. */
static struct sfs_slot_rec *lease_slot(struct sfs_cache *c, const struct sfs_lease *l)
{
    if (!c || !l || l->entry >= c->max_leases || !slot_ok(c, l->slot))
        return NULL;
    /* An entry marked ENTRY_DROP was released already: no longer a lease. */
    if ((atomic_load_explicit(&c->leases[l->entry], memory_order_relaxed) & ~ENTRY_OWNER) !=
        l->slot + 1)
        return NULL;
    return &c->slots[l->slot];
}

static bool i_own(struct sfs_cache *c, const struct sfs_slot_rec *s)
{
    return atomic_load_explicit(&s->owner, memory_order_acquire) == c->me &&
           atomic_load_explicit(&s->owner_gen, memory_order_acquire) == c->my_gen;
}

/* The owner's own lease, not another lease of the owner's process. */
static bool lease_is_owner(struct sfs_cache *c, const struct sfs_lease *l)
{
    return atomic_load_explicit(&c->leases[l->entry], memory_order_relaxed) & ENTRY_OWNER;
}

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
        pin_on_load(c, sl);
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

int sfs_cache_publish(struct sfs_cache *c, const struct sfs_lease *lease, uint32_t length,
                      unsigned flags)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);

    if (!sl || length > c->shard_size)
        return -EINVAL;
    if (atomic_load_explicit(&sl->state, memory_order_acquire) != SFS_STATE_LOADING ||
        !i_own(c, sl) || !lease_is_owner(c, lease))
        return -EPERM;
    atomic_store_explicit(&sl->length, length, memory_order_relaxed);
    atomic_store_explicit(&sl->error, 0, memory_order_relaxed);
    sfs_ctr_add(c, CTR_RESIDENT_DELTA, length);
    if (!(flags & SFS_PUBLISH_WRITTEN))
        sfs_ctr_add(c, CTR_BYTES_READ, length);
    if (atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PREFETCHED)
        sfs_ctr_add(c, CTR_PREFETCHED, 1);
    /* No longer an owner's lease: a later retry's owner is someone else. */
    atomic_fetch_and_explicit(&c->leases[lease->entry], ~ENTRY_OWNER, memory_order_relaxed);
    set_state(sl, SFS_STATE_READY);
    /* Open to lock-free hits, after the state (release in slot_open: a
     * hitter's acquire CAS sees Ready, the length and the bytes). Only
     * under the bucket lock: a recount (slot_recount) relies on a slot it
     * closed staying closed while it holds the lock. Tried, never waited
     * for: a slot left closed is opened by the next Get that takes the
     * lock, and meanwhile hits take the locked path. */
    uint32_t b = atomic_load_explicit(&sl->bucket, memory_order_relaxed);
    if (b < c->nbuckets && bucket_lock(c, b, LOCK_TRY) == 0) {
        if (atomic_load_explicit(&sl->state, memory_order_relaxed) == SFS_STATE_READY)
            slot_open(sl);
        bucket_unlock(c, b);
    }
    return 0;
}

int sfs_cache_fail(struct sfs_cache *c, const struct sfs_lease *lease, int error)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);

    if (!sl || error >= 0)
        return -EINVAL;
    if (atomic_load_explicit(&sl->state, memory_order_acquire) != SFS_STATE_LOADING ||
        !i_own(c, sl) || !lease_is_owner(c, lease))
        return -EPERM;
    /* Error first, then state, then version (set_state): waiters that see
     * Failed see the error. */
    atomic_store_explicit(&sl->error, error, memory_order_relaxed);
    sfs_ctr_add(c, CTR_FAILURES, 1);
    atomic_fetch_and_explicit(&c->leases[lease->entry], ~ENTRY_OWNER, memory_order_relaxed);
    set_state(sl, SFS_STATE_FAILED);
    pin_on_fail(c, sl); /* a pin counts only what it holds */
    return 0;
}

int sfs_cache_settle(struct sfs_cache *c, const struct sfs_lease *lease, int io_result,
                     uint32_t expected_len, unsigned flags)
{
    int err, r;

    if (io_result >= 0 && (uint32_t)io_result == expected_len)
        return sfs_cache_publish(c, lease, expected_len, flags);
    err = io_result < 0 ? io_result : -EIO; /* a short read or write */
    r = sfs_cache_fail(c, lease, err);
    return r < 0 ? r : err;
}

int sfs_cache_error(struct sfs_cache *c, const struct sfs_lease *lease)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);

    if (!sl)
        return -EINVAL;
    /* Acquire on state pairs with fail()'s release store. */
    if (atomic_load_explicit(&sl->state, memory_order_acquire) != SFS_STATE_FAILED)
        return 0;
    int e = atomic_load_explicit(&sl->error, memory_order_relaxed);
    return e < 0 ? e : -EIO;
}

uint32_t sfs_cache_length(struct sfs_cache *c, const struct sfs_lease *lease)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);
    uint32_t len;

    if (!sl)
        return 0;
    len = atomic_load_explicit(&sl->length, memory_order_acquire);
    return len <= c->shard_size ? len : 0;
}

bool sfs_cache_write_wanted(struct sfs_cache *c, const struct sfs_lease *lease)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);

    /* Relaxed: a hint polled by the lease's holder (see SLOT_F_WRITE_WANTED). */
    return sl && (atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_WRITE_WANTED);
}

void *sfs_cache_data(struct sfs_cache *c, const struct sfs_lease *lease)
{
    if (!c || c->query_only || !lease || !slot_ok(c, lease->slot))
        return NULL;
    return sfs_dp_addr(c, lease->slot);
}

/*
 * The lock-free release of a held, non-owner lease on an open slot: mark the
 * entry in transit (a CAS: of two threads releasing one lease, one wins),
 * decrement the count while the word is still open, free the entry. 0:
 * released; 1: the slot is closed (entry restored), take the lock; -EINVAL:
 * not a lease we hold.
 */
static int release_fast(struct sfs_cache *c, const struct sfs_lease *lease)
{
    struct sfs_slot_rec *sl = &c->slots[lease->slot];
    uint32_t v = lease->slot + 1;
    uint32_t w = atomic_load_explicit(&sl->refcount, memory_order_relaxed);

    if (!(w & SLOT_REF_OPEN))
        return 1;
    /* Relaxed: the decrement's release CAS publishes the mark. */
    if (!atomic_compare_exchange_strong_explicit(&c->leases[lease->entry], &v, v | ENTRY_TRANSIT,
                                                 memory_order_relaxed, memory_order_relaxed))
        return (v & ~ENTRY_OWNER) == lease->slot + 1 ? 1 : -EINVAL; /* an owner's: locked */
    SFS_TEST_POINT("release:intent");
    do {
        if (!(w & SLOT_REF_OPEN) || SLOT_REF_COUNT(w) == 0) {
            atomic_store_explicit(&c->leases[lease->entry], v, memory_order_relaxed);
            return 1;
        }
        /* Release: our reads of the bytes happen-before the acquire CAS of
         * whoever closes the slot at count 0 to reuse it. */
    } while (!atomic_compare_exchange_weak_explicit(&sl->refcount, &w, w - 1,
                                                    memory_order_release, memory_order_relaxed));
    SFS_TEST_POINT("release:dropped");
    if (SLOT_REF_COUNT(w) == 1)
        refcount_last(c, sl);
    atomic_store_explicit(&c->leases[lease->entry], SFS_ENTRY_FREE, memory_order_relaxed);
    return 0;
}

/* Release a lease; free its entry when free_entry (else the caller reuses it). */
static int release_lease(struct sfs_cache *c, const struct sfs_lease *lease, bool free_entry)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);
    uint32_t b;
    int r;

    if (!sl)
        return -EINVAL;
    /* Process-local: a release still finishes our deferred ones. */
    if (atomic_load_explicit(&c->deferred, memory_order_relaxed))
        lease_finish_deferred(c);
    if (!SFS_TEST_FORCE_LOCKED()) {
        r = release_fast(c, lease);
        if (r <= 0) {
            if (r == 0 && free_entry)
                entry_free(c, lease->entry);
            return r;
        }
    }
    /* Stable while we hold the lease: a leased slot never moves. */
    b = atomic_load_explicit(&sl->bucket, memory_order_relaxed);
    if (b >= c->nbuckets)
        return -EBADMSG;
    uint32_t v = atomic_load_explicit(&c->leases[lease->entry], memory_order_relaxed);
    r = bucket_lock_within(c, b, RELEASE_LOCK_NS);
    if (r < 0) {
        /* A stopped holder: the release is recorded, its count dropped
         * later (never leaked, never waited for past RELEASE_LOCK_NS). */
        return lease_defer(c, lease->entry, v) ? 0 : -EINVAL;
    }
    SFS_TEST_POINT("release:locked");
    /* Two threads releasing one lease: only the first finds it here. */
    if ((atomic_load_explicit(&c->leases[lease->entry], memory_order_relaxed) & ~ENTRY_OWNER) !=
        lease->slot + 1) {
        bucket_unlock(c, b);
        return -EINVAL;
    }
    release_locked(c, c->me, c->my_gen, c->leases, lease->entry, lease->slot);
    bucket_unlock(c, b);
    if (free_entry)
        entry_free(c, lease->entry);
    return 0;
}

int sfs_cache_release(struct sfs_cache *c, const struct sfs_lease *lease)
{
    return release_lease(c, lease, true);
}

/* ---------------------------------------------------------------------------
 * Lookups without leases, Remove, Prealloc, Touch.
 */

/*
 * Lock key's bucket and find the key on it. Returns 0 with the bucket locked
 * and *s the slot or SFS_NIL; -errno (bucket unlocked) on a bad argument, a
 * lock error or a corrupt chain.
 */
static int lock_find(struct sfs_cache *c, const struct sfs_key *key, uint32_t *b, uint32_t *s)
{
    int r, err = 0;

    if (!c || !key)
        return -EINVAL;
    *b = bucket_of(c, key);
    r = bucket_lock(c, *b, 0);
    if (r < 0)
        return r;
    *s = chain_find(c, *b, key, &err);
    if (err) {
        bucket_unlock(c, *b);
        return err;
    }
    return 0;
}

int sfs_cache_state(struct sfs_cache *c, const struct sfs_key *key)
{
    uint32_t b, s;
    int r = lock_find(c, key, &b, &s);

    if (r < 0)
        return r;
    r = s == SFS_NIL ? -ENOENT
                     : (int)atomic_load_explicit(&c->slots[s].state, memory_order_acquire);
    bucket_unlock(c, b);
    return r;
}

bool sfs_cache_exists(struct sfs_cache *c, const struct sfs_key *key)
{
    return sfs_cache_state(c, key) == SFS_STATE_READY;
}

int sfs_cache_remove(struct sfs_cache *c, const struct sfs_key *key)
{
    uint32_t b, s;
    int r = lock_find(c, key, &b, &s);

    if (r < 0)
        return r;
    if (s == SFS_NIL) {
        r = -ENOENT;
    } else if (!slot_close_unleased(&c->slots[s])) {
        /* Leased (the CAS that closes it to lock-free hits failed). Relaxed:
         * the same hint as a write Get's (get_impl). */
        atomic_fetch_or_explicit(&c->slots[s].flags, (uint8_t)SLOT_F_WRITE_WANTED,
                                 memory_order_relaxed);
        r = -EBUSY;
    } else {
        struct sfs_slot_rec *sl = &c->slots[s];

        chain_unlink(c, b, s);
        pin_on_unlink(c, sl);
        if (atomic_load_explicit(&sl->state, memory_order_relaxed) == SFS_STATE_READY)
            sfs_ctr_add(c, CTR_RESIDENT_DELTA,
                        -(int64_t)atomic_load_explicit(&sl->length, memory_order_relaxed));
        atomic_store_explicit(&sl->accessed, 0, memory_order_relaxed);
        set_state(sl, SFS_STATE_FREE);
        /* Release: the slot is fully reset before an evictor's CAS claims it. */
        atomic_store_explicit(&sl->bucket, SFS_NIL, memory_order_release);
        r = 0;
    }
    bucket_unlock(c, b);
    return r;
}

int sfs_cache_prealloc(struct sfs_cache *c, const struct sfs_key *key)
{
    uint32_t b, s;
    int r = lock_find(c, key, &b, &s);

    if (r < 0)
        return r;
    if (s != SFS_NIL) {
        r = 0;
    } else if (alloc_slot(c, b, sfs_domain_of(c, key->shard),
                          POOL_REGULAR | POOL_FRESH_ONLY | POOL_RESERVED, &s) == 0) {
        install(c, b, s, key, SFS_STATE_IDLE, false);
        atomic_store_explicit(&c->slots[s].owner, SFS_NIL, memory_order_relaxed);
        sfs_ctr_add(c, CTR_PREALLOC, 1);
        r = 1;
    } else {
        r = 0;
    }
    bucket_unlock(c, b);
    return r;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

static bool block_in(const struct sfs_block_id *blocks, size_t n, const uint8_t *id)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(blocks[i].b, id, SFS_BLOCK_ID_LEN) == 0)
            return true;
    return false;
}

int sfs_cache_touch(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n)
{
    uint32_t max_shard, span, *bk = NULL;
    size_t nb = 0;
    int marked = 0;

    if (!c || (!blocks && n))
        return -EINVAL;
    if (n == 0)
        return 0;
    max_shard = atomic_load_explicit(&c->hdr->max_shard, memory_order_relaxed);
    span = max_shard >= c->nbuckets - 1 ? c->nbuckets : max_shard + 1;
    if ((uint64_t)span * n >= c->nbuckets) {
        /* The walk would cover every bucket anyway: visit each once. */
        nb = c->nbuckets;
    } else {
        bk = malloc(sizeof(*bk) * span * n);
        if (!bk)
            return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
            uint64_t h = sfs_key_hash(&blocks[i]);

            for (uint32_t k = 0; k < span; k++)
                bk[nb++] = (uint32_t)(h + k) & c->bucket_mask;
        }
        /* Clustered by bucket: each lock taken once. */
        qsort(bk, nb, sizeof(*bk), cmp_u32);
    }
    for (size_t i = 0; i < nb; i++) {
        uint32_t b = bk ? bk[i] : (uint32_t)i;

        if (bk && i && bk[i - 1] == b)
            continue;
        if (bucket_lock(c, b, 0) < 0)
            continue;
        uint32_t s = atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed);
        for (uint32_t steps = 0; s != SFS_NIL && slot_ok(c, s) && steps < c->nslots; steps++) {
            struct sfs_slot_rec *sl = &c->slots[s];
            uint32_t st = atomic_load_explicit(&sl->state, memory_order_relaxed);

            if ((st == SFS_STATE_READY || st == SFS_STATE_LOADING) &&
                block_in(blocks, n, sl->block)) {
                atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
                sfs_admit_hit(sl, atomic_load_explicit(&sl->flags, memory_order_relaxed));
                marked++;
            }
            s = atomic_load_explicit(&sl->next, memory_order_relaxed);
        }
        bucket_unlock(c, b);
    }
    free(bk);
    sfs_ctr_add(c, CTR_TOUCHED, marked);
    if (c->touch_fn)
        c->touch_fn(blocks, n, c->touch_arg);
    return marked;
}

void sfs_cache_set_touch_hook(struct sfs_cache *c, sfs_touch_hook_fn *fn, void *arg)
{
    c->touch_fn = fn;
    c->touch_arg = arg;
}

int sfs_cache_foreach(struct sfs_cache *c, unsigned state_mask, sfs_key_visit_fn *fn, void *arg)
{
    struct sfs_key *keys = NULL;
    int *states = NULL, r = 0;
    uint32_t cap = 0;

    if (!c || !fn)
        return -EINVAL;
    for (uint32_t b = 0; b < c->nbuckets && r == 0; b++) {
        uint32_t n = 0;

        if (atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed) == SFS_NIL)
            continue; /* racy peek is fine: a snapshot */
        if (bucket_lock(c, b, 0) < 0)
            continue;
        uint32_t s = atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed);
        for (uint32_t steps = 0; s != SFS_NIL && slot_ok(c, s) && steps < c->nslots; steps++) {
            struct sfs_slot_rec *sl = &c->slots[s];
            uint32_t st = atomic_load_explicit(&sl->state, memory_order_relaxed);

            if (st < 32 && (state_mask & (1u << st))) {
                if (n == cap) {
                    uint32_t ncap = cap ? cap * 2 : 16;
                    struct sfs_key *nk = realloc(keys, sizeof(*keys) * ncap);
                    int *ns = nk ? realloc(states, sizeof(*states) * ncap) : NULL;

                    if (nk)
                        keys = nk;
                    if (!ns) {
                        r = -ENOMEM;
                        break;
                    }
                    states = ns;
                    cap = ncap;
                }
                memcpy(keys[n].block.b, sl->block, SFS_BLOCK_ID_LEN);
                keys[n].shard = sl->shard;
                states[n++] = (int)st;
            }
            s = atomic_load_explicit(&sl->next, memory_order_relaxed);
        }
        bucket_unlock(c, b);
        /* Callbacks run with no lock held: they may call back into the cache. */
        for (uint32_t i = 0; i < n && r == 0; i++)
            r = fn(&keys[i], states[i], arg);
    }
    free(keys);
    free(states);
    return r;
}
