/* SPDX-License-Identifier: MIT */
/*
 * fs_i.h - private to the shardfs daemon: its state, the inode table, and
 * what its rooms share. Calls flow down this list, never up (checked by
 * .ci/callcircles.py):
 *
 *   main.c     setup and lifetime; unwinds through named labels
 *   options.c  the command line, validated once (checks.c: against the
 *              system); session.c the reaper, the session loop's thread,
 *              the stop signals, daemonizing
 *   ops.c      the operations table (lookup, forget, getattr, statfs, init)
 *   read.c, write.c, dir.c, xattr.c   the handlers: the read path and
 *              readahead; open files and storing shards; changing the tree
 *              and listings; extended attributes
 *   wait.c     reads parked until another's load settles (the settler)
 *   storecap.c -o store_capacity: the collector that bounds the store
 *   usage.c    the learned hot set: usage counts, the usage file, warm restart
 *   storefile.c  files read and written by name in the store, within a deadline
 *   revalidate.c  -o revalidate: drops blocks another host replaced
 *   attr.c     attributes and entry replies; loads.c backend loads into
 *              leased slots, prefetch, the answer of a settled read
 *   pagecache.c  -o page_cache: pins on page-cached shards, their watcher
 *   names.c    names and the inode table; stats.c the /stats text;
 *              cgroup.c memory limits; log.c the daemon's log
 *
 * The tree is virtual: every name is a pure function of (kind, block id,
 * shard index), so an inode is that triple. 128-bit block ids do not fit in a
 * 64-bit inode number, so the daemon keeps a table: each triple the kernel
 * holds a reference to (lookup count > 0) has one node with a number that is
 * never reused. A number the table does not know gives ESTALE, never a crash.
 */
#ifndef SHARDFS_FS_I_H
#define SHARDFS_FS_I_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <shardfs/backend.h>
#include <shardfs/cache.h>

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

/* What an inode is. */
enum fs_kind {
    FS_ROOT = 1, /* MOUNTPOINT */
    FS_BLOCKS,   /* MOUNTPOINT/block */
    FS_STATS,    /* MOUNTPOINT/stats */
    FS_BLOCK,    /* MOUNTPOINT/block/<32 hex> */
    FS_SHARDDIR, /* MOUNTPOINT/block/<32 hex>/shard */
    FS_SHARD,    /* MOUNTPOINT/block/<32 hex>/shard/<n> */
};

/* Fixed inode numbers; the table hands out numbers from FS_INO_DYNAMIC up. */
#define FS_INO_ROOT    FUSE_ROOT_ID
#define FS_INO_BLOCKS  2
#define FS_INO_STATS   3
#define FS_INO_DYNAMIC 16

/* An object of the tree: what an inode number resolves to. */
struct fs_obj {
    int kind;           /* enum fs_kind */
    struct sfs_key key; /* block for FS_BLOCK/FS_SHARDDIR; block and shard for FS_SHARD */
};

/* The old version a retired node's open files read (pagecache.c): refs
 * (fs.lock) are the node's and those of the reads being answered from it,
 * whose replies the kernel may complete (and the reader close) before our
 * writev returns. */
struct fs_snap {
    uint32_t refs;
    uint32_t len;
    uint8_t bytes[];
};

/* One table entry. Every field is protected by fs.lock. */
struct fs_node {
    fuse_ino_t ino;
    struct fs_obj obj;
    uint64_t nlookup;  /* kernel references: + on each entry reply, - on forget */
    uint32_t nwriters; /* open write handles */
    uint32_t ndirty;   /* of those, handles holding bytes not yet stored: the shard exists
                        * (and unlink is EBUSY) while > 0. Not nwriters: RELEASE comes
                        * after close(2) returns, so a closed handle may linger. */
    struct fs_node *next_ino, *next_obj; /* hash chains */
    /* -o page_cache (pagecache.c): while pinned, a lease on the shard's slot
     * that this process holds because the kernel may cache its pages. */
    bool pinned;
    struct sfs_lease pin;
    struct fs_node *pin_prev, *pin_next; /* fs->pins, oldest first */
    /* -o page_cache: open files whose reads the kernel's page cache serves
     * (not direct_io). While > 0 the node keeps the version they read: a
     * change of the key retires it (pagecache.c, "Versions"). */
    uint32_t nreaders;
    /* Retired: no longer its shard's node (off the by_obj chains: a lookup
     * makes a new one); its open files read snap (the version they read),
     * or fail ESTALE when snap is NULL. */
    bool retired;
    struct fs_snap *snap;
};

/* A pin taken off its node, to be dropped: its pages invalidated, then its
 * lease released (pagecache.c). */
struct fs_pinned {
    fuse_ino_t ino;
    struct sfs_lease lease;
    bool readers; /* the node had open page-cache files (nreaders > 0) */
    bool changed; /* a rank wants the slot (the watcher's): a change */
};

