/* SPDX-License-Identifier: MIT */
/*
 * read.c - the read path: a read of a shard file is a cache Get.
 *
 * A hit is answered straight from the data-plane mapping (fuse_reply_buf:
 * splice from hugetlb memfds fails). The first reader of a missing shard
 * becomes its owner: it submits an asynchronous backend load into the slot and
 * returns to the loop; the load's completion publishes the slot (Ready or
 * Failed) and answers the request from the backend's thread. Every other
 * reader of that shard, in this daemon or in an attached rank, is a waiter: it
 * blocks on the slot's futex with a deadline and answers when the owner
 * publishes. The lease is released after the reply is written, so a slot is
 * never evicted under a reply.
 *
 * Readahead: a read that misses (owner or waiter) also starts advisory loads
 * of the next -o readahead shards of its block (the prefetch xattr's path),
 * and marks them; the first read of a marked shard moves the window on. So a
 * sequential reader keeps several backend loads in flight. The loads in flight
 * are listed so that a stop can wait for them, then abandon the rest
 * (fs_loads_stop).
 */
#include "fs_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define STOP_POLL_NS (100 * 1000 * 1000ll) /* how often a blocked handler checks for a stop */

/* ---------------------------------------------------------------------------
 * The read path: Get, then hit / owner / waiter.
 */

/* An asynchronous backend load into a leased slot; req is NULL for a
 * prefetch (nobody to answer). On fs->loads from submission until its
 * completion; freed by load_done(). Exactly one of load_done() and
 * fs_loads_stop() handles it: whichever sets its flag first, under
 * fs->load_lock. */
struct load_op {
    struct fs *fs;
    fuse_req_t req;
    struct sfs_lease lease;
    off_t off;
    size_t size;
    struct sfs_io io;
    struct load_op *prev, *next; /* fs->load_lock */
    bool completing;             /* fs->load_lock: load_done() is handling it */
    bool abandoned;              /* fs->load_lock: fs_loads_stop() handled it */
};

/* The errno a reader gets for a load error: ENOENT for a shard that is gone,
 * EIO for everything else (errors, short reads). */
static int reader_errno(int err)
{
    return err == -ENOENT ? ENOENT : EIO;
}

/* Answer a read from a Ready slot; the caller releases the lease after. */
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

static void loads_unlink(struct fs *fs, struct load_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        fs->loads = op->next;
    if (op->next)
        op->next->prev = op->prev;
}

/* Backend completion: publish, answer the reader (if any), release. Runs on a
 * backend thread, or inline in submit. */
static void load_done(struct sfs_io *io)
{
    struct load_op *op = io->arg;
    struct fs *fs = op->fs;
    int err = 0;

    pthread_mutex_lock(&fs->load_lock);
    if (op->abandoned) {
        /* Too late: shutdown failed the slot and answered the reader. The
         * bytes the backend wrote are for this key; nobody reads them. */
        loads_unlink(fs, op);
        pthread_mutex_unlock(&fs->load_lock);
        free(op);
        return;
    }
    op->completing = true;
    pthread_mutex_unlock(&fs->load_lock);

    if (io->result == (int)io->len) {
        err = sfs_cache_publish(fs->cache, &op->lease, io->len, 0);
    } else {
        err = io->result < 0 ? io->result : -EIO;
        CTR_ADD(fs, backend_errors, 1);
        sfs_cache_fail(fs->cache, &op->lease, err);
    }
    if (op->req) {
        if (err)
            fuse_reply_err(op->req, reader_errno(err));
        else
            reply_slot(fs, op->req, &op->lease, op->off, op->size);
    }
    sfs_cache_release(fs->cache, &op->lease);
    pthread_mutex_lock(&fs->load_lock);
    loads_unlink(fs, op);
    if (--fs->nloads == 0)
        pthread_cond_broadcast(&fs->loads_idle);
    pthread_mutex_unlock(&fs->load_lock);
    free(op);
}

/* As owner of lease: load the shard asynchronously. Consumes the lease (and
 * answers req, when given) whatever happens. */
static void start_load(struct fs *fs, fuse_req_t req, const struct sfs_key *key,
                       const struct sfs_lease *lease, off_t off, size_t size)
{
    struct load_op *op = calloc(1, sizeof(*op));
    struct sfs_io *iop;
    void *data = sfs_cache_data(fs->cache, lease);
    int r;

    if (!op || !data) {
        free(op);
        sfs_cache_fail(fs->cache, lease, op ? -EIO : -ENOMEM);
        sfs_cache_release(fs->cache, lease);
        if (req)
            fuse_reply_err(req, op ? EIO : ENOMEM);
        return;
    }
    op->fs = fs;
    op->req = req;
    op->lease = *lease;
    op->off = off;
    op->size = size;
    op->io.key = *key;
    op->io.buf = data;
    op->io.len = (uint32_t)fs->shard_size;
    op->io.done = load_done;
    op->io.arg = op;
    iop = &op->io;
    pthread_mutex_lock(&fs->load_lock);
    op->next = fs->loads;
    if (op->next)
        op->next->prev = op;
    fs->loads = op;
    fs->nloads++;
    pthread_mutex_unlock(&fs->load_lock);
    CTR_ADD(fs, backend_loads, 1);
    r = sfs_backend_load(fs->be, &iop, 1);
    if (r < 0) {
        /* Nothing was submitted: complete it here, once. */
        op->io.result = r;
        load_done(&op->io);
    }
}

