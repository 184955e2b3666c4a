/* SPDX-License-Identifier: MIT */
/*
 * rankenv.h - what the rank suites share (test_rank.c, test_rank_cuda.c,
 * test_rank_deadline.c, ...): a cache served on a socket in this process
 * with a posix store beside it, a host-copier rank on it, and the checks
 * every rank test ends with (the bytes each entry got, no lease left
 * behind).
 */
#ifndef SHARDFS_RANKENV_H
#define SHARDFS_RANKENV_H

#include <shardfs/cache.h>
#include <shardfs/rank.h>

#include <stdint.h>

/* The shard size of every rank test's cache and store. */
#define SHARD (32u * 1024)

struct env {
    struct sfs_cache *c;
    char sock[128];
    char dir[128];
};

/* A cache of nslots (nreserved reserved) SHARD-byte slots served at
 * e->sock; e->dir names a store not yet written. */
void env_up(struct env *e, uint32_t nslots, uint32_t nreserved);
/* Assert no lease is left, close the cache, remove the store. */
void env_down(struct env *e);
/* Every slot the cache holds can be removed: nobody holds a lease. */
void assert_no_leases(struct sfs_cache *c);

/* Write blocks [first, first + nblocks) of nshards shards into the posix
 * store at dir (tu_store_write with tu_fill's bytes); asserts. */
void write_store(const char *dir, uint64_t first, uint64_t nblocks, uint32_t nshards,
                 uint32_t shard_size);

/* Entry i of n got shard `shard` of block first + i, whole, status 0. */
void check_bufs(uint64_t first, uint32_t n, uint32_t shard, const void *bufs, const int *st);

/* A rank with the host copier on e's socket over backend `spec` (NULL:
 * none); key_ms and depth: key_timeout_ms and load_depth (0: default).
 * Asserts. rank_here: the default depth. */
struct sfs_rank *rank_depth(struct env *e, const char *spec, int dev, unsigned key_ms,
                            unsigned depth);
struct sfs_rank *rank_here(struct env *e, const char *spec, int dev, unsigned key_ms);
/* Load shard `shard` of blocks [first, first + n) into bufs (SHARD apart)
 * and wait (20 s at most); statuses in st. sfs_rank_wait's result. */
int load_sync(struct sfs_rank *rk, uint64_t first, uint32_t n, uint32_t shard, void *bufs,
              int *st);
/* Publish shard 0 of `block`, which this process owns under l, with its
 * bytes (tu_fill), and release it. Asserts. */
void publish_owned(struct sfs_cache *c, uint64_t block, const struct sfs_lease *l);

#endif /* SHARDFS_RANKENV_H */
