/* SPDX-License-Identifier: MIT */
/*
 * pin.c - pins: a block kept resident until an absolute expiry, within a
 * budget of slots.
 *
 * A pin is one entry of a table in shared memory: a block id, the
 * CLOCK_MONOTONIC instant its pin ends, and the user who owns it. No
 * process holds it and no thread times it: the evictor (and sfs_install)
 * compare the expiry with the clock, so a pin ends at its expiry whether its
 * maker lives or not. That is the whole crash story: a process killed while
 * holding pins leaves entries that stop counting at their expiry, and the
 * next sweep frees them. Only the pin's owner, or root, changes or removes
 * it (sfs_cache_pin_as: the daemon passes the uid of the process that asked
 * through the mount).
 *
 * A slot of a pinned block carries a `pin` byte, 1 + the index of the user
 * it is charged to (hdr->pin_users), set under its bucket lock once both
 * charges are taken: to hdr->pinned_slots, never above the cache's budget,
 * and to the user's own count, never above pin_user_budget (root has no
 * such bound), each a bounded CAS. Whoever clears the byte (an exchange:
 * the fail path holds no lock) returns both charges, once. The byte alone
 * proves nothing: the evictor keeps a pinned slot only while the table says
 * the block's pin lasts, and unpins (and uncharges) one whose pin ended.
 * Sweeps (every pin call, every pinned-bytes read) free expired entries and
 * unpin their slots, so the budgets and the gauge come back.
 *
 * Table entries are written only under hdr->pin_lock, as a seqlock; readers
 * (the evictor, sfs_install) are lock-free. Lock order: pin_lock, then bucket
 * locks; the evictor and sfs_install never take pin_lock. An entry lives in the
 * PIN_PROBE entries from its block's hash. The hit path never looks at pins.
 */
#include "slot_i.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
 * *user: 1 + its owner's index in hdr->pin_users (with an expiry).
 */
static int64_t pin_lookup(const struct sfs_cache *c, const uint64_t w[2], uint32_t *user)
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
            uint32_t u = atomic_load_explicit(&p->user, memory_order_relaxed);
            uint64_t a = __atomic_load_n((const key_word *)p->block, __ATOMIC_RELAXED);
            uint64_t b = __atomic_load_n((const key_word *)(p->block + 8), __ATOMIC_RELAXED);

            /* Acquire fence: the loads above happen before the re-read of
             * seq (the seqlock's reader side). */
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&p->seq, memory_order_relaxed) != s1)
                continue;
            if (e != 0 && a == w[0] && b == w[1]) {
                *user = u;
                return e;
            }
            break;
        }
        if (t == PIN_READ_TRIES)
            return PIN_UNKNOWN;
    }
    return 0;
}

