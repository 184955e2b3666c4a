/* SPDX-License-Identifier: MIT */
/*
 * shardfs/cache.h - the CacheBuffer shared by every rank of a node.
 *
 * One process (the daemon, or a test) creates a cache: a control plane in one
 * shared memfd (bucket chains, slot metadata, per-process records) and a data
 * plane of huge-page memfd segments. It serves a Unix socket; every other
 * process attaches through it and receives the memfds with SCM_RIGHTS. After
 * attach, all operations work directly on shared memory: no RPC per Get.
 *
 * A Get of a key returns a lease and a role. A hit is Ready data. The first
 * process to miss a key becomes its owner: it fills the slot and publishes
 * Ready (or Failed with an error). Everyone else is a waiter and blocks on a
 * shared futex until the owner publishes. A leased slot is never evicted.
 *
 * Conventions: actions return 0 or -errno; predicates return bool;
 * constructors return a pointer and take `int *err`. Deadlines are absolute
 * CLOCK_MONOTONIC nanoseconds (see sfs_deadline_after()).
 */
#ifndef SHARDFS_CACHE_H
#define SHARDFS_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SFS_API __attribute__((visibility("default")))
#else
#define SFS_API
#endif

/* A block id is 16 bytes (an md5-style hash of a token block). */
#define SFS_BLOCK_ID_LEN 16
/* Printed as 32 lowercase hex characters; buffers need one more for the NUL. */
#define SFS_BLOCK_HEX_LEN 32

struct sfs_block_id {
    uint8_t b[SFS_BLOCK_ID_LEN];
};

/* A key: (block id, shard index). */
struct sfs_key {
    struct sfs_block_id block;
    uint32_t shard;
};

/* Slot states, as one word in shared memory. */
enum sfs_state {
    SFS_STATE_FREE = 0,    /* not on any chain: no key */
    SFS_STATE_IDLE = 1,    /* on its chain with no data: any Get may take it over */
    SFS_STATE_LOADING = 2, /* an owner is filling it */
    SFS_STATE_READY = 3,   /* data valid */
    SFS_STATE_FAILED = 4,  /* the owner published an error; the next Get retries */
};

/* What a Get made of the caller. */
enum sfs_role {
    SFS_HIT = 0,    /* the slot is Ready: read it, then release */
    SFS_OWNER = 1,  /* fill the slot, then sfs_cache_settle() (or publish / fail) */
    SFS_WAITER = 2, /* someone else fills it: sfs_cache_wait() */
};

/* A lease: a reference on one slot, held between Get and Release. Plain data:
 * it may be copied between threads of the process that took it, not to other
 * processes. */
struct sfs_lease {
    uint32_t slot;  /* slot index */
    uint32_t entry; /* index in this process's lease table */
};

/* Flags for sfs_cache_get(). */
enum {
    SFS_GET_NOALLOC = 1u << 0,  /* never allocate: a miss returns -ENOENT */
    SFS_GET_PREFETCH = 1u << 1, /* advisory fill: no reserved slots, marks prefetched */
    SFS_GET_WRITE = 1u << 2,    /* become owner to rewrite: a present key that is not
                                 * leased is taken over (-EBUSY if it is leased) */
    SFS_GET_PEEK = 1u << 3,     /* not a use: a hit or a wait sets no CLOCK bit and
                                 * keeps a probationary key on probation (a copy
                                 * of what the caller itself loaded and released);
                                 * a load is a load either way */
};

/* Flags for sfs_cache_publish(). */
enum {
    SFS_PUBLISH_WRITTEN = 1u << 0, /* the bytes came from a writer, not the backend:
                                    * not counted in bytes_read */
};

/* Log callback: syslog levels (LOG_ERR ... LOG_DEBUG). The library is silent
 * unless one is set. Process-wide; it may be replaced while other threads
 * log: each line goes whole to the old callback (with its argument) or to
 * the new one. */
typedef void sfs_log_fn(int level, const char *msg, void *arg);
SFS_API void sfs_set_log(sfs_log_fn *fn, void *arg, int max_level);

enum sfs_hugepages {
    SFS_HUGEPAGES_AUTO = 0, /* try MFD_HUGETLB, fall back to ordinary memfds */
    SFS_HUGEPAGES_ON = 1,   /* huge pages or fail with -ENOMEM */
    SFS_HUGEPAGES_OFF = 2,
};

