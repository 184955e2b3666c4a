/* SPDX-License-Identifier: MIT */
/*
 * pin.c - pins: a block kept resident until an absolute expiry, within a
 * budget of slots.
 *
 * A pin is one entry of a table in shared memory: a block id and the
 * CLOCK_MONOTONIC instant its pin ends. No process owns it and no thread
 * times it: the evictor (and sfs_install) compare the expiry with the clock, so
 * a pin ends at its expiry whether its maker lives or not. That is the whole
 * crash story: a process killed while holding pins leaves entries that stop
 * counting at their expiry, and the next sweep frees them.
 *
 * A slot of a pinned block carries SLOT_F_PINNED, set and cleared under its
 * bucket lock, and each flagged slot is charged to hdr->pinned_slots, which
 * never exceeds the budget (every charge is a bounded CAS). The flag alone
 * proves nothing: the evictor keeps a flagged slot only while the table says
 * the block's pin lasts, and clears the flag (and the charge) of one whose
 * pin ended. Sweeps (every pin call, every pinned-bytes read) free expired
 * entries and unflag their slots, so the budget and the gauge come back.
 *
 * Table entries are written only under hdr->pin_lock, as a seqlock; readers
 * (the evictor, sfs_install) are lock-free. Lock order: pin_lock, then bucket
 * locks; the evictor and sfs_install never take pin_lock. An entry lives in the
 * PIN_PROBE entries from its block's hash. The hit path never looks at pins.
 */
#include "slot_i.h"

#include <stdlib.h>
#include <string.h>

#define PIN_PROBE      16 /* entries a block's pin may sit in, from its hash */
#define PIN_READ_TRIES 64

/* What a lock-free look at the table says. */
#define PIN_UNKNOWN INT64_MAX /* an entry kept changing under the reader */

static uint32_t pin_home(const struct sfs_cache *c, const uint8_t *block)
{
    struct sfs_block_id id;

    memcpy(id.b, block, sizeof(id.b));
    return (uint32_t)sfs_key_hash(&id) & (c->npins - 1);
}

static void block_words(const uint8_t *block, uint64_t w[2])
{
    memcpy(w, block, 16);
}

/*
 * The expiry of block's pin: 0 if it has none, PIN_UNKNOWN if an entry kept
 * changing (a writer died in it: the next writer repairs it). Lock-free.
 */
static int64_t pin_expiry(const struct sfs_cache *c, const uint64_t w[2])
{
    uint32_t home = pin_home(c, (const uint8_t *)w);

    for (uint32_t i = 0; i < PIN_PROBE; i++) {
        struct sfs_pin_rec *p = &c->pins[(home + i) & (c->npins - 1)];
        int t;

        for (t = 0; t < PIN_READ_TRIES; t++) {
            /* Acquire: pairs with the writer's release of the even seq, so
             * the fields read below are at least that update's. */
            uint32_t s1 = atomic_load_explicit(&p->seq, memory_order_acquire);

            if (s1 & 1)
                continue;
            int64_t e = atomic_load_explicit(&p->expiry_ns, memory_order_relaxed);
            uint64_t a = __atomic_load_n((const key_word *)p->block, __ATOMIC_RELAXED);
            uint64_t b = __atomic_load_n((const key_word *)(p->block + 8), __ATOMIC_RELAXED);

            /* Acquire fence: the loads above happen before the re-read of
             * seq (the seqlock's reader side). */
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&p->seq, memory_order_relaxed) != s1)
                continue;
            if (e != 0 && a == w[0] && b == w[1])
                return e;
            break;
        }
        if (t == PIN_READ_TRIES)
            return PIN_UNKNOWN;
    }
    return 0;
}

/* Writers (pin_lock held): rewrite entry p. */
static void pin_write(struct sfs_pin_rec *p, const uint8_t *block, int64_t expiry)
{
    uint64_t w[2] = {0, 0};

    if (block)
        block_words(block, w);
    /* Relaxed increments to odd, then a release fence: readers that see any
     * of the new fields see the odd seq on their re-read. */
    atomic_fetch_add_explicit(&p->seq, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    __atomic_store_n((key_word *)p->block, w[0], __ATOMIC_RELAXED);
    __atomic_store_n((key_word *)(p->block + 8), w[1], __ATOMIC_RELAXED);
    atomic_store_explicit(&p->expiry_ns, expiry, memory_order_relaxed);
    /* Release: the fields are visible before the even seq. */
    atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
}

/* ---------------------------------------------------------------------------
 * The slot side (bucket lock held), for evict.c, cache.c and the walks.
 */

/* Charge one pinned slot if the budget has room. Relaxed CAS: a counter
 * whose bound is all that matters; the flag it pays for is under a lock. */
static bool pin_charge(struct sfs_cache *c)
{
    uint32_t v = atomic_load_explicit(&c->hdr->pinned_slots, memory_order_relaxed);

    do {
        if (v >= c->pin_budget)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&c->hdr->pinned_slots, &v, v + 1,
                                                    memory_order_relaxed, memory_order_relaxed));
    return true;
}