/* Counters the daemon keeps itself (the cache keeps the shared ones).
 * Relaxed atomics: statistics, read only by /stats. */
struct fs_counters {
    _Atomic uint64_t backend_loads;     /* loads this daemon submitted to its backend */
    _Atomic uint64_t backend_errors;    /* loads and dumps that completed with an error */
    _Atomic uint64_t reads;             /* FUSE read requests on shard files */
    _Atomic uint64_t read_bytes;        /* bytes answered to those reads */
    _Atomic uint64_t writes;            /* shards stored through the mount */
    _Atomic uint64_t wait_timeouts;     /* reads that gave up waiting (ETIMEDOUT/EAGAIN) */
    _Atomic uint64_t prefetch_accepted; /* shards user.shardfs.prefetch started loading */
    _Atomic uint64_t readahead_started; /* shards readahead started loading */
    _Atomic uint64_t warmed;            /* shards the warm restart started loading */
    _Atomic uint64_t warm_total;        /* shards the warm restart means to load (its budget,
                                         * then what it started once it ends) */
    _Atomic uint64_t reval_sweeps;      /* revalidation sweeps done (revalidate.c) */
    _Atomic uint64_t reval_invalidated; /* blocks a sweep invalidated */
    _Atomic uint64_t reval_removed;     /* shards those invalidations removed */
    _Atomic uint64_t store_bytes;       /* the collector's count of the store's block bytes */
    _Atomic uint64_t store_evicted;     /* blocks the collector removed from the store */
    _Atomic uint64_t store_freed;       /* their bytes */
    _Atomic uint64_t store_collector;   /* 1: this daemon holds the store's collector lease */
    _Atomic uint64_t store_running;     /* 1 while a collection removes (storecap.c) */
    _Atomic uint64_t store_to_remove;   /* bytes the last collection set out to remove */
    _Atomic uint64_t store_removed;     /* bytes it removed so far */
};

/* Readahead markers: a direct-mapped set of hashes of shards that readahead
 * loaded and no read has consumed yet. The first read that finds its shard
 * here (a hit, or a waiter on the load) moves the window on. Lossy on
 * purpose: a collision only costs one readahead. */
#define FS_RA_MARKS 1024

struct fs {
    /* Set up by main() before the session starts; read-only afterwards. */
    struct sfs_cache *cache;
    struct sfs_backend *be;
    uint64_t shard_size;
    uint32_t max_read;  /* bytes per read request (conn->max_read) */
    bool ro;            /* -o ro: every change is EROFS */
    int64_t wait_ns;    /* deadline of a waiter, and of a load on a full cache */
    uint32_t readahead; /* shards loaded ahead of a missed read (0: off) */
    uint32_t nslots;    /* the cache's slots: bounds prefetch (loads.c) */
    uint32_t pc_max;    /* -o page_cache: shards the kernel may cache at once (0: off) */
    uid_t uid;          /* owner of every inode: the backend directory's */
    gid_t gid;          /* group of every inode: the backend directory's */
    mode_t perm;        /* its permission bits (07777 masked to 0777) */
    char socket_path[108];
    struct timespec start; /* mtime/ctime/atime of every inode */

    /* The inode table. */
    pthread_mutex_t lock;
    struct fs_node **by_ino, **by_obj;   /* nbuckets chains each; lock */
    size_t nbuckets, nnodes;             /* lock */
    uint64_t next_ino;                   /* lock */
    struct fs_handle *handles;           /* lock: open files (write.c) */
    struct fs_node *pin_head, *pin_tail; /* lock: pinned nodes, oldest first (pagecache.c) */
    uint32_t npins;                      /* lock: how many */
    uint64_t snap_bytes;                 /* lock: bytes of retired nodes' snapshots */

    /* The page-cache watcher (pagecache.c): sleeps on cond (with fs->lock,
     * CLOCK_MONOTONIC) while nothing is pinned, else looks every
     * PC_POLL_NS for pins a writer wants or beyond the budget. */
    struct fs_pcwatch {
        pthread_cond_t cond;
        bool stop;    /* fs->lock */
        bool started; /* set before and after the thread runs */
        pthread_t thread;
    } pcw;

    /* The session: handlers that block (waiters) poll fuse_session_exited()
     * so that a stop is not held up by them. Set before the loop starts. */
    struct fuse_session *se;

    /* Asynchronous loads (reads and prefetches) still running. Their
     * completions answer requests and publish slots, so the session and the
     * cache must outlive them: at shutdown fs_loads_stop() waits a grace
     * period, then abandons the rest (fails their slots). */
    pthread_mutex_t load_lock;
    pthread_cond_t loads_idle; /* load_lock, CLOCK_MONOTONIC: nloads reached 0 */
    struct load_op *loads;     /* load_lock: in flight (and abandoned, until they complete) */
    uint32_t nloads;           /* load_lock: in flight, not abandoned */

