/* SPDX-License-Identifier: MIT */
/*
 * posix_lock_i.h - what the posix backend's commit (posix_commit.c) takes
 * from its file-system side (posix_lock.c): block directories, the block
 * lock and the record a kept lock file holds, temporary names, and the
 * sweep of a dead writer's leftovers. The protocol: posix_commit.c's header.
 */
#ifndef SHARDFS_POSIX_LOCK_I_H
#define SHARDFS_POSIX_LOCK_I_H

#include "posix_i.h"

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define LOCK_TRIES 100000
/* -ESTALE (a handle another host's rename or unlink made stale, NFS and
 * GlusterFS) is retried: a new lookup resolves the name afresh, once the
 * client's own lookup caches let go of the old handle (GlusterFS: about
 * 1 s, entry-timeout and md-cache-timeout; docs/shared-store.md). So the
 * retries are bounded in time, STALE_BUDGET_NS, well past those caches,
 * with sleeps between them (STALE_SLEEP_*), not in a count that a fast
 * loop spends in a millisecond. */
#define STALE_TRIES        16
#define STALE_BUDGET_NS    (3ll * 1000000000)
#define STALE_SLEEP_MIN_US 500
#define STALE_SLEEP_MAX_US 50000
/* How long a commit on a remote file system polls for a held lock before
 * it goes on without it: a quarter of the deadline, at most this. */
#define LOCK_POLL_MAX_NS (5ll * 1000000000)
/* Temporary names: <file>.tmp.<host>.<pid>.<seq>. */
#define TMP_INFIX ".tmp."
/* On a remote file system, a second name of each committed block file:
 * <file>.ref.<its inode, 16 hex>, linked before its rename, unlinked by
 * the commit that replaces it (posix_commit.c: a stale view of the name). */
#define REF_INFIX ".ref."
/* A temporary or lock file is stale when older than this many deadlines,
 * and never younger than TMP_AGE_MIN_NS. */
#define TMP_AGE_DEADLINES 20
#define TMP_AGE_MIN_NS    (10ll * 60 * 1000000000)
/* The record a kept lock file holds: the block file its last holder
 * committed, and the one a holder is about to rename over it (written
 * before the rename: a holder killed between its rename and its record
 * leaves a record that names what it renamed). Read and written by the
 * lock's holder only. A record of the older layout ("SFSLOCK1", 24 bytes)
 * reads as none. */
#define LOCK_RECORD_MAGIC 0x5346534c4f434b32ull /* "SFSLOCK2" */
struct lock_record {
    uint64_t magic;     /* LOCK_RECORD_MAGIC; anything else: no record */
    uint64_t size;      /* bytes of the block file the holder left; 0: none */
    uint64_t ino;       /* its inode number (a rename keeps it) */
    uint64_t pend_size; /* bytes of the file being renamed over it ... */
    uint64_t pend_ino;  /* ... and its inode; 0: no rename under way */
};

/* Make the directory of block path rel (its first dlen bytes). 0 or -errno. */
int sfs_posix_ensure_dir(struct posix_backend *p, const char *rel, size_t dlen);
/* fsync the directory of rel (sync=1 commits). 0 or -errno. */
int sfs_posix_sync_dir(struct posix_backend *p, const char *rel, size_t dlen);
/* Sleep before the next retry of a stale handle (*us doubles); false once
 * budget_ns from start_ns is spent. */
bool sfs_posix_stale_backoff(int64_t start_ns, int64_t budget_ns, unsigned *us);
/* Take the lock file lock_rel (posix_lock.c says how on each kind of file
 * system). The fd of the held lock, or -1: no lock, go on without it. */
int sfs_posix_lock_block(struct posix_backend *p, const char *lock_rel);
/* FUSE stores (host_lock_fd >= 0): take the host lock of lock_rel's block
 * (its file's name in name); the fd of the held lock, or -1: no lock. */
#define HOST_LOCK_DIR      "/run/lock/shardfs"
#define HOST_LOCK_DIR_TMP  "/tmp/shardfs-locks"
#define HOST_LOCK_NAME_MAX 32
int sfs_posix_host_lock(struct posix_backend *p, const char *lock_rel,
                        char name[HOST_LOCK_NAME_MAX]);
/* Unlink and close a held host lock. */
void sfs_posix_host_unlock(struct posix_backend *p, int fd, const char *name);
/* Open (O_CREAT) the store's lock file lock_rel for its record only, under
 * a host lock; the fd or -1. */
int sfs_posix_open_record(struct posix_backend *p, const char *lock_rel);

/* The block's owner file on a FUSE store, <file>.own beside <file>.lock:
 * what keeps writers on other hosts out without a lock request (below). */
#define OWN_SUFFIX    ".own"
#define OWN_TOKEN_MAX 128
/* Under the host lock (lock_rel's block): create the owner file
 * exclusively, waiting while another host's is there, for at most a
 * quarter of the deadline (LOCK_POLL_MAX_NS at most); one of this host's
 * lock domain (its holder is gone: we hold the host lock), or one seen
 * unchanged for half that wait, is broken. True when owned (token: what
 * it holds); false: the commit goes on without it, as where no lock
 * crosses hosts. */
bool sfs_posix_own_block(struct posix_backend *p, const char *lock_rel, char token[OWN_TOKEN_MAX]);
/* Remove the owner file if it still holds token. */
void sfs_posix_disown_block(struct posix_backend *p, const char *lock_rel, const char *token);
/* The second name of block path rel's file of inode ino (REF_INFIX): 0,
 * or -ENAMETOOLONG. */
int sfs_posix_ref_rel(const char *rel, uint64_t ino, char out[PATH_REL_MAX]);
/* This writer's own temporary file for block path rel, created exclusively
 * (name in tmp). The fd or -errno. */
int sfs_posix_create_tmp(struct posix_backend *p, const char *rel, char tmp[PATH_REL_MAX]);
/* Remove the commit leftovers of rel's directory older than tmp_age
 * (against now_ref, the file system's clock); rate-limited, errors ignored. */
void sfs_posix_sweep_dir(struct posix_backend *p, const char *rel, size_t dlen,
                         const struct timespec *now_ref);
/* A block held for a commit, whichever scheme the store needs: on a FUSE
 * store (host_lock_fd >= 0) the host lock, the owner file that keeps other
 * hosts' writers out, and the store's lock file opened for its record
 * only; on any other store the lock file's flock. lfd: the store's lock
 * file, held, or -1: the commit goes on without a lock. */
struct block_hold {
    int lfd;
    int hfd; /* the host lock; -1: none */
    bool owned;
    char hname[HOST_LOCK_NAME_MAX];
    char token[OWN_TOKEN_MAX];
};
void sfs_posix_hold_block(struct posix_backend *p, const char *lock_rel, struct block_hold *h);
/* Let it go: on a local file system the lock file is unlinked first (a
 * waiter then finds the path moved on); on a remote one it stays. */
void sfs_posix_release_block(struct posix_backend *p, const char *lock_rel, struct block_hold *h);

/* The held lock file's record: true with *r, or false when it has none. */
bool sfs_posix_lock_record_read(int lfd, struct lock_record *r);
/* Write *r into the held lock file (magic 0: clears it); best effort. */
void sfs_posix_lock_record_write(int lfd, const struct lock_record *r);

#endif /* SHARDFS_POSIX_LOCK_I_H */
