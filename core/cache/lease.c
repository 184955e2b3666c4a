/* SPDX-License-Identifier: MIT */
/*
 * lease.c - lease tables: entries in shared memory, free entries in private
 * memory, one spare per thread, and dropping leases.
 *
 * Key idea: a lease is one entry in its process's table in the control plane
 * (slot + 1, see slot_i.h). A lock-free hit's lease sits in its slot's hit
 * line at the table's start and is in no count (sfs_hit_leased finds it). A
 * counted lease's entry is marked in transit (ENTRY_TRANSIT) around every
 * change of the slot's count made for it, under the bucket lock or
 * lock-free (a release on an open Ready slot), so the count of any slot can
 * be settled from the tables after a death (sfs_slot_recount in bucket.c; the
 * argument is in docs/recovery.md). Which
 * entries are free is private to the process: a lock-free stack, plus one
 * spare entry per thread so a thread's Get/Release pair touches no shared
 * word for its entry. A refcount that drops to 0 is what a Get waiting for a
 * free slot waits for (release_seq, evict.c).
 */
#include "slot_i.h"

#include <stdlib.h>

/*
 * The free entries form a Treiber stack in private memory: the head packs a
 * tag (bumped on every pop, against ABA) with the top entry + 1. Pop and push
 * are one CAS each, so threads of one process never serialise on a mutex
 * here.
 */
#define FREE_TOP(h) ((uint32_t)(h))
#define FREE_TAG(h) ((h) >> 32)

/* Entry top - 1 is about to be used: raise our record's high-water mark, so
 * repair reads it (release: the mark is visible before any entry written
 * beyond it under a bucket lock). Our process is its only writer. */
static void hwm_raise(struct sfs_cache *c, uint32_t top)
{
    if (!c->self)
        return;
    uint32_t hw = atomic_load_explicit(&c->self->lease_hwm, memory_order_relaxed);

    while (hw < top && !atomic_compare_exchange_weak_explicit(&c->self->lease_hwm, &hw, top,
                                                             memory_order_release,
                                                             memory_order_relaxed))
        ;
}

int sfs_entry_pop(struct sfs_cache *c, uint32_t *e)
{
    /* Acquire: the next link of the top was written before it was pushed. */
    uint64_t h = atomic_load_explicit(&c->free_head, memory_order_acquire);

    SFS_TEST_POINT("lease:pop"); /* counted by tests: a Get that found no spare */
    for (;;) {
        uint32_t top = FREE_TOP(h);

        if (top == 0)
            return -ENOBUFS;
        uint32_t next = atomic_load_explicit(&c->free_next[top - 1], memory_order_relaxed);
        uint64_t nh = (FREE_TAG(h) + 1) << 32 | next;

        if (atomic_compare_exchange_weak_explicit(&c->free_head, &h, nh, memory_order_acquire,
                                                  memory_order_acquire)) {
            SFS_ASSERT(top <= c->max_leases); /* the stack is private memory */
            *e = top - 1;
            hwm_raise(c, top);
            return 0;
        }
    }
}

void sfs_entry_push(struct sfs_cache *c, uint32_t e)
{
    uint64_t h = atomic_load_explicit(&c->free_head, memory_order_relaxed);

    for (;;) {
        atomic_store_explicit(&c->free_next[e], FREE_TOP(h), memory_order_relaxed);
        /* Release: the link is visible before the entry is on top. */
        if (atomic_compare_exchange_weak_explicit(&c->free_head, &h, FREE_TAG(h) << 32 | (e + 1),
                                                  memory_order_release, memory_order_relaxed))
            return;
    }
}

/*
 * Each thread keeps one spare entry of one handle, so the common Get/Release
 * pair of a thread touches no shared word for its entry. A spare goes back
 * to its handle's stack when the thread exits, if the handle is still open
 * (handles are looked up by id in a process-wide registry, so a closed
 * handle is never touched), and when the thread has freed SPARE_SWITCH
 * entries of another handle in a row: the spare follows the handle the
 * thread uses (after a re-attach, or in a child forked by a process that
 * had attached, whose spare names its parent's handle).
 */

