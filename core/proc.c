/* SPDX-License-Identifier: MIT */
/*
 * proc.c - attached processes: registration, reaping a dead one's record,
 * detaching, and the counters summed into stats.
 *
 * Key idea: each attached process has a record in the control plane, its own
 * lease table, and counters only it writes. Leases of a dead process are
 * freed by the reaper, which also resets its half-filled slots to IDLE so the
 * next Get (or a waiter) takes them over; the dead process's counters are
 * folded into the header's retired totals, so stats never go backwards.
 */
#include "slot_i.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/*
 * Take the header's proc_lock, with bucket_lock's deadline meaning (0:
 * LOCK_WAIT_NS; LOCK_TRY: only if free). The retired counters it guards need
 * no repair after a dead holder: a fold cut short loses that one record's
 * last counts, nothing else.
 */
static int proc_lock(struct sfs_cache *c, int64_t deadline_ns)
{
    pthread_mutex_t *m = &c->hdr->proc_lock;
    int r = pthread_mutex_trylock(m);

    if (r == EBUSY) {
        if (deadline_ns < 0)
            return -EBUSY;
        r = robust_lock_until(m, deadline_ns);
    }
    if (r == EOWNERDEAD) {
        pthread_mutex_consistent(m);
        r = 0;
    }
    return -r;
}

/* Fold record p's counters into the retired totals; -ETIMEDOUT / -EBUSY
 * when proc_lock stayed out of reach (nothing folded). */
