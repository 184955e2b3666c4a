/* SPDX-License-Identifier: MIT */
/*
 * fs_i.h - private to the shardfs daemon: its state, the inode table, and
 * what its rooms share: main.c (setup, options, lifetime), ops.c (the
 * operations table, attributes and entries), names.c (names and the inode
 * table), read.c (the read path), write.c (open files and storing shards),
 * dir.c (changing the tree, listings), xattr.c (xattrs and /stats) and
 * cgroup.c (memory limits).
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
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
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
    char socket_path[108];
    struct timespec start; /* mtime/ctime/atime of every inode */

    /* The inode table. */
    pthread_mutex_t lock;
    struct fs_node **by_ino, **by_obj; /* nbuckets chains each; lock */
    size_t nbuckets, nnodes;           /* lock */
    uint64_t next_ino;                 /* lock */
    struct fs_handle *handles;         /* lock: open files (write.c) */

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

    struct fs_counters ctr;

    _Atomic uint64_t ra_mark[FS_RA_MARKS]; /* relaxed: advisory */
};

#define ENTRY_TIMEOUT 1.0
#define ATTR_TIMEOUT  1.0
#define STATS_MAX     (16u << 10) /* bytes of the /stats text */

/* Relaxed: statistics. */
#define CTR_ADD(fs, name, v) atomic_fetch_add_explicit(&(fs)->ctr.name, (v), memory_order_relaxed)

static inline struct fs *fs_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

/* An open file: a shard (read or write handle) or /stats. */
struct fs_handle {
    struct fs_obj obj;
    bool writable;
    pthread_mutex_t lock; /* buf, dirty */
    uint8_t *buf;         /* write handles: the whole shard */
    bool dirty;           /* lock: buf differs from what was last stored */
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

/* ops.c: the operations table, attributes and entries. */
extern const struct fuse_lowlevel_ops fs_ops;
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
/* Drop nlookup kernel references on ino. */
void fs_forget_one(struct fs *fs, fuse_ino_t ino, uint64_t nlookup);
/* A shard exists while a write handle holds it, while the cache has it Ready
 * or Loading, or when the backend has it. */
bool fs_shard_exists(struct fs *fs, const struct sfs_key *key);

/* read.c: the read path. */
void fs_op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi);
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
/* Advisory background loads of shards [first, first + n) of block that the
 * backend has and the cache lacks; mark: set readahead markers. Returns how
 * many loads started. */
int fs_prefetch_shards(struct fs *fs, const struct sfs_block_id *block, uint32_t first, uint32_t n,
                       bool mark);
/* The session is ending (a signal, an unmount): handlers stop waiting. */
bool fs_stopping(struct fs *fs);
/* Synchronous: copy the shard's current bytes into buf (via the cache, so
 * the load is shared with concurrent readers). Returns 0 or -errno. */
int fs_load_copy(struct fs *fs, const struct sfs_key *key, void *buf);

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
/* Files still open when the session ended: free them (fs_table_destroy). */
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

/* xattr.c: extended attributes and /stats. */
void fs_op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                    size_t size, int flags);
void fs_op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
void fs_op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void fs_op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name);
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

#endif /* SHARDFS_FS_I_H */
