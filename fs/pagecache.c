/* SPDX-License-Identifier: MIT */
/*
 * pagecache.c - the page-cache mode (-o page_cache=SIZE): the kernel's page
 * cache serves resident shards, kept coherent with every change of a key.
 *
 * In this mode a shard opened for reading is not direct_io and keeps its
 * cache across opens (keep_cache), so repeated reads, 4 KiB ones above all,
 * never reach the daemon. The kernel caches only what a FUSE read answered,
 * and the key idea is that **the daemon keeps a lease (a pin) on the slot of
 * every shard whose pages the kernel may hold**:
 *
 *   - after answering a read of a shard, the lease of that read becomes the
 *     inode's pin, or is released when the inode has one already (the same
 *     slot: a pinned slot can be neither evicted nor rewritten);
 *   - every change of a key needs its slot unleased: a write through the
 *     mount or a rank's dump takes it with SFS_GET_WRITE, a remove with
 *     sfs_cache_remove, and both answer -EBUSY while any lease is held (and
 *     retry until their deadline). So no change can happen while a pin is
 *     held;
 *   - a pin is dropped in one order: taken off its node (under fs->lock),
 *     the inode's pages invalidated (fuse_lowlevel_notify_inval_inode,
 *     synchronous: when it returns the kernel holds none of them), then the
 *     lease released. A read answered meanwhile holds its own lease until it
 *     is pinned again, so the slot never stands unleased with pages cached.
 *
 * Hence a change that succeeds comes after the invalidation of every page
 * the old bytes were cached in, and the next read (through a file kept open
 * or a new one) asks the daemon, which answers from the slot: the new bytes,
 * or ENOENT after a remove. The daemon drops its pins itself before its own
 * changes (write.c, dir.c). The ranks' changes are learned from the slot: a
 * write Get or a remove that meets a lease sets the slot's write-wanted flag
 * (sfs_cache_write_wanted), and the watcher thread, which looks at every pin
 * every PC_POLL_NS while any is held, drops the pins whose slot is wanted;
 * the rank's dump, which retries every millisecond, then takes the slot. So
 * a dump of a shard the mount caches waits about 1-2 ms more, and an
 * eviction never meets a page-cached shard (it is leased). The watcher also
 * keeps the pins within the budget, dropping the oldest first.
 *
 * Versions. That alone let one read(2) return two versions: the kernel
 * serves a read(2) from several page-cache lookups and fetches a missing
 * page with a FUSE read of its own, and a change between two of them (pages
 * invalidated, new bytes stored) gave the read the old bytes first and the
 * new ones after. No FUSE read says which read(2) it serves, and pages of
 * one inode are shared by all its readers, so the daemon cannot serve the
 * rest of an old read the old bytes and a later read the new ones from one
 * inode. So an inode with files open through the page cache (its node's
 * nreaders) keeps its version: a change of the key retires it instead
 * (names.c: off its name's chains, so a lookup makes a new inode for the
 * new bytes), with a copy of the old bytes taken under the pin before the
 * lease goes, and its pages kept. Every later FUSE read of that inode is
 * answered from the copy (a read already answered from the slot took its
 * lease first, so it has the old bytes too), its open files read the whole
 * old version until they close, and a new open of it answers ESTALE, on
 * which the kernel looks the name up again and opens the new inode. A
 * remove retires without a copy (its files fail ESTALE); so does a change
 * past the copies' budget (page_cache bytes). A pin of an inode with open
 * files is not dropped for the budget: without the pin the key could change
 * under a read(2) half served from the pages.
 *
 * Invalidations are made by the watcher and by handlers that change a key
 * (FLUSH, fsync, setattr, unlink, create): never under a lock the kernel
 * holds for the same inode's pages, but they need another worker to answer
 * a read the kernel may be waiting on, so the mode refuses -s.
 */
#include "fs_i.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PC_BATCH 64 /* pins one pass of the watcher drops at most */

/* gone: the key is being removed (no version to keep); change: it is being
 * rewritten (or a rank wants it); neither: only the pin goes (the budget). */
