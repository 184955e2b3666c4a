/* SPDX-License-Identifier: MIT */
/*
 * bucket.c - bucket locks, the chains they protect, and their repair.
 *
 * Every bucket lock is a robust process-shared mutex. When a process dies
 * holding one, the next locker gets EOWNERDEAD and repairs the chain: walks
 * it (bounded, indices checked), and recounts each slot's refcount from the
 * lease tables (sfs_slot_recount: the slot is closed to lock-free hits first,
 * and a slot a live process is mid-step on keeps its count, which is exact
 * but for the dead one's entries in transit, settled by its reap). The order of writes
 * when a slot is claimed (unlink, bucket, key, link, lease entry, refcount)
 * makes any prefix of it repairable: a slot cut off mid-move is an orphan
 * that the next evictor finds by walking its chain (evict.c), and it never
 * has a lease entry pointing at it.
 */
#include "slot_i.h"

#include <time.h>

/* Walk a chain, checking indices and bounding the walk. Returns its length,
 * or -EBADMSG for an index out of range or a cycle. */
static int chain_check(struct sfs_cache *c, uint32_t b, bool fix)
{
    _Atomic uint32_t *link = &c->buckets[b].head;
    uint32_t n = 0;

    for (;;) {
        /* Under the bucket lock: relaxed loads see our own and prior owners'
         * stores (the mutex orders them). */
        uint32_t s = atomic_load_explicit(link, memory_order_relaxed);

        if (s == SFS_NIL)
            return (int)n;
        if (!slot_ok(c, s) || n >= c->nslots) {
            if (!fix)
                return -EBADMSG;
            atomic_store_explicit(link, SFS_NIL, memory_order_relaxed); /* cut: rest are orphans */
            return (int)n;
        }
        if (fix)
            atomic_store_explicit(&c->slots[s].bucket, b, memory_order_relaxed);
        link = &c->slots[s].next;
        n++;
    }
}

/*
 * Bucket lock held, s on its chain. Quiesce s: close it (lock-free hits and
 * releases need SLOT_REF_OPEN, so from the close on only holders of this
 * lock change the count), then read every table. A held entry counts; an
 * entry in transit of a dead record (Dead or Reaping: it will never take
 * another step) is settled as never taken, freed, and not counted; one in
 * transit of a record still Alive means that process is between two steps
 * on s (its increment or decrement may or may not be in the count), so
 * nothing is changed and -EBUSY says to come back. Why this is exact, and
 * why a live process's transit entry is always seen: docs/recovery.md.
 *
 * Bound: the tables of records that are not Free, each to its lease_hwm
 * (see repair_bucket), read twice at most.
 */
int sfs_slot_recount(struct sfs_cache *c, uint32_t s)
{
    struct sfs_slot_rec *sl = &c->slots[s];
    uint32_t held = 0;
    bool busy = false, frozen = false;

    SFS_ASSERT(s < c->nslots);
    /* acq_rel: a lock-free changer's release CAS before the close makes its
     * transit mark (stored before that CAS) visible to the reads below. */
    atomic_fetch_and_explicit(&sl->refcount, ~SLOT_REF_OPEN, memory_order_acq_rel);
    SFS_TEST_POINT("recount:closed");
    for (int pass = 0; pass < 2 && !busy; pass++) {
        for (uint32_t p = 0; p < c->max_procs && !busy; p++) {
            /* Acquire: pairs with the release that freed the record / raised
             * the mark before an entry beyond it was written. */
            uint32_t ps = atomic_load_explicit(&c->procs[p].state, memory_order_acquire);
            if (ps == PROC_FREE)
                continue;
            _Atomic uint32_t *t = lease_table(c, p);
            uint32_t hwm = atomic_load_explicit(&c->procs[p].lease_hwm, memory_order_acquire);
            if (hwm > c->max_leases)
                hwm = c->max_leases; /* input: bounded by the table */
            /* From c->nhit: a hit line's lease is in no count. */
            for (uint32_t e = c->nhit; e < hwm; e++) {
                uint32_t v = atomic_load_explicit(&t[e], memory_order_relaxed);

                if (ENTRY_SLOT1(v) != s + 1)
                    continue;
                bool dead = ps == PROC_DEAD || ps == PROC_REAPING;

                if (pass == 1) {
                    /* Dead: it never takes the next step. Settled as not
                     * taken; the count stored below is what makes that so.
                     * (A live transit mark first seen now was made after
                     * the close: its CAS fails, it changes no count.) */
                    if ((v & ENTRY_TRANSIT) && dead)
                        atomic_store_explicit(&t[e], SFS_ENTRY_FREE, memory_order_relaxed);
                } else if (!(v & ENTRY_TRANSIT)) {
                    held++;
                } else if (!dead) {
                    busy = true; /* alive (or claiming, leaving): mid-step */
                    break;
                } else {
                    frozen = true;
                }
            }
        }
        if (!frozen)
            break; /* nothing to free: one pass was enough */
    }
    if (!busy) {
        uint32_t w = atomic_load_explicit(&sl->refcount, memory_order_relaxed);
        /* Closed: only holders of this lock change the count now. */
        atomic_store_explicit(&sl->refcount, held, memory_order_relaxed);
        if (SLOT_REF_COUNT(w) && !held)
            refcount_last(c, sl);
    }
    if (atomic_load_explicit(&sl->state, memory_order_acquire) == SFS_STATE_READY)
        slot_open(sl);
    return busy ? -EBUSY : 0;
}

