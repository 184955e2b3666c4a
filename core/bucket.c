/* SPDX-License-Identifier: MIT */
/*
 * bucket.c - bucket locks, the chains they protect, and their repair.
 *
 * Every bucket lock is a robust process-shared mutex. When a process dies
 * holding one, the next locker gets EOWNERDEAD and repairs the chain: walks
 * it (bounded, indices checked), and recounts each slot's refcount from the
 * lease tables, which change only under the same lock. The order of writes
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
 * A process died holding bucket b's lock. Cut the chain at any bad link and
 * recount each chain slot's refcount from the lease tables: entries for slots
 * on this chain change only under this lock, so the count is exact.
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
    uint32_t chain[64], n = 0, s;
    bool all = false;

    chain_check(c, b, true);
    s = atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed);
    while (s != SFS_NIL && slot_ok(c, s)) {
        if (n < 64)
            chain[n++] = s;
        else
            all = true;
        atomic_store_explicit(&c->slots[s].refcount, 0, memory_order_relaxed);
        s = atomic_load_explicit(&c->slots[s].next, memory_order_relaxed);
    }
    for (uint32_t p = 0; p < c->max_procs; p++) {
        _Atomic uint32_t *t = lease_table(c, p);
        /* Acquire: pairs with the release that freed the record / raised
         * the mark before an entry beyond it was written. */
        if (atomic_load_explicit(&c->procs[p].state, memory_order_acquire) == PROC_FREE)
            continue;
        uint32_t hwm = atomic_load_explicit(&c->procs[p].lease_hwm, memory_order_acquire);
        if (hwm > c->max_leases)
            hwm = c->max_leases; /* input: bounded by the table */

        for (uint32_t e = 0; e < hwm; e++) {
            uint32_t v = ENTRY_SLOT1(atomic_load_explicit(&t[e], memory_order_relaxed));

            if (v == SFS_ENTRY_FREE || !slot_ok(c, v - 1))
                continue;
            s = v - 1;
            bool on = false;
            if (all) {
                on = atomic_load_explicit(&c->slots[s].bucket, memory_order_relaxed) == b;
            } else {
                for (uint32_t i = 0; i < n && !on; i++)
                    on = chain[i] == s;
            }
            if (on)
                atomic_fetch_add_explicit(&c->slots[s].refcount, 1, memory_order_relaxed);
        }
    }
    /* A slot nobody leases has no live waiter: a waiter killed in its
     * sleep leaves no count behind (see refcount_drop in lease.c). */
    s = atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed);
    for (uint32_t k = 0; s != SFS_NIL && slot_ok(c, s) && k < c->nslots; k++) {
        if (atomic_load_explicit(&c->slots[s].refcount, memory_order_relaxed) == 0)
            atomic_store_explicit(&c->slots[s].nwaiters, 0, memory_order_relaxed);
        s = atomic_load_explicit(&c->slots[s].next, memory_order_relaxed);
    }
    sfs_log(LOG_WARNING, "bucket %u: lock holder died; chain repaired", b);
}

/* What a lock call returned: a dead holder's bucket is repaired, then ours. */
int bucket_locked(struct sfs_cache *c, uint32_t b, int r)
{
    if (r == EOWNERDEAD) {
        repair_bucket(c, b);
        pthread_mutex_consistent(&c->buckets[b].lock);
        return 0;
    }
    return -r;
}

int robust_lock_until(pthread_mutex_t *m, int64_t deadline_ns)
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

int bucket_lock_wait(struct sfs_cache *c, uint32_t b, int64_t deadline_ns)
{
    if (deadline_ns < 0)
        return -EBUSY;
    /* A robust mutex: EOWNERDEAD when the holder died, ETIMEDOUT when it
     * lives but keeps the lock past our deadline. */
    int r = robust_lock_until(&c->buckets[b].lock, deadline_ns);

    return r ? bucket_locked(c, b, r) : 0;
}

/* Unlink s from chain b (lock held). Returns false if s is not on it. */
bool chain_unlink(struct sfs_cache *c, uint32_t b, uint32_t s)
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

