/* SPDX-License-Identifier: MIT */
/*
 * sample.c - a read-only look at which Ready slots were used: the query the
 * daemon's hot-set sampler (fs/usage.c) calls about once a second.
 *
 * It reads what the hit path already writes (the CLOCK accessed bit, the
 * slot's lease count) and writes nothing shared: no counter, no bit, no
 * lock held longer than one chain walk. A bucket whose lock is busy is
 * skipped (trylock, never a wait), so the sampler never queues behind a Get;
 * what it skips it sees at the next sample. A call visits at most
 * max_buckets buckets from a cursor the caller keeps, so the caller bounds
 * the cost of each call whatever the cache's size: O(max_buckets + the
 * slots on their chains), no allocation.
 */
#include "slot_i.h"


int sfs_cache_sample(struct sfs_cache *c, uint32_t *cursor, uint32_t max_buckets, sfs_sample_fn *fn,
                     void *arg)
{
    uint32_t b, n;
    int r = 0;

    if (!c || !fn || !cursor)
        return -EINVAL;
    n = max_buckets && max_buckets < c->nbuckets ? max_buckets : c->nbuckets;
    b = *cursor & c->bucket_mask; /* nbuckets is a power of two */
    for (uint32_t i = 0; i < n && r == 0; i++, b = (b + 1) & c->bucket_mask) {
        /* Relaxed racy peek: an empty chain is skipped without its lock; a
         * snapshot may miss a key linked just now (the next sample sees it). */
        if (atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed) == SFS_NIL)
            continue;
        if (bucket_lock(c, b, LOCK_TRY) < 0)
            continue; /* busy (a Get is on it) or unrecoverable: skipped */
        SFS_CHAIN_EACH(c, b, s) {
            struct sfs_slot_rec *sl = &c->slots[s];
            /* Relaxed: a snapshot; the key fields are stable under the lock. */
            uint32_t st = atomic_load_explicit(&sl->state, memory_order_relaxed);

            if (st == SFS_STATE_READY) {
                struct sfs_key k;
                bool acc = atomic_load_explicit(&sl->accessed, memory_order_relaxed) != 0;
                /* Counted leases, then the hit lines (procs_used lines). */
                bool leased = sfs_slot_refs(sl) != 0 || (c->nhit && sfs_hit_leased(c, s));

                slot_key_load(sl, &k);
                /* Under the lock: fn must not call into the cache. */
                r = fn(&k, s, acc, leased, arg);
                if (r)
                    break;
            }
        }
        bucket_unlock(c, b);
    }
    *cursor = b;
    return r;
}
