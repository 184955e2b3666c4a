/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the FUSE low-level operations table of shardfs, and the replies
 * every room shares: attributes, entries, lookup and forget, statfs, init.
 *
 *   /block                      blocks with shards resident in the cache
 *   /block/<32 hex>             any well-formed id is a directory
 *   /block/<32 hex>/shard       shard indices the backend or the cache holds
 *   /block/<32 hex>/shard/<n>   one regular file of shard_size bytes
 *   /stats                      counters, Prometheus text
 *
 * The handlers live in rooms (fs_i.h lists them): names.c (the names and the
 * inode table), read.c (the read path, readahead, loads in flight), write.c
 * (open files, storing a shard, create/setattr), dir.c (changing the tree,
 * directory listings), xattr.c (extended attributes and /stats).
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
 * Attributes and entries.
 */

void fs_fill_attr(struct fs *fs, const struct fs_obj *o, fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_uid = getuid();
    st->st_gid = getgid();
    st->st_atim = st->st_mtim = st->st_ctim = fs->start;
    st->st_blksize = (blksize_t)(fs->shard_size < (1u << 20) ? fs->shard_size : (1u << 20));
    switch (o->kind) {
    case FS_SHARD:
        st->st_mode = S_IFREG | (fs->ro ? 0444 : 0644);
        st->st_nlink = 1;
        st->st_size = (off_t)fs->shard_size;
        st->st_blocks = (blkcnt_t)((fs->shard_size + 511) / 512);
        break;
    case FS_STATS: {
        char buf[STATS_MAX];

        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = (off_t)fs_stats_text(fs, buf, sizeof(buf));
        break;
    }
    default:
        st->st_mode = S_IFDIR | (fs->ro ? 0555 : 0755);
        st->st_nlink = 2;
        break;
    }
}

void fs_reply_entry(fuse_req_t req, struct fs *fs, const struct fs_obj *o)
{
    struct fuse_entry_param e;

    memset(&e, 0, sizeof(e));
    e.ino = fs_obj_ref(fs, o, false);
    if (!e.ino) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    fs_fill_attr(fs, o, e.ino, &e.attr);
    e.attr_timeout = o->kind == FS_STATS ? 0.0 : ATTR_TIMEOUT;
    e.entry_timeout = ENTRY_TIMEOUT;
    if (fuse_reply_entry(req, &e) != 0)
        fs_forget_one(fs, e.ino, 1); /* the kernel did not take the reference */
}

/* Resolve (parent, name) to an object. -ENOENT for any name outside the tree.
 * check_exists: a shard name must name a shard that exists. */
int fs_child_obj(struct fs *fs, const struct fs_obj *parent, const char *name, bool check_exists,
                 struct fs_obj *out)
{
    struct sfs_block_id id;
    uint32_t n;

    switch (parent->kind) {
    case FS_ROOT:
        if (strcmp(name, "block") == 0)
            *out = fs_make_obj(FS_BLOCKS, NULL, 0);
        else if (strcmp(name, "stats") == 0)
            *out = fs_make_obj(FS_STATS, NULL, 0);
        else
            return -ENOENT;
        return 0;
    case FS_BLOCKS:
        if (!fs_parse_block(name, &id))
            return -ENOENT;
        *out = fs_make_obj(FS_BLOCK, &id, 0);
        return 0;
    case FS_BLOCK:
        if (strcmp(name, "shard") != 0)
            return -ENOENT;
        *out = fs_make_obj(FS_SHARDDIR, &parent->key.block, 0);
        return 0;
    case FS_SHARDDIR:
        if (!fs_parse_shard(name, &n))
            return -ENOENT;
        *out = fs_make_obj(FS_SHARD, &parent->key.block, n);
        if (check_exists && !fs_shard_exists(fs, &out->key))
            return -ENOENT;
        return 0;
    default:
        return -ENOTDIR;
    }
}

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
