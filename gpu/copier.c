/* SPDX-License-Identifier: MIT */
/*
 * copier.c - the copier thread of a rank, and the choice of copier.
 *
 * Key idea: items reach the copier in the order they become Ready, from the
 * dispatcher (hits), the backend's done callbacks (our own loads) and the
 * watcher threads (loads of other ranks), so a slow key never holds back the
 * ones behind it: there is no per-task order to respect. The thread takes
 * everything queued at once, up to a batch, and hands it to the copier
 * implementation in one call (one kernel launch with CUDA). Leases are
 * released only after the batch call returned, i.e. after the copy is
 * complete; then each entry's status is recorded.
 *
 * Items arrive on rk->ready (rank_push_copy(), any thread); each finished
 * item goes down to complete.c (done, or a dump handed to a worker): this
 * file calls nothing in the dispatcher's room.
 *
 * This file is also the one place that knows whether the library was built
 * with CUDA (STYLE rule 7): sfs_copier_open() picks the implementation.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#define COPY_BATCH_MAX SFS_COPY_BATCH_MAX
_Static_assert(SFS_RANK_PIECES_MAX < COPY_BATCH_MAX, "an item's copies fit one batch");

/* ---------------------------------------------------------------------------
 * Choosing a copier.
 */

int sfs_copier_cuda_device_count(void)
{
#if SHARDFS_HAVE_CUDA
    return sfs_cuda_device_count();
#else
    return 0;
#endif
}

int sfs_copier_open(int mode, int device_id, struct sfs_cache *c, struct sfs_copier **out)
{
    int err = 0;

    *out = NULL;
    switch (mode) {
    case SFS_COPIER_HOST:
        *out = sfs_copier_host_open(&err);
        return *out ? 0 : err;
    case SFS_COPIER_CUDA:
    case SFS_COPIER_AUTO:
        break;
    default:
        return -EINVAL;
    }
#if SHARDFS_HAVE_CUDA
    size_t memcpy_min = SFS_CUDA_MEMCPY_MIN;
#ifdef SFS_BENCH_BASELINES
    /* Measurement switch: where the kernel hands over to cudaMemcpyAsync. */
    const char *env = getenv("SHARDFS_CUDA_MEMCPY_MIN");

    if (env && *env)
        memcpy_min = (size_t)strtoull(env, NULL, 0);
#endif
    if (device_id >= 0 && device_id < sfs_cuda_device_count()) {
        *out = sfs_copier_cuda_open(device_id, c, memcpy_min, &err);
        if (*out)
            return 0;
        if (mode == SFS_COPIER_CUDA)
            return err;
        /* The host copier cannot tell device pointers from host ones: say
         * loudly that device destinations would fault from now on. */
        sfs_log(LOG_ERR,
                "rank %d: CUDA copier failed (%s), using the host copier: destinations must be "
                "host memory",
                device_id, strerror(-err));
    } else if (mode == SFS_COPIER_CUDA) {
        sfs_log(LOG_ERR, "rank %d: copier=cuda but there is no CUDA device %d", device_id,
                device_id);
        return -ENODEV;
    }
#else
    if (mode == SFS_COPIER_CUDA) {
        sfs_log(LOG_ERR, "rank %d: copier=cuda but libshardfs-rank was built without CUDA",
                device_id);
        return -ENODEV;
    }
#endif
    *out = sfs_copier_host_open(&err);
    return *out ? 0 : err;
}

/* ---------------------------------------------------------------------------
 * The copier thread.
 */

/* A batch: items, and their copies (one per piece of an item; one for a
 * plain entry). Item i's copies are copies[first[i] .. first[i + 1]). */
struct batch {
    struct rank_item *items[COPY_BATCH_MAX];
    uint32_t first[COPY_BATCH_MAX + 1];
    struct sfs_copy copies[COPY_BATCH_MAX];
    size_t n;       /* items */
    size_t ncopies; /* copies */
    bool dump;      /* every item STEP_COPY_IN; else every item STEP_COPY_OUT */
    bool behind;    /* dump: every item a write-behind dump's (ops->dump_behind) */
};

/* The copier thread's batches: one being filled, and with a pipelining
 * copier (ops->start) at most one more in flight. */
struct copier_state {
    struct batch b[2];
    int fill;     /* the batch being filled */
    int inflight; /* started and not finished; -1: none */
};

/* The copies one item takes. */
static uint32_t item_copies(const struct rank_item *it)
{
    return it->npieces ? it->npieces : 1;
}

