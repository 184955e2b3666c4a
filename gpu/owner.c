/* SPDX-License-Identifier: MIT */
/*
 * owner.c - what a rank does as a key's owner: the depth tokens that bound
 * its backend requests in flight, submitting loads and dumps and their
 * backend completions (publish, fail, hand the item to the copier), the
 * bounced dump taking its slot, the worker threads (dump submits, loads
 * taken over from dead owners), the background threads (write-behind store
 * writes, at a lower priority), the deadline of a load the store does not
 * answer (the expirer thread) and prefetch.
 *
 * Below the dispatcher (loadqueue.c), inline.c (a depth token), rank.c
 * (close gives back a cancelled task's tokens) and lookup.c (prefetch);
 * calls only complete.c and the backend. Items reach it by a call from the
 * dispatcher or a push on the work queue (rank_push_work()) or the
 * background queue (rank_push_behind()).
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------
 * Depth tokens: backend requests in flight.
 */

bool sfs_own_token_try(struct sfs_rank *rk)
{
    unsigned cur = atomic_load_explicit(&rk->inflight, memory_order_relaxed);
    unsigned max;

    do {
        if (cur >= rk->depth)
            return false;
    } while (!atomic_compare_exchange_weak_explicit(&rk->inflight, &cur, cur + 1,
                                                    memory_order_seq_cst, memory_order_relaxed));
    /* A statistic: a racy maximum is fine as long as it only grows. */
    max = atomic_load_explicit(&rk->max_inflight, memory_order_relaxed);
    while (cur + 1 > max &&
           !atomic_compare_exchange_weak_explicit(&rk->max_inflight, &max, cur + 1,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    return true;
}

/* Block until a token is free. Tokens come back from backend completions,
 * which never wait for anything of ours: this always ends. */
void sfs_own_token_get(struct sfs_rank *rk)
{
    if (sfs_own_token_try(rk))
        return;
    pthread_mutex_lock(&rk->depth_mu);
    /* Counted before the try, both seq_cst, and the putter's decrement
     * before its look at the count (Dekker): either our try sees the token
     * come back or the putter sees us waiting and signals under the mutex,
     * which we hold until pthread_cond_wait releases it. */
    atomic_fetch_add_explicit(&rk->token_waiters, 1, memory_order_seq_cst);
    while (!sfs_own_token_try(rk))
        pthread_cond_wait(&rk->depth_cv, &rk->depth_mu);
    atomic_fetch_sub_explicit(&rk->token_waiters, 1, memory_order_relaxed);
    pthread_mutex_unlock(&rk->depth_mu);
}

void sfs_own_token_put(struct sfs_rank *rk)
{
    atomic_fetch_sub_explicit(&rk->inflight, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&rk->token_waiters, memory_order_seq_cst)) {
        pthread_mutex_lock(&rk->depth_mu);
        pthread_cond_signal(&rk->depth_cv);
        pthread_mutex_unlock(&rk->depth_mu);
    }
}

/* ---------------------------------------------------------------------------
 * Backend completions (backend threads, or inline in submit).
 *
 * The core's ownership is the owner's lease: another Get of ours on a slot
 * we are loading makes that item a waiter, which waits for our publish like
 * any other (and releasing it does not abandon the load). So a load needs to
 * know nothing about other items of ours on the same key.
 */

/* ---------------------------------------------------------------------------
 * Deadlines of owner loads.
 *
 * A task's owner load is listed on rk->own_* from its submit until the
 * backend answers (load_done) or its deadline, key_timeout_ms after the
 * submit, passes (the expirer), whichever comes first under own_mu: the
 * list is in submit order, hence in deadline order. On a store that stops
 * answering (a hung network file system) the expirer ends the entry with
 * -ETIMEDOUT, so the task completes; the load itself keeps its lease (the
 * slot stays Loading: the backend may still write into it, so the slot must
 * not go to another key), its depth token and a reference to its task, and
 * when the backend does answer it settles the slot for whoever reads next
 * and lets go, never handing the item to the copier: nothing is written to
 * the entry's destination after its entry ended.
 */

/* Put the task items of ios[0..n) on the list, each with its deadline. */
static void own_list(struct sfs_rank *rk, struct sfs_io **ios, size_t n)
{
    int64_t deadline = sfs_deadline_after(rk->key_timeout_ns);
    bool was_empty;

    pthread_mutex_lock(&rk->own_mu);
    was_empty = rk->own_head == NULL;
    for (size_t i = 0; i < n; i++) {
        struct rank_item *it = ios[i]->arg;

        if (!it->task)
            continue; /* a prefetch: no entry to end */
        it->deadline_ns = deadline;
        it->expired = false;
        it->own_next = NULL;
        it->own_prev = rk->own_tail;
        if (rk->own_tail)
            rk->own_tail->own_next = it;
        else
            rk->own_head = it;
        rk->own_tail = it;
    }
    /* A sleeping expirer waits for a head that is earlier than these. */
    if (was_empty && rk->own_head)
        pthread_cond_signal(&rk->own_cv);
    pthread_mutex_unlock(&rk->own_mu);
}

/* own_mu held: take `it` off the list. */
static void own_unlink(struct sfs_rank *rk, struct rank_item *it)
{
    if (it->own_prev)
        it->own_prev->own_next = it->own_next;
    else
        rk->own_head = it->own_next;
    if (it->own_next)
        it->own_next->own_prev = it->own_prev;
    else
        rk->own_tail = it->own_prev;
    it->own_prev = it->own_next = NULL;
}

/* The backend is done with `it`'s load: true when its entry is still ours
 * to end (off the list now), false when the expirer ended it already. */
static bool own_unlist(struct sfs_rank *rk, struct rank_item *it)
{
    bool expired;

    if (!it->task)
        return true;
    pthread_mutex_lock(&rk->own_mu);
    expired = it->expired;
    if (!expired)
        own_unlink(rk, it);
    pthread_mutex_unlock(&rk->own_mu);
    return !expired;
}

/* The late answer to an expired load: settle the slot with it (the bytes
 * are the key's; a failure lets the next Get retry) and let go. */
static void own_late(struct rank_item *it, int io_result, uint32_t len)
{
    sfs_cache_settle(it->rank->cache, &it->lease, io_result, len, 0);
    sfs_item_late_done(it);
}

static void *expirer_main(void *arg)
{
    struct sfs_rank *rk = arg;

    pthread_mutex_lock(&rk->own_mu);
    while (!rk->own_stop) {
        struct rank_item *it = rk->own_head;
        struct sfs_task *t;

        if (!it) {
            pthread_cond_wait(&rk->own_cv, &rk->own_mu);
            continue;
        }
        if (sfs_now_ns() < it->deadline_ns) {
            struct timespec ts = {it->deadline_ns / 1000000000, it->deadline_ns % 1000000000};

            pthread_cond_timedwait(&rk->own_cv, &rk->own_mu, &ts);
            continue;
        }
        /* Late. The load's own references first, under own_mu: once it is
         * marked, load_done() may run the late path and drop them. */
        own_unlink(rk, it);
        it->expired = true;
        t = it->task;
        pthread_mutex_lock(&t->mu);
        t->refs++;
        pthread_mutex_unlock(&t->mu);
        pthread_mutex_lock(&rk->mu);
        rk->active++; /* close and a re-attach wait for the backend's answer */
        pthread_mutex_unlock(&rk->mu);
        pthread_mutex_unlock(&rk->own_mu);
        sfs_item_expire(it, -ETIMEDOUT);
        pthread_mutex_lock(&rk->own_mu);
    }
    pthread_mutex_unlock(&rk->own_mu);
    return NULL;
}

static void load_done(struct sfs_io *io)
{
    struct rank_item *it = io->arg;
    struct sfs_rank *rk = it->rank;
    int res;

    sfs_own_token_put(rk);
    sfs_cache_observe(rk->cache, SFS_HIST_LOAD, sfs_now_ns() - it->start_ns);
    if (it->kind != ITEM_PREFETCH) {
        if (io->result == (int)io->len)
            sfs_cache_count_served(rk->cache,
                                   sfs_io_from_peer(io) ? SFS_TIER_PEER : SFS_TIER_STORE);
        else if (io->result == -ENOENT)
            sfs_cache_count_served(rk->cache, SFS_TIER_MISS);
    }
    if (!own_unlist(rk, it)) {
        own_late(it, io->result, io->len);
        return;
    }
    /* -EPERM: we are no longer its owner (reaped as dead): let go. */
    res = sfs_cache_settle(rk->cache, &it->lease, io->result, io->len, 0);
    if (res == 0 && it->kind != ITEM_PREFETCH) {
        it->step = STEP_COPY_OUT;
        rank_push_copy(rk, it);
        return;
    }
    sfs_item_done(it, res); /* a prefetch keeps no lease */
}

/* The backend request of `it`: its key, one shard to or from it->buf. */
static void io_prep(struct rank_item *it, void (*done)(struct sfs_io *))
{
    struct sfs_io *iop = &it->io;

    memset(iop, 0, sizeof(*iop));
    iop->key = it->key;
    iop->buf = it->buf;
    iop->len = it->rank->shard_size;
    iop->done = done;
    iop->arg = it;
}

/* Owner of it->lease, holding a depth token: fill in its request. False
 * (and the item is finished) when there is no backend. */
bool sfs_own_prep_load(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;

    if (!rk->be) {
        if (it->kind != ITEM_PREFETCH)
            sfs_cache_count_served(rk->cache, SFS_TIER_MISS);
        sfs_own_token_put(rk);
        sfs_cache_fail(rk->cache, &it->lease, -ENOENT);
        sfs_item_done(it, -ENOENT);
        return false;
    }
    it->buf = sfs_cache_data(rk->cache, &it->lease);
    io_prep(it, load_done);
    return true;
}

/* Submit prepared loads with one backend call (one io_uring submit in the
 * posix backend, which also opens each block file once for the batch). */
void sfs_own_submit_loads(struct sfs_rank *rk, struct sfs_io **ios, size_t n)
{
    int r;

    if (n == 0)
        return;
    rank_ctr_add(rk, RC_OWNER_LOADS, n);
    int64_t now = sfs_now_ns();
    for (size_t i = 0; i < n; i++)
        ((struct rank_item *)ios[i]->arg)->start_ns = now;
    own_list(rk, ios, n); /* before: the backend may answer inline */
    r = sfs_backend_load(rk->be, ios, n);
    if (r >= (int)n)
        return;
    /* None taken (-errno), or a prefix (the contract allows it; our
     * backends take all or none): fail the rest. */
    int err = r < 0 ? r : -EIO;

    for (size_t i = r < 0 ? 0 : (size_t)r; i < n; i++) {
        struct rank_item *it = ios[i]->arg;

        sfs_own_token_put(rk);
        if (!own_unlist(rk, it)) { /* a backend that blocked past the deadline */
            own_late(it, err, 0);
            continue;
        }
        sfs_cache_fail(rk->cache, &it->lease, err);
        sfs_item_done(it, err);
    }
}

/* Owner of it->lease, holding a depth token: start loading it. */
int sfs_own_submit_load(struct rank_item *it)
{
    struct sfs_io *iop = &it->io;

    if (!sfs_own_prep_load(it))
        return -ENOENT;
    sfs_own_submit_loads(it->rank, &iop, 1);
    return 0;
}

/* A wait made this item owner (the owner died, or the slot was reset): load
 * it ourselves. Blocks for a depth token: a worker (or the blocking
 * dispatcher) runs it, never a watcher. */
void sfs_own_takeover(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;

    rank_ctr_add(rk, RC_TAKEOVERS, 1);
    sfs_own_token_get(rk);
    sfs_own_submit_load(it);
}

static void dump_done(struct sfs_io *io)
{
    struct rank_item *it = io->arg;
    struct sfs_rank *rk = it->rank;
    int res = io->result;

    sfs_own_token_put(rk);
    if (it->behind) { /* Ready since its publish: nothing to settle */
        if (res >= 0 && res != (int)io->len)
            res = -EIO; /* short */
        sfs_item_behind_done(it, res < 0 ? res : 0);
        return;
    }
    if (!it->bounce)
        res = sfs_cache_settle(rk->cache, &it->lease, res, io->len, SFS_PUBLISH_WRITTEN);
    else if (res >= 0 && res != (int)io->len)
        res = -EIO; /* short */
    sfs_item_done(it, res < 0 ? res : 0);
}

/* A bounced dump (the key was leased elsewhere at dispatch): take the key's
 * slot for writing now and move the bytes in, so that the dump runs as the
 * key's writer. True when it did; false when the item was put back on the
 * work queue (still leased: tried again after the queue's other work) or
 * finished (-ETIMEDOUT at the key's deadline, or the Get's error), with
 * nothing stored. */
static bool bounce_take_slot(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    int role = sfs_cache_get(rk->cache, &it->key, SFS_GET_WRITE, it->deadline_ns, &it->lease);
    void *data;

    if (role == -EBUSY) {
        if (sfs_now_ns() >= it->deadline_ns) {
            sfs_item_done(it, -ETIMEDOUT);
        } else {
            struct timespec ts = {0, 1000 * 1000}; /* a reader's lease is short */

            nanosleep(&ts, NULL);
            rank_push_work(rk, it);
        }
        return false;
    }
    if (role < 0) {
        sfs_item_done(it, role);
        return false;
    }
    it->leased = true;
    if (role != SFS_OWNER) { /* not expected with SFS_GET_WRITE */
        sfs_item_done(it, -EBUSY);
        return false;
    }
    data = sfs_cache_data(rk->cache, &it->lease);
    if (!data) {
        sfs_item_done(it, -EIO); /* released unwritten: Idle, as any failed dump */
        return false;
    }
    memcpy(data, it->buf, rk->shard_size);
    free(it->buf);
    it->buf = data;
    it->bounce = false;
    return true;
}

/* Test build: a background store write waits for a byte (or EOF) on the
 * descriptor SHARDFS_RANK_BEHIND_HOLD_FD names, so a test holds it exactly
 * as long as it needs. */
static void behind_hold(struct sfs_rank *rk)
{
#ifdef SFS_TEST_HOOKS
    char b;

    if (rk->behind_hold_fd >= 0)
        while (read(rk->behind_hold_fd, &b, 1) < 0 && errno == EINTR)
            ;
#else
    (void)rk;
#endif
}

/* A worker thread: the bytes are in it->buf; write them through. A
 * write-behind dump the copier did not publish (a bounced one) is published
 * here and handed to the background threads, which come here for its store
 * write. */
static void submit_dump(struct rank_item *it)
{
    struct sfs_rank *rk = it->rank;
    struct sfs_io *iop = &it->io;
    int r;

    if (it->bounce && !bounce_take_slot(it))
        return;
    if (it->task->behind && !it->behind) {
        r = sfs_item_publish_behind(it, true);
        if (r < 0)
            sfs_item_done(it, r);
        else
            rank_push_behind(rk, it); /* its store write, in the background */
        return;
    }
    if (it->behind)
        behind_hold(rk);
    sfs_own_token_get(rk);
    io_prep(it, dump_done);
    rank_ctr_add(rk, RC_DUMPS, 1);
    r = sfs_backend_dump(rk->be, &iop, 1);
    if (r < 0) {
        sfs_own_token_put(rk);
        if (it->behind)
            sfs_item_behind_done(it, r);
        else
            sfs_item_done(it, r); /* released unpublished: Idle (sfs_cache_settle()) */
    }
}

/* ---------------------------------------------------------------------------
 * Workers: dump submits and takeover loads, both of which may block. They
 * take items off rk->work until it is stopped and drained.
 */

static void *worker_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct rank_item *it;

    while ((it = item_of(sfs_workq_pop(&rk->work, SFS_WQ_FOREVER)))) {
        if (it->step == STEP_DUMP_SUBMIT)
            submit_dump(it);
        else
            sfs_own_takeover(it);
    }
    return NULL;
}

