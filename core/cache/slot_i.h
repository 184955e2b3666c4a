/* SPDX-License-Identifier: MIT */
/*
 * slot_i.h - what the cache's rooms share: index checks, the key's bucket,
 * lease-table entries, bucket locks and chains, and state changes.
 *
 * The rooms: bucket.c (robust bucket locks, chains, repair), lease.c (lease
 * tables, free entries, thread spares, handle registry), evict.c (fresh slots,
 * CLOCK, allocation and sfs_install), proc.c (process records, reaping, stats),
 * ctl.c (geometry), cache.c (Get, Publish, Fail, Release), wait.c (Wait,
 * WaitAny, takeover) and lookup.c (State, Remove, Prealloc, Touch, foreach).
 * Calls go from cache.c, wait.c and lookup.c down to the others and from
 * evict.c and proc.c down to bucket.c and lease.c, never back up.
 *
 * What is on every Get (index checks, the key's bucket and compare, taking
 * and dropping a bucket lock, finding a key on a chain, taking a lease) is
 * inline here, so the split costs the Get path no calls.
 */
#ifndef SHARDFS_SLOT_I_H
#define SHARDFS_SLOT_I_H

#include "cache_i.h"
#include "futex_i.h"
#include "testpoint_i.h"

#include <errno.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------
 * Indices from shared memory are input: check them before use.
 */

static inline bool slot_ok(const struct sfs_cache *c, uint32_t s)
{
    return s < c->nslots;
}

static inline uint32_t bucket_of(const struct sfs_cache *c, const struct sfs_key *k)
{
    /* Shards of a block sit in consecutive buckets, so Touch visits only
     * hash(block) + [0, max_shard]. */
    return (uint32_t)(sfs_key_hash(&k->block) + k->shard) & c->bucket_mask;
}

/* The key's words, as a lock-free hit reads them and sfs_install writes them
 * (relaxed atomics: the slot may change under the reader, who validates). */
typedef uint64_t __attribute__((may_alias)) key_word;

static inline bool key_eq_atomic(const struct sfs_slot_rec *s, const struct sfs_key *k)
{
    uint64_t b[2];

    __builtin_memcpy(b, k->block.b, 16);
    return __atomic_load_n((const uint32_t *)&s->shard, __ATOMIC_RELAXED) == k->shard &&
           __atomic_load_n((const key_word *)s->block, __ATOMIC_RELAXED) == b[0] &&
           __atomic_load_n((const key_word *)(s->block + 8), __ATOMIC_RELAXED) == b[1];
}

/* The same compare under the bucket lock (every chain step). Relaxed
 * atomic loads too, free on the machines we run on: the lock orders us with
 * this process's writers, but a slot can reach this chain from another
 * bucket, moved there by another process (another mapping), and sfs_install
 * wrote its key under that bucket's lock; plain loads would be a race to
 * ThreadSanitizer, which sees no order made in another process. */
static inline bool key_eq(const struct sfs_slot_rec *s, const struct sfs_key *k)
{
    return key_eq_atomic(s, k);
}

/* The key a slot holds now, read as a lock-free hit reads it (relaxed
 * atomics): for readers that take a snapshot, such as the hot-set sampler,
 * even under the bucket lock, since sfs_install writes the words under another
 * bucket's lock once the slot moved there, possibly from another process. */
static inline void slot_key_load(const struct sfs_slot_rec *s, struct sfs_key *k)
{
    uint64_t b[2];

    b[0] = __atomic_load_n((const key_word *)s->block, __ATOMIC_RELAXED);
    b[1] = __atomic_load_n((const key_word *)(s->block + 8), __ATOMIC_RELAXED);
    __builtin_memcpy(k->block.b, b, 16);
    k->shard = __atomic_load_n((const uint32_t *)&s->shard, __ATOMIC_RELAXED);
}

