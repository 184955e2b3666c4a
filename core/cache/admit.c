/* SPDX-License-Identifier: MIT */
/*
 * admit.c - scan-resistant admission (-o admission=scan): a new key is
 * probationary until its second access, and while probationary keys hold
 * more than SFS_ADMIT_SHARE_PCT of the regular pool the CLOCK hand takes
 * victims among them only, passing main slots untouched (bits included).
 *
 * This is S3-FIFO's small queue laid over the one CLOCK ring: the hand meets
 * probationary slots in the order they were loaded (a new key takes the
 * victim's position, just behind the hand), so among them it is a FIFO, and
 * a key loaded once by a scan is evicted before any key that was used twice.
 * The new-load bit stays: a probationary slot still gets its one lap.
 *
 * State: one flag bit per slot (SLOT_F_PROBATION, shared) and this process's
 * census of what its hand saw (process-local). Crash safety: the flag is a
 * hint with no invariant attached. A death at any instant leaves at worst a
 * key in the wrong class (main that should be probationary or the reverse),
 * which costs hit rate until the key is hit or evicted, never a lease, a
 * chain or a byte; the census dies with its process and a new one starts
 * empty (an empty census never passes over main slots). A hand that passed
 * over main slots and found nothing scans again as plain CLOCK (evict.c),
 * so the admission can never turn a free slot into -ENOSPC.
 *
 * See docs/eviction.md, "Scan-resistant admission".
 */
#include "admit_i.h"

#include "slot_i.h"

uint8_t sfs_admit_new(const struct sfs_cache *c, uint32_t s)
{
    /* The reserved pool has its own hand and stays plain CLOCK. */
    return c->admit_scan && s < c->nregular ? SLOT_F_PROBATION : 0;
}

bool sfs_admit_pass(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    if (!c->admit_scan)
        return false;
    /* Relaxed throughout: the flag and the census are estimates; a lost
     * update misplaces one key or miscounts one visit. */
    bool prob = atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PROBATION;

    if (prob && sfs_slot_refs(sl) != 0) {
        /* Held: the hand cannot take it anyway, and it is being used. */
        atomic_fetch_and_explicit(&sl->flags, (uint8_t)~SLOT_F_PROBATION, memory_order_relaxed);
        prob = false;
    }
    /* The census: of the last nregular slots this process's hand visited
     * (one lap's worth), how many were probationary. The decision uses the
     * last complete window: a running ratio would swing with the order of
     * the ring (main slots lie together, in the order they were loaded). */
    uint32_t seen = atomic_fetch_add_explicit(&c->adm_seen, 1, memory_order_relaxed) + 1;
    uint32_t np = atomic_load_explicit(&c->adm_prob, memory_order_relaxed) + prob;

    if (prob)
        atomic_store_explicit(&c->adm_prob, np, memory_order_relaxed);
    if (seen >= c->nregular) {
        atomic_store_explicit(&c->adm_last, np, memory_order_relaxed);
        atomic_store_explicit(&c->adm_seen, 0, memory_order_relaxed);
        atomic_store_explicit(&c->adm_prob, 0, memory_order_relaxed);
    }
    return !prob && (uint64_t)atomic_load_explicit(&c->adm_last, memory_order_relaxed) * 100u >
                        (uint64_t)c->nregular * SFS_ADMIT_SHARE_PCT;
}