/* Geometry and policy of a new cache. Zero fields take the defaults. */
struct sfs_cache_config {
    uint64_t shard_size;   /* bytes per shard (default 256 KiB) */
    uint64_t capacity;     /* data-plane bytes; slots = capacity / shard_size (default 1 GiB) */
    uint32_t nslots;       /* if set, overrides capacity */
    uint32_t nreserved;    /* of nslots, how many form the reserved pool (default 1/64, 0 ok) */
    uint32_t nbuckets;     /* rounded up to a power of two (default ~nslots/2, >= 64) */
    uint32_t max_procs;    /* attached processes at once (default 64) */
    uint32_t max_leases;   /* leases one process may hold at once (default 16384) */
    uint64_t segment_size; /* bytes per data-plane memfd (default 1 GiB, rounded) */
    int hugepages;         /* enum sfs_hugepages */
    int numa_node;         /* with numa_bind: the node the data plane is bound to */
    bool numa_bind;        /* bind the data plane to numa_node (default: no binding) */
    bool populate;         /* prefault the data plane at create (default false) */
    bool no_reserved;      /* nreserved is exactly 0 (0 in nreserved means default) */
    int admission;         /* enum sfs_admission (default SFS_ADMIT_CLOCK) */
    /* Policies (docs/design.md, section 10). Appended: a caller built against the older header
     * passes a shorter struct; sfs_cache_create is the creator's call (the
     * daemon, tests), not a rank's, so only they need a rebuild. */
    uint32_t partitions; /* eviction domains (0 or 1: one; at most 64); a key's
                          * domain is its shard index mod partitions */
    int pin_budget_pct;  /* percent of the slots pins may hold (0: 25; < 0: no pins) */
    /* Each domain's budget (NULL: equal): `partitions` weights, each 1..
     * SFS_PARTITION_WEIGHT_MAX; domain d owns weights[d] / sum of the regular
     * slots and of the reserved pool (rounded down at each boundary), and
     * every domain must get one regular slot at least (else -EINVAL). */
    const uint32_t *partition_weights;
    /* Appended with pin owners: the longest pin in seconds (0:
     * SFS_PIN_MAX_SECONDS), and the percent of the pin budget one user's
     * pins may hold (0: 100; root, uid 0, is not bounded by it). */
    uint32_t pin_max_seconds;
    uint32_t pin_user_pct;
};

#define SFS_PARTITION_WEIGHT_MAX 1000000u

/* How a new key enters the cache (docs/eviction.md, "Scan-resistant admission"). */
enum sfs_admission {
    SFS_ADMIT_CLOCK = 0, /* CLOCK with the new-load bit: every key on equal terms */
    SFS_ADMIT_SCAN = 1,  /* a new key is probationary until its second access */
};

struct sfs_cache;

/*
 * Create a cache. The caller becomes the first attached process. Returns NULL
 * and sets *err to -errno on failure (-EINVAL for a bad config).
 */
SFS_API struct sfs_cache *sfs_cache_create(const struct sfs_cache_config *cfg, int *err);

/*
 * Serve the attach socket at `path` from a background thread of this process
 * (the creator). An existing socket file at path is replaced. Returns 0 or
 * -errno. Stopped by sfs_cache_close(), which also unlinks the socket.
 */
SFS_API int sfs_cache_serve(struct sfs_cache *c, const char *path);

/*
 * Who may attach, for sfs_cache_serve_opts(). Root and the server's own uid
 * always may; besides them, the uids listed and the members of group gid
 * (primary or supplementary). Refused peers get -EACCES and a log line.
 */
struct sfs_serve_opts {
    const uint32_t *uids; /* more uids allowed to attach (may be NULL) */
    size_t nuids;
    int64_t gid;          /* a group allowed to attach; -1: none */
    uint32_t max_per_uid; /* attached processes one uid may have (0: max_procs) */
};

/*
 * sfs_cache_serve() with an access policy (NULL: the defaults). The socket
 * file is 0600 by default, 0660 with the group gid when gid is set, 0666 when
 * uids are listed (the server then checks each peer itself). The socket's
 * directory must belong to root or this euid and be writable by nobody else
 * unless sticky: -EPERM otherwise.
 */
SFS_API int sfs_cache_serve_opts(struct sfs_cache *c, const char *path,
                                 const struct sfs_serve_opts *opts);

