/* SPDX-License-Identifier: MIT */
/*
 * shardfs/backend.h - the slower stores below the cache.
 *
 * A backend is a small vtable (load, dump, exists, touch, close) behind a
 * batched, asynchronous interface: a caller submits an array of I/O requests
 * and each one completes exactly once through its `done` callback, called
 * from a thread of the backend (or inline, before submit returns). The
 * caller that publishes cache slots does so from that callback.
 *
 * Backends are chosen by a spec string, so the daemon, tests and benchmarks
 * share one way to name them:
 *
 *   /path/to/dir                     posix store (UCM PosixStore layout)
 *   posix:/path/to/dir?dir_prefix=2&direct=1&depth=64
 *   mem:                             in-process store (tests)
 *   fault:latency_us=200,eio=0.1,short=0.05,stall_ms=0,seed=7:<inner spec>
 *   peer:listen=ADDR:PORT,members=FILE,ways=N,capacity=SIZE:<inner spec>
 *                                    the peer tier over another (docs/peer.md)
 *
 * Posix options: dir_prefix=N (layout below), depth=D (io_uring entries),
 * sync=1 (fsync on commit), read_only=1, direct=0|1 (default 1: loads read
 * O_DIRECT where the file system and the buffer's alignment allow (4 KiB
 * aligned buffer, length and offset), buffered otherwise; the first load
 * that finds the file system refusing O_DIRECT logs one line and the
 * backend reads buffered from then on; direct=0: always buffered, through
 * the page cache).
 *
 * Posix layout: block file <root>/data/<32 hex id> (dir_prefix=0), or
 * <root>/<first N hex chars>/<32 hex id>; shard n at byte offset
 * n * shard_size. Writers write <file>.tmp and rename it on commit, so no
 * reader ever sees a torn shard.
 */
#ifndef SHARDFS_BACKEND_H
#define SHARDFS_BACKEND_H

#include <shardfs/cache.h>

#ifdef __cplusplus
extern "C" {
#endif

struct sfs_backend;
struct sfs_io;

typedef void sfs_io_done_fn(struct sfs_io *io);

/* One request: one shard. The caller owns the struct until done() runs. */
struct sfs_io {
    struct sfs_key key;
    void *buf;            /* load: destination; dump: source */
    uint32_t len;         /* bytes: normally the backend's shard_size */
    int result;           /* on completion: bytes moved (== len) or -errno:
                           * -ENOENT absent, -EIO error or short read */
    sfs_io_done_fn *done; /* called exactly once per submitted request */
    void *arg;            /* the caller's */
    void *priv[4];        /* the backend's; do not touch */
};

struct sfs_backend_params {
    uint64_t shard_size; /* bytes per shard (required) */
    unsigned dir_prefix; /* posix: default when the spec does not say */
    bool direct;         /* unused: posix loads are O_DIRECT by default (the
                          * spec's direct=0 turns it off); kept for the ABI */
    bool read_only;      /* dumps and removes fail with -EROFS */
    /* posix: deadline of a synchronous call (exists, shard_count, list), ms;
     * past it the call returns -ETIMEDOUT and is left to finish on its own
     * (a hung file system). 0: SFS_BACKEND_TIMEOUT_MS_DEFAULT. */
    unsigned timeout_ms;
};

#define SFS_BACKEND_TIMEOUT_MS_DEFAULT 30000u

/*
 * What identifies the version of a block in the store: posix, its block
 * file's device, inode, size, mtime and ctime. A commit renames a new file
 * over the block (a new inode), so two stamps are the same
 * (sfs_block_stamp_same) only when nothing replaced or changed the file
 * between them. For the daemon's revalidation of what it holds
 * (docs/shared-store.md).
 */
struct sfs_block_stamp {
    uint64_t dev, ino, size;
    int64_t mtime_ns, ctime_ns; /* the file system's clock */
    uint32_t flags;             /* SFS_STAMP_* */
};
#define SFS_STAMP_ABSENT 1u /* no block file (every other field 0) */
#define SFS_STAMP_REMOTE 2u /* the store is on a file system hosts share (NFS, FUSE, ...) */
/* The block file has fewer bytes on disk than its size: some of its shards
 * may lie in holes, which are misses (exists says which; docs/layout.md). */
#define SFS_STAMP_HOLES 4u

static inline bool sfs_block_stamp_same(const struct sfs_block_stamp *a,
                                        const struct sfs_block_stamp *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime_ns == b->mtime_ns && a->ctime_ns == b->ctime_ns &&
           (a->flags & SFS_STAMP_ABSENT) == (b->flags & SFS_STAMP_ABSENT);
}

/* One block file as a scan of the store sees it (sfs_backend_scan). */
struct sfs_block_scan {
    struct sfs_block_id id;
    struct sfs_block_stamp stamp; /* as sfs_backend_stamp's (never SFS_STAMP_ABSENT) */
    uint64_t bytes;               /* what it takes on disk: st_blocks * 512 */
    int64_t atime_ns;             /* its last access, the file system's clock (relatime: coarse) */
};
typedef int sfs_scan_fn(const struct sfs_block_scan *b, void *arg);

struct sfs_backend_ops {
    const char *name;
    int (*load)(struct sfs_backend *be, struct sfs_io **ios, size_t n);
    int (*dump)(struct sfs_backend *be, struct sfs_io **ios, size_t n);
    int (*exists)(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present);
    int (*shard_count)(struct sfs_backend *be, const struct sfs_block_id *block);
    int (*touch)(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n);
    int (*remove)(struct sfs_backend *be, const struct sfs_key *key);
    int (*list)(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *block, void *arg),
                void *arg);
    void (*close)(struct sfs_backend *be);
    /* Added last (older backends leave it NULL: -EOPNOTSUPP). */
    int (*stamp)(struct sfs_backend *be, const struct sfs_block_id *block,
                 struct sfs_block_stamp *out);
    int (*scan)(struct sfs_backend *be, sfs_scan_fn *fn, void *arg);
    int (*evict)(struct sfs_backend *be, const struct sfs_block_id *block,
                 const struct sfs_block_stamp *expect, uint64_t *freed);
    int (*lease)(struct sfs_backend *be, const char *role, uint32_t ttl_ms);
};

