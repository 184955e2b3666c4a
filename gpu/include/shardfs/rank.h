/* SPDX-License-Identifier: MIT */
/*
 * shardfs/rank.h - libshardfs-rank, the library every tensor-parallel rank
 * links to load KV-cache shards from the node's shared CacheBuffer into its
 * device (or host) memory, and to dump them back.
 *
 * A rank attaches once to the cache (through the daemon's Unix socket) and
 * opens its own instance of the backend the cache sits on. Each rank runs a
 * LoadQueue: a dispatcher thread that takes tasks (batches of entries, one
 * shard of one block each), walks them in RearrangeIndex order and arbitrates
 * every key in the cache (hit / owner / waiter); owners load from the backend
 * asynchronously, at most `load_depth` loads per rank at once; and a copier
 * thread that copies each Ready shard to its destination as soon as it is
 * Ready (CUDA gather kernel, or memcpy without a GPU), releases the lease and
 * records a per-entry status, so an engine can recompute only what failed.
 *
 * Conventions: actions return 0 or -errno; predicates return bool;
 * constructors return a pointer and take `int *err`. Every function is safe
 * to call from several threads of the process that opened the rank, except
 * sfs_rank_close(), which must be the last call on a rank.
 */
#ifndef SHARDFS_RANK_H
#define SHARDFS_RANK_H

#include <shardfs/cache.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Which copier moves bytes between the data plane and destinations. */
enum sfs_rank_copier {
    SFS_COPIER_AUTO = 0, /* CUDA when built with it and device_id names a device; else host */
    SFS_COPIER_HOST = 1, /* memcpy: destinations are host pointers */
    SFS_COPIER_CUDA = 2, /* CUDA; -ENODEV at open when there is no such device */
};

/*
 * Configuration of a rank. Fill it with sfs_rank_config_init() first: that
 * sets the defaults (rotate = true, load_depth = 32, ...), which a zeroed
 * struct does not all have.
 */
struct sfs_rank_config {
    /* Where the cache is: the attach socket, or a shardfs mount point whose
     * `user.shardfs.socket` xattr names it. Exactly one must be set. */
    const char *socket_path;
    const char *mount_point;
    /* This rank's device. < 0: the query-only scheduler role (control plane
     * only): lookups and touch work, loads, dumps and prefetch return -EPERM. */
    int device_id;
    /* Ranks on this node (N of RearrangeIndex); 0 is taken as 1. */
    int local_rank_size;
    /* Backend spec (see shardfs/backend.h), opened by this rank to load
     * misses, e.g. the same posix directory as the daemon. NULL: no backend:
     * a miss fails with -ENOENT, dumps only fill the cache. Its shard size is
     * the cache's. */
    const char *backend;
    /* Backend loads and dumps in flight per rank (default 32). */
    unsigned load_depth;
    /* RearrangeIndex order (default true); false walks tasks in natural
     * order 0, 1, 2... (the benchmark baseline). */
    bool rotate;
    /* Must be false (sfs_rank_open returns -EINVAL otherwise). In 0.1.0
     * this was `blocking_waits`, a benchmark baseline that now lives only in
     * the benchmarks' build of the library (docs/rank.md); the field stays
     * so the struct keeps its layout. */
    bool reserved0;
    /* Prealloc (block, shard + 1) of the last task's blocks when the queue
     * runs empty (default true). */
    bool prealloc;
    /* enum sfs_rank_copier (default AUTO). */
    int copier;
    /* Worker threads that submit dumps and load keys taken over from a
     * dead owner (default 4; 0 is taken as 4), and as many background
     * threads for write-behind dumps' store writes, 10 nicer than the
     * thread that opened the rank. Keys other ranks are loading are not waited on by these:
     * watcher threads, started as needed, each sleep on up to
     * SFS_WAIT_ANY_MAX of them at once, so no waiting key is held behind
     * another. (Named `waiters` in 0.1.0; same place in the struct.) */
    unsigned workers;
    /* Deadline for one key, ms: a key another rank is loading, this rank's
     * own backend load of a key (a store that stops answering), or a cache
     * full of leased slots, fails the entry with -ETIMEDOUT / -ENOSPC after
     * this long (default 30000). */
    unsigned key_timeout_ms;
    /* This rank's index r among the local_rank_size ranks (RearrangeIndex:
     * rank r walks r, r+N, ...; it decides which keys this rank owns first).
     * < 0 (the default): device_id % local_rank_size, as before this field
     * existed; set it when the device does not say the rank, e.g. every
     * worker sees its GPU as device 0 through CUDA_VISIBLE_DEVICES.
     * 0..local_rank_size-1: that index; larger: -EINVAL. Ignored by the
     * scheduler role. Added in 0.2 (symbol version SHARDFS_RANK_0.2) where
     * the struct had tail padding: its size is unchanged, and a program
     * built against 0.1 binds sfs_rank_open@SHARDFS_RANK_0.1, which never
     * reads it. */
    int rank_index;
};