unsigned fs_loads_stop(struct fs *fs, int64_t grace_ns)
{
    int64_t deadline = sfs_deadline_after(grace_ns);
    struct timespec ts = {deadline / 1000000000, deadline % 1000000000};
    unsigned n = 0;

    pthread_mutex_lock(&fs->load_lock);
    while (fs->nloads && pthread_cond_timedwait(&fs->loads_idle, &fs->load_lock, &ts) != ETIMEDOUT)
        ;
    for (struct load_op *op = fs->loads; op; op = op->next) {
        if (op->completing || op->abandoned)
            continue;
        /* Failed, not given back: every waiter learns at once that this
         * load will not come, and the next Get (any process) retries. The
         * lease stays ours until sfs_cache_close(), so the slot cannot go
         * to another key while the backend may still write into it. */
        op->abandoned = true;
        sfs_cache_fail(fs->cache, &op->lease, -ECANCELED);
        if (op->req)
            fuse_reply_err(op->req, EIO);
        op->req = NULL;
        fs->nloads--;
        n++;
    }
    /* Those already completing finish in a moment: they answer requests on
     * the session main() is about to destroy. */
    while (fs->nloads)
        pthread_cond_wait(&fs->loads_idle, &fs->load_lock);
    pthread_mutex_unlock(&fs->load_lock);
    return n;
}

/* Readahead markers (fs_i.h): 0 is "empty", so a hash is never 0. */
static uint64_t ra_hash(const struct sfs_key *key)
{
    struct fs_obj o = fs_make_obj(FS_SHARD, &key->block, key->shard);
    uint64_t h = fs_obj_hash(&o);

    return h ? h : 1;
}

static void ra_mark_set(struct fs *fs, const struct sfs_key *key)
{
    uint64_t h = ra_hash(key);

    atomic_store_explicit(&fs->ra_mark[h & (FS_RA_MARKS - 1)], h, memory_order_relaxed);
}

/* True (once) when key carries a readahead marker. */
static bool ra_mark_take(struct fs *fs, const struct sfs_key *key)
{
    uint64_t h = ra_hash(key);
    _Atomic uint64_t *m = &fs->ra_mark[h & (FS_RA_MARKS - 1)];
    uint64_t v = atomic_load_explicit(m, memory_order_relaxed);

    return v == h && atomic_compare_exchange_strong_explicit(m, &v, 0, memory_order_relaxed,
                                                             memory_order_relaxed);
}

/* Advisory: start background loads of shards [first, first + n) of block,
 * only those the backend has (0..shard_count-1) and the cache lacks
 * (SFS_GET_PREFETCH: no reserved slots, never waits, never evicts a leased
 * slot). mark: set a readahead marker on each load started. Returns how many
 * loads started. Used by user.shardfs.prefetch and by readahead. */
int fs_prefetch_shards(struct fs *fs, const struct sfs_block_id *block, uint32_t first, uint32_t n,
                       bool mark)
{
    int count = sfs_backend_shard_count(fs->be, block), started = 0;
    uint32_t end;

    if (count <= 0 || first >= (uint32_t)count)
        return 0;
    end = n < (uint32_t)count - first ? first + n : (uint32_t)count;
    for (uint32_t i = first; i < end; i++) {
        struct sfs_key k = {.block = *block, .shard = i};
        struct sfs_lease l;
        int r = sfs_cache_get(fs->cache, &k, SFS_GET_PREFETCH, 0, &l);

        if (r == -EEXIST)
            continue; /* already there */
        if (r < 0)
            break; /* no free slot without evicting: stop, it is advice */
        if (r != SFS_OWNER) {
            sfs_cache_release(fs->cache, &l);
            continue;
        }
        if (mark)
            ra_mark_set(fs, &k);
        start_load(fs, NULL, &k, &l, 0, 0);
        started++;
    }
    return started;
}

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

/* The session is ending (a signal, an unmount): handlers stop waiting. */
bool fs_stopping(struct fs *fs)
{
    return fs->se && fuse_session_exited(fs->se);
}

