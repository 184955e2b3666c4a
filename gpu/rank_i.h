/* SPDX-License-Identifier: MIT */
/*
 * rank_i.h - the private state of a rank: its task queue, the items that
 * carry one entry through dispatcher -> (backend | waiter) -> copier, and the
 * counters. Shared by rank.c (API), loadqueue.c (dispatcher, waiters,
 * backend callbacks) and copier.c (copier thread).
 *
 * Threads of a rank and what they own:
 *   dispatcher  takes tasks from `tq`, Gets every key in RearrangeIndex order,
 *               submits owner loads, runs Prealloc in the idle window;
 *   watchers    each sleeps in one sfs_cache_wait_any_bell() on a set of up
 *               to SFS_WAIT_ANY_MAX keys other ranks load and on its doorbell
 *               (rung when it is given a new key), and hands each key to the
 *               copier as soon as it settles; started on demand;
 *   workers     submit dumps (a posix dump runs in the submitter's thread)
 *               and loads taken over from dead owners (they may block on a
 *               depth token, which a watcher must never do);
 *   copier      copies Ready shards to destinations in batches, releases;
 *   backend     its own threads call load_done()/dump_done().
 * An item is owned by exactly one of them at a time: whoever took it off a
 * queue (or the backend, between submit and done).
 */
#ifndef SHARDFS_RANK_I_H
#define SHARDFS_RANK_I_H

#include <shardfs/backend.h>
#include <shardfs/rank.h>

#include "copier_i.h"

#include <pthread.h>
#include <stdatomic.h>

enum item_kind {
    ITEM_LOAD = 0,
    ITEM_DUMP = 1,
    ITEM_PREFETCH = 2,
};

enum item_step {
    STEP_COPY_OUT = 0,    /* Ready in the cache: copier copies slot -> addr */
    STEP_COPY_IN = 1,     /* dump: copier copies addr -> slot (or bounce) */
    STEP_WAIT = 2,        /* another rank loads it: a watcher sleeps on it */
    STEP_DUMP_SUBMIT = 3, /* dump: copied in, a worker submits it */
    STEP_TAKEOVER = 4,    /* a wait made us owner (dead owner): a worker loads it */
};

struct sfs_task;
struct sfs_rank;
struct sfs_watcher;

/* One entry in flight. */
struct rank_item {
    struct rank_item *next; /* in one queue at a time */
    struct sfs_rank *rank;
    struct sfs_task *task; /* NULL for prefetch */
    uint32_t idx;          /* entry index in the task */
    uint8_t kind;          /* enum item_kind */
    uint8_t step;          /* enum item_step */
    bool leased;
    bool bounce; /* dump through a private buffer (key leased elsewhere) */
    struct sfs_key key;
    struct sfs_lease lease;
    void *buf;           /* the slot's bytes, or the bounce buffer */
    void *addr;          /* the entry's destination (load) or source (dump) */
    int64_t deadline_ns; /* STEP_WAIT, or a bounced dump taking its slot: when it gives up
                            (-ETIMEDOUT) */
    struct sfs_io io;
};

struct item_queue {
    struct rank_item *head, *tail;
};

/* Append the chain head..tail (linked by ->next) to q; the caller holds
 * whatever guards q. */
static inline void item_queue_append(struct item_queue *q, struct rank_item *head,
                                     struct rank_item *tail)
{
    tail->next = NULL;
    if (q->tail)
        q->tail->next = head;
    else
        q->head = head;
    q->tail = tail;
}

struct sfs_task {
    struct sfs_rank *rank;
    struct sfs_task *next; /* rank->tq, under rank->mu */
    int kind;              /* ITEM_LOAD or ITEM_DUMP */
    size_t n;
    struct sfs_rank_entry *entries;
    struct rank_item *items;
    int *status; /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC; signalled when pending reaches 0 */
    size_t pending;    /* under mu: entries not done */
    int refs;          /* under mu: user + dispatcher + completion */
};

enum rank_ctr {
    RC_TASKS,
    RC_ENTRIES,
    RC_HITS,
    RC_OWNER_LOADS,
    RC_TAKEOVERS,
    RC_WAITS,
    RC_DUMPS,
    RC_DUMPS_BOUNCED,
    RC_FAILED,
    RC_COPIES,
    RC_COPY_BATCHES,
    RC_BYTES_COPIED,
    RC_PREALLOC,
    RC_PREFETCHED,
    RC_COUNT
};

struct sfs_rank {
    struct sfs_cache *cache;
    struct sfs_backend *be;    /* NULL: no backend */
    struct sfs_copier *copier; /* NULL in the scheduler role */
    uint64_t shard_size;
    unsigned r, N; /* RearrangeIndex: r = device_id % N */
    unsigned depth;
    unsigned nworkers;
    bool rotate;
    bool blocking_waits;
    bool prealloc;
    bool query_only;
    int64_t key_timeout_ns;