    /* Reads parked until another's load settles (wait.c). */
    struct fs_waitq {
        pthread_mutex_t lock;
        struct fs_waiter *head; /* lock: parked reads */
        size_t n;               /* lock: how many */
        bool stop;              /* lock: fs_waitq_stop() was called */
        bool started;           /* set before and after the settler runs */
        uint32_t bell;          /* sfs_bell_ring() on each park and at stop */
        pthread_t thread;       /* the settler */
    } waitq;

    struct fs_counters ctr;
    _Atomic uint32_t prefetch_pinned; /* relaxed: slots prefetch batches hold leased */

    _Atomic uint64_t ra_mark[FS_RA_MARKS]; /* relaxed: advisory */

    /* The learned hot set and warm restart (usage.c); NULL: none (a store
     * with no directory, or no memory for the table). */
    struct fs_usage *usage;
    uint32_t warm_pin_s; /* -o warm_pin: seconds the warm-up pins what it warms (0: no) */

    uint64_t store_capacity; /* -o store_capacity: bytes (0: off) */
    /* -o store_capacity (storecap.c): the collector; NULL: off. Set before
     * the session starts, cleared after it ended. */
    struct fs_storecap *storecap;

    /* -o revalidate (revalidate.c): the sweep thread. Its table and since
     * are the thread's alone. */
    struct fs_reval {
        pthread_mutex_t lock;
        pthread_cond_t cond; /* lock, CLOCK_MONOTONIC: stop was set */
        _Atomic bool stop;   /* set under lock; the sweep reads it between blocks too */
        bool started;        /* set before and after the thread runs */
        pthread_t thread;
        uint32_t period_ms;     /* 0: off */
        int64_t since;          /* realtime start of the last sweep (the daemon's, at first) */
        struct reval_rec *recs; /* the last sweep's blocks, sorted by id */
        size_t n;
    } reval;
};

/* The coverage build (tests/coverage/run.sh): libgcov writes a process's
 * counters at exit(), so a process that leaves by _exit or exit_group (the
 * daemonizing parent, a stop with handlers stuck in the backend) writes
 * them first, or its last lines read as never run. Nothing otherwise. */
#ifdef SFS_COVERAGE
void __gcov_dump(void);
#define FS_COVERAGE_DUMP() __gcov_dump()
#else
#define FS_COVERAGE_DUMP() ((void)0)
#endif

/* The daemon's defaults and bounds (options.c, session.c, main.c). */
#define SOCKET_DIR "/run/shardfs"
/* SFS_DEFAULT_SHARD_SIZE and SFS_DEFAULT_CAPACITY (shardfs/cache.h) as the
 * usage and the messages write them. */
#define DEFAULT_SHARD_SIZE_TEXT  "256K"
#define DEFAULT_CAPACITY_TEXT    "1G"
#define DEFAULT_WAIT_S           30
#define DEFAULT_MAX_READ         (1u << 20)
#define DEFAULT_MAX_THREADS      64
#define DEFAULT_MAX_IDLE_THREADS 16
#define DEFAULT_READAHEAD        4
#define MAX_READAHEAD            1024
#define PC_POLL_NS               (1000 * 1000ll) /* the page-cache watcher's look at pins */
#define PC_MAX_PINS              8192            /* leases the page-cache mode may hold */
#define DEFAULT_WARM_PCT         25 /* -o warm: percent of capacity */
#define REAP_INTERVAL_NS         (200 * 1000 * 1000ll)
#define STOP_GRACE_NS            (2 * 1000 * 1000 * 1000ll) /* loads in flight get this to finish */
#define SFS_ATTACH_UIDS_MAX      64                         /* uids in -o attach_uids */

/* -o store_capacity: the collector's watermarks, percent of it. */
#define DEFAULT_STORE_HIGH_PCT 95
#define DEFAULT_STORE_LOW_PCT  90

/* -o revalidate: the period on a store hosts share, and its bound. */
#define DEFAULT_REVALIDATE_MS 1000
#define MAX_REVALIDATE_MS     3600000

/* Hidden (not listed): drives a fault backend; the public names are SFS_XATTR_*. */
#define FS_XATTR_FAULT "user.shardfs.fault"

#define FS_BLKSIZE    (128u << 10) /* st_blksize of a shard (at most shard_size): attr.c */
#define ENTRY_TIMEOUT 1.0
#define ATTR_TIMEOUT  1.0
#define STATS_MAX     (32u << 10) /* bytes of the /stats text */

/* Relaxed: statistics. */
#define CTR_ADD(fs, name, v) atomic_fetch_add_explicit(&(fs)->ctr.name, (v), memory_order_relaxed)
#define CTR_SET(fs, name, v) atomic_store_explicit(&(fs)->ctr.name, (v), memory_order_relaxed)