static inline void slot_key_store(struct sfs_slot_rec *s, const struct sfs_key *k)
{
    uint64_t b[2];

    __builtin_memcpy(b, k->block.b, 16);
    __atomic_store_n((key_word *)s->block, b[0], __ATOMIC_RELAXED);
    __atomic_store_n((key_word *)(s->block + 8), b[1], __ATOMIC_RELAXED);
    __atomic_store_n(&s->shard, k->shard, __ATOMIC_RELAXED);
}

/*
 * A lease-table entry is slot + 1, with ENTRY_OWNER set on the one lease that
 * made its holder owner, from the claim until publish or fail. Ownership is
 * the process (slot->owner) *and* that lease: releasing another lease the
 * owner's process holds on the slot (a waiter thread's) does not abandon the
 * load. Slots are < 2^29, so bits 31, 30 and 29 are free.
 */
#define ENTRY_OWNER    (1u << 31)
/* Set on an entry its holder released while the bucket lock was out of
 * reach (a stopped holder): still counted in the slot's refcount until
 * sfs_lease_finish_deferred() (or close, or the reaper) drops it under the lock,
 * but no longer a lease its holder may use. */
#define ENTRY_DROP     (1u << 30)
/* Set while the slot's count is being changed for this entry (a Get's
 * intent before its increment, a release's before its decrement, until the
 * entry is confirmed or freed): the count may or may not include the entry.
 * Only a recount of the quiesced slot (sfs_slot_recount) settles a dead
 * process's transit entry; see docs/recovery.md, "Lock-free hits". */
#define ENTRY_TRANSIT  (1u << 29)
#define ENTRY_SLOT1(v) ((v) & ~(ENTRY_OWNER | ENTRY_DROP | ENTRY_TRANSIT)) /* slot + 1, or 0 */

static inline _Atomic uint32_t *lease_table(const struct sfs_cache *c, uint32_t proc)
{
    return (_Atomic uint32_t *)((uint8_t *)c->ctl + c->off_leases) + (uint64_t)proc * c->max_leases;
}

/* Record proc's hit counters, one per lease entry (layout_i.h, off_hits). */
static inline _Atomic uint64_t *hit_table(const struct sfs_cache *c, uint32_t proc)
{
    return (_Atomic uint64_t *)((uint8_t *)c->ctl + c->off_hits) + (uint64_t)proc * c->max_leases;
}

/* Record proc's lock-free hits, summed over the entries it ever used (a
 * snapshot while it lives). take: zero each counter as it is read, for a
 * fold (the record's threads no longer run). */
static inline uint64_t hits_sum(const struct sfs_cache *c, uint32_t proc, bool take)
{
    _Atomic uint64_t *h = hit_table(c, proc);
    uint32_t hwm = atomic_load_explicit(&c->procs[proc].lease_hwm, memory_order_acquire);
    uint64_t n = 0;

    if (hwm > c->max_leases)
        hwm = c->max_leases; /* shared memory is input */
    for (uint32_t e = 0; e < hwm; e++)
        n += take ? atomic_exchange_explicit(&h[e], 0, memory_order_relaxed)
                  : atomic_load_explicit(&h[e], memory_order_relaxed);
    return n;
}

/* ---------------------------------------------------------------------------
 * bucket.c: robust bucket locks and the chains they protect.
 */

/* A bucket-lock wait with no deadline of the caller's (deadline 0) ends
 * after this: critical sections are microseconds, so a holder that keeps a
 * lock this long is stopped (SIGSTOP, a freezer, a debugger), and waiting on
 * would wedge the caller with it. */
#define LOCK_WAIT_NS (5 * 1000 * 1000 * 1000ll)
/* Deadline for bucket_lock: take the lock only if it is free now. */
#define LOCK_TRY (-1)

/* A lock call returned r != 0: repair after a dead holder (EOWNERDEAD: then
 * 0, locked), else -r. */
