/* SPDX-License-Identifier: MIT */
/*
 * loads.c - backend loads into leased slots, and the answers they give.
 *
 * The room below the read path (read.c), the settler (wait.c), the prefetch
 * xattr (xattr.c) and the write path's read-modify-write (write.c): each of
 * them calls down into it, and it calls none of them. An owner's load is
 * asynchronous: it is submitted to the backend and its completion publishes
 * the slot (Ready or Failed) and answers the request, if any, from the
 * backend's thread; the lease is released after the reply is written, so a
 * slot is never evicted under a reply. A parked read whose wait ended is
 * answered here too (fs_read_settled), so the settler never calls back up
 * into the read path.
 *
 * Prefetch (the xattr, and readahead after a missed read) starts advisory
 * loads in batches that keep their slots leased until the last load ends,
 * and sets readahead markers the read path consumes. The loads in flight are
 * listed so that a stop can wait for them, then abandon the rest
 * (fs_loads_stop).
 */
#include "fs_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define STOP_POLL_NS (100 * 1000 * 1000ll) /* how often a blocked load_copy checks for a stop */

/* An asynchronous backend load into a leased slot; req is NULL for a
 * prefetch (nobody to answer). On fs->loads from submission until its
 * completion; freed by load_done(). Exactly one of load_done() and
 * fs_loads_stop() handles it: whichever sets its flag first, under
 * fs->load_lock. */
struct load_op {
    struct fs *fs;
    fuse_req_t req;
    fuse_ino_t ino; /* req's inode when read through the page cache, else 0 */
    struct sfs_lease lease;
    off_t off;
    size_t size;
    struct sfs_io io;
    struct prefetch_batch *batch; /* a prefetch's: the batch holds the lease */
    int64_t deadline;             /* req's: ETIMEDOUT after (fs_loads_expire) */
    struct load_op *prev, *next;  /* fs->load_lock */
    bool completing;              /* fs->load_lock: load_done() is handling it */
    bool abandoned;               /* fs->load_lock: fs_loads_stop() handled it */
    bool for_read;                /* a reader's load (counted as served), not a prefetch */
    int64_t start_ns;             /* submitted (the load latency histogram) */
};

/*
 * The slots one prefetch request (the xattr, or a readahead window) started
 * loading stay leased until the last of its loads completes: the CLOCK hand
 * never takes a leased slot, so a prefetch can never evict what it itself
 * just loaded (a huge block on a small cache used to chase its own tail:
 * 88,167 loads, 87,207 evictions). Then every lease goes back at once and the
 * slots keep the second chance a new load gets.
 */
struct prefetch_batch {
    _Atomic uint32_t pending; /* loads not yet done, +1 while the batch is being started */
    uint32_t n;               /* leases[] used; at most the cap it was made for */
    struct sfs_lease leases[];
};

/* Drop one reference; the last releases every lease of the batch. */
static void batch_put(struct fs *fs, struct prefetch_batch *b)
{
    /* acq_rel: the last one sees every lease the starter stored. */
    if (atomic_fetch_sub_explicit(&b->pending, 1, memory_order_acq_rel) != 1)
        return;
    for (uint32_t i = 0; i < b->n; i++)
        sfs_cache_release(fs->cache, &b->leases[i]);
    /* Relaxed: a bound on new batches, not an ordering. */
    atomic_fetch_sub_explicit(&fs->prefetch_pinned, b->n, memory_order_relaxed);
    free(b);
}

/* The errno a reader gets for a load error: ENOENT for a shard that is gone,
 * EIO for everything else (errors, short reads). */