/*
 * Attach to the cache served at `path`. device_id < 0 is the query-only
 * (scheduler) role: control plane only, sfs_cache_data() returns NULL.
 * A cache of another layout is refused with -EPROTO; a corrupt or truncated
 * region with -EBADMSG. A handle belongs to the process that made it: after
 * fork(), the child attaches anew and never uses the parent's handle (its
 * process record, leases and counters are the parent's). The handle keeps
 * its connection to the server (close-on-exec) until sfs_cache_close(): the
 * server reaps this process when it closes. -EACCES: this uid may not
 * attach; -EUSERS: no process record free, or this process or uid holds its
 * bound of them.
 */
SFS_API struct sfs_cache *sfs_cache_attach(const char *path, int device_id, int *err);

/*
 * The attach connection of a handle made by sfs_cache_attach(), or -1. It is
 * held (close-on-exec) for the handle's life: the server reaps this process
 * when it closes, and it turns readable (EOF) when the server goes away. For
 * poll() only: never read, write or close it.
 */
SFS_API int sfs_cache_conn_fd(const struct sfs_cache *c);

/* Release this process's leases, unregister it, unmap. Safe on NULL. */
SFS_API void sfs_cache_close(struct sfs_cache *c);

/*
 * Look up `key`. On success returns the role (enum sfs_role >= 0) and fills
 * *lease: SFS_HIT (Ready), SFS_WAITER (another live owner is loading it:
 * sfs_cache_wait()), or SFS_OWNER: a miss, a Failed or Idle slot, or a dead
 * owner's Loading one; the slot is Loading, and the caller must settle it
 * (sfs_cache_settle(), or publish / fail) or release it unsettled (Idle:
 * the next Get or a waiter takes it over). A prefetch Get returns only
 * SFS_OWNER on success. SFS_GET_PEEK changes no role, only what eviction
 * learns: the hit or wait is not counted as a use. Otherwise *lease is
 * untouched, no lease is taken,
 * and it returns -errno:
 *   -EINVAL     c, key or lease is NULL;
 *   -ENOBUFS    this process holds as many leases as its table allows:
 *               max_leases, of which a quarter (rounded to a power of
 *               two; none under 64) are kept for lock-free hits, 16 per
 *               line of slots, so a Get past the rest fails here;
 *   -ENOENT     SFS_GET_NOALLOC and the key is absent;
 *   -EEXIST     SFS_GET_PREFETCH and the key is present, in any state
 *               (nothing to prefetch: callers skip it, it is no error);
 *   -EBUSY      SFS_GET_WRITE and the key is leased or Loading; also a
 *               negative deadline_ns when the bucket lock is busy;
 *   -ENOSPC     no slot without evicting a leased one: at once for a
 *               prefetch and when deadline_ns is 0 or has passed, else when
 *               no lease was released before deadline_ns;
 *   -ETIMEDOUT  the key's bucket lock stayed held (by a stopped process,
 *               say) until deadline_ns (0: for at most 5 s);
 *   -EBADMSG    the key's chain is corrupt (a bad write to shared memory);
 *   -ENOTRECOVERABLE, or another -errno of the robust bucket lock or of
 *               the futex a full cache sleeps on: returned, never retried.
 */
SFS_API int sfs_cache_get(struct sfs_cache *c, const struct sfs_key *key, unsigned flags,
                          int64_t deadline_ns, struct sfs_lease *lease);

/*
 * How a wait ended (sfs_cache_wait(), and *outcome of the wait_any calls).
 * Its own type: the values are neither slot states (enum sfs_state) nor
 * roles (enum sfs_role), so an outcome compared with a state never matches.
 * (ABI: before this type, a wait returned SFS_STATE_READY (3),
 * SFS_STATE_FAILED (4) or SFS_WAIT_OWNER defined as SFS_STATE_IDLE (1);
 * callers built against that header must be rebuilt.)
 */
enum sfs_wait_outcome {
    SFS_WAIT_READY = 16,  /* the slot is Ready: read it, then release */
    SFS_WAIT_FAILED = 17, /* the owner failed it: sfs_cache_wait_errno() says why */
    SFS_WAIT_OWNER = 18,  /* the owner died or the slot was reset: the caller owns
                           * it now (fill, then sfs_cache_settle()) */
};

