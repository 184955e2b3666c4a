/* SPDX-License-Identifier: MIT */
/*
 * layout_i.h - the control plane's shared-memory layout, in one place.
 *
 * The control plane is one memfd mapped by every attached process, at any
 * address, so it holds offsets and indices, never pointers. It is laid out as
 *
 *   [header][bucket table][slot table][process table][lease tables]
 *   [hit counters][pin table]
 *
 * each part cache-line aligned. Every field says who writes it and what
 * protects it. Everything read from here is input: an index is checked
 * against its table's size before use (see slot_i.h), and a region whose magic,
 * format word or geometry does not match is refused at attach.
 *
 * The format word is computed from the sizes and offsets below (and the size
 * of pthread_mutex_t), so two builds with different layouts refuse each
 * other instead of misreading shared memory.
 */
#ifndef SHARDFS_LAYOUT_I_H
#define SHARDFS_LAYOUT_I_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SFS_MAGIC          0x3153465344524148ull /* "HARDSFS1" little-endian */
/* 3: the refcount word carries SLOT_REF_OPEN (lock-free hits); 4: header.
 * admission (was pad0) and SLOT_F_PROBATION (scan-resistant admission); 5:
 * eviction domains and the pin table, SLOT_F_PINNED; 6: a hit counter per
 * lease entry (off_hits) and each domain's budget (part_end, part_rend) in
 * the header; 7: a lease table's first entries are hit lines (uncounted
 * leases of lock-free hits, placed by slot) and header.procs_used; 8: pins
 * have owners (a pin entry's user, the header's pin_users, pin_user_budget
 * and pin_max_s, a slot's pin byte instead of SLOT_F_PINNED); 9: a
 * process record's requester class, served counts and histograms; 10: a
 * process record's uid (docs/layout.md). */
#define SFS_LAYOUT_VERSION 10u
#define SFS_NIL            UINT32_MAX /* "no slot / no bucket" in links */
#define SFS_CACHELINE      64
/* Eviction domains: at most this many (-o partitions). */
#define SFS_MAX_PARTITIONS 64u /* = SFS_MAX_PARTITIONS_PUBLIC (ctl.c checks) */

/* Lease-table entries: 0 is free, else slot index + 1. */
#define SFS_ENTRY_FREE 0u
/*
 * A lease table's first entries (sfs_hit_entries() of them: 0, or a power
 * of two of 16 or more) are hit lines: 16 entries, one cache line, each.
 * A lock-free hit on slot s takes its lease in line s mod lines, holding
 * s + 1 and counted in no refcount: whoever closes s to reuse it reads that
 * one line of every record's table (docs/recovery.md, "Lock-free hits").
 * The rest of the table holds the counted leases of the locked path.
 */
#define SFS_HIT_LINE 16u

static inline uint32_t sfs_hit_entries(uint32_t max_leases)
{
    uint32_t n = SFS_HIT_LINE;

    if (max_leases < 4 * SFS_HIT_LINE)
        return 0; /* a small table keeps every entry for the locked path */
    while (2 * n <= max_leases / 4)
        n *= 2;
    return n;
}

/* Per-process counters; indices into sfs_proc_rec.ctr. */
enum sfs_ctr {
    CTR_REQUESTS,
    CTR_UNSERVED, /* Gets that returned an error; hits are derived */
    CTR_MISSES,
    CTR_PREFETCHED,
    CTR_PREFETCH_HITS,
    CTR_BYTES_READ,
    CTR_RESIDENT_DELTA, /* signed: + on publish Ready, - on evict/remove of Ready */
    CTR_OWNER_LOADS,
    CTR_WAITS,
    CTR_EVICTIONS,
    CTR_FAILURES,
    CTR_TAKEOVERS,
    CTR_PREALLOC,
    CTR_TOUCHED,
    CTR_REAPED,
    CTR_BEHIND_WRITTEN, /* write-behind dumps whose background store write ended well */
    CTR_BEHIND_FAILED,  /* ... and failed (the shard stays in memory only) */
    CTR_COUNT
};

/*
 * One bucket: a robust process-shared mutex and the head of a singly linked
 * chain of slots. A cache line each, so neighbours do not share a line.
 */
struct sfs_bucket_rec {
    alignas(SFS_CACHELINE) pthread_mutex_t lock; /* robust, pshared; protects the chain */
    _Atomic uint32_t head;                       /* first slot or SFS_NIL; written under lock */
    uint32_t pad0;
};

