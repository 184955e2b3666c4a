/* SPDX-License-Identifier: MIT */
/*
 * cache.c - the CacheBuffer's leased entry points: Get (the lock-free hit,
 * then the locked path), Publish, Fail, Release, and what a lease holder
 * reads (error, length, data), all on shared memory. Waiting for a Loading
 * key is in wait.c, the lookups without leases (State, Remove, Prealloc,
 * Touch, foreach) in lookup.c.
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

/* A release waits this long for its bucket lock, then defers (lease.c). */
#define RELEASE_LOCK_NS (200 * 1000 * 1000ll)

/* ---------------------------------------------------------------------------
 * Get / Publish / Release (owner_alive_rec, lease_slot: slot_i.h).
 */

/*
 * The lock-free hit (docs/recovery.md, "Lock-free hits", argues each step).
 * Walk the chain without the lock to a slot that carries the key, then:
 *   1. read its refcount word; closed (not Ready, or being changed under
 *      the lock): take the locked path;
 *   2. claim a free entry of the slot's hit line in our table (a seq_cst
 *      CAS to slot + 1): our lease, in no count; a full line: the locked
 *      path;
 *   3. read the word again (seq_cst, after the claim): still open, so any
 *      closer after us reads our entry (slot_close_free) and keeps the slot
 *      as it is;
 *   4. check the key and the state: the slot may have been evicted and
 *      reloaded with another key since the walk (then let go, the locked
 *      path);
 *   5. count the request on the entry's hit counter (a plain add: the
 *      entry is this thread's until the lease is released).
 * The slot's own line is only read: two processes hitting the same keys
 * write nothing they share. A death at any step leaves our entry holding
 * slot + 1 or free; the reaper frees it, and it was in no count. 1: a hit,
 * the lease in *out; 0: take the locked path.
 */
static int hit_fast(struct sfs_cache *c, uint32_t b, const struct sfs_key *key, bool peek,
                    struct sfs_lease *out)
{
    if (c->nhit == 0)
        return 0; /* a table too small for hit lines: every lease is counted */
    /* Acquire: the slot's key and state were written before it was linked. */
    uint32_t s = atomic_load_explicit(&c->buckets[b].head, memory_order_acquire);

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

    if (!(atomic_load_explicit(&sl->refcount, memory_order_relaxed) & SLOT_REF_OPEN))
        return 0;
    SFS_TEST_POINT("hit:walked");
    /* Bounded: one line of SFS_HIT_LINE entries. */
    uint32_t e = hit_line_of(c, s), end = e + SFS_HIT_LINE;

    for (;; e++) {
        if (e == end)
            return 0; /* our line is full: the locked path's counted lease */
        uint32_t v = SFS_ENTRY_FREE;

        /* seq_cst: the claim precedes our read of the word below in the
         * single order that a closer's CAS and read of the line are in. */
        if (atomic_load_explicit(&c->leases[e], memory_order_relaxed) == SFS_ENTRY_FREE &&
            atomic_compare_exchange_strong_explicit(&c->leases[e], &v, s + 1,
                                                    memory_order_seq_cst, memory_order_relaxed))
            break;
    }
    SFS_TEST_POINT("hit:claimed");
    /* seq_cst: see above. Acquire, too: the key, state and bytes published
     * before the open are seen by us. */
    uint32_t w = atomic_load_explicit(&sl->refcount, memory_order_seq_cst);

    if (!(w & SLOT_REF_OPEN) || !key_eq_atomic(sl, key) ||
        atomic_load_explicit(&sl->state, memory_order_acquire) != SFS_STATE_READY) {
        /* Closed since the walk, or reused for another key: let go. */
        atomic_store_explicit(&c->leases[e], SFS_ENTRY_FREE, memory_order_seq_cst);
        hit_released(c);
        return 0;
    }
    SFS_TEST_POINT("hit:checked");
    out->slot = s;
    out->entry = e;
    uint8_t f = atomic_load_explicit(&sl->flags, memory_order_relaxed);

