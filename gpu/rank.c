/* SPDX-License-Identifier: MIT */
/*
 * rank.c - the public face of libshardfs-rank: opening a rank (attach,
 * backend, copier, threads), tasks and waiting for them, lookups, touch,
 * prefetch and counters. The moving parts live in loadqueue.c (dispatcher,
 * workers, prefetch, backend callbacks), watch.c (watchers), copier.c
 * (copier thread) and inline.c (small resident tasks on the submitting
 * thread); an entry's end, and a task's references (caller, dispatcher,
 * completion), in complete.c. See rank_i.h for which way the
 * calls go.
 */
#include "rank_i.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <syslog.h>
#include <time.h>

/*
 * struct sfs_rank_config as 0.1 had it: the fields up to key_timeout_ms.
 * rank_index went into its tail padding, so the size is the same; a 0.1
 * program's struct may hold anything there (a copy need not copy padding),
 * which is why sfs_rank_open@SHARDFS_RANK_0.1 (rank_open_0_1 below) never
 * reads it.
 */
struct sfs_rank_config_0_1 {
    const char *socket_path;
    const char *mount_point;
    int device_id;
    int local_rank_size;
    const char *backend;
    unsigned load_depth;
    bool rotate;
    bool reserved0;
    bool prealloc;
    int copier;
    unsigned workers;
    unsigned key_timeout_ms;
};
_Static_assert(sizeof(struct sfs_rank_config_0_1) == sizeof(struct sfs_rank_config),
               "struct sfs_rank_config keeps its 0.1 size");
_Static_assert(offsetof(struct sfs_rank_config, rank_index) >=
                   offsetof(struct sfs_rank_config_0_1, key_timeout_ms) + sizeof(unsigned),
               "rank_index comes after every 0.1 field");

void sfs_rank_config_init(struct sfs_rank_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof(*cfg));
    cfg->local_rank_size = 1;
    cfg->load_depth = 32;
    cfg->rotate = true;
    cfg->prealloc = true;
    cfg->copier = SFS_COPIER_AUTO;
    cfg->workers = 4;
    cfg->key_timeout_ms = 30000;
    cfg->rank_index = -1;
}

static void touch_hook(const struct sfs_block_id *blocks, size_t n, void *arg)
{
    struct sfs_rank *rk = arg;

    if (rk->be)
        sfs_backend_touch(rk->be, blocks, n); /* a hint: errors do not matter */
}

/* The socket a mount point names in its xattr. */
static int socket_from_mount(const char *mnt, char *out, size_t len)
{
    ssize_t n = getxattr(mnt, SFS_XATTR_SOCKET, out, len - 1);

    if (n < 0)
        return errno == ENOTSUP ? -ENODATA : -errno;
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\0'))
        out[--n] = '\0';
    return n > 0 ? 0 : -ENODATA;
}

static void rank_free(struct sfs_rank *rk)
{
    if (rk->copier)
        rk->copier->ops->close(rk->copier);
    if (rk->be)
        sfs_backend_close(rk->be);
    sfs_cache_close(rk->cache);
    pthread_rwlock_destroy(&rk->link_rw);
    free(rk->socket_path);
    free(rk->mount_point);
    if (rk->queues_ready) {
        sfs_workq_destroy(&rk->tq);
        sfs_workq_destroy(&rk->ready);
        sfs_workq_destroy(&rk->work);
    }
    pthread_mutex_destroy(&rk->mu);
    pthread_cond_destroy(&rk->idle_cv);
    pthread_mutex_destroy(&rk->wait_mu);
    pthread_mutex_destroy(&rk->depth_mu);
    pthread_cond_destroy(&rk->depth_cv);
    pthread_mutex_destroy(&rk->lease_mu);
    pthread_cond_destroy(&rk->lease_cv);
    free(rk);
}

/* ---------------------------------------------------------------------------
 * The daemon link.
 *
 * The cache handle holds its attach connection for its whole life (the
 * daemon reaps this process when it closes). A thread polls it: when the
 * daemon exits or is killed the connection reads EOF at once, the thread
 * sets link_lost and wakes the watchers and the dispatcher, and every entry
 * in flight that still depends on the old cache fails with -ESHUTDOWN within
 * a slice (no one would reap a dead owner there any more). Loads this rank
 * owns finish from the backend as usual. The next call re-attaches to
 * whatever serves the socket path by then (rank_enter), transparently.
 */

