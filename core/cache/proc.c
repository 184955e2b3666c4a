/* SPDX-License-Identifier: MIT */
/*
 * proc.c - attached processes: registration, reaping a dead one's record,
 * detaching, and the counters summed into stats.
 *
 * Key idea: each attached process has a record in the control plane, its own
 * lease table, and counters only it writes. The server claims the record of
 * each client it welcomes and declares it dead when that client's
 * connection closes: liveness is owned by the daemon, never judged from a
 * pid. Leases of a dead process are freed by the reaper (in the server's
 * process), which also resets its half-filled slots to IDLE so the next Get
 * (or a waiter) takes them over; the dead process's counters are folded
 * into the header's retired totals, so stats never go backwards.
 */
#include "slot_i.h"
#include "testpoint_i.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Counters live in shared memory, so any attached process can write any
 * value into them: they are summed modulo 2^64, never with signed overflow
 * (found by tests/fuzz/fuzz_ctl_header.c). */
static int64_t ctr_sum(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

/* Fold record p's counters into the retired totals; -ETIMEDOUT / -EBUSY
 * when proc_lock stayed out of reach (nothing folded). */
static int fold_counters(struct sfs_cache *c, struct sfs_proc_rec *p, int64_t deadline_ns)
{
    int r = sfs_proc_lock(c, deadline_ns);

    if (r < 0)
        return r;
    SFS_TEST_POINT("proc:fold");
    /* The lock-free hits, counted per lease entry (hits_sum), are requests. */
    atomic_fetch_add_explicit(&p->ctr[CTR_REQUESTS],
                              (int64_t)hits_sum(c, (uint32_t)(p - c->procs), true),
                              memory_order_relaxed);
    int64_t v[CTR_COUNT];

    for (int i = 0; i < CTR_COUNT; i++) {
        /* Relaxed: the record's writer is gone or is us. */
        v[i] = atomic_exchange_explicit(&p->ctr[i], 0, memory_order_relaxed);
        c->hdr->retired[i] = ctr_sum(c->hdr->retired[i], v[i]);
    }
    sfs_served_fold(c, p, v);
    pthread_mutex_unlock(&c->hdr->proc_lock);
    return 0;
}

/*
 * Who may change a record's state, and when (enum sfs_proc_state):
 *
 *   FREE -> CLAIMING   a claimer's CAS: the server (for a client it welcomes),
 *                      the creator, or an attach_fds handle; the CAS is the
 *                      claim's lock
 *   CLAIMING -> ALIVE  that claimer, once gen, pid and counters are written
 *   ALIVE -> FREE      a handle's own detach (not a connection's record)
 *   ALIVE -> LEFT      a connection's client, detaching: leases freed, then
 *                      the connection closes
 *   LEFT -> FREE       the server, when that connection closes
 *   ALIVE -> DEAD      the server, when the connection it claimed the record
 *                      for closes (exit, exec or detach) or the peer's pidfd
 *                      says it exited; or a handle's own detach (not a
 *                      connection's record) that left leases behind a lock
 *                      it could not take within LOCK_WAIT_NS
 *   DEAD -> REAPING    a reaper's CAS, in the server's process only
 *   REAPING -> FREE    that reaper, once the leases are freed and the
 *                      counters folded
 *   REAPING -> DEAD    that reaper, when a lock it only tries was busy: the
 *                      next pass (within 200 ms) takes it again
 *
 * No process judges another by its pid: pids differ across pid namespaces
 * and survive exec. Only the server, which holds each client's connection,
 * declares a record dead. Every actor above is either the server's process
 * (which takes the whole cache with it when it dies) or a handle that was
 * not attached through a connection (tests, tools); so no transition is
 * left half-done by a process that others would have to detect.
 */
static int claim(struct sfs_cache *c, int pid, uint32_t uid, int device_id, uint32_t kind,
                 uint32_t *out_i, uint32_t *out_gen)
{
    /* Bounded: one pass over max_procs records. */
    for (uint32_t i = 0; i < c->max_procs; i++) {
        struct sfs_proc_rec *p = &c->procs[i];
        uint32_t expect = PROC_FREE;

        /* acq_rel: the last reaper's writes happen-before ours. */
        if (!atomic_compare_exchange_strong_explicit(&p->state, &expect, PROC_CLAIMING,
                                                     memory_order_acq_rel, memory_order_relaxed))
            continue;
        /* Relaxed, all of these: the release store of ALIVE publishes them. */
        /* The table is empty; its hit lines are always read. */
        atomic_store_explicit(&p->lease_hwm, c->nhit, memory_order_relaxed);
        /* seq_cst: before any hit of the record's process, in the order a
         * closer reads it in (sfs_hit_leased). Bounded: one raise. */
        uint32_t used = atomic_load_explicit(&c->hdr->procs_used, memory_order_relaxed);
        while (used < i + 1 &&
               !atomic_compare_exchange_weak_explicit(&c->hdr->procs_used, &used, i + 1,
                                                      memory_order_seq_cst, memory_order_relaxed))
            ;
        atomic_store_explicit(&p->release_waiting, 0, memory_order_relaxed);
        atomic_store_explicit(&p->pid, pid, memory_order_relaxed);
        p->device_id = device_id;
        p->kind = kind;
        p->uid = uid;
        uint32_t gen = atomic_fetch_add_explicit(&p->gen, 1, memory_order_relaxed) + 1;
        for (int k = 0; k < CTR_COUNT; k++)
            atomic_store_explicit(&p->ctr[k], 0, memory_order_relaxed);
        sfs_served_clear(p);
        /* Release: gen, pid and counters visible before anyone sees it alive. */
        atomic_store_explicit(&p->state, PROC_ALIVE, memory_order_release);
        *out_i = i;
        *out_gen = gen;
        return 0;
    }
    return -EUSERS;
}

static void adopt(struct sfs_cache *c, uint32_t i, uint32_t gen)
{
    /* Read once: the record is ours from here, and its claimer wrote the
     * uid before the release store of ALIVE our caller loaded (acquire). */
    c->uid = c->procs[i].uid;
    c->me = i;
    c->my_gen = gen;
    c->self = &c->procs[i];
    c->leases = lease_table(c, i);
    c->hits = hit_table(c, i);
}

int sfs_proc_register(struct sfs_cache *c, int device_id)
{
    uint32_t i, gen;
    int r = claim(c, getpid(), (uint32_t)geteuid(), device_id, PROC_KIND_HANDLE, &i, &gen);

    if (r == 0)
        adopt(c, i, gen);
    return r;
}

int sfs_proc_claim_for(struct sfs_cache *c, int pid, uint32_t uid, int device_id, uint32_t *i,
                       uint32_t *gen)
{
    return claim(c, pid, uid, device_id, PROC_KIND_CONN, i, gen);
}

int sfs_proc_adopt(struct sfs_cache *c, uint32_t i, uint32_t gen)
{
    if (i >= c->max_procs)
        return -EBADMSG;
    struct sfs_proc_rec *p = &c->procs[i];
    /* Acquire on state: pairs with the claimer's release store of ALIVE, so
     * the relaxed gen load after it sees the claim's gen. */
    if (atomic_load_explicit(&p->state, memory_order_acquire) != PROC_ALIVE ||
        atomic_load_explicit(&p->gen, memory_order_relaxed) != gen || p->kind != PROC_KIND_CONN)
        return -EBADMSG;
    adopt(c, i, gen);
    return 0;
}

bool sfs_proc_mark_dead(struct sfs_cache *c, uint32_t i, uint32_t gen)
{
    struct sfs_proc_rec *p;
    uint32_t expect = PROC_ALIVE;

    if (i >= c->max_procs)
        return false;
    p = &c->procs[i];
    /* Only the server moves a connection's record out of ALIVE, and it is
     * not FREE (so not reclaimed) until reaped: the gen read here is the
     * one the server claimed. */
    if (atomic_load_explicit(&p->gen, memory_order_relaxed) != gen)
        return false;
    /* Release: seen by owner_alive_rec's acquire load in every process. */
    if (atomic_compare_exchange_strong_explicit(&p->state, &expect, PROC_DEAD, memory_order_acq_rel,
                                                memory_order_relaxed))
        return true;
    /* It detached itself: nothing left to reap, not a death. acq_rel: its
     * lease drops happen-before the record is claimed again. */
    expect = PROC_LEFT;
    atomic_compare_exchange_strong_explicit(&p->state, &expect, PROC_FREE, memory_order_acq_rel,
                                            memory_order_relaxed);
    return false;
}

/*
 * Clean record i (we moved it DEAD -> REAPING) and free it. The reaper never
 * waits for a lock: leases behind a bucket lock held by a live process
 * (stopped, maybe), or a proc_lock out of reach, put the record back to
 * DEAD, and the next pass (the server's reaper comes back within 200 ms)
 * finishes it. True when the record is free.
 */
static bool reap_record(struct sfs_cache *c, uint32_t i)
{
    struct sfs_proc_rec *p = &c->procs[i];
    /* Relaxed: our REAPING CAS (acq_rel) ordered the claim's writes before. */
    uint32_t gen = atomic_load_explicit(&p->gen, memory_order_relaxed);

    SFS_TEST_POINT("reap:record");
    /* Its Loading slots go back to Idle with a version bump and a wake:
     * that is what wakes their waiters. */
    if (sfs_drop_all_leases(c, i, gen, LOCK_TRY) > 0 || fold_counters(c, p, LOCK_TRY) < 0) {
        /* Part-way: what was dropped stays dropped (each under its lock).
         * Back to DEAD, never left REAPING: only a DEAD record is picked up
         * again, so this is what makes the next pass retry it. Release: our
         * drops happen-before the next reaper's CAS. */
        atomic_store_explicit(&p->state, PROC_DEAD, memory_order_release);
        return false;
    }
    /* Its threads killed asleep for a free slot: their share of the
     * header's count goes (relaxed: the dead process writes it no more). */
    uint32_t w = atomic_exchange_explicit(&p->release_waiting, 0, memory_order_relaxed);
    if (w)
        atomic_fetch_sub_explicit(&c->hdr->release_waiters, w, memory_order_seq_cst);
    sfs_log(LOG_NOTICE, "reaped process %d (record %u)",
            atomic_load_explicit(&p->pid, memory_order_relaxed), i);
    sfs_ctr_add(c, CTR_REAPED, 1);
    atomic_store_explicit(&p->pid, 0, memory_order_relaxed); /* published by the FREE store */
    /* Release: the record is clean before it can be claimed again. */
    atomic_store_explicit(&p->state, PROC_FREE, memory_order_release);
    return true;
}

int sfs_cache_reap(struct sfs_cache *c)
{
    int n = 0;

    if (!c)
        return -EINVAL;
    if (!c->creator)
        return 0;                /* only the server's process reaps: it alone saw them go */
    SFS_TEST_POINT("proc:reap"); /* tests hold the server's reaper here */
    /* Bounded: one pass over max_procs records. */
    for (uint32_t i = 0; i < c->max_procs; i++) {
        uint32_t expect = PROC_DEAD;

        /* acq_rel: the server's DEAD store and the dead one's last writes
         * happen-before the reap; one reaper wins. */
        if (!atomic_compare_exchange_strong_explicit(&c->procs[i].state, &expect, PROC_REAPING,
                                                     memory_order_acq_rel, memory_order_relaxed))
            continue;
        if (reap_record(c, i))
            n++;
    }
    return n;
}

static void sum_proc(const struct sfs_cache *c, uint32_t i, int64_t *acc)
{
    const struct sfs_proc_rec *p = &c->procs[i];

    for (int k = 0; k < CTR_COUNT; k++)
        acc[k] = ctr_sum(acc[k], atomic_load_explicit(&p->ctr[k], memory_order_relaxed));
    acc[CTR_REQUESTS] = ctr_sum(acc[CTR_REQUESTS], (int64_t)hits_sum(c, i, false));
}

static void fill_stats(struct sfs_cache *c, const int64_t *acc, struct sfs_stats *o)
{
    memset(o, 0, sizeof(*o));
    o->requests = (uint64_t)acc[CTR_REQUESTS];
    /* Hits are not counted on the hit path: every request is a hit, a miss
     * (owner or waiter) or unserved (an error). */
    int64_t hits = (int64_t)((uint64_t)acc[CTR_REQUESTS] - (uint64_t)acc[CTR_MISSES] -
                             (uint64_t)acc[CTR_UNSERVED]); /* modulo 2^64, as ctr_sum */
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

/* Every process's counters, the gone ones' included, into acc. */
static void sum_all(struct sfs_cache *c, int64_t *acc)
{
    /* Under proc_lock a fold is never seen half-done; past LOCK_WAIT_NS (a
     * stopped holder) the sum is taken without it, a snapshot as good as
     * any counter read one by one. */
    bool locked = sfs_proc_lock(c, 0) == 0;

    for (int i = 0; i < CTR_COUNT; i++)
        acc[i] = c->hdr->retired[i];
    for (uint32_t i = 0; i < c->max_procs; i++)
        sum_proc(c, i, acc);
    if (locked)
        pthread_mutex_unlock(&c->hdr->proc_lock);
}

void sfs_cache_stats(struct sfs_cache *c, struct sfs_stats *out)
{
    int64_t acc[CTR_COUNT] = {0};

    sum_all(c, acc);
    fill_stats(c, acc, out);
}

void sfs_cache_count_behind(struct sfs_cache *c, int result)
{
    if (c)
        sfs_ctr_add(c, result < 0 ? CTR_BEHIND_FAILED : CTR_BEHIND_WRITTEN, 1);
}

void sfs_cache_behind_stats(struct sfs_cache *c, struct sfs_behind_stats *out)
{
    int64_t acc[CTR_COUNT] = {0};

    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    if (!c)
        return;
    sum_all(c, acc);
    out->written = (uint64_t)acc[CTR_BEHIND_WRITTEN];
    out->failed = (uint64_t)acc[CTR_BEHIND_FAILED];
}

void sfs_cache_stats_local(struct sfs_cache *c, struct sfs_stats *out)
{
    int64_t acc[CTR_COUNT] = {0};

    sum_proc(c, c->me, acc);
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
         * lock still out of reach are left for the server's reaper. */
        bool clean = sfs_drop_all_leases(c, c->me, c->my_gen, 0) == 0;

        if (fold_counters(c, c->self, 0) < 0)
            clean = false; /* the reaper folds them */
        if (clean)
            atomic_store_explicit(&c->self->pid, 0, memory_order_relaxed);
        /* Clean: a connection's record is the server's to free, when the
         * connection closes (after this): we only say we left (LEFT); a
         * handle's record is free. Not clean: a connection's record stays
         * ALIVE, and the close makes the server declare it dead and reap
         * what is left; a handle's record is declared DEAD here, for the
         * server's reaper. */
        uint32_t to = clean ? (c->conn_fd < 0 ? PROC_FREE : PROC_LEFT)
                            : (c->conn_fd < 0 ? PROC_DEAD : PROC_ALIVE);
        if (to != PROC_ALIVE)
            atomic_compare_exchange_strong_explicit(&c->self->state, &expect, to,
                                                    memory_order_acq_rel, memory_order_relaxed);
    }
    sfs_dp_unmap(c);
    if (c->ctl)
        munmap(c->ctl, c->ctl_len);
    if (c->ctl_fd >= 0)
        close(c->ctl_fd);
    sfs_lease_table_fini(c);
    free(c);
}
