/* SPDX-License-Identifier: MIT */
/*
 * task.c - a rank's tasks: submitting a load or a dump (a small resident
 * load is tried inline first, inline.c; the rest goes to the dispatcher's
 * queue), waiting for a task, and dropping the caller's reference. A task's
 * end and its references are complete.c's; rank.c cancels what is still
 * queued at close.
 */
#include "rank_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The entries of a call, plain or made of pieces (exactly one is set). */
struct entries_in {
    const struct sfs_rank_entry *plain;
    const struct sfs_rank_entryv *vec;
    void *event; /* dumps: a CUDA event their sources wait for; NULL: none */
};

/* Check the pieces of a vectored call and count them: 0 and *total, or
 * -EINVAL. */
static int pieces_check(const struct sfs_rank *rk, const struct sfs_rank_entryv *v, size_t n,
                        size_t *total)
{
    *total = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t sum = 0;

        if (v[i].npieces == 0 || v[i].npieces > SFS_RANK_PIECES_MAX || !v[i].pieces)
            return -EINVAL;
        for (uint32_t j = 0; j < v[i].npieces; j++) {
            uint64_t len = v[i].pieces[j].len;

            if (!v[i].pieces[j].addr || len == 0 || len > rk->shard_size - sum)
                return -EINVAL;
            sum += len;
        }
        *total += v[i].npieces;
    }
    return 0;
}

/* Every range the host copier would touch lies in this process's memory,
 * writable for a load, readable for a dump: a device address handed to a
 * rank that copies with memcpy (a library built without CUDA, or a host
 * copier chosen for a GPU worker) is refused here, -EFAULT, not met by a
 * SIGSEGV in the copier thread. */
static int host_ranges_check(struct sfs_rank *rk, const struct sfs_task *t)
{
    bool write = t->kind == ITEM_LOAD;

    if (!rk->copier || !rk->copier->ops->host_memory)
        return 0; /* the CUDA copier places every end itself */
    for (size_t i = 0; i < t->n; i++) {
        const struct rank_item *it = &t->items[i];
        int r;

        if (it->npieces == 0) {
            r = sfs_mem_usable(it->addr, rk->shard_size, write);
            if (r < 0)
                return r;
        }
        for (uint32_t j = 0; j < it->npieces; j++) {
            r = sfs_mem_usable(it->pieces[j].addr, it->pieces[j].len, write);
            if (r < 0)
                return r;
        }
    }
    return 0;
}

static int submit_entered(struct sfs_rank *rk, struct entries_in in, size_t n, int kind,
                          struct sfs_task **out)
{
    struct sfs_task *t;
    pthread_condattr_t ca;
    size_t npieces = 0;
    int r;

