/* SPDX-License-Identifier: MIT */
/*
 * loadqueue.c - the LoadQueue of a rank: the dispatcher; the watchers are
 * watch.c's, what an owner does (depth tokens, backend requests and their
 * completions, workers, prefetch) owner.c's, the end of an item
 * complete.c's (all below this file: it calls them, never the other way).
 *
 * Key idea: the dispatcher never blocks on one key. It walks a task in
 * RearrangeIndex order and Gets each key:
 *   hit     -> the item goes straight to the copier;
 *   owner   -> a backend load into the slot is submitted; its done callback
 *              (a backend thread) publishes Ready or Failed and hands the item
 *              to the copier;
 *   waiter  -> the item goes to a watcher thread, which sleeps on it together
 *              with every other waiting key and its doorbell
 *              (sfs_cache_wait_any_bell: one futex_waitv, no polling; the
 *              dispatcher rings the bell when it gives the watcher a new
 *              key) and hands each to the copier the moment it is Ready,
 *              or to a worker that loads it when its owner died.
 * The only thing the dispatcher waits for is a free load slot: at most
 * `depth` backend requests per rank are in flight. It takes that token
 * *before* a Get that may make it owner, so it never sits on an ownership it
 * cannot serve while other ranks could; when the depth is used up it first
 * peeks at the key's state and Gets hits and loading keys without a token.
 *
 * In the idle window (the queue is empty after a task), the dispatcher runs
 * Prealloc (block, shard + 1) for every block of the last load task: streams
 * read a block's shards in order, so the next task's Gets find their slot on
 * the chain and take it over on the fast path (design.md, scenario E).
 *
 * Dumps take the same road the other way: Get with SFS_GET_WRITE, the copier
 * copies the source into the slot, a worker thread submits the backend dump
 * (a posix dump is synchronous in its submitter), and the done callback
 * publishes the slot (SFS_PUBLISH_WRITTEN), or, when the dump failed,
 * releases it unpublished: the error is the dump's, and a reader parked on
 * the key loads what the store still has.
 *
 * The slot a dump owns under SFS_GET_WRITE is the key's writer lock, across
 * processes (the mount's writes take it too): the store is written only by
 * that owner, and the slot is published after the store has the bytes, so
 * the cache and the store agree on the last committed version. A key that is
 * leased elsewhere when its dump is dispatched (a reader, or another dump of
 * it) is copied into a bounce buffer first, so the dispatcher never waits;
 * a worker then takes the slot once the key is free (retrying, behind other
 * work, until the key's deadline) and dumps as its owner.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------------------
 * Leases: the dispatcher short of them.
 */

/* This process holds every lease the cache allows it (-ENOBUFS: a task far
 * bigger than max_leases, the copier behind the dispatcher). Wait until an
 * item releases one, 10 ms at most (leases held elsewhere in the process
 * signal nobody), or until `deadline`. */
static void lease_wait(struct sfs_rank *rk, int64_t deadline)
{
    int64_t ns = deadline - sfs_now_ns();
    struct timespec ts;

    if (ns <= 0)
        return;
    if (ns > 10 * 1000000ll)
        ns = 10 * 1000000ll;
    clock_gettime(CLOCK_REALTIME, &ts); /* the condvar's clock */
    ts.tv_nsec += ns;
    ts.tv_sec += ts.tv_nsec / 1000000000;
    ts.tv_nsec %= 1000000000;
    pthread_mutex_lock(&rk->lease_mu);
    /* A release between our failed Get and this count signals nobody: it
     * costs at most the 10 ms bound, then the Get is tried again. */
    atomic_fetch_add_explicit(&rk->lease_waiters, 1, memory_order_relaxed);
    pthread_cond_timedwait(&rk->lease_cv, &rk->lease_mu, &ts);
    atomic_fetch_sub_explicit(&rk->lease_waiters, 1, memory_order_relaxed);
    pthread_mutex_unlock(&rk->lease_mu);
}

/* ---------------------------------------------------------------------------
 * Blocking waits (the blocking_waits baseline, benchmark builds only) and a
 * lost daemon.
 */

#ifdef SFS_BENCH_BASELINES
#define LINK_CHECK_NS (100 * 1000 * 1000ll) /* a blocking wait looks for a lost daemon */

/* The blocking_waits baseline: the dispatcher itself waits, in slices, to
 * see the daemon go (bounded by the key's deadline). */
static void wait_one(struct sfs_rank *rk, struct rank_item *it)
{
    int r;

    do {
        int64_t slice = sfs_deadline_after(LINK_CHECK_NS);

        r = sfs_cache_wait(rk->cache, &it->lease,
                           slice < it->deadline_ns ? slice : it->deadline_ns);
    } while (r == -ETIMEDOUT && sfs_now_ns() < it->deadline_ns && !rank_link_lost(rk));
    if (r == -ETIMEDOUT && rank_link_lost(rk))
        r = -ESHUTDOWN;
    if (sfs_watch_settled(rk, it, r))
        sfs_own_takeover(it);
}
#endif

