/* SPDX-License-Identifier: MIT */
/*
 * lookup.c - the questions and hints a rank passes on: which keys the cache
 * or the store holds (sfs_rank_lookup, sfs_rank_lookup_prefix), touch, pins
 * and prefetch (owner.c starts the prefetch loads). Each enters the
 * daemon link first (link.c), so it works across a daemon restart.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>

static int lookup_entered(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                          uint32_t shard, bool *present)
{
    struct sfs_key *miss = NULL;
    size_t *where = NULL, nmiss = 0;
    bool *found = NULL;
    int r = 0;

    if (!rk || (n && (!blocks || !present)))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        struct sfs_key k = {.block = blocks[i], .shard = shard};

        present[i] = sfs_cache_exists(rk->cache, &k);
        if (!present[i])
            nmiss++;
    }
    if (nmiss == 0 || !rk->be)
        return 0;
    miss = malloc(nmiss * sizeof(*miss));
    where = malloc(nmiss * sizeof(*where));
    found = malloc(nmiss * sizeof(*found));
    if (!miss || !where || !found) {
        r = -ENOMEM;
        goto out;
    }
    nmiss = 0;
    for (size_t i = 0; i < n; i++) {
        if (present[i])
            continue;
        miss[nmiss] = (struct sfs_key){.block = blocks[i], .shard = shard};
        where[nmiss++] = i;
    }
    r = sfs_backend_exists(rk->be, miss, nmiss, found);
    if (r == 0)
        for (size_t j = 0; j < nmiss; j++)
            present[where[j]] = found[j];
out:
    free(miss);
    free(where);
    free(found);
    return r;
}

int sfs_rank_lookup(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                    uint32_t shard, bool *present)
{
    if (!rk || (n && (!blocks || !present)))
        return -EINVAL;
    return SFS_LINKED(rk, lookup_entered(rk, blocks, n, shard, present));
}

static long lookup_prefix_entered(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                                  uint32_t shard)
{
    size_t i = 0;
    bool *present;
    int r;

    /* The cache answers the common case (a resident prefix) without I/O. */
    for (; i < n; i++) {
        struct sfs_key k = {.block = blocks[i], .shard = shard};

        if (!sfs_cache_exists(rk->cache, &k))
            break;
    }
    if (i == n || !rk->be)
        return (long)i;
    present = malloc((n - i) * sizeof(*present));
    if (!present)
        return -ENOMEM;
    r = sfs_rank_lookup(rk, blocks + i, n - i, shard, present);
    if (r == 0) {
        size_t j = 0;

        while (i + j < n && present[j])
            j++;
        i += j;
    }
    free(present);
    return r < 0 ? r : (long)i;
}

long sfs_rank_lookup_prefix(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                            uint32_t shard)
{
    if (!rk || (n && !blocks))
        return -EINVAL;
    return SFS_LINKED(rk, lookup_prefix_entered(rk, blocks, n, shard));
}

int sfs_rank_touch(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n)
{
    if (!rk || (n && !blocks))
        return -EINVAL;
    return SFS_LINKED(rk, sfs_cache_touch(rk->cache, blocks, n));
}

int sfs_rank_pin(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n, uint32_t seconds)
{
    if (!rk || (n && !blocks))
        return -EINVAL;
    return SFS_LINKED(rk, sfs_cache_pin(rk->cache, blocks, n, seconds));
}

int sfs_rank_prefetch(struct sfs_rank *rk, const struct sfs_key *keys, size_t n)
{
    if (!rk || (n && !keys))
        return -EINVAL;
    if (rk->query_only || !rk->be)
        return 0;
    return SFS_LINKED(rk, sfs_own_prefetch(rk, keys, n));
}