static inline struct fs *fs_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

/* The session is ending (a signal, an unmount): handlers stop waiting. */
static inline bool fs_stopping(struct fs *fs)
{
    return fs->se && fuse_session_exited(fs->se);
}

/* An open file: a shard (read or write handle) or /stats. */
struct fs_handle {
    struct fs_obj obj;
    bool writable;
    bool cached;          /* a shard open for reading through the page cache (nreaders) */
    fuse_ino_t ino;       /* cached: the node it was opened on */
    pthread_mutex_t lock; /* the write handle's fields below */
    uint8_t *buf;         /* write handles: the whole shard */
    uint64_t *written;    /* lock: one bit per byte of buf written through this open file */
    uint64_t nwritten;    /* lock: bits set in written (shard_size: a whole shard) */
    bool wrote;           /* lock: a write(2) came through this open file */
    bool creating;        /* created a new name: with nothing written it stores zeros */
    bool from_zeros;      /* buf started as zeros (O_TRUNC, a new name), not the stored bytes */
    bool dirty;           /* lock: holds bytes not yet stored (counted in fs_node.ndirty) */
    bool kept;            /* lock: a FLUSH reported the shard incomplete (-ENODATA); its
                           * bytes stay for a completing close, else the release
                           * discards them */
    int error;            /* lock: -errno reported to the writer: nothing is stored any more */
    char *text;           /* /stats: the snapshot taken at open */
    size_t text_len;
    /* On fs->handles from just before the open is answered until release
     * (fs->lock), so that those the kernel never releases (files still open
     * when the session ends) are freed at exit. */
    struct fs *fs;
    struct fs_handle *prev, *next;
};

static inline struct fs_handle *fs_fh_of(struct fuse_file_info *fi)
{
    return (struct fs_handle *)(uintptr_t)fi->fh;
}

/* log.c: the daemon's log (the bottom room: calls no other). */
/* One line to the daemon's log: stderr in the foreground, syslog when
 * detached; level as syslog's (LOG_WARNING ...). */
void fs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for a line already formatted; the callback of sfs_set_log(). */
void fs_log_msg(int level, const char *msg, void *arg);
/* From now on the log goes to syslog (the daemon detached from its terminal). */
void fs_log_to_syslog(void);

/* ops.c: the operations table (and lookup, forget, getattr, statfs, init). */
extern const struct fuse_lowlevel_ops fs_ops;

/* attr.c: attributes and entries. */
void fs_fill_attr(struct fs *fs, const struct fs_obj *o, fuse_ino_t ino, struct stat *st);
/* Answer req with the entry of o (one kernel reference taken). */
void fs_reply_entry(fuse_req_t req, struct fs *fs, const struct fs_obj *o);
/* Resolve (parent, name) to an object. -ENOENT for any name outside the tree.
 * check_exists: a shard name must name a shard that exists. */
int fs_child_obj(struct fs *fs, const struct fs_obj *parent, const char *name, bool check_exists,
                 struct fs_obj *out);

/* names.c: names and the inode table. */
/* The inode table and the list of loads in flight. */
int fs_table_init(struct fs *fs);
void fs_table_destroy(struct fs *fs);
/* Parse a shard index: canonical decimal (no sign, no leading zero). */
bool fs_parse_shard(const char *name, uint32_t *out);
/* Parse a block directory name: exactly 32 lowercase hex characters. */
bool fs_parse_block(const char *name, struct sfs_block_id *out);
/* Canonical object: fields a kind does not use are zero. */
struct fs_obj fs_make_obj(int kind, const struct sfs_block_id *block, uint32_t shard);
uint64_t fs_obj_hash(const struct fs_obj *o);
/* What an inode number names; -ESTALE for a number the table does not hold. */
int fs_resolve(struct fs *fs, fuse_ino_t ino, struct fs_obj *out);
/* Take one kernel reference on o and return its number (0 on ENOMEM).
 * writer: also count a new write handle with unstored bytes (create). */
fuse_ino_t fs_obj_ref(struct fs *fs, const struct fs_obj *o, bool writer);
/* Count (or uncount) an open write handle on a shard (delta), and a handle
 * with bytes not yet stored (dirty). */
void fs_writers_add(struct fs *fs, const struct fs_obj *o, int delta, int dirty);
/* True while a write handle of the mount holds bytes of o not yet stored. */
bool fs_has_writers(struct fs *fs, const struct fs_obj *o);
/* True while the mount has o open for writing (stored or not). */
bool fs_has_write_handles(struct fs *fs, const struct fs_obj *o);
/* Drop nlookup kernel references on ino. */
void fs_forget_one(struct fs *fs, fuse_ino_t ino, uint64_t nlookup);
/* A shard exists while a write handle holds it, while the cache has it Ready
 * or Loading, or when the backend has it. */