/* Fill v[0 .. item_copies(it)) with the item's copies. A load copies what
 * the slot holds (its stored length; a shard stored shorter fills the
 * pieces as far as it goes); a dump copies the source into the slot, and
 * zeros the slot after the last piece (it is ours to write). */
static void item_prepare(struct sfs_rank *rk, struct rank_item *it, bool dump, struct sfs_copy *v)
{
    uint8_t *slot = dump ? it->buf : sfs_cache_data(rk->cache, &it->lease);
    uint64_t have = rk->shard_size, off = 0;

    if (!dump) {
        uint32_t len = sfs_cache_length(rk->cache, &it->lease);

        have = len ? len : rk->shard_size;
    }
    void *gate = dump && it->task ? it->task->gate : NULL;

    if (it->npieces == 0) {
        v[0] = dump ? (struct sfs_copy){.dst = slot, .src = it->addr, .len = rk->shard_size, .gate = gate}
                    : (struct sfs_copy){.dst = it->addr, .src = slot, .len = have};
        return;
    }
    for (uint32_t j = 0; j < it->npieces; j++) {
        uint64_t len = it->pieces[j].len;

        if (dump) {
            v[j] = (struct sfs_copy){
                .dst = slot + off, .src = it->pieces[j].addr, .len = len, .gate = gate};
        } else {
            uint64_t n = off < have ? (len < have - off ? len : have - off) : 0;

            /* A copy of 0 bytes: a piece past a short shard's end. */
            v[j] = (struct sfs_copy){.dst = it->pieces[j].addr, .src = slot + off, .len = n};
        }
        off += len;
    }
    if (dump && off < rk->shard_size)
        memset(slot + off, 0, rk->shard_size - off);
}

static void batch_prepare(struct sfs_rank *rk, struct batch *b)
{
    for (size_t i = 0; i < b->n; i++)
        item_prepare(rk, b->items[i], b->dump, &b->copies[b->first[i]]);
}

/* Every copy is complete (each result set): an item's result is its first
 * failed copy's, or 0; then hand each item on. */
static void items_done(struct sfs_rank *rk, struct rank_item **items, const uint32_t *first,
                       const struct sfs_copy *copies, size_t n, bool dump)
{
    uint64_t ncopies = 0, bytes = 0;
    int res[COPY_BATCH_MAX];

    /* Counted before any item is handed on: a task that completes must find
     * its copies in the counters. A shard is one copy however many pieces
     * it has. */
    for (size_t i = 0; i < n; i++) {
        uint64_t b = 0;

        res[i] = 0;
        for (uint32_t k = first[i]; k < first[i + 1]; k++) {
            if (copies[k].result < 0 && res[i] == 0)
                res[i] = copies[k].result;
            b += copies[k].len;
        }
        if (res[i] == 0) {
            ncopies++;
            bytes += b;
        }
    }
    rank_ctr_add(rk, RC_COPY_BATCHES, 1);
    rank_ctr_add(rk, RC_COPIES, ncopies);
    rank_ctr_add(rk, RC_BYTES_COPIED, bytes);
    for (size_t i = 0; i < n; i++) {
        struct rank_item *it = items[i];
        int r = res[i];

        if (!dump || r < 0)
            /* The copy is complete: only now may the slot go. A dump's that
             * failed goes unpublished: Idle, and a reader parked on it loads
             * what the store still has (sfs_cache_settle() for a write). */
            sfs_item_done(it, r);
        else
            sfs_item_dump_copied(it);
    }
}

static void batch_done(struct sfs_rank *rk, struct batch *b)
{
    items_done(rk, b->items, b->first, b->copies, b->n, b->dump);
    b->n = 0;
    b->ncopies = 0;
}

/* The inline path of a small task (inline.c): the submitting thread copies
 * its Ready items itself, through the copier's load_inline (memcpy, or one
 * CUDA gather launch on the copier's inline stream, synchronized), then
 * finishes them as the copier thread would (counters, release, status,
 * completion). -EAGAIN when the copier cannot copy on this thread: nothing
 * was copied, the items are untouched. */