    *out = NULL;
    if (rk->query_only)
        return -EPERM;
    if (in.vec && (r = pieces_check(rk, in.vec, n, &npieces)) < 0)
        return r;
    if (in.event && (!rk->copier || !rk->copier->ops->gate_open))
        return -EOPNOTSUPP;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->entries = malloc(n * sizeof(*t->entries));
    t->items = calloc(n, sizeof(*t->items));
    t->status = calloc(n, sizeof(*t->status));
    if (npieces)
        t->pieces = malloc(npieces * sizeof(*t->pieces));
    if (!t->entries || !t->items || !t->status || (npieces && !t->pieces)) {
        free(t->entries);
        free(t->items);
        free(t->status);
        free(t->pieces);
        free(t);
        return -ENOMEM;
    }
    if (in.plain)
        memcpy(t->entries, in.plain, n * sizeof(*in.plain));
    t->rank = rk;
    t->kind = kind;
    /* Relaxed: the mode the caller set before this call (same thread), or
     * either one when another thread changes it meanwhile. */
    t->behind = kind == ITEM_DUMP &&
                atomic_load_explicit(&rk->dump_mode, memory_order_relaxed) == SFS_DUMP_WRITE_BEHIND;
    t->n = n;
    t->pending = n;
    t->refs = 3; /* caller, dispatcher, completion */
    pthread_mutex_init(&t->mu, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&t->cv, &ca);
    pthread_condattr_destroy(&ca);
    for (size_t i = 0, p = 0; i < n; i++) {
        struct rank_item *it = &t->items[i];

        if (in.vec) {
            const struct sfs_rank_entryv *v = &in.vec[i];

            memcpy(&t->pieces[p], v->pieces, v->npieces * sizeof(*v->pieces));
            t->entries[i] = (struct sfs_rank_entry){
                .block = v->block, .shard = v->shard, .addr = v->pieces[0].addr};
            it->pieces = &t->pieces[p];
            it->npieces = v->npieces;
            p += v->npieces;
        }
        it->rank = rk;
        it->task = t;
        it->idx = (uint32_t)i;
        it->kind = (uint8_t)kind;
        it->key.block = t->entries[i].block;
        it->key.shard = t->entries[i].shard;
        it->addr = t->entries[i].addr;
        t->status[i] = -EINPROGRESS;
    }
    r = host_ranges_check(rk, t);
    if (r == 0 && in.event) {
        r = rk->copier->ops->gate_open(rk->copier, in.event, &t->gate);
        t->gate_close = rk->copier->ops->gate_close;
    }
    if (r < 0) {
        t->refs = 1;
        sfs_task_unref(t);
        return r;
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

static int submit(struct sfs_rank *rk, struct entries_in in, size_t n, int kind,
                  struct sfs_task **out)
{
    if (!rk || !(in.plain || in.vec) || !out || n == 0 || n > UINT32_MAX)
        return -EINVAL;
    *out = NULL;
    return SFS_LINKED(rk, submit_entered(rk, in, n, kind, out));
}

int sfs_rank_load(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                  struct sfs_task **task)
{
    return submit(rk, (struct entries_in){.plain = entries}, n, ITEM_LOAD, task);
}

int sfs_rank_dump(struct sfs_rank *rk, const struct sfs_rank_entry *entries, size_t n,
                  struct sfs_task **task)
{
    return submit(rk, (struct entries_in){.plain = entries}, n, ITEM_DUMP, task);
}

int sfs_rank_loadv(struct sfs_rank *rk, const struct sfs_rank_entryv *entries, size_t n,
                   struct sfs_task **task)
{
    return submit(rk, (struct entries_in){.vec = entries}, n, ITEM_LOAD, task);
}

int sfs_rank_dumpv(struct sfs_rank *rk, const struct sfs_rank_entryv *entries, size_t n,
                   struct sfs_task **task)
{
    return submit(rk, (struct entries_in){.vec = entries}, n, ITEM_DUMP, task);
}

int sfs_rank_dumpv_after(struct sfs_rank *rk, const struct sfs_rank_entryv *entries, size_t n,
                         void *cuda_event, struct sfs_task **task)
{
    if (!cuda_event)
        return -EINVAL;
    return submit(rk, (struct entries_in){.vec = entries, .event = cuda_event}, n, ITEM_DUMP,
                  task);
}

/* The task's end is seen by its user: its write-behind store writes may
 * start (owner.c waits for this). Under t->mu. */
static void task_seen(struct sfs_task *t)
{
    if (!t->seen) {
        t->seen = true;
        if (t->behind)
            pthread_cond_broadcast(&t->cv);
    }
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
    if (r == 0)
        task_seen(t);
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
    if (done)
        task_seen(t);
    pthread_mutex_unlock(&t->mu);
    return done;
}

size_t sfs_rank_task_size(struct sfs_task *t)
{
    return t ? t->n : 0;
}

void sfs_rank_task_free(struct sfs_task *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    task_seen(t); /* nobody looks any more */
    pthread_mutex_unlock(&t->mu);
    sfs_task_unref(t);
}