static void *link_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct pollfd pf[2] = {{.fd = sfs_cache_conn_fd(rk->cache), .events = POLLIN | POLLRDHUP},
                           {.fd = rk->link_stop_fd, .events = POLLIN}};

    for (;;) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            sfs_log(LOG_ERR, "rank %d: cannot watch the daemon link: %s", rk->device_id,
                    strerror(errno));
            return NULL;
        }
        if (pf[1].revents)
            return NULL; /* stopped */
        if (pf[0].revents)
            break;
    }
    sfs_log(LOG_WARNING,
            "rank %d: the daemon went away: entries in flight fail with ESHUTDOWN; the next "
            "call attaches again",
            rk->device_id);
    /* Release: what the waits see after this store. */
    atomic_store_explicit(&rk->link_lost, true, memory_order_release);
    sfs_lq_link_lost(rk);
    return NULL;
}

static int link_start(struct sfs_rank *rk)
{
    int r;

    if (sfs_cache_conn_fd(rk->cache) < 0)
        return 0; /* not attached through a server: nothing to watch */
    rk->link_stop_fd = eventfd(0, EFD_CLOEXEC);
    if (rk->link_stop_fd < 0)
        return -errno;
    r = pthread_create(&rk->link_thread, NULL, link_main, rk);
    if (r) {
        close(rk->link_stop_fd);
        return -r;
    }
    rk->link_started = true;
    return 0;
}

static void link_stop(struct sfs_rank *rk)
{
    uint64_t one = 1;

    if (!rk->link_started)
        return;
    if (write(rk->link_stop_fd, &one, sizeof(one)) < 0)
        sfs_log(LOG_ERR, "rank %d: cannot stop the link thread: %s", rk->device_id,
                strerror(errno));
    pthread_join(rk->link_thread, NULL);
    close(rk->link_stop_fd);
    rk->link_started = false;
}

/* Attach to the socket the configuration names (a mount point's xattr is
 * read anew: the daemon behind it may have restarted). */
static int attach_cache(struct sfs_rank *rk)
{
    char sock[PATH_MAX];
    const char *path = rk->socket_path;
    struct sfs_cache_info info;
    int r;

    if (rk->mount_point) {
        r = socket_from_mount(rk->mount_point, sock, sizeof(sock));
        if (r < 0)
            return r;
        path = sock;
    }
    rk->cache = sfs_cache_attach(path, rk->query_only ? -1 : rk->device_id, &r);
    if (!rk->cache)
        return r;
    sfs_cache_info(rk->cache, &info);
    /* The shard size's one check: past it, the rank's every use is a
     * uint32_t that fits the backend's int result. */
    if (info.shard_size == 0 || info.shard_size > RANK_SHARD_MAX) {
        sfs_cache_close(rk->cache);
        rk->cache = NULL;
        return -EINVAL;
    }
    if (rk->shard_size && info.shard_size != rk->shard_size) {
        /* Re-attached to a daemon of another shard size: the backend and
         * the caller's buffers are sized for the old one. */
        sfs_log(LOG_ERR, "rank %d: the daemon now serves %llu-byte shards, not %llu", rk->device_id,
                (unsigned long long)info.shard_size, (unsigned long long)rk->shard_size);
        sfs_cache_close(rk->cache);
        rk->cache = NULL;
        return -EPROTO;
    }
    rk->shard_size = (uint32_t)info.shard_size;
    return 0;
}

/* Everything that runs on the cache: touch hook, copier, threads, link. On
 * failure, what was started is stopped again. */
static int start_engine(struct sfs_rank *rk)
{
    int r = 0;

    if (rk->be)
        sfs_cache_set_touch_hook(rk->cache, touch_hook, rk);
    if (!rk->query_only) {
        r = sfs_copier_open(rk->copier_mode, rk->device_id, rk->cache, &rk->copier);
        if (r < 0)
            return r;
        r = sfs_copier_start(rk);
        if (r == 0)
            r = sfs_lq_start(rk);
    }
    if (r == 0)
        r = link_start(rk);
    if (r < 0) {
        sfs_lq_stop(rk);
        sfs_copier_stop(rk);
        if (rk->copier)
            rk->copier->ops->close(rk->copier);
        rk->copier = NULL;
    }
    return r;
}