bool fs_shard_exists(struct fs *fs, const struct sfs_key *key);
/* fs_shard_exists, but 1, 0 or -ETIMEDOUT (the backend did not answer). */
int fs_shard_present(struct fs *fs, const struct sfs_key *key);

/* Page-cache mode (-o page_cache), the inode table's side (names.c). */
/* After answering a read of key from lease l: keep l as the pin of inode
 * ino (0: key's current inode) unless it has one or is retired. True: l is
 * kept (do not release it). */
bool fs_pin_keep(struct fs *fs, fuse_ino_t ino, const struct sfs_key *key,
                 const struct sfs_lease *l);
/* An open for reading through the page cache of ino: 0, or -ESTALE when ino
 * is retired (the kernel looks the name up again). */
int fs_reader_open(struct fs *fs, fuse_ino_t ino);
/* Its release: true when it was the last of a retired node, whose pages
 * nobody can read any more (invalidate them). */
bool fs_reader_close(struct fs *fs, fuse_ino_t ino);
/* Whether ino is retired: 1, and when snap is not NULL *snap (the version
 * its open files read, a reference taken: fs_snap_put it; NULL: none, they
 * fail ESTALE), else 0. */
int fs_node_retired(struct fs *fs, fuse_ino_t ino, struct fs_snap **snap);
void fs_snap_put(struct fs *fs, struct fs_snap *snap);
/* Retire ino (a change of its key while page-cache files are open on it):
 * *snap (malloc'd, one reference, or NULL) becomes what they read, unless
 * the snapshots' budget is spent (then freed and set NULL). The kernel's entry
 * of the name may still lead to ino: its open answers ESTALE, and the
 * kernel looks the name up again (LOOKUP_REVAL), finding the new node. */
void fs_node_retire(struct fs *fs, fuse_ino_t ino, struct fs_snap **snap);
/* Take the pin off key's inode, if it has one: 1 (and *out), else 0. */
int fs_pin_take(struct fs *fs, const struct sfs_key *key, struct fs_pinned *out);
/* Under fs->lock: take off at most max pins that must go (a writer or a
 * remove wants the slot, or beyond fs->pc_max, oldest first). */
size_t fs_pins_collect_locked(struct fs *fs, struct fs_pinned *out, size_t max);

/* pagecache.c: the page-cache mode's pins and their watcher. */
/* Before anything that changes (gone: false) or removes (gone: true) the
 * key: take its pin off, if any, and release it after its inode's pages are
 * invalidated, or, while page-cache files are open on the inode, after the
 * inode is retired (they go on reading the version they read, a copy of it;
 * after a remove, or past the budget, they fail ESTALE). No-op when the
 * mode is off. */
void fs_pin_drop(struct fs *fs, const struct sfs_key *key, bool gone);
/* Answer a read of key on inode ino (0: a direct_io file) from lease l, or
 * from ino's snapshot when ino is retired; then keep l as the pin or release
 * it. */
void fs_read_answer(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                    const struct sfs_lease *l, off_t off, size_t size);

/* -o revalidate (revalidate.c). The period: opt_ms when >= 0, else
 * DEFAULT_REVALIDATE_MS on a store hosts share (sfs_backend_stamp says
 * remote), 0 (off) elsewhere. start: 0 or -errno (0 and nothing started
 * for period 0). stop: false when the sweep was still in the backend after
 * grace_ns (left detached: do not close the backend). */
uint32_t fs_reval_period(struct sfs_backend *be, int64_t opt_ms);
int fs_reval_start(struct fs *fs, uint32_t period_ms);
bool fs_reval_stop(struct fs *fs, int64_t grace_ns);
/* Start / stop the watcher (main; no-ops when the mode is off). */
int fs_pagecache_start(struct fs *fs);
void fs_pagecache_stop(struct fs *fs);

/* read.c: the read path. */
void fs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);

/* usage.c: the learned hot set, the usage file, warm restart (above loads.c). */
/* Set up the hot set of a store (spec: the BACKEND_DIR argument) and start
 * its threads: read BACKEND_DIR/.shardfs_usage (a bad one is ignored with
 * one log line), start warming warm_pct % of capacity from it in the
 * background, sample the cache every second, save the file every minute
 * (not with save false: -o ro). Never fails the mount: on any error the
 * daemon runs without a hot set (fs->usage stays NULL). */
void fs_usage_start(struct fs *fs, const char *spec, unsigned warm_pct, bool save);
/* Stop the threads, write the file a last time, free (safe when NULL);
 * free_it false: leave the table where it is (a thread left to the exit,
 * the store's collector, may still read its counts). */
void fs_usage_stop(struct fs *fs, bool free_it);
/* A read of the mount used a shard of block: count it (striped lock: no
 * line shared by reads of different blocks, bar a 1/64 stripe collision). */
void fs_usage_note(struct fs *fs, const struct sfs_block_id *block);