/* One entry of a task: a key and an address. For loads `addr` is the
 * destination (shard_size bytes, device or host memory); for dumps the
 * source. */
struct sfs_rank_entry {
    struct sfs_block_id block;
    uint32_t shard;
    void *addr;
};

struct sfs_rank;
struct sfs_task;

/* Fill *cfg with the defaults; socket_path/mount_point stay NULL,
 * device_id 0, local_rank_size 1, rank_index -1 (from device_id). */
SFS_API void sfs_rank_config_init(struct sfs_rank_config *cfg);

/*
 * Attach to the cache, open the backend, start the dispatcher, the workers,
 * a watcher and the copier. With a CUDA copier, every data-plane segment is
 * registered with the device here (cudaHostRegister, mapped), once per rank.
 * Returns NULL and sets *err: -EINVAL for a bad config (rank_index >=
 * local_rank_size among others), -ENODEV when
 * copier = CUDA and the device does not exist (or the library was built
 * without CUDA), -ENODATA when the mount point has no socket xattr, or the
 * attach / backend error (-ENOENT when the socket the mount point names,
 * a path in the daemon's mount namespace, is not there in ours).
 */
SFS_API struct sfs_rank *sfs_rank_open(const struct sfs_rank_config *cfg, int *err);

/*
 * Stop the rank: tasks still queued (not yet started by the dispatcher) are
 * cancelled, their entries complete with -ECANCELED; entries already started
 * run to completion (each bounded by key_timeout_ms), so no copy writes a
 * destination after close returns. It also waits for this rank's backend
 * loads whose entries already failed at their deadline (they write into the
 * cache's mapping): on a store that never answers it does not return. Then
 * every lease is released, the backend closed and the cache detached. Tasks
 * not yet freed stay valid for sfs_rank_wait() and sfs_rank_task_free().
 * Safe on NULL.
 */
SFS_API void sfs_rank_close(struct sfs_rank *rank);

/*
 * Queue a load of n entries: each shard is copied to its entry's addr when
 * Ready. The entries are copied: the array may be reused at once; the
 * destinations must stay valid until the task completes. Returns 0 and a
 * task in *task, -EINVAL for n == 0 or bad pointers, -EPERM for the
 * scheduler role, -ESHUTDOWN while closing, -ENOMEM.
 */
SFS_API int sfs_rank_load(struct sfs_rank *rank, const struct sfs_rank_entry *entries, size_t n,
                          struct sfs_task **task);

