/* SPDX-License-Identifier: MIT */
/*
 * complete.c - the end of an entry and of a task: the room the dispatcher,
 * the watchers, the workers, the backend callbacks and the copier all call
 * downward when an item is finished (or, for a dump, copied in).
 *
 * Key idea: an item ends exactly once, in sfs_item_done(): its lease goes
 * back to the cache (waking a dispatcher short of leases), its bounce buffer
 * is freed, its status is recorded, and the last entry of a task wakes the
 * task's waiters and drops the completion reference (a write-behind dump's
 * entry ends at its publish, before its item does: sfs_item_publish_behind()).
 * Nothing here calls up
 * into the dispatcher or the copier: a dump whose bytes are copied in is
 * handed to a worker by a push on the work queue.
 *
 * A task is a small refcounted object: one reference for the caller (dropped
 * by sfs_rank_task_free), one for the dispatcher (dropped after its walk and
 * the idle window), one for completion (dropped by the last entry). So a task
 * freed early finishes quietly, and a finished task outlives its rank.
 */
#include "rank_i.h"

#include <stdlib.h>
#include <string.h>
#include <syslog.h>

void sfs_task_unref(struct sfs_task *t)
{
    bool last;

    pthread_mutex_lock(&t->mu);
    last = --t->refs == 0;
    pthread_mutex_unlock(&t->mu);
    if (!last)
        return;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t->items);
    free(t->entries);
    free(t->pieces);
    if (t->gate)
        t->gate_close(t->gate);
    free(t->status);
    free(t);
}

/* A task completed or a prefetch ended: close may be waiting for the last. */
void sfs_rank_active_put(struct sfs_rank *rk)
{
    pthread_mutex_lock(&rk->mu);
    if (--rk->active == 0)
        pthread_cond_broadcast(&rk->idle_cv);
    pthread_mutex_unlock(&rk->mu);
}

/* Drop the item's lease (if it still holds one). */
static void item_release(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;

    if (!it->leased)
        return;
    sfs_cache_release(rk->cache, &it->lease);
    it->leased = false;
    /* Relaxed: a dispatcher that counted itself after this look waits 10 ms
     * at most (lease_wait() in loadqueue.c bounds its sleep). */
    if (atomic_load_explicit(&rk->lease_waiters, memory_order_relaxed)) {
        pthread_mutex_lock(&rk->lease_mu);
        pthread_cond_broadcast(&rk->lease_cv);
        pthread_mutex_unlock(&rk->lease_mu);
    }
}

static void push_held(struct sfs_rank *rk, struct rank_item *it);

/* Record entry idx's status; the last entry completes the task, and hands
 * on the write-behind items held on it (a failure can be the last entry to
 * end: those items then leave here, never from a publish). */
static void entry_end(struct sfs_rank *rk, struct sfs_task *t, uint32_t idx, int status)
{
    struct rank_item *held = NULL;
    bool finished;

    pthread_mutex_lock(&t->mu);
    t->status[idx] = status;
    finished = --t->pending == 0;
    if (finished) {
        t->done_ns = sfs_now_ns();
        held = t->held_head;
        t->held_head = t->held_tail = NULL;
        t->nheld = 0;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    push_held(rk, held); /* each holds a task reference of its own */
    if (finished) {
        sfs_rank_active_put(rk);
        sfs_task_unref(t); /* the completion reference */
    }
}

/* The item is finished with `status`: its lease is gone, its bounce buffer
 * freed. Record the status; the last entry completes the task. */
void sfs_item_done(struct rank_item *it, int status)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_task *t = it->task;

    item_release(it);
    if (it->bounce) {
        free(it->buf);
        it->buf = NULL;
        it->bounce = false;
    }
    if (status < 0)
        rank_ctr_add(rk, RC_FAILED, 1);
    if (!t) { /* a prefetch */
        free(it);
        sfs_rank_active_put(rk);
        return;
    }
    entry_end(rk, t, it->idx, status);
}

/* An owner load past its deadline (owner.c's expirer): the entry ends now,
 * without its lease: the slot is still Loading under it and the backend may
 * still write into it, so it goes back only in sfs_item_late_done(), when
 * the backend answers. Nothing is copied to the entry's destination after
 * this: the late completion never hands the item to the copier. */
void sfs_item_expire(struct rank_item *it, int status)
{
    rank_ctr_add(it->rank, RC_FAILED, 1);
    entry_end(it->rank, it->task, it->idx, status);
}

/* The backend answered an expired load (the slot is settled: its bytes are
 * the key's, for whoever reads next): drop the lease, and the task
 * reference and active count the expiry took for the load. */