/*
 * Block until the leased slot is no longer Loading, or deadline_ns (0: no
 * deadline; library callers always pass one). Returns an enum
 * sfs_wait_outcome (SFS_WAIT_READY, SFS_WAIT_FAILED, SFS_WAIT_OWNER) or
 * -errno: -EINVAL (not a lease of this process), -ETIMEDOUT (also when a
 * takeover's bucket lock stays held to the deadline, or for 5 s without
 * one), -EBADMSG when the leased slot is in a state no leased slot can be in
 * (a bad write to shared memory), or an unexpected error of the futex wait.
 */
SFS_API int sfs_cache_wait(struct sfs_cache *c, const struct sfs_lease *lease, int64_t deadline_ns);

/*
 * The one triage of a wait's outcome into an errno: 0 for SFS_WAIT_READY,
 * the slot's error for SFS_WAIT_FAILED (sfs_cache_error(); -EIO when the
 * slot no longer carries one), the outcome itself when it is -errno, and
 * -EINVAL for SFS_WAIT_OWNER (no error: the caller loads it) or a value that
 * is no outcome.
 */
SFS_API int sfs_cache_wait_errno(struct sfs_cache *c, const struct sfs_lease *lease, int outcome);

/*
 * Block until any of the leased slots is no longer Loading, or deadline_ns.
 * Returns the index i of one such lease and sets *outcome as sfs_cache_wait()
 * would return it for leases[i] (an enum sfs_wait_outcome), or -ETIMEDOUT,
 * -EINVAL, -EBADMSG, an unexpected futex error. At most SFS_WAIT_ANY_MAX leases; one sleep on all
 * their futexes (futex_waitv), so a caller with many keys in flight is never
 * held behind one slow key.
 */
#define SFS_WAIT_ANY_MAX 128
SFS_API int sfs_cache_wait_any(struct sfs_cache *c, const struct sfs_lease *leases, size_t n,
                               int64_t deadline_ns, int *outcome);

/*
 * sfs_cache_wait_any() that also wakes when a doorbell rings: `bell` is a
 * word in the caller's own memory that its other threads bump only with
 * sfs_bell_ring() (and read with __atomic_load_n or C11 atomics) (to add work to a waiter's set,
 * say). Returns n when *bell differs from bell_seen (read it before checking for work, then pass
 * what was read). n may be 0 with a bell. One futex_waitv sleeps on at most
 * 128 words, the bell included: with SFS_WAIT_ANY_MAX leases and a bell the
 * sleep covers 127 of them at a time and moves its window every 2 ms, so
 * the key left out is seen within 2 ms (every wake looks at all n). An
 * unexpected error from the wait is returned, never retried in a loop;
 * -EBADMSG for a leased slot in a state no leased slot can be in.
 */
SFS_API int sfs_cache_wait_any_bell(struct sfs_cache *c, const struct sfs_lease *leases, size_t n,
                                    int64_t deadline_ns, int *outcome, uint32_t *bell,
                                    uint32_t bell_seen);
SFS_API void sfs_bell_ring(uint32_t *bell);

/* Owner: publish the filled slot as Ready with `length` valid bytes
 * (<= shard_size). Counts `length` into bytes_read unless SFS_PUBLISH_WRITTEN.
 * The lease stays held: release it when done reading. Returns 0, -EINVAL
 * (not a lease of this process, or length > shard_size) or -EPERM (the slot
 * is not Loading under this lease: reaped as dead, say). Owners that filled
 * the slot from an I/O call sfs_cache_settle() instead. */
SFS_API int sfs_cache_publish(struct sfs_cache *c, const struct sfs_lease *lease, uint32_t length,
                              unsigned flags);

/* Owner: publish failure `error` (negative errno). The next Get retries.
 * Returns 0, -EINVAL (not a lease of this process, or error >= 0) or -EPERM
 * (the slot is not Loading under this lease: reaped as dead, say). */
SFS_API int sfs_cache_fail(struct sfs_cache *c, const struct sfs_lease *lease, int error);

