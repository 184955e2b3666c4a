/* SPDX-License-Identifier: MIT */
/*
 * wait.c - readers that wait for another's load hold no FUSE worker.
 *
 * A read that finds its shard Loading (another reader of the mount, a
 * readahead, or an attached rank fills it) used to sleep on the slot's futex
 * in its worker thread until the owner published. Eighty readers of one slow
 * shard then held every worker, and a read of a resident shard waited seconds
 * for a free one. Now the handler parks the request here and returns to the
 * loop without replying (the low-level API lets a request be answered later
 * from any thread); one thread, the settler, sleeps on the futexes of the
 * parked slots at once (sfs_cache_wait_any_bell: futex_waitv, at most
 * SFS_WAIT_ANY_MAX slots per sleep) and answers each request when its slot
 * settles: Ready (the bytes), Failed (the error), the owner gone (the request
 * becomes owner and loads), its deadline (ETIMEDOUT) or the session's end
 * (EIO). Answering is a copy out of the data plane, never a wait, so one
 * thread serves every parked reader.
 *
 * Key idea: a park rings a doorbell the settler sleeps on, so a new slot
 * joins its set at once; each wake sweeps the parked list (a non-blocking
 * look at each slot), so the cost of a wake is bounded by the parked
 * requests, themselves bounded by what the kernel has in flight. More than
 * SFS_WAIT_ANY_MAX distinct slots parked: the ones outside the set are looked
 * at every OVERFLOW_POLL_NS.
 */
#include "fs_i.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define STOP_POLL_NS     (100 * 1000 * 1000ll) /* how often the settler looks for a stop */
#define OVERFLOW_POLL_NS (5 * 1000 * 1000ll)   /* slots beyond one futex_waitv set */

/* A read parked until its slot settles; owned by the list, then by the
 * settler once taken off it. */
struct fs_waiter {
    fuse_req_t req;
    fuse_ino_t ino; /* its inode when read through the page cache, else 0 */
    struct sfs_key key;
    struct sfs_lease lease; /* the waiter's own, from its Get */
    off_t off;
    size_t size;
    int64_t deadline; /* CLOCK_MONOTONIC ns: ETIMEDOUT after */
    int result;       /* what the sweep found (settler only) */
    int64_t start_ns; /* parked (the wait histogram) */
    struct fs_waiter *next;
};

/* Non-blocking: has l's slot settled? What sfs_cache_wait() returns, or 0
 * while it is still Loading and the waiter may go on waiting. */
static int look(struct fs *fs, struct fs_waiter *w, bool stop, int64_t now)
{
    int r = sfs_cache_wait(fs->cache, &w->lease, 1 /* a deadline long past: do not sleep */);

    if (r != -ETIMEDOUT)
        return r;
    if (stop)
        return -ESHUTDOWN;
    if (now >= w->deadline)
        return -ETIMEDOUT;
    return 0;
}

/* Take w off the parked list and answer it with the outcome r. Settler
 * only. */
static void settle_now(struct fs *fs, struct fs_waiter *w, int r)
{
    struct fs_waitq *q = &fs->waitq;

    pthread_mutex_lock(&q->lock);
    for (struct fs_waiter **pp = &q->head; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            q->n--;
            break;
        }
    }
    pthread_mutex_unlock(&q->lock);
    sfs_cache_observe(fs->cache, SFS_HIST_WAIT, sfs_now_ns() - w->start_ns);
    fs_read_settled(fs, w->req, w->ino, &w->key, &w->lease, w->off, w->size, r);
    free(w);
}