/*
 * Queue a dump of n entries (addr = source, shard_size bytes), write-through:
 * each key is taken for writing in the cache (SFS_GET_WRITE), the source is
 * copied into its slot, the slot is dumped to the backend, and published
 * Ready once the backend has it. The slot is the key's writer lock (dumps of
 * every rank and writes through the mount take it), so the cache and the
 * backend agree on the last version committed. A key leased elsewhere (a
 * reader, another dump of it) is copied into a bounce buffer at once and
 * dumped once its slot can be taken; -ETIMEDOUT, with nothing stored, when
 * it stays leased past key_timeout_ms. Several entries with the same key
 * commit in an unspecified order. Returns as sfs_rank_load().
 * sfs_rank_set_dump_mode(SFS_DUMP_WRITE_BEHIND) ends the entry at the
 * publish instead, the backend dump following in the background.
 */
SFS_API int sfs_rank_dump(struct sfs_rank *rank, const struct sfs_rank_entry *entries, size_t n,
                          struct sfs_task **task);

/* How a dump's entry ends (sfs_rank_set_dump_mode()). */
enum sfs_rank_dump_mode {
    SFS_DUMP_WRITE_THROUGH = 0, /* once the backend has the shard (the default) */
    SFS_DUMP_WRITE_BEHIND = 1,  /* once the slot is published Ready; the store write follows */
};

/*
 * Choose how the dumps this rank submits from now on end (a task submitted
 * before the call keeps the mode it was submitted with).
 *
 * SFS_DUMP_WRITE_BEHIND: an entry completes (status 0) as soon as its bytes
 * are in the key's slot and the slot is published Ready: every rank and
 * engine of the node loads it from memory at once. The backend dump then
 * runs in the background while this rank keeps its lease on the slot, so
 * the CLOCK hand cannot evict it and another writer of the key (a dump of
 * any rank, a write through the mount) waits for the slot as it waits for
 * any lease: writes of a key still commit one at a time, in the cache's
 * order. When the background write ends the lease goes, and the cache and
 * the store hold the same bytes. A background write that fails is logged
 * and counted (sfs_cache_behind_stats(); the daemon's
 * shardfs_write_behind_failed_total) and leaves the shard Ready in memory
 * only: until the slot is evicted or rewritten readers get these bytes, and
 * after an eviction a load gets what the store still has (the older
 * version, or a miss). sfs_rank_close() waits for the background writes
 * (each bounded by the backend's deadline, key_timeout_ms for a posix
 * store); a rank killed during one leaves its lease to the daemon's reaper:
 * the shard stays Ready, the store lacks it. Without a backend the two
 * modes are one. Returns 0, -EINVAL for a bad rank or mode.
 * (ABI: new in SHARDFS_RANK_0.5.)
 */
SFS_API int sfs_rank_set_dump_mode(struct sfs_rank *rank, int mode);

/* One piece of a shard, for the vectored calls: len bytes at addr (device or
 * host memory, as for an entry's addr). */
struct sfs_rank_piece {
    void *addr;
    uint64_t len;
};

/* The most pieces one entry of a vectored call may have. */
#define SFS_RANK_PIECES_MAX 512

/* An entry whose shard is several pieces, in order: piece 0 holds the
 * shard's bytes [0, len0), piece 1 the next len1 bytes, and so on. The
 * lengths (each > 0) add up to at most the shard size. An engine that keeps
 * one page as K here and V there (or one row per layer) moves it as it is,
 * with no staging copy: each piece is one copy of the batch (one descriptor
 * of the CUDA gather/scatter kernel). */
struct sfs_rank_entryv {
    struct sfs_block_id block;
    uint32_t shard;
    uint32_t npieces; /* 1..SFS_RANK_PIECES_MAX */
    const struct sfs_rank_piece *pieces;
};

/*
 * sfs_rank_load() and sfs_rank_dump() for entries made of pieces. A load
 * copies the shard's bytes to the pieces (a shard stored shorter than the
 * pieces fills them as far as it goes, as sfs_rank_load does); a dump stores
 * the pieces' bytes one after the other and zeros after them, up to the
 * shard size. The entries and their piece arrays are copied: both may be
 * reused at once. Returns as sfs_rank_load(), and -EINVAL for a piece count
 * out of range, a NULL or empty piece, or pieces longer than a shard.
 * (ABI: new in SHARDFS_RANK_0.3.)
 */