void sfs_lq_link_lost(struct sfs_rank *rk)
{
    sfs_watch_wake_all(rk);
    pthread_mutex_lock(&rk->lease_mu);
    pthread_cond_broadcast(&rk->lease_cv);
    pthread_mutex_unlock(&rk->lease_mu);
}

/* ---------------------------------------------------------------------------
 * The dispatcher.
 */

/* What the walk holds back: owner loads it has taken (each holds a token
 * and its key's ownership) but not yet submitted, and hits not yet handed to
 * the copier (one lock and one wake for a run of them, not one per key).
 * Flushed whenever the dispatcher would block (a token, a blocking wait, a
 * full cache), when it holds `depth` loads or `hits_max` hits, and at the
 * end of the walk: so nothing held waits for more than the walk's next few
 * Gets. The first run of a walk is short, so the copier starts early on a
 * small task (its latency); runs then double to HITS_HELD, fewer wakes on a
 * big one (its throughput). */
struct load_batch {
    size_t n, cap;
    struct sfs_io **ios;
    struct sfs_fifo hits; /* linked through qn; the copier's queue takes the chain */
    unsigned nhits, hits_max;
};

#define HITS_FIRST 16
#define HITS_HELD  128

static void hits_flush(struct sfs_rank *rk, struct load_batch *b)
{
    if (b->nhits)
        rank_push_copy_chain(rk, item_of(b->hits.head), item_of(b->hits.tail));
    b->hits.head = b->hits.tail = NULL;
    b->nhits = 0;
}

static void batch_flush(struct sfs_rank *rk, struct load_batch *b)
{
    hits_flush(rk, b);
    sfs_own_submit_loads(rk, b->ios, b->n);
    b->n = 0;
}

/*
 * The walk of a load task. The cursor `pos` takes the keys in walk order
 * (RearrangeIndex, or natural); that order decides which keys this rank owns.
 * While the cursor waits for a load slot, the look-ahead takes keys further
 * on that need none -- Ready ones and ones another rank is loading -- so
 * their copies overlap our own loads instead of all coming after them.
 * `taken` marks what the look-ahead dispatched; missing keys it leaves to the
 * cursor, so ownership stays where the walk order puts it.
 */
struct walk {
    struct sfs_task *t;
    const uint32_t *order;
    bool *taken; /* NULL: no look-ahead */
    size_t pos, ahead;
    struct load_batch b;
};

/* Keys peeked per wait for a load slot: bounds the look-ahead's cost on a
 * long task to a few microseconds per owner load. */
#define LOOKAHEAD_PEEKS 64

/* Route `it`, whose Get made it `role` (its lease taken), by that role.
 * `token`: we hold a depth token for it. `deadline`: the key's deadline if
 * the Get read the clock for one, else 0. */
static void route(struct sfs_rank *rk, struct rank_item *it, struct load_batch *b, bool token,
                  int role, int64_t deadline)
{
    it->leased = true;
    switch (role) {
    case SFS_HIT:
        if (token)
            sfs_own_token_put(rk);
        rank_ctr_add(rk, RC_HITS, 1);
        it->step = STEP_COPY_OUT;
        sfs_fifo_push(&b->hits, &it->qn);
        if (++b->nhits >= b->hits_max) {
            hits_flush(rk, b);
            if (b->hits_max < HITS_HELD)
                b->hits_max *= 2;
        }
        break;
    case SFS_WAITER:
        if (token)
            sfs_own_token_put(rk);
        rank_ctr_add(rk, RC_WAITS, 1);
        it->step = STEP_WAIT;
        it->start_ns = sfs_now_ns();
        it->deadline_ns = deadline ? deadline : sfs_deadline_after(rk->key_timeout_ns);
#ifdef SFS_BENCH_BASELINES
        if (rk->blocking_waits) {
            batch_flush(rk, b);
            wait_one(rk, it); /* the old way: the walk stalls here */
            break;
        }
#endif
        sfs_watch_push(rk, it);
        break;
    case SFS_OWNER:
    default:
        if (!token) {
            batch_flush(rk, b);
            sfs_own_token_get(rk); /* lost the race with a peek: rare */
        }
        if (!b->ios) {
            sfs_own_submit_load(it); /* no batch array: one at a time */
            break;
        }
        if (!sfs_own_prep_load(it))
            break;
        b->ios[b->n++] = &it->io;
        if (b->n == b->cap)
            batch_flush(rk, b);
        break;
    }
}