/*
 * One slot: a cache entry's metadata. Its bytes live in the data plane at
 * slot * stride (see dataplane.c).
 *
 * Who writes what:
 * - key, shard, next, accessed(set on claim): under the lock of the bucket
 *   the slot is on (or is being moved to). key and shard are written with
 *   relaxed atomic stores (sfs_install), because a lock-free hit reads them.
 * - refcount: the count of the locked path's leases in bits 0-30 and
 *   SLOT_REF_OPEN in bit 31, changed only by atomic read-modify-writes:
 *   under the bucket lock by anyone, and lock-free (a release) only while
 *   SLOT_REF_OPEN is set. Lock-free hits take no count: their leases sit in
 *   the hit lines of the lease tables (docs/recovery.md, "Lock-free hits").
 *   OPEN is set only on a Ready slot: publish sets it; whoever takes the
 *   slot out of Ready clears it under the bucket lock, by a CAS that
 *   requires the count to be 0, then reads the hit lines for its leases
 *   and opens it again if it finds one (slot_close_free).
 * - bucket: under the lock of the bucket it leaves or joins; read lock-free
 *   by the CLOCK hand as a hint, re-checked under that bucket's lock.
 * - state: claimed (FREE/IDLE/FAILED -> LOADING) under the bucket lock;
 *   published (LOADING -> READY/FAILED) by the owner, lock-free, while it
 *   holds a lease (so the slot cannot move).
 * - version: bumped by whoever changes state, after the state store and
 *   before the futex wake. Waiters sleep on it.
 * - accessed: set on hit and claim, cleared by the CLOCK hand; lock-free.
 */
struct sfs_slot_rec {
    alignas(8) uint8_t block[16]; /* key: block id; 8-aligned: read as two atomic words */
    uint32_t shard;             /* key: shard index */
    _Atomic uint32_t bucket;    /* chain it is on, or SFS_NIL */
    _Atomic uint32_t next;      /* next slot on the chain or SFS_NIL */
    _Atomic uint32_t state;     /* enum sfs_state */
    _Atomic uint32_t version;   /* futex word: bumped on every state change */
    _Atomic uint32_t nwaiters;  /* processes sleeping on version */
    _Atomic uint32_t refcount;  /* leases held, all processes | SLOT_REF_OPEN */
    _Atomic int32_t error;      /* -errno a Failed slot carries */
    _Atomic uint32_t length;    /* valid bytes when Ready */
    _Atomic uint32_t owner;     /* proc index of the owner while Loading */
    _Atomic uint32_t owner_gen; /* that proc record's generation */
    _Atomic uint8_t accessed;   /* CLOCK bit */
    _Atomic uint8_t flags;      /* SLOT_F_* */
    /* Pinned: 1 + the index in hdr->pin_users of the user its pin slot is
     * charged to; 0: not pinned. Set under the bucket lock (with both
     * charges taken first); cleared by an exchange, whoever clears it
     * returns the charges, once (pin.c). */
    _Atomic uint8_t pin;
    uint8_t pad[1];
};

/* The refcount word: bit 31 says lock-free hits and releases may change the
 * count (the slot is Ready); bits 0-30 count the leases. */
#define SLOT_REF_OPEN     (1u << 31)
#define SLOT_REF_COUNT(w) ((w) & ~SLOT_REF_OPEN)

/* The leases on a slot now (a snapshot; tests and hints). */
static inline uint32_t sfs_slot_refs(const struct sfs_slot_rec *s)
{
    return SLOT_REF_COUNT(atomic_load_explicit(&s->refcount, memory_order_relaxed));
}

enum {
    SLOT_F_PREFETCHED = 1u << 0,   /* filled by prefetch, not yet hit */
    SLOT_F_RESERVED = 1u << 1,     /* constant: belongs to the reserved pool */
    SLOT_F_WRITE_WANTED = 1u << 2, /* a write Get or a remove found it leased (set under
                                    * the bucket lock; cleared when the slot is owned or
                                    * reused): the mount drops its page-cache pin on it */
    SLOT_F_PROBATION = 1u << 3,    /* admission=scan: a new key not hit since its load
                                    * (admit.c); a hint: a lost race only moves a key
                                    * between probation and main */
};

/*
 * One pin: a block and the absolute CLOCK_MONOTONIC instant its pin ends.
 * Written only under hdr->pin_lock, as a seqlock (seq odd while the entry
 * changes), read lock-free by the evictor and by install. expiry_ns 0: the
 * entry is free. No process owns a pin: it ends at expiry_ns whoever made
 * it, dead or alive (docs/eviction.md, "Pins").
 */
struct sfs_pin_rec {
    _Atomic uint32_t seq;
    _Atomic uint32_t user;        /* 1 + its owner's index in hdr->pin_users (0: none) */
    alignas(8) uint8_t block[16]; /* read as two relaxed atomic words */
    _Atomic int64_t expiry_ns;
};

/* A user who pins (pin.c): uid written under pin_lock while pins or slots
 * count anything; pins (entries that name it) under pin_lock; slots (the
 * slots charged to it) by relaxed CAS where hdr->pinned_slots is. An entry
 * with both counts 0 is free for another uid. */
