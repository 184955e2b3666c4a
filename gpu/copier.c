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

#define COPY_BATCH_MAX 1024

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

void sfs_copier_push(struct sfs_rank *rk, struct rank_item *it)
{
    it->next = NULL;
    pthread_mutex_lock(&rk->ready_mu);
    if (rk->ready.tail)
        rk->ready.tail->next = it;
    else
        rk->ready.head = it;
    rk->ready.tail = it;
    pthread_cond_signal(&rk->ready_cv);
    pthread_mutex_unlock(&rk->ready_mu);
}

struct batch {
    struct rank_item *items[COPY_BATCH_MAX];
    struct sfs_copy copies[COPY_BATCH_MAX];
    size_t n;
};

static void run_loads(struct sfs_rank *rk, struct batch *b)
{
    if (b->n == 0)
        return;
    for (size_t i = 0; i < b->n; i++) {
        struct rank_item *it = b->items[i];
        uint32_t len = sfs_cache_length(rk->cache, &it->lease);

        b->copies[i] = (struct sfs_copy){
            .dst = it->addr,
            .src = sfs_cache_data(rk->cache, &it->lease),
            .len = len ? len : rk->shard_size,
        };
    }
    rk->copier->ops->load(rk->copier, b->copies, b->n);
    rank_ctr_add(rk, RC_COPY_BATCHES, 1);
    for (size_t i = 0; i < b->n; i++) {
        if (b->copies[i].result == 0) {
            rank_ctr_add(rk, RC_COPIES, 1);
            rank_ctr_add(rk, RC_BYTES_COPIED, b->copies[i].len);
        }
        /* The copy is complete: only now may the slot go. */
        sfs_lq_item_done(b->items[i], b->copies[i].result);
    }
    b->n = 0;
}

static void run_dumps(struct sfs_rank *rk, struct batch *b)
{
    if (b->n == 0)
        return;
    for (size_t i = 0; i < b->n; i++) {
        struct rank_item *it = b->items[i];

        b->copies[i] = (struct sfs_copy){.dst = it->buf, .src = it->addr, .len = rk->shard_size};
    }
    rk->copier->ops->dump(rk->copier, b->copies, b->n);
    rank_ctr_add(rk, RC_COPY_BATCHES, 1);
    for (size_t i = 0; i < b->n; i++) {
        struct rank_item *it = b->items[i];
        int r = b->copies[i].result;

        if (r < 0) {
            if (it->leased && !it->bounce)
                sfs_cache_fail(rk->cache, &it->lease, r);
            sfs_lq_item_done(it, r);
            continue;
        }
        rank_ctr_add(rk, RC_COPIES, 1);
        rank_ctr_add(rk, RC_BYTES_COPIED, b->copies[i].len);
        sfs_lq_dump_copied(it);
    }
    b->n = 0;
}

static void *copier_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct batch *loads = malloc(sizeof(*loads));
    struct batch *dumps = malloc(sizeof(*dumps));

    if (!loads || !dumps) {
        /* Cannot run: fail everything that arrives (never leave a waiter). */
        free(loads);
        free(dumps);
        loads = dumps = NULL;
    } else {
        loads->n = dumps->n = 0;
    }
    for (;;) {
        struct rank_item *it;

        pthread_mutex_lock(&rk->ready_mu);
        while (!rk->ready.head && !rk->copier_stop)
            pthread_cond_wait(&rk->ready_cv, &rk->ready_mu);
        it = rk->ready.head;
        rk->ready.head = rk->ready.tail = NULL;
        pthread_mutex_unlock(&rk->ready_mu);
        if (!it)
            break; /* stopping, nothing left */

        while (it) {
            struct rank_item *next = it->next;

            if (!loads) {
                if (it->step == STEP_COPY_IN && it->leased && !it->bounce)
                    sfs_cache_fail(rk->cache, &it->lease, -ENOMEM);
                sfs_lq_item_done(it, -ENOMEM);
            } else if (it->step == STEP_COPY_IN) {
                dumps->items[dumps->n++] = it;
                if (dumps->n == COPY_BATCH_MAX)
                    run_dumps(rk, dumps);
            } else {
                loads->items[loads->n++] = it;
                if (loads->n == COPY_BATCH_MAX)
                    run_loads(rk, loads);
            }
            it = next;
        }
        if (loads) {
            run_loads(rk, loads);
            run_dumps(rk, dumps);
        }
    }
    free(loads);
    free(dumps);
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
