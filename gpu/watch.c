/* SPDX-License-Identifier: MIT */
/*
 * watch.c - the watchers of a rank: threads that sleep on the keys other
 * ranks are loading and hand each one on the moment it settles.
 *
 * A watcher owns a set of up to SFS_WAIT_ANY_MAX waiting items and sleeps in
 * one sfs_cache_wait_any_bell() on all of them (futex_waitv on their version
 * words): whichever settles first is handed on at once (Ready -> copier,
 * Failed -> the owner's error, owner -> a worker loads it), so no key waits
 * behind another.
 *
 * Joining: each watcher has its own inbox and a doorbell, a private futex
 * word that the same futex_waitv sleeps on. sfs_watch_push() gives a new item to
 * the first watcher with room (its `load`: set + inbox, below
 * SFS_WAIT_ANY_MAX), then rings its bell (or signals it if it is idle, with
 * an empty set); the watcher reads its bell before it looks at its inbox, so
 * a ring after that look always wakes it, and it takes the inbox whenever
 * the wait returns n. Otherwise it sleeps until the first deadline of its
 * set, at ~0 CPU. When every watcher is full, a push starts another one (at
 * most WATCHERS_MAX); past that, items go to a shared overflow queue that
 * any watcher drains into its set when it has room.
 *
 * Without futex_waitv (the wait returns -ENOSYS) a watcher watches its keys
 * in WATCH_SLICE_NS slices and looks at its bell between slices.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#define WATCH_SLICE_NS (2 * 1000 * 1000ll) /* futex_waitv-less kernels only */
#define WATCHERS_MAX   64                  /* x SFS_WAIT_ANY_MAX keys = 8192 keys asleep at once */

struct sfs_watcher {
    struct sfs_rank *rk;
    pthread_t thread;
    pthread_cond_t cv;       /* idle (empty set): inbox non-empty, or stopping */
    struct sfs_fifo inbox;   /* under wait_mu: given to this watcher, not in its set yet */
    unsigned load;           /* under wait_mu: set (as of its last look) + inbox */
    bool idle;               /* under wait_mu: in pthread_cond_wait on cv */
    uint32_t bell;           /* sfs_bell_ring() after a push to a non-idle watcher */
};

struct watch_set {
    size_t n;
    struct rank_item *items[SFS_WAIT_ANY_MAX];
    struct sfs_lease leases[SFS_WAIT_ANY_MAX];
};

static void set_remove(struct watch_set *ws, size_t i)
{
    ws->n--;
    ws->items[i] = ws->items[ws->n];
    ws->leases[i] = ws->leases[ws->n];
}

/* Move the first item of q (not empty) into the set. */
static void set_add(struct watch_set *ws, struct sfs_fifo *q)
{
    struct rank_item *it = item_of(sfs_fifo_pop(q));

    ws->items[ws->n] = it;
    ws->leases[ws->n] = it->lease;
    ws->n++;
}

/* A wait on `it` ended with `r` as sfs_cache_wait() returns it: hand it on
 * (Ready -> copier; Failed, or an error -> done). True when the wait made
 * it owner (a dead owner's key): the caller loads it, or has a worker do it
 * (loading may block on a depth token, which a watcher must never do). */
bool sfs_watch_settled(struct sfs_rank *rk, struct rank_item *it, int r)
{
    sfs_cache_observe(rk->cache, SFS_HIST_WAIT, sfs_now_ns() - it->start_ns);
    switch (r) {
    case SFS_WAIT_READY:
        it->step = STEP_COPY_OUT;
        rank_push_copy(rk, it);
        return false;
    case SFS_WAIT_OWNER:
        return true;
    default: /* Failed, or the wait's -errno */
        sfs_item_done(it, sfs_cache_wait_errno(rk->cache, &it->lease, r));
        return false;
    }
}

/* A watcher's key settled: hand it on; a takeover goes to a worker. */
static void settled(struct sfs_rank *rk, struct rank_item *it, int r)
{
    if (sfs_watch_settled(rk, it, r)) {
        it->step = STEP_TAKEOVER;
        rank_push_work(rk, it);
    }
}

static void *watcher_main(void *arg);

/* wait_mu held: start one more watcher. NULL when the thread cannot start. */
static struct sfs_watcher *start_watcher(struct sfs_rank *rk)
{
    struct sfs_watcher *w = &rk->watchers[rk->nwatchers];
    int r;