/* Writers (pin_lock held): rewrite entry p (user: 1 + its owner's index). */
static void pin_write(struct sfs_pin_rec *p, const uint8_t *block, int64_t expiry, uint32_t user)
{
    uint64_t w[2] = {0, 0};

    if (block)
        block_words(block, w);
    /* Relaxed increments to odd, then a release fence: readers that see any
     * of the new fields see the odd seq on their re-read. */
    atomic_fetch_add_explicit(&p->seq, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    SFS_TEST_POINT("pin:half_written"); /* a writer dead here: the next one repairs */
    __atomic_store_n((key_word *)p->block, w[0], __ATOMIC_RELAXED);
    __atomic_store_n((key_word *)(p->block + 8), w[1], __ATOMIC_RELAXED);
    atomic_store_explicit(&p->expiry_ns, expiry, memory_order_relaxed);
    atomic_store_explicit(&p->user, user, memory_order_relaxed);
    /* Release: the fields are visible before the even seq. */
    atomic_fetch_add_explicit(&p->seq, 1, memory_order_release);
}

/* ---------------------------------------------------------------------------
 * The slot side (bucket lock held), for evict.c, cache.c and the walks.
 */

/* Counters bounded by a budget (the pinned slots, in all and by user).
 * Relaxed CAS: a count whose bound is all that matters; the pin it pays
 * for is set under a lock. take: n more if that stays within max (0: no
 * bound); give: n back, never below 0 (a corrupt count stays 0). */
static bool count_take(_Atomic uint32_t *ctr, uint32_t n, uint32_t max)
{
    uint32_t v = atomic_load_explicit(ctr, memory_order_relaxed);

    do {
        if (max && (uint64_t)v + n > max)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(ctr, &v, v + n, memory_order_relaxed,
                                                    memory_order_relaxed));
    return true;
}

static void count_give(_Atomic uint32_t *ctr, uint32_t n)
{
    uint32_t v = atomic_load_explicit(ctr, memory_order_relaxed);

    do {
        if (v == 0)
            return;
    } while (!atomic_compare_exchange_weak_explicit(ctr, &v, v > n ? v - n : 0,
                                                    memory_order_relaxed, memory_order_relaxed));
}

/* The user 1 + index u names (NULL for 0 or out of range: a corrupt byte). */
static struct sfs_pin_user *pin_user(struct sfs_cache *c, uint32_t u)
{
    return u >= 1 && u <= SFS_PIN_USERS ? &c->hdr->pin_users[u - 1] : NULL;
}

/* Charge n pinned slots to user u if both budgets have room: the cache's,
 * and the user's own (root, uid 0, has none). */
static bool pin_charge(struct sfs_cache *c, uint32_t u, uint32_t n)
{
    struct sfs_pin_user *pu = pin_user(c, u);
    uint32_t ubudget = 0;

    if (!pu)
        return false;
    if (atomic_load_explicit(&pu->uid, memory_order_relaxed) != 0)
        ubudget = c->pin_user_budget;
    if (!count_take(&c->hdr->pinned_slots, n, c->pin_budget))
        return false;
    if (!count_take(&pu->slots, n, ubudget)) {
        count_give(&c->hdr->pinned_slots, n);
        return false;
    }
    return true;
}

static void pin_uncharge(struct sfs_cache *c, uint32_t u, uint32_t n)
{
    struct sfs_pin_user *pu = pin_user(c, u);

    count_give(&c->hdr->pinned_slots, n);
    if (pu)
        count_give(&pu->slots, n);
}

static void slot_unflag(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    /* Relaxed exchange: whoever takes the byte returns its charges, once. */
    uint32_t u = atomic_exchange_explicit(&sl->pin, 0, memory_order_relaxed);

    if (u)
        pin_uncharge(c, u, 1);
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
    uint32_t u;
    int64_t e = pin_lookup(c, w, &u);

    return e != 0 && (e == PIN_UNKNOWN || e > sfs_now_ns());
}

bool sfs_slot_pin_holds(struct sfs_cache *c, struct sfs_slot_rec *sl)
{
    if (!atomic_load_explicit(&sl->pin, memory_order_relaxed))
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
        !slot_holds_data(sl) || atomic_load_explicit(&sl->pin, memory_order_relaxed))
        return;
    uint64_t w[2];
    uint32_t u = 0;

    slot_block_words(sl, w);
    int64_t e = pin_lookup(c, w, &u);

    if (e != 0 && e != PIN_UNKNOWN && e > sfs_now_ns() && pin_charge(c, u, 1))
        atomic_store_explicit(&sl->pin, (uint8_t)u, memory_order_relaxed);
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

/* The entry counts, pins_used and each user's, from the table (pin_lock
 * held, after a writer died in it): a writer counts an entry before it
 * writes it and uncounts it after, so one killed in between leaves them
 * off by one for good (pins_used above 0 makes every load look the table
 * up). Both are changed under pin_lock only, so the table is their truth.
 * Bound: the table, once. */
static void pin_recount(struct sfs_cache *c)
{
    uint32_t used = 0, per[SFS_PIN_USERS] = {0};

    for (uint32_t i = 0; i < c->npins; i++) {
        struct sfs_pin_rec *p = &c->pins[i];
        uint32_t u = atomic_load_explicit(&p->user, memory_order_relaxed);

        if (atomic_load_explicit(&p->expiry_ns, memory_order_relaxed) == 0)
            continue;
        used++;
        if (u >= 1 && u <= SFS_PIN_USERS)
            per[u - 1]++;
    }
    atomic_store_explicit(&c->hdr->pins_used, used, memory_order_relaxed);
    for (uint32_t u = 0; u < SFS_PIN_USERS; u++)
        atomic_store_explicit(&c->hdr->pin_users[u].pins, per[u], memory_order_relaxed);
}

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
                pin_write(p, NULL, 0, 0);
            }
        }
        pin_recount(c);
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
        SFS_CHAIN_EACH(c, b, s)
        {
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
    if (slot_holds_data(sl) && !atomic_load_explicit(&sl->pin, memory_order_relaxed))
        ++*(uint32_t *)arg;
}