/* Every backend starts with this header. */
struct sfs_backend {
    const struct sfs_backend_ops *ops;
    uint64_t shard_size;
};

/*
 * Open the backend a spec names. Returns NULL and sets *err: -EINVAL for a
 * malformed spec (and, when errbuf is given, a one-line reason naming what is
 * wrong), -ENOENT for a missing directory.
 */
SFS_API struct sfs_backend *sfs_backend_open(const char *spec,
                                             const struct sfs_backend_params *params, char *errbuf,
                                             size_t errlen, int *err);

/* Submit loads/dumps. Returns how many were submitted (all, on success) or
 * -errno if none was; each submitted request completes exactly once. */
SFS_API int sfs_backend_load(struct sfs_backend *be, struct sfs_io **ios, size_t n);
SFS_API int sfs_backend_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n);

/* Synchronous: does each key exist (without reading data)? 0 or -errno. */
SFS_API int sfs_backend_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                               bool *present);

/* How many shards the block's file spans in the store, -ENOENT if none: a
 * shard among them that lies in a hole (SFS_STAMP_HOLES) is a miss. */
SFS_API int sfs_backend_shard_count(struct sfs_backend *be, const struct sfs_block_id *block);

/*
 * The stamp of a block in the store (struct sfs_block_stamp), with the
 * backend's deadline: 0 (SFS_STAMP_ABSENT in out->flags when the block has
 * no file), -EOPNOTSUPP for a backend without block files (mem), -ETIMEDOUT
 * or another -errno. block NULL: only out->flags' SFS_STAMP_REMOTE is
 * meaningful (the store's kind). Wrapping backends (fault, peer) answer for
 * their inner one.
 */
SFS_API int sfs_backend_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                              struct sfs_block_stamp *out);

/*
 * Visit every block file of the store with its stamp, its bytes on disk and
 * its access time, in the caller's thread, one directory at a time
 * (opendir/readdir, one stat each): memory bounded by two open directories,
 * whatever the store holds; no deadline (a hung store holds the caller).
 * Stops when fn returns non-zero and returns that value; 0, -errno of a
 * directory, -EOPNOTSUPP for a backend without block files (mem). Wrapping
 * backends (fault, peer) answer for their inner one.
 */
SFS_API int sfs_backend_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg);
/*
 * Remove a whole block from the store for a collector bounding it: under
 * the block's commit lock (a commit in flight, of this host or of another
 * where the lock crosses hosts, ends first and none starts meanwhile),
 * and only when its file is still the one `expect` stamps. One unlink of
 * the whole file: a reader that has it open reads the whole old block, a
 * later one misses. 0 (*freed: its bytes on disk), -ESTALE (a commit
 * changed it since the stamp: left), -EBUSY (the lock could not be had:
 * left), -ENOENT (gone), -EROFS, -ETIMEDOUT (the backend's deadline),
 * -EOPNOTSUPP (no block files), or another -errno.
 */