static void pin_uncharge(struct sfs_cache *c, uint32_t n)
{
    /* Relaxed: see pin_charge. Never below 0 (a corrupt count stays 0). */
    uint32_t v = atomic_load_explicit(&c->hdr->pinned_slots, memory_order_relaxed);

    do {
        if (v == 0)
            return;
    } while (!atomic_compare_exchange_weak_explicit(&c->hdr->pinned_slots, &v, v > n ? v - n : 0,
                                                    memory_order_relaxed, memory_order_relaxed));
}

static void slot_unflag(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    /* Relaxed: flags are written under the bucket lock we hold. */
    if (atomic_fetch_and_explicit(&sl->flags, (uint8_t)~SLOT_F_PINNED, memory_order_relaxed) &
        SLOT_F_PINNED)
        pin_uncharge(c, 1);
}

/* A slot's block id, as a lock-free reader may read it while sfs_install
 * writes it (relaxed atomic words, as the lock-free hit reads them). */
static void slot_block_words(const struct sfs_slot_rec *sl, uint64_t w[2])
{
    w[0] = __atomic_load_n((const key_word *)sl->block, __ATOMIC_RELAXED);
    w[1] = __atomic_load_n((const key_word *)(sl->block + 8), __ATOMIC_RELAXED);
}

/* Whether a slot holds its shard or is being filled with it: the only slots
 * a pin counts. A Prealloc'd slot (Idle: a guess that the shard will be
 * read, perhaps of a shard the store does not have) and a failed load hold
 * nothing, and a pin that kept them would spend its budget and the cache's
 * slots on nothing until its expiry. */
static bool slot_holds_data(const struct sfs_slot_rec *sl)
{
    uint32_t st = atomic_load_explicit(&sl->state, memory_order_relaxed);

    return st == SFS_STATE_READY || st == SFS_STATE_LOADING;
}

bool sfs_slot_pin_hint(struct sfs_cache *c, const struct sfs_slot_rec *sl)
{
    uint64_t w[2];

    if (!slot_holds_data(sl))
        return false;
    slot_block_words(sl, w);
    int64_t e = pin_expiry(c, w);

    return e != 0 && (e == PIN_UNKNOWN || e > sfs_now_ns());
}

bool sfs_slot_pin_holds(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    if (!(atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PINNED))
        return false;
    if (sfs_slot_pin_hint(c, sl))
        return true;
    slot_unflag(c, sl);
    return false;
}

void sfs_pin_on_load(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    /* Relaxed: a hint; a pin made after this look flags the slot itself
     * (its walk runs after its entry is visible). */
    if (atomic_load_explicit(&c->hdr->pins_used, memory_order_relaxed) == 0 ||
        !slot_holds_data(sl) ||
        (atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PINNED))
        return;
    uint64_t w[2];

    slot_block_words(sl, w);
    int64_t e = pin_expiry(c, w);

    if (e != 0 && e != PIN_UNKNOWN && e > sfs_now_ns() && pin_charge(c))
        atomic_fetch_or_explicit(&sl->flags, (uint8_t)SLOT_F_PINNED, memory_order_relaxed);
}

void sfs_pin_on_fail(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    /* A load that failed holds nothing (slot_holds_data). The flag is
     * cleared by an atomic read-modify-write, so its charge is returned
     * once, whoever clears it; a walk that flags the slot just before it
     * failed leaves the evictor to clear it (sfs_slot_pin_holds). */
    slot_unflag(c, sl);
}

void sfs_pin_on_unlink(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    slot_unflag(c, sl);
}

/* ---------------------------------------------------------------------------
 * The table's writers: pin, unpin, sweep (pin_lock held).
 */

static int pin_lock(struct sfs_cache *c)
{
    pthread_mutex_t *m = &c->hdr->pin_lock;
    int r = sfs_robust_lock_until(m, sfs_now_ns() + LOCK_WAIT_NS);

    if (r == EOWNERDEAD) {
        /* A writer died mid-update: an entry with an odd seq is half
         * written. Free it (its block's slots are unflagged by the
         * evictor, which then finds no pin). */
        for (uint32_t i = 0; i < c->npins; i++) {
            struct sfs_pin_rec *p = &c->pins[i];

            if (atomic_load_explicit(&p->seq, memory_order_relaxed) & 1) {
                atomic_fetch_add_explicit(&p->seq, 1, memory_order_relaxed);
                pin_write(p, NULL, 0);
            }
        }
        pthread_mutex_consistent(m);
        r = 0;
    }
    return -r;
}

