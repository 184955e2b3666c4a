/* SPDX-License-Identifier: MIT */
/*
 * posix_remote_i.h - what a commit on a remote store (NFS, GlusterFS) adds
 * to the local one (posix_remote.c): the record a kept lock file holds, the
 * file a commit may start from, and the second names of committed files.
 * posix_commit.c calls each step where the protocol (its header) puts it;
 * on a local store every step does nothing.
 */
#ifndef SHARDFS_POSIX_REMOTE_I_H
#define SHARDFS_POSIX_REMOTE_I_H

#include "posix_lock_i.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* The shards a commit writes: ios[0..k) (NULL: a remove), S the shard size. */
struct commit_shards {
    struct sfs_io **ios;
    size_t k;
    uint64_t S;
};

/* Does the commit write shard n itself? */
static inline bool commit_writes(const struct commit_shards *cs, uint64_t n)
{
    for (size_t i = 0; i < cs->k; i++) {
        if (cs->ios[i]->key.shard == n)
            return true;
    }
    return false;
}

/* Would the commit keep any of the first len bytes of the block file, that
 * is, lose data if it took the file for absent? */
static inline bool commit_keeps_old(const struct commit_shards *cs, uint64_t len)
{
    if (!cs->ios)
        return len > 0;
    /* At most k + 1 rounds: k shards are written, so one of 0..k is not. */
    for (uint64_t n = 0; n * cs->S < len; n++) {
        if (!commit_writes(cs, n))
            return true;
    }
    return false;
}

/* One commit's remote state, from begin to its end. */
struct remote_commit {
    bool on; /* a remote store, its lock file held (lfd) */
    int lfd;
    bool have_rec; /* rec is the lock file's record */
    struct lock_record rec;
    bool linked; /* ref: the second name linked for the new file */
    char ref[PATH_REL_MAX];
};

/* Start a commit of block path rel: on a remote store with the lock file
 * held (lfd >= 0), read its record. */
void sfs_posix_remote_begin(struct posix_backend *p, int lfd, struct remote_commit *rc);

/* The committed file a commit starts from: src (the fd of the block file
 * opened by its name, or -errno; *st its stat when >= 0) or, when the name
 * shows an older file than the record, the recorded one through its second
 * name (src closed, *st its stat). A false view (not the file the last
 * commit under the lock left: the header) is -ESTALE, src closed, to look
 * again; on the last try it is refused instead, -EIO, the record cleared
 * and the refusal logged. *why says which step met the stale view. */
int sfs_posix_remote_source(struct posix_backend *p, struct remote_commit *rc, const char *rel,
                            int src, struct stat *st, const struct commit_shards *cs, bool last,
                            const char **why);

/* Before the rename of tmp (fd, size bytes) over rel: link its second name
 * and record the rename under way. */
void sfs_posix_remote_pending(struct posix_backend *p, struct remote_commit *rc, const char *rel,
                              const char *tmp, int fd, uint64_t size);

/* After the rename: record the file committed, drop the replaced files'
 * second names. */
void sfs_posix_remote_committed(struct posix_backend *p, struct remote_commit *rc, const char *rel,
                                int fd, uint64_t size);

/* The block file was unlinked (a remove of shard 0): an empty record, and
 * no second name left. */
void sfs_posix_remote_removed(struct posix_backend *p, struct remote_commit *rc, const char *rel);

/* A commit that ends before its rename: its second name goes. */
void sfs_posix_remote_abort(struct posix_backend *p, struct remote_commit *rc);

#endif /* SHARDFS_POSIX_REMOTE_I_H */