/* link_rw held for writing: wait for every task and prefetch in flight (those
 * on the old cache fail fast), stop the threads, close the old handle. */
static void rank_down(struct sfs_rank *rk)
{
    if (rk->down)
        return;
    pthread_mutex_lock(&rk->mu);
    while (rk->active > 0)
        pthread_cond_wait(&rk->idle_cv, &rk->mu);
    pthread_mutex_unlock(&rk->mu);
    sfs_lq_stop(rk);
    sfs_copier_stop(rk);
    link_stop(rk);
    if (rk->copier)
        rk->copier->ops->close(rk->copier);
    rk->copier = NULL;
    sfs_cache_set_touch_hook(rk->cache, NULL, NULL);
    sfs_cache_close(rk->cache);
    rk->cache = NULL;
    rk->down = true;
}

/* link_rw held for writing: attach anew and restart. */
static int rank_relink(struct sfs_rank *rk)
{
    int r;

    rank_down(rk);
    r = attach_cache(rk);
    if (r < 0)
        return r;
    /* The threads are stopped: their stop flags are ours to reset. */
    rk->stopping = false;
    rk->watchers_stop = false;
    sfs_workq_restart(&rk->tq);
    sfs_workq_restart(&rk->ready);
    sfs_workq_restart(&rk->work);
    /* Relaxed: the threads that read it are started below (pthread_create
     * orders this store before them); the callers hold link_rw. */
    atomic_store_explicit(&rk->link_lost, false, memory_order_relaxed);
    r = start_engine(rk);
    if (r < 0) {
        sfs_cache_close(rk->cache);
        rk->cache = NULL;
        return r;
    }
    rk->down = false;
    sfs_log(LOG_NOTICE, "rank %d: attached again", rk->device_id);
    return 0;
}

/* Enter a call that uses the cache: link_rw held for reading on success
 * (rank_leave drops it). A lost daemon link is re-attached first; when no
 * daemon serves the socket yet, that error (-ENOENT, -ECONNREFUSED, ...) is
 * the call's, and the next call tries again. */
static int rank_enter(struct sfs_rank *rk)
{
    for (;;) {
        int r = 0;

        pthread_rwlock_rdlock(&rk->link_rw);
        if (!rk->down && !rank_link_lost(rk))
            return 0;
        pthread_rwlock_unlock(&rk->link_rw);
        pthread_rwlock_wrlock(&rk->link_rw);
        if (rk->down || rank_link_lost(rk))
            r = rank_relink(rk);
        pthread_rwlock_unlock(&rk->link_rw);
        if (r < 0)
            return r;
    }
}

static void rank_leave(struct sfs_rank *rk)
{
    pthread_rwlock_unlock(&rk->link_rw);
}

/* sfs_rank_open@@SHARDFS_RANK_0.2, the default: reads rank_index. */
SFS_API struct sfs_rank *rank_open_0_2(const struct sfs_rank_config *cfg, int *err);
__asm__(".symver rank_open_0_2, sfs_rank_open@@SHARDFS_RANK_0.2");

struct sfs_rank *rank_open_0_2(const struct sfs_rank_config *cfg, int *err)
{
    struct sfs_rank *rk;
    int r;

    if (!err)
        return NULL;
    /* reserved0 was blocking_waits in 0.1.0: refused, not ignored. */
    if (!cfg || (!cfg->socket_path == !cfg->mount_point) || cfg->local_rank_size < 0 ||
        cfg->copier < SFS_COPIER_AUTO || cfg->copier > SFS_COPIER_CUDA || cfg->reserved0 ||
        (cfg->device_id >= 0 && cfg->rank_index >= (cfg->local_rank_size > 0 ? cfg->local_rank_size : 1))) {
        *err = -EINVAL;
        return NULL;
    }
    rk = calloc(1, sizeof(*rk));
    if (!rk) {
        *err = -ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&rk->mu, NULL);
    pthread_cond_init(&rk->idle_cv, NULL);
    pthread_mutex_init(&rk->wait_mu, NULL);
    pthread_mutex_init(&rk->depth_mu, NULL);
    pthread_cond_init(&rk->depth_cv, NULL);
    pthread_mutex_init(&rk->lease_mu, NULL);
    pthread_cond_init(&rk->lease_cv, NULL);
    pthread_rwlock_init(&rk->link_rw, NULL);
    rk->link_stop_fd = -1;
    r = sfs_workq_init(&rk->tq);
    if (r == 0 && (r = sfs_workq_init(&rk->ready)) < 0)
        sfs_workq_destroy(&rk->tq);
    if (r == 0 && (r = sfs_workq_init(&rk->work)) < 0) {
        sfs_workq_destroy(&rk->tq);
        sfs_workq_destroy(&rk->ready);
    }
    if (r < 0) {
        *err = r;
        goto out_free;
    }
    rk->queues_ready = true;