static int fold_counters(struct sfs_cache *c, struct sfs_proc_rec *p, int64_t deadline_ns)
{
    int r = proc_lock(c, deadline_ns);

    if (r < 0)
        return r;
    SFS_TEST_POINT("proc:fold");
    for (int i = 0; i < CTR_COUNT; i++) {
        /* Relaxed: the record's writer is gone or is us. */
        c->hdr->retired[i] += atomic_exchange_explicit(&p->ctr[i], 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&c->hdr->proc_lock);
    return 0;
}

/*
 * busy_pid is the record's transition lock: whoever moves a record between
 * states (claiming it, reaping it) first CASes busy_pid from 0 to its pid,
 * and clears it last. A process that dies holding it leaves its pid there,
 * and the next reaper inherits the transition with a second CAS.
 */
static bool rec_busy_take(struct sfs_proc_rec *p, int32_t from, int32_t me)
{
    /* acq_rel: what the last holder did happens-before us. */
    return atomic_compare_exchange_strong_explicit(&p->busy_pid, &from, me, memory_order_acq_rel,
                                                   memory_order_relaxed);
}

static void rec_busy_drop(struct sfs_proc_rec *p)
{
    /* Release: the record's new state is visible before the lock is free. */
    atomic_store_explicit(&p->busy_pid, 0, memory_order_release);
}

int sfs_proc_register(struct sfs_cache *c, int device_id)
{
    uint64_t st = 0;
    int pid = getpid();
    bool tried_reap = false;

    sfs_proc_start_time(pid, &st);
again:
    for (uint32_t i = 0; i < c->max_procs; i++) {
        struct sfs_proc_rec *p = &c->procs[i];

        if (atomic_load_explicit(&p->state, memory_order_acquire) != PROC_FREE ||
            atomic_load_explicit(&p->busy_pid, memory_order_relaxed) != 0 ||
            !rec_busy_take(p, 0, pid))
            continue;
        if (atomic_load_explicit(&p->state, memory_order_acquire) != PROC_FREE) {
            rec_busy_drop(p);
            continue;
        }
        atomic_store_explicit(&p->state, PROC_CLAIMING, memory_order_relaxed);
        atomic_store_explicit(&p->lease_hwm, 0, memory_order_relaxed); /* the table is empty */
        atomic_store_explicit(&p->start_time, st, memory_order_relaxed);
        atomic_store_explicit(&p->pid, pid, memory_order_relaxed);
        p->device_id = device_id;
        c->my_gen = atomic_fetch_add_explicit(&p->gen, 1, memory_order_relaxed) + 1;
        for (int k = 0; k < CTR_COUNT; k++)
            atomic_store_explicit(&p->ctr[k], 0, memory_order_relaxed);
        /* Release: pid/gen visible before anyone sees the record alive. */
        atomic_store_explicit(&p->state, PROC_ALIVE, memory_order_release);
        rec_busy_drop(p);
        c->me = i;
        c->self = p;
        c->leases = lease_table(c, i);
        return 0;
    }
    if (!tried_reap) {
        tried_reap = true;
        if (sfs_cache_reap(c) > 0)
            goto again;
    }
    return -EUSERS;
}

/*
 * Clean record i of a dead process (we hold its busy lock) and free it. The
 * reaper never waits for a bucket lock: one held by a live process (stopped,
 * maybe) leaves the record Reaping, and a later sfs_cache_reap() finishes it.
 * True when the record is free.
 */
static bool reap_record(struct sfs_cache *c, uint32_t i)
{
    struct sfs_proc_rec *p = &c->procs[i];
    uint32_t gen = atomic_load_explicit(&p->gen, memory_order_relaxed);

    if (atomic_load_explicit(&p->state, memory_order_relaxed) != PROC_REAPING) {
        atomic_store_explicit(&p->state, PROC_REAPING, memory_order_relaxed);
        sfs_log(LOG_NOTICE, "reaping process %d (record %u)",
                atomic_load_explicit(&p->pid, memory_order_relaxed), i);
    }
    SFS_TEST_POINT("reap:record");
    if (drop_all_leases(c, i, gen, LOCK_TRY) > 0 || fold_counters(c, p, LOCK_TRY) < 0) {
        rec_busy_drop(p); /* Reaping, busy 0: the next pass comes back */
        return false;
    }
    sfs_ctr_add(c, CTR_REAPED, 1);
    atomic_store_explicit(&p->pid, 0, memory_order_relaxed);
    /* Release: the record is clean before it can be claimed again. */
    atomic_store_explicit(&p->state, PROC_FREE, memory_order_release);
    rec_busy_drop(p);
    return true;
}

int sfs_cache_reap(struct sfs_cache *c)
{
    int n = 0, me = getpid();

    if (!c)
        return -EINVAL;
    for (uint32_t i = 0; i < c->max_procs; i++) {
        struct sfs_proc_rec *p = &c->procs[i];
        int32_t busy = atomic_load_explicit(&p->busy_pid, memory_order_acquire);

        if (i == c->me)
            continue;
        if (busy != 0) {
            /* Someone is claiming or reaping it: step in only if they died
             * half-way; the CAS makes us their one successor. */
            if (busy == me || !sfs_pid_gone(busy) || !rec_busy_take(p, busy, me))
                continue;
            if (atomic_load_explicit(&p->state, memory_order_acquire) == PROC_FREE) {
                rec_busy_drop(p); /* died before changing anything */
                continue;
            }
        } else if (atomic_load_explicit(&p->state, memory_order_acquire) == PROC_REAPING) {
            /* Left half-reaped by a pass that met a busy lock: finish it. */
            if (!rec_busy_take(p, 0, me))
                continue;
            if (atomic_load_explicit(&p->state, memory_order_acquire) != PROC_REAPING) {
                rec_busy_drop(p);
                continue;
            }
        } else {
            if (atomic_load_explicit(&p->state, memory_order_acquire) != PROC_ALIVE ||
                sfs_pid_alive(atomic_load_explicit(&p->pid, memory_order_relaxed),
                              atomic_load_explicit(&p->start_time, memory_order_relaxed)))
                continue;
            if (!rec_busy_take(p, 0, me))
                continue; /* another reaper has it */
            /* Re-check under the lock: a record freed and claimed anew in the
             * meantime belongs to a live process. */
            if (atomic_load_explicit(&p->state, memory_order_acquire) != PROC_ALIVE ||
                sfs_pid_alive(atomic_load_explicit(&p->pid, memory_order_relaxed),
                              atomic_load_explicit(&p->start_time, memory_order_relaxed))) {
                rec_busy_drop(p);
                continue;
            }
        }
        if (reap_record(c, i))
            n++;
    }
    return n;
}

static void sum_proc(const struct sfs_proc_rec *p, int64_t *acc)
{
    for (int i = 0; i < CTR_COUNT; i++)
        acc[i] += atomic_load_explicit(&p->ctr[i], memory_order_relaxed);
}

static void fill_stats(struct sfs_cache *c, const int64_t *acc, struct sfs_stats *o)
{
    memset(o, 0, sizeof(*o));
    o->requests = (uint64_t)acc[CTR_REQUESTS];
    /* Hits are not counted on the hit path: every request is a hit, a miss
     * (owner or waiter) or unserved (an error). */
    int64_t hits = acc[CTR_REQUESTS] - acc[CTR_MISSES] - acc[CTR_UNSERVED];
    o->hits = hits > 0 ? (uint64_t)hits : 0; /* counters are read one by one */
    o->misses = (uint64_t)acc[CTR_MISSES];
    o->prefetched = (uint64_t)acc[CTR_PREFETCHED];
    o->prefetch_hits = (uint64_t)acc[CTR_PREFETCH_HITS];
    o->bytes_read = (uint64_t)acc[CTR_BYTES_READ];
    o->resident_bytes = acc[CTR_RESIDENT_DELTA] > 0 ? (uint64_t)acc[CTR_RESIDENT_DELTA] : 0;
    o->capacity_bytes = (uint64_t)c->nslots * c->shard_size;
    o->owner_loads = (uint64_t)acc[CTR_OWNER_LOADS];
    o->waits = (uint64_t)acc[CTR_WAITS];
    o->evictions = (uint64_t)acc[CTR_EVICTIONS];
    o->failures = (uint64_t)acc[CTR_FAILURES];
    o->takeovers = (uint64_t)acc[CTR_TAKEOVERS];
    o->prealloc = (uint64_t)acc[CTR_PREALLOC];
    o->touched = (uint64_t)acc[CTR_TOUCHED];
    o->reaped = (uint64_t)acc[CTR_REAPED];
}

void sfs_cache_stats(struct sfs_cache *c, struct sfs_stats *out)
{
    int64_t acc[CTR_COUNT] = {0};
    /* Under proc_lock a fold is never seen half-done; past LOCK_WAIT_NS (a
     * stopped holder) the sum is taken without it, a snapshot as good as
     * any counter read one by one. */
    bool locked = proc_lock(c, 0) == 0;

    for (int i = 0; i < CTR_COUNT; i++)
        acc[i] = c->hdr->retired[i];
    for (uint32_t i = 0; i < c->max_procs; i++)
        sum_proc(&c->procs[i], acc);
    if (locked)
        pthread_mutex_unlock(&c->hdr->proc_lock);
    fill_stats(c, acc, out);
}

void sfs_cache_stats_local(struct sfs_cache *c, struct sfs_stats *out)
{
    int64_t acc[CTR_COUNT] = {0};

    sum_proc(c->self, acc);
    fill_stats(c, acc, out);
}

/* Detach: free our leases, fold our counters, free the record, unmap. */
void sfs_cache_free_handle(struct sfs_cache *c)
{
    if (!c)
        return;
    if (c->self) {
        uint32_t expect = PROC_ALIVE;
        /* Each bucket lock waited for at most LOCK_WAIT_NS: leases behind a
         * lock still out of reach leave the record Reaping, for a reaper. */
        bool clean = drop_all_leases(c, c->me, c->my_gen, 0) == 0;

        if (fold_counters(c, c->self, 0) < 0)
            clean = false; /* the reaper folds them */
        if (clean)
            atomic_store_explicit(&c->self->pid, 0, memory_order_relaxed);
        atomic_compare_exchange_strong_explicit(&c->self->state, &expect,
                                                clean ? PROC_FREE : PROC_REAPING,
                                                memory_order_acq_rel, memory_order_relaxed);
    }
    sfs_dp_unmap(c);
    if (c->ctl)
        munmap(c->ctl, c->ctl_len);
    if (c->ctl_fd >= 0)
        close(c->ctl_fd);
    lease_table_fini(c);
    free(c);
}