/*
 * Owner: settle the slot from the result of the I/O that filled it, the one
 * home of "publish or fail" (fs/ and the rank library both call it). The
 * whole shard arrived (io_result == expected_len): publish Ready with
 * expected_len bytes and `flags` (SFS_PUBLISH_*). Otherwise fail it: a
 * negative io_result with that errno, a short one (0 <= io_result !=
 * expected_len) with -EIO. A write that failed (SFS_PUBLISH_WRITTEN: the
 * I/O was a dump of the caller's bytes) is not published as Failed: the
 * error is the writer's, the slot stays its own until the release, which
 * leaves it Idle, and a reader parked on it, or the next Get, loads what
 * the store still has. Returns the outcome:
 *   0        published Ready;
 *   -errno   the slot is Failed with it (what its waiters see; the caller's
 *            own readers should get the same), or, for a write, the
 *            write's error with the slot still Loading;
 *   -EINVAL  not a lease of this process, or expected_len > shard_size:
 *            nothing changed;
 *   -EPERM   the lease is no longer the owner's (reaped as dead, or the
 *            slot was settled already): nothing changed, let go of it.
 * The lease stays held either way: release it when done.
 */
SFS_API int sfs_cache_settle(struct sfs_cache *c, const struct sfs_lease *lease, int io_result,
                             uint32_t expected_len, unsigned flags);

/* The error a Failed slot carries (negative errno; -EIO when it carries
 * none), 0 when the slot is not Failed, -EINVAL for a lease not ours. */
SFS_API int sfs_cache_error(struct sfs_cache *c, const struct sfs_lease *lease);

/* Valid bytes of a Ready slot. */
SFS_API uint32_t sfs_cache_length(struct sfs_cache *c, const struct sfs_lease *lease);

/*
 * Drop a lease. Returns 0, or -EINVAL for a lease this process does not hold
 * (one released already, by another thread too). When the slot's bucket lock
 * stays held for 200 ms (a stopped holder) the release is recorded and
 * returns 0; the slot's count drops under the lock at this process's next
 * release or at close.
 */
SFS_API int sfs_cache_release(struct sfs_cache *c, const struct sfs_lease *lease);

/*
 * True when, since the leased slot was last filled, a Get with SFS_GET_WRITE
 * or a sfs_cache_remove() of its key found it leased and returned -EBUSY
 * (they retry until their deadline). For a holder that keeps a lease long
 * (the mount's page-cache pins) and should let go. A hint, read without a
 * lock; false for a lease not of this process.
 */
SFS_API bool sfs_cache_write_wanted(struct sfs_cache *c, const struct sfs_lease *lease);

/* The slot's bytes in this process's mapping; NULL for the query-only role. */
SFS_API void *sfs_cache_data(struct sfs_cache *c, const struct sfs_lease *lease);

/* State of `key` without taking a lease: enum sfs_state (a snapshot), or
 * -ENOENT (absent), -EINVAL (NULL), -EBADMSG (a corrupt chain), or the
 * bucket lock's -errno as for sfs_cache_get() with deadline_ns 0. */
SFS_API int sfs_cache_state(struct sfs_cache *c, const struct sfs_key *key);

/* True when `key` is Ready in the cache. */
SFS_API bool sfs_cache_exists(struct sfs_cache *c, const struct sfs_key *key);

/*
 * Block-level Touch: set the accessed bit of every resident shard of each
 * block, walking only the buckets those shards can be in, then forward the
 * batch to the touch hook (the cascade contract). Returns the number of slots
 * marked, or -errno.
 */
SFS_API int sfs_cache_touch(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n);

/* The hook Touch forwards its batch to (a backend's touch). Process-local. */
typedef void sfs_touch_hook_fn(const struct sfs_block_id *blocks, size_t n, void *arg);
SFS_API void sfs_cache_set_touch_hook(struct sfs_cache *c, sfs_touch_hook_fn *fn, void *arg);

/*
 * Pin blocks for `seconds` (0: unpin). A pinned block's resident shards, and
 * its shards loaded while the pin lasts (as long as the budget has room for
 * them), are never evicted until the pin's absolute expiry; then they are
 * ordinary slots again, whoever made the pin and whether that process still
 * lives (a pin is an expiry in shared memory, nothing else). Pinning a
 * pinned block sets its expiry to now + seconds. All or nothing: a batch
 * whose resident shards would take the pinned slots above the budget
 * (config pin_budget_pct of the slots) is refused with -EDQUOT and pins
 * nothing; -ENOSPC: the pin table has no entry left near a block's hash;
 * -EPERM: this cache has no pins (pin_budget_pct < 0); -EINVAL: bad
 * arguments or seconds above SFS_PIN_MAX_SECONDS. Returns the shards pinned
 * now (unpin: 0); a block named twice in a batch counts once. "Resident"
 * is Ready or being loaded: a Prealloc'd (Idle) or failed slot holds
 * nothing and is neither pinned nor charged; it is pinned when a Get loads
 * it while the pin lasts.
 */