    rk->query_only = cfg->device_id < 0;
    rk->device_id = cfg->device_id;
    rk->copier_mode = cfg->copier;
    rk->N = cfg->local_rank_size > 0 ? (unsigned)cfg->local_rank_size : 1;
    /* rank_index < 0: the device says the rank (0.1's only way); checked
     * above to be < N otherwise. */
    if (rk->query_only)
        rk->r = 0;
    else if (cfg->rank_index >= 0)
        rk->r = (unsigned)cfg->rank_index;
    else
        rk->r = (unsigned)cfg->device_id % rk->N;
    rk->depth = cfg->load_depth ? cfg->load_depth : 32;
    rk->nworkers = cfg->workers ? cfg->workers : 4;
    rk->rotate = cfg->rotate;
    rk->prealloc = cfg->prealloc;
    /* Test hook (bench_rank's pipeline figure, A/B tests): never inline. */
    rk->inline_off = getenv("SHARDFS_RANK_NO_INLINE") != NULL;
    rk->key_timeout_ns = (int64_t)(cfg->key_timeout_ms ? cfg->key_timeout_ms : 30000) * 1000000;
    if ((cfg->socket_path && !(rk->socket_path = strdup(cfg->socket_path))) ||
        (cfg->mount_point && !(rk->mount_point = strdup(cfg->mount_point)))) {
        *err = -ENOMEM;
        goto out_free;
    }

    r = attach_cache(rk);
    if (r < 0) {
        *err = r;
        goto out_free;
    }
    if (cfg->backend) {
        struct sfs_backend_params bp = {.shard_size = rk->shard_size,
                                        .timeout_ms = (unsigned)(rk->key_timeout_ns / 1000000)};
        char errbuf[256] = "";

        rk->be = sfs_backend_open(cfg->backend, &bp, errbuf, sizeof(errbuf), err);
        if (!rk->be) {
            sfs_log(LOG_ERR, "rank %d: backend '%s': %s", cfg->device_id, cfg->backend,
                    errbuf[0] ? errbuf : strerror(-*err));
            goto out_free;
        }
    }
    r = start_engine(rk);
    if (r < 0) {
        *err = r;
        goto out_free;
    }
    *err = 0;
    return rk;

out_free:
    rank_free(rk);
    return NULL;
}

/* sfs_rank_open@SHARDFS_RANK_0.1: a program built against 0.1 passes the
 * 0.1 struct; its rank index comes from the device, as it did. */
SFS_API struct sfs_rank *rank_open_0_1(const struct sfs_rank_config_0_1 *old, int *err);
__asm__(".symver rank_open_0_1, sfs_rank_open@SHARDFS_RANK_0.1");

struct sfs_rank *rank_open_0_1(const struct sfs_rank_config_0_1 *old, int *err)
{
    struct sfs_rank_config cfg;

    if (!old) {
        if (err)
            *err = -EINVAL;
        return NULL;
    }
    sfs_rank_config_init(&cfg);
    cfg.socket_path = old->socket_path;
    cfg.mount_point = old->mount_point;
    cfg.device_id = old->device_id;
    cfg.local_rank_size = old->local_rank_size;
    cfg.backend = old->backend;
    cfg.load_depth = old->load_depth;
    cfg.rotate = old->rotate;
    cfg.reserved0 = old->reserved0;
    cfg.prealloc = old->prealloc;
    cfg.copier = old->copier;
    cfg.workers = old->workers;
    cfg.key_timeout_ms = old->key_timeout_ms;
    cfg.rank_index = -1;
    return rank_open_0_2(&cfg, err);
}

/* Complete every entry of a task the dispatcher never started (an inline
 * try may have left leases in it: they go back). mu held. */
