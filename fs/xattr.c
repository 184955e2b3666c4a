/* SPDX-License-Identifier: MIT */
/*
 * xattr.c - extended attributes.
 *
 * user.shardfs.touch and user.shardfs.prefetch act on a block,
 * user.shardfs.state reads a shard's cache state, user.shardfs.socket names the
 * attach socket on the root; user.shardfs.fault (hidden) drives a fault
 * backend. (The /stats text is stats.c's.)
 */
#include "fs_i.h"

#include <shardfs/fault.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * Extended attributes.
 */

static bool value_is_one(const char *v, size_t n)
{
    return (n == 1 && v[0] == '1') || (n == 2 && v[0] == '1' && v[1] == '\n');
}

/* user.shardfs.pin's value: decimal seconds (0 unpins), an optional
 * newline; -EINVAL for anything else or above SFS_PIN_MAX_SECONDS. */
static int parse_pin_seconds(const char *v, size_t n)
{
    uint64_t s = 0;

    if (n && v[n - 1] == '\n')
        n--;
    if (n == 0 || n > 10)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -EINVAL;
        s = s * 10 + (uint64_t)(v[i] - '0');
    }
    return s > SFS_PIN_MAX_SECONDS ? -EINVAL : (int)s;
}

/* user.shardfs.state: the state's name, with ",pinned" while the shard's
 * block pin lasts ("ready,pinned"). */
static void reply_state(fuse_req_t req, struct fs *fs, const struct sfs_key *key, size_t size);

/* user.shardfs.prefetch: start background loads of every shard of block the
 * backend has and the cache lacks. Returns how many loads started. */
static int prefetch_block(struct fs *fs, const struct sfs_block_id *block)
{
    int started = fs_prefetch_shards(fs, block, 0, UINT32_MAX, false);

    CTR_ADD(fs, prefetch_accepted, (uint64_t)started);
    return started;
}

void fs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                    size_t size, int flags)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    int r = fs_resolve(fs, ino, &o);

    if (r < 0)
        goto out;
    if (o.kind == FS_BLOCK && strcmp(name, SFS_XATTR_TOUCH) == 0) {
        r = value_is_one(value, size) ? sfs_cache_touch(fs->cache, &o.key.block, 1) : -EINVAL;
        r = r < 0 ? r : 0;
    } else if (o.kind == FS_BLOCK && strcmp(name, SFS_XATTR_PREFETCH) == 0) {
        r = value_is_one(value, size) ? 0 : -EINVAL;
        if (r == 0)
            prefetch_block(fs, &o.key.block);
    } else if (o.kind == FS_BLOCK && strcmp(name, SFS_XATTR_PIN) == 0) {
        r = parse_pin_seconds(value, size);
        /* The pin is the asking user's: only they (or root) change it. */
        if (r >= 0)
            r = sfs_cache_pin_as(fs->cache, &o.key.block, 1, (uint32_t)r,
                                 (uint32_t)fuse_req_ctx(req)->uid);
        r = r < 0 ? r : 0;
    } else if (o.kind == FS_ROOT && strcmp(name, FS_XATTR_FAULT) == 0) {
        char opts[256];

        if (size >= sizeof(opts)) {
            r = -EINVAL;
            goto out;
        }
        memcpy(opts, value, size);
        opts[size] = '\0';
        if (size && opts[size - 1] == '\n')
            opts[size - 1] = '\0';
        if (strcmp(opts, "off") == 0 || strcmp(opts, "none") == 0)
            opts[0] = '\0';
        r = sfs_fault_set(fs->be, opts); /* -EINVAL: not a fault backend, or bad opts */
    } else {
        r = -ENOTSUP;
    }
out:
    fuse_reply_err(req, -r);
}

static void reply_xattr_value(fuse_req_t req, const char *v, size_t size)
{
    size_t len = strlen(v);

    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, v, len);
}

static void reply_state(fuse_req_t req, struct fs *fs, const struct sfs_key *key, size_t size)
{
    char v[64];
    const char *name = sfs_state_name(sfs_cache_state(fs->cache, key));

    snprintf(v, sizeof(v), "%s%s", name, sfs_cache_pinned(fs->cache, key) == 1 ? ",pinned" : "");
    reply_xattr_value(req, v, size);
}

void fs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    int r = fs_resolve(fs, ino, &o);

    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    if (o.kind == FS_SHARD && strcmp(name, SFS_XATTR_STATE) == 0)
        reply_state(req, fs, &o.key, size);
    else if (o.kind == FS_ROOT && strcmp(name, SFS_XATTR_SOCKET) == 0)
        reply_xattr_value(req, fs->socket_path, size);
    else
        fuse_reply_err(req, ENODATA);
}

void fs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    const char *names = "";
    size_t len = 0;
    int r = fs_resolve(fs, ino, &o);

    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    /* Only the names a get answers (the set-only ones would make getfattr -d
     * fail); each NUL-terminated. */
    if (o.kind == FS_SHARD) {
        names = SFS_XATTR_STATE;
        len = sizeof(SFS_XATTR_STATE);
    } else if (o.kind == FS_ROOT) {
        names = SFS_XATTR_SOCKET;
        len = sizeof(SFS_XATTR_SOCKET);
    }
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, names, len);
}

void fs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    bool ours = strcmp(name, SFS_XATTR_TOUCH) == 0 || strcmp(name, SFS_XATTR_PREFETCH) == 0 ||
                strcmp(name, SFS_XATTR_PIN) == 0 || strcmp(name, SFS_XATTR_STATE) == 0 ||
                strcmp(name, SFS_XATTR_SOCKET) == 0;

    fuse_reply_err(req, ours ? ENOTSUP : ENODATA);
}
