/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the FUSE low-level operations table of shardfs, and the handlers
 * that belong to no room: lookup and forget, getattr, statfs, init.
 *
 *   /block                      blocks with shards resident in the cache
 *   /block/<32 hex>             any well-formed id is a directory
 *   /block/<32 hex>/shard       shard indices the backend or the cache holds
 *   /block/<32 hex>/shard/<n>   one regular file of shard_size bytes
 *   /stats                      counters, Prometheus text
 *
 * The handlers live in rooms (fs_i.h lists them): read.c (the read path,
 * readahead), write.c (open files, storing a shard, create/setattr), dir.c
 * (changing the tree, directory listings), xattr.c (extended attributes).
 * Below them: attr.c (attributes and entry replies), names.c (the names and
 * the inode table). This room is the top of the handlers: it calls down, and
 * nothing calls it (the rooms' handlers are only named in its table).
 *
 * Every handler ends in exactly one fuse_reply_*; cache and backend errors are
 * -errno and negated once, at the reply.
 */
#include "fs_i.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------
 * Lookup, forget, attributes.
 */

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    int r = fs_resolve(fs, parent, &p);

    if (r == 0)
        r = fs_child_obj(fs, &p, name, true, &o);
    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    fs_reply_entry(req, fs, &o);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    fs_forget_one(fs_of(req), ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    for (size_t i = 0; i < count; i++)
        fs_forget_one(fs_of(req), forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    struct stat st;
    int r = fs_resolve(fs, ino, &o);

    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    fs_fill_attr(fs, &o, ino, &st);
    fuse_reply_attr(req, &st, o.kind == FS_STATS ? 0.0 : ATTR_TIMEOUT);
}

/* ---------------------------------------------------------------------------
 * The session.
 */

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    struct fs *fs = fs_of(req);
    struct sfs_stats s;
    struct statvfs v;

    sfs_cache_stats(fs->cache, &s);
    memset(&v, 0, sizeof(v));
    v.f_bsize = 4096;
    v.f_frsize = 4096;
    v.f_blocks = s.capacity_bytes / 4096;
    v.f_bfree = v.f_bavail =
        s.capacity_bytes > s.resident_bytes ? (s.capacity_bytes - s.resident_bytes) / 4096 : 0;
    v.f_files = s.capacity_bytes / fs->shard_size;
    v.f_ffree = v.f_favail = v.f_bfree * 4096 / fs->shard_size;
    v.f_namemax = 255;
    fuse_reply_statfs(req, &v);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    struct fs *fs = userdata;

    /* 1 MiB requests: max_write sizes the kernel's max_pages (256), which
     * also caps reads under direct_io; -o max_read needs conn->max_read. */
    conn->max_write = 1u << 20;
    conn->max_read = fs->max_read;
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
        conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    /* splice from hugetlb memfds fails: replies are plain buffers. */
    conn->want &= ~(unsigned)(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

const struct fuse_lowlevel_ops fs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = fs_op_setattr,
    .mknod = fs_op_mknod,
    .mkdir = fs_op_mkdir,
    .unlink = fs_op_unlink,
    .rmdir = fs_op_rmdir,
    .symlink = fs_op_symlink,
    .rename = fs_op_rename,
    .link = fs_op_link,
    .open = fs_op_open,
    .create = fs_op_create,
    .read = fs_op_read,
    .write = fs_op_write,
    .flush = fs_op_flush,
    .release = fs_op_release,
    .fsync = fs_op_fsync,
    .opendir = fs_op_opendir,
    .readdir = fs_op_readdir,
    .releasedir = fs_op_releasedir,
    .statfs = op_statfs,
    .setxattr = fs_op_setxattr,
    .getxattr = fs_op_getxattr,
    .listxattr = fs_op_listxattr,
    .removexattr = fs_op_removexattr,
};