#define SFS_PIN_MAX_SECONDS (366u * 24 * 3600)
SFS_API int sfs_cache_pin(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n,
                          uint32_t seconds);

/*
 * sfs_cache_pin() on behalf of user uid (sfs_cache_pin() is this with the
 * calling process's uid as the cache's creator sees it: the attach
 * socket's peer uid, which for a process in a user namespace is its mapped
 * host uid, not the namespace's own; the creator's euid): a pin belongs to
 * the user who made it, and only that user or root (uid 0) changes or
 * removes it (-EPERM for the whole batch otherwise; a pin root renews
 * becomes root's). A user's pinned shards stay within pin_user_pct of the
 * pin budget (-EDQUOT), but root's; seconds above the cache's
 * pin_max_seconds is -EINVAL; -ENOSPC also when SFS_PIN_USERS other users
 * hold pins.
 */
SFS_API int sfs_cache_pin_as(struct sfs_cache *c, const struct sfs_block_id *blocks, size_t n,
                             uint32_t seconds, uint32_t uid);

/* 1 if key is resident and its block's pin lasts, 0 if not, or -errno. */
SFS_API int sfs_cache_pinned(struct sfs_cache *c, const struct sfs_key *key);

/* 1 if block's pin lasts, resident or not (a store collector keeps it), 0
 * if not, -EINVAL. Lock-free. */
SFS_API int sfs_cache_block_pinned(struct sfs_cache *c, const struct sfs_block_id *block);

/* Bytes of the slots pins hold now (expired pins swept first). */
SFS_API uint64_t sfs_cache_pinned_bytes(struct sfs_cache *c);

/* The eviction domains: returns their number P and fills out[0..min(P, max))
 * with each domain's evictions so far. */
SFS_API uint32_t sfs_cache_partition_evictions(struct sfs_cache *c, uint64_t *out, uint32_t max);

/* The eviction domains: returns their number P and fills out[0..min(P, max))
 * with each domain's regular slots (its budget: the slots its keys may
 * take, the reserved pool aside). A key's domain is its shard index mod P. */
SFS_API uint32_t sfs_cache_partition_slots(struct sfs_cache *c, uint32_t *out, uint32_t max);

/*
 * Idle-window prewarm: put an Idle slot for `key` on its chain with refcount
 * 0, taking a never-used regular slot if one is left, else a reserved one; it
 * never evicts from the regular pool. Returns 1 if a slot was placed, 0 if the
 * key was already there or no slot could be had, or -errno.
 */
SFS_API int sfs_cache_prealloc(struct sfs_cache *c, const struct sfs_key *key);

/*
 * Remove `key`: unlink it and free its slot. -EBUSY if leased, -ENOENT if
 * absent.
 */
SFS_API int sfs_cache_remove(struct sfs_cache *c, const struct sfs_key *key);

/*
 * Free the leases of attached processes the server saw leave (their attach
 * connection closed: exit, exec, detach) and hand their half-filled slots to
 * the next Get. Returns the number of processes reaped. Liveness is the
 * server's: this judges no process by its pid, reaps only records the server
 * declared dead, and does so only in the server's process (elsewhere it
 * returns 0). The server's own reaper thread calls it as connections close.
 * Never waits for a lock: a dead process whose leases sit behind a busy
 * bucket lock (a stopped holder, say) stays declared dead and is finished
 * by a later call (and not counted until then); the server's reaper comes
 * back within 200 ms.
 */
SFS_API int sfs_cache_reap(struct sfs_cache *c);

/* Visit every key in a given state mask (1u << SFS_STATE_x), without leases:
 * a snapshot taken bucket by bucket. Stops early when fn returns non-zero and
 * returns that value. */
typedef int sfs_key_visit_fn(const struct sfs_key *key, int state, void *arg);
SFS_API int sfs_cache_foreach(struct sfs_cache *c, unsigned state_mask, sfs_key_visit_fn *fn,
                              void *arg);

