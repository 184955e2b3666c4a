/* SPDX-License-Identifier: MIT */
/*
 * evict.c - taking a slot for a new key: never-used slots first, then CLOCK;
 * and waiting for one when every slot is leased.
 *
 * Eviction is CLOCK second chance (see docs/eviction.md for the essay). The
 * hand is a shared counter; an evictor holding its own bucket lock scans at
 * most two laps: a set accessed bit is cleared and skipped, a clear bit on an
 * unleased slot is the victim. After one lap of set bits the second lap meets
 * the first position again with its bit now clear: that is the "raw hand"
 * fallback (design.md, section 4), with no special case. A victim in another bucket is
 * taken only with trylock, so two evictors never wait on each other's locks.
 *
 * A slot moves between chains by unlink, bucket, key, link (bucket.c says why
 * any prefix of that is repairable): a slot that names a bucket but is on no
 * chain is an orphan cut off by a dead mover, and the evictor that finds it
 * takes it.
 */
#include "admit_i.h"
#include "slot_i.h"

#include <string.h>

/* One more eviction in the domain of the slot's key (read under the
 * victim's bucket lock). Relaxed: a counter, summed by /stats. */
static void count_domain_eviction(struct sfs_cache *c, const struct sfs_slot_rec *sl)
{
    uint32_t d = sfs_domain_of(
        c, atomic_load_explicit((_Atomic uint32_t *)&sl->shard, memory_order_relaxed));

    atomic_fetch_add_explicit(&c->hdr->part_evictions[d], 1, memory_order_relaxed);
}

/* Try to take slot s for bucket b (b locked). Returns 0 with s detached and
 * s->bucket == b, -EBUSY when its bucket was busy, or -EAGAIN to move on. */
static int take_slot(struct sfs_cache *c, uint32_t b, uint32_t s)
{
    struct sfs_slot_rec *sl = &c->slots[s];
    uint32_t sb = atomic_load_explicit(&sl->bucket, memory_order_acquire);

    if (sb == SFS_NIL) {
        /* A free slot: the CAS is the claim (acq_rel: pairs with remove()). */
        uint32_t nil = SFS_NIL;
        return atomic_compare_exchange_strong_explicit(&sl->bucket, &nil, b, memory_order_acq_rel,
                                                       memory_order_relaxed)
                   ? 0
                   : -EAGAIN;
    }
    if (sb >= c->nbuckets)
        return -EAGAIN; /* corrupt hint: never index with it */
    SFS_TEST_POINT("evict:candidate");
    if (sb != b && bucket_lock(c, sb, LOCK_TRY) < 0)
        return -EBUSY; /* another evictor or reader holds it: not "all leased" */
    int r = -EAGAIN;
    if (atomic_load_explicit(&sl->bucket, memory_order_relaxed) != sb)
        goto out_unlock;
    /* Pinned, and the pin lasts: not a victim (an expired pin's flag is
     * cleared here, and the slot is one like any other). */
    if (sfs_slot_pin_holds(c, sl))
        goto out_unlock;
    /* Leased after all (the scan's look was a hint): never unlinked. The
     * count is checked before the unlink, so at no instant is a leased slot
     * off its chain: a death there left one, and the next Get of its key
     * became a second owner. An orphan is reclaimed only at refcount 0. The
     * check is the CAS that closes the slot to lock-free hits: one that
     * took a lease first makes it fail, one that comes later fails its own. */
    if (!slot_close_free(c, s))
        goto out_unlock;
    if (!sfs_chain_unlink(c, sb, s)) {
        /* On no chain though it names one: cut off by a dead mover. Ours. */
        sfs_log(LOG_NOTICE, "slot %u: orphan reclaimed", s);
    } else {
        uint32_t st = atomic_load_explicit(&sl->state, memory_order_relaxed);

        if (st == SFS_STATE_READY)
            sfs_ctr_add(c, CTR_RESIDENT_DELTA,
                        -(int64_t)atomic_load_explicit(&sl->length, memory_order_relaxed));
        if (st != SFS_STATE_FREE) {
            sfs_ctr_add(c, CTR_EVICTIONS, 1);
            count_domain_eviction(c, sl);
        }
    }
    SFS_TEST_POINT("evict:unlinked");
    atomic_store_explicit(&sl->bucket, b, memory_order_relaxed);
    r = 0;
out_unlock:
    if (sb != b)
        bucket_unlock(c, sb);
    return r;
}

