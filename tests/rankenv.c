/* SPDX-License-Identifier: MIT */
/* rankenv.c - see rankenv.h. */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void write_store(const char *dir, uint64_t first, uint64_t nblocks, uint32_t nshards,
                 uint32_t shard_size)
{
    int r = tu_store_write(dir, first, nblocks, nshards, shard_size, NULL, NULL, false);

    cr_assert_eq(r, 0, "store %s: %s", dir, strerror(-r));
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    return remove(p);
}

static void rm_tree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}


void env_up(struct env *e, uint32_t nslots, uint32_t nreserved)
{
    snprintf(e->sock, sizeof(e->sock), "%s", tu_path("sock"));
    snprintf(e->dir, sizeof(e->dir), "%s", tu_path("store"));
    e->c = tu_cache(nslots, nreserved, SHARD);
    cr_assert_not_null(e->c);
    cr_assert_eq(sfs_cache_serve(e->c, e->sock), 0);
}

struct lease_scan {
    struct sfs_key keys[4096];
    int n;
};

static int collect_key(const struct sfs_key *k, int state, void *arg)
{
    struct lease_scan *ls = arg;

    if (ls->n < 4096)
        ls->keys[ls->n++] = *k;
    return 0;
}

void assert_no_leases(struct sfs_cache *c)
{
    struct lease_scan *ls = calloc(1, sizeof(*ls));

    cr_assert_not_null(ls);
    sfs_cache_foreach(c, ~0u, collect_key, ls);
    for (int i = 0; i < ls->n; i++) {
        int r = sfs_cache_remove(c, &ls->keys[i]);

        cr_assert(r == 0 || r == -ENOENT, "key %d still leased (%d)", i, r);
    }
    free(ls);
}

void env_down(struct env *e)
{
    assert_no_leases(e->c);
    sfs_cache_close(e->c);
    rm_tree(e->dir);
}


void check_bufs(uint64_t first, uint32_t n, uint32_t shard, const void *bufs, const int *st)
{
    for (uint32_t i = 0; i < n; i++) {
        struct sfs_key k = tu_key(first + i, shard);

        cr_assert_eq(st[i], 0, "entry %u: %d", i, st[i]);
        cr_assert_eq(tu_check(&k, (const uint8_t *)bufs + (size_t)i * SHARD, SHARD), -1,
                     "entry %u: wrong bytes", i);
    }
}

struct sfs_rank *rank_depth(struct env *e, const char *spec, int dev, unsigned key_ms,
                            unsigned depth)
{
    struct sfs_rank_config cfg;
    struct sfs_rank *rk;
    int err = 0;

    sfs_rank_config_init(&cfg);
    cfg.socket_path = e->sock;
    cfg.device_id = dev;
    cfg.backend = spec;
    cfg.copier = SFS_COPIER_HOST;
    if (key_ms)
        cfg.key_timeout_ms = key_ms;
    if (depth)
        cfg.load_depth = depth;
    rk = sfs_rank_open(&cfg, &err);
    cr_assert_not_null(rk, "sfs_rank_open: %s", strerror(-err));
    return rk;
}

struct sfs_rank *rank_here(struct env *e, const char *spec, int dev, unsigned key_ms)
{
    return rank_depth(e, spec, dev, key_ms, 0);
}

int load_sync(struct sfs_rank *rk, uint64_t first, uint32_t n, uint32_t shard, void *bufs,
              int *st)
{
    struct sfs_rank_entry e[256];
    struct sfs_task *t;
    int r;

    cr_assert(n <= 256);
    for (uint32_t i = 0; i < n; i++)
        e[i] = (struct sfs_rank_entry){tu_block(first + i), shard,
                                       (uint8_t *)bufs + (size_t)i * SHARD};
    r = sfs_rank_load(rk, e, n, &t);
    if (r < 0)
        return r;
    r = sfs_rank_wait(t, 20000, st);
    sfs_rank_task_free(t);
    return r;
}

void publish_owned(struct sfs_cache *c, uint64_t block, const struct sfs_lease *l)
{
    struct sfs_key k = tu_key(block, 0);

    tu_fill(&k, sfs_cache_data(c, l), SHARD);
    cr_assert_eq(sfs_cache_publish(c, l, SHARD, 0), 0);
    cr_assert_eq(sfs_cache_release(c, l), 0);
}
