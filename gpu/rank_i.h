/* SPDX-License-Identifier: MIT */
/*
 * rank_i.h - the private state of a rank: its task queue, the items that
 * carry one entry through dispatcher -> (backend | watcher) -> copier, and
 * the counters. Shared by the library's rooms, whose calls flow one way:
 *
 *   rank.c       the API: open/close, counters
 *   task.c       the API: tasks (submit, wait, free)
 *   lookup.c     the API: lookups, touch, pins, prefetch
 *     -> link.c        the daemon link: attach, start/stop, enter/leave
 *     -> inline.c      small resident tasks on the submitting thread
 *     -> loadqueue.c   the dispatcher: walk, look-ahead, idle window
 *          -> watch.c  watchers: keys other ranks are loading
 *          -> owner.c  depth tokens, backend loads/dumps and their
 *                      completions, workers, prefetch
 *     -> copier.c      copier thread (and releaser), choice of copier
 *   all of them -> complete.c  an item's or a task's end (leases, status)
 *               -> workq.c     the queue type
 *
 * Handing an item to the copier or to a worker is a push on that thread's
 * queue (rank_push_copy(), rank_push_work() below), not a call into its room.
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
 *   expirer     sleeps until the first deadline of this rank's owner loads
 *               in the backend and ends a late one's entry (-ETIMEDOUT),
 *               touching only its task's status (owner.c);
 *   backend     its own threads call load_done()/dump_done().
 * An item is owned by exactly one of them at a time: whoever took it off a
 * queue (or the backend, between submit and done, also after the expirer
 * ended its entry).
 */
#ifndef SHARDFS_RANK_I_H
#define SHARDFS_RANK_I_H

#include <shardfs/backend.h>
#include <shardfs/rank.h>

#include "copier_i.h"
#include "workq_i.h"

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
    struct sfs_wq_node qn; /* in one queue at a time */
    struct sfs_rank *rank;
    struct sfs_task *task; /* NULL for prefetch */
    uint32_t idx;          /* entry index in the task */
    uint8_t kind;          /* enum item_kind */
    uint8_t step;          /* enum item_step */
    bool leased;
    bool bounce;    /* dump through a private buffer (key leased elsewhere) */
    bool behind;    /* a write-behind dump whose entry ended: its store write runs on */
    uint8_t pregot; /* load: PREGOT_* -- the submitting thread's inline try already Got it */
    struct sfs_key key;
    struct sfs_lease lease;
    void *buf;           /* the slot's bytes, or the bounce buffer */
    void *addr;          /* the entry's destination (load) or source (dump) */
    /* An entry of a vectored call: its pieces, in the task's array (npieces
     * 0: the one range at addr, a shard long). */
    const struct sfs_rank_piece *pieces;
    uint32_t npieces;
    int64_t deadline_ns; /* STEP_WAIT, a bounced dump taking its slot, or a task's owner
                            load in the backend: when it gives up (-ETIMEDOUT) */
    struct sfs_io io;
    int64_t start_ns; /* its wait, or its backend load, began (the histograms) */
    /* A task's owner load in the backend (owner.c): on rk->own_* from its
     * submit to its completion or its deadline. A write-behind dump held
     * back (complete.c): own_next links its task's held chain (under the
     * task's mu). */
    struct rank_item *own_prev, *own_next; /* under rk->own_mu */
    bool expired; /* under rk->own_mu: failed at its deadline; the load ends alone */
};

/* What the inline try of a small task (inline.c) left in an item it handed to
 * the dispatcher: the Get is done, the dispatcher routes the item by it and
 * does not Get the key again (so every key is Got once, counted once). */
enum item_pregot {
    PREGOT_NONE = 0,
    PREGOT_HIT = 1,    /* a Ready lease: to the copier */
    PREGOT_WAITER = 2, /* another owner loads it: to a watcher */
    PREGOT_OWNER = 3,  /* ours to load, with a depth token taken for it */
};

/* The item a queue node is, or NULL. */
static inline struct rank_item *item_of(struct sfs_wq_node *n)
{
    return n ? sfs_wq_entry(n, struct rank_item, qn) : NULL;
}