SFS_API int sfs_backend_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                              const struct sfs_block_stamp *expect, uint64_t *freed);
/*
 * A store-wide lease on a role (e.g. "collector"): one holder at a time
 * among every host and process on the store, decided by the store (posix:
 * a file at its root; docs/eviction.md). Each call takes it, or checks
 * that this backend still holds it and renews it: 1 when this backend
 * holds it now, 0 when another holds it (renewed within ttl_ms, on the
 * store's clock) or took it over, -errno; ttl_ms 0 drops it if held. A
 * holder that dies or stops calling loses it ttl_ms after its last
 * renewal, to one taker alone, and learns it at its next call. A check
 * costs one stat (posix): call it before each act the lease guards. One
 * thread per backend calls it. -EOPNOTSUPP: a backend without a shared
 * directory (mem).
 */
SFS_API int sfs_backend_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms);
/* A hint: these blocks will be read soon (readahead / WILLNEED). 0 or -errno. */
SFS_API int sfs_backend_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n);

/* Remove one shard (posix: the whole block file when its last shard goes,
 * documented in the backend). 0 or -errno. */
SFS_API int sfs_backend_remove(struct sfs_backend *be, const struct sfs_key *key);

/* Visit every block the store holds; stops when fn returns non-zero. */
SFS_API int sfs_backend_list(struct sfs_backend *be,
                             int (*fn)(const struct sfs_block_id *block, void *arg), void *arg);

SFS_API void sfs_backend_close(struct sfs_backend *be);

/* The peer tier's counters (docs/design.md, section 11: shardfs_peer_*). */
struct sfs_peer_stats {
    uint64_t hits, misses;
    uint64_t clean_torn, clean_other_key, clean_length, clean_unreachable;
    uint64_t bytes_read, bytes_written, writes, lost_writes;
    uint64_t round_trips; /* requests to other hosts (not in /stats) */
};

/* A snapshot of be's peer counters; -ENOENT when be is not a peer backend. */
SFS_API int sfs_backend_peer_stats(struct sfs_backend *be, struct sfs_peer_stats *out);

/* The peer tier's get latency: one observation per key of each batch
 * sent to the owners (the batch's round trip). -ENOENT when be is not a
 * peer backend. */
SFS_API int sfs_backend_peer_hist(struct sfs_backend *be, struct sfs_hist *out);

/* After a load's done(): did the peer tier answer it (rather than the store
 * behind it)? Valid for loads submitted by sfs_backend_load(). */
SFS_API bool sfs_io_from_peer(const struct sfs_io *io);

/*
 * HiCache's batch API over the peer tier alone (not its inner backend),
 * synchronous. Keys are grouped by owner host; each owner gets one round
 * trip per batch for get and exists (two for set: the buckets' headers,
 * then the conditional writes), all owners at once, each under the peer
 * spec's deadline_ms (of no progress). An owner that does not answer makes
 * its keys clean misses; the other owners' answers stand.
 *
 * batch_get: results[i] = len (bufs[i] holds the key's bytes, checked) or
 * -ENOENT (a clean miss: bufs[i] holds nothing promised). Counted as peer
 * hits and misses. batch_set: results[i] = 0, -EAGAIN (lost twice to other
 * writers: lost_writes), -EHOSTUNREACH (the owner did not answer) or
 * -EMSGSIZE (len over the owner's slot). batch_exists: how many keys in a
 * row, from keys[0], the peer tier has with length len (headers only).
 * Each returns 0 (batch_exists: the count) or -EINVAL (not a peer backend),
 * -ENOMEM.
 */
SFS_API int sfs_backend_peer_batch_get(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                                       void *const *bufs, uint32_t len, int *results);
SFS_API int sfs_backend_peer_batch_set(struct sfs_backend *be, const struct sfs_key *keys, size_t n,
                                       const void *const *bufs, uint32_t len, int *results);
SFS_API int sfs_backend_peer_batch_exists(struct sfs_backend *be, const struct sfs_key *keys,
                                          size_t n, uint32_t len);

/* Ask the peer tier to re-read its members file (whether or not its mtime
 * changed); done within a second. Async-signal-safe (the daemon calls it
 * on SIGHUP). 0, or -EINVAL when be is not a peer backend. */
SFS_API int sfs_backend_peer_reload(struct sfs_backend *be);

/* Synchronous convenience: load or dump one shard and wait. Returns bytes or
 * -errno. */
SFS_API int sfs_backend_load_sync(struct sfs_backend *be, const struct sfs_key *key, void *buf,
                                  uint32_t len);
SFS_API int sfs_backend_dump_sync(struct sfs_backend *be, const struct sfs_key *key,
                                  const void *buf, uint32_t len);

#ifdef __cplusplus
}
#endif
#endif /* SHARDFS_BACKEND_H */
