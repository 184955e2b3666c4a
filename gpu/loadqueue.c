/* SPDX-License-Identifier: MIT */
/*
 * loadqueue.c - the LoadQueue of a rank: the dispatcher, the waiters and the
 * backend completions.
 *
 * Key idea: the dispatcher never blocks on one key. It walks a task in
 * RearrangeIndex order and Gets each key:
 *   hit     -> the item goes straight to the copier;
 *   owner   -> a backend load into the slot is submitted; its done callback
 *              (a backend thread) publishes Ready or Failed and hands the item
 *              to the copier;
 *   waiter  -> the item goes to a waiter thread, which blocks on the slot's
 *              futex (no polling) and hands it to the copier when Ready, or
 *              becomes its owner and loads it when the owner died.
 * The only thing the dispatcher waits for is a free load slot: at most
 * `depth` backend requests per rank are in flight. It takes that token
 * *before* a Get that may make it owner, so it never sits on an ownership it
 * cannot serve while other ranks could; when the depth is used up it first
 * peeks at the key's state and Gets hits and loading keys without a token.
 *
 * In the idle window (the queue is empty after a task), the dispatcher runs
 * Prealloc (block, shard + 1) for every block of the last load task: streams
 * read a block's shards in order, so the next task's Gets find their slot on
 * the chain and take it over on the fast path (seed scenario E).
 *
 * Dumps take the same road the other way: Get with SFS_GET_WRITE, the copier
 * copies the source into the slot, a waiter thread submits the backend dump
 * (a posix dump is synchronous in its submitter), and the done callback
 * publishes the slot (SFS_PUBLISH_WRITTEN) or fails it.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

/* ---------------------------------------------------------------------------
 * Depth tokens: backend requests in flight.
 */

bool sfs_lq_token_try(struct sfs_rank *rk)
{
    bool ok = false;

    pthread_mutex_lock(&rk->depth_mu);
    if (rk->inflight < rk->depth) {
        if (++rk->inflight > rk->max_inflight)
            rk->max_inflight = rk->inflight;
        ok = true;
    }
    pthread_mutex_unlock(&rk->depth_mu);
    return ok;
}

/* Block until a token is free. Tokens come back from backend completions,
 * which never wait for anything of ours: this always ends. */
static void token_get(struct sfs_rank *rk)
{
    pthread_mutex_lock(&rk->depth_mu);
    while (rk->inflight >= rk->depth)
        pthread_cond_wait(&rk->depth_cv, &rk->depth_mu);
    if (++rk->inflight > rk->max_inflight)
        rk->max_inflight = rk->inflight;
    pthread_mutex_unlock(&rk->depth_mu);
}

void sfs_lq_token_put(struct sfs_rank *rk)
{
    pthread_mutex_lock(&rk->depth_mu);
    rk->inflight--;
    pthread_cond_signal(&rk->depth_cv);
    pthread_mutex_unlock(&rk->depth_mu);
}

/* ---------------------------------------------------------------------------
 * Tasks and entries.
 */

void sfs_lq_task_unref(struct sfs_task *t)
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
    free(t->status);
    free(t);
}

static void rank_idle_one(struct sfs_rank *rk)
{
    pthread_mutex_lock(&rk->mu);
    if (--rk->active == 0)
        pthread_cond_broadcast(&rk->idle_cv);
    pthread_mutex_unlock(&rk->mu);
}

/* Drop the item's lease (if it still holds one). */
static void item_release(struct rank_item *it)
{
    if (it->leased) {
        sfs_cache_release(it->rank->cache, &it->lease);
        it->leased = false;
    }
}

/* The item is finished with `status`: its lease is gone, its bounce buffer
 * freed. Record the status; the last entry completes the task. */
void sfs_lq_item_done(struct rank_item *it, int status)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_task *t = it->task;
    bool finished;

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
        rank_idle_one(rk);
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->status[it->idx] = status;
    finished = --t->pending == 0;
    if (finished)
        pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (finished) {
        rank_idle_one(rk);
        sfs_lq_task_unref(t); /* the completion reference */
    }
}

/* ---------------------------------------------------------------------------
 * Backend completions (backend threads, or inline in submit).
 */

/*
 * Claim the load of it's slot for this process: true if it is ours to load
 * (it is now on the own list), false if a load of ours is already in flight
 * (it follows that one and completes with it).
 */
static bool claim_load(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    bool mine = true;

    pthread_mutex_lock(&rk->own_mu);
    for (struct rank_item *o = rk->own_head; o; o = o->own_next) {
        if (o->lease.slot == it->lease.slot) {
            it->own_next = o->followers;
            o->followers = it;
            mine = false;
            break;
        }
    }
    if (mine) {
        it->followers = NULL;
        it->own_next = rk->own_head;
        rk->own_head = it;
    }
    pthread_mutex_unlock(&rk->own_mu);
    return mine;
}

