/* SPDX-License-Identifier: MIT */
/*
 * inline.c - small tasks on the submitting thread.
 *
 * A load of at most RANK_INLINE_KEYS_MAX entries and RANK_INLINE_BYTES_MAX
 * bytes whose keys are all Ready never leaves the submitting thread: it
 * Gets every key (in the walk's own order), copies through the copier's
 * load_inline (memcpy; with CUDA, one gather launch on the copier's inline
 * stream, synchronized), releases and completes the task -- no hand-off to
 * the dispatcher, the copier and back (a one-key resident load took 26-31
 * us that way, the core's Get+copy+Release 1.5-2). The task is complete
 * when sfs_rank_load returns; sfs_rank_wait reports it as any other.
 *
 * A load of at most RANK_INLINE_KEYS_MAX entries but more bytes is tried
 * the same way, all but the copy: its Ready keys go to the copier thread
 * in one push, which copies them while sfs_rank_load returns (the call
 * stays short); one hand-off instead of two, which on a host short of
 * CPUs is a wake-up less to wait for.
 *
 * Anything else goes the pipeline, losing nothing: the try stops at the
 * first key that is not a hit. Every key it Got is handed to the dispatcher
 * with its role (item->pregot), which routes it without a second Get --
 * hits to the copier, waiters to a watcher, an owner with the depth token
 * the try took for it -- and walks the rest as usual. The try walks the
 * dispatcher's order and stops where the dispatcher would first meet a
 * non-hit, so which rank owns which missing key is unchanged. An ownership
 * it cannot serve at once (no free depth token) is released unsettled (the
 * slot goes Idle, any rank's next Get takes it over), as the dispatcher
 * never holds an ownership while it waits for a token. A Get error (a full
 * cache, out of leases) leaves the key to the dispatcher's Get and its
 * waits (the cache then counts that key's Get twice).
 *
 * Ordering with dumps: a load never overtakes a dump of this rank. The try
 * runs only when no dump task is queued or being walked (dumps_unwalked is
 * 0); once walked, a dump owns its keys for writing, so a load of one of
 * them is a waiter (not a hit) and goes the pipeline, to be copied after
 * the dump's publish, exactly as before.
 *
 * Calls go down only: to owner.c (a depth token), copier.c (the copy
 * and the items' end) and complete.c through it; the task queue is pushed
 * by task.c when this returns false.
 */
#include "rank_i.h"

static bool inline_eligible(struct sfs_rank *rk, size_t n)
{
    return !rank_inline_off(rk) && !rank_blocking_waits(rk) && n <= RANK_INLINE_KEYS_MAX &&
           rk->copier && rk->copier->ops->load_inline &&
           /* Acquire: pairs with the dispatcher's release after a dump's
            * walk (its Gets are seen). */
           atomic_load_explicit(&rk->dumps_unwalked, memory_order_acquire) == 0 &&
           !rank_link_lost(rk);
}

bool sfs_inline_load(struct sfs_rank *rk, struct sfs_task *t)
{
    uint32_t order[RANK_INLINE_KEYS_MAX];
    struct rank_item *got[RANK_INLINE_KEYS_MAX];
    size_t n = t->n, k;

    if (!inline_eligible(rk, n))
        return false;
    if (rk->rotate) {
        sfs_rank_rearrange(n, rk->r, rk->N, order);
    } else {
        for (size_t i = 0; i < n; i++)
            order[i] = (uint32_t)i;
    }
    for (k = 0; k < n; k++) {
        struct rank_item *it = &t->items[order[k]];
        int role;

        if (rank_link_lost(rk))
            break; /* the dispatcher fails the rest with -ESHUTDOWN */
        role = sfs_cache_get(rk->cache, &it->key, 0, 0, &it->lease);
        if (role < 0)
            break; /* full, out of leases, ...: the dispatcher's Get waits */
        if (role == SFS_HIT) {
            it->pregot = PREGOT_HIT;
            it->leased = true;
            got[k] = it;
            continue;
        }
        if (role == SFS_WAITER) {
            it->pregot = PREGOT_WAITER;
            it->leased = true;
        } else if (sfs_own_token_try(rk)) {
            it->pregot = PREGOT_OWNER;
            it->leased = true;
        } else {
            /* Never hold an ownership we cannot serve: Idle, for any
             * rank's next Get (ours, from the dispatcher, included). */
            sfs_cache_release(rk->cache, &it->lease);
        }
        break;
    }
    if (k < n)
        return false;
    /* All Ready. Counted as the dispatcher counts hits: before any copy. */
    rank_ctr_add(rk, RC_HITS, n);
    for (size_t i = 0; i < n; i++) {
        got[i]->pregot = PREGOT_NONE;
        got[i]->step = STEP_COPY_OUT;
        got[i]->qn.next = i + 1 < n ? &got[i + 1]->qn : NULL;
    }
    /* Too many bytes to copy in the call, or not on this thread (a CUDA
     * copier whose device is not this thread's current one, or whose
     * inline stream another thread is using): the copier thread copies the
     * run, one hand-off instead of two. */
    if ((uint64_t)n * rk->shard_size > RANK_INLINE_BYTES_MAX || sfs_copier_inline(rk, got, n) < 0)
        rank_push_copy_chain(rk, got[0], got[n - 1]);
    /* The dispatcher's reference is never used (the completion reference
     * goes with the last entry). */
    sfs_task_unref(t);
    return true;
}