/*
 * Read-only usage sample, for a sampler outside the hit path (the daemon's
 * hot set): visit the Ready slots of up to max_buckets buckets (0: all),
 * starting at bucket *cursor (taken modulo the bucket count) and leaving
 * *cursor at the next one, so that repeated calls sweep the whole cache at
 * a bounded cost per call. Each visit gets the key, the slot index, the
 * CLOCK accessed bit (set by a hit or a claim, cleared by the hand) and
 * whether any lease holds the slot now. Writes nothing shared; a bucket
 * whose lock is busy is skipped, never waited for. fn runs under the
 * bucket's lock: it must be short, take no lock, and not call into the
 * cache. Stops early when fn returns non-zero and returns that value;
 * -EINVAL for NULL arguments.
 */
typedef int sfs_sample_fn(const struct sfs_key *key, uint32_t slot, bool accessed, bool leased,
                          void *arg);
SFS_API int sfs_cache_sample(struct sfs_cache *c, uint32_t *cursor, uint32_t max_buckets,
                             sfs_sample_fn *fn, void *arg);

/* Counters, summed over every process that ever attached. */
struct sfs_stats {
    uint64_t requests;      /* Gets */
    uint64_t hits;          /* Gets that found Ready data */
    uint64_t misses;        /* Gets that did not (owner or waiter) */
    uint64_t prefetched;    /* slots filled by prefetch */
    uint64_t prefetch_hits; /* Gets served by a prefetched slot (first hit) */
    uint64_t bytes_read;    /* bytes loaded from the backend */
    uint64_t resident_bytes;
    uint64_t capacity_bytes;
    uint64_t owner_loads; /* Gets that made the caller owner */
    uint64_t waits;       /* Gets that made the caller waiter */
    uint64_t evictions;   /* slots with a key taken by CLOCK */
    uint64_t failures;    /* owners that published Failed */
    uint64_t takeovers;   /* ownership taken from a dead owner or an Idle slot */
    uint64_t prealloc;    /* Idle slots placed by Prealloc */
    uint64_t touched;     /* slots marked by Touch */
    uint64_t reaped;      /* dead processes reaped */
};

SFS_API void sfs_cache_stats(struct sfs_cache *c, struct sfs_stats *out);

/* Counters of this process alone. */
SFS_API void sfs_cache_stats_local(struct sfs_cache *c, struct sfs_stats *out);

/*
 * Write-behind dumps (libshardfs-rank's sfs_rank_set_dump_mode(), docs/rank.md):
 * a shard published Ready before the store had it, whose store write then
 * ran in the background. `written`: those writes that ended with the store
 * holding the shard; `failed`: those that failed, leaving the shard in
 * memory only (the daemon's shardfs_write_behind_failed_total). Summed over
 * every process that was ever attached. (ABI: new in SHARDFS_RANK_0.5.)
 */
struct sfs_behind_stats {
    uint64_t written;
    uint64_t failed;
};

SFS_API void sfs_cache_behind_stats(struct sfs_cache *c, struct sfs_behind_stats *out);

/* The writer of a write-behind dump counts how its background store write
 * ended (result < 0: failed), in this process's record. */
SFS_API void sfs_cache_count_behind(struct sfs_cache *c, int result);

/*
 * Where reads were served from, by requester class, and latency histograms
 * (the daemon's /stats). A Get is served from MEMORY when it found the
 * shard Ready or waited for another's load (derived from the counters above:
 * the hit path counts nothing more); the process that loaded a key counts
 * where its load came from: the PEER tier, the STORE, or a MISS (the store
 * had no such shard).
 */
enum sfs_tier { SFS_TIER_MEMORY, SFS_TIER_PEER, SFS_TIER_STORE, SFS_TIER_MISS, SFS_TIERS };
/* What a histogram times: a load from the backend (submit to completion),
 * and a waiter's wait for another's load. */
enum sfs_hist_kind { SFS_HIST_LOAD, SFS_HIST_WAIT, SFS_HIST_KINDS };
#define SFS_HIST_BUCKETS 20 /* bucket i holds <= sfs_hist_bound_ns(i); the last is +Inf */
#define SFS_CLASS_LEN    16 /* a class name: 1..15 of [A-Za-z0-9_.-], NUL-terminated */