    memset(w, 0, sizeof(*w));
    w->rk = rk;
    r = pthread_cond_init(&w->cv, NULL);
    if (r == 0) {
        r = pthread_create(&w->thread, NULL, watcher_main, w);
        if (r)
            pthread_cond_destroy(&w->cv);
    }
    if (r) {
        sfs_log(LOG_WARNING, "rank: cannot start a watcher thread: %s", strerror(r));
        return NULL;
    }
    rk->nwatchers++;
    return w;
}

/* Give a STEP_WAIT item to a watcher (the dispatcher). */
void sfs_watch_push(struct sfs_rank *rk, struct rank_item *it)
{
    struct sfs_watcher *w = NULL;
    bool ring = false;

    pthread_mutex_lock(&rk->wait_mu);
    for (unsigned i = 0; i < rk->nwatchers && !w; i++)
        if (rk->watchers[i].load < SFS_WAIT_ANY_MAX)
            w = &rk->watchers[i];
    if (!w && rk->nwatchers < WATCHERS_MAX)
        w = start_watcher(rk);
    if (!w) {
        /* Every set is full: the first watcher with room takes it. */
        sfs_fifo_push(&rk->overflow, &it->qn);
        pthread_mutex_unlock(&rk->wait_mu);
        return;
    }
    /* A non-empty inbox already has a ring (or a signal) on its way. */
    ring = sfs_fifo_empty(&w->inbox);
    sfs_fifo_push(&w->inbox, &it->qn);
    w->load++;
    if (w->idle) {
        pthread_cond_signal(&w->cv);
        ring = false;
    }
    pthread_mutex_unlock(&rk->wait_mu);
    if (ring)
        sfs_bell_ring(&w->bell); /* watchers live until sfs_watch_stop() */
}

/*
 * sfs_cache_wait_any_bell() for kernels without futex_waitv (before 5.16):
 * look at every key without sleeping, then at the bell, then sleep on one
 * key, in turn, for a slice. A key other than the one slept on, and a ring,
 * are seen within a slice.
 */
static int wait_any_compat(struct sfs_cache *c, const struct watch_set *ws, int64_t deadline,
                           int *state, size_t *turn, uint32_t *bell, uint32_t bell_seen)
{
    for (;;) {
        for (size_t i = 0; i < ws->n; i++) {
            int r = sfs_cache_wait(c, &ws->leases[i], 1); /* long past: no sleep */

            if (r != -ETIMEDOUT) {
                *state = r;
                return (int)i;
            }
        }
        if (__atomic_load_n(bell, __ATOMIC_ACQUIRE) != bell_seen)
            return (int)ws->n;
        int64_t now = sfs_now_ns();

        if (now >= deadline)
            return -ETIMEDOUT;
        int64_t d = now + WATCH_SLICE_NS < deadline ? now + WATCH_SLICE_NS : deadline;
        size_t j = (*turn)++ % ws->n;
        int r = sfs_cache_wait(c, &ws->leases[j], d);

        if (r != -ETIMEDOUT) {
            *state = r;
            return (int)j;
        }
    }
}

