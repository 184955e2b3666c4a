/* SPDX-License-Identifier: MIT */
/*
 * task.c - a rank's tasks: submitting a load or a dump (a small resident
 * load is tried inline first, inline.c; the rest goes to the dispatcher's
 * queue), waiting for a task, and dropping the caller's reference. A task's
 * end and its references are complete.c's; rank.c cancels what is still
 * queued at close.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int submit_entered(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                          int kind, struct sfs_task **out)
{
    struct sfs_task *t;
    pthread_condattr_t ca;

    if (!rk || !entries || !out || n == 0 || n > UINT32_MAX)
        return -EINVAL;
    *out = NULL;
    if (rk->query_only)
        return -EPERM;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->entries = malloc(n * sizeof(*t->entries));
    t->items = calloc(n, sizeof(*t->items));
    t->status = calloc(n, sizeof(*t->status));
    if (!t->entries || !t->items || !t->status) {
        free(t->entries);
        free(t->items);
        free(t->status);
        free(t);
        return -ENOMEM;
    }
    memcpy(t->entries, entries, n * sizeof(*entries));
    t->rank = rk;
    t->kind = kind;
    t->n = n;
    t->pending = n;
    t->refs = 3; /* caller, dispatcher, completion */
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (size_t i = 0; i < n; i++) {
        struct rank_item *it = &t->items[i];

        it->rank = rk;
        it->task = t;
        it->idx = (uint32_t)i;
        it->kind = (uint8_t)kind;
        it->key.block = entries[i].block;
        it->key.shard = entries[i].shard;
        it->addr = entries[i].addr;
        t->status[i] = -EINPROGRESS;
    }

    pthread_mutex_lock(&rk->mu);
    if (rk->stopping) {
        pthread_mutex_unlock(&rk->mu);
        t->refs = 1;
        sfs_task_unref(t);
        return -ESHUTDOWN;
    }
    rk->active++;
    if (kind == ITEM_DUMP) {
        /* Relaxed: ordered before the push (under tq's lock) that the
         * dispatcher's walk, and its release decrement, come after. */
        atomic_fetch_add_explicit(&rk->dumps_unwalked, 1, memory_order_relaxed);
        sfs_workq_push(&rk->tq, &t->qn); /* under mu: close cancels it, or the dispatcher runs it */
    }
    pthread_mutex_unlock(&rk->mu);
    rank_ctr_add(rk, RC_TASKS, 1);
    rank_ctr_add(rk, RC_ENTRIES, n);
    *out = t;
    if (kind == ITEM_DUMP || sfs_inline_load(rk, t))
        return 0; /* queued; or complete, or in the copier's hands (inline.c) */
    /* Under mu: close cancels it, or the dispatcher runs it (active is
     * counted, so a close that started meanwhile waits for it). */
    pthread_mutex_lock(&rk->mu);
    sfs_workq_push(&rk->tq, &t->qn);
    pthread_mutex_unlock(&rk->mu);
    return 0;
}

static int submit(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n, int kind,
                  struct sfs_task **out)
{
    if (!rk || !entries || !out || n == 0 || n > UINT32_MAX)
        return -EINVAL;
    *out = NULL;
    return SFS_LINKED(rk, submit_entered(rk, entries, n, kind, out));
}

int sfs_rank_load(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                  struct sfs_task **task)
{
    return submit(rk, entries, n, ITEM_LOAD, task);
}

int sfs_rank_dump(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                  struct sfs_task **task)
{
    return submit(rk, entries, n, ITEM_DUMP, task);
}

int sfs_rank_wait(struct sfs_task *t, int timeout_ms, int *status)
{
    struct timespec ts;
    int r = 0;

    if (!t)
        return -EINVAL;
    if (timeout_ms >= 0) {
        int64_t d = sfs_deadline_after((int64_t)timeout_ms * 1000000);

        ts.tv_sec = d / 1000000000;
        ts.tv_nsec = d % 1000000000;
    }
    pthread_mutex_lock(&t->mu);
    while (t->pending > 0) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&t->cv, &t->mu);
        } else if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
            if (t->pending > 0)
                r = -ETIMEDOUT;
            break;
        }
    }
    if (r == 0 && status)
        memcpy(status, t->status, t->n * sizeof(*status));
    pthread_mutex_unlock(&t->mu);
    return r;
}

bool sfs_rank_task_done(struct sfs_task *t)
{
    bool done;

    if (!t)
        return false;
    pthread_mutex_lock(&t->mu);
    done = t->pending == 0;
    pthread_mutex_unlock(&t->mu);
    return done;
}

size_t sfs_rank_task_size(struct sfs_task *t)
{
    return t ? t->n : 0;
}

void sfs_rank_task_free(struct sfs_task *t)
{
    if (t)
        sfs_task_unref(t);
}