struct flag_ctx {
    uint32_t user;     /* 1 + the index of the user the slots are charged to */
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
    if (!atomic_load_explicit(&sl->pin, memory_order_relaxed)) {
        if (f->reserved)
            f->reserved--;
        else if (!pin_charge(c, f->user, 1))
            return; /* loaded since the count, and no room: stays unpinned */
        atomic_store_explicit(&sl->pin, (uint8_t)f->user, memory_order_relaxed);
    }
    f->pinned++;
}

/* Free entry p and unflag its block's slots (pin_lock held). */
static void pin_free(struct sfs_cache *c, struct sfs_pin_rec *p)
{
    struct sfs_pin_user *pu = pin_user(c, atomic_load_explicit(&p->user, memory_order_relaxed));
    uint8_t block[16];

    memcpy(block, p->block, sizeof(block)); /* ours to read: pin_lock */
    pin_write(p, NULL, 0, 0);
    /* Relaxed: hint counters, changed under pin_lock only. */
    if (atomic_load_explicit(&c->hdr->pins_used, memory_order_relaxed))
        atomic_fetch_sub_explicit(&c->hdr->pins_used, 1, memory_order_relaxed);
    if (pu && atomic_load_explicit(&pu->pins, memory_order_relaxed))
        atomic_fetch_sub_explicit(&pu->pins, 1, memory_order_relaxed);
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

/* The entry of the user uid (pin_lock held): 1 + its index, its own or a
 * free one now its; 0 when every entry is another user's. */
static uint32_t user_get(struct sfs_cache *c, uint32_t uid)
{
    uint32_t free_u = 0;

    for (uint32_t i = 0; i < SFS_PIN_USERS; i++) {
        struct sfs_pin_user *pu = &c->hdr->pin_users[i];
        bool used = atomic_load_explicit(&pu->pins, memory_order_relaxed) ||
                    atomic_load_explicit(&pu->slots, memory_order_relaxed);

        if (used && atomic_load_explicit(&pu->uid, memory_order_relaxed) == uid)
            return i + 1;
        if (!used && !free_u)
            free_u = i + 1;
    }
    if (free_u)
        atomic_store_explicit(&c->hdr->pin_users[free_u - 1].uid, uid, memory_order_relaxed);
    return free_u;
}

int sfs_cache_pin(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n,
                  uint32_t seconds)
{
    return sfs_cache_pin_as(c, blocks, n, seconds, c ? c->uid : 0); /* NULL: -EINVAL there */
}

int sfs_cache_pin_as(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n,
                     uint32_t seconds, uint32_t uid)
{
    struct sfs_pin_rec **ent = NULL;
    uint8_t *taken = NULL;
    uint32_t need = 0, user = 0;
    int r;

    if (!c || (n && !blocks) || seconds > SFS_PIN_MAX_SECONDS || n > c->npins)
        return -EINVAL;
    if (c->pin_budget == 0 && seconds)
        return -EPERM;
    if (c->pin_max_s && seconds > c->pin_max_s)
        return -EINVAL;
    if (n == 0)
        return 0;
    r = pin_lock(c);
    if (r < 0)
        return r;
    int64_t now = sfs_now_ns();

    pin_sweep(c, now);
    /* Only a pin's owner, or root, changes it: the whole batch, or none. */
    for (size_t i = 0; i < n && uid != 0; i++) {
        struct sfs_pin_rec *p = pin_find(c, blocks[i].b);
        struct sfs_pin_user *pu =
            p ? pin_user(c, atomic_load_explicit(&p->user, memory_order_relaxed)) : NULL;

        if (pu && atomic_load_explicit(&pu->uid, memory_order_relaxed) != uid) {
            r = -EPERM;
            goto out;
        }
    }
    if (seconds == 0) {
        for (size_t i = 0; i < n; i++) {
            struct sfs_pin_rec *p = pin_find(c, blocks[i].b);

            if (p)
                pin_free(c, p);
        }
        r = 0;
        goto out;
    }
    user = user_get(c, uid);
    if (!user) {
        r = -ENOSPC; /* SFS_PIN_USERS others hold pins */
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
        if (taken[ent[i] - c->pins]) {
            ent[i] = NULL; /* the block again: counted, charged and pinned once */
            continue;
        }
        taken[ent[i] - c->pins] = 1;
    }
    /* The budgets, all or nothing: charge the unpinned resident shards now,
     * to the cache's budget and to the user's. */
    for (size_t i = 0; i < n; i++)
        if (ent[i])
            walk_block(c, blocks[i].b, count_unflagged_fn, &need);
    if (need && !pin_charge(c, user, need)) {
        r = -EDQUOT;
        goto out;
    }
    /* Publish the entries, then pin: a shard loaded after its entry is
     * visible pins itself (sfs_pin_on_load); one loaded before is met by
     * the walk. An entry root takes over from another user is root's now
     * (the slots already pinned stay charged to whom they were). */
    int64_t expiry = now + (int64_t)seconds * 1000000000ll;
    for (size_t i = 0; i < n; i++) {
        if (!ent[i])
            continue;
        uint32_t was = atomic_load_explicit(&ent[i]->user, memory_order_relaxed);
        bool fresh = atomic_load_explicit(&ent[i]->expiry_ns, memory_order_relaxed) == 0;

        if (fresh || was != user) {
            struct sfs_pin_user *old = fresh ? NULL : pin_user(c, was);

            if (fresh)
                atomic_fetch_add_explicit(&c->hdr->pins_used, 1, memory_order_relaxed);
            if (old && atomic_load_explicit(&old->pins, memory_order_relaxed))
                atomic_fetch_sub_explicit(&old->pins, 1, memory_order_relaxed);
            atomic_fetch_add_explicit(&c->hdr->pin_users[user - 1].pins, 1, memory_order_relaxed);
        }
        pin_write(ent[i], blocks[i].b, expiry, user);
    }
    struct flag_ctx f = {.user = user, .reserved = need, .pinned = 0};
    for (size_t i = 0; i < n; i++)
        if (ent[i])
            walk_block(c, blocks[i].b, flag_fn, &f);
    if (f.reserved)
        pin_uncharge(c, user, f.reserved); /* evicted or duplicated since the count */
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

int sfs_cache_block_pinned(struct sfs_cache *c, const struct sfs_block_id *block)
{
    uint64_t w[2];
    uint32_t user;
    int64_t e;

    if (!c || !block)
        return -EINVAL;
    if (!c->npins)
        return 0;
    block_words(block->b, w);
    e = pin_lookup(c, w, &user);
    /* An entry that kept changing is taken for a pin: the caller keeps
     * the block (a pin is never broken on a guess). */
    return e == PIN_UNKNOWN || e > sfs_now_ns();
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
