/* SPDX-License-Identifier: MIT */
/*
 * posix_i.h - what the rooms of the posix backend share: the backend's
 * struct, a block file's path, and opening it beneath the root.
 *
 * The backend's life is backend_posix.c; the loads and their reaper
 * posix_load.c, over the ring's queue and block-file opens posix_ring.c
 * (their shared parts: posix_ring_i.h); exists, shard_count and list
 * posix_query.c; dumps and removes (the tmp + rename commit) posix_commit.c;
 * the synchronous calls' helpers posix_call.c; store-wide leases (one
 * collector a store) posix_lease.c; naming and opening a block
 * file posix_path.c, which all of them call. Calls go downward:
 * backend_posix.c -> posix_load.c -> posix_ring.c -> posix_path.c, and
 * backend_posix.c -> posix_query.c / posix_commit.c -> posix_call.c.
 */
#ifndef SHARDFS_POSIX_I_H
#define SHARDFS_POSIX_I_H

#include "backend_i.h"

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/stat.h>

struct block_fd;
struct posix_job;

/* "<32 hex>/" + "<32 hex>" + ".tmp." + host (<= POSIX_HOST_MAX) + ".<pid>.<seq>"
 * + NUL, with room (posix_commit.c's temporary names). */
#define PATH_REL_MAX   160
#define POSIX_HOST_MAX 40

/* Helpers of the synchronous calls alive at once: also how many calls can be
 * stuck in a hung file system at once (posix_call.c). */
#define POSIX_HELPERS_MAX 8u
/* Linux's nice values, -20..19. */
#define POSIX_NICE_LEVELS 40

struct posix_backend {
    struct sfs_backend be;
    int root_fd; /* O_PATH directory; immutable after open */
    struct sfs_posix_opts o;
    struct io_uring ring;
    pthread_t reaper;

    pthread_mutex_t sq_lock;
    pthread_cond_t idle_cond;    /* signalled when nothing is in flight or pending */
    unsigned inflight;           /* sq_lock: loads that hold a ring entry */
    struct sfs_io *pend_head;    /* sq_lock: loads waiting for a ring entry */
    struct sfs_io *pend_tail;    /* sq_lock */
    struct block_fd *bpend_head; /* sq_lock: block-file ops waiting for a ring entry */
    struct block_fd *bpend_tail; /* sq_lock */
    unsigned loads_active;       /* sq_lock: loads submitted whose done() has not returned */
    bool closing;                /* sq_lock */
    bool ring_open;              /* immutable: opens are ring ops (OPENAT2 + STATX) */
    atomic_bool direct_off;      /* set once the fs refused O_DIRECT */
    bool remote_fs;              /* immutable: the store is on a network or FUSE file system */
    int host_lock_fd;            /* immutable: FUSE stores, the host's lock directory; else -1 */
    uint64_t store_id;           /* immutable: the root's device and inode, mixed */
    uint64_t lock_domain;        /* immutable: store_id and the lock directory, mixed */

    /* posix_call.c: the helpers of the synchronous calls. */
    pthread_mutex_t call_lock;
    pthread_cond_t call_cond;    /* a job was queued, or stop (helpers wait) */
    pthread_cond_t call_done;    /* a job finished, or a helper ended (callers wait) */
    struct posix_job *call_head; /* call_lock: jobs not yet taken */
    struct posix_job *call_tail; /* call_lock */
    unsigned call_threads;       /* call_lock: helpers alive, <= POSIX_HELPERS_MAX */
    /* call_lock: helpers alive and waiting for a job, by nice value (index
     * nice + 20): a job runs at its caller's (posix_call.c). */
    unsigned char call_alive_at[POSIX_NICE_LEVELS];
    unsigned char call_idle_at[POSIX_NICE_LEVELS];
    bool call_stop; /* call_lock */

    /* posix_commit.c: temporary names and their sweep. */
    char host[POSIX_HOST_MAX + 1]; /* immutable: this host's name, [A-Za-z0-9_-] only */
    atomic_uint_fast64_t tmp_seq;  /* the next temporary name's counter */
    int64_t tmp_age_ns;            /* immutable: a temporary file older than this is stale */
    atomic_int_fast64_t sweep_ns;  /* when this backend last swept (sfs_now_ns), 0: never */

    /* posix_lease.c: this backend's token in store-wide leases; set at
     * its first call. Leases are taken by one thread (a collector's).
     * The lease held: its role, its file (the inode this backend linked
     * under the lease's name) and when it was last renewed (sfs_now_ns). */
    char lease_token[96];
    char lease_role[33];
    dev_t lease_dev;
    ino_t lease_ino;
    int64_t lease_renewed_ns;
    int64_t lease_swept_ns; /* when its holder last swept the lease's leftovers */
};


/* One synchronous call, run by a helper. Allocated by the caller as one
 * block (with its inputs and outputs); fn must touch nothing outside it but
 * the backend. */
struct posix_job {
    int (*fn)(struct posix_backend *p, struct posix_job *j);
    void (*drop)(struct posix_job *j); /* frees what the job points to, or NULL */
    int result;                        /* fn's return, once done */
    int state;                         /* call_lock */
    int nice;                          /* its caller's, the helper's that runs it */
    struct posix_job *next;            /* call_lock: queue link */
};