int sfs_bucket_locked(struct sfs_cache *c, uint32_t b, int r);
/* pthread_mutex_clocklock(CLOCK_MONOTONIC) until deadline_ns (0:
 * LOCK_WAIT_NS from now): 0 or a positive error number, as pthreads. */
int sfs_robust_lock_until(pthread_mutex_t *m, int64_t deadline_ns);
/* The lock was busy: wait for it until deadline_ns (see bucket_lock). */
int sfs_bucket_lock_wait(struct sfs_cache *c, uint32_t b, int64_t deadline_ns);

/*
 * Lock bucket b. deadline_ns: absolute CLOCK_MONOTONIC; 0: LOCK_WAIT_NS from
 * now; LOCK_TRY: do not wait. 0 when locked (a dead holder's chain repaired
 * first), -ETIMEDOUT, -EBUSY (LOCK_TRY), or another -errno. The uncontended
 * path is one trylock: no clock read.
 */
static inline int bucket_lock(struct sfs_cache *c, uint32_t b, int64_t deadline_ns)
{
    SFS_ASSERT(b < c->nbuckets); /* from bucket_of(), or checked by the caller */
    int r = pthread_mutex_trylock(&c->buckets[b].lock);

    if (r == EBUSY)
        return sfs_bucket_lock_wait(c, b, deadline_ns);
    return r ? sfs_bucket_locked(c, b, r) : 0;
}

/* bucket_lock() with a deadline rel_ns from now, read from the clock only
 * when the lock is busy (a release is on every hit's path). */
static inline int bucket_lock_within(struct sfs_cache *c, uint32_t b, int64_t rel_ns)
{
    SFS_ASSERT(b < c->nbuckets);
    int r = pthread_mutex_trylock(&c->buckets[b].lock);

    if (r == EBUSY)
        return sfs_bucket_lock_wait(c, b, sfs_now_ns() + rel_ns);
    return r ? sfs_bucket_locked(c, b, r) : 0;
}

static inline void bucket_unlock(struct sfs_cache *c, uint32_t b)
{
    SFS_ASSERT(b < c->nbuckets);
    pthread_mutex_unlock(&c->buckets[b].lock);
}

/* Walk chain b, its lock held: `s` takes each slot index in turn. Bounded:
 * at most nslots steps, and it ends at an index out of range -- a chain a
 * death left torn is walked no further than it can be trusted (bucket.c
 * repairs it). The body may break, not continue past a change to the
 * chain: the next index is read after the body. */
#define SFS_CHAIN_EACH(c, b, s)                                                             \
    for (uint32_t s = atomic_load_explicit(&(c)->buckets[(b)].head, memory_order_relaxed),    \
                  s##_steps_ = 0;                                                             \
         s != SFS_NIL && slot_ok((c), s) && s##_steps_ < (c)->nslots;                         \
         s = atomic_load_explicit(&(c)->slots[s].next, memory_order_relaxed), s##_steps_++)

/* Find key on chain b (lock held). Returns the slot, SFS_NIL, or sets *err
 * (-EBADMSG: an index out of range or a chain longer than nslots). */
static inline uint32_t chain_find(struct sfs_cache *c, uint32_t b, const struct sfs_key *k,
                                  int *err)
{
    uint32_t s = atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed);
    uint32_t n = 0;

    while (s != SFS_NIL) {
        if (!slot_ok(c, s) || ++n > c->nslots) {
            *err = -EBADMSG;
            return SFS_NIL;
        }
        if (key_eq(&c->slots[s], k))
            return s;
        s = atomic_load_explicit(&c->slots[s].next, memory_order_relaxed);
    }
    return SFS_NIL;
}

/* Unlink s from chain b (lock held). Returns false if s is not on it. */
bool sfs_chain_unlink(struct sfs_cache *c, uint32_t b, uint32_t s);

