/* SPDX-License-Identifier: MIT */
/*
 * revalidate.c - -o revalidate=MS: on a store that several hosts share, a
 * block another host replaced (or removed) stops being served from this
 * daemon's cache within a bound (docs/shared-store.md, "Another host's
 * commit").
 *
 * The cache keeps no version of what a slot holds, and the hit path and
 * the shared layout stay as they are: this is a sweep of the daemon's own,
 * through the public cache and backend APIs. Every `period` it takes a
 * snapshot of the resident keys (sfs_cache_foreach, Ready and Loading),
 * groups them by block, and asks the store for each block's stamp (its
 * file's device, inode, size, mtime, ctime: sfs_backend_stamp). It keeps,
 * per block resident at the last sweep, the stamp it saw and whether it
 * *trusts* it: whether every resident shard of the block was read from
 * that version. Per block:
 *
 *   trusted, stamp the same  nothing changed: done.
 *   anything else            the block is *invalidated*: each of its
 *                            shards (0 .. the most any version it knows
 *                            had) is removed from the cache when unleased
 *                            (sfs_cache_remove; page-cache pins dropped
 *                            first), so the next read loads the store's
 *                            version. When none was leased, the stamp
 *                            taken before the removals is trusted: every
 *                            shard resident from now on is loaded after
 *                            it, from that version or a later one (which
 *                            the next sweep sees as a changed stamp). A
 *                            leased shard (a read in progress, a load in
 *                            flight: Loading slots are leased) stays, the
 *                            block stays untrusted, and the next sweep
 *                            tries again.
 *
 * except for a block seen for the first time (not resident at the last
 * sweep's snapshot, so every one of its shards was claimed, and read,
 * after that sweep began, at T): its stamp is trusted without removing
 * anything when the file's mtime and ctime are at least REVAL_MARGIN_NS
 * before T (the commit was visible to this host's lookups before those
 * reads, and nothing replaced it since). A file younger than that is
 * invalidated as above: a spurious reload at worst, once. The first
 * sweep's T is the daemon's start (the cache is new; nothing was loaded
 * before it). A block with no Ready shard (only loads in flight, whose
 * owners hold leases) is not stat'ed: it keeps what was known of it, or,
 * first seen, stays unjudged with its T until a shard is Ready. The same
 * when the store does not answer; a stamp that times out (a hung store)
 * ends the sweep's stats, and the next sweep waits REVAL_BACKOFF_MS, since
 * each such stamp holds one of the backend's helper threads.
 *
 * The bound. A commit or remove another host finished at t is seen by this
 * host's stat once the client's lookup and attribute caches let it (L:
 * GlusterFS 1 s; NFS acdirmax), so the first sweep to stat the block after
 * t + L invalidates it: t + L + period + 2 x (one sweep's time) at most, if
 * its shards are unleased then (each sweep that finds one leased adds a
 * period). What it assumes: host clocks within 1 s of each other (the
 * first-seen rule compares another host's file times with ours;
 * REVAL_MARGIN_NS allows 1 s of skew and 1 s of lookup cache); a commit
 * sets ctime (rename does on Linux file systems, NFS and GlusterFS);
 * writes through the cache are write-through (the slot is leased until the
 * store has them, write.c), so a removal never drops bytes the store lacks;
 * and no bucket lock is held past its deadline during a snapshot (a stopped
 * holder: sfs_cache_foreach skips that bucket, whose blocks then count as
 * absent).
 *
 * Cost: one stat per resident block per period (a helper thread of the
 * backend, with its deadline); nothing on the hit path. The table is this
 * process's: two sorted arrays (last sweep, this one), O(blocks log blocks)
 * per sweep.
 */
#include "fs_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REVAL_MARGIN_NS  (2000 * 1000 * 1000ll) /* 1 s of lookup cache + 1 s of clock skew */
#define REVAL_SHARDS_MIN 64u                    /* shards an invalidation removes at least */
#define REVAL_SHARDS_MAX 65536u                 /* and at most (a bound on one block's work) */
#define REVAL_BACKOFF_MS 30000u                 /* the wait after a sweep whose stamp timed out */