/* Visit, under their bucket locks, the slots of `block` (any state). */
typedef void slot_fn(struct sfs_cache *c, struct sfs_slot_rec *sl, void *arg);

static void walk_block(struct sfs_cache *c, const uint8_t *block, slot_fn *fn, void *arg)
{
    struct sfs_block_id id;
    uint32_t max_shard = atomic_load_explicit(&c->hdr->max_shard, memory_order_relaxed);
    uint32_t span = max_shard >= c->nbuckets - 1 ? c->nbuckets : max_shard + 1;
    uint64_t w[2];

    memcpy(id.b, block, sizeof(id.b));
    block_words(block, w);
    uint64_t h = sfs_key_hash(&id);

    for (uint32_t k = 0; k < span; k++) {
        uint32_t b = (uint32_t)(h + k) & c->bucket_mask;

        if (bucket_lock(c, b, 0) < 0)
            continue;
        SFS_CHAIN_EACH(c, b, s) {
            struct sfs_slot_rec *sl = &c->slots[s];
            uint64_t v[2];

            slot_block_words(sl, v);
            if (v[0] == w[0] && v[1] == w[1] &&
                atomic_load_explicit(&sl->state, memory_order_relaxed) != SFS_STATE_FREE)
                fn(c, sl, arg);
        }
        bucket_unlock(c, b);
    }
}

static void unflag_fn(struct sfs_cache *c, struct sfs_slot_rec *sl, void *arg)
{
    (void)arg;
    slot_unflag(c, sl);
}

static void count_unflagged_fn(struct sfs_cache *c, struct sfs_slot_rec *sl, void *arg)
{
    (void)c;
    if (slot_holds_data(sl) &&
        !(atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PINNED))
        ++*(uint32_t *)arg;
}

struct flag_ctx {
    uint32_t reserved; /* charges taken ahead for this walk */
    uint32_t pinned;   /* slots of the block flagged after it */
};

static void flag_fn(struct sfs_cache *c, struct sfs_slot_rec *sl, void *arg)
{
    struct flag_ctx *f = arg;

    if (!slot_holds_data(sl)) {
        slot_unflag(c, sl); /* flagged while it held data (a load since failed) */
        return;
    }
    if (!(atomic_load_explicit(&sl->flags, memory_order_relaxed) & SLOT_F_PINNED)) {
        if (f->reserved)
            f->reserved--;
        else if (!pin_charge(c))
            return; /* loaded since the count, and no room: stays unpinned */
        atomic_fetch_or_explicit(&sl->flags, (uint8_t)SLOT_F_PINNED, memory_order_relaxed);
    }
    f->pinned++;
}

/* Free entry p and unflag its block's slots (pin_lock held). */
static void pin_free(struct sfs_cache *c, struct sfs_pin_rec *p)
{
    uint8_t block[16];

    memcpy(block, p->block, sizeof(block)); /* ours to read: pin_lock */
    pin_write(p, NULL, 0);
    /* Relaxed: a hint counter, changed under pin_lock only. */
    if (atomic_load_explicit(&c->hdr->pins_used, memory_order_relaxed))
        atomic_fetch_sub_explicit(&c->hdr->pins_used, 1, memory_order_relaxed);
    walk_block(c, block, unflag_fn, NULL);
}

/* Free every expired entry (pin_lock held). Bound: the table, once. */
static void pin_sweep(struct sfs_cache *c, int64_t now)
{
    if (atomic_load_explicit(&c->hdr->pins_used, memory_order_relaxed) == 0)
        return;
    for (uint32_t i = 0; i < c->npins; i++) {
        struct sfs_pin_rec *p = &c->pins[i];
        int64_t e = atomic_load_explicit(&p->expiry_ns, memory_order_relaxed);

        if (e != 0 && e <= now)
            pin_free(c, p);
    }
}

/* The entry of block (pin_lock held), or NULL. */
static struct sfs_pin_rec *pin_find(struct sfs_cache *c, const uint8_t *block)
{
    uint32_t home = pin_home(c, block);

    for (uint32_t i = 0; i < PIN_PROBE; i++) {
        struct sfs_pin_rec *p = &c->pins[(home + i) & (c->npins - 1)];

        if (atomic_load_explicit(&p->expiry_ns, memory_order_relaxed) != 0 &&
            memcmp(p->block, block, 16) == 0)
            return p;
    }
    return NULL;
}

