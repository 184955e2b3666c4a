/* SPDX-License-Identifier: MIT */
/*
 * lookup.c - the entry points that take no lease: State (and its name), Exists, Remove,
 * Prealloc, Touch and foreach, each under the key's bucket lock (or each
 * bucket's in turn).
 */
#include "admit_i.h"
#include "slot_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
    } else if (!slot_close_free(c, s)) {
        /* Leased (the CAS that closes it to lock-free hits failed). Relaxed:
         * the same hint as a write Get's (get_impl). */
        atomic_fetch_or_explicit(&c->slots[s].flags, (uint8_t)SLOT_F_WRITE_WANTED,
                                 memory_order_relaxed);
        r = -EBUSY;
    } else {
        struct sfs_slot_rec *sl = &c->slots[s];

        sfs_chain_unlink(c, b, s);
        sfs_pin_on_unlink(c, sl);
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
    } else if (sfs_alloc_slot(c, b, sfs_domain_of(c, key->shard),
                          POOL_REGULAR | POOL_FRESH_ONLY | POOL_RESERVED, &s) == 0) {
        sfs_install(c, b, s, key, SFS_STATE_IDLE, false);
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
        SFS_CHAIN_EACH(c, b, s) {
            struct sfs_slot_rec *sl = &c->slots[s];
            uint32_t st = atomic_load_explicit(&sl->state, memory_order_relaxed);

            if ((st == SFS_STATE_READY || st == SFS_STATE_LOADING) &&
                block_in(blocks, n, sl->block)) {
                sfs_slot_use(sl, atomic_load_explicit(&sl->flags, memory_order_relaxed));
                marked++;
            }
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
        SFS_CHAIN_EACH(c, b, s) {
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

const char *sfs_state_name(int state)
{
    switch (state) {
    case SFS_STATE_FREE:
        return "absent";
    case SFS_STATE_IDLE:
        return "idle";
    case SFS_STATE_LOADING:
        return "loading";
    case SFS_STATE_READY:
        return "ready";
    case SFS_STATE_FAILED:
        return "failed";
    default:
        return "absent";
    }
}