/* The task ended and nobody has seen it yet: wait until someone has, or
 * RANK_BEHIND_GRACE_NS after its end. A waiter woken by the end would
 * otherwise compete for the CPUs with the store writes it just made
 * runnable, and a kernel without preemption (PREEMPT_NONE) lets a store
 * write's system calls run on for milliseconds before it: on 2 CPUs, one
 * store step in five took 7-12 ms instead of 4.5 (bench_vllm). A task
 * still running (a write let go past RANK_BEHIND_HOLD_MAX) does not wait. */
static void behind_grace(struct sfs_task *t)
{
    pthread_mutex_lock(&t->mu);
    if (t->pending == 0 && !t->seen) {
        int64_t until = t->done_ns + RANK_BEHIND_GRACE_NS;
        struct timespec ts = {.tv_sec = until / 1000000000, .tv_nsec = until % 1000000000};

        while (!t->seen && pthread_cond_timedwait(&t->cv, &t->mu, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&t->mu);
}

/* A background thread: the store writes of write-behind dumps (Ready in the
 * cache already, nobody waits for them), RANK_BEHIND_NICE nicer than the
 * thread that started it, so that the application's threads (an engine's
 * step, a waiter woken by the dump's end) go first on a busy host. An
 * unprivileged thread cannot undo that, hence threads of their own. */
static void *behind_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct rank_item *it;
    int nice;

    errno = 0;
    nice = getpriority(PRIO_PROCESS, 0); /* Linux: this thread's */
    if (nice != -1 || errno == 0)
        (void)setpriority(PRIO_PROCESS, 0, nice + RANK_BEHIND_NICE); /* best effort */
    while ((it = item_of(sfs_workq_pop(&rk->behind, SFS_WQ_FOREVER)))) {
        behind_grace(it->task);
        submit_dump(it);
    }
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Prefetch: owner loads with no destination and no task, started from the
 * caller's thread, each holding a depth token (so at most the free depth).
 */

int sfs_own_prefetch(struct sfs_rank *rk, const struct sfs_key *keys, size_t n)
{
    int accepted = 0;

    for (size_t i = 0; i < n; i++) {
        struct rank_item *it;
        int role;

        /* Advisory: no free load slot means no, not later. */
        if (!sfs_own_token_try(rk))
            break;
        it = calloc(1, sizeof(*it));
        if (!it) {
            sfs_own_token_put(rk);
            break;
        }
        it->rank = rk;
        it->kind = ITEM_PREFETCH;
        it->key = keys[i];
        pthread_mutex_lock(&rk->mu);
        if (rk->stopping) {
            pthread_mutex_unlock(&rk->mu);
            sfs_own_token_put(rk);
            free(it);
            break;
        }
        rk->active++;
        pthread_mutex_unlock(&rk->mu);
        role = sfs_cache_get(rk->cache, &it->key, SFS_GET_PREFETCH, 0, &it->lease);
        if (role != SFS_OWNER) {
            /* Present, loading, or no slot without evicting: rejected.
             * -EEXIST (present) is the common answer. */
            if (role >= 0)
                sfs_cache_release(rk->cache, &it->lease);
            sfs_own_token_put(rk);
            free(it);
            sfs_rank_active_put(rk);
            continue;
        }
        it->leased = true;
        rank_ctr_add(rk, RC_PREFETCHED, 1);
        accepted++;
        sfs_own_submit_load(it); /* done: publish, release, free */
    }
    return accepted;
}

/* ---------------------------------------------------------------------------
 * Start / stop of the workers and the expirer (the LoadQueue's start and
 * stop call these).
 */

/* rk->nworkers threads running fn: *out their array, *started how many
 * began (a failure leaves those for threads_stop). 0 or -errno. */
static int threads_start(struct sfs_rank *rk, void *(*fn)(void *), pthread_t **out,
                         unsigned *started)
{
    *out = calloc(rk->nworkers, sizeof(**out));
    if (!*out)
        return -ENOMEM;
    for (unsigned i = 0; i < rk->nworkers; i++) {
        int r = pthread_create(&(*out)[i], NULL, fn, rk);

        if (r)
            return -r;
        (*started)++;
    }
    return 0;
}

/* Stop q (its consumers drain it, then end) and join its threads. */
static void threads_stop(struct sfs_workq *q, pthread_t **t, unsigned *n)
{
    sfs_workq_stop(q);
    for (unsigned i = 0; i < *n; i++)
        pthread_join((*t)[i], NULL);
    *n = 0;
    free(*t);
    *t = NULL;
}

int sfs_own_workers_start(struct sfs_rank *rk)
{
    int r;

    if (rk->be) {
        rk->own_stop = false; /* a re-attach restarts it */
        r = pthread_create(&rk->expirer, NULL, expirer_main, rk);
        if (r)
            return -r;
        rk->expirer_started = true;
    }
    r = threads_start(rk, worker_main, &rk->worker_threads, &rk->nworker_threads);
    if (r == 0)
        r = threads_start(rk, behind_main, &rk->behind_threads, &rk->nbehind_threads);
    return r;
}

/* The watchers are stopped (they hand takeovers to the workers): drain the
 * work queue and join the workers. */
void sfs_own_workers_stop(struct sfs_rank *rk)
{
    /* Every task is complete (active is 0), so no load is listed. */
    if (rk->expirer_started) {
        pthread_mutex_lock(&rk->own_mu);
        rk->own_stop = true;
        pthread_cond_signal(&rk->own_cv);
        pthread_mutex_unlock(&rk->own_mu);
        pthread_join(rk->expirer, NULL);
        rk->expirer_started = false;
    }
    threads_stop(&rk->work, &rk->worker_threads, &rk->nworker_threads);
    threads_stop(&rk->behind, &rk->behind_threads, &rk->nbehind_threads);
}
