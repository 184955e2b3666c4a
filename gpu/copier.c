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
 * This file is also the one place that knows whether the library was built
 * with CUDA (STYLE rule 7): sfs_copier_open() picks the implementation.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#define COPY_BATCH_MAX SFS_COPY_BATCH_MAX

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
    if (device_id >= 0 && device_id < sfs_cuda_device_count()) {
        *out = sfs_copier_cuda_open(device_id, c, &err);
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

/* Hand the copier a chain of items, head..tail linked by ->next: one lock
 * and at most one wake for all of them. */
void sfs_copier_push_chain(struct sfs_rank *rk, struct rank_item *head, struct rank_item *tail)
{
    tail->next = NULL;
    pthread_mutex_lock(&rk->ready_mu);
    if (rk->ready.tail)
        rk->ready.tail->next = head;
    else
        rk->ready.head = head;
    rk->ready.tail = tail;
    pthread_cond_signal(&rk->ready_cv);
    pthread_mutex_unlock(&rk->ready_mu);
}

void sfs_copier_push(struct sfs_rank *rk, struct rank_item *it)
{
    sfs_copier_push_chain(rk, it, it);
}

struct batch {
    struct rank_item *items[COPY_BATCH_MAX];
    struct sfs_copy copies[COPY_BATCH_MAX];
    size_t n;
    bool dump; /* every item STEP_COPY_IN; else every item STEP_COPY_OUT */
};

/* The copier thread's batches: one being filled, and with a pipelining
 * copier (ops->start) at most one more in flight. */
struct copier_state {
    struct batch b[2];
    int fill;     /* the batch being filled */
    int inflight; /* started and not finished; -1: none */
};

static void batch_prepare(struct sfs_rank *rk, struct batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        struct rank_item *it = b->items[i];

        if (b->dump) {
            b->copies[i] = (struct sfs_copy){.dst = it->buf, .src = it->addr, .len = rk->shard_size};
        } else {
            uint32_t len = sfs_cache_length(rk->cache, &it->lease);

            b->copies[i] = (struct sfs_copy){
                .dst = it->addr,
                .src = sfs_cache_data(rk->cache, &it->lease),
                .len = len ? len : rk->shard_size,
            };
        }
    }
}

/* Every copy of b is complete (each result set): hand each item on. */
static void batch_done(struct sfs_rank *rk, struct batch *b)
{
    uint64_t copies = 0, bytes = 0;

    /* Counted before any item is handed on: a task that completes must find
     * its copies in the counters. */
    for (size_t i = 0; i < b->n; i++) {
        if (b->copies[i].result == 0) {
            copies++;
            bytes += b->copies[i].len;
        }
    }
    rank_ctr_add(rk, RC_COPY_BATCHES, 1);
    rank_ctr_add(rk, RC_COPIES, copies);
    rank_ctr_add(rk, RC_BYTES_COPIED, bytes);
    for (size_t i = 0; i < b->n; i++) {
        struct rank_item *it = b->items[i];
        int r = b->copies[i].result;

        if (!b->dump) {
            /* The copy is complete: only now may the slot go. */
            sfs_lq_item_done(it, r);
        } else if (r < 0) {
            if (it->leased && !it->bounce)
                sfs_cache_fail(rk->cache, &it->lease, r);
            sfs_lq_item_done(it, r);
        } else {
            sfs_lq_dump_copied(it);
        }
    }
    b->n = 0;
}

/* Finish the batch in flight, if any. */
static void drain(struct sfs_rank *rk, struct copier_state *st)
{
    if (st->inflight < 0)
        return;
    rk->copier->ops->finish(rk->copier, st->inflight);
    batch_done(rk, &st->b[st->inflight]);
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
        (b->dump ? ops->dump : ops->load)(rk->copier, b->copies, b->n);
        batch_done(rk, b);
        return;
    }
    r = ops->start(rk->copier, b->copies, b->n, b->dump, st->fill);
    if (r < 0) {
        for (size_t i = 0; i < b->n; i++)
            b->copies[i].result = r;
        batch_done(rk, b);
        return;
    }
    drain(rk, st);
    st->inflight = st->fill;
    st->fill ^= 1;
}

static void batch_add(struct sfs_rank *rk, struct copier_state *st, struct rank_item *it)
{
    bool dump = it->step == STEP_COPY_IN;
    struct batch *b = &st->b[st->fill];

    if (b->n && b->dump != dump) {
        batch_run(rk, st);
        b = &st->b[st->fill];
    }
    b->dump = dump;
    b->items[b->n++] = it;
    if (b->n == COPY_BATCH_MAX)
        batch_run(rk, st);
}

/* No memory for the batches: fail what arrives (never leave a waiter). */
static void item_fail(struct sfs_rank *rk, struct rank_item *it)
{
    if (it->step == STEP_COPY_IN && it->leased && !it->bounce)
        sfs_cache_fail(rk->cache, &it->lease, -ENOMEM);
    sfs_lq_item_done(it, -ENOMEM);
}

static void *copier_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct copier_state *st = malloc(sizeof(*st));

    if (st) {
        st->b[0].n = st->b[1].n = 0;
        st->fill = 0;
        st->inflight = -1;
    }
    for (;;) {
        struct rank_item *it;

        pthread_mutex_lock(&rk->ready_mu);
        while (!rk->ready.head && !rk->copier_stop) {
            if (st && st->inflight >= 0) {
                /* Nothing more to prepare: complete the batch in flight
                 * before sleeping. */
                pthread_mutex_unlock(&rk->ready_mu);
                drain(rk, st);
                pthread_mutex_lock(&rk->ready_mu);
                continue;
            }
            pthread_cond_wait(&rk->ready_cv, &rk->ready_mu);
        }
        it = rk->ready.head;
        rk->ready.head = rk->ready.tail = NULL;
        pthread_mutex_unlock(&rk->ready_mu);
        if (!it)
            break; /* stopping, nothing left (and nothing in flight) */

        while (it) {
            struct rank_item *next = it->next;

            if (st)
                batch_add(rk, st, it);
            else
                item_fail(rk, it);
            it = next;
        }
        if (st)
            batch_run(rk, st);
    }
    if (st)
        drain(rk, st);
    free(st);
    return NULL;
}

int sfs_copier_start(struct sfs_rank *rk)
{
    int r = pthread_create(&rk->copier_thread, NULL, copier_main, rk);

    if (r)
        return -r;
    rk->copier_started = true;
    return 0;
}

void sfs_copier_stop(struct sfs_rank *rk)
{
    if (!rk->copier_started)
        return;
    pthread_mutex_lock(&rk->ready_mu);
    rk->copier_stop = true;
    pthread_cond_broadcast(&rk->ready_cv);
    pthread_mutex_unlock(&rk->ready_mu);
    pthread_join(rk->copier_thread, NULL);
    rk->copier_started = false;
}