/* The load is published (or failed): take it off the own list and hand
 * back its followers. After the publish, so that a thread of ours that
 * finds the slot no longer Loading never looks for the list entry. */
static struct rank_item *unclaim_load(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    struct rank_item **pp, *f;

    pthread_mutex_lock(&rk->own_mu);
    for (pp = &rk->own_head; *pp; pp = &(*pp)->own_next) {
        if (*pp == it) {
            *pp = it->own_next;
            break;
        }
    }
    f = it->followers;
    it->followers = NULL;
    pthread_mutex_unlock(&rk->own_mu);
    return f;
}

static void finish_followers(struct sfs_rank *rk, struct rank_item *f, int res)
{
    while (f) {
        struct rank_item *next = f->own_next;

        if (res == 0) {
            f->step = STEP_COPY_OUT;
            sfs_copier_push(rk, f);
        } else {
            sfs_lq_item_done(f, res);
        }
        f = next;
    }
}

static void load_done(struct sfs_io *io)
{
    struct rank_item *it = io->arg;
    struct sfs_rank *rk = it->rank;
    int res = io->result;

    sfs_lq_token_put(rk);
    if (res == (int)io->len) {
        /* -EPERM: we are no longer its owner (reaped as dead): let go. */
        res = sfs_cache_publish(rk->cache, &it->lease, io->len, 0);
    } else {
        if (res >= 0)
            res = -EIO; /* short */
        sfs_cache_fail(rk->cache, &it->lease, res);
    }
    finish_followers(rk, unclaim_load(it), res);
    if (res == 0 && it->kind != ITEM_PREFETCH) {
        it->step = STEP_COPY_OUT;
        sfs_copier_push(rk, it);
        return;
    }
    sfs_lq_item_done(it, res); /* a prefetch keeps no lease */
}

/* Owner of it->lease, holding a depth token, on the own list: load it. */
static int start_load(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_io *iop = &it->io;
    int r;

    if (!rk->be) {
        r = -ENOENT;
        goto out_fail;
    }
    it->buf = sfs_cache_data(rk->cache, &it->lease);
    memset(iop, 0, sizeof(*iop));
    iop->key = it->key;
    iop->buf = it->buf;
    iop->len = (uint32_t)rk->shard_size;
    iop->done = load_done;
    iop->arg = it;
    rank_ctr_add(rk, RC_OWNER_LOADS, 1);
    r = sfs_backend_load(rk->be, &iop, 1);
    if (r >= 0)
        return 0;
out_fail:
    sfs_lq_token_put(rk);
    sfs_cache_fail(rk->cache, &it->lease, r);
    finish_followers(rk, unclaim_load(it), r);
    sfs_lq_item_done(it, r);
    return r;
}

/* Owner of it->lease, holding a depth token: start loading it, or follow a
 * load of ours already in flight on the slot. */
int sfs_lq_submit_load(struct rank_item *it)
{
    if (!claim_load(it)) {
        sfs_lq_token_put(it->rank);
        return 0;
    }
    return start_load(it);
}

/* A waiter told it owns the slot: the owner died (or let go) and the load
 * is ours, or it is a load of this process in flight (the core's ownership
 * is per process): follow that one, without taking a load slot. */
static void submit_load_waiter(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;

    if (!claim_load(it))
        return;
    rank_ctr_add(rk, RC_TAKEOVERS, 1);
    token_get(rk);
    start_load(it);
}

static void dump_done(struct sfs_io *io)
{
    struct rank_item *it = io->arg;
    struct sfs_rank *rk = it->rank;
    int res = io->result;

    sfs_lq_token_put(rk);
    if (res >= 0 && res != (int)io->len)
        res = -EIO;
    if (!it->bounce) {
        if (res >= 0)
            res = sfs_cache_publish(rk->cache, &it->lease, io->len, SFS_PUBLISH_WRITTEN);
        else
            sfs_cache_fail(rk->cache, &it->lease, res);
    }
    sfs_lq_item_done(it, res < 0 ? res : 0);
}

/* A waiter thread: the bytes are in it->buf; write them through. */
static void submit_dump(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_io *iop = &it->io;
    int r;

    token_get(rk);
    memset(iop, 0, sizeof(*iop));
    iop->key = it->key;
    iop->buf = it->buf;
    iop->len = (uint32_t)rk->shard_size;
    iop->done = dump_done;
    iop->arg = it;
    rank_ctr_add(rk, RC_DUMPS, 1);
    r = sfs_backend_dump(rk->be, &iop, 1);
    if (r < 0) {
        sfs_lq_token_put(rk);
        if (!it->bounce)
            sfs_cache_fail(rk->cache, &it->lease, r);
        sfs_lq_item_done(it, r);
    }
}