/* initial-exec: a plain %fs-relative access, not a __tls_get_addr call. */
__thread struct lease_spare lease_spare __attribute__((tls_model("initial-exec")));
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sfs_cache *registry; /* open handles, by reg_next; registry_mu */
static _Atomic uint64_t next_handle_id;

static void spare_exit(void *arg)
{
    struct lease_spare *sp = arg;

    pthread_mutex_lock(&registry_mu);
    for (struct sfs_cache *c = registry; c; c = c->reg_next) {
        if (c->id == sp->id) {
            sfs_entry_push(c, sp->e);
            break;
        }
    }
    pthread_mutex_unlock(&registry_mu);
    sp->id = 0;
    sp->misses = 0;
}

void sfs_lease_spare_switch(struct sfs_cache *c, uint32_t e)
{
    pthread_mutex_lock(&registry_mu);
    for (struct sfs_cache *o = registry; o; o = o->reg_next) {
        if (o->id == lease_spare.id) {
            sfs_entry_push(o, lease_spare.e);
            break;
        }
    }
    pthread_mutex_unlock(&registry_mu);
    lease_spare.id = c->id;
    lease_spare.e = e;
    lease_spare.misses = 0;
}

static void spare_init(void)
{
    pthread_key_create(&spare_key, spare_exit);
}

/* The first spare a thread keeps: the key makes the destructor run at
 * thread exit (only this thread reads its spare). */
void sfs_lease_spare_arm(void)
{
    lease_spare.keyed = true;
    pthread_setspecific(spare_key, &lease_spare);
}

/* Called once per handle when its lease table is ready. */
static void registry_add(struct sfs_cache *c)
{
    pthread_once(&spare_once, spare_init);
    c->id = atomic_fetch_add_explicit(&next_handle_id, 1, memory_order_relaxed) + 1;
    pthread_mutex_lock(&registry_mu);
    c->reg_next = registry;
    registry = c;
    pthread_mutex_unlock(&registry_mu);
}

static void registry_remove(struct sfs_cache *c)
{
    pthread_mutex_lock(&registry_mu);
    for (struct sfs_cache **p = &registry; *p; p = &(*p)->reg_next) {
        if (*p == c) {
            *p = c->reg_next;
            break;
        }
    }
    pthread_mutex_unlock(&registry_mu);
    if (lease_spare.id == c->id)
        lease_spare.id = 0; /* ours was of this handle: it goes with it */
}

/*
 * Bucket lock held: one lease fewer on s. The last one frees a slot a full
 * cache's Get may be waiting for. A Get that found no free slot registers in
 * release_waiters, then reads release_seq, then rescans before it sleeps; a
 * last release bumps release_seq (and wakes) only when it sees a waiter
 * (Dekker: each side's fence orders its write before its read, so the
 * release sees the registration, or the rescan sees the free slot). So no
 * release is lost, and a release with no one waiting writes no shared line:
 * the hit path's Get+Release stays within its own bucket.
 *
 * At 0 no lease holder is left, so no live waiter sleeps on the slot (a
 * waiter holds its lease through its sleep): nwaiters is reset, and a waiter
 * killed in its sleep leaves it raised only until then.
 */
void sfs_refcount_drop(struct sfs_cache *c, struct sfs_slot_rec *s)
{
    uint32_t w = atomic_load_explicit(&s->refcount, memory_order_relaxed);

    do {
        if (SLOT_REF_COUNT(w) == 0)
            return; /* saturate: a repaired count is never driven below zero */
        /* Release: our reads of the bytes happen-before a closer's acquire
         * CAS (slot_close_free) that sees the count at 0. */
    } while (!atomic_compare_exchange_weak_explicit(&s->refcount, &w, w - 1, memory_order_release,
                                                    memory_order_relaxed));
    if (SLOT_REF_COUNT(w) == 1)
        refcount_last(c, s);
}

/* Drop the lease in entry e on slot s: bucket lock held. An owner that lets
 * go of a slot it never published leaves it Idle, and waiters take over. */