    if (!peek)
        sfs_slot_use(sl, f); /* a second access: out of probation */
    sfs_slot_prefetch_hit(c, sl, f);
    /* The request, on this entry's own counter: no locked instruction, no
     * line another thread writes (stats sums the counters, the fold takes
     * them). Relaxed: one writer, the entry's holder. */
    atomic_store_explicit(&c->hits[e], atomic_load_explicit(&c->hits[e], memory_order_relaxed) + 1,
                          memory_order_relaxed);
    SFS_TEST_POINT("hit:tallied");
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
    b = bucket_of(c, key);
    /* A prefetch is not a lookup: it counts as a load (owner_loads,
     * prefetched), never as a request, miss or unserved Get. */
    const bool lookup = !(flags & SFS_GET_PREFETCH);
    if (!(flags & (SFS_GET_PREFETCH | SFS_GET_WRITE)) && !SFS_TEST_FORCE_LOCKED() &&
        hit_fast(c, b, key, flags & SFS_GET_PEEK, lease) > 0)
        return SFS_HIT; /* counted as a request on its hit entry (hit_fast) */
    r = entry_alloc(c, &e);
    if (r < 0) {
        if (lookup) {
            sfs_ctr_add(c, CTR_REQUESTS, 1);
            sfs_ctr_add(c, CTR_UNSERVED, 1);
        }
        return r;
    }
    if (lookup)
        sfs_ctr_add(c, CTR_REQUESTS, 1);
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
            if (st == SFS_STATE_LOADING || !slot_close_free(c, s)) {
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
            /* Its pin stays (a byte of its own): the key stays, and its charge. */
            atomic_fetch_and_explicit(&sl->flags, (uint8_t)SLOT_F_RESERVED,
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
            uint8_t f = atomic_load_explicit(&sl->flags, memory_order_relaxed);

            if (!(flags & SFS_GET_PEEK))
                sfs_slot_use(sl, f);
            SFS_TEST_POINT("get:prefetch_seen");
            sfs_slot_prefetch_hit(c, sl, f);
            bucket_unlock(c, b);
            return SFS_HIT;
        case SFS_STATE_LOADING:
            if (owner_alive_rec(c, sl)) {
                lease_take(c, s, e, lease);
                if (!(flags & SFS_GET_PEEK))
                    sfs_slot_use(sl, atomic_load_explicit(&sl->flags, memory_order_relaxed));
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
            atomic_fetch_and_explicit(&sl->flags, (uint8_t)SLOT_F_RESERVED,
                                      memory_order_relaxed);
            set_state(sl, SFS_STATE_LOADING);
            sfs_pin_on_load(c, sl); /* a Prealloc'd or failed slot was no pin's */
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
    r = sfs_alloc_slot(c, b, sfs_domain_of(c, key->shard),
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
             * sfs_refcount_drop): a release before our registration is seen by
             * the rescan, one after it sees us and bumps release_seq. So a
             * release never writes a shared line unless someone waits. */
            rw->seq = sfs_release_wait_begin(c);
            rw->registered = true;
            goto retry;
        }
        r = sfs_wait_for_release(c, rw->seq, deadline_ns);
        if (r < 0)
            goto out_free;
        rw->seq = atomic_load_explicit(&c->hdr->release_seq, memory_order_seq_cst);
        reaped = false;
        goto retry;
    }
    sfs_install(c, b, s, key, SFS_STATE_LOADING, !lookup);
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
        sfs_release_wait_end(c);
    return r;
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
     * under the bucket lock: a recount (sfs_slot_recount) relies on a slot it
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
    sfs_pin_on_fail(c, sl); /* a pin counts only what it holds */
    return 0;
}

int sfs_cache_settle(struct sfs_cache *c, const struct sfs_lease *lease, int io_result,
                     uint32_t expected_len, unsigned flags)
{
    int err, r;

    if (io_result >= 0 && (uint32_t)io_result == expected_len)
        return sfs_cache_publish(c, lease, expected_len, flags);
    err = io_result < 0 ? io_result : -EIO; /* a short read or write */
    if (flags & SFS_PUBLISH_WRITTEN)
        return err; /* a write's error is the writer's: its release leaves the slot Idle */
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
        /* The last lease, with a waiter's count left (one killed in its
         * sleep): cleared under the lock (refcount_last). Lock-free it could
         * only be cleared after the decrement, when the slot may hold a new
         * key already and the count be its sleeping waiter's. Relaxed: a
         * live waiter holds a lease, so a count of 1 here means none. */
        if (!(w & SLOT_REF_OPEN) || SLOT_REF_COUNT(w) == 0 ||
            (SLOT_REF_COUNT(w) == 1 && atomic_load_explicit(&sl->nwaiters, memory_order_relaxed))) {
            atomic_store_explicit(&c->leases[lease->entry], v, memory_order_relaxed);
            return 1;
        }
        /* Release (in seq_cst): our reads of the bytes happen-before the
         * acquire CAS of whoever closes the slot at count 0 to reuse it.
         * seq_cst: the last lease's wake check needs no fence after it
         * (refcount_last_rmw); on x86 the same locked instruction. */
    } while (!atomic_compare_exchange_weak_explicit(&sl->refcount, &w, w - 1,
                                                    memory_order_seq_cst, memory_order_relaxed));
    SFS_TEST_POINT("release:dropped");
    if (SLOT_REF_COUNT(w) == 1)
        refcount_last_rmw(c, sl);
    atomic_store_explicit(&c->leases[lease->entry], SFS_ENTRY_FREE, memory_order_relaxed);
    return 0;
}