static void cancel_task(struct sfs_rank *rk, struct sfs_task *t)
{
    for (size_t i = 0; i < t->n; i++) {
        struct rank_item *it = &t->items[i];

        if (it->leased) {
            if (it->pregot == PREGOT_OWNER)
                sfs_lq_token_put(rk);
            sfs_cache_release(rk->cache, &it->lease);
            it->leased = false;
        }
    }
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n; i++)
        t->status[i] = -ECANCELED;
    t->pending = 0;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

void sfs_rank_close(struct sfs_rank *rk)
{
    struct sfs_wq_node *cancelled, *n;
    struct sfs_task *t;

    if (!rk)
        return;
    pthread_mutex_lock(&rk->mu);
    /* Atomic store: idle_prealloc() peeks at it without the lock. No task
     * is queued after this (submit looks under mu); what is queued now is
     * cancelled. */
    __atomic_store_n(&rk->stopping, true, __ATOMIC_RELAXED);
    cancelled = rk->queues_ready ? sfs_workq_pop_all(&rk->tq, SFS_WQ_NOWAIT) : NULL;
    for (n = cancelled; n; n = n->next) {
        struct sfs_task *ct = sfs_wq_entry(n, struct sfs_task, qn);

        if (ct->kind == ITEM_DUMP) /* relaxed: nothing is submitted any more */
            atomic_fetch_sub_explicit(&rk->dumps_unwalked, 1, memory_order_relaxed);
        cancel_task(rk, ct);
        rk->active--;
    }
    while (rk->active > 0)
        pthread_cond_wait(&rk->idle_cv, &rk->mu);
    pthread_mutex_unlock(&rk->mu);
    while (cancelled) {
        t = sfs_wq_entry(cancelled, struct sfs_task, qn);
        cancelled = cancelled->next;
        sfs_task_unref(t); /* dispatcher's */
        sfs_task_unref(t); /* completion's */
    }
    sfs_lq_stop(rk);
    sfs_copier_stop(rk);
    link_stop(rk);
    if (rk->be && rk->cache)
        sfs_cache_set_touch_hook(rk->cache, NULL, NULL);
    rank_free(rk); /* sfs_cache_close() drops any lease left */
}

static int submit_entered(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                          int kind, struct sfs_task **out)
{
    struct sfs_task *t;
    pthread_condattr_t ca;

    if (!rk || !entries || !out || n == 0 || n > UINT32_MAX)
        return -EINVAL;
    *out = NULL;
    if (rk->query_only)
        return -EPERM;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->entries = malloc(n * sizeof(*t->entries));
    t->items = calloc(n, sizeof(*t->items));
    t->status = calloc(n, sizeof(*t->status));
    if (!t->entries || !t->items || !t->status) {
        free(t->entries);
        free(t->items);
        free(t->status);
        free(t);
        return -ENOMEM;
    }
    memcpy(t->entries, entries, n * sizeof(*entries));
    t->rank = rk;
    t->kind = kind;
    t->n = n;
    t->pending = n;
    t->refs = 3; /* caller, dispatcher, completion */
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (size_t i = 0; i < n; i++) {
        struct rank_item *it = &t->items[i];

        it->rank = rk;
        it->task = t;
        it->idx = (uint32_t)i;
        it->kind = (uint8_t)kind;
        it->key.block = entries[i].block;
        it->key.shard = entries[i].shard;
        it->addr = entries[i].addr;
        t->status[i] = -EINPROGRESS;
    }

    pthread_mutex_lock(&rk->mu);
    if (rk->stopping) {
        pthread_mutex_unlock(&rk->mu);
        t->refs = 1;
        sfs_task_unref(t);
        return -ESHUTDOWN;
    }
    rk->active++;
    if (kind == ITEM_DUMP) {
        /* Relaxed: ordered before the push (under tq's lock) that the
         * dispatcher's walk, and its release decrement, come after. */
        atomic_fetch_add_explicit(&rk->dumps_unwalked, 1, memory_order_relaxed);
        sfs_workq_push(&rk->tq, &t->qn); /* under mu: close cancels it, or the dispatcher runs it */
    }
    pthread_mutex_unlock(&rk->mu);
    rank_ctr_add(rk, RC_TASKS, 1);
    rank_ctr_add(rk, RC_ENTRIES, n);
    *out = t;
    if (kind == ITEM_DUMP || sfs_inline_load(rk, t))
        return 0; /* queued; or complete, or in the copier's hands (inline.c) */
    /* Under mu: close cancels it, or the dispatcher runs it (active is
     * counted, so a close that started meanwhile waits for it). */
    pthread_mutex_lock(&rk->mu);
    sfs_workq_push(&rk->tq, &t->qn);
    pthread_mutex_unlock(&rk->mu);
    return 0;
}