/* storefile.c: the files the daemon opens by name in the store directory,
 * each open and read or write on a thread of its own, waited for at most
 * timeout_ns (then -ETIMEDOUT, the thread abandoned to finish or to die with
 * the daemon). Read: path's whole content (a regular file, at most max
 * bytes) into *buf (malloc'd) and *len; 0, -ENOENT, -EINVAL (*why says
 * why) or -ETIMEDOUT. Replace: buf (owned, freed) becomes path's content by
 * path.tmp, fsync and rename; 0, -errno, -ETIMEDOUT, or -EBUSY while an
 * earlier abandoned write is still in the store. */
int fs_store_file_read(const char *path, uint64_t max, int64_t timeout_ns, uint8_t **buf,
                       size_t *len, const char **why);
int fs_store_file_replace(const char *path, uint8_t *buf, size_t len, int64_t timeout_ns);

/* The uses the hot set counts for block now (decayed; 0: none, or no hot set). */
uint32_t fs_usage_count(struct fs *fs, const struct sfs_block_id *block);
/* The max hottest blocks by decayed use count, hottest first: how many. */
unsigned fs_usage_hottest(struct fs *fs, struct sfs_block_id *ids, uint32_t *counts, unsigned max);

/* storecap.c: -o store_capacity, the collector (above usage.c). */
/* Start the collector when fs->store_capacity is set (else 0, nothing):
 * its first pass scans the store at once. 0 or -errno. */
int fs_storecap_start(struct fs *fs, unsigned high_pct, unsigned low_pct);
/* Stop it: false when it was still in the store after grace_ns (a hung
 * store; left detached: do not close the backend). */
bool fs_storecap_stop(struct fs *fs, int64_t grace_ns);
/* The mount committed bytes to the store: count them, and start a pass when
 * that takes the count past the high watermark. */
void fs_storecap_note(struct fs *fs, uint64_t bytes);

/* loads.c: backend loads into leased slots (below read.c, wait.c, write.c). */
/* As owner of lease: load the shard asynchronously. Consumes the lease (and
 * answers req, when given) whatever happens. */
void fs_load_start(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                   const struct sfs_lease *lease, off_t off, size_t size);
/*
 * After the session loop: wait up to grace_ns for the loads in flight, then
 * abandon the rest: each one's slot is failed with -ECANCELED (waiters in
 * other processes get that error and their next Get retries), its reader, if
 * any, gets EIO. Their leases stay with this process until sfs_cache_close()
 * drops them. A completion that comes later touches nothing but its own
 * record. Returns how many were abandoned: when > 0 the backend still holds
 * requests, so it must not be closed (its close would wait for them) and fs
 * must stay where it is until the process exits.
 */
unsigned fs_loads_stop(struct fs *fs, int64_t grace_ns);
/* Answer ETIMEDOUT to the readers whose own load has run past wait_timeout
 * (a backend that does not answer); the loads go on. Called by the settler
 * at least every 100 ms. */
void fs_loads_expire(struct fs *fs, int64_t now);
/* Advisory background loads of shards [first, first + n) of block that the
 * backend has and the cache lacks; mark: set readahead markers. Returns how
 * many loads started. */
int fs_prefetch_shards(struct fs *fs, const struct sfs_block_id *block, uint32_t first, uint32_t n,
                       bool mark);
/* True (once) when key carries a readahead marker. */
bool fs_ra_mark_take(struct fs *fs, const struct sfs_key *key);
/* Answer a parked read whose wait ended with r (what sfs_cache_wait()
 * returns, or -ESHUTDOWN / -ENOMEM): the bytes, the error, or a load of its
 * own when it became owner. Consumes the lease. */
void fs_read_settled(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                     const struct sfs_lease *l, off_t off, size_t size, int r);
/* Synchronous: copy the shard's current bytes into buf (via the cache, so
 * the load is shared with concurrent readers). Returns 0 or -errno. */
int fs_load_copy(struct fs *fs, const struct sfs_key *key, void *buf);
/* The wait every writer of the tree shares (a store, a remove): call
 * try(fs, key, arg) while it answers -EBUSY -- a lease on the key, most
 * often a reader finishing one read -- 1 ms apart, until `deadline`; with
 * a `grace` (0: none), also once the grace has passed and the key is not
 * being loaded (a lease that outlives a read is an open reader's or a
 * rank's: not worth the whole wait). Stops early when the session ends.
 * Returns try's last answer. */
typedef int fs_busy_try_fn(struct fs *fs, const struct sfs_key *key, void *arg);
/* A writer's take of a key's slot, as a try's arg: where the lease goes, and
 * the deadline of the whole wait (each try's Get waits for a slot until it). */
struct fs_take {
    struct sfs_lease *lease;
    int64_t deadline;
};
int fs_retry_busy(struct fs *fs, const struct sfs_key *key, int64_t deadline, int64_t grace,
                  fs_busy_try_fn *try, void *arg);

