/* SPDX-License-Identifier: MIT */
/*
 * copier_i.h - the copier interface: how a rank moves shard bytes between
 * the data plane (host memory every rank maps) and its destinations.
 *
 * Two implementations: copier_host.c (memcpy; destinations are host memory)
 * and copier_cuda.cu (one gather kernel per batch reading the registered,
 * device-mapped data plane; a scatter kernel for dumps). Which one a rank
 * gets is decided in one place, sfs_copier_open() in copier.c; that is the
 * only code that knows whether the library was built with CUDA.
 *
 * A batch call copies every element, sets each one's result, and returns
 * when every copy is complete (the source may be released, the destination
 * read). Batches come from one thread, the rank's copier thread -- except
 * load_inline, which any thread may call at any time (the submitting thread
 * of a small task whose keys are all Ready, see inline.c), concurrently with
 * the copier thread and with other callers of it.
 *
 * A copier whose copies run on their own (the GPU) may also offer start and
 * finish, so that the copier thread prepares and completes one batch while
 * another is in flight: start(slot) queues a batch and returns at once;
 * finish(slot) returns when all of it is complete, with every result set.
 * Slot 0 or 1 holds one batch each between its start and its finish.
 */
#ifndef SHARDFS_COPIER_I_H
#define SHARDFS_COPIER_I_H

#include <shardfs/cache.h>

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most copies one batch call gets. */
#define SFS_COPY_BATCH_MAX 1024

struct sfs_copy {
    void *dst;
    const void *src;
    size_t len;
    /* A gate (gate_open's) the copy must wait for before it reads src;
     * NULL: none. Only a copier with gate_open is given one. */
    void *gate;
    int result; /* out: 0 or -errno */
};

struct sfs_copier;

struct sfs_copier_ops {
    const char *name;
    /* Data plane -> destination (load). Returns 0, with per-element results,
     * or -errno when nothing was copied (every result is set to it too). */
    int (*load)(struct sfs_copier *cp, struct sfs_copy *v, size_t n);
    /* Source -> data plane slot or a host bounce buffer (dump). */
    int (*dump)(struct sfs_copier *cp, struct sfs_copy *v, size_t n);
    void (*close)(struct sfs_copier *cp);
    /* Optional (NULL: load and dump only). start: 0, or -errno when nothing
     * was queued (the caller then fails the batch); n <= SFS_COPY_BATCH_MAX. */
    int (*start)(struct sfs_copier *cp, struct sfs_copy *v, size_t n, bool dump, int slot);
    void (*finish)(struct sfs_copier *cp, int slot);
    /* Optional (NULL: small tasks always go through the copier thread). A
     * load batch of n <= SFS_COPY_INLINE_MAX on the calling thread, complete
     * on return, as load. -EAGAIN: not on this thread now (nothing copied,
     * no result set): the caller hands the batch to the copier thread. */
    int (*load_inline)(struct sfs_copier *cp, struct sfs_copy *v, size_t n);
    /* Every address is host memory the CPU copies (submit checks that each
     * one is, task.c); false: the copier places each end itself. */
    bool host_memory;
    /* Optional (NULL: no gates, -EOPNOTSUPP). On the submitting thread:
     * capture `event`'s current record as a gate of the copier's own, which
     * copies given it wait for. 0 or -errno. gate_close frees a gate once
     * no batch can still be given it (any thread, the copier open or not). */
    int (*gate_open)(struct sfs_copier *cp, void *event, void **gate);
    void (*gate_close)(void *gate);
    /* Optional (NULL: dump). A dump batch of write-behind dumps only, whose
     * slots nobody reads soon (their store writes start once their task
     * ended): as dump, but the destinations need not stay in the caches.
     * Only a copier without start is given one. */
    int (*dump_behind)(struct sfs_copier *cp, struct sfs_copy *v, size_t n);
};

/* The most copies one load_inline call gets (rank_i.h's RANK_INLINE_KEYS_MAX). */
#define SFS_COPY_INLINE_MAX 64

struct sfs_copier {
    const struct sfs_copier_ops *ops;
};

/* Open the copier `mode` (enum sfs_rank_copier) for device_id, registering
 * the data plane of `c` where the copier needs it. 0 or -errno (-ENODEV:
 * CUDA asked for and not available). */
int sfs_copier_open(int mode, int device_id, struct sfs_cache *c, struct sfs_copier **out);
int sfs_copier_cuda_device_count(void);

struct sfs_copier *sfs_copier_host_open(int *err);

/* copier_cuda.cu (only when SHARDFS_HAVE_CUDA). Shards of at least
 * memcpy_min bytes (0: none) are copied by cudaMemcpyAsync, not the gather
 * kernel: SFS_CUDA_MEMCPY_MIN, as fast there (docs/rank.md). */
#define SFS_CUDA_MEMCPY_MIN ((size_t)4 << 20)
int sfs_cuda_device_count(void);
struct sfs_copier *sfs_copier_cuda_open(int device, struct sfs_cache *c, size_t memcpy_min,
                                        int *err);

#ifdef __cplusplus
}
#endif
#endif /* SHARDFS_COPIER_I_H */
