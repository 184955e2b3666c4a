/* SPDX-License-Identifier: MIT */
/*
 * read.c - the read path: a read of a shard file is a cache Get.
 *
 * A hit is answered straight from the data-plane mapping (fuse_reply_buf:
 * splice from hugetlb memfds fails). The first reader of a missing shard
 * becomes its owner: it starts an asynchronous backend load into the slot
 * (loads.c) and returns to the loop; the load's completion answers it. Every
 * other reader of that shard (another reader of the mount, or any reader
 * while an attached rank loads it) is a waiter: its request is parked with
 * the settler (wait.c), which answers it when the owner publishes or its
 * deadline passes, so no worker thread sleeps on a load.
 *
 * Readahead: a read that misses (owner or waiter) also starts advisory loads
 * of the next -o readahead shards of its block (the prefetch xattr's path),
 * and marks them; the first read of a marked shard moves the window on. So a
 * sequential reader keeps several backend loads in flight.
 */
#include "fs_i.h"

#include <errno.h>
#include <string.h>

/* ---------------------------------------------------------------------------
 * The read path: Get, then hit / owner / waiter.
 */

/* A read of key missed (or consumed a readahead marker): have the next
 * fs->readahead shards of its block loading, so a sequential reader finds
 * several backend loads in flight instead of waiting for each in turn. */
static void read_ahead(struct fs *fs, const struct sfs_key *key)
{
    int started;

    if (!fs->readahead || key->shard == UINT32_MAX)
        return;
    started = fs_prefetch_shards(fs, &key->block, key->shard + 1, fs->readahead, true);
    if (started > 0)
        CTR_ADD(fs, readahead_started, (uint64_t)started);
}

/* Errors of a Get, for a reader. */
static int get_errno(struct fs *fs, int r)
{
    if (r == -ENOSPC || r == -ENOBUFS) {
        CTR_ADD(fs, wait_timeouts, 1);
        return EAGAIN; /* every slot leased until the deadline */
    }
    return r == -ENOENT ? ENOENT : EIO;
}

/* ino: the inode of a file read through the page cache, else 0. */
static void read_shard(fuse_req_t req, struct fs *fs, fuse_ino_t ino, const struct sfs_key *keyp,
                       size_t size, off_t off)
{
    /* A copy: once req is answered, a RELEASE may free the handle keyp is in. */
    const struct sfs_key key = *keyp;
    struct sfs_lease l;
    bool ra = false;
    int r;

    CTR_ADD(fs, reads, 1);
    if (off < 0 || (uint64_t)off >= fs->shard_size || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > fs->shard_size - (uint64_t)off)
        size = fs->shard_size - (size_t)off;
    if (off == 0)
        fs_usage_note(fs, &key.block); /* one use per read of the shard from its start */
    if (ino && fs_node_retired(fs, ino, NULL)) {
        /* Its version is no longer the key's: no Get (pagecache.c). */
        fs_read_answer(fs, req, ino, &key, NULL, off, size);
        return;
    }
    r = sfs_cache_get(fs->cache, &key, 0, sfs_deadline_after(fs->wait_ns), &l);
    if (r < 0) {
        fuse_reply_err(req, get_errno(fs, r));
        return;
    }
    if (r == SFS_OWNER) {
        fs_load_start(fs, req, ino, &key, &l, off, size);
        read_ahead(fs, &key); /* after ours: our load goes first */
        return;
    }
    if (r == SFS_WAITER) {
        /* Before parking: the loads behind this one overlap the wait. */
        if (fs->readahead) {
            fs_ra_mark_take(fs, &key);
            read_ahead(fs, &key);
        }
        /* No worker sleeps on another's load: the settler (wait.c) answers
         * when the slot settles, and this worker takes the next request. */
        fs_waitq_park(fs, req, ino, &key, &l, off, size, sfs_deadline_after(fs->wait_ns));
        return;
    }
    /* A hit on a shard readahead loaded: move the window on. */
    ra = fs->readahead && fs_ra_mark_take(fs, &key);
    fs_read_answer(fs, req, ino, &key, &l, off, size); /* releases l, or keeps it as a pin */
    if (ra)
        read_ahead(fs, &key);
}

void fs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = fs_fh_of(fi);

    if (!h) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (h->obj.kind == FS_STATS) {
        if (off < 0 || (size_t)off >= h->text_len) {
            fuse_reply_buf(req, NULL, 0);
            return;
        }
        if (size > h->text_len - (size_t)off)
            size = h->text_len - (size_t)off;
        /* Reply from a copy: the reader wakes inside our writev, and with
         * noflush its RELEASE may free h before writev returns (harmless to
         * the kernel's copy, but the buffer must outlive the call). */
        char copy[STATS_MAX];

        memcpy(copy, h->text + off, size);
        fuse_reply_buf(req, copy, size);
        return;
    }
    if (h->writable) {
        /* Read back what this handle holds (O_RDWR). */
        pthread_mutex_lock(&h->lock);
        if (off < 0 || (uint64_t)off >= fs->shard_size) {
            fuse_reply_buf(req, NULL, 0);
        } else {
            if (size > fs->shard_size - (uint64_t)off)
                size = fs->shard_size - (size_t)off;
            fuse_reply_buf(req, (const char *)h->buf + off, size);
        }
        pthread_mutex_unlock(&h->lock);
        return;
    }
    read_shard(req, fs, h->cached ? ino : 0, &h->obj.key, size, off);
}