/* Push s on chain b (lock held). */
static inline void chain_link(struct sfs_cache *c, uint32_t b, uint32_t s)
{
    SFS_ASSERT(b < c->nbuckets && s < c->nslots);
    atomic_store_explicit(&c->slots[s].next,
                          atomic_load_explicit(&c->buckets[b].head, memory_order_relaxed),
                          memory_order_relaxed);
    /* Release: the slot's key and state are visible before it is reachable. */
    atomic_store_explicit(&c->buckets[b].head, s, memory_order_release);
}

/* ---------------------------------------------------------------------------
 * lease.c: lease entries, the per-thread spare, dropping leases.
 */

/* Each thread keeps one spare entry of one handle (see lease.c). */
struct lease_spare {
    uint64_t id; /* handle id, 0: none */
    uint32_t e;
    /* Entries freed to another handle since the spare was last used: at
     * SPARE_SWITCH the spare moves to that handle (sfs_lease_spare_switch). */
    uint32_t misses;
    bool keyed; /* the exit destructor is armed for this thread */
};

/* A thread whose spare sits on a handle it no longer uses (one it used
 * before a re-attach, or its parent's across a fork) moves it to the handle
 * it uses after this many frees there: the spare is what spares a Get and
 * its Release two CAS on the process's entry stack. */
#define SPARE_SWITCH 64u

extern __thread struct lease_spare lease_spare
    __attribute__((tls_model("initial-exec"), visibility("hidden")));

int sfs_entry_pop(struct sfs_cache *c, uint32_t *e); /* -ENOBUFS: table full */
void sfs_entry_push(struct sfs_cache *c, uint32_t e);
void sfs_lease_spare_arm(void);
/* Give our spare back to its handle (if still open), keep e of c instead. */
void sfs_lease_spare_switch(struct sfs_cache *c, uint32_t e);

/* A free entry of our table for a new lease: the thread's spare if it has
 * one of this handle, else one from the handle's stack. */
static inline int entry_alloc(struct sfs_cache *c, uint32_t *e)
{
    if (lease_spare.id == c->id) {
        lease_spare.id = 0;
        lease_spare.misses = 0;
        *e = lease_spare.e;
        SFS_ASSERT(*e < c->max_leases);
        return 0;
    }
    return sfs_entry_pop(c, e);
}

static inline void entry_free(struct sfs_cache *c, uint32_t e)
{
    SFS_ASSERT(e < c->max_leases);
    if (lease_spare.id == 0) {
        lease_spare.id = c->id;
        lease_spare.e = e;
        if (!lease_spare.keyed)
            sfs_lease_spare_arm();
        return;
    }
    if (lease_spare.id != c->id && ++lease_spare.misses >= SPARE_SWITCH) {
        sfs_lease_spare_switch(c, e);
        return;
    }
    sfs_entry_push(c, e);
}

/* Bucket lock held: mark our lease e on slot s as the owner's. */
static inline void lease_mark_owner(struct sfs_cache *c, uint32_t s, uint32_t e)
{
    atomic_store_explicit(&c->leases[e], (s + 1) | ENTRY_OWNER, memory_order_relaxed);
}

/* Bucket lock held: the entry in transit, the count up, the entry held. A
 * Ready slot's count is also changed by lock-free hits and releases, so the
 * add is atomic. Relaxed: a recount that must see the transit mark holds
 * this same lock, and the lock orders the stores for it. */
static inline void lease_take(struct sfs_cache *c, uint32_t s, uint32_t e, struct sfs_lease *out)
{
    struct sfs_slot_rec *sl = &c->slots[s];

    SFS_ASSERT(s < c->nslots && e < c->max_leases);
    atomic_store_explicit(&c->leases[e], (s + 1) | ENTRY_TRANSIT, memory_order_relaxed);
    SFS_TEST_POINT("take:transit");
    atomic_fetch_add_explicit(&sl->refcount, 1, memory_order_relaxed);
    SFS_TEST_POINT("take:counted");
    atomic_store_explicit(&c->leases[e], s + 1, memory_order_relaxed);
    out->slot = s;
    out->entry = e;
}