/*
 * A process died holding bucket b's lock. Cut the chain at any bad link and
 * recount each chain slot's refcount from the lease tables (sfs_slot_recount):
 * a slot whose count a live process is changing right now keeps it.
 *
 * Bound: this runs under the lock, so it reads only what can hold a lease:
 * the tables of records that are not Free (a record is freed only after its
 * entries were dropped, each under its bucket's lock), each up to its
 * high-water mark lease_hwm (entries beyond were never used). That is at
 * most the sum over attached processes of the most leases each held at once,
 * never more than max_procs * max_leases entries; plus two walks of the
 * chain (at most nslots steps each).
 */
static void repair_bucket(struct sfs_cache *c, uint32_t b)
{
    uint32_t s;

    chain_check(c, b, true);
    s = atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed);
    for (uint32_t k = 0; s != SFS_NIL && slot_ok(c, s) && k < c->nslots; k++) {
        sfs_slot_recount(c, s);
        /* A slot nobody leases has no live waiter: a waiter killed in its
         * sleep leaves no count behind (see sfs_refcount_drop in lease.c). */
        if (sfs_slot_refs(&c->slots[s]) == 0)
            atomic_store_explicit(&c->slots[s].nwaiters, 0, memory_order_relaxed);
        s = atomic_load_explicit(&c->slots[s].next, memory_order_relaxed);
    }
    sfs_log(LOG_WARNING, "bucket %u: lock holder died; chain repaired", b);
}

/* What a lock call returned: a dead holder's bucket is repaired, then ours. */
int sfs_bucket_locked(struct sfs_cache *c, uint32_t b, int r)
{
    if (r == EOWNERDEAD) {
        repair_bucket(c, b);
        pthread_mutex_consistent(&c->buckets[b].lock);
        return 0;
    }
    return -r;
}

int sfs_robust_lock_until(pthread_mutex_t *m, int64_t deadline_ns)
{
    struct timespec ts;

    if (deadline_ns == 0)
        deadline_ns = sfs_now_ns() + LOCK_WAIT_NS;
#if defined(__SANITIZE_THREAD__)
    /* ThreadSanitizer (GCC 12) does not intercept clocklock and would take
     * the lock for never taken: the same deadline on CLOCK_REALTIME. */
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t rt = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + (deadline_ns - sfs_now_ns());
    ts.tv_sec = rt / 1000000000;
    ts.tv_nsec = rt % 1000000000;
    return pthread_mutex_timedlock(m, &ts);
#else
    ts.tv_sec = deadline_ns / 1000000000;
    ts.tv_nsec = deadline_ns % 1000000000;
    return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
#endif
}

int sfs_bucket_lock_wait(struct sfs_cache *c, uint32_t b, int64_t deadline_ns)
{
    if (deadline_ns < 0)
        return -EBUSY;
    /* A robust mutex: EOWNERDEAD when the holder died, ETIMEDOUT when it
     * lives but keeps the lock past our deadline. */
    int r = sfs_robust_lock_until(&c->buckets[b].lock, deadline_ns);

    return r ? sfs_bucket_locked(c, b, r) : 0;
}

/* Unlink s from chain b (lock held). Returns false if s is not on it. */
bool sfs_chain_unlink(struct sfs_cache *c, uint32_t b, uint32_t s)
{
    _Atomic uint32_t *link = &c->buckets[b].head;
    uint32_t n = 0;

    for (;;) {
        uint32_t cur = atomic_load_explicit(link, memory_order_relaxed);

        if (cur == SFS_NIL || !slot_ok(c, cur) || ++n > c->nslots)
            return false;
        if (cur == s) {
            /* One store removes it: a crash before or after leaves a chain. */
            atomic_store_explicit(link,
                                  atomic_load_explicit(&c->slots[s].next, memory_order_relaxed),
                                  memory_order_release);
            return true;
        }
        link = &c->slots[cur].next;
    }
}

/*
 * Take the header's proc_lock, with bucket_lock's deadline meaning (0:
 * LOCK_WAIT_NS; LOCK_TRY: only if free). The retired counters it guards need
 * no repair after a dead holder: a fold cut short loses that one record's
 * last counts, nothing else.
 */
int sfs_proc_lock(struct sfs_cache *c, int64_t deadline_ns)
{
    pthread_mutex_t *m = &c->hdr->proc_lock;
    int r = pthread_mutex_trylock(m);

    if (r == EBUSY) {
        if (deadline_ns < 0)
            return -EBUSY;
        r = sfs_robust_lock_until(m, deadline_ns);
    }
    if (r == EOWNERDEAD) {
        pthread_mutex_consistent(m);
        r = 0;
    }
    return -r;
}