/* Set when a stop gave up waiting for the sweep (a stamp stuck in a hung
 * store): the daemon is closing the cache and leaving, so the sweep must
 * touch nothing of it, struct fs included, once its call returns. A
 * static, not in struct fs, for that reason. Relaxed: the flag alone
 * matters. */
static _Atomic bool reval_abandoned;

/* What a sweep knew of one block. */
enum reval_state {
    REC_UNJUDGED,  /* not looked at yet (only loading, or the store did not
                    * answer): its shards were claimed after `since` */
    REC_UNTRUSTED, /* to be invalidated (a shard was leased last time) */
    REC_TRUSTED,   /* every resident shard was read from st's version */
};

struct reval_rec {
    struct sfs_block_id id;
    struct sfs_block_stamp st; /* valid when have_st */
    int64_t since;             /* REC_UNJUDGED: realtime its shards were claimed after */
    uint32_t nshards;          /* 1 + the highest shard resident or in a known version */
    enum reval_state state;
    bool have_st;
    bool ready; /* the snapshot had a Ready shard of it (else only Loading) */
};

static int cmp_id(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct sfs_block_id));
}

/* The snapshot: resident keys, in a growing array. */
struct snap {
    struct reval_rec *r;
    size_t n, cap;
    int err;
};

static int snap_key(const struct sfs_key *key, int state, void *arg)
{
    struct snap *s = arg;

    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 256;
        struct reval_rec *nr = realloc(s->r, ncap * sizeof(*nr));

        if (!nr) {
            s->err = -ENOMEM;
            return 1;
        }
        s->r = nr;
        s->cap = ncap;
    }
    s->r[s->n++] = (struct reval_rec){
        .id = key->block, .nshards = key->shard + 1, .ready = state == SFS_STATE_READY};
    return 0;
}

/* Sort by block and merge each block's keys into one record. */
static size_t snap_blocks(struct snap *s)
{
    size_t m = 0;

    if (s->n == 0)
        return 0; /* nothing resident: s->r may be NULL, which qsort must not get */
    qsort(s->r, s->n, sizeof(*s->r), cmp_id);
    for (size_t i = 0; i < s->n; i++) {
        if (m && memcmp(&s->r[m - 1].id, &s->r[i].id, sizeof(s->r[i].id)) == 0) {
            if (s->r[i].nshards > s->r[m - 1].nshards)
                s->r[m - 1].nshards = s->r[i].nshards;
            s->r[m - 1].ready |= s->r[i].ready;
            continue;
        }
        s->r[m++] = s->r[i];
    }
    s->n = m;
    return m;
}

static int64_t realtime_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t shards_of(const struct fs *fs, const struct sfs_block_stamp *st)
{
    uint64_t n = st->size / fs->shard_size;

    return n > REVAL_SHARDS_MAX ? REVAL_SHARDS_MAX : (uint32_t)n;
}

/* Remove every unleased shard of r's block. True when none was leased. */
static bool invalidate(struct fs *fs, const struct reval_rec *r, uint32_t nshards)
{
    bool all = true;
    uint64_t removed = 0;

    if (nshards < REVAL_SHARDS_MIN)
        nshards = REVAL_SHARDS_MIN;
    for (uint32_t n = 0; n < nshards; n++) {
        struct sfs_key k = {.block = r->id, .shard = n};
        int ret;

        fs_pin_drop(fs, &k, false); /* the kernel's pages first (page-cache mode) */
        ret = sfs_cache_remove(fs->cache, &k);
        if (ret == 0)
            removed++;
        else if (ret != -ENOENT)
            all = false; /* -EBUSY: leased; or a lock's error: try again next sweep */
    }
    /* Relaxed: a statistic. */
    atomic_fetch_add_explicit(&fs->ctr.reval_removed, removed, memory_order_relaxed);
    return all;
}

/* Keep what the last sweep knew of a block not judged now (prev NULL:
 * first seen, claimed after since). */