/* ---------------------------------------------------------------------------
 * Hit lines (layout_i.h, SFS_HIT_LINE): the uncounted leases of lock-free
 * hits, one line of each record's table per slot.
 */

/* Entry index of the first entry of slot s's hit line (c->nhit > 0). */
static inline uint32_t hit_line_of(const struct sfs_cache *c, uint32_t s)
{
    /* Slot order: the consecutive slots of a task land on distinct lines. */
    return (s & (c->nhit / SFS_HIT_LINE - 1)) * SFS_HIT_LINE;
}

static inline bool entry_is_hit(const struct sfs_cache *c, uint32_t e)
{
    return e < c->nhit;
}

/* A hit's lease was let go (its entry freed by a seq_cst RMW or store): a
 * Get waiting for a free slot on a full cache rescans (the same Dekker as
 * refcount_last_rmw, with the entry's write in place of the count's). */
static inline void hit_released(struct sfs_cache *c)
{
    if (atomic_load_explicit(&c->hdr->release_waiters, memory_order_seq_cst)) {
        atomic_fetch_add_explicit(&c->hdr->release_seq, 1, memory_order_seq_cst);
        sfs_futex_wake(&c->hdr->release_seq, INT32_MAX);
    }
}

/* Some record's hit line holds a lease on s (or a hit's claim, about to
 * find s closed and let go). seq_cst loads: the closer's side of the
 * Dekker with a hit (slot_close_free). Bound: procs_used lines of 16. */
bool sfs_hit_leased(struct sfs_cache *c, uint32_t s);

/* Bucket lock held: close slot s to lock-free changes if no lease is on it,
 * counted or a hit's. True: closed with a count of 0 and no hit lease, so
 * no Get can take it until it is Ready and open again; the caller may
 * unlink, reset or reload it. False: leased, left as it was.
 *
 * The close is a seq_cst CAS that needs the count at 0 (a counted lease
 * taken first makes it fail), then the hit lines are read: a hit claims
 * its entry (seq_cst CAS) before it reads the word, so either it sees the
 * close and lets go, or the read here sees its entry (Dekker; the argument
 * is docs/recovery.md, "Lock-free hits"). Found: the word is put back (no
 * one else changes a closed word but holders of this lock). acq_rel in the
 * CAS: the releases that brought the count to 0 (their reads of the bytes)
 * happen-before what we do next; a hit's release is its entry's seq_cst
 * CAS, read here. */
static inline bool slot_close_free(struct sfs_cache *c, uint32_t s)
{
    struct sfs_slot_rec *sl = &c->slots[s];
    uint32_t w = atomic_load_explicit(&sl->refcount, memory_order_relaxed);

    for (;;) {
        if (SLOT_REF_COUNT(w) != 0)
            return false;
        if (atomic_compare_exchange_weak_explicit(&sl->refcount, &w, 0, memory_order_seq_cst,
                                                  memory_order_relaxed))
            break;
    }
    SFS_TEST_POINT("close:closed");
    if (c->nhit && sfs_hit_leased(c, s)) {
        /* Release: the state and key stand as they were for the next
         * hitter's acquire of the word. */
        atomic_store_explicit(&sl->refcount, w, memory_order_release);
        return false;
    }
    return true;
}

/* Bucket lock held, the slot Ready: open it to lock-free hits (release: the
 * state and key it carries are seen by a hitter's acquire CAS). */
static inline void slot_open(struct sfs_slot_rec *sl)
{
    if (!(atomic_load_explicit(&sl->refcount, memory_order_relaxed) & SLOT_REF_OPEN))
        atomic_fetch_or_explicit(&sl->refcount, SLOT_REF_OPEN, memory_order_release);
}

/* Bucket lock held (bucket b, slot s on it): close s and set its count to
 * the held entries the lease tables have for it, settling the transit
 * entries of dead records (freed). -EBUSY, count untouched, when a record
 * still alive has an entry in transit on s (it is between two of its steps:
 * try again later). Reopens a Ready slot. Bounded like repair_bucket. */