SFS_API int sfs_rank_loadv(struct sfs_rank *rank, const struct sfs_rank_entryv *entries, size_t n,
                           struct sfs_task **task);
SFS_API int sfs_rank_dumpv(struct sfs_rank *rank, const struct sfs_rank_entryv *entries, size_t n,
                           struct sfs_task **task);

/*
 * sfs_rank_dumpv() whose sources a stream of the program is still writing:
 * `cuda_event` (a cudaEvent_t) was recorded on that stream after the
 * writes. No thread blocks on it: at submit the rank captures the event's
 * current record (a later record or cudaEventDestroy of it changes
 * nothing), and the copier's stream waits for it before it reads a source
 * (a copy the copier makes on the CPU synchronizes with it first, on the
 * copier's thread). The calling thread's current device is unchanged.
 * -EOPNOTSUPP with a copier that is not CUDA's (a host copier cannot wait
 * for a device's stream: synchronize, then call sfs_rank_dumpv()); else
 * as sfs_rank_dumpv(), and a CUDA error at submit as -errno.
 * (ABI: new in SHARDFS_RANK_0.3.)
 */
SFS_API int sfs_rank_dumpv_after(struct sfs_rank *rank, const struct sfs_rank_entryv *entries,
                                 size_t n, void *cuda_event, struct sfs_task **task);

/*
 * Wait for a task. timeout_ms < 0 waits without a limit; 0 polls. Returns 0
 * when every entry is done, then fills status[0..n) (if not NULL) with each
 * entry's result: 0, or -errno (-EIO backend error or short read, -ENOENT
 * not in the backend, -ETIMEDOUT, -ENOSPC cache full of leased slots,
 * -ECANCELED). Returns -ETIMEDOUT when the timeout passes first: the wait
 * never outlives its timeout. -EINVAL for NULL.
 */
SFS_API int sfs_rank_wait(struct sfs_task *task, int timeout_ms, int *status);

/* True once every entry of the task is done. */
SFS_API bool sfs_rank_task_done(struct sfs_task *task);

/* Entries of the task. */
SFS_API size_t sfs_rank_task_size(struct sfs_task *task);

/*
 * Free a task. Freeing one that is not done detaches it: the rank finishes
 * it (its copies still write the destinations) and frees it then. Safe on
 * NULL.
 */
SFS_API void sfs_rank_task_free(struct sfs_task *task);

/*
 * Does shard `shard` of each block exist, in the cache (Ready) or in the
 * backend? present[i] answers blocks[i]. Works in the scheduler role.
 * Returns 0 or -errno.
 */
SFS_API int sfs_rank_lookup(struct sfs_rank *rank, const struct sfs_block_id *blocks, size_t n,
                            uint32_t shard, bool *present);

/* Length of the leading run of blocks whose shard `shard` exists (as
 * sfs_rank_lookup), or -errno. */
SFS_API long sfs_rank_lookup_prefix(struct sfs_rank *rank, const struct sfs_block_id *blocks,
                                    size_t n, uint32_t shard);

/* Block-level Touch: mark every resident shard of each block recently used
 * and forward the batch to the backend. Returns the number of slots marked,
 * or -errno. */
SFS_API int sfs_rank_touch(struct sfs_rank *rank, const struct sfs_block_id *blocks, size_t n);

/*
 * Pin blocks for `seconds` (0 unpins): their resident shards, and shards
 * loaded while the pin lasts, are not evicted until the pin's absolute
 * expiry, whether this process lives that long or not (a pin is bounded by
 * its time to live, by construction). Pins share the daemon's budget
 * (-o pin_budget): a batch over it is refused whole with -EDQUOT, never by
 * evicting another pin. -ENOSPC: no pin table entry near a block's hash;
 * -EPERM: the daemon has pins off. Returns the shards pinned now (unpin: 0).
 * (ABI: new in SHARDFS_RANK_0.2.)
 */