void sfs_item_late_done(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_task *t = it->task;

    item_release(it);
    sfs_task_unref(t); /* it may free the item */
    sfs_rank_active_put(rk);
}

/* After the copier has copied a dump's bytes in: write them through (a
 * worker submits the dump); a write-behind dump copied into its slot is
 * published and its entry ended first. Called by the copier thread, or its
 * releaser. */
void sfs_item_dump_copied(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;

    if (!rk->be) {
        /* No backend: the cache is the only copy. */
        int r = sfs_cache_publish(rk->cache, &it->lease, rk->shard_size, SFS_PUBLISH_WRITTEN);

        sfs_item_done(it, r);
        return;
    }
    it->step = STEP_DUMP_SUBMIT;
    if (it->task->behind && !it->bounce) { /* a bounced one does it once it has its slot */
        int r = sfs_item_publish_behind(it, false);

        if (r < 0)
            sfs_item_done(it, r);
        return; /* held, or handed to a worker */
    }
    rank_push_work(rk, it);
}

/* Hand a chain of held items (linked by own_next) to the background threads. */
static void push_held(struct sfs_rank *rk, struct rank_item *it)
{
    while (it) {
        struct rank_item *next = it->own_next;

        it->own_next = NULL;
        rank_push_behind(rk, it);
        it = next;
    }
}

void sfs_task_no_hold(struct sfs_task *t)
{
    struct rank_item *held;

    pthread_mutex_lock(&t->mu);
    t->no_hold = true;
    held = t->held_head;
    t->held_head = t->held_tail = NULL;
    t->nheld = 0;
    pthread_mutex_unlock(&t->mu);
    push_held(t->rank, held);
}

/* The entry ends now, as an expired load's does (sfs_item_expire), and the
 * item lives on with a task reference and an active count of its own, so
 * close and a re-attach wait for the store write; sfs_item_behind_done()
 * drops them with the lease. An item of the copier is handed to a
 * background thread here (rank_push_behind): held back while the task still
 * copies (and no dump of it bounced, and fewer than RANK_BEHIND_HOLD_MAX are
 * held), all at once when its last entry ends. A worker's (a bounced dump
 * that took its slot) is handed over by that worker (owner.c). */
int sfs_item_publish_behind(struct rank_item *it, bool worker)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_task *t = it->task;
    struct rank_item *held = NULL;
    bool hold, finished;
    int r = sfs_cache_publish(rk->cache, &it->lease, rk->shard_size, SFS_PUBLISH_WRITTEN);

    if (r < 0)
        return r;
    pthread_mutex_lock(&rk->mu);
    rk->active++;
    pthread_mutex_unlock(&rk->mu);
    it->behind = true;
    it->own_next = NULL;
    pthread_mutex_lock(&t->mu);
    t->refs++;
    t->status[it->idx] = 0;
    finished = --t->pending == 0;
    hold = !worker && !finished && !t->no_hold && t->nheld < RANK_BEHIND_HOLD_MAX;
    if (hold) {
        if (t->held_tail)
            t->held_tail->own_next = it;
        else
            t->held_head = it;
        t->held_tail = it;
        t->nheld++;
    } else if (!worker || finished) {
        held = t->held_head;
        t->held_head = t->held_tail = NULL;
        t->nheld = 0;
    }
    if (finished) {
        t->done_ns = sfs_now_ns();
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    if (!worker && !hold)
        rank_push_behind(rk, it);
    push_held(rk, held);
    if (finished) {
        sfs_rank_active_put(rk);
        sfs_task_unref(t); /* the completion reference; ours keeps it */
    }
    return 0;
}

/* The background store write of a write-behind dump ended: count it (in the
 * cache's counters, which /stats shows), log a failure (the first, then at
 * each power of two: a store that is down fails every write), and let the
 * slot go. A failed write leaves the shard Ready in memory only. */
void sfs_item_behind_done(struct rank_item *it, int result)
{
    struct sfs_rank *rk = it->rank;

    sfs_cache_count_behind(rk->cache, result);
    if (result < 0) {
        /* Relaxed: a counter; only the spacing of log lines depends on it. */
        uint64_t n = atomic_fetch_add_explicit(&rk->behind_failed, 1, memory_order_relaxed) + 1;

        if ((n & (n - 1)) == 0) {
            char hex[SFS_BLOCK_HEX_LEN + 1];

            sfs_block_to_hex(&it->key.block, hex);
            sfs_log(LOG_WARNING,
                    "rank: write-behind of %s shard %u failed: %s; it stays in memory only "
                    "(%llu failed so far)",
                    hex, it->key.shard, strerror(-result), (unsigned long long)n);
        }
    }
    sfs_item_late_done(it);
}