int sfs_copier_inline(struct sfs_rank *rk, struct rank_item **items, size_t n)
{
    struct sfs_copy copies[SFS_COPY_INLINE_MAX];
    uint32_t first[RANK_INLINE_KEYS_MAX + 1];
    size_t k = 0;
    int r;

    if (n == 0 || n > RANK_INLINE_KEYS_MAX || !rk->copier->ops->load_inline)
        return -EAGAIN;
    for (size_t i = 0; i < n; i++) {
        first[i] = (uint32_t)k;
        k += item_copies(items[i]);
        if (k > SFS_COPY_INLINE_MAX)
            return -EAGAIN; /* too many pieces for one inline call */
    }
    first[n] = (uint32_t)k;
    for (size_t i = 0; i < n; i++)
        item_prepare(rk, items[i], false, &copies[first[i]]);
    r = rk->copier->ops->load_inline(rk->copier, copies, k);
    if (r == -EAGAIN)
        return r;
    items_done(rk, items, first, copies, n, false);
    return 0;
}

/* ---------------------------------------------------------------------------
 * The releaser: with a pipelining copier, finished batches are handed on
 * (leases released, tasks completed, dumps written through) by a thread of
 * their own. On a GPU host that work -- a bucket lock and the task's lock
 * per shard, lines last touched by the dispatcher's core -- cost the copier
 * thread more than the transfer of a 16 KiB shard, so the GPU waited for
 * it; now it overlaps the next batches' placing and launching.
 */

struct done_batch {
    struct sfs_wq_node qn; /* in the releaser's queue */
    size_t n;
    bool dump;
    struct rank_item **items;
    uint32_t *first;
    struct sfs_copy *copies;
};

struct sfs_releaser {
    pthread_t thread;
    struct sfs_workq q; /* finished batches (struct done_batch) */
};

static void *releaser_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct sfs_releaser *rl = rk->releaser;
    struct sfs_wq_node *n;

    while ((n = sfs_workq_pop(&rl->q, SFS_WQ_FOREVER))) {
        struct done_batch *d = sfs_wq_entry(n, struct done_batch, qn);

        items_done(rk, d->items, d->first, d->copies, d->n, d->dump);
        free(d);
    }
    return NULL;
}

/* Hand a finished batch to the releaser (a copy of its items and results:
 * the batch is refilled at once); with no releaser or no memory, here. */
static void batch_release(struct sfs_rank *rk, struct batch *b)
{
    struct sfs_releaser *rl = rk->releaser;
    struct done_batch *d = NULL;

    if (rl)
        d = malloc(sizeof(*d) + b->ncopies * sizeof(*d->copies) + b->n * sizeof(*d->items) +
                   (b->n + 1) * sizeof(*d->first));
    if (!d) {
        batch_done(rk, b);
        return;
    }
    d->n = b->n;
    d->dump = b->dump;
    d->copies = (struct sfs_copy *)(d + 1);
    d->items = (struct rank_item **)(d->copies + b->ncopies);
    d->first = (uint32_t *)(d->items + b->n);
    memcpy(d->copies, b->copies, b->ncopies * sizeof(*d->copies));
    memcpy(d->items, b->items, b->n * sizeof(*d->items));
    memcpy(d->first, b->first, (b->n + 1) * sizeof(*d->first));
    b->n = 0;
    b->ncopies = 0;
    sfs_workq_push(&rl->q, &d->qn);
}

static int releaser_start(struct sfs_rank *rk)
{
    struct sfs_releaser *rl = calloc(1, sizeof(*rl));
    int r;

    if (!rl)
        return -ENOMEM;
    r = sfs_workq_init(&rl->q);
    if (r < 0) {
        free(rl);
        return r;
    }
    rk->releaser = rl;
    r = pthread_create(&rl->thread, NULL, releaser_main, rk);
    if (r) {
        rk->releaser = NULL;
        sfs_workq_destroy(&rl->q);
        free(rl);
        return -r;
    }
    return 0;
}

/* After the copier thread is gone: everything it handed on is done. */
static void releaser_stop(struct sfs_rank *rk)
{
    struct sfs_releaser *rl = rk->releaser;

    if (!rl)
        return;
    sfs_workq_stop(&rl->q); /* it drains what is queued, then ends */
    pthread_join(rl->thread, NULL);
    sfs_workq_destroy(&rl->q);
    free(rl);
    rk->releaser = NULL;
}

/* Finish the batch in flight, if any. `idle`: nothing is queued for the
 * copier, so it hands the batch on itself rather than wake the releaser
 * (one thread hop less for the last batch of a task: its latency). */
static void drain(struct sfs_rank *rk, struct copier_state *st, bool idle)
{
    if (st->inflight < 0)
        return;
    rk->copier->ops->finish(rk->copier, st->inflight);
    if (idle)
        batch_done(rk, &st->b[st->inflight]);
    else
        batch_release(rk, &st->b[st->inflight]);
    st->inflight = -1;
}