void sfs_release_locked(struct sfs_cache *c, uint32_t proc, uint32_t gen,
                           _Atomic uint32_t *table, uint32_t e, uint32_t s)
{
    struct sfs_slot_rec *sl = &c->slots[s];
    uint32_t v = atomic_load_explicit(&table[e], memory_order_relaxed);

    /* In transit until the count is down: a death in between is settled by
     * a recount (sfs_slot_recount), never by a second decrement. */
    atomic_store_explicit(&table[e], v | ENTRY_TRANSIT, memory_order_relaxed);
    if ((v & ENTRY_OWNER) &&
        atomic_load_explicit(&sl->state, memory_order_relaxed) == SFS_STATE_LOADING &&
        atomic_load_explicit(&sl->owner, memory_order_relaxed) == proc &&
        atomic_load_explicit(&sl->owner_gen, memory_order_relaxed) == gen) {
        atomic_store_explicit(&sl->owner, SFS_NIL, memory_order_relaxed);
        set_state(sl, SFS_STATE_IDLE);
    }
    SFS_TEST_POINT("release:transit_locked");
    sfs_refcount_drop(c, sl);
    atomic_store_explicit(&table[e], SFS_ENTRY_FREE, memory_order_relaxed);
}

bool sfs_hit_leased(struct sfs_cache *c, uint32_t s)
{
    /* seq_cst: after the close in the single order, or the claim of the
     * record that hits (raised before it is Alive) is seen. */
    uint32_t n = atomic_load_explicit(&c->hdr->procs_used, memory_order_seq_cst);
    uint32_t base = hit_line_of(c, s);

    if (n > c->max_procs)
        n = c->max_procs; /* shared memory is input */
    for (uint32_t p = 0; p < n; p++) {
        _Atomic uint32_t *t = lease_table(c, p) + base;

        for (uint32_t k = 0; k < SFS_HIT_LINE; k++)
            if (atomic_load_explicit(&t[k], memory_order_seq_cst) == s + 1)
                return true;
    }
    return false;
}

/* Free every lease in proc p's table (p is dead, or is us detaching); a
 * lease whose bucket lock is out of reach by deadline_ns (LOCK_TRY: busy
 * now) stays for a later call. Returns the number left. Bounded by the
 * table's max_leases entries. */
int sfs_drop_all_leases(struct sfs_cache *c, uint32_t p, uint32_t gen, int64_t deadline_ns)
{
    _Atomic uint32_t *t = lease_table(c, p);
    int left = 0;

    for (uint32_t e = 0; e < c->max_leases; e++) {
        uint32_t v = atomic_load_explicit(&t[e], memory_order_relaxed);

        if (v == SFS_ENTRY_FREE)
            continue;
        if (entry_is_hit(c, e)) {
            /* A hit's lease is in no count: freeing it is the release
             * (seq_cst, as a hit's own: a closer's read of the line sees
             * it free, or a full cache's waiter is woken below). */
            atomic_store_explicit(&t[e], SFS_ENTRY_FREE, memory_order_seq_cst);
            hit_released(c);
            continue;
        }
        if (!slot_ok(c, ENTRY_SLOT1(v) - 1)) {
            atomic_store_explicit(&t[e], SFS_ENTRY_FREE, memory_order_relaxed);
            continue;
        }
        uint32_t s = ENTRY_SLOT1(v) - 1;
        uint32_t b = atomic_load_explicit(&c->slots[s].bucket, memory_order_relaxed);
        if (b >= c->nbuckets) {
            /* A leased slot on no valid chain: only a bad write does that,
             * and there is no lock to count it down under. */
            atomic_store_explicit(&t[e], SFS_ENTRY_FREE, memory_order_relaxed);
            continue;
        }
        if (bucket_lock(c, b, deadline_ns) < 0) {
            /* Held by a stopped (or slow) process: never drop the entry
             * without its count, come back later. */
            left++;
            continue;
        }
        if (atomic_load_explicit(&t[e], memory_order_relaxed) == v) {
            if (!(v & ENTRY_TRANSIT))
                sfs_release_locked(c, p, gen, t, e, s);
            else if (sfs_slot_recount(c, s) < 0)
                left++; /* a live process is mid-step on s: the next pass */
            /* A transit entry of ours (we detach with a Get in flight on
             * another thread) stays too: sfs_slot_recount sees us alive. */
            else if (atomic_load_explicit(&t[e], memory_order_relaxed) != SFS_ENTRY_FREE)
                left++;
        }
        bucket_unlock(c, b);
    }
    return left;
}