struct sfs_task {
    struct sfs_rank *rank;
    struct sfs_wq_node qn; /* in rank->tq */
    int kind;              /* ITEM_LOAD or ITEM_DUMP */
    bool behind;           /* a dump submitted in SFS_DUMP_WRITE_BEHIND mode */
    /* Write-behind: store writes held back until the task completes (so
     * they do not share the CPUs with its copies), at most
     * RANK_BEHIND_HOLD_MAX; no_hold once a dump of the task bounced (it may
     * wait for a held one's lease). Under mu. */
    struct rank_item *held_head, *held_tail;
    unsigned nheld;
    bool no_hold;
    /* Write-behind: the task's end was seen (a wait or a done() returned it,
     * or the task was freed), and when it ended (sfs_now_ns). The store
     * writes of an ended task wait for the first, RANK_BEHIND_GRACE_NS at
     * most (owner.c). Under mu. */
    bool seen;
    int64_t done_ns;
    size_t n;
    struct sfs_rank_entry *entries;
    struct sfs_rank_piece *pieces; /* the vectored entries' pieces; NULL: none */
    void *gate;                    /* dumps after an event: the copier's gate; NULL: none */
    void (*gate_close)(void *gate);
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
    /* The requester class named in the cache's /stats ("rank" unless
     * sfs_rank_set_class said otherwise); given to each attach. */
    char cls[SFS_CLASS_LEN];
    struct sfs_backend *be;    /* NULL: no backend */
    struct sfs_copier *copier; /* NULL in the scheduler role */
    uint32_t shard_size; /* 1..RANK_SHARD_MAX, checked once, at open */
    unsigned r, N; /* RearrangeIndex: r = device_id % N */
    unsigned depth;
    unsigned nworkers;
    bool rotate;
    bool prealloc;
    bool query_only;
    /* enum sfs_rank_dump_mode, for tasks submitted from now on. */
    _Atomic int dump_mode;
    /* Write-behind store writes that failed (their log lines are spaced out). */
    _Atomic uint64_t behind_failed;
    /* Test build: SHARDFS_RANK_BEHIND_HOLD_FD, a descriptor each background
     * store write reads a byte from before it starts (owner.c); -1: none. */
    int behind_hold_fd;
#ifdef SFS_BENCH_BASELINES
    /* The benchmarks' baselines (rank_blocking_waits(), rank_inline_off()). */
    bool blocking_waits; /* SHARDFS_RANK_BLOCKING_WAITS (loadqueue.c) */
    bool inline_off;     /* SHARDFS_RANK_NO_INLINE (rank.c): every task to the pipeline */
#endif
    int64_t key_timeout_ns;

    /* Lifetime. Lock order: mu before tq's lock (submit pushes under mu,
     * close takes the queued tasks under mu). */
    pthread_mutex_t mu;
    pthread_cond_t idle_cv; /* close: active reached 0 */
    size_t active;          /* under mu: tasks not complete + prefetches in flight */
    bool stopping;          /* under mu (peeked lock-free by idle_prealloc) */

    struct sfs_workq tq;    /* tasks for the dispatcher (struct sfs_task) */
    struct sfs_workq ready; /* items ready to copy (copier thread) */
    struct sfs_workq work;  /* dumps to submit, takeover loads (worker threads) */
    struct sfs_workq behind; /* write-behind store writes (background threads) */
    /* Dump tasks submitted and not yet walked by the dispatcher (whose Gets
     * take their keys for writing). A small load runs inline only when it
     * is 0, so a load never overtakes an earlier dump of this rank. */
    _Atomic unsigned dumps_unwalked;

    /* Keys to watch (watcher threads, see watch.c). Each watcher has its
     * own inbox and doorbell; a push goes to the first with room and rings
     * its bell, so no watcher polls. */
    pthread_mutex_t wait_mu;
    struct sfs_watcher *watchers; /* [WATCHERS_MAX]; inboxes and loads under wait_mu */
    unsigned nwatchers;           /* under wait_mu: started */
    struct sfs_fifo overflow;     /* under wait_mu: STEP_WAIT items no set had room for */
    bool watchers_stop;           /* under wait_mu */
    bool wait_compat;             /* test build: SHARDFS_RANK_WAIT_COMPAT (watch.c) */

    /* Backend requests in flight: at most `depth`. Taken and returned
     * without a lock (a resident key takes one and gives it back at once);
     * depth_mu and depth_cv only for the dispatcher waiting for one. */
    pthread_mutex_t depth_mu;
    pthread_cond_t depth_cv;
    _Atomic unsigned inflight;
    _Atomic unsigned max_inflight;
    _Atomic unsigned token_waiters;

    /* Owner loads of tasks in the backend, oldest (earliest deadline)
     * first (owner.c). The expirer thread sleeps until the head's deadline
     * and fails an entry whose load is late with -ETIMEDOUT; the load itself
     * keeps its lease, token and task until the backend answers. */
    pthread_mutex_t own_mu;
    pthread_cond_t own_cv; /* CLOCK_MONOTONIC: the expirer's sleep */
    struct rank_item *own_head, *own_tail; /* under own_mu */
    bool own_stop;                         /* under own_mu */
    bool expirer_started;
    pthread_t expirer;

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
    pthread_t *behind_threads; /* nworkers of them, at RANK_BEHIND_NICE */
    unsigned nbehind_threads;  /* started */
    bool dispatcher_started, copier_started;
    bool queues_ready; /* tq, ready and work initialised */