/* ---------------------------------------------------------------------------
 * Waiters.
 */

void sfs_lq_push_wait(struct sfs_rank *rk, struct rank_item *it)
{
    it->next = NULL;
    pthread_mutex_lock(&rk->wait_mu);
    if (rk->waitq.tail)
        rk->waitq.tail->next = it;
    else
        rk->waitq.head = it;
    rk->waitq.tail = it;
    pthread_cond_signal(&rk->wait_cv);
    pthread_mutex_unlock(&rk->wait_mu);
}

static void wait_one(struct sfs_rank *rk, struct rank_item *it)
{
    int64_t deadline = sfs_deadline_after(rk->key_timeout_ns);
    int r = sfs_cache_wait(rk->cache, &it->lease, deadline);

    switch (r) {
    case SFS_STATE_READY:
        it->step = STEP_COPY_OUT;
        sfs_copier_push(rk, it);
        return;
    case SFS_STATE_FAILED:
        r = sfs_cache_error(rk->cache, &it->lease);
        sfs_lq_item_done(it, r < 0 ? r : -EIO);
        return;
    case SFS_WAIT_OWNER:
        submit_load_waiter(it);
        return;
    default:
        sfs_lq_item_done(it, r < 0 ? r : -EIO);
        return;
    }
}

static void *waiter_main(void *arg)
{
    struct sfs_rank *rk = arg;

    for (;;) {
        struct rank_item *it;

        pthread_mutex_lock(&rk->wait_mu);
        while (!rk->waitq.head && !rk->waiters_stop)
            pthread_cond_wait(&rk->wait_cv, &rk->wait_mu);
        it = rk->waitq.head;
        if (!it) {
            pthread_mutex_unlock(&rk->wait_mu);
            break;
        }
        rk->waitq.head = it->next;
        if (!rk->waitq.head)
            rk->waitq.tail = NULL;
        pthread_mutex_unlock(&rk->wait_mu);

        if (it->step == STEP_DUMP_SUBMIT)
            submit_dump(it);
        else
            wait_one(rk, it);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------
 * The dispatcher.
 */

static void dispatch_load(struct sfs_rank *rk, struct rank_item *it)
{
    int64_t deadline = sfs_deadline_after(rk->key_timeout_ns);
    bool token = sfs_lq_token_try(rk);
    int role;

    if (!token) {
        /* Depth used up: a key that is Ready or loading needs no token, so
         * do not stall behind our own loads for it. */
        int st = sfs_cache_state(rk->cache, &it->key);

        if (st != SFS_STATE_READY && st != SFS_STATE_LOADING) {
            token_get(rk);
            token = true;
        }
    }
    role = sfs_cache_get(rk->cache, &it->key, 0, deadline, &it->lease);
    if (role < 0) {
        if (token)
            sfs_lq_token_put(rk);
        sfs_lq_item_done(it, role);
        return;
    }
    it->leased = true;
    switch (role) {
    case SFS_HIT:
        if (token)
            sfs_lq_token_put(rk);
        rank_ctr_add(rk, RC_HITS, 1);
        it->step = STEP_COPY_OUT;
        sfs_copier_push(rk, it);
        break;
    case SFS_WAITER:
        if (token)
            sfs_lq_token_put(rk);
        rank_ctr_add(rk, RC_WAITS, 1);
        it->step = STEP_WAIT;
        if (rk->blocking_waits)
            wait_one(rk, it); /* the old way: the walk stalls here */
        else
            sfs_lq_push_wait(rk, it);
        break;
    case SFS_OWNER:
    default:
        if (!token)
            token_get(rk); /* lost the race with the peek: rare */
        sfs_lq_submit_load(it);
        break;
    }
}

static void dispatch_dump(struct sfs_rank *rk, struct rank_item *it)
{
    int64_t deadline = sfs_deadline_after(rk->key_timeout_ns);
    int role = sfs_cache_get(rk->cache, &it->key, SFS_GET_WRITE, deadline, &it->lease);

    if (role == -EBUSY && rk->be) {
        /* Someone reads or loads this key: leave the cache alone and write
         * the backend from a private copy. */
        it->buf = malloc(rk->shard_size);
        if (!it->buf) {
            sfs_lq_item_done(it, -ENOMEM);
            return;
        }
        it->bounce = true;
        rank_ctr_add(rk, RC_DUMPS_BOUNCED, 1);
        it->step = STEP_COPY_IN;
        sfs_copier_push(rk, it);
        return;
    }
    if (role < 0) {
        sfs_lq_item_done(it, role);
        return;
    }
    it->leased = true;
    if (role != SFS_OWNER) { /* not expected with SFS_GET_WRITE */
        sfs_lq_item_done(it, -EBUSY);
        return;
    }
    it->buf = sfs_cache_data(rk->cache, &it->lease);
    it->step = STEP_COPY_IN;
    sfs_copier_push(rk, it);
}

/* After the copier has copied a dump's bytes in: write them through. Called
 * by the copier thread. */
void sfs_lq_dump_copied(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;

    if (!rk->be) {
        /* No backend: the cache is the only copy. */
        int r =
            sfs_cache_publish(rk->cache, &it->lease, (uint32_t)rk->shard_size, SFS_PUBLISH_WRITTEN);
        sfs_lq_item_done(it, r);
        return;
    }
    it->step = STEP_DUMP_SUBMIT;
    sfs_lq_push_wait(rk, it);
}

static void walk_task(struct sfs_rank *rk, struct sfs_task *t)
{
    uint32_t *order = malloc(t->n * sizeof(*order));

    if (order && rk->rotate) {
        sfs_rank_rearrange(t->n, rk->r, rk->N, order);
    } else if (order) {
        for (size_t i = 0; i < t->n; i++)
            order[i] = (uint32_t)i;
    }
    for (size_t k = 0; k < t->n; k++) {
        struct rank_item *it = &t->items[order ? order[k] : k];

        if (t->kind == ITEM_DUMP)
            dispatch_dump(rk, it);
        else
            dispatch_load(rk, it);
    }
    free(order);
}

/* Idle window: prewarm the next shard of every block of the last task. */
static void idle_prealloc(struct sfs_rank *rk, struct sfs_task *t)
{
    for (size_t i = 0; i < t->n; i++) {
        struct sfs_key k = {.block = t->entries[i].block, .shard = t->entries[i].shard + 1};

        if (k.shard == 0)
            continue;                                         /* wrapped */
        if (__atomic_load_n(&rk->stopping, __ATOMIC_RELAXED)) /* relaxed: a hint */
            break;
        if (sfs_cache_prealloc(rk->cache, &k) == 1)
            rank_ctr_add(rk, RC_PREALLOC, 1);
        /* Stop early when a task arrives: it is worth more than a guess. */
        if (__atomic_load_n(&rk->tq_head, __ATOMIC_RELAXED)) /* relaxed: a hint */
            break;
    }
}

static void *dispatcher_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct sfs_task *last = NULL; /* holds the dispatcher reference */

    pthread_mutex_lock(&rk->mu);
    for (;;) {
        struct sfs_task *t = rk->tq_head;

        if (!t) {
            if (last) {
                /* The idle window. */
                pthread_mutex_unlock(&rk->mu);
                if (rk->prealloc && last->kind == ITEM_LOAD)
                    idle_prealloc(rk, last);
                sfs_lq_task_unref(last);
                last = NULL;
                pthread_mutex_lock(&rk->mu);
                continue;
            }
            if (rk->stopping)
                break;
            pthread_cond_wait(&rk->task_cv, &rk->mu);
            continue;
        }
        rk->tq_head = t->next;
        if (!rk->tq_head)
            rk->tq_tail = NULL;
        pthread_mutex_unlock(&rk->mu);
        if (last)
            sfs_lq_task_unref(last);
        walk_task(rk, t);
        last = t;
        pthread_mutex_lock(&rk->mu);
    }
    pthread_mutex_unlock(&rk->mu);
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Start / stop.
 */

int sfs_lq_start(struct sfs_rank *rk)
{
    int r;

    rk->waiter_threads = calloc(rk->nwaiters, sizeof(*rk->waiter_threads));
    if (!rk->waiter_threads)
        return -ENOMEM;
    for (unsigned i = 0; i < rk->nwaiters; i++) {
        r = pthread_create(&rk->waiter_threads[i], NULL, waiter_main, rk);
        if (r)
            return -r;
        rk->nwaiter_threads++;
    }
    r = pthread_create(&rk->dispatcher, NULL, dispatcher_main, rk);
    if (r)
        return -r;
    rk->dispatcher_started = true;
    return 0;
}

/* Everything queued has been cancelled or completed (rk->active == 0) and
 * stopping is set: join the threads. */
void sfs_lq_stop(struct sfs_rank *rk)
{
    if (rk->dispatcher_started) {
        pthread_mutex_lock(&rk->mu);
        rk->stopping = true;
        pthread_cond_broadcast(&rk->task_cv);
        pthread_mutex_unlock(&rk->mu);
        pthread_join(rk->dispatcher, NULL);
        rk->dispatcher_started = false;
    }
    pthread_mutex_lock(&rk->wait_mu);
    rk->waiters_stop = true;
    pthread_cond_broadcast(&rk->wait_cv);
    pthread_mutex_unlock(&rk->wait_mu);
    for (unsigned i = 0; i < rk->nwaiter_threads; i++)
        pthread_join(rk->waiter_threads[i], NULL);
    rk->nwaiter_threads = 0;
    free(rk->waiter_threads);
    rk->waiter_threads = NULL;
}