    /* Task queue and lifetime. */
    pthread_mutex_t mu;
    pthread_cond_t task_cv;             /* dispatcher: a task arrived, or stopping */
    pthread_cond_t idle_cv;             /* close: active reached 0 */
    struct sfs_task *tq_head, *tq_tail; /* under mu */
    size_t active;                      /* under mu: tasks not complete + prefetches in flight */
    bool stopping;                      /* under mu */

    /* Items ready to copy (copier thread). */
    pthread_mutex_t ready_mu;
    pthread_cond_t ready_cv;
    struct item_queue ready; /* under ready_mu */
    bool copier_stop;        /* under ready_mu */

    /* Keys to watch (watcher threads, see loadqueue.c). Each watcher has
     * its own inbox and doorbell; a push goes to the first with room and
     * rings its bell, so no watcher polls. */
    pthread_mutex_t wait_mu;
    struct sfs_watcher *watchers; /* [WATCHERS_MAX]; inboxes and loads under wait_mu */
    unsigned nwatchers;           /* under wait_mu: started */
    struct item_queue overflow;   /* under wait_mu: STEP_WAIT items no set had room for */
    bool watchers_stop;           /* under wait_mu */
    bool wait_compat;             /* watch as without futex_waitv (tests) */

    /* Dumps to submit and takeover loads (worker threads). */
    pthread_mutex_t work_mu;
    pthread_cond_t work_cv;
    struct item_queue workq; /* under work_mu */
    bool workers_stop;       /* under work_mu */

    /* Backend requests in flight: at most `depth`. Taken and returned
     * without a lock (a resident key takes one and gives it back at once);
     * depth_mu and depth_cv only for the dispatcher waiting for one. */
    pthread_mutex_t depth_mu;
    pthread_cond_t depth_cv;
    _Atomic unsigned inflight;
    _Atomic unsigned max_inflight;
    _Atomic unsigned token_waiters;

    /* The dispatcher waits here when this process holds every lease the
     * cache allows it (-ENOBUFS); items signal when they release one. */
    pthread_mutex_t lease_mu;
    pthread_cond_t lease_cv;
    _Atomic unsigned lease_waiters;

    pthread_t dispatcher;
    pthread_t copier_thread;
    struct sfs_releaser *releaser; /* copier.c; NULL: none */
    pthread_t *worker_threads;
    unsigned nworker_threads; /* started */
    bool dispatcher_started, copier_started;

    /* The daemon link (rank.c). A thread polls the attach connection; when
     * the daemon goes away it sets link_lost and wakes the watchers and the
     * dispatcher, which fail what they hold with -ESHUTDOWN. The next call
     * re-attaches under link_rw held for writing; calls that use `cache`
     * hold it for reading. */
    pthread_rwlock_t link_rw;
    _Atomic bool link_lost;
    bool down;        /* link_rw (write): threads stopped, no cache; re-attach pending */
    int link_stop_fd; /* eventfd: stops the link thread */
    pthread_t link_thread;
    bool link_started;
    char *socket_path; /* as configured (one of the two) */
    char *mount_point;
    int device_id;
    int copier_mode;

    /* Relaxed counters: single numbers, read by sfs_rank_stats(). */
    _Atomic uint64_t ctr[RC_COUNT];
};

static inline void rank_ctr_add(struct sfs_rank *rk, enum rank_ctr c, uint64_t v)
{
    /* Relaxed: statistics only. */
    atomic_fetch_add_explicit(&rk->ctr[c], v, memory_order_relaxed);
}

/* The core's logger (util.c, linked into this library). */
void sfs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* loadqueue.c */
int sfs_lq_start(struct sfs_rank *rk);
void sfs_lq_stop(struct sfs_rank *rk);
void sfs_lq_push_work(struct sfs_rank *rk, struct rank_item *it);
void sfs_lq_item_done(struct rank_item *it, int status);
void sfs_lq_token_put(struct sfs_rank *rk);
bool sfs_lq_token_try(struct sfs_rank *rk);
int sfs_lq_submit_load(struct rank_item *it);
void sfs_lq_dump_copied(struct rank_item *it);
void sfs_lq_task_unref(struct sfs_task *t);
/* The daemon is gone: wake every watcher (its set fails with -ESHUTDOWN)
 * and a dispatcher waiting for a lease. */
void sfs_lq_link_lost(struct sfs_rank *rk);

static inline bool rank_link_lost(struct sfs_rank *rk)
{
    /* Acquire: pairs with the link thread's release store. */
    return atomic_load_explicit(&rk->link_lost, memory_order_acquire);
}

/* copier.c */
int sfs_copier_start(struct sfs_rank *rk);
void sfs_copier_stop(struct sfs_rank *rk);
void sfs_copier_push(struct sfs_rank *rk, struct rank_item *it);
void sfs_copier_push_chain(struct sfs_rank *rk, struct rank_item *head, struct rank_item *tail);

#endif /* SHARDFS_RANK_I_H */