#define SFS_PIN_USERS 64
struct sfs_pin_user {
    _Atomic uint32_t uid;
    _Atomic uint32_t pins;
    _Atomic uint32_t slots;
    uint32_t pad;
};

enum sfs_proc_state {
    PROC_FREE = 0,
    PROC_ALIVE = 1,
    PROC_REAPING = 2,
    PROC_CLAIMING = 3,
    PROC_DEAD = 4, /* the server saw its connection close; not yet reaped */
    PROC_LEFT = 5, /* detached itself (leases freed); the server frees it at close */
};

/* How a record is held (sfs_proc_rec.kind). */
enum sfs_proc_kind {
    PROC_KIND_HANDLE = 0, /* the creator, or attach_fds: freed by its own detach */
    PROC_KIND_CONN = 1,   /* claimed by the server for a connection: reaped at its close */
};

/*
 * One attached process. The record's owner writes its counters (relaxed,
 * single writer: no shared hot line). `state` moves only as proc.c's table
 * says: claims and reaps take it by CAS, and only the server (which holds
 * the client's connection) declares a connection's record dead. Nothing here
 * is used to judge liveness from a pid.
 */
struct sfs_proc_rec {
    alignas(SFS_CACHELINE) _Atomic uint32_t state; /* enum sfs_proc_state (see proc.c) */
    _Atomic uint32_t gen;                          /* bumped at each claim */
    _Atomic int32_t pid; /* the claimer's view of the pid, for logs only */
    int32_t device_id;   /* as attached (-1: query-only) */
    uint32_t kind;       /* enum sfs_proc_kind; written by the claimer */
    /* The process's uid in the daemon's user namespace (the server's
     * SO_PEERCRED of the connection, or the creator's euid), whatever the
     * process's own namespace calls it: a pin it makes is this user's.
     * Written by the claimer before ALIVE. */
    uint32_t uid;
    /* Entries [0, lease_hwm) of the record's lease table were ever used:
     * raised by the owner before it writes an entry beyond (release), reset
     * at claim; bounds what repair reads of this table. */
    _Atomic uint32_t lease_hwm;
    /* The record's threads asleep for a free slot (sfs_wait_for_release): a
     * share of the header's release_waiters, which the reaper takes back
     * from a process killed in that sleep. Written by the owner only. */
    _Atomic uint32_t release_waiting;
    uint8_t pad0[SFS_CACHELINE - 32];
    alignas(SFS_CACHELINE) _Atomic int64_t ctr[CTR_COUNT]; /* written by the owner only */
    /* served.c: the record's requester class (written by the owner; read
     * as untrusted bytes), where its loads came from ([SFS_TIER_MEMORY]
     * unused: derived) and its histograms (bucket counts, then the sum in
     * ns). Written by the owner's threads (relaxed fetch_add), zeroed at
     * claim, folded into the header's classes and retired_hist. */
    alignas(SFS_CACHELINE) char cls[SFS_CLASS_LEN];
    _Atomic int64_t served[SFS_TIERS];
    _Atomic uint64_t hist[SFS_HIST_KINDS][SFS_HIST_BUCKETS + 1];
};

/* Served counts of the processes gone, by class (name "" : unused). */
#define SFS_CLASSES 16
struct sfs_class_rec {
    char name[SFS_CLASS_LEN];
    int64_t served[SFS_TIERS];
};

/*
 * The header. Geometry is written once by the creator before any other
 * process can see the region; the rest is shared mutable state.
 */
struct sfs_header {
    uint64_t magic;
    uint64_t format;      /* sfs_layout_format() of the creator */
    uint64_t region_size; /* bytes of the control memfd */
    uint64_t shard_size;
    uint64_t stride; /* bytes between slots in the data plane */
    uint64_t segment_size;
    uint32_t nslots;
    uint32_t nreserved; /* the last nreserved slots form the reserved pool */
    uint32_t nbuckets;  /* a power of two */
    uint32_t max_procs;
    uint32_t max_leases; /* entries per process lease table */
    uint32_t nsegments;
    uint32_t slots_per_segment;
    uint32_t seg_shift; /* log2(slots_per_segment) when a power of two, else 0 */
    uint32_t hugepages; /* the data plane is on huge pages */
    uint32_t admission;   /* enum sfs_admission of the creator (admit.c) */
    uint32_t npartitions; /* eviction domains, 1..SFS_MAX_PARTITIONS */
    uint32_t npins;       /* pin table entries, a power of two */
    uint32_t pin_budget;  /* slots pins may hold at once */
    uint32_t pad1;
    uint64_t off_buckets;
    uint64_t off_slots;
    uint64_t off_procs;
    uint64_t off_leases;
    uint64_t off_pins;
    /* hits[max_procs][max_leases]: u64 each. hits[p][e] counts the lock-free
     * hits made with record p's lease entry e, written (a relaxed load and
     * store, no locked instruction) only by the thread that holds the entry
     * for its Get; summed by stats, folded into retired[CTR_REQUESTS] and
     * zeroed with the record's counters. */
    uint64_t off_hits;
    /* Each domain's budget: domain d owns regular slots [part_end[d - 1],
     * part_end[d]) (from 0 for d = 0) and reserved slots nregular +
     * [part_rend[d - 1], part_rend[d]). Entries < npartitions are used:
     * part_end strictly increasing up to nregular, part_rend nondecreasing
     * up to nreserved (checked at attach). */
    uint32_t part_end[SFS_MAX_PARTITIONS];
    uint32_t part_rend[SFS_MAX_PARTITIONS];