int sfs_slot_recount(struct sfs_cache *c, uint32_t s);

/* Drop the lease in entry e of `table` (proc, gen) on slot s: bucket lock
 * held. An owner that lets go of a slot it never published leaves it Idle. */
void sfs_release_locked(struct sfs_cache *c, uint32_t proc, uint32_t gen, _Atomic uint32_t *table,
                    uint32_t e, uint32_t s);
/* One lease fewer on s, by an atomic decrement (saturating at 0); the last
 * one wakes a Get waiting for a free slot. Lock-free callers only while the
 * slot is open (release_fast). */
void sfs_refcount_drop(struct sfs_cache *c, struct sfs_slot_rec *s);
/*
 * The last lease on s is gone, and the count was brought to 0 by a seq_cst
 * read-modify-write: wake a Get waiting for a free slot. Dekker with
 * sfs_release_wait_begin (evict.c), which registers (seq_cst RMW), then fences
 * (seq_cst), then rescans the counts. Our RMW W and our seq_cst load R of
 * release_waiters are in the single order S with the waiter's fence F: if
 * W precedes F, the waiter's rescan (after F) sees our count; else F
 * precedes R, and R sees the waiter's registration (before F). So no fence
 * here: on x86 the RMW is the locked instruction the release makes anyway,
 * and the load a plain one (a hit's release used to pay a fence too).
 */
static inline void refcount_last_rmw(struct sfs_cache *c, struct sfs_slot_rec *s)
{
    /* Nothing of the slot's own after the decrement: from it on the slot
     * may be evicted and hold another key, whose waiters count themselves
     * in nwaiters. A dead waiter's count is cleared under the lock
     * (refcount_last; release_fast takes the lock for it). */
    (void)s;
    if (atomic_load_explicit(&c->hdr->release_waiters, memory_order_seq_cst)) {
        atomic_fetch_add_explicit(&c->hdr->release_seq, 1, memory_order_seq_cst);
        sfs_futex_wake(&c->hdr->release_seq, INT32_MAX);
    }
}

/* The same after a count brought to 0 any other way (a weaker RMW, a
 * recount's store): the seq_cst fence orders that store before the read of
 * release_waiters, against the waiter's registration and rescan. */