static void *settler_main(void *arg)
{
    struct fs *fs = arg;
    struct fs_waitq *q = &fs->waitq;
    struct sfs_lease set[SFS_WAIT_ANY_MAX];
    struct fs_waiter *who[SFS_WAIT_ANY_MAX]; /* whose lease set[i] is */

    for (;;) {
        /* Read the bell before the sweep: a park after this point rings a
         * value we have not seen, and the wait returns at once. Acquire:
         * pairs with sfs_bell_ring's release after the list was updated. */
        uint32_t seen = __atomic_load_n(&q->bell, __ATOMIC_ACQUIRE);
        struct fs_waiter *done = NULL, **pp;
        int64_t now = sfs_now_ns(), until = now + STOP_POLL_NS;
        bool stop, exit_now, overflow = false;
        size_t n = 0;
        int state;

        pthread_mutex_lock(&q->lock);
        stop = q->stop || fs_stopping(fs);
        for (pp = &q->head; *pp;) {
            struct fs_waiter *w = *pp;
            bool dup = false;

            w->result = look(fs, w, stop, now);
            if (w->result != 0) {
                *pp = w->next;
                q->n--;
                w->next = done;
                done = w;
                continue;
            }
            pp = &w->next;
            if (w->deadline < until)
                until = w->deadline;
            /* Many readers of one shard share one futex: one entry. */
            for (size_t i = 0; i < n && !dup; i++)
                dup = set[i].slot == w->lease.slot;
            if (dup)
                continue;
            if (n < SFS_WAIT_ANY_MAX) {
                who[n] = w;
                set[n++] = w->lease;
            } else {
                overflow = true;
            }
        }
        exit_now = q->stop && !q->head;
        pthread_mutex_unlock(&q->lock);

        while (done) {
            struct fs_waiter *w = done;

            done = w->next;
            fs_read_settled(fs, w->req, w->ino, &w->key, &w->lease, w->off, w->size, w->result);
            free(w);
        }
        if (exit_now)
            break;
        fs_loads_expire(fs, sfs_now_ns()); /* an owner's read has the same deadline */
        if (overflow && until > now + OVERFLOW_POLL_NS)
            until = now + OVERFLOW_POLL_NS;
        int i = sfs_cache_wait_any_bell(fs->cache, set, n, until, &state, &q->bell, seen);

        /* The wait may have taken a dead owner's slot over for who[i]: that
         * is no look the next sweep can repeat (the slot is Loading under
         * us, alive), so who[i] is answered now, whatever the outcome.
         * Only this thread takes waiters off the list: who[i] is on it. */
        if (i >= 0 && (size_t)i < n)
            settle_now(fs, who[i], state);
    }
    return NULL;
}

int fs_waitq_start(struct fs *fs)
{
    struct fs_waitq *q = &fs->waitq;
    sigset_t all, old;
    int e;

    pthread_mutex_init(&q->lock, NULL);
    q->head = NULL;
    q->n = 0;
    q->stop = false;
    q->bell = 0;
    /* The settler takes no signals: the session's thread does. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    e = pthread_create(&q->thread, NULL, settler_main, fs);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        pthread_mutex_destroy(&q->lock);
        return -e;
    }
    q->started = true;
    return 0;
}

void fs_waitq_stop(struct fs *fs)
{
    struct fs_waitq *q = &fs->waitq;

    if (!q->started)
        return;
    pthread_mutex_lock(&q->lock);
    q->stop = true;
    pthread_mutex_unlock(&q->lock);
    sfs_bell_ring(&q->bell);
    pthread_join(q->thread, NULL); /* its last sweep answered every parked read (EIO) */
    pthread_mutex_destroy(&q->lock);
    q->started = false;
}

void fs_waitq_park(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                   const struct sfs_lease *lease, off_t off, size_t size, int64_t deadline)
{
    struct fs_waitq *q = &fs->waitq;
    struct fs_waiter *w = malloc(sizeof(*w));
    bool stopped;

    if (w) {
        *w = (struct fs_waiter){.req = req,
                                .ino = ino,
                                .key = *key,
                                .lease = *lease,
                                .off = off,
                                .size = size,
                                .deadline = deadline,
                                .start_ns = sfs_now_ns()};
    }
    pthread_mutex_lock(&q->lock);
    stopped = q->stop || !q->started;
    if (w && !stopped) {
        w->next = q->head;
        q->head = w;
        q->n++;
    }
    pthread_mutex_unlock(&q->lock);
    if (!w || stopped) {
        free(w);
        fs_read_settled(fs, req, ino, key, lease, off, size, w ? -ESHUTDOWN : -ENOMEM);
        return;
    }
    sfs_bell_ring(&q->bell);
}