    /* CLOCK hands (regular and reserved pools) of domain 0, the only one
     * when npartitions is 1: fetch_add, relaxed. Domains 1.. have theirs in
     * dom[] below. */
    alignas(SFS_CACHELINE) _Atomic uint64_t hand;
    _Atomic uint64_t hand_reserved;
    /* Never-used slots are handed out in order before the hand moves. */
    _Atomic uint32_t fresh;          /* next never-used regular slot */
    _Atomic uint32_t fresh_reserved; /* next never-used reserved slot (offset) */
    /* Highest shard index ever inserted: bounds Touch's bucket walk. */
    _Atomic uint32_t max_shard;
    /* 1 + the highest process record ever claimed: the records a closer
     * reads the hit lines of. Raised (seq_cst RMW) by a claim before the
     * record is Alive; never lowered. Read (seq_cst) by slot_close_free. */
    _Atomic uint32_t procs_used;

    /* Slot-free notification for Gets waiting on a full cache. */
    alignas(SFS_CACHELINE) _Atomic uint32_t release_seq; /* futex word */
    _Atomic uint32_t release_waiters;

    /* Pins (pin.c): the table's writers' lock, and the slots pinned (their
     * `pin` byte set: charged before it is set, returned by whoever clears
     * it; never above pin_budget), in all and by user (each user's never
     * above pin_user_budget, but root's; 0: no such bound). pin_max_s:
     * the longest pin (creator, constant; checked at attach). */
    alignas(SFS_CACHELINE) pthread_mutex_t pin_lock; /* robust, pshared */
    _Atomic uint32_t pinned_slots;
    _Atomic uint32_t pins_used; /* entries with expiry_ns != 0 (a hint: 0 skips lookups) */
    uint32_t pin_user_budget;
    uint32_t pin_max_s;
    struct sfs_pin_user pin_users[SFS_PIN_USERS];

    /* Evictions by domain (a miss path's fetch_add, relaxed). */
    alignas(SFS_CACHELINE) _Atomic uint64_t part_evictions[SFS_MAX_PARTITIONS];

    /* The hands of domains 1..npartitions-1 (domain d at dom[d - 1]). */
    alignas(SFS_CACHELINE) struct {
        alignas(SFS_CACHELINE) _Atomic uint64_t hand;
        _Atomic uint64_t hand_reserved;
        _Atomic uint32_t fresh;
        _Atomic uint32_t fresh_reserved;
    } dom[SFS_MAX_PARTITIONS - 1];

    /* Counters of reaped or detached processes, folded in under proc_lock. */
    alignas(SFS_CACHELINE) pthread_mutex_t proc_lock; /* robust, pshared */
    int64_t retired[CTR_COUNT];
    /* served.c: what the gone processes served, by class, and their
     * histograms; under proc_lock like retired. */
    struct sfs_class_rec classes[SFS_CLASSES];
    uint64_t retired_hist[SFS_HIST_KINDS][SFS_HIST_BUCKETS + 1];
};

#define SFS_ALIGN_UP(x, a) (((x) + ((a)-1)) & ~((uint64_t)(a)-1))

_Static_assert(sizeof(struct sfs_slot_rec) == 64, "slot record is one cache line");
_Static_assert(sizeof(struct sfs_bucket_rec) == SFS_CACHELINE, "bucket is one line");
_Static_assert(offsetof(struct sfs_proc_rec, ctr) == SFS_CACHELINE, "counters on own line");
_Static_assert(sizeof(struct sfs_proc_rec) % SFS_CACHELINE == 0, "proc rec is whole lines");
_Static_assert(offsetof(struct sfs_header, hand) % SFS_CACHELINE == 0, "hand on own line");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "futex words are 32-bit");
_Static_assert(sizeof(struct sfs_pin_rec) == 32, "pin entry: seq, user, block, expiry");
_Static_assert(SFS_PIN_USERS < 255, "a slot's pin byte names 1 + a user's index");

/* Derived from the layout: differs whenever a size or offset above does. */
uint64_t sfs_layout_format(void);

#endif /* SHARDFS_LAYOUT_I_H */