static inline void refcount_last(struct sfs_cache *c, struct sfs_slot_rec *s)
{
    /* Bucket lock held, so the slot stays ours: no Get can evict it for a
     * new key, whose waiters would count themselves in nwaiters, before
     * we unlock. No live waiter is left (a waiter holds its lease through
     * its sleep): a count is a waiter's killed in its sleep. Relaxed:
     * nwaiters only decides whether set_state makes a wake call, and the
     * lock orders this store before any later waiter's increment. */
    if (atomic_load_explicit(&s->nwaiters, memory_order_relaxed))
        atomic_store_explicit(&s->nwaiters, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    refcount_last_rmw(c, s);
}
/* Free every lease in proc p's table (p is dead, or is us detaching) whose
 * bucket lock is reachable by deadline_ns (bucket_lock's meaning); returns
 * how many are left for a later call. */
int sfs_drop_all_leases(struct sfs_cache *c, uint32_t p, uint32_t gen, int64_t deadline_ns);
/* A release whose lock was out of reach: marked now (ENTRY_DROP), dropped
 * under the lock by sfs_lease_finish_deferred() on a later release, at close,
 * or by the reaper. */
bool sfs_lease_defer(struct sfs_cache *c, uint32_t e, uint32_t v);
void sfs_lease_finish_deferred(struct sfs_cache *c);
void sfs_lease_table_fini(struct sfs_cache *c);

/* ---------------------------------------------------------------------------
 * evict.c: taking a slot for a new key.
 */

/* A waiter re-reads its slot and its owner's record this often while it
 * sleeps (no pid is judged: the daemon declares records dead). */
#define OWNER_CHECK_NS (100 * 1000 * 1000ll)

enum pool { POOL_REGULAR = 1, POOL_RESERVED = 2, POOL_FRESH_ONLY = 4 };

/* Take a slot for bucket b (b locked) from `pools`: 0 with *out detached
 * and its bucket set to b; -ENOSPC when every candidate was leased; -EAGAIN
 * when some unleased one sat in a bucket that was busy at that instant. */
int sfs_alloc_slot(struct sfs_cache *c, uint32_t b, uint32_t dom, unsigned pools, uint32_t *out);
/* Put key on slot s (detached, s->bucket == b, b locked) in `state`. */
void sfs_install(struct sfs_cache *c, uint32_t b, uint32_t s, const struct sfs_key *k, uint32_t state,
             bool prefetch);
/* A Get that found no free slot waits for a release: sfs_release_wait_begin()
 * counts it in release_waiters and returns release_seq, then the caller
 * rescans before it sleeps; sfs_wait_for_release() sleeps while release_seq
 * still reads `seq`, for at most one OWNER_CHECK_NS slice or to the deadline
 * (0 to rescan, or -errno); sfs_release_wait_end() when the Get returns. */
uint32_t sfs_release_wait_begin(struct sfs_cache *c);
int sfs_wait_for_release(struct sfs_cache *c, uint32_t seq, int64_t deadline_ns);
void sfs_release_wait_end(struct sfs_cache *c);

/* ---------------------------------------------------------------------------
 * State changes and wakes.
 */

static inline void set_state(struct sfs_slot_rec *s, uint32_t state)
{
    /* Release: error/length/bytes written before are seen with the state. */
    atomic_store_explicit(&s->state, state, memory_order_release);
    /* seq_cst: ordered against the waiter's nwaiters increment (Dekker). */
    atomic_fetch_add_explicit(&s->version, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&s->nwaiters, memory_order_seq_cst)) {
        SFS_TEST_POINT("state:wake"); /* counted by tests: a wake call made */
        sfs_futex_wake(&s->version, INT32_MAX);
    }
}

static inline void make_owner(struct sfs_cache *c, struct sfs_slot_rec *s)
{
    atomic_store_explicit(&s->owner, c->me, memory_order_relaxed);
    atomic_store_explicit(&s->owner_gen, c->my_gen, memory_order_relaxed);
    atomic_store_explicit(&s->error, 0, memory_order_relaxed);
    atomic_store_explicit(&s->length, 0, memory_order_relaxed);
}

/* The owner of a Loading slot is attached and alive (its record ALIVE, the
 * generation it owned under): else a Get or a waiter takes the load over. */
static inline bool owner_alive_rec(struct sfs_cache *c, const struct sfs_slot_rec *s)
{
    uint32_t o = atomic_load_explicit(&s->owner, memory_order_acquire);
    uint32_t gen = atomic_load_explicit(&s->owner_gen, memory_order_acquire);

    if (o >= c->max_procs)
        return false;
    return atomic_load_explicit(&c->procs[o].state, memory_order_acquire) == PROC_ALIVE &&
           atomic_load_explicit(&c->procs[o].gen, memory_order_acquire) == gen;
}

/* The slot of a lease handed in by a caller: the lease must be ours,
 * checked against our table, never trusted. NULL when it is not. */
static inline struct sfs_slot_rec *lease_slot(struct sfs_cache *c, const struct sfs_lease *l)
{
    if (!c || !l || l->entry >= c->max_leases || !slot_ok(c, l->slot))
        return NULL;
    /* An entry marked ENTRY_DROP was released already: no longer a lease. */
    if ((atomic_load_explicit(&c->leases[l->entry], memory_order_relaxed) & ~ENTRY_OWNER) !=
        l->slot + 1)
        return NULL;
    return &c->slots[l->slot];
}

#endif /* SHARDFS_SLOT_I_H */
