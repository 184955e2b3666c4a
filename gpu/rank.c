/* SPDX-License-Identifier: MIT */
/*
 * rank.c - opening and closing a rank (configuration, backend, attach and
 * engine through link.c), and its counters and accessors. Tasks are
 * task.c's, lookups, touch, pins and prefetch lookup.c's, the daemon link
 * link.c's. The moving parts live in loadqueue.c (the dispatcher),
 * owner.c (depth tokens, backend loads and dumps, workers, prefetch),
 * watch.c (watchers), copier.c (copier thread) and inline.c (small
 * resident tasks on the submitting thread); an entry's end, and a task's
 * references (caller, dispatcher, completion), in complete.c. See rank_i.h
 * for which way the calls go.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
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
        sfs_workq_destroy(&rk->behind);
    }
    pthread_mutex_destroy(&rk->mu);
    pthread_cond_destroy(&rk->idle_cv);
    pthread_mutex_destroy(&rk->wait_mu);
    pthread_mutex_destroy(&rk->depth_mu);
    pthread_cond_destroy(&rk->depth_cv);
    pthread_mutex_destroy(&rk->lease_mu);
    pthread_cond_destroy(&rk->lease_cv);
    pthread_mutex_destroy(&rk->own_mu);
    pthread_cond_destroy(&rk->own_cv);
    free(rk);
}

/* sfs_rank_open@@SHARDFS_RANK_0.2, the default: reads rank_index. */
SFS_API struct sfs_rank *rank_open_0_2(const struct sfs_rank_config *cfg, int *err);
__asm__(".symver rank_open_0_2, sfs_rank_open@@SHARDFS_RANK_0.2");

struct sfs_rank *rank_open_0_2(const struct sfs_rank_config *cfg, int *err)
{
    pthread_condattr_t ca;
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
    pthread_mutex_init(&rk->own_mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines are sfs_now_ns() */
    pthread_cond_init(&rk->own_cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_rwlock_init(&rk->link_rw, NULL);
    rk->link_stop_fd = -1;
    rk->behind_hold_fd = -1;
#ifdef SFS_TEST_HOOKS
    /* Test hook: hold each write-behind store write (owner.c). */
    if (getenv("SHARDFS_RANK_BEHIND_HOLD_FD"))
        rk->behind_hold_fd = atoi(getenv("SHARDFS_RANK_BEHIND_HOLD_FD"));
#endif
    r = sfs_workq_init(&rk->tq);
    if (r == 0 && (r = sfs_workq_init(&rk->ready)) < 0)
        sfs_workq_destroy(&rk->tq);
    if (r == 0 && (r = sfs_workq_init(&rk->work)) < 0) {
        sfs_workq_destroy(&rk->tq);
        sfs_workq_destroy(&rk->ready);
    }
    if (r == 0 && (r = sfs_workq_init(&rk->behind)) < 0) {
        sfs_workq_destroy(&rk->tq);
        sfs_workq_destroy(&rk->ready);
        sfs_workq_destroy(&rk->work);
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
#ifdef SFS_BENCH_BASELINES
    /* Baseline switch (bench_rank's pipeline figure): never inline. */
    rk->inline_off = getenv("SHARDFS_RANK_NO_INLINE") != NULL;
#endif
    rk->key_timeout_ns = (int64_t)(cfg->key_timeout_ms ? cfg->key_timeout_ms : 30000) * 1000000;
    if ((cfg->socket_path && !(rk->socket_path = strdup(cfg->socket_path))) ||
        (cfg->mount_point && !(rk->mount_point = strdup(cfg->mount_point)))) {
        *err = -ENOMEM;
        goto out_free;
    }

    r = sfs_link_attach(rk);
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
    r = sfs_link_start_engine(rk);
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
                sfs_own_token_put(rk);
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
    sfs_link_stop(rk);
    if (rk->be && rk->cache)
        sfs_cache_set_touch_hook(rk->cache, NULL, NULL);
    rank_free(rk); /* sfs_cache_close() drops any lease left */
}

/* ---------------------------------------------------------------------------
 * Counters and accessors.
 */

int sfs_rank_set_class(struct sfs_rank *rk, const char *name)
{
    int r = sfs_cache_set_class(NULL, name);

    if (!rk || r < 0)
        return -EINVAL;
    snprintf(rk->cls, sizeof(rk->cls), "%s", name);
    return sfs_cache_set_class(rk->cache, name);
}

int sfs_rank_set_dump_mode(struct sfs_rank *rk, int mode)
{
    if (!rk || (mode != SFS_DUMP_WRITE_THROUGH && mode != SFS_DUMP_WRITE_BEHIND))
        return -EINVAL;
    /* Relaxed: read at each submit (task.c); no other memory goes with it. */
    atomic_store_explicit(&rk->dump_mode, mode, memory_order_relaxed);
    return 0;
}

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
    if (sfs_link_enter(rk) == 0) {
        sfs_cache_stats(rk->cache, &o->cache);
        sfs_link_leave(rk);
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