SFS_API int sfs_rank_pin(struct sfs_rank *rank, const struct sfs_block_id *blocks, size_t n,
                         uint32_t seconds);

/*
 * Advisory prefetch: start loading keys into the cache, with no destination
 * and no lease kept once loaded. Keys already present, keys that would need
 * an eviction of a reserved slot, and keys beyond the free load depth are
 * rejected. Returns how many were accepted (0 is not an error); never fails
 * for rejection. -EINVAL for bad pointers only. The scheduler role returns 0.
 */
SFS_API int sfs_rank_prefetch(struct sfs_rank *rank, const struct sfs_key *keys, size_t n);

/* Counters of this rank, and the cache's (summed over all processes). */
struct sfs_rank_stats {
    uint64_t tasks;         /* load and dump tasks queued */
    uint64_t entries;       /* entries of those tasks */
    uint64_t hits;          /* entries found Ready */
    uint64_t owner_loads;   /* backend loads this rank submitted as owner */
    uint64_t takeovers;     /* of those, keys taken from a dead owner while waiting */
    uint64_t waits;         /* entries another rank was loading */
    uint64_t dumps;         /* backend dumps submitted */
    uint64_t dumps_bounced; /* of those, through a bounce buffer (key leased elsewhere) */
    uint64_t failed;        /* entries that completed with an error */
    uint64_t copies;        /* shards copied by the copier */
    uint64_t copy_batches;  /* copier batches (kernel launches with CUDA) */
    uint64_t bytes_copied;
    uint64_t prealloc;      /* Idle slots placed in idle windows */
    uint64_t prefetched;    /* prefetch keys accepted */
    uint64_t max_inflight;  /* most backend requests in flight at once */
    struct sfs_stats cache; /* sfs_cache_stats() */
};

SFS_API void sfs_rank_stats(struct sfs_rank *rank, struct sfs_rank_stats *out);

/*
 * Name this rank's requester class, the class label of the daemon's
 * shardfs_class_served_total: "rank" by default; an engine adapter passes
 * its name ("vllm", "sglang", "ucm"). Written into this process's record in
 * the cache (kept across a re-attach); the attach protocol is unchanged.
 * Call it after open, before loads. Returns 0, or -EINVAL for a name that is
 * not 1..15 of [A-Za-z0-9_.-]. Added in 0.4.
 */
SFS_API int sfs_rank_set_class(struct sfs_rank *rank, const char *name);

/* Geometry of the attached cache and which copier runs ("host", "cuda"). */
SFS_API uint64_t sfs_rank_shard_size(struct sfs_rank *rank);
SFS_API const char *sfs_rank_copier_name(struct sfs_rank *rank);

/* The backend this rank loads from (owned by the rank; NULL without one),
 * e.g. for sfs_fault_set() in tests. */
struct sfs_backend;
SFS_API struct sfs_backend *sfs_rank_backend(struct sfs_rank *rank);

/*
 * RearrangeIndex: the order in which rank r of N walks a task of n entries:
 * r, r+N, r+2N, ... (< n), then r+1, r+1+N, ..., wrapping through every
 * residue mod N, so that at each step the N ranks touch N different keys.
 * order[0..n) receives a permutation of 0..n-1. N == 0 is taken as 1, r is
 * taken mod N. Returns 0 or -EINVAL (order NULL with n > 0).
 */
SFS_API int sfs_rank_rearrange(size_t n, unsigned r, unsigned N, uint32_t *order);

/* CUDA devices the library can use: 0 when built without CUDA or when none
 * is present. Initialises the CUDA runtime in this process. */
SFS_API int sfs_rank_cuda_devices(void);

#ifdef __cplusplus
}
#endif
#endif /* SHARDFS_RANK_H */