static void carry(struct reval_rec *cur, const struct reval_rec *prev, int64_t since)
{
    if (!prev) {
        cur->state = REC_UNJUDGED;
        cur->since = since;
        return;
    }
    cur->st = prev->st;
    cur->have_st = prev->have_st;
    cur->state = prev->state;
    cur->since = prev->since;
    if (prev->nshards > cur->nshards)
        cur->nshards = prev->nshards;
}

/*
 * One block of this sweep: cur (its snapshot record, judged here), prev
 * (the last sweep's record, or NULL: first seen), since (the last sweep's
 * start, realtime). *timed_out: a stamp of this sweep timed out (a hung
 * store): judge no more blocks this sweep, each stamp would hold one more
 * of the backend's helpers.
 */
static void sweep_block(struct fs *fs, struct reval_rec *cur, const struct reval_rec *prev,
                        int64_t since, bool *timed_out)
{
    struct sfs_block_stamp st;
    uint32_t n = cur->nshards;
    int64_t first;
    int ret;

    /* Only loading: nothing served yet, and its owners hold leases, so
     * nothing could be removed; judged once a shard is Ready. */
    if (!cur->ready || *timed_out) {
        carry(cur, prev, since);
        return;
    }
    ret = sfs_backend_stamp(fs->be, &cur->id, &st);
    if (atomic_load_explicit(&reval_abandoned, memory_order_relaxed))
        pthread_exit(NULL); /* see reval_abandoned; the exit frees the rest */
    /* Stopping (and waiting for us): touch the cache no more. Relaxed:
     * fs_reval_stop joins a thread that saw it. */
    if (atomic_load_explicit(&fs->reval.stop, memory_order_relaxed))
        return;
    if (ret < 0) {
        /* The store did not answer: what we knew stands (nothing removed). */
        *timed_out = ret == -ETIMEDOUT;
        carry(cur, prev, since);
        return;
    }
    cur->have_st = true;
    cur->st = st;
    if (prev && prev->state == REC_TRUSTED && prev->have_st &&
        sfs_block_stamp_same(&prev->st, &st)) {
        cur->state = REC_TRUSTED;
        return;
    }
    /* First seen (now, or unjudged since): every shard was claimed after
     * `first`; a file older than that by the margin is what they read. */
    first = !prev ? since : prev->state == REC_UNJUDGED ? prev->since : INT64_MIN;
    if (first != INT64_MIN && !(st.flags & SFS_STAMP_ABSENT) &&
        st.mtime_ns <= first - REVAL_MARGIN_NS && st.ctime_ns <= first - REVAL_MARGIN_NS) {
        cur->state = REC_TRUSTED;
        return;
    }
    /* Changed, removed, untrusted, or first seen and young. */
    if (shards_of(fs, &st) > n)
        n = shards_of(fs, &st);
    if (prev && prev->nshards > n)
        n = prev->nshards;
    if (prev && prev->have_st && shards_of(fs, &prev->st) > n)
        n = shards_of(fs, &prev->st);
    cur->nshards = n;
    cur->state = invalidate(fs, cur, n) ? REC_TRUSTED : REC_UNTRUSTED;
    /* Relaxed: a statistic. */
    atomic_fetch_add_explicit(&fs->ctr.reval_invalidated, 1, memory_order_relaxed);
}

/* One sweep: the snapshot, each block against the last sweep's table. The
 * new table replaces the old: a block not resident now is forgotten. */
static bool sweep(struct fs *fs, struct fs_reval *rv, int64_t started)
{
    struct snap s = {0};
    bool timed_out = false;
    size_t n;

    sfs_cache_foreach(fs->cache, (1u << SFS_STATE_READY) | (1u << SFS_STATE_LOADING), snap_key, &s);
    if (s.err) { /* no memory: keep the old table, try again next period */
        free(s.r);
        return false;
    }
    n = snap_blocks(&s);
    /* Relaxed: see sweep_block. */
    for (size_t i = 0; i < n && !atomic_load_explicit(&rv->stop, memory_order_relaxed); i++) {
        const struct reval_rec *prev =
            rv->n ? bsearch(&s.r[i].id, rv->recs, rv->n, sizeof(*rv->recs), cmp_id) : NULL;

        sweep_block(fs, &s.r[i], prev, rv->since, &timed_out);
    }
    free(rv->recs);
    rv->recs = s.r;
    rv->n = n;
    rv->since = started;
    /* Relaxed: a statistic. */
    atomic_fetch_add_explicit(&fs->ctr.reval_sweeps, 1, memory_order_relaxed);
    return timed_out;
}

