/* SPDX-License-Identifier: MIT */
/*
 * xattr.c - extended attributes and the /stats text.
 *
 * user.shardfs.touch and user.shardfs.prefetch act on a block,
 * user.shardfs.state reads a shard's cache state, user.shardfs.socket names the
 * attach socket on the root; user.shardfs.fault (hidden) drives a fault
 * backend. /stats is the cache's shared counters and the daemon's own, in the
 * Prometheus text format.
 */
#include "fs_i.h"

#include <shardfs/fault.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define XATTR_TOUCH    "user.shardfs.touch"
#define XATTR_PREFETCH "user.shardfs.prefetch"
#define XATTR_STATE    "user.shardfs.state"
#define XATTR_SOCKET   "user.shardfs.socket"
#define XATTR_FAULT    "user.shardfs.fault" /* hidden: fault backends only */

/* ---------------------------------------------------------------------------
 * Extended attributes.
 */

static bool value_is_one(const char *v, size_t n)
{
    return (n == 1 && v[0] == '1') || (n == 2 && v[0] == '1' && v[1] == '\n');
}

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
    if (o.kind == FS_BLOCK && strcmp(name, XATTR_TOUCH) == 0) {
        r = value_is_one(value, size) ? sfs_cache_touch(fs->cache, &o.key.block, 1) : -EINVAL;
        r = r < 0 ? r : 0;
    } else if (o.kind == FS_BLOCK && strcmp(name, XATTR_PREFETCH) == 0) {
        r = value_is_one(value, size) ? 0 : -EINVAL;
        if (r == 0)
            prefetch_block(fs, &o.key.block);
    } else if (o.kind == FS_ROOT && strcmp(name, XATTR_FAULT) == 0) {
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

static const char *state_word(int st)
{
    switch (st) {
    case SFS_STATE_IDLE:
        return "idle";
    case SFS_STATE_LOADING:
        return "loading";
    case SFS_STATE_READY:
        return "ready";
    case SFS_STATE_FAILED:
        return "failed";
    default:
        return "absent"; /* -ENOENT, or Free */
    }
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
    if (o.kind == FS_SHARD && strcmp(name, XATTR_STATE) == 0)
        reply_xattr_value(req, state_word(sfs_cache_state(fs->cache, &o.key)), size);
    else if (o.kind == FS_ROOT && strcmp(name, XATTR_SOCKET) == 0)
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
        names = XATTR_STATE;
        len = sizeof(XATTR_STATE);
    } else if (o.kind == FS_ROOT) {
        names = XATTR_SOCKET;
        len = sizeof(XATTR_SOCKET);
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
    bool ours = strcmp(name, XATTR_TOUCH) == 0 || strcmp(name, XATTR_PREFETCH) == 0 ||
                strcmp(name, XATTR_STATE) == 0 || strcmp(name, XATTR_SOCKET) == 0;

    fuse_reply_err(req, ours ? ENOTSUP : ENODATA);
}

/* ---------------------------------------------------------------------------
 * /stats
 */

struct textbuf {
    char *p;
    size_t len, cap;
};

static void emit(struct textbuf *t, const char *name, const char *type, const char *help,
                 uint64_t v)
{
    int n =
        snprintf(t->p + (t->len < t->cap ? t->len : t->cap), t->len < t->cap ? t->cap - t->len : 0,
                 "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);

    if (n > 0)
        t->len += (size_t)n;
}

size_t fs_stats_text(struct fs *fs, char *buf, size_t len)
{
    struct textbuf t = {.p = buf, .cap = len};
    struct sfs_stats s;
    struct sfs_cache_info ci;

    if (len)
        buf[0] = '\0';
    sfs_cache_stats(fs->cache, &s);
    sfs_cache_info(fs->cache, &ci);
#define C(name, help, v) emit(&t, "shardfs_" name, "counter", help, (uint64_t)(v))
#define G(name, help, v) emit(&t, "shardfs_" name, "gauge", help, (uint64_t)(v))
#define L(f)             atomic_load_explicit(&fs->ctr.f, memory_order_relaxed)
    C("requests_total",
      "Cache lookups, from the mount and every attached rank (prefetches are loads, not lookups).",
      s.requests);
    C("hits_total", "Gets that found the shard Ready.", s.hits);
    C("misses_total", "Gets that did not (owner or waiter).", s.misses);
    C("prefetched_total", "Slots filled by prefetch.", s.prefetched);
    C("prefetch_hits_total", "Gets served by a prefetched slot.", s.prefetch_hits);
    C("bytes_read_total", "Bytes loaded from the backend into the cache.", s.bytes_read);
    G("resident_bytes", "Bytes of Ready shards in the cache.", s.resident_bytes);
    G("capacity_bytes", "Bytes of the data plane.", s.capacity_bytes);
    C("backend_loads_total", "Shard loads this daemon submitted to its backend.", L(backend_loads));
    C("evictions_total", "Slots with a key taken by the CLOCK hand.", s.evictions);
    C("owner_loads_total", "Gets that made the caller owner (mount and ranks).", s.owner_loads);
    C("waits_total", "Gets that made the caller a waiter.", s.waits);
    C("failures_total", "Owners that published Failed.", s.failures);
    C("backend_errors_total", "Backend loads and dumps of this daemon that failed.",
      L(backend_errors));
    C("takeovers_total", "Ownership taken from a dead owner or an Idle slot.", s.takeovers);
    C("prealloc_total", "Idle slots placed by Prealloc.", s.prealloc);
    C("touched_total", "Slots marked by Touch.", s.touched);
    C("reaped_total", "Dead processes reaped.", s.reaped);
    C("fs_reads_total", "Read requests on shard files.", L(reads));
    C("fs_read_bytes_total", "Bytes answered to reads of shard files.", L(read_bytes));
    C("fs_writes_total", "Shards stored through the mount.", L(writes));
    C("fs_wait_timeouts_total", "Reads that gave up at their deadline.", L(wait_timeouts));
    C("fs_prefetch_started_total", "Loads started by user.shardfs.prefetch.", L(prefetch_accepted));
    C("fs_readahead_started_total", "Loads started by readahead after a read.",
      L(readahead_started));
    G("shard_size_bytes", "Bytes per shard.", ci.shard_size);
    G("slots", "Slots in the cache.", ci.nslots);
#undef C
#undef G
#undef L
    return t.len;
}