int sfs_cache_pin(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n,
                  uint32_t seconds)
{
    struct sfs_pin_rec **ent = NULL;
    uint8_t *taken = NULL;
    uint32_t need = 0;
    int r;

    if (!c || (n && !blocks) || seconds > SFS_PIN_MAX_SECONDS || n > c->npins)
        return -EINVAL;
    if (c->pin_budget == 0 && seconds)
        return -EPERM;
    if (n == 0)
        return 0;
    r = pin_lock(c);
    if (r < 0)
        return r;
    int64_t now = sfs_now_ns();

    pin_sweep(c, now);
    if (seconds == 0) {
        for (size_t i = 0; i < n; i++) {
            struct sfs_pin_rec *p = pin_find(c, blocks[i].b);

            if (p)
                pin_free(c, p);
        }
        r = 0;
        goto out;
    }
    /* Entries first (nothing written yet): an existing one, or a free one
     * no earlier block of this batch chose. */
    ent = calloc(n, sizeof(*ent));
    taken = calloc(c->npins, 1);
    if (!ent || !taken) {
        r = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t home = pin_home(c, blocks[i].b);

        ent[i] = pin_find(c, blocks[i].b);
        for (size_t j = 0; !ent[i] && j < i; j++)
            if (memcmp(blocks[j].b, blocks[i].b, 16) == 0)
                ent[i] = ent[j];
        for (uint32_t k = 0; !ent[i] && k < PIN_PROBE; k++) {
            uint32_t x = (home + k) & (c->npins - 1);

            if (!taken[x] && atomic_load_explicit(&c->pins[x].expiry_ns, memory_order_relaxed) == 0)
                ent[i] = &c->pins[x];
        }
        if (!ent[i]) {
            r = -ENOSPC;
            goto out;
        }
        taken[ent[i] - c->pins] = 1;
    }
    /* The budget, all or nothing: charge the unflagged resident shards now. */
    for (size_t i = 0; i < n; i++)
        walk_block(c, blocks[i].b, count_unflagged_fn, &need);
    uint32_t v = atomic_load_explicit(&c->hdr->pinned_slots, memory_order_relaxed);
    do {
        if ((uint64_t)v + need > c->pin_budget) {
            r = -EDQUOT;
            goto out;
        }
    } while (!atomic_compare_exchange_weak_explicit(&c->hdr->pinned_slots, &v, v + need,
                                                    memory_order_relaxed, memory_order_relaxed));
    /* Publish the entries, then flag: a shard loaded after its entry is
     * visible flags itself (sfs_pin_on_load); one loaded before is met by
     * the walk. */
    int64_t expiry = now + (int64_t)seconds * 1000000000ll;
    for (size_t i = 0; i < n; i++) {
        if (atomic_load_explicit(&ent[i]->expiry_ns, memory_order_relaxed) == 0)
            atomic_fetch_add_explicit(&c->hdr->pins_used, 1, memory_order_relaxed);
        pin_write(ent[i], blocks[i].b, expiry);
    }
    struct flag_ctx f = {.reserved = need, .pinned = 0};
    for (size_t i = 0; i < n; i++)
        walk_block(c, blocks[i].b, flag_fn, &f);
    if (f.reserved)
        pin_uncharge(c, f.reserved); /* evicted or duplicated since the count */
    r = (int)f.pinned;
out:
    pthread_mutex_unlock(&c->hdr->pin_lock);
    free(ent);
    free(taken);
    return r;
}

int sfs_cache_pinned(struct sfs_cache *c, const struct sfs_key *key)
{
    uint32_t b, s;
    int r, err = 0;

    if (!c || !key)
        return -EINVAL;
    b = bucket_of(c, key);
    r = bucket_lock(c, b, 0);
    if (r < 0)
        return r;
    s = chain_find(c, b, key, &err);
    r = err ? err : s != SFS_NIL && sfs_slot_pin_holds(c, &c->slots[s]);
    bucket_unlock(c, b);
    return r;
}

uint64_t sfs_cache_pinned_bytes(struct sfs_cache *c)
{
    if (!c)
        return 0;
    if (c->pin_budget && pin_lock(c) == 0) {
        pin_sweep(c, sfs_now_ns());
        pthread_mutex_unlock(&c->hdr->pin_lock);
    }
    return (uint64_t)atomic_load_explicit(&c->hdr->pinned_slots, memory_order_relaxed) *
           c->shard_size;
}

uint32_t sfs_cache_partition_evictions(struct sfs_cache *c, uint64_t *out, uint32_t max)
{
    if (!c)
        return 0;
    for (uint32_t d = 0; d < c->npartitions && d < max && out; d++)
        out[d] = atomic_load_explicit(&c->hdr->part_evictions[d], memory_order_relaxed);
    return c->npartitions;
}

uint32_t sfs_cache_partition_slots(struct sfs_cache *c, uint32_t *out, uint32_t max)
{
    if (!c)
        return 0;
    /* Immutable after attach: validated by ctl.c (strictly increasing). */
    for (uint32_t d = 0; d < c->npartitions && d < max && out; d++)
        out[d] = c->part_end[d] - (d ? c->part_end[d - 1] : 0);
    return c->npartitions;
}