/* sfs_cache_wait() in slices of STOP_POLL_NS, so that a stop is not held up
 * for wait_timeout by a load that may never come (the session loop joins
 * its workers before main() can abandon anything). Waking is still the
 * futex's: a publish ends the wait at once. Returns what sfs_cache_wait()
 * returns, or -ESHUTDOWN. */
static int wait_slot(struct fs *fs, const struct sfs_lease *l, int64_t deadline)
{
    for (;;) {
        int64_t slice = sfs_now_ns() + STOP_POLL_NS;
        int r;

        if (fs_stopping(fs))
            return -ESHUTDOWN;
        r = sfs_cache_wait(fs->cache, l, slice < deadline ? slice : deadline);
        if (r != -ETIMEDOUT || slice >= deadline)
            return r;
    }
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

static void read_shard(fuse_req_t req, struct fs *fs, const struct sfs_key *keyp, size_t size,
                       off_t off)
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
    r = sfs_cache_get(fs->cache, &key, 0, sfs_deadline_after(fs->wait_ns), &l);
    if (r < 0) {
        fuse_reply_err(req, get_errno(fs, r));
        return;
    }
    if (r == SFS_OWNER) {
        start_load(fs, req, &key, &l, off, size);
        read_ahead(fs, &key); /* after ours: our load goes first */
        return;
    }
    if (r == SFS_WAITER) {
        /* Before blocking: the loads behind this one overlap the wait. */
        if (fs->readahead) {
            ra_mark_take(fs, &key);
            read_ahead(fs, &key);
        }
        r = wait_slot(fs, &l, sfs_deadline_after(fs->wait_ns));
        if (r == SFS_WAIT_OWNER) {
            /* The owner died or gave the slot back: ours to fill now. */
            start_load(fs, req, &key, &l, off, size);
            return;
        }
        if (r == -ETIMEDOUT) {
            CTR_ADD(fs, wait_timeouts, 1);
            fuse_reply_err(req, ETIMEDOUT);
            sfs_cache_release(fs->cache, &l);
            return;
        }
        if (r != SFS_STATE_READY) {
            int err = r == SFS_STATE_FAILED ? sfs_cache_error(fs->cache, &l) : r;

            fuse_reply_err(req, reader_errno(err < 0 ? err : -EIO));
            sfs_cache_release(fs->cache, &l);
            return;
        }
    } else {
        /* A hit on a shard readahead loaded: move the window on. */
        ra = fs->readahead && ra_mark_take(fs, &key);
    }
    reply_slot(fs, req, &l, off, size);
    sfs_cache_release(fs->cache, &l);
    if (ra)
        read_ahead(fs, &key);
}

/* Synchronous: copy the shard's current bytes into buf (via the cache, so
 * the load is shared with concurrent readers). Returns 0 or -errno. */
int fs_load_copy(struct fs *fs, const struct sfs_key *key, void *buf)
{
    struct sfs_lease l;
    int r = sfs_cache_get(fs->cache, key, 0, sfs_deadline_after(fs->wait_ns), &l);

    if (r == -ENOSPC || r == -ENOBUFS) {
        /* No slot to be had: read around the cache. */
        r = sfs_backend_load_sync(fs->be, key, buf, (uint32_t)fs->shard_size);
        return r < 0 ? r : r == (int)fs->shard_size ? 0 : -EIO;
    }
    if (r < 0)
        return r;
    if (r == SFS_WAITER) {
        r = wait_slot(fs, &l, sfs_deadline_after(fs->wait_ns));
        if (r == SFS_WAIT_OWNER) {
            r = SFS_OWNER;
        } else if (r != SFS_STATE_READY) {
            int err = r == SFS_STATE_FAILED ? sfs_cache_error(fs->cache, &l) : r;

            sfs_cache_release(fs->cache, &l);
            return err < 0 ? err : -EIO;
        }
    }
    if (r == SFS_OWNER) {
        void *data = sfs_cache_data(fs->cache, &l);

        CTR_ADD(fs, backend_loads, 1);
        r = data ? sfs_backend_load_sync(fs->be, key, data, (uint32_t)fs->shard_size) : -EIO;
        if (r == (int)fs->shard_size) {
            sfs_cache_publish(fs->cache, &l, (uint32_t)fs->shard_size, 0);
        } else {
            r = r < 0 ? r : -EIO;
            CTR_ADD(fs, backend_errors, 1);
            sfs_cache_fail(fs->cache, &l, r);
            sfs_cache_release(fs->cache, &l);
            return r;
        }
    }
    {
        uint32_t len = sfs_cache_length(fs->cache, &l);
        const void *data = sfs_cache_data(fs->cache, &l);

        if (data)
            memcpy(buf, data, len < fs->shard_size ? len : fs->shard_size);
        else
            r = -EIO;
    }
    sfs_cache_release(fs->cache, &l);
    return r < 0 ? r : 0;
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
    read_shard(req, fs, &h->obj.key, size, off);
}