/* Our lease in entry e (holding v) could not be released under its lock:
 * mark it, to be finished by sfs_lease_finish_deferred(). The CAS fails when
 * another thread released it meanwhile (false: a second release). Relaxed:
 * the mark changes no count (repair still counts the entry); it only keeps
 * the holder from using it. */
bool sfs_lease_defer(struct sfs_cache *c, uint32_t e, uint32_t v)
{
    if (v & ENTRY_DROP ||
        !atomic_compare_exchange_strong_explicit(&c->leases[e], &v, v | ENTRY_DROP,
                                                 memory_order_relaxed, memory_order_relaxed))
        return false;
    atomic_fetch_add_explicit(&c->deferred, 1, memory_order_relaxed);
    return true;
}

/* Finish our deferred releases whose bucket lock is free now. Bounded by
 * the table's max_leases entries; called only while some are deferred. */
void sfs_lease_finish_deferred(struct sfs_cache *c)
{
    for (uint32_t e = 0; e < c->max_leases; e++) {
        uint32_t v = atomic_load_explicit(&c->leases[e], memory_order_relaxed);

        if (!(v & ENTRY_DROP))
            continue;
        uint32_t s = ENTRY_SLOT1(v) - 1;
        uint32_t b = slot_ok(c, s) ? atomic_load_explicit(&c->slots[s].bucket,
                                                           memory_order_relaxed)
                                   : SFS_NIL;
        if (b >= c->nbuckets || bucket_lock(c, b, LOCK_TRY) < 0)
            continue;
        /* Under the lock: another thread of ours may have finished it. */
        bool mine = atomic_load_explicit(&c->leases[e], memory_order_relaxed) == v;
        if (mine)
            sfs_release_locked(c, c->me, c->my_gen, c->leases, e, s);
        bucket_unlock(c, b);
        if (mine) {
            entry_free(c, e);
            SFS_ASSERT(atomic_load_explicit(&c->deferred, memory_order_relaxed) > 0);
            atomic_fetch_sub_explicit(&c->deferred, 1, memory_order_relaxed);
        }
    }
}

int sfs_lease_table_init(struct sfs_cache *c)
{
    c->free_next = malloc(sizeof(*c->free_next) * c->max_leases);
    if (!c->free_next)
        return -ENOMEM;
    /* Entry i links to i + 1 (as "top" values: index + 1), 0 ends the
     * stack; the hit lines before c->nhit are never on it. */
    for (uint32_t i = 0; i < c->max_leases; i++)
        atomic_init(&c->free_next[i], i + 1 < c->max_leases ? i + 2 : 0);
    atomic_init(&c->free_head, c->nhit < c->max_leases ? c->nhit + 1 : 0);
    registry_add(c);
    return 0;
}

#if SFS_DEBUG >= 2
/* Expensive check, at close: the free stack holds distinct entries in range
 * (at most max_leases steps). Private memory only. */
static bool stack_sane(struct sfs_cache *c)
{
    uint32_t top = FREE_TOP(atomic_load_explicit(&c->free_head, memory_order_relaxed));
    uint8_t *seen = calloc(c->max_leases, 1);
    bool ok = true;

    if (!seen)
        return true;
    for (uint32_t n = 0; top != 0 && ok; n++) {
        ok = top <= c->max_leases && n < c->max_leases && !seen[top - 1];
        if (ok) {
            seen[top - 1] = 1;
            top = atomic_load_explicit(&c->free_next[top - 1], memory_order_relaxed);
        }
    }
    free(seen);
    return ok;
}
#endif

/* At close: forget the handle (its thread spares die with it), free the stack. */
void sfs_lease_table_fini(struct sfs_cache *c)
{
    if (c->free_next)
        SFS_ASSERT_EXPENSIVE(stack_sane(c));
    if (c->id)
        registry_remove(c);
    free(c->free_next);
    c->free_next = NULL;
}