static int reader_errno(int err)
{
    return err == -ENOENT ? ENOENT : EIO;
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
    int err;

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

    if (io->result != (int)io->len)
        CTR_ADD(fs, backend_errors, 1);
    sfs_cache_observe(fs->cache, SFS_HIST_LOAD, sfs_now_ns() - op->start_ns);
    if (op->for_read && io->result == (int)io->len)
        sfs_cache_count_served(fs->cache, sfs_io_from_peer(io) ? SFS_TIER_PEER : SFS_TIER_STORE);
    else if (op->for_read && io->result == -ENOENT)
        sfs_cache_count_served(fs->cache, SFS_TIER_MISS);
    /* What the slot's waiters see is what this reader gets. */
    err = sfs_cache_settle(fs->cache, &op->lease, io->result, io->len, 0);
    if (op->req) {
        if (err)
            fuse_reply_err(op->req, reader_errno(err));
        else
            fs_read_answer(fs, op->req, op->ino, &op->io.key, &op->lease, op->off, op->size);
    }
    if (op->batch)
        batch_put(fs, op->batch);
    else if (!op->req || err)
        sfs_cache_release(fs->cache, &op->lease); /* else released or kept as a pin */
    pthread_mutex_lock(&fs->load_lock);
    loads_unlink(fs, op);
    if (--fs->nloads == 0)
        pthread_cond_broadcast(&fs->loads_idle);
    pthread_mutex_unlock(&fs->load_lock);
    free(op);
}

/* As owner of lease: load the shard asynchronously. Consumes the lease (and
 * answers req, when given) whatever happens. */
static void start_load_in(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                          const struct sfs_lease *lease, off_t off, size_t size,
                          struct prefetch_batch *batch)
{
    struct load_op *op = calloc(1, sizeof(*op));
    struct sfs_io *iop;
    void *data = sfs_cache_data(fs->cache, lease);
    int r;

