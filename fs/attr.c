/* SPDX-License-Identifier: MIT */
/*
 * attr.c - what the kernel is told about an object: its attributes, the
 * entry reply of a lookup or a create, and which object a (parent, name)
 * names.
 *
 * Every inode shows the backend directory's owner, group and permission bits
 * (read once at start), the start time as its times, and shard_size as a
 * shard's size: the tree is virtual, so the attributes are a pure function of
 * the object and the daemon's configuration (and, for /stats, of the text's
 * length now). Shared by ops.c, write.c and dir.c; calls only names.c and
 * stats.c below it.
 */
#include "fs_i.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

/* The inode number stat shows: the fixed ones as they are; a block, its
 * shard directory or a shard gets a pure function of what it names, not
 * the node number the table handed out. The kernel forgets an idle node
 * (memory pressure, an expired entry) and the next lookup gets a new node
 * number; a tool that compares st_ino across its own stat and open (cp:
 * "replaced while being copied") must still see the same file. 63 bits,
 * never one of the fixed numbers; two objects sharing one is a 2^-63 event
 * that only tools comparing inode numbers could notice. */
static ino_t stable_ino(const struct fs_obj *o, fuse_ino_t ino)
{
    uint64_t w[2], h;

    if (ino < FS_INO_DYNAMIC)
        return (ino_t)ino;
    memcpy(w, o->key.block.b, sizeof(w));
    h = w[0] ^ (w[1] * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)o->key.shard << 3) ^ (uint64_t)o->kind;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    h &= INT64_MAX;
    return (ino_t)(h < FS_INO_DYNAMIC ? h + FS_INO_DYNAMIC : h);
}

void fs_fill_attr(struct fs *fs, const struct fs_obj *o, fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = stable_ino(o, ino);
    /* The backend directory's owner, group and mode (options.c): what the
     * kernel checks (default_permissions) is what the store's own
     * directory allows. Shards drop the x bits; -o ro drops the w bits. */
    st->st_uid = fs->uid;
    st->st_gid = fs->gid;
    st->st_atim = st->st_mtim = st->st_ctim = fs->start;
    /* The I/O size tools take from us (docs/fs.md, "st_blksize"): 128 KiB is
     * coreutils' own floor, so cat and cp read with the buffer they use on
     * tmpfs; a larger one (1 MiB) made cat map and fault in a fresh buffer
     * per file, which cost more than the FUSE requests it saved. */
    st->st_blksize = (blksize_t)(fs->shard_size < FS_BLKSIZE ? fs->shard_size : FS_BLKSIZE);
    switch (o->kind) {
    case FS_SHARD:
        st->st_mode = S_IFREG | (fs->perm & 0666 & (fs->ro ? 0444 : 0777));
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
        st->st_mode = S_IFDIR | (fs->perm & (fs->ro ? 0555 : 0777));
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
    /* A shard a writer of the mount holds may exist only by that writer (a
     * new name not yet stored): an entry the kernel kept for a second would
     * show it after the writer's close reported it unstored. */
    if (o->kind == FS_SHARD && fs_has_writers(fs, o))
        e.attr_timeout = e.entry_timeout = 0.0;
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
        if (check_exists) {
            int r = fs_shard_present(fs, &out->key);

            if (r == 0) /* a name the store lacks: the mount's miss (its read never Gets) */
                sfs_cache_count_served(fs->cache, SFS_TIER_MISS);
            if (r <= 0)
                return r < 0 ? r : -ENOENT; /* -ETIMEDOUT: a hung store */
        }
        return 0;
    default:
        return -ENOTDIR;
    }
}