static int take_fresh(struct sfs_cache *c, uint32_t b, _Atomic uint32_t *fresh, uint32_t base,
                      uint32_t n, uint32_t *out)
{
    /* Relaxed: the counter only hands out indices; the CAS on bucket claims. */
    while (atomic_load_explicit(fresh, memory_order_relaxed) < n) {
        uint32_t i = atomic_fetch_add_explicit(fresh, 1, memory_order_relaxed);

        if (i >= n)
            break;
        if (take_slot(c, b, base + i) == 0) {
            *out = base + i;
            return 0;
        }
    }
    return -ENOSPC;
}

/*
 * CLOCK over slots [base, base + n): at most two laps. A set bit is cleared
 * (leased or not) and skipped; the first clear, unleased slot is the victim.
 * With `passed` (admission=scan, regular pool), the admission may have the
 * hand pass over a slot untouched; *passed then says it did.
 */
static int clock_scan(struct sfs_cache *c, uint32_t b, _Atomic uint64_t *hand, uint32_t base,
                      uint32_t n, uint32_t *out, bool *busy, bool *passed)
{
    if (n == 0)
        return -ENOSPC;
    for (uint64_t step = 0; step < 2ull * n; step++) {
        /* Relaxed: concurrent evictors share the hand; each position is
         * examined by one of them. */
        uint32_t s =
            base + (uint32_t)(atomic_fetch_add_explicit(hand, 1, memory_order_relaxed) % n);
        struct sfs_slot_rec *sl = &c->slots[s];

        if (passed && sfs_admit_pass(c, sl)) {
            *passed = true;
            continue;
        }
        if (atomic_load_explicit(&sl->accessed, memory_order_relaxed)) {
            atomic_store_explicit(&sl->accessed, 0, memory_order_relaxed);
            continue;
        }
        if (sfs_slot_refs(sl) != 0)
            continue; /* hint; re-checked under the lock */
        if (atomic_load_explicit(&sl->pin, memory_order_relaxed) &&
            sfs_slot_pin_hint(c, sl))
            continue; /* hint; re-checked under the lock (take_slot) */
        int r = take_slot(c, b, s);

        if (r == 0) {
            *out = s;
            return 0;
        }
        if (r == -EBUSY)
            *busy = true;
    }
    return -ENOSPC;
}

/*
 * An eviction domain: its share of each pool and its hands. Domain d owns
 * regular slots [part_end[d - 1], part_end[d]) and reserved slots likewise
 * (equal shares by default, or as weighted at create: ctl.c), so a domain's
 * budget is a hard bound by construction: its keys are only ever installed
 * in its own ranges. With P = 1 this is the whole pools and the header's
 * hands, exactly as before domains.
 */
struct domain {
    _Atomic uint64_t *hand, *hand_reserved;
    _Atomic uint32_t *fresh, *fresh_reserved;
    uint32_t base, n, rbase, rn;
};

static void domain_get(struct sfs_cache *c, uint32_t d, struct domain *o)
{
    struct sfs_header *h = c->hdr;

    if (d == 0) {
        o->hand = &h->hand;
        o->hand_reserved = &h->hand_reserved;
        o->fresh = &h->fresh;
        o->fresh_reserved = &h->fresh_reserved;
    } else {
        o->hand = &h->dom[d - 1].hand;
        o->hand_reserved = &h->dom[d - 1].hand_reserved;
        o->fresh = &h->dom[d - 1].fresh;
        o->fresh_reserved = &h->dom[d - 1].fresh_reserved;
    }
    o->base = d ? c->part_end[d - 1] : 0;
    o->n = c->part_end[d] - o->base;
    o->rbase = c->nregular + (d ? c->part_rend[d - 1] : 0);
    o->rn = c->nregular + c->part_rend[d] - o->rbase;
}

/* -ENOSPC when every candidate was leased (or pinned); -EAGAIN when some
 * unleased one sat in a bucket that was busy at that instant (worth another
 * try). Only the slots of domain `dom` are candidates. */