/* Not cumulative: bucket[i] counts observations in (bound(i-1), bound(i)]. */
struct sfs_hist {
    uint64_t bucket[SFS_HIST_BUCKETS];
    uint64_t sum_ns;
};

struct sfs_served {
    char name[SFS_CLASS_LEN];
    uint64_t tier[SFS_TIERS];
    uint32_t attached; /* processes of the class attached now */
};

/* Upper bound of histogram bucket i in ns; INT64_MAX for the last. */
SFS_API int64_t sfs_hist_bound_ns(unsigned i);

/* Name this process's requester class ("mount", "rank", an engine
 * adapter's name), shown as the class label in /stats. Written into this
 * process's own record; nothing goes over the attach socket. c NULL: only
 * checks the name. Returns 0, or -EINVAL for a name that is not 1..15 of
 * [A-Za-z0-9_.-]. */
SFS_API int sfs_cache_set_class(struct sfs_cache *c, const char *name);

/* The owner of a load says where it came from (PEER, STORE or MISS; MEMORY
 * is derived and ignored here). Relaxed counters of this process's record. */
SFS_API void sfs_cache_count_served(struct sfs_cache *c, enum sfs_tier t);

/* One observation of ns into this process's histogram k. */
SFS_API void sfs_cache_observe(struct sfs_cache *c, enum sfs_hist_kind k, int64_t ns);

/* Served counts by class, of every process that was ever attached: fills at
 * most max entries, returns how many (classes past the table's room are
 * counted as "other"). */
SFS_API unsigned sfs_cache_served(struct sfs_cache *c, struct sfs_served *out, unsigned max);

/* Histogram k of every process that was ever attached. */
SFS_API void sfs_cache_hist(struct sfs_cache *c, enum sfs_hist_kind k, struct sfs_hist *out);

/* Geometry, for callers that size buffers. */
struct sfs_cache_info {
    uint64_t shard_size;
    uint32_t nslots;
    uint32_t nreserved;
    uint32_t nbuckets;
    uint32_t nsegments;
    uint32_t max_procs;
    bool hugepages;  /* the data plane is on huge pages */
    bool query_only; /* this handle has no data plane */
    int proc_index;  /* this process's record */
    uint64_t control_bytes;
};
SFS_API void sfs_cache_info(struct sfs_cache *c, struct sfs_cache_info *out);

/* Data-plane segment i of this mapping (for device registration). Returns the
 * base address and sets *len, or NULL past the last segment. */
SFS_API void *sfs_cache_segment(struct sfs_cache *c, uint32_t i, size_t *len);

/* Helpers. */
SFS_API int64_t sfs_now_ns(void);
SFS_API int64_t sfs_deadline_after(int64_t ns); /* now + ns */
SFS_API void sfs_block_to_hex(const struct sfs_block_id *id, char out[SFS_BLOCK_HEX_LEN + 1]);
/* Parses exactly 32 hex characters (either case). Returns 0 or -EINVAL. */
SFS_API int sfs_block_from_hex(const char *hex, size_t len, struct sfs_block_id *id);
SFS_API const char *sfs_state_name(int state);

/* Defaults and names that the daemon and its clients share, each defined
 * once: the geometry a zero field of sfs_cache_config takes (and the
 * daemon's -o shard_size, capacity), and the extended attributes of a
 * shardfs mount (docs/fs.md). */
#define SFS_DEFAULT_SHARD_SIZE (256ull << 10) /* bytes per shard */
#define SFS_DEFAULT_CAPACITY   (1ull << 30)   /* data-plane bytes */
#define SFS_DEFAULT_PIN_BUDGET_PCT 25u        /* percent of slots pins may hold */
#define SFS_MAX_PARTITIONS_PUBLIC  64u        /* eviction domains at most */
#define SFS_XATTR_SOCKET       "user.shardfs.socket"   /* root: the attach socket's path */
#define SFS_XATTR_STATE        "user.shardfs.state"    /* shard: its cache state */
#define SFS_XATTR_TOUCH        "user.shardfs.touch"    /* block, set to 1: mark it recently used */
#define SFS_XATTR_PREFETCH     "user.shardfs.prefetch" /* block, set to 1: load it */
#define SFS_XATTR_PIN          "user.shardfs.pin"      /* block, set to SECONDS: pin (0 unpins) */

#ifdef __cplusplus
}
#endif
#endif /* SHARDFS_CACHE_H */