    if (!op || !data) {
        free(op);
        sfs_cache_fail(fs->cache, lease, op ? -EIO : -ENOMEM);
        if (batch)
            batch_put(fs, batch);
        else
            sfs_cache_release(fs->cache, lease);
        if (req)
            fuse_reply_err(req, op ? EIO : ENOMEM);
        return;
    }
    op->fs = fs;
    op->req = req;
    op->ino = ino;
    op->lease = *lease;
    op->off = off;
    op->size = size;
    op->batch = batch;
    op->deadline = sfs_deadline_after(fs->wait_ns);
    op->for_read = req != NULL;
    op->start_ns = sfs_now_ns();
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

void fs_load_start(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                   const struct sfs_lease *lease, off_t off, size_t size)
{
    start_load_in(fs, req, ino, key, lease, off, size, NULL);
}

void fs_loads_expire(struct fs *fs, int64_t now)
{
    fuse_req_t late[64];
    size_t n = 0;

    /* Bound: one pass over the loads in flight; at most 64 answers a call
     * (the rest go on the next, 100 ms later at most). */
    pthread_mutex_lock(&fs->load_lock);
    for (struct load_op *op = fs->loads; op && n < 64; op = op->next) {
        if (!op->req || op->completing || op->abandoned || now < op->deadline)
            continue;
        /* The load goes on and publishes for whoever reads next; this
         * reader stops waiting for it. load_done() sees req NULL. */
        late[n++] = op->req;
        op->req = NULL;
    }
    pthread_mutex_unlock(&fs->load_lock);
    for (size_t i = 0; i < n; i++) {
        CTR_ADD(fs, wait_timeouts, 1);
        fuse_reply_err(late[i], ETIMEDOUT);
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

bool fs_ra_mark_take(struct fs *fs, const struct sfs_key *key)
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
    /* Bounds (docs/fs.md): one request starts at most nslots/4 loads and
     * looks at most nslots shards; all requests together pin at most
     * nslots/2 slots. Its cost is bounded by the cache, never the block. */
    uint32_t cap = fs->nslots / 4 ? fs->nslots / 4 : 1;
    uint32_t pin_max = fs->nslots / 2 ? fs->nslots / 2 : 1;
    uint32_t end, probes = 0;
    struct prefetch_batch *b;

    if (count <= 0 || first >= (uint32_t)count)
        return 0;
    end = n < (uint32_t)count - first ? first + n : (uint32_t)count;
    if (end - first < cap)
        cap = end - first;
    b = malloc(sizeof(*b) + (size_t)cap * sizeof(b->leases[0]));
    if (!b)
        return 0;
    atomic_init(&b->pending, 1);
    b->n = 0;
    for (uint32_t i = first; i < end && b->n < cap && probes < fs->nslots; i++, probes++) {
        struct sfs_key k = {.block = *block, .shard = i};
        struct sfs_lease l;
        int r;

        /* Relaxed: an approximate bound; a race overshoots by a few. */
        if (atomic_load_explicit(&fs->prefetch_pinned, memory_order_relaxed) >= pin_max)
            break;
        r = sfs_cache_get(fs->cache, &k, SFS_GET_PREFETCH, 0, &l);
        if (r == -EEXIST)
            continue; /* already there */
        if (r < 0)
            break; /* no free slot without evicting a leased one: stop, it is advice */
        if (r != SFS_OWNER) {
            sfs_cache_release(fs->cache, &l);
            continue;
        }
        if (mark)
            ra_mark_set(fs, &k);
        b->leases[b->n++] = l;
        atomic_fetch_add_explicit(&fs->prefetch_pinned, 1, memory_order_relaxed);
        /* Relaxed: batch_put's acq_rel orders the leases[] stores. */
        atomic_fetch_add_explicit(&b->pending, 1, memory_order_relaxed);
        start_load_in(fs, NULL, 0, &k, &l, 0, 0, b);
        started++;
    }
    batch_put(fs, b); /* the starter's reference */
    return started;
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

void fs_read_settled(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                     const struct sfs_lease *l, off_t off, size_t size, int r)
{
    if (r == SFS_WAIT_OWNER) {
        /* The owner died or gave the slot back: ours to fill now. */
        fs_load_start(fs, req, ino, key, l, off, size);
        return;
    }
    if (r == SFS_WAIT_READY) {
        fs_read_answer(fs, req, ino, key, l, off, size); /* releases l, or keeps it as a pin */
        return;
    } else if (r == -ETIMEDOUT) {
        CTR_ADD(fs, wait_timeouts, 1);
        fuse_reply_err(req, ETIMEDOUT);
    } else {
        fuse_reply_err(req, reader_errno(sfs_cache_wait_errno(fs->cache, l, r)));
    }
    sfs_cache_release(fs->cache, l);
}

/* Synchronous: copy the shard's current bytes into buf (via the cache, so
 * the load is shared with concurrent readers). Returns 0 or -errno. */
int fs_load_copy(struct fs *fs, const struct sfs_key *key, void *buf)
{
    struct sfs_lease l;
    int r = sfs_cache_get(fs->cache, key, 0, sfs_deadline_after(fs->wait_ns), &l);

    if (r == -ENOSPC || r == -ENOBUFS) {
        /* No slot to be had: read around the cache. Harmless, unlike a
         * write around it (store_shard never does): these bytes go only to
         * the caller's buffer (a write handle's starting bytes, a
         * truncate's kept ones), never into a slot, so the cache cannot
         * come to serve them; reading the previous version while a store
         * commits is what any read racing that store may see. */
        r = sfs_backend_load_sync(fs->be, key, buf, (uint32_t)fs->shard_size);
        return r < 0 ? r : r == (int)fs->shard_size ? 0 : -EIO;
    }
    if (r < 0)
        return r;
    if (r == SFS_WAITER) {
        r = wait_slot(fs, &l, sfs_deadline_after(fs->wait_ns));
        if (r == SFS_WAIT_OWNER) {
            r = SFS_OWNER;
        } else if (r != SFS_WAIT_READY) {
            int err = sfs_cache_wait_errno(fs->cache, &l, r);

            sfs_cache_release(fs->cache, &l);
            return err;
        }
    }
    if (r == SFS_OWNER) {
        void *data = sfs_cache_data(fs->cache, &l);

        CTR_ADD(fs, backend_loads, 1);
        r = data ? sfs_backend_load_sync(fs->be, key, data, (uint32_t)fs->shard_size) : -EIO;
        if (r != (int)fs->shard_size)
            CTR_ADD(fs, backend_errors, 1);
        r = sfs_cache_settle(fs->cache, &l, r, (uint32_t)fs->shard_size, 0);
        if (r < 0) {
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

int fs_retry_busy(struct fs *fs, const struct sfs_key *key, int64_t deadline, int64_t grace,
                  fs_busy_try_fn *try, void *arg)
{
    for (;;) {
        int r = try(fs, key, arg);
        int64_t now;

        if (r != -EBUSY || fs_stopping(fs))
            return r;
        now = sfs_now_ns();
        if (now >= deadline ||
            (grace && now >= grace && sfs_cache_state(fs->cache, key) != SFS_STATE_LOADING))
            return r;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}