static void *reval_main(void *arg)
{
    struct fs *fs = arg;
    struct fs_reval *rv = &fs->reval;

    uint32_t wait_ms = rv->period_ms;

    pthread_mutex_lock(&rv->lock);
    while (!atomic_load_explicit(&rv->stop, memory_order_relaxed)) {
        struct timespec ts;
        int64_t started;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += wait_ms / 1000;
        ts.tv_nsec += (long)(wait_ms % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        /* stop is set under lock (relaxed is enough under it). */
        while (!atomic_load_explicit(&rv->stop, memory_order_relaxed) &&
               pthread_cond_timedwait(&rv->cond, &rv->lock, &ts) != ETIMEDOUT)
            ;
        if (atomic_load_explicit(&rv->stop, memory_order_relaxed))
            break;
        pthread_mutex_unlock(&rv->lock);
        started = realtime_ns();
        /* A hung store: the next sweep waits REVAL_BACKOFF_MS at least. */
        wait_ms = sweep(fs, rv, started) && rv->period_ms < REVAL_BACKOFF_MS ? REVAL_BACKOFF_MS
                                                                             : rv->period_ms;
        pthread_mutex_lock(&rv->lock);
    }
    pthread_mutex_unlock(&rv->lock);
    return NULL;
}

uint32_t fs_reval_period(struct sfs_backend *be, int64_t opt_ms)
{
    struct sfs_block_stamp st;

    if (opt_ms >= 0)
        return (uint32_t)opt_ms;
    /* Default: on where hosts may share the store and the backend can say
     * what a block's version is. */
    if (sfs_backend_stamp(be, NULL, &st) < 0 || !(st.flags & SFS_STAMP_REMOTE))
        return 0;
    return DEFAULT_REVALIDATE_MS;
}

int fs_reval_start(struct fs *fs, uint32_t period_ms)
{
    struct fs_reval *rv = &fs->reval;
    pthread_condattr_t ca;
    int r;

    rv->period_ms = period_ms;
    if (!period_ms)
        return 0;
    /* The first sweep's "last sweep": the daemon's start, before the cache
     * existed. */
    rv->since = (int64_t)fs->start.tv_sec * 1000000000 + fs->start.tv_nsec;
    pthread_mutex_init(&rv->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&rv->cond, &ca);
    pthread_condattr_destroy(&ca);
    atomic_store_explicit(&rv->stop, false, memory_order_relaxed); /* before the thread */
    r = pthread_create(&rv->thread, NULL, reval_main, fs);
    if (r)
        return -r;
    rv->started = true;
    return 0;
}

bool fs_reval_stop(struct fs *fs, int64_t grace_ns)
{
    struct fs_reval *rv = &fs->reval;
    struct timespec ts;

    if (!rv->started)
        return true;
    pthread_mutex_lock(&rv->lock);
    atomic_store_explicit(&rv->stop, true, memory_order_relaxed); /* under lock: the wait sees it */
    pthread_cond_signal(&rv->cond);
    pthread_mutex_unlock(&rv->lock);
    /* A stamp stuck in a hung store returns at the backend's deadline; the
     * stop does not wait that long. */
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += grace_ns / 1000000000;
    ts.tv_nsec += grace_ns % 1000000000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    if (pthread_timedjoin_np(rv->thread, NULL, &ts) != 0) {
        atomic_store_explicit(&reval_abandoned, true, memory_order_relaxed);
        pthread_detach(rv->thread); /* it touches only the backend from now on */
        rv->started = false;
        return false;
    }
    rv->started = false;
    free(rv->recs);
    rv->recs = NULL;
    rv->n = 0;
    return true;
}