/* wait.c: reads waiting for another's load, answered without a worker. */
/* Start the settler thread (main, before the session loop). 0 or -errno. */
int fs_waitq_start(struct fs *fs);
/* After the session loop: answer every parked read (EIO: the session ended,
 * or its slot's state), stop and join the settler. */
void fs_waitq_stop(struct fs *fs);
/* Park req (a waiter on l's slot, lease consumed) until the slot settles or
 * deadline (CLOCK_MONOTONIC ns). Returns at once; the settler answers. */
void fs_waitq_park(struct fs *fs, fuse_req_t req, fuse_ino_t ino, const struct sfs_key *key,
                   const struct sfs_lease *lease, off_t off, size_t size, int64_t deadline);

/* write.c: open files, storing shards. */
void fs_op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                  struct fuse_file_info *fi);
void fs_op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev);
void fs_op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                 struct fuse_file_info *fi);
void fs_op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi);
void fs_op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                   struct fuse_file_info *fi);
/* Files still open when the session ended: free them (main, before
 * fs_table_destroy). */
void fs_handles_drop(struct fs *fs);

/* dir.c: changing the tree, directory listings. */
void fs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode);
void fs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name);
void fs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                  const char *newname, unsigned int flags);
void fs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname);
void fs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name);
void fs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
void fs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info *fi);
void fs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);

/* xattr.c: extended attributes. */
void fs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                    size_t size, int flags);
void fs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void fs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);

/* stats.c: the /stats text. */
/* Write the Prometheus text of the counters into buf; returns its length
 * (which may exceed len: then the text was cut). */
size_t fs_stats_text(struct fs *fs, char *buf, size_t len);

/* cgroup.c */
/* One limit: bytes (UINT64_MAX: none) and the file that set it. */
struct fs_limit {
    uint64_t bytes;
    char where[PATH_MAX + 64];
};

struct fs_cgroup_limits {
    struct fs_limit memory;  /* smallest memory.max / memory.limit_in_bytes */
    struct fs_limit hugetlb; /* smallest hugetlb.<size>.max / .limit_in_bytes */
    bool hugetlb_in_memory;  /* cgroup2 memory_hugetlb_accounting: huge pages count in memory */
};

/* The limits of this process's cgroup and all its ancestors, for huge pages of
 * hugepage_size bytes (0: none). Never fails: what cannot be read is no limit. */
void fs_cgroup_limits(uint64_t hugepage_size, struct fs_cgroup_limits *out);
/* The default huge page size (Hugepagesize in /proc/meminfo), or 0. */
uint64_t fs_hugepage_size(void);
/* Undo the octal escapes of /proc/self/mountinfo (\040 for a space) in place. */
void fs_unescape(char *s);

/* options.c: the command line. */
/* What the command line says. Strings are owned by fuse_opt (free them). */
struct fs_options {
    char *shard_size;
    char *capacity;
    char *dir_prefix;
    char *socket;
    char *hugepages;
    char *reserved;
    char *wait_timeout;
    char *readahead;
    char *warm;             /* -o warm=PCT */
    char *partitions;       /* -o partitions=P */
    char *partition_budget; /* -o partition_budget=W0:W1:...: each domain's share */
    char *pin_budget;       /* -o pin_budget=PCT */
    char *pin_max;          /* -o pin_max=SECONDS */
    char *pin_user_share;   /* -o pin_user_share=PCT */
    char *warm_pin;         /* -o warm_pin=SECONDS */
    char *revalidate;       /* -o revalidate=MS */
    char *numa_node;
    char *attach_uids; /* U1:U2:...: more uids that may attach */
    char *attach_gid;  /* a group whose members may attach */
    char *page_cache;  /* SIZE: bytes of shards the kernel page cache may hold */
    char *admission;   /* clock|scan: -o admission (enum sfs_admission) */
    char *peer_listen;   /* ADDR:PORT: enables the peer tier (design.md, section 11) */
    char *peers;         /* the members file */
    char *peer_capacity; /* SIZE: slot region bytes */
    char *peer_ways;     /* N */
    char *peer_slot;     /* SIZE: max payload (default the shard size) */
    char *peer_key;      /* the members' key file (required with peer_listen) */

    char *store_capacity; /* SIZE: bound of the store's block bytes (storecap.c) */
    char *store_high;     /* PCT of it: the collector starts above */
    char *store_low;      /* PCT of it: and stops at */

    char *backend;     /* the first non-option argument */
    unsigned max_read;
    bool max_read_set;
    bool ro;
    bool perms_on;  /* -o default_permissions given (it is the default anyway) */
    bool perms_off; /* -o no_default_permissions: the kernel checks no modes */
    int nonopts;
    int bad; /* a one-line error was printed */
};