int sfs_alloc_slot(struct sfs_cache *c, uint32_t b, uint32_t dom, unsigned pools, uint32_t *out)
{
    struct domain d;
    bool busy = false;

    SFS_ASSERT(dom < c->npartitions);
    domain_get(c, dom, &d);
    if (pools & POOL_REGULAR) {
        if (take_fresh(c, b, d.fresh, d.base, d.n, out) == 0)
            return 0;
        if (!(pools & POOL_FRESH_ONLY)) {
            bool passed = false;

            if (clock_scan(c, b, d.hand, d.base, d.n, out, &busy, c->admit_scan ? &passed : NULL) ==
                0)
                return 0;
            /* The admission passed over main slots and found no victim:
             * plain CLOCK, so it never turns a free slot into -ENOSPC. */
            if (passed && clock_scan(c, b, d.hand, d.base, d.n, out, &busy, NULL) == 0)
                return 0;
        }
    }
    if (pools & POOL_RESERVED) {
        if (take_fresh(c, b, d.fresh_reserved, d.rbase, d.rn, out) == 0)
            return 0;
        if (clock_scan(c, b, d.hand_reserved, d.rbase, d.rn, out, &busy, NULL) == 0)
            return 0;
    }
    return busy ? -EAGAIN : -ENOSPC;
}

/* Put key on slot s (detached, s->bucket == b, b locked) in `state`. */
void sfs_install(struct sfs_cache *c, uint32_t b, uint32_t s, const struct sfs_key *k, uint32_t state,
             bool prefetch)
{
    struct sfs_slot_rec *sl = &c->slots[s];
    uint8_t flags = s >= c->nregular ? SLOT_F_RESERVED : 0;

    SFS_ASSERT(s < c->nslots && b < c->nbuckets);
    /* Relaxed atomic stores: a lock-free hit may read the key while we write
     * it (and then fails its CAS or its check: the slot is closed). */
    slot_key_store(sl, k);
    make_owner(c, sl);
    flags |= sfs_admit_new(c, s); /* admission=scan: probationary until hit */
    atomic_store_explicit(&sl->flags, flags | (prefetch ? SLOT_F_PREFETCHED : 0),
                          memory_order_relaxed);
    atomic_store_explicit(&sl->refcount, 0, memory_order_relaxed);
    /* A new load gets a second chance; a prewarmed guess does not. */
    atomic_store_explicit(&sl->accessed, state == SFS_STATE_LOADING, memory_order_relaxed);
    set_state(sl, state);
    sfs_pin_on_load(c, sl); /* a Prealloc'd (Idle) slot is no pin's */
    chain_link(c, b, s);
    uint32_t m = atomic_load_explicit(&c->hdr->max_shard, memory_order_relaxed);
    while (k->shard > m &&
           !atomic_compare_exchange_weak_explicit(&c->hdr->max_shard, &m, k->shard,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
}

uint32_t sfs_release_wait_begin(struct sfs_cache *c)
{
    struct sfs_header *h = c->hdr;

    /* seq_cst, and a full fence before the caller's rescan reads any
     * refcount: pairs with sfs_refcount_drop's fence (Dekker). */
    atomic_fetch_add_explicit(&h->release_waiters, 1, memory_order_seq_cst);
    /* Relaxed: our share of the count above, read only by the reaper after
     * our death. Raised after the header's count and lowered before it, so
     * a death between the two leaves the header's count high (one spare
     * wake per release), never low. */
    atomic_fetch_add_explicit(&c->self->release_waiting, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load_explicit(&h->release_seq, memory_order_seq_cst);
}

void sfs_release_wait_end(struct sfs_cache *c)
{
    atomic_fetch_sub_explicit(&c->self->release_waiting, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&c->hdr->release_waiters, 1, memory_order_seq_cst);
}

int sfs_wait_for_release(struct sfs_cache *c, uint32_t seq, int64_t deadline_ns)
{
    struct sfs_header *h = c->hdr;
    int r = 0;

    if (atomic_load_explicit(&h->release_seq, memory_order_seq_cst) == seq) {
        int64_t slice = sfs_now_ns() + OWNER_CHECK_NS;

        SFS_TEST_POINT("evict:release_sleep");
        r = sfs_futex_wait(&h->release_seq, seq, slice < deadline_ns ? slice : deadline_ns);
    }
    return r == -ETIMEDOUT || r == -EAGAIN || r == -EINTR ? 0 : r;
}
