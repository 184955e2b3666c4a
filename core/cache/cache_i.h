/* SPDX-License-Identifier: MIT */
/*
 * cache_i.h - the process-local handle of a CacheBuffer, and the helpers the
 * core's files share.
 *
 * A handle keeps its own validated copy of the geometry: after attach, sizes
 * and offsets are never re-read from shared memory, so a corrupted header
 * cannot steer this process outside its mappings.
 */
#ifndef SHARDFS_CACHE_I_H
#define SHARDFS_CACHE_I_H

#include <shardfs/cache.h>

#include "assert_i.h"
#include "layout_i.h"
#include "util_i.h"

#include <pthread.h>
#include <stdarg.h>
#include <syslog.h>

struct sfs_server;

struct sfs_cache {
    /* Control plane. */
    int ctl_fd;
    void *ctl;
    size_t ctl_len;
    struct sfs_header *hdr;
    struct sfs_bucket_rec *buckets;
    struct sfs_slot_rec *slots;
    struct sfs_proc_rec *procs;
    _Atomic uint32_t *leases; /* this process's lease table */
    _Atomic uint64_t *hits;   /* this process's hit counters, one per lease entry */
    uint64_t off_leases;
    uint64_t off_hits;

    /* Validated geometry (local copies). */
    uint64_t shard_size;
    uint64_t stride;
    uint64_t seg_size;
    uint32_t nslots;
    uint32_t nregular; /* slots [0, nregular) are the regular pool */
    uint32_t nreserved;
    uint32_t nbuckets;
    uint32_t bucket_mask;
    uint32_t max_procs;
    uint32_t max_leases;
    uint32_t nhit; /* hit-line entries at the start of each lease table (sfs_hit_entries) */
    uint32_t nsegments;
    uint32_t slots_per_seg;
    uint32_t seg_shift; /* 0: use div/mod */
    uint32_t seg_mask;
    uint32_t npartitions; /* eviction domains (>= 1) */
    /* Each domain's ranges (layout_i.h, part_end and part_rend), as validated. */
    uint32_t part_end[SFS_MAX_PARTITIONS];
    uint32_t part_rend[SFS_MAX_PARTITIONS];
    uint32_t npins;      /* pin table entries (a power of two) */
    uint32_t pin_budget; /* slots pins may hold */
    uint32_t pin_user_budget; /* of them, one user's (root's: any); 0: no bound */
    uint32_t pin_max_s;       /* the longest pin; 0: SFS_PIN_MAX_SECONDS */
    struct sfs_pin_rec *pins;

    /* Data plane (NULL for the query-only role). */
    int *seg_fds;
    uint8_t **seg_base;
    bool query_only;
    bool hugepages;
    bool creator;
    int device_id;

    /* This process's record. */
    uint32_t me;
    uint32_t my_gen;
    struct sfs_proc_rec *self;
    /* Our uid as the daemon sees it (the record's, copied at adopt): the
     * owner of our pins. Not geteuid(), which in a user namespace is the
     * namespace's name for us (a pod's root is 0 there). */
    uint32_t uid;

    /* Free entries of our lease table: a lock-free stack, process-local
     * (see entry_alloc in slot_i.h). */
    _Atomic uint64_t free_head;
    _Atomic uint32_t *free_next;
    _Atomic uint32_t deferred;  /* releases marked ENTRY_DROP, not yet dropped */
    uint64_t id;                /* process-unique handle id (thread spares) */
    struct sfs_cache *reg_next; /* in the registry of open handles */

    /* Touch cascade. */
    sfs_touch_hook_fn *touch_fn;
    void *touch_arg;

    struct sfs_server *server;
    int conn_fd; /* the attach connection, held for the handle's life; -1: none */

    /* admission=scan (admit.c): the mode as the creator set it, and this
     * process's census of the slots its CLOCK hand visited (process-local,
     * so nothing to repair after a death; relaxed: an estimate). */
    bool admit_scan;
    /* Padded to a line each side (the handle is calloc'ed, not aligned):
     * written per hand step, and free_head above is on every Get. */
    uint8_t adm_pad0[SFS_CACHELINE];
    _Atomic uint32_t adm_seen; /* visits in the current window of nregular */
    _Atomic uint32_t adm_prob; /* of them, probationary */
    _Atomic uint32_t adm_last; /* probationary visits of the last full window */
    uint8_t adm_pad1[SFS_CACHELINE];
};

/* pin.c: the evictor's and the loads' side of pins (under the slot's bucket
 * lock, but sfs_pin_on_fail). A pin counts only slots that hold data (Loading or
 * Ready), never a Prealloc'd (Idle) or failed one. sfs_slot_pin_holds: false for
 * an unpinned slot; for a flagged one, true while it holds data and its
 * block's pin lasts, else clears the flag (and the charge) and returns
 * false. sfs_pin_on_load: flag a slot that just became Loading (installed, or
 * taken over from Idle or Failed) if its block is pinned and the budget has
 * room. sfs_pin_on_fail: its load failed. sfs_pin_on_unlink: a slot leaves its
 * chain. */