/* The validated configuration. */
struct fs_config {
    struct sfs_cache_config cache;
    unsigned dir_prefix;
    int64_t wait_ns;
    uint32_t readahead;
    uint64_t page_cache; /* bytes (0: off) */
    unsigned warm_pct; /* -o warm: percent of capacity warmed at mount (0: off) */
    uint32_t warm_pin_s; /* -o warm_pin: pin the warmed blocks this long (0: no) */
    int64_t revalidate_ms; /* -o revalidate: sweep period (0: off; -1: the store's default) */

    uint64_t store_capacity;                /* -o store_capacity: bytes (0: off) */
    unsigned store_high_pct, store_low_pct; /* its watermarks, low < high */
    char socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
    bool default_socket;
    /* Who may attach besides root and our uid (-o attach_uids, attach_gid). */
    uint32_t attach_uids[SFS_ATTACH_UIDS_MAX];
    struct sfs_serve_opts serve;
    /* -o partition_budget: cache.partition_weights points here. */
    uint32_t partition_weights[SFS_MAX_PARTITIONS_PUBLIC];
    /* hugepages=auto turned into on: ordinary memory for the data plane
     * would be above this cgroup memory limit. */
    bool no_fallback;
    struct fs_limit memory_limit;
};

/* Parse argv's options into *o (zeroed first; free with fs_options_free even
 * on failure). 0, or -1 with the reason on stderr. */
int fs_options_parse(struct fuse_args *args, struct fs_options *o);
/* checks.c: the start's checks against the system (0, or -1 with one line
 * on stderr). The default socket path for a mount point; the store
 * directory of a backend spec exists; the mount point is a free directory;
 * the socket path is ours to take (default_dir: create SOCKET_DIR). */
int fs_default_socket(const char *mnt, char *out, size_t outlen);
int fs_check_backend(const char *spec);
int fs_check_mountpoint(const char *mnt);
int fs_check_socket(const char *path, bool default_dir);
/* Validate *o into *cfg and check BACKEND_DIR, MOUNTPOINT and the socket
 * path. 0, or -1 with a one-line reason on stderr. */
int fs_options_check(const struct fs_options *o, const char *mnt, struct fs_config *cfg);
/* Add the mount options the kernel needs (default_permissions, max_read). */
int fs_options_mount_args(const struct fs_options *o, struct fuse_args *args);
void fs_options_free(struct fs_options *o);
/* The backend spec the daemon opens: BACKEND_DIR, wrapped in a peer: spec
 * when -o peer_listen is given (malloc'd; NULL: out of memory). */
char *fs_backend_spec(const struct fs_options *o);
void fs_usage(const char *prog);
/* Every inode shows the backend directory's owner, group and permission
 * bits, so that with default_permissions the mount grants exactly what the
 * store's own directory does (chgrp + chmod g+w BACKEND_DIR gives a group
 * write access). Read once, at start. A store with no directory (mem:): the
 * daemon's user, 0755. */
void fs_inode_owner(const char *spec, struct fs *fs);

/* session.c: the reaper, the session loop's thread, daemonizing. */
/* Finishes the reaps the attach server could not, every REAP_INTERVAL_NS. */
struct fs_reaper {
    struct sfs_cache *cache;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    bool stop;           /* lock */
};

/* The session loop in a thread of its own (session.c says why). */
struct fs_session_loop {
    struct fuse_session *se;
    bool single;
    unsigned clone_fd, max_idle_threads, max_threads;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;   /* CLOCK_MONOTONIC: done was set */
    bool done;             /* lock */
    int err;               /* lock: what the loop returned */
    int64_t grace_left_ns; /* set by fs_loop_wait(): the stop grace not yet spent */
};

/* SIGINT, SIGTERM, SIGHUP, SIGQUIT: only the session loop's thread takes them. */
void fs_stop_signals(sigset_t *set);
int fs_reaper_start(struct fs_reaper *r, struct sfs_cache *c);
void fs_reaper_stop(struct fs_reaper *r);
/* Run the session loop (l's se and sizes set) in its own thread. 0 or -errno. */
int fs_loop_start(struct fs_session_loop *l);
/* Wait for the loop to end. Once the session has exited (a signal, an
 * unmount), wait at most grace_ns more for libfuse to join its workers.
 * True: the loop returned and was joined (l->err, l->grace_left_ns are
 * set). False: a handler is still running after the grace; the loop thread
 * is left as it is. Bound: wakes every 100 ms to look at the session. */
bool fs_loop_wait(struct fs_session_loop *l, int64_t grace_ns);
/* Fork; the parent waits for the child's verdict and exits with it. Returns
 * the write end of the pipe in the child. */
int fs_daemonize_start(void);
/* The child is mounted and serving: detach from the terminal, release the
 * parent with status 0. */
void fs_daemonize_done(int fd);

#endif /* SHARDFS_FS_I_H */