/* Get `it` and route it by role. `token`: we hold a depth token for it. */
static void get_and_route(struct sfs_rank *rk, struct rank_item *it, struct load_batch *b,
                          bool token)
{
    /* The key's deadline starts at its Get, not before the wait for a load
     * slot (which can outlast key_timeout_ms behind slow loads); it is read
     * from the clock only when needed: hits, most keys, need none. First a
     * Get that does not wait for a free slot: a full cache must not wait on
     * slots whose loads (or copies) we hold back. */
    int64_t deadline = 0;
    if (rank_link_lost(rk)) {
        /* The daemon is gone: nobody repairs this cache any more. */
        if (token)
            sfs_own_token_put(rk);
        sfs_item_done(it, -ESHUTDOWN);
        return;
    }
    int role = sfs_cache_get(rk->cache, &it->key, 0, 0, &it->lease);

    if (role == -ENOSPC) {
        batch_flush(rk, b);
        deadline = sfs_deadline_after(rk->key_timeout_ns);
        role = sfs_cache_get(rk->cache, &it->key, 0, deadline, &it->lease);
    }
    /* Out of leases: what we hold goes on (the copier releases it), then
     * wait for a free one, until the key's deadline. */
    if (role == -ENOBUFS && !deadline)
        deadline = sfs_deadline_after(rk->key_timeout_ns);
    while (role == -ENOBUFS && sfs_now_ns() < deadline) {
        batch_flush(rk, b);
        lease_wait(rk, deadline);
        role = sfs_cache_get(rk->cache, &it->key, 0, deadline, &it->lease);
    }
    if (role < 0) {
        if (token)
            sfs_own_token_put(rk);
        sfs_item_done(it, role);
        return;
    }
    route(rk, it, b, token, role, deadline);
}

/* An item the submitting thread already Got (its inline try stopped at it,
 * or at a key after it): route it by that Get, without another. An owner
 * comes with its depth token (inline.c takes one before it keeps an
 * ownership). */
static void route_pregot(struct sfs_rank *rk, struct rank_item *it, struct load_batch *b)
{
    int role = it->pregot == PREGOT_HIT      ? SFS_HIT
               : it->pregot == PREGOT_WAITER ? SFS_WAITER
                                             : SFS_OWNER;

    it->pregot = PREGOT_NONE;
    route(rk, it, b, role == SFS_OWNER, role, 0);
}

static bool needs_no_token(int state)
{
    return state == SFS_STATE_READY || state == SFS_STATE_LOADING;
}

/* The cursor waits for a load slot (our batch is flushed): dispatch keys
 * ahead of it that need none, until a slot frees or LOOKAHEAD_PEEKS keys
 * have been peeked. The look-ahead resumes where it stopped and wraps, so
 * a key still missing now is looked at again later. True: we took a token. */
static bool look_ahead(struct sfs_rank *rk, struct walk *w)
{
    size_t n = w->t->n, left = n - w->pos - 1;
    unsigned peeks = 0;

    for (; left && peeks < LOOKAHEAD_PEEKS; left--) {
        if (w->ahead <= w->pos || w->ahead >= n)
            w->ahead = w->pos + 1;
        size_t i = w->ahead++;

        if (w->taken[i])
            continue;
        /* A slot may have come back meanwhile: our own share goes first. */
        if (peeks++ % 8 == 0 && sfs_own_token_try(rk))
            return true;

        struct rank_item *it = &w->t->items[w->order[i]];

        if (needs_no_token(sfs_cache_state(rk->cache, &it->key))) {
            w->taken[i] = true;
            get_and_route(rk, it, &w->b, false);
        }
    }
    return false;
}

/* The cursor's key: take a depth token first unless the key needs none. */
static void dispatch_load(struct sfs_rank *rk, struct walk *w, struct rank_item *it)
{
    bool token = sfs_own_token_try(rk);

    /* Depth used up: a key that is Ready or loading needs no token, so do
     * not stall behind our own loads for it. */
    if (!token && !needs_no_token(sfs_cache_state(rk->cache, &it->key))) {
        batch_flush(rk, &w->b); /* their tokens are the ones we wait for */
        token = w->taken && look_ahead(rk, w);
        if (!token) {
            hits_flush(rk, &w->b); /* the look-ahead's */
            sfs_own_token_get(rk);
        }
        token = true;
    }
    get_and_route(rk, it, &w->b, token);
}