/* Copy the batch being filled. A pipelining copier starts it, then
 * finishes the one before (whose copies ran meanwhile), so the next batch
 * is prepared while this one is in flight; others copy it here and now. */
static void batch_run(struct sfs_rank *rk, struct copier_state *st)
{
    const struct sfs_copier_ops *ops = rk->copier->ops;
    struct batch *b = &st->b[st->fill];
    int r;

    if (b->n == 0)
        return;
    batch_prepare(rk, b);
    if (!ops->start) {
        (!b->dump                        ? ops->load
         : b->behind && ops->dump_behind ? ops->dump_behind
                                         : ops->dump)(rk->copier, b->copies, b->ncopies);
        batch_release(rk, b);
        return;
    }
    r = ops->start(rk->copier, b->copies, b->ncopies, b->dump, st->fill);
    if (r < 0) {
        for (size_t i = 0; i < b->ncopies; i++)
            b->copies[i].result = r;
        batch_done(rk, b);
        return;
    }
    drain(rk, st, false);
    st->inflight = st->fill;
    st->fill ^= 1;
}

static void batch_add(struct sfs_rank *rk, struct copier_state *st, struct rank_item *it)
{
    bool dump = it->step == STEP_COPY_IN;
    uint32_t k = item_copies(it); /* <= SFS_RANK_PIECES_MAX < COPY_BATCH_MAX */
    struct batch *b = &st->b[st->fill];

    if (b->n && (b->dump != dump || b->ncopies + k > COPY_BATCH_MAX)) {
        batch_run(rk, st);
        b = &st->b[st->fill];
    }
    if (b->n == 0)
        b->behind = true;
    b->behind = b->behind && dump && it->task->behind;
    b->dump = dump;
    b->first[b->n] = (uint32_t)b->ncopies;
    b->items[b->n++] = it;
    b->ncopies += k;
    b->first[b->n] = (uint32_t)b->ncopies;
    if (b->ncopies == COPY_BATCH_MAX)
        batch_run(rk, st);
}

/* No memory for the batches: fail what arrives (never leave a waiter). */
static void item_fail(struct rank_item *it)
{
    /* A reader's lease (the slot is Ready), or a dump's slot, released
     * unwritten: Idle. */
    sfs_item_done(it, -ENOMEM);
}

static void *copier_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct copier_state *st = malloc(sizeof(*st));

    if (st) {
        st->b[0].n = st->b[1].n = 0;
        st->b[0].ncopies = st->b[1].ncopies = 0;
        st->fill = 0;
        st->inflight = -1;
    }
    for (;;) {
        /* Everything queued at once. With a batch in flight, look without
         * sleeping: nothing more to prepare means complete that batch
         * first, then sleep. */
        bool busy = st && st->inflight >= 0;
        struct rank_item *it = item_of(
            sfs_workq_pop_all(&rk->ready, busy ? SFS_WQ_NOWAIT : SFS_WQ_FOREVER));

        if (!it && busy) {
            drain(rk, st, true);
            continue;
        }
        if (!it)
            break; /* stopped, nothing left (and nothing in flight) */

        while (it) {
            struct rank_item *next = item_of(it->qn.next);

            if (st)
                batch_add(rk, st, it);
            else
                item_fail(it);
            it = next;
        }
        if (st)
            batch_run(rk, st);
    }
    if (st)
        drain(rk, st, true);
    free(st);
    return NULL;
}

int sfs_copier_start(struct sfs_rank *rk)
{
    bool releaser = rk->copier->ops->start != NULL;
    int r;

    /* Only a pipelining copier gains from it; without one (no thread to
     * spare), batches are handed on by the copier thread itself. Tests (the
     * TSan run, which has no GPU) ask for it with the test build's hook
     * SHARDFS_RANK_RELEASER. */
#ifdef SFS_TEST_HOOKS
    releaser = releaser || getenv("SHARDFS_RANK_RELEASER");
#endif
    if (releaser && releaser_start(rk) < 0)
        sfs_log(LOG_WARNING, "rank: no releaser thread: the copier hands batches on itself");
    r = pthread_create(&rk->copier_thread, NULL, copier_main, rk);
    if (r) {
        releaser_stop(rk);
        return -r;
    }
    rk->copier_started = true;
    return 0;
}

void sfs_copier_stop(struct sfs_rank *rk)
{
    if (!rk->copier_started)
        return;
    sfs_workq_stop(&rk->ready);
    pthread_join(rk->copier_thread, NULL);
    rk->copier_started = false;
    releaser_stop(rk);
}