static int submit(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n, int kind,
                  struct sfs_task **out)
{
    int r;

    if (!rk || !entries || !out || n == 0 || n > UINT32_MAX)
        return -EINVAL;
    *out = NULL;
    r = rank_enter(rk);
    if (r < 0)
        return r;
    r = submit_entered(rk, entries, n, kind, out);
    rank_leave(rk);
    return r;
}

int sfs_rank_load(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                  struct sfs_task **task)
{
    return submit(rk, entries, n, ITEM_LOAD, task);
}

int sfs_rank_dump(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                  struct sfs_task **task)
{
    return submit(rk, entries, n, ITEM_DUMP, task);
}

int sfs_rank_wait(struct sfs_task *t, int timeout_ms, int *status)
{
    struct timespec ts;
    int r = 0;

    if (!t)
        return -EINVAL;
    if (timeout_ms >= 0) {
        int64_t d = sfs_deadline_after((int64_t)timeout_ms * 1000000);

        ts.tv_sec = d / 1000000000;
        ts.tv_nsec = d % 1000000000;
    }
    pthread_mutex_lock(&t->mu);
    while (t->pending > 0) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&t->cv, &t->mu);
        } else if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) == ETIMEDOUT) {
            if (t->pending > 0)
                r = -ETIMEDOUT;
            break;
        }
    }
    if (r == 0 && status)
        memcpy(status, t->status, t->n * sizeof(*status));
    pthread_mutex_unlock(&t->mu);
    return r;
}

bool sfs_rank_task_done(struct sfs_task *t)
{
    bool done;

    if (!t)
        return false;
    pthread_mutex_lock(&t->mu);
    done = t->pending == 0;
    pthread_mutex_unlock(&t->mu);
    return done;
}

size_t sfs_rank_task_size(struct sfs_task *t)
{
    return t ? t->n : 0;
}

void sfs_rank_task_free(struct sfs_task *t)
{
    if (t)
        sfs_task_unref(t);
}

/* ---------------------------------------------------------------------------
 * Lookups, touch, prefetch.
 */

static int lookup_entered(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                          uint32_t shard, bool *present)
{
    struct sfs_key *miss = NULL;
    size_t *where = NULL, nmiss = 0;
    bool *found = NULL;
    int r = 0;

    if (!rk || (n && (!blocks || !present)))
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        struct sfs_key k = {.block = blocks[i], .shard = shard};

        present[i] = sfs_cache_exists(rk->cache, &k);
        if (!present[i])
            nmiss++;
    }
    if (nmiss == 0 || !rk->be)
        return 0;
    miss = malloc(nmiss * sizeof(*miss));
    where = malloc(nmiss * sizeof(*where));
    found = malloc(nmiss * sizeof(*found));
    if (!miss || !where || !found) {
        r = -ENOMEM;
        goto out;
    }
    nmiss = 0;
    for (size_t i = 0; i < n; i++) {
        if (present[i])
            continue;
        miss[nmiss] = (struct sfs_key){.block = blocks[i], .shard = shard};
        where[nmiss++] = i;
    }
    r = sfs_backend_exists(rk->be, miss, nmiss, found);
    if (r == 0)
        for (size_t j = 0; j < nmiss; j++)
            present[where[j]] = found[j];
out:
    free(miss);
    free(where);
    free(found);
    return r;
}

int sfs_rank_lookup(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                    uint32_t shard, bool *present)
{
    int r;

    if (!rk || (n && (!blocks || !present)))
        return -EINVAL;
    r = rank_enter(rk);
    if (r < 0)
        return r;
    r = lookup_entered(rk, blocks, n, shard, present);
    rank_leave(rk);
    return r;
}