/* posix_call.c. Set up the helpers' lock and conditions: 0 or -errno. */
int sfs_posix_call_init(struct posix_backend *p);
/* Run j on a helper and wait until the backend's deadline, at the calling
 * thread's nice value (a background writer's call stays in the background).
 * Returns 0 when j
 * ran (j->result holds fn's return; the caller frees j with
 * sfs_posix_job_free), or -ETIMEDOUT (deadline) / -EAGAIN (no helper could
 * be started): then j is no longer the caller's. */
int sfs_posix_call(struct posix_backend *p, struct posix_job *j);
void sfs_posix_job_free(struct posix_job *j);
/* Called by a job's fn at its point of no return (a commit's rename): true
 * when it may go on (the caller still waits, and now waits for it to
 * finish: one more deadline); false when the caller already gave up
 * (-ETIMEDOUT), so fn must change nothing. */
bool sfs_posix_call_commit(struct posix_backend *p, struct posix_job *j);
/* Stop the helpers: wait up to grace_ns for them to end. True when none is
 * left (the lock and conditions are destroyed then); false when a call is
 * still stuck (the backend must then stay allocated). */
bool sfs_posix_call_stop(struct posix_backend *p, int64_t grace_ns);

/* posix_query.c: the stamp of a block file (size 0 and SFS_STAMP_ABSENT
 * when absent or not a regular file beneath the root). 0 or -errno. Blocks
 * on a hung file system. */
int sfs_posix_block_stat(struct posix_backend *p, const struct sfs_block_id *id,
                         struct sfs_block_stamp *out);
/* posix_query.c: the backend's exists, shard_count, stamp and list. */
int sfs_posix_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present);
int sfs_posix_shard_count(struct sfs_backend *be, const struct sfs_block_id *block);
int sfs_posix_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                    struct sfs_block_stamp *out);
int sfs_posix_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                   void *arg);
/* posix_query.c: the backend's scan (shardfs/backend.h). */
int sfs_posix_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg);

/* posix_load.c: the backend's load (its sfs_backend_ops). */
int sfs_posix_load(struct sfs_backend *be, struct sfs_io **ios, size_t n);
/* posix_load.c: start the reaper thread (signals blocked in it): 0 or
 * -errno. Stop it: nothing may be in flight (it queues a NOP and joins). */
int sfs_posix_reaper_start(struct posix_backend *p);
void sfs_posix_reaper_stop(struct posix_backend *p);
/* posix_ring.c: the backend's touch (a readahead hint). */
int sfs_posix_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n);

/* posix_path.c. Relative path of the block file (tmp: of its lock file,
 * <file>.lock); returns the length of the directory part, so callers can cut
 * the path there. */
size_t sfs_posix_block_rel(const struct posix_backend *p, const struct sfs_block_id *id, bool tmp,
                           char out[PATH_REL_MAX]);
/* An open's errno, as a block's: a missing directory level is a missing
 * block (-ENOENT); else -e. */
int sfs_posix_errno_of_open(int e);
/* Open rel beneath the root, never waiting on what is not a regular file.
 * Returns the fd or -errno (sfs_posix_errno_of_open's mapping). */
int sfs_posix_open_beneath(struct posix_backend *p, const char *rel, int flags);
/* Is the directory fd on a network or FUSE file system (NFS, FUSE:
 * GlusterFS, CephFS's and Lustre's clients, SMB, 9P), whose clients cache
 * lookups and forward locks (posix_commit.c)? */
bool sfs_posix_remote_fs(int dirfd);
/* The store is on a FUSE file system (the test build: SHARDFS_POSIX_HOST_LOCKS=1). */
bool sfs_posix_fuse_fs(int dirfd);
/* The host's lock directory for p's store (posix_lock.c): its fd, or -1
 * (then the block locks are taken on the store, logged). Sets store_id. */
int sfs_posix_host_locks_open(struct posix_backend *p);
/* sfs_posix_open_beneath() of a block file, which must be a regular file
 * (else -EIO), with O_NONBLOCK cleared again; out (may be NULL): its stat.
 * Returns the fd or -errno. */
int sfs_posix_open_block_file(struct posix_backend *p, const char *rel, int flags,
                              struct stat *out);
/* Holes (a shard in one is a miss: docs/layout.md). May a file of size
 * bytes and blocks512 512-byte blocks on disk have holes? Does the range
 * [off, off + len) of fd lie wholly in a hole (SEEK_DATA finds no data in
 * it; a file system without SEEK_DATA: never)? And are the len bytes at
 * buf all zeros (only such a shard read can be a hole's)? */
bool sfs_posix_may_have_holes(uint64_t size, uint64_t blocks512);
/* lseek(fd, off, SEEK_DATA): the offset, or -1 with errno (ENXIO: no data
 * at or past off). */
off_t sfs_posix_seek_data(int fd, uint64_t off);
bool sfs_posix_range_in_hole(int fd, uint64_t off, uint64_t len);
bool sfs_posix_all_zero(const void *buf, size_t len);

/* posix_lock.c: set up the temporary names (host, counter) and the age
 * past which a temporary file is stale. Never fails. */
void sfs_posix_commit_init(struct posix_backend *p);
/* posix_commit.c: the backend's dump and remove (its sfs_backend_ops). */
int sfs_posix_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n);
int sfs_posix_remove(struct sfs_backend *be, const struct sfs_key *key);
/* posix_lease.c: the backend's lease (shardfs/backend.h). */
int sfs_posix_lease(struct sfs_backend *be, const char *role, uint32_t ttl_ms);
/* posix_commit.c: the backend's evict (shardfs/backend.h). */
int sfs_posix_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                    const struct sfs_block_stamp *expect, uint64_t *freed);

#endif /* SHARDFS_POSIX_I_H */
