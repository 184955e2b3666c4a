/* SPDX-License-Identifier: MIT */
/*
 * workq_i.h - the one queue type of the rank library: an intrusive FIFO
 * (struct sfs_fifo, unlocked, the caller guards it) and a work queue around
 * it (struct sfs_workq: mutex + condition variable + FIFO + stop).
 *
 * Key idea: a queued object embeds a struct sfs_wq_node and is linked
 * through it, so a push never allocates and a chain of objects already
 * linked (a run of hits) is appended with one lock and one wake. A consumer
 * pops one node or everything queued, waiting until a deadline, forever, or
 * not at all; after sfs_workq_stop() consumers still drain what is queued
 * and then get NULL, so nothing pushed before the stop is lost.
 *
 * Used by the task queue (dispatcher), the ready queue (copier), the work
 * queue (workers) and the releaser's queue. The watchers' inboxes are bare
 * FIFOs under their own lock: a watcher sleeps in futex_waitv on its keys
 * and a doorbell, not on a condition variable.
 */
#ifndef SHARDFS_WORKQ_I_H
#define SHARDFS_WORKQ_I_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sfs_wq_node {
    struct sfs_wq_node *next; /* in one queue at a time */
};

/* The object of type `type` whose member `member` is `node` (not NULL). */
#define sfs_wq_entry(node, type, member) ((type *)((char *)(node) - offsetof(type, member)))

/* ---------------------------------------------------------------------------
 * The bare FIFO: whoever uses one holds what guards it.
 */

struct sfs_fifo {
    struct sfs_wq_node *head, *tail;
};

/* Append the chain head..tail (linked by ->next). */
static inline void sfs_fifo_append(struct sfs_fifo *q, struct sfs_wq_node *head,
                                   struct sfs_wq_node *tail)
{
    tail->next = NULL;
    if (q->tail)
        q->tail->next = head;
    else
        /* Relaxed: sfs_workq_peek() reads head without the lock (a hint). */
        __atomic_store_n(&q->head, head, __ATOMIC_RELAXED);
    q->tail = tail;
}

static inline void sfs_fifo_push(struct sfs_fifo *q, struct sfs_wq_node *n)
{
    sfs_fifo_append(q, n, n);
}

/* The first node, unlinked; NULL when empty. */
static inline struct sfs_wq_node *sfs_fifo_pop(struct sfs_fifo *q)
{
    struct sfs_wq_node *n = q->head;

    if (!n)
        return NULL;
    __atomic_store_n(&q->head, n->next, __ATOMIC_RELAXED); /* relaxed: see append */
    if (!q->head)
        q->tail = NULL;
    return n;
}

/* Everything queued, as a NULL-terminated chain; the FIFO is left empty. */
static inline struct sfs_wq_node *sfs_fifo_take_all(struct sfs_fifo *q)
{
    struct sfs_wq_node *n = q->head;

    __atomic_store_n(&q->head, NULL, __ATOMIC_RELAXED); /* relaxed: see append */
    q->tail = NULL;
    return n;
}

static inline bool sfs_fifo_empty(const struct sfs_fifo *q)
{
    return q->head == NULL;
}

/* ---------------------------------------------------------------------------
 * The work queue.
 */

struct sfs_workq {
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* CLOCK_MONOTONIC: a push, or the stop */
    struct sfs_fifo fifo; /* under mu */
    bool stop;            /* under mu */
};

/* Deadlines of a pop: CLOCK_MONOTONIC ns (sfs_now_ns()), or one of these. */
#define SFS_WQ_FOREVER INT64_MAX /* wait until a push or the stop */
#define SFS_WQ_NOWAIT  0         /* take what is there, never sleep */

/* 0 or -errno (pthread's). */
int sfs_workq_init(struct sfs_workq *q);
/* Nothing may use q any more; nodes still queued are the caller's. */
void sfs_workq_destroy(struct sfs_workq *q);

/* Append a chain head..tail (linked by ->next, or one node: head == tail)
 * and wake one consumer. A push after the stop is still queued (and
 * drained): the caller decides whether to push, under its own lock. */
void sfs_workq_push_chain(struct sfs_workq *q, struct sfs_wq_node *head, struct sfs_wq_node *tail);

static inline void sfs_workq_push(struct sfs_workq *q, struct sfs_wq_node *n)
{
    sfs_workq_push_chain(q, n, n);
}

/* The first node, waiting for one until `deadline_ns` (bounded by it: one
 * timed wait per wake-up, the re-check loop ends at the deadline). NULL:
 * nothing came by the deadline, or the queue is stopped and empty. */
struct sfs_wq_node *sfs_workq_pop(struct sfs_workq *q, int64_t deadline_ns);

/* As sfs_workq_pop(), but everything queued at once, as a NULL-terminated
 * chain (one lock for a run of items). */
struct sfs_wq_node *sfs_workq_pop_all(struct sfs_workq *q, int64_t deadline_ns);

/* Stop: every consumer wakes; pops drain what is queued, then return NULL. */
void sfs_workq_stop(struct sfs_workq *q);
/* Undo the stop, once every consumer has ended and the queue is drained
 * (a rank's threads restarting after its daemon came back). */
void sfs_workq_restart(struct sfs_workq *q);

/* A hint without the lock: is anything queued? (May be stale at once.) */
static inline bool sfs_workq_peek(struct sfs_workq *q)
{
    return __atomic_load_n(&q->fifo.head, __ATOMIC_RELAXED) != NULL; /* relaxed: a hint */
}

#endif /* SHARDFS_WORKQ_I_H */
