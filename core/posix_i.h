/* SPDX-License-Identifier: MIT */
/*
 * posix_i.h - what the rooms of the posix backend share: the backend's
 * struct, a block file's path, and opening it beneath the root.
 *
 * The loads, the queries, the listing and the backend's life are
 * backend_posix.c; dumps and removes (the tmp + rename commit) are
 * posix_commit.c; naming and opening a block file is posix_path.c, which
 * both call. Calls go backend_posix.c -> posix_commit.c -> posix_path.c.
 */
#ifndef SHARDFS_POSIX_I_H
#define SHARDFS_POSIX_I_H

#include "backend_i.h"

#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>

#define PATH_REL_MAX 96 /* "<32 hex>/" + "<32 hex>" + ".tmp" + NUL, with room */

struct posix_backend {
    struct sfs_backend be;
    int root_fd; /* O_PATH directory; immutable after open */
    struct sfs_posix_opts o;
    struct io_uring ring;
    pthread_t reaper;

    pthread_mutex_t sq_lock;
    pthread_cond_t idle_cond; /* signalled when nothing is in flight or pending */
    unsigned inflight;        /* sq_lock: loads that hold a ring entry */
    struct sfs_io *pend_head; /* sq_lock: loads waiting for a ring entry */
    struct sfs_io *pend_tail; /* sq_lock */
    bool closing;             /* sq_lock */
    atomic_bool direct_off;   /* set once the fs refused O_DIRECT */
};

/* posix_path.c. Relative path of the block file (tmp: of its .tmp); returns
 * the length of the directory part, so callers can cut the path there. */
size_t sfs_posix_block_rel(const struct posix_backend *p, const struct sfs_block_id *id, bool tmp,
                           char out[PATH_REL_MAX]);
/* An open's errno, as a block's: a missing directory level is a missing
 * block (-ENOENT); else -e. */
int sfs_posix_errno_of_open(int e);
/* Open rel beneath the root, never waiting on what is not a regular file.
 * Returns the fd or -errno (sfs_posix_errno_of_open's mapping). */
int sfs_posix_open_beneath(struct posix_backend *p, const char *rel, int flags);
/* sfs_posix_open_beneath() of a block file, which must be a regular file
 * (else -EIO), with O_NONBLOCK cleared again. Returns the fd or -errno. */
int sfs_posix_open_block_file(struct posix_backend *p, const char *rel, int flags);

/* posix_commit.c: the backend's dump and remove (its sfs_backend_ops). */
int sfs_posix_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n);
int sfs_posix_remove(struct sfs_backend *be, const struct sfs_key *key);

#endif /* SHARDFS_POSIX_I_H */