/* The release of a lock-free hit's lease: free its hit entry by a CAS (of
 * two threads releasing one lease, one wins). seq_cst: our reads of the
 * bytes happen-before a closer's read of the line that sees it free, and
 * the wake check after it needs no fence (hit_released). 0, or -EINVAL:
 * not a lease we hold. */
static int release_hit(struct sfs_cache *c, const struct sfs_lease *lease)
{
    uint32_t v = lease->slot + 1;

    if (!atomic_compare_exchange_strong_explicit(&c->leases[lease->entry], &v, SFS_ENTRY_FREE,
                                                 memory_order_seq_cst, memory_order_relaxed))
        return -EINVAL;
    SFS_TEST_POINT("release:hit_freed");
    hit_released(c);
    return 0;
}

int sfs_cache_release(struct sfs_cache *c, const struct sfs_lease *lease)
{
    struct sfs_slot_rec *sl = lease_slot(c, lease);
    uint32_t b;
    int r;

    if (!sl)
        return -EINVAL;
    /* Process-local: a release still finishes our deferred ones. */
    if (atomic_load_explicit(&c->deferred, memory_order_relaxed))
        sfs_lease_finish_deferred(c);
    if (entry_is_hit(c, lease->entry))
        return release_hit(c, lease);
    if (!SFS_TEST_FORCE_LOCKED()) {
        r = release_fast(c, lease);
        if (r <= 0) {
            if (r == 0)
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
        return sfs_lease_defer(c, lease->entry, v) ? 0 : -EINVAL;
    }
    SFS_TEST_POINT("release:locked");
    /* Two threads releasing one lease: only the first finds it here. */
    if ((atomic_load_explicit(&c->leases[lease->entry], memory_order_relaxed) & ~ENTRY_OWNER) !=
        lease->slot + 1) {
        bucket_unlock(c, b);
        return -EINVAL;
    }
    sfs_release_locked(c, c->me, c->my_gen, c->leases, lease->entry, lease->slot);
    bucket_unlock(c, b);
    entry_free(c, lease->entry);
    return 0;
}