static void *watcher_main(void *arg)
{
    struct sfs_watcher *w = arg;
    struct sfs_rank *rk = w->rk;
    struct watch_set ws = {.n = 0};
    bool compat = rk->wait_compat;
    size_t turn = 0;

    pthread_mutex_lock(&rk->wait_mu);
    for (;;) {
        /* Acquire, before looking at the inbox: a push after this look
         * rings after it, and the wait below returns n at once. */
        uint32_t seen = __atomic_load_n(&w->bell, __ATOMIC_ACQUIRE);

        /* The inbox always fits: sfs_watch_push() keeps load <= the maximum. */
        while (ws.n < SFS_WAIT_ANY_MAX && !sfs_fifo_empty(&w->inbox))
            set_add(&ws, &w->inbox);
        while (ws.n < SFS_WAIT_ANY_MAX && !sfs_fifo_empty(&rk->overflow))
            set_add(&ws, &rk->overflow);
        w->load = (unsigned)ws.n;
        if (ws.n > 0 && rank_link_lost(rk)) {
            /* The daemon is gone: an owner that dies now is never reaped,
             * so these waits could only end at their deadlines. */
            pthread_mutex_unlock(&rk->wait_mu);
            while (ws.n > 0) {
                struct rank_item *it = ws.items[ws.n - 1];

                set_remove(&ws, ws.n - 1);
                sfs_item_done(it, -ESHUTDOWN);
            }
            pthread_mutex_lock(&rk->wait_mu);
            continue;
        }
        if (ws.n == 0) {
            if (rk->watchers_stop)
                break;
            w->idle = true;
            pthread_cond_wait(&w->cv, &rk->wait_mu);
            w->idle = false;
            continue;
        }
        pthread_mutex_unlock(&rk->wait_mu);

        int64_t first = ws.items[0]->deadline_ns;
        for (size_t i = 1; i < ws.n; i++)
            if (ws.items[i]->deadline_ns < first)
                first = ws.items[i]->deadline_ns;
        int st = 0, i = -ETIMEDOUT;

        if (first > sfs_now_ns()) {
            if (!compat) {
                i = sfs_cache_wait_any_bell(rk->cache, ws.leases, ws.n, first, &st, &w->bell, seen);
                if (i == -ENOSYS) {
                    sfs_log(LOG_WARNING, "rank: no futex_waitv: watching keys in slices");
                    compat = true;
                }
            }
            if (compat)
                i = wait_any_compat(rk->cache, &ws, first, &st, &turn, &w->bell, seen);
        }
        if (i == (int)ws.n) {
            /* The bell: new items in the inbox. */
        } else if (i >= 0) {
            struct rank_item *it = ws.items[i];

            set_remove(&ws, (size_t)i);
            settled(rk, it, st);
        } else if (i == -ETIMEDOUT) {
            int64_t now = sfs_now_ns();

            for (size_t k = ws.n; k-- > 0;) {
                struct rank_item *it = ws.items[k];

                if (it->deadline_ns <= now) {
                    set_remove(&ws, k);
                    sfs_item_done(it, -ETIMEDOUT);
                }
            }
        } else {
            /* Any other error fails the whole set, never retried in a loop:
             * -EBADMSG (a leased slot in a state no leased slot can be in:
             * a bad write to shared memory), an unexpected errno from
             * futex_waitv, -ENOSYS before Linux 5.16, or -EINVAL (a lease
             * that is not ours: a bug). */
            sfs_log(LOG_ERR, "rank: sfs_cache_wait_any_bell: %d", i);
            while (ws.n > 0) {
                struct rank_item *it = ws.items[ws.n - 1];

                set_remove(&ws, ws.n - 1);
                sfs_item_done(it, i);
            }
        }
        pthread_mutex_lock(&rk->wait_mu);
    }
    pthread_mutex_unlock(&rk->wait_mu);
    return NULL;
}


/* Start the first watcher (more start when keys need them). The test build
 * reads the hook SHARDFS_RANK_WAIT_COMPAT: watch as on a kernel without
 * futex_waitv. */
int sfs_watch_start(struct sfs_rank *rk)
{
    int r;

    rk->watchers = calloc(WATCHERS_MAX, sizeof(*rk->watchers));
    if (!rk->watchers)
        return -ENOMEM;
#ifdef SFS_TEST_HOOKS
    rk->wait_compat = getenv("SHARDFS_RANK_WAIT_COMPAT") != NULL;
#endif
    pthread_mutex_lock(&rk->wait_mu);
    r = start_watcher(rk) ? 0 : -EAGAIN;
    pthread_mutex_unlock(&rk->wait_mu);
    return r;
}

/* The dispatcher is gone (no new keys) and every set is empty (every task
 * completed): join the watchers. */
void sfs_watch_stop(struct sfs_rank *rk)
{
    unsigned n;

    if (!rk->watchers)
        return;
    pthread_mutex_lock(&rk->wait_mu);
    rk->watchers_stop = true;
    for (unsigned i = 0; i < rk->nwatchers; i++)
        pthread_cond_signal(&rk->watchers[i].cv); /* every set is empty by now */
    n = rk->nwatchers;                            /* none start once the dispatcher is gone */
    pthread_mutex_unlock(&rk->wait_mu);
    for (unsigned i = 0; i < n; i++) {
        pthread_join(rk->watchers[i].thread, NULL);
        pthread_cond_destroy(&rk->watchers[i].cv);
    }
    rk->nwatchers = 0;
    free(rk->watchers);
    rk->watchers = NULL;
}

void sfs_watch_wake_all(struct sfs_rank *rk)
{
    pthread_mutex_lock(&rk->wait_mu);
    for (unsigned i = 0; i < rk->nwatchers; i++) {
        struct sfs_watcher *w = &rk->watchers[i];

        if (w->idle)
            pthread_cond_signal(&w->cv);
        else
            sfs_bell_ring(&w->bell);
    }
    pthread_mutex_unlock(&rk->wait_mu);
}