    /* The daemon link (link.c). A thread polls the attach connection; when
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

/* Write-behind store writes a task holds back at most (complete.c). */
#define RANK_BEHIND_HOLD_MAX 64u
/* How much nicer than the process the background store writes run (owner.c):
 * on a busy host they take the CPU time the application's threads leave, and
 * still get a share (nice 10 weighs a tenth of nice 0), never starve. */
#define RANK_BEHIND_NICE 10
/* How long the store writes of an ended write-behind task wait for its end
 * to be seen (owner.c): the waiter's wake-up goes first. */
#define RANK_BEHIND_GRACE_NS (2ll * 1000000)

/* A backend reports bytes moved in an int (struct sfs_io): a bigger shard
 * would read as an error. sfs_rank_open() refuses a cache past it. */
#define RANK_SHARD_MAX ((uint32_t)INT32_MAX)

/* A small task: at most this many entries and bytes (entries x shard size)
 * are tried inline, on the submitting thread, when every key is Ready (see
 * inline.c). 64 x 16 KiB is the GPU path's small task; 1 MiB bounds the time
 * sfs_rank_load spends copying before it returns (tens of microseconds). */
#define RANK_INLINE_KEYS_MAX  ((unsigned)SFS_COPY_INLINE_MAX) /* 64 */
#define RANK_INLINE_BYTES_MAX (1u << 20)

/* The benchmarks' baseline modes, switched by environment variables read at
 * open: only in the builds with SFS_BENCH_BASELINES (shardfs-rank-bench,
 * which bench_rank links, and the tests' shardfs-rank-hooks); the product
 * has neither mode. Blocking waits: the dispatcher itself waits on each key
 * another rank is loading, as the old natural-order LoadQueue did. No
 * inline: every task goes through the pipeline. */
#ifdef SFS_BENCH_BASELINES
#define rank_blocking_waits(rk) ((rk)->blocking_waits)
#define rank_inline_off(rk)     ((rk)->inline_off)
#else
#define rank_blocking_waits(rk) false
#define rank_inline_off(rk)     false
#endif

/* Hand items to the copier thread: a chain head..tail (linked through qn)
 * with one lock and at most one wake. Any thread. */
static inline void rank_push_copy_chain(struct sfs_rank *rk, struct rank_item *head,
                                        struct rank_item *tail)
{
    sfs_workq_push_chain(&rk->ready, &head->qn, &tail->qn);
}

static inline void rank_push_copy(struct sfs_rank *rk, struct rank_item *it)
{
    sfs_workq_push(&rk->ready, &it->qn);
}

/* Hand an item to a worker thread (it->step says what to do). Any thread. */
static inline void rank_push_work(struct sfs_rank *rk, struct rank_item *it)
{
    sfs_workq_push(&rk->work, &it->qn);
}

/* Hand a published write-behind dump to a background thread for its store
 * write. Any thread. */
static inline void rank_push_behind(struct sfs_rank *rk, struct rank_item *it)
{
    sfs_workq_push(&rk->behind, &it->qn);
}

/* complete.c: the end of an item or a task; calls nothing above it. */
void sfs_item_done(struct rank_item *it, int status);
void sfs_item_dump_copied(struct rank_item *it);
/* A write-behind dump's bytes are in its slot: publish it Ready and end its
 * entry (status 0), keeping the lease for the background store write, which
 * sfs_item_behind_done() ends. The copier's items (worker false) go to a
 * worker from here; a worker (a bounced dump) writes its own. -errno: not
 * published (the caller ends the item with it). */
int sfs_item_publish_behind(struct rank_item *it, bool worker);
void sfs_item_behind_done(struct rank_item *it, int result);
/* A dump of task t bounced: hand on its held store writes, hold no more. */
void sfs_task_no_hold(struct sfs_task *t);
/* An owner load past its deadline: its entry ends with `status` now, the
 * lease stays (the backend may still write the slot). The caller holds a
 * task reference and an active count for the load, which
 * sfs_item_late_done() drops with the lease when the backend answers. */
void sfs_item_expire(struct rank_item *it, int status);
void sfs_item_late_done(struct rank_item *it);
void sfs_task_unref(struct sfs_task *t);
void sfs_rank_active_put(struct sfs_rank *rk);

/* loadqueue.c: the dispatcher (and, through owner.c, the workers). */
int sfs_lq_start(struct sfs_rank *rk);
void sfs_lq_stop(struct sfs_rank *rk);
/* The daemon is gone: wake every watcher (its set fails with -ESHUTDOWN)
 * and a dispatcher waiting for a lease. */
void sfs_lq_link_lost(struct sfs_rank *rk);

static inline bool rank_link_lost(struct sfs_rank *rk)
{
    /* Acquire: pairs with the link thread's release store. */
    return atomic_load_explicit(&rk->link_lost, memory_order_acquire);
}

/* owner.c (called by loadqueue.c, inline.c, rank.c, lookup.c): a key's
 * owner. Depth tokens: take one without waiting, block for one, give one
 * back (tokens come back from backend completions, so a blocking take
 * always ends). */
bool sfs_own_token_try(struct sfs_rank *rk);
void sfs_own_token_get(struct sfs_rank *rk);
void sfs_own_token_put(struct sfs_rank *rk);
/* Owner of it->lease, holding a depth token: fill in its backend request.
 * False (and the item is finished) when there is no backend. */
bool sfs_own_prep_load(struct rank_item *it);
/* Submit prepared loads with one backend call; what the backend does not
 * take fails. */
void sfs_own_submit_loads(struct sfs_rank *rk, struct sfs_io **ios, size_t n);
/* Owner of it->lease, holding a depth token: start loading it. */
int sfs_own_submit_load(struct rank_item *it);
/* A wait made this item owner: take a token (blocking) and load it. */
void sfs_own_takeover(struct rank_item *it);
int sfs_own_workers_start(struct sfs_rank *rk);
void sfs_own_workers_stop(struct sfs_rank *rk);
int sfs_own_prefetch(struct sfs_rank *rk, const struct sfs_key *keys, size_t n);

/* watch.c (called by loadqueue.c) */
int sfs_watch_start(struct sfs_rank *rk);
void sfs_watch_stop(struct sfs_rank *rk);
void sfs_watch_push(struct sfs_rank *rk, struct rank_item *it);
bool sfs_watch_settled(struct sfs_rank *rk, struct rank_item *it, int r);
/* Wake every watcher: a sleeping one rings out of its wait and looks at
 * rank_link_lost(). */
void sfs_watch_wake_all(struct sfs_rank *rk);

/* link.c (called by rank.c, task.c and lookup.c). Attach to the cache the
 * configuration names; start what runs on it (touch hook, copier,
 * LoadQueue, link thread: on failure what was started is stopped again);
 * stop the link thread (close). */
int sfs_link_attach(struct sfs_rank *rk);
int sfs_link_start_engine(struct sfs_rank *rk);
void sfs_link_stop(struct sfs_rank *rk);
/* Enter a call that uses the cache: link_rw held for reading on success,
 * after re-attaching a lost daemon link; sfs_link_leave() drops it. */
int sfs_link_enter(struct sfs_rank *rk);
void sfs_link_leave(struct sfs_rank *rk);
/* The value of `call` evaluated between sfs_link_enter and sfs_link_leave,
 * or enter's -errno (then call is not evaluated): the body of every public
 * call that uses the cache. */
#define SFS_LINKED(rk, call)                                                                       \
    __extension__({                                                                                \
        __typeof__(call) linked_r_ = sfs_link_enter(rk);                                           \
        if (linked_r_ >= 0) {                                                                      \
            linked_r_ = (call);                                                                    \
            sfs_link_leave(rk);                                                                    \
        }                                                                                          \
        linked_r_;                                                                                 \
    })

/* inline.c (called by task.c): try load task t (counted active, not
 * queued) on the calling thread. True: it is complete, or its every key is
 * a Ready lease handed to the copier thread (a copier that cannot copy on
 * this thread, or more than RANK_INLINE_BYTES_MAX of shards). False: the
 * caller queues it for the dispatcher, which routes the keys the try Got
 * (item->pregot) and walks the rest. */
bool sfs_inline_load(struct sfs_rank *rk, struct sfs_task *t);

/* memmap.c (called by task.c): 0 when [addr, addr + len) is memory this
 * process may read (and, `write`, write), else -EFAULT. */
int sfs_mem_usable(const void *addr, uint64_t len, bool write);

/* copier.c (called by link.c and inline.c) */
int sfs_copier_start(struct sfs_rank *rk);
/* The inline path of a small task: copy items[0..n) (each a Ready lease,
 * n <= RANK_INLINE_KEYS_MAX) on the calling thread and finish each one.
 * -EAGAIN: the copier cannot copy on this thread; nothing was touched. */
int sfs_copier_inline(struct sfs_rank *rk, struct rank_item **items, size_t n);
void sfs_copier_stop(struct sfs_rank *rk);

#endif /* SHARDFS_RANK_I_H */