bool sfs_slot_pin_holds(struct sfs_cache *c, struct sfs_slot_rec *sl);
bool sfs_slot_pin_hint(struct sfs_cache *c, const struct sfs_slot_rec *sl); /* lock-free look */
void sfs_pin_on_load(struct sfs_cache *c, struct sfs_slot_rec *sl);
void sfs_pin_on_fail(struct sfs_cache *c, struct sfs_slot_rec *sl);
void sfs_pin_on_unlink(struct sfs_cache *c, struct sfs_slot_rec *sl);

/* The domain of a key: its shard index mod npartitions (design.md, section 10). */
static inline uint32_t sfs_domain_of(const struct sfs_cache *c, uint32_t shard)
{
    return c->npartitions > 1 ? shard % c->npartitions : 0;
}

/* Hash of a block id. Ids are already md5-style hashes, so one multiply and
 * a fold suffice to spread ids that are not (sequential test ids, say) over
 * the low bits the bucket mask keeps. Inline: it is on every Get. */
static inline uint64_t sfs_key_hash(const struct sfs_block_id *block)
{
    uint64_t a, b;

    __builtin_memcpy(&a, block->b, 8);
    __builtin_memcpy(&b, block->b + 8, 8);
    a = (a ^ (b + 0x9e3779b97f4a7c15ull)) * 0xbf58476d1ce4e5b9ull;
    return a ^ (a >> 29);
}

/* dataplane.c */
int sfs_dp_create(struct sfs_cache *c, int hugepages, int numa_node, bool populate);
int sfs_dp_map(struct sfs_cache *c, const int *fds, uint32_t n);
void sfs_dp_unmap(struct sfs_cache *c);

static inline void *sfs_dp_addr(const struct sfs_cache *c, uint32_t slot)
{
    uint32_t seg, idx;

    SFS_ASSERT(slot < c->nslots && !c->query_only); /* callers bound the index */
    if (c->seg_shift) {
        seg = slot >> c->seg_shift;
        idx = slot & c->seg_mask;
    } else {
        seg = slot / c->slots_per_seg;
        idx = slot % c->slots_per_seg;
    }
    return c->seg_base[seg] + (uint64_t)idx * c->stride;
}

/* ctl.c: lay out / validate the control plane. proc.c: register, close.
 * lease.c: this handle's lease table. */
int sfs_ctl_init(struct sfs_cache *c, const struct sfs_cache_config *cfg);
int sfs_ctl_validate(struct sfs_cache *c);
int sfs_proc_register(struct sfs_cache *c, int device_id);
/* The server's side of connection-held records (proc.c): claim one for a
 * client (pid for logs; uid, its SO_PEERCRED, owns its pins), and declare
 * it dead when the connection closes.
 * The client adopts the record the welcome names. */
int sfs_proc_claim_for(struct sfs_cache *c, int pid, uint32_t uid, int device_id, uint32_t *i,
                       uint32_t *gen);
bool sfs_proc_mark_dead(struct sfs_cache *c, uint32_t i, uint32_t gen);
int sfs_proc_adopt(struct sfs_cache *c, uint32_t i, uint32_t gen);
void sfs_cache_free_handle(struct sfs_cache *c);
int sfs_lease_table_init(struct sfs_cache *c);

/* attach.c. attach_fds: for tests and tools that hold the memfds already;
 * takes ownership of every fd. */
struct sfs_cache *sfs_cache_attach_fds(int ctl_fd, const int *seg_fds, uint32_t nseg, int device_id,
                                       int *err);
/* server.c: stop serving (the handle's close calls it). */
void sfs_server_stop(struct sfs_server *s);

/* bucket.c: take the header's proc_lock (deadline as bucket_lock's). */
int sfs_proc_lock(struct sfs_cache *c, int64_t deadline_ns);
/* served.c: a record's served counts and histograms at claim, and at its
 * fold (under proc_lock; v: the counters the fold took). */
void sfs_served_clear(struct sfs_proc_rec *p);
void sfs_served_fold(struct sfs_cache *c, struct sfs_proc_rec *p, const int64_t *v);

static inline void sfs_ctr_add(struct sfs_cache *c, enum sfs_ctr i, int64_t v)
{
    /* Single writer (this process): relaxed is enough; readers sum. */
    atomic_fetch_add_explicit(&c->self->ctr[i], v, memory_order_relaxed);
}

#endif /* SHARDFS_CACHE_I_H */