static long lookup_prefix_entered(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                                  uint32_t shard)
{
    size_t i = 0;
    bool *present;
    int r;

    if (!rk || (n && !blocks))
        return -EINVAL;
    /* The cache answers the common case (a resident prefix) without I/O. */
    for (; i < n; i++) {
        struct sfs_key k = {.block = blocks[i], .shard = shard};

        if (!sfs_cache_exists(rk->cache, &k))
            break;
    }
    if (i == n || !rk->be)
        return (long)i;
    present = malloc((n - i) * sizeof(*present));
    if (!present)
        return -ENOMEM;
    r = sfs_rank_lookup(rk, blocks + i, n - i, shard, present);
    if (r == 0) {
        size_t j = 0;

        while (i + j < n && present[j])
            j++;
        i += j;
    }
    free(present);
    return r < 0 ? r : (long)i;
}

long sfs_rank_lookup_prefix(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n,
                            uint32_t shard)
{
    long r;

    if (!rk || (n && !blocks))
        return -EINVAL;
    r = rank_enter(rk);
    if (r < 0)
        return r;
    r = lookup_prefix_entered(rk, blocks, n, shard);
    rank_leave(rk);
    return r;
}

int sfs_rank_touch(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n)
{
    int r;

    if (!rk || (n && !blocks))
        return -EINVAL;
    r = rank_enter(rk);
    if (r < 0)
        return r;
    r = sfs_cache_touch(rk->cache, blocks, n);
    rank_leave(rk);
    return r;
}

int sfs_rank_pin(struct sfs_rank *rk, const struct sfs_block_id *blocks, size_t n, uint32_t seconds)
{
    int r;

    if (!rk || (n && !blocks))
        return -EINVAL;
    r = rank_enter(rk);
    if (r < 0)
        return r;
    r = sfs_cache_pin(rk->cache, blocks, n, seconds);
    rank_leave(rk);
    return r;
}

static int prefetch_entered(struct sfs_rank *rk, const struct sfs_key *keys, size_t n)
{
    if (!rk || (n && !keys))
        return -EINVAL;
    if (rk->query_only || !rk->be)
        return 0;
    return sfs_lq_prefetch(rk, keys, n);
}

int sfs_rank_prefetch(struct sfs_rank *rk, const struct sfs_key *keys, size_t n)
{
    int r;

    if (!rk || (n && !keys))
        return -EINVAL;
    if (rk->query_only || !rk->be)
        return 0;
    r = rank_enter(rk);
    if (r < 0)
        return r;
    r = prefetch_entered(rk, keys, n);
    rank_leave(rk);
    return r;
}

/* ---------------------------------------------------------------------------
 * Counters and accessors.
 */

void sfs_rank_stats(struct sfs_rank *rk, struct sfs_rank_stats *o)
{
    if (!rk || !o)
        return;
    memset(o, 0, sizeof(*o));
    /* Relaxed loads: statistics. */
#define LD(c) atomic_load_explicit(&rk->ctr[c], memory_order_relaxed)
    o->tasks = LD(RC_TASKS);
    o->entries = LD(RC_ENTRIES);
    o->hits = LD(RC_HITS);
    o->owner_loads = LD(RC_OWNER_LOADS);
    o->takeovers = LD(RC_TAKEOVERS);
    o->waits = LD(RC_WAITS);
    o->dumps = LD(RC_DUMPS);
    o->dumps_bounced = LD(RC_DUMPS_BOUNCED);
    o->failed = LD(RC_FAILED);
    o->copies = LD(RC_COPIES);
    o->copy_batches = LD(RC_COPY_BATCHES);
    o->bytes_copied = LD(RC_BYTES_COPIED);
    o->prealloc = LD(RC_PREALLOC);
    o->prefetched = LD(RC_PREFETCHED);
#undef LD
    o->max_inflight = atomic_load_explicit(&rk->max_inflight, memory_order_relaxed);
    /* The cache's part: of the cache attached now (none while no daemon
     * serves the socket: zeros). */
    if (rank_enter(rk) == 0) {
        sfs_cache_stats(rk->cache, &o->cache);
        rank_leave(rk);
    }
}

uint64_t sfs_rank_shard_size(struct sfs_rank *rk)
{
    return rk ? rk->shard_size : 0;
}

const char *sfs_rank_copier_name(struct sfs_rank *rk)
{
    if (!rk)
        return NULL;
    return rk->copier ? rk->copier->ops->name : "none";
}

struct sfs_backend *sfs_rank_backend(struct sfs_rank *rk)
{
    return rk ? rk->be : NULL;
}

int sfs_rank_cuda_devices(void)
{
    return sfs_copier_cuda_device_count();
}
