/* SPDX-License-Identifier: MIT */
/*
 * fuzz_fs.h - the daemon's FUSE handlers without a kernel, for the fs fuzz
 * targets.
 *
 * The targets link every room of fs/ except main.c and call the real
 * handlers (fs_ops.lookup, fs_op_setxattr, ...) with a fake request: the few
 * libfuse reply functions the handlers use are defined in fuzz_fs.c, and the
 * executable's definitions take precedence over libfuse3's, so each reply is
 * recorded in the request instead of being written to /dev/fuse. The struct
 * fs behind the requests is set up as main() does it, on a real cache and a
 * real backend (mem, or fault over mem).
 */
#ifndef SHARDFS_FUZZ_FS_H
#define SHARDFS_FUZZ_FS_H

#include "fs_i.h"
#include "fuzz_harness.h"

#include <stddef.h>
#include <stdint.h>

enum fz_reply_kind {
    FZ_NONE = 0, /* no reply yet */
    FZ_ERR,      /* fuse_reply_err (err may be 0) */
    FZ_ENTRY,
    FZ_ATTR,
    FZ_BUF,
    FZ_XATTR,
    FZ_NOREPLY, /* fuse_reply_none */
};

/* The fake request: what the handler answered, and how many times. */
struct fuse_req {
    struct fs *fs;
    int nreplies;
    enum fz_reply_kind kind;
    int err;          /* FZ_ERR: the positive errno */
    fuse_ino_t ino;   /* FZ_ENTRY */
    struct stat attr; /* FZ_ENTRY, FZ_ATTR */
    size_t size;      /* FZ_XATTR: the size; FZ_BUF: bytes */
    char buf[512];    /* FZ_BUF: the first bytes */
};

/* A fresh request on fs. */
void fz_req_init(struct fuse_req *req, struct fs *fs);

/* Exactly one reply: abort (a finding) otherwise. */
void fz_req_check_one(const struct fuse_req *req, const char *op);

/*
 * Set up the daemon's state as main() does: a cache of 64 slots of 4 KiB,
 * the backend `spec` with shard_size 4 KiB, the inode table. Aborts on
 * failure (the harness cannot run without it).
 */
struct fs *fz_fs_setup(const char *spec);

/* Store one shard of `fill` bytes in the backend. */
void fz_fs_store(struct fs *fs, const struct sfs_block_id *block, uint32_t shard, int fill);

#define FZ_SHARD_SIZE 4096u

#endif /* SHARDFS_FUZZ_FS_H */
