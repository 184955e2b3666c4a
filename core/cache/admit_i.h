/* SPDX-License-Identifier: MIT */
/*
 * admit_i.h - the scan-resistant admission's hooks (admit.c), for evict.c
 * (where a new load enters, where the hand decides) and cache.c (a hit).
 *
 * With admission=clock every hook is a no-op: the flag it tests is never set
 * and the hand never asks.
 */
#ifndef SHARDFS_ADMIT_I_H
#define SHARDFS_ADMIT_I_H

#include "cache_i.h"

#include <stdbool.h>
#include <stdint.h>

/* Share of the regular pool, in percent, above which the hand passes over
 * main slots to take probationary ones (docs/eviction.md says why 50 and
 * not S3-FIFO's 10: a shorter probation evicts released, not yet copied
 * loads). */
#define SFS_ADMIT_SHARE_PCT 50u

/* The flags a new key's slot s starts with: SLOT_F_PROBATION or 0. */
uint8_t sfs_admit_new(const struct sfs_cache *c, uint32_t s);

/* The regular pool's hand is at sl (unlocked; every read a hint). Counts it
 * in this process's census, promotes a leased probationary slot (it is in
 * use), and returns true when the hand must pass over it untouched: a main
 * slot while probation holds more than its share. */
bool sfs_admit_pass(struct sfs_cache *c, struct sfs_slot_rec *sl);

/* A second access (a hit, a wait on a load, Touch) with the flags as the
 * caller read them: a probationary key is promoted to main. Relaxed: the
 * flag is a policy hint; the fetch_and keeps the other bits. */
static inline void sfs_admit_hit(struct sfs_slot_rec *sl, uint8_t flags)
{
    if (flags & SLOT_F_PROBATION)
        atomic_fetch_and_explicit(&sl->flags, (uint8_t)~SLOT_F_PROBATION, memory_order_relaxed);
}

/* A use of a slot (a hit, a wait on its load, Touch): its CLOCK bit, and
 * the admission's second access. The one place every path marks a use, so
 * the hit paths cannot drift apart. Relaxed: the bit is a hint the hand
 * reads; it is stored only when clear, so a hot slot's line is not written
 * on every hit. */
static inline void sfs_slot_use(struct sfs_slot_rec *sl, uint8_t flags)
{
    if (!atomic_load_explicit(&sl->accessed, memory_order_relaxed))
        atomic_store_explicit(&sl->accessed, 1, memory_order_relaxed);
    sfs_admit_hit(sl, flags);
}

/* The first hit on a prefetched load counts one prefetch hit. The lock-free
 * hit and a locked Get may race on the flag: whoever's fetch_and cleared it
 * counts, the other does not. Relaxed: a counter and a flag of its own. */
static inline void sfs_slot_prefetch_hit(struct sfs_cache *c, struct sfs_slot_rec *sl, uint8_t flags)
{
    if ((flags & SLOT_F_PREFETCHED) &&
        (atomic_fetch_and_explicit(&sl->flags, (uint8_t)~SLOT_F_PREFETCHED, memory_order_relaxed) &
         SLOT_F_PREFETCHED))
        sfs_ctr_add(c, CTR_PREFETCH_HITS, 1);
}

#endif /* SHARDFS_ADMIT_I_H */