static void drop_one(struct fs *fs, const struct fs_pinned *p, bool change, bool gone)
{
    if ((change || gone) && p->readers) {
        /* Files are open on the inode, and a read(2) of one may be half
         * served from its pages: they keep this version (a copy: the slot
         * is about to change), new lookups get a new inode. */
        uint32_t len = sfs_cache_length(fs->cache, &p->lease);
        const void *data = sfs_cache_data(fs->cache, &p->lease);
        struct fs_snap *snap = NULL;

        if (!gone && data && (snap = malloc(sizeof(*snap) + len))) {
            snap->refs = 1;
            snap->len = len;
            memcpy(snap->bytes, data, len);
        }
        fs_node_retire(fs, p->ino, &snap);
        if (!snap && fs->se) /* nothing to read: their next read fails ESTALE */
            fuse_lowlevel_notify_inval_inode(fs->se, p->ino, 0, 0);
        sfs_cache_release(fs->cache, &p->lease);
        return;
    }
    /* Pages first, then the lease: -ENOENT (the kernel forgot the inode,
     * and its pages with it) and a session that ended are fine. */
    if (fs->se)
        fuse_lowlevel_notify_inval_inode(fs->se, p->ino, 0, 0);
    sfs_cache_release(fs->cache, &p->lease);
}

void fs_pin_drop(struct fs *fs, const struct sfs_key *key, bool gone)
{
    struct fs_pinned p;

    if (fs->pc_max && fs_pin_take(fs, key, &p))
        drop_one(fs, &p, true, gone);
}

/* Answer a read from a Ready slot. */
static void reply_slot(struct fs *fs, fuse_req_t req, const struct sfs_lease *l, off_t off,
                       size_t size)
{
    const char *data = sfs_cache_data(fs->cache, l);
    uint32_t len = sfs_cache_length(fs->cache, l);

    if (!data) {
        fuse_reply_err(req, EIO);
        return;
    }
    if ((uint64_t)off >= len) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > len - (uint64_t)off)
        size = len - (size_t)off;
    CTR_ADD(fs, read_bytes, size);
    fuse_reply_buf(req, data + off, size);
}

void fs_read_answer(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                    const struct sfs_lease *l, off_t off, size_t size)
{
    struct fs_snap *snap;

    /* After the lease: a retirement that comes later copies this same
     * version (the slot cannot change while l is held). */
    if (fs->pc_max && ino && fs_node_retired(fs, ino, &snap)) {
        if (l)
            sfs_cache_release(fs->cache, l);
        if (!snap) {
            fuse_reply_err(req, ESTALE);
            return;
        }
        if ((uint64_t)off >= snap->len)
            size = 0;
        else if (size > snap->len - (uint64_t)off)
            size = snap->len - (size_t)off;
        CTR_ADD(fs, read_bytes, size);
        fuse_reply_buf(req, size ? (const char *)snap->bytes + off : NULL, size);
        fs_snap_put(fs, snap);
        return;
    }
    reply_slot(fs, req, l, off, size);
    if (fs->pc_max && fs_pin_keep(fs, ino, key, l))
        return;
    sfs_cache_release(fs->cache, l);
}

static void *watch_main(void *arg)
{
    struct fs *fs = arg;
    struct fs_pinned batch[PC_BATCH];
    size_t n = 0;

    pthread_mutex_lock(&fs->lock);
    while (!fs->pcw.stop) {
        if (fs->npins == 0) {
            pthread_cond_wait(&fs->pcw.cond, &fs->lock);
        } else if (fs->npins <= fs->pc_max || n < PC_BATCH) {
            /* (Beyond the budget, the pins of inodes with open files stay
             * until those close: look again later, not at once.) */
            struct timespec ts;

            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += PC_POLL_NS;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&fs->pcw.cond, &fs->lock, &ts);
        }
        if (fs->pcw.stop)
            break;
        n = fs_pins_collect_locked(fs, batch, PC_BATCH);
        if (!n)
            continue;
        pthread_mutex_unlock(&fs->lock);
        for (size_t i = 0; i < n; i++)
            drop_one(fs, &batch[i], batch[i].changed, false);
        pthread_mutex_lock(&fs->lock);
    }
    pthread_mutex_unlock(&fs->lock);
    return NULL;
}

int fs_pagecache_start(struct fs *fs)
{
    pthread_condattr_t ca;
    int r;

    if (!fs->pc_max)
        return 0;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fs->pcw.cond, &ca);
    pthread_condattr_destroy(&ca);
    fs->pcw.stop = false;
    r = pthread_create(&fs->pcw.thread, NULL, watch_main, fs);
    if (r)
        return -r;
    fs->pcw.started = true;
    return 0;
}

void fs_pagecache_stop(struct fs *fs)
{
    if (!fs->pcw.started)
        return;
    pthread_mutex_lock(&fs->lock);
    fs->pcw.stop = true;
    pthread_cond_signal(&fs->pcw.cond);
    pthread_mutex_unlock(&fs->lock);
    pthread_join(fs->pcw.thread, NULL);
    fs->pcw.started = false;
    /* The pins stay until sfs_cache_close() frees this process's leases. */
}