static void dispatch_dump(struct sfs_rank *rk, struct rank_item *it)
{
    int64_t deadline = sfs_deadline_after(rk->key_timeout_ns);
    int role = sfs_cache_get(rk->cache, &it->key, SFS_GET_WRITE, deadline, &it->lease);

    if (role == -EBUSY && rk->be) {
        /* Someone reads, loads or dumps this key: copy the source now into
         * a private buffer; a worker dumps it once it can own the slot. */
        it->deadline_ns = deadline;
        it->buf = malloc(rk->shard_size);
        if (!it->buf) {
            sfs_item_done(it, -ENOMEM);
            return;
        }
        it->bounce = true;
        rank_ctr_add(rk, RC_DUMPS_BOUNCED, 1);
        if (it->task->behind)
            sfs_task_no_hold(it->task);
        it->step = STEP_COPY_IN;
        rank_push_copy(rk, it);
        return;
    }
    if (role < 0) {
        sfs_item_done(it, role);
        return;
    }
    it->leased = true;
    if (role != SFS_OWNER) { /* not expected with SFS_GET_WRITE */
        sfs_item_done(it, -EBUSY);
        return;
    }
    it->buf = sfs_cache_data(rk->cache, &it->lease);
    it->step = STEP_COPY_IN;
    rank_push_copy(rk, it);
}

static void walk_task(struct sfs_rank *rk, struct sfs_task *t)
{
    uint32_t *order = malloc(t->n * sizeof(*order));
    struct walk w = {.t = t, .order = order, .b = {.hits_max = HITS_FIRST}};

    if (order && rk->rotate) {
        sfs_rank_rearrange(t->n, rk->r, rk->N, order);
    } else if (order) {
        for (size_t i = 0; i < t->n; i++)
            order[i] = (uint32_t)i;
    }
    if (t->kind == ITEM_LOAD) {
        w.b.cap = rk->depth ? rk->depth : 1;
        w.b.ios = malloc(w.b.cap * sizeof(*w.b.ios)); /* NULL: loads go one by one */
        /* The old blocking LoadQueue (a baseline) had no look-ahead. */
        if (order && !rank_blocking_waits(rk))
            w.taken = calloc(t->n, sizeof(*w.taken)); /* NULL: none */
    }
    /* No memory for the order: natural order, still correct. */
    for (w.pos = 0; w.pos < t->n; w.pos++) {
        struct rank_item *it = &t->items[order ? order[w.pos] : w.pos];

        if (t->kind == ITEM_DUMP)
            dispatch_dump(rk, it);
        else if (it->pregot)
            route_pregot(rk, it, &w.b);
        else if (!w.taken || !w.taken[w.pos])
            dispatch_load(rk, &w, it);
    }
    batch_flush(rk, &w.b);
    free(w.b.ios);
    free(w.taken);
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
        if (sfs_workq_peek(&rk->tq))
            break;
    }
}

static void *dispatcher_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct sfs_task *last = NULL; /* holds the dispatcher reference */

    for (;;) {
        /* After a task, look without waiting: an empty queue is the idle
         * window. Stopped and drained: NULL with no last task. */
        struct sfs_wq_node *n = sfs_workq_pop(&rk->tq, last ? SFS_WQ_NOWAIT : SFS_WQ_FOREVER);
        struct sfs_task *t;

        if (!n) {
            if (!last)
                break;
            if (rk->prealloc && last->kind == ITEM_LOAD)
                idle_prealloc(rk, last);
            sfs_task_unref(last);
            last = NULL;
            continue;
        }
        t = sfs_wq_entry(n, struct sfs_task, qn);
        if (last)
            sfs_task_unref(last);
        walk_task(rk, t);
        if (t->kind == ITEM_DUMP)
            /* Release: a submitter that reads 0 (acquire) sees the keys this
             * walk took for writing, so its inline load waits for them. */
            atomic_fetch_sub_explicit(&rk->dumps_unwalked, 1, memory_order_release);
        last = t;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------
 * Start / stop.
 */

/* Start the workers, a watcher and the dispatcher. The benchmark builds
 * read the baseline switch SHARDFS_RANK_BLOCKING_WAITS: the dispatcher
 * blocks on each key another rank is loading, as the old natural-order
 * LoadQueue did (bench_rank's baseline; rank_i.h). */
int sfs_lq_start(struct sfs_rank *rk)
{
    int r;

#ifdef SFS_BENCH_BASELINES
    rk->blocking_waits = getenv("SHARDFS_RANK_BLOCKING_WAITS") != NULL;
#endif
    r = sfs_own_workers_start(rk);
    if (r)
        return r;
    r = sfs_watch_start(rk);
    if (r)
        return r;
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
        __atomic_store_n(&rk->stopping, true, __ATOMIC_RELAXED); /* peeked lock-free */
        pthread_mutex_unlock(&rk->mu);
        sfs_workq_stop(&rk->tq);
        pthread_join(rk->dispatcher, NULL);
        rk->dispatcher_started = false;
    }
    /* Watchers before workers: a watcher may hand a takeover to a worker. */
    sfs_watch_stop(rk);
    sfs_own_workers_stop(rk);
}
