/* SPDX-License-Identifier: MIT */
/*
 * workq.c - the rank library's work queue (see workq_i.h): one mutex, one
 * CLOCK_MONOTONIC condition variable, an intrusive FIFO and a stop flag.
 *
 * Key idea: a consumer's wait is a re-check loop on "something queued, or
 * stopped", so a spurious wake-up or a stolen item costs one more turn,
 * never a lost item; the stop wakes every consumer and leaves the queued
 * items to be drained.
 */
#include "workq_i.h"

#include <errno.h>
#include <time.h>

int sfs_workq_init(struct sfs_workq *q)
{
    pthread_condattr_t ca;
    int r;

    q->fifo.head = q->fifo.tail = NULL;
    q->stop = false;
    r = pthread_mutex_init(&q->mu, NULL);
    if (r)
        return -r;
    r = pthread_condattr_init(&ca);
    if (r == 0) {
        r = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        if (r == 0)
            r = pthread_cond_init(&q->cv, &ca);
        pthread_condattr_destroy(&ca);
    }
    if (r) {
        pthread_mutex_destroy(&q->mu);
        return -r;
    }
    return 0;
}

void sfs_workq_destroy(struct sfs_workq *q)
{
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mu);
}

void sfs_workq_push_chain(struct sfs_workq *q, struct sfs_wq_node *head, struct sfs_wq_node *tail)
{
    pthread_mutex_lock(&q->mu);
    sfs_fifo_append(&q->fifo, head, tail);
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

/* mu held: wait until something is queued, the stop, or the deadline.
 * True when something is queued. */
static bool wait_nonempty(struct sfs_workq *q, int64_t deadline_ns)
{
    struct timespec ts = {
        .tv_sec = deadline_ns / 1000000000,
        .tv_nsec = deadline_ns % 1000000000,
    };

    while (sfs_fifo_empty(&q->fifo) && !q->stop) {
        if (deadline_ns == SFS_WQ_FOREVER)
            pthread_cond_wait(&q->cv, &q->mu);
        else if (deadline_ns <= 0 ||
                 pthread_cond_timedwait(&q->cv, &q->mu, &ts) == ETIMEDOUT)
            break;
    }
    return !sfs_fifo_empty(&q->fifo);
}

/* One node, or (all) every node queued, once something is queued. */
static struct sfs_wq_node *pop(struct sfs_workq *q, int64_t deadline_ns, bool all)
{
    struct sfs_wq_node *n = NULL;

    pthread_mutex_lock(&q->mu);
    if (wait_nonempty(q, deadline_ns))
        n = all ? sfs_fifo_take_all(&q->fifo) : sfs_fifo_pop(&q->fifo);
    pthread_mutex_unlock(&q->mu);
    return n;
}

struct sfs_wq_node *sfs_workq_pop(struct sfs_workq *q, int64_t deadline_ns)
{
    return pop(q, deadline_ns, false);
}

struct sfs_wq_node *sfs_workq_pop_all(struct sfs_workq *q, int64_t deadline_ns)
{
    return pop(q, deadline_ns, true);
}

void sfs_workq_stop(struct sfs_workq *q)
{
    pthread_mutex_lock(&q->mu);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void sfs_workq_restart(struct sfs_workq *q)
{
    pthread_mutex_lock(&q->mu);
    q->stop = false;
    pthread_mutex_unlock(&q->mu);
}
