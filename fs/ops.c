/* SPDX-License-Identifier: MIT */
/*
 * ops.c - the FUSE low-level handlers of shardfs: a virtual tree over the
 * shared CacheBuffer and the backend below it.
 *
 *   /block                      blocks with shards resident in the cache
 *   /block/<32 hex>             any well-formed id is a directory
 *   /block/<32 hex>/shard       shard indices the backend or the cache holds
 *   /block/<32 hex>/shard/<n>   one regular file of shard_size bytes
 *   /stats                      counters, Prometheus text
 *
 * Key idea: a read of a shard file is a cache Get. A hit is answered straight
 * from the data-plane mapping (fuse_reply_buf: splice from hugetlb memfds
 * fails). The first reader of a missing shard becomes its owner: it submits an
 * asynchronous backend load into the slot and returns to the loop; the load's
 * completion publishes the slot (Ready or Failed) and answers the request from
 * the backend's thread. Every other reader of that shard, in this daemon or in
 * an attached rank, is a waiter: it blocks on the slot's futex with a deadline
 * and answers when the owner publishes. The lease is released after the reply
 * is written, so a slot is never evicted under a reply.
 *
 * Readahead: a read that misses (owner or waiter) also starts advisory loads
 * of the next -o readahead shards of its block (the prefetch xattr's path),
 * and marks them; the first read of a marked shard moves the window on. So a
 * sequential reader keeps several backend loads in flight.
 *
 * Writes produce whole shards: a write handle buffers the shard in private
 * memory (starting from the stored bytes, or zeros for a new shard or
 * O_TRUNC) and stores it on flush/fsync/release: a Get with SFS_GET_WRITE
 * takes the slot, the bytes go in, the backend writes them through (its
 * tmp + rename commit), and the slot is published as written.
 *
 * Every handler ends in exactly one fuse_reply_*; cache and backend errors are
 * -errno and negated once, at the reply.
 */
#include "fs_i.h"

#include <shardfs/fault.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#define ENTRY_TIMEOUT 1.0
#define ATTR_TIMEOUT  1.0
#define UNKNOWN_INO   0xffffffffu
#define STATS_MAX     (16u << 10)
#define STOP_POLL_NS  (100 * 1000 * 1000ll) /* how often a blocked handler checks for a stop */

#define XATTR_TOUCH    "user.shardfs.touch"
#define XATTR_PREFETCH "user.shardfs.prefetch"
#define XATTR_STATE    "user.shardfs.state"
#define XATTR_SOCKET   "user.shardfs.socket"
#define XATTR_FAULT    "user.shardfs.fault" /* hidden: fault backends only */

/* Relaxed: statistics. */
#define CTR_ADD(fs, name, v) atomic_fetch_add_explicit(&(fs)->ctr.name, (v), memory_order_relaxed)

static struct fs *fs_of(fuse_req_t req)
{
    return fuse_req_userdata(req);
}

/* ---------------------------------------------------------------------------
 * Names.
 */

bool fs_parse_block(const char *name, struct sfs_block_id *out)
{
    if (strlen(name) != SFS_BLOCK_HEX_LEN)
        return false;
    for (size_t i = 0; i < SFS_BLOCK_HEX_LEN; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return false; /* lowercase only: one name per block */
    return sfs_block_from_hex(name, SFS_BLOCK_HEX_LEN, out) == 0;
}

bool fs_parse_shard(const char *name, uint32_t *out)
{
    uint64_t v = 0;
    size_t len = strlen(name);

    if (len == 0 || len > 10 || (len > 1 && name[0] == '0'))
        return false;
    for (size_t i = 0; i < len; i++) {
        if (name[i] < '0' || name[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    if (v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* ---------------------------------------------------------------------------
 * The inode table: two chained hashes (by number, by object) over one set of
 * nodes, grown by doubling.
 */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t obj_hash(const struct fs_obj *o)
{
    uint64_t a, b;

    memcpy(&a, o->key.block.b, 8);
    memcpy(&b, o->key.block.b + 8, 8);
    return mix64(a ^ mix64(b ^ mix64(((uint64_t)o->kind << 32) | o->key.shard)));
}

static bool obj_eq(const struct fs_obj *x, const struct fs_obj *y)
{
    return x->kind == y->kind && x->key.shard == y->key.shard &&
           memcmp(&x->key.block, &y->key.block, sizeof(x->key.block)) == 0;
}

/* Canonical object: fields a kind does not use are zero, so equal objects
 * compare equal. */
static struct fs_obj make_obj(int kind, const struct sfs_block_id *block, uint32_t shard)
{
    struct fs_obj o;

    memset(&o, 0, sizeof(o));
    o.kind = kind;
    if (block && (kind == FS_BLOCK || kind == FS_SHARDDIR || kind == FS_SHARD))
        o.key.block = *block;
    if (kind == FS_SHARD)
        o.key.shard = shard;
    return o;
}

int fs_table_init(struct fs *fs)
{
    fs->nbuckets = 1024;
    fs->by_ino = calloc(fs->nbuckets, sizeof(*fs->by_ino));
    fs->by_obj = calloc(fs->nbuckets, sizeof(*fs->by_obj));
    if (!fs->by_ino || !fs->by_obj) {
        free(fs->by_ino);
        free(fs->by_obj);
        return -ENOMEM;
    }
    fs->nnodes = 0;
    fs->next_ino = FS_INO_DYNAMIC;
    fs->handles = NULL;
    fs->loads = NULL;
    fs->nloads = 0;
    {
        pthread_condattr_t ca;

        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&fs->loads_idle, &ca);
        pthread_condattr_destroy(&ca);
    }
    pthread_mutex_init(&fs->load_lock, NULL);
    return -pthread_mutex_init(&fs->lock, NULL);
}

static void handles_drop(struct fs *fs);

void fs_table_destroy(struct fs *fs)
{
    handles_drop(fs);
    for (size_t i = 0; fs->by_ino && i < fs->nbuckets; i++) {
        struct fs_node *n = fs->by_ino[i];

        while (n) {
            struct fs_node *next = n->next_ino;

            free(n);
            n = next;
        }
    }
    free(fs->by_ino);
    free(fs->by_obj);
    fs->by_ino = fs->by_obj = NULL;
    pthread_mutex_destroy(&fs->lock);
    /* Abandoned loads may still complete (and take load_lock) until exit. */
    pthread_mutex_lock(&fs->load_lock);
    bool idle = !fs->loads;
    pthread_mutex_unlock(&fs->load_lock);
    if (idle) {
        pthread_cond_destroy(&fs->loads_idle);
        pthread_mutex_destroy(&fs->load_lock);
    }
}

/* Under fs->lock. */
static struct fs_node *node_by_ino(struct fs *fs, fuse_ino_t ino)
{
    for (struct fs_node *n = fs->by_ino[mix64(ino) & (fs->nbuckets - 1)]; n; n = n->next_ino)
        if (n->ino == ino)
            return n;
    return NULL;
}

/* Under fs->lock. */
static struct fs_node *node_by_obj(struct fs *fs, const struct fs_obj *o)
{
    for (struct fs_node *n = fs->by_obj[obj_hash(o) & (fs->nbuckets - 1)]; n; n = n->next_obj)
        if (obj_eq(&n->obj, o))
            return n;
    return NULL;
}

/* Under fs->lock. Doubling is best effort: a failed allocation keeps the old
 * (longer) chains. */
static void table_grow(struct fs *fs)
{
    size_t nb = fs->nbuckets * 2;
    struct fs_node **bi = calloc(nb, sizeof(*bi)), **bo = calloc(nb, sizeof(*bo));

    if (!bi || !bo) {
        free(bi);
        free(bo);
        return;
    }
    for (size_t i = 0; i < fs->nbuckets; i++) {
        struct fs_node *n = fs->by_ino[i];

        while (n) {
            struct fs_node *next = n->next_ino;
            size_t hi = mix64(n->ino) & (nb - 1), ho = obj_hash(&n->obj) & (nb - 1);

            n->next_ino = bi[hi];
            bi[hi] = n;
            n->next_obj = bo[ho];
            bo[ho] = n;
            n = next;
        }
    }
    free(fs->by_ino);
    free(fs->by_obj);
    fs->by_ino = bi;
    fs->by_obj = bo;
    fs->nbuckets = nb;
}

/* Under fs->lock: find or add the node of o. */
static struct fs_node *node_get(struct fs *fs, const struct fs_obj *o)
{
    struct fs_node *n = node_by_obj(fs, o);
    size_t hi, ho;

    if (n)
        return n;
    n = calloc(1, sizeof(*n));
    if (!n)
        return NULL;
    if (fs->nnodes >= 2 * fs->nbuckets)
        table_grow(fs);
    n->ino = fs->next_ino++;
    n->obj = *o;
    hi = mix64(n->ino) & (fs->nbuckets - 1);
    ho = obj_hash(o) & (fs->nbuckets - 1);
    n->next_ino = fs->by_ino[hi];
    fs->by_ino[hi] = n;
    n->next_obj = fs->by_obj[ho];
    fs->by_obj[ho] = n;
    fs->nnodes++;
    return n;
}

/* Under fs->lock: drop n when nothing refers to it any more. */
static void node_maybe_free(struct fs *fs, struct fs_node *n)
{
    struct fs_node **pp;

    if (n->nlookup > 0 || n->nwriters > 0)
        return;
    for (pp = &fs->by_ino[mix64(n->ino) & (fs->nbuckets - 1)]; *pp; pp = &(*pp)->next_ino)
        if (*pp == n) {
            *pp = n->next_ino;
            break;
        }
    for (pp = &fs->by_obj[obj_hash(&n->obj) & (fs->nbuckets - 1)]; *pp; pp = &(*pp)->next_obj)
        if (*pp == n) {
            *pp = n->next_obj;
            break;
        }
    fs->nnodes--;
    free(n);
}

/* What an inode number names; -ESTALE for a number the table does not hold. */
static int resolve(struct fs *fs, fuse_ino_t ino, struct fs_obj *out)
{
    struct fs_node *n;

    switch (ino) {
    case FS_INO_ROOT:
        *out = make_obj(FS_ROOT, NULL, 0);
        return 0;
    case FS_INO_BLOCKS:
        *out = make_obj(FS_BLOCKS, NULL, 0);
        return 0;
    case FS_INO_STATS:
        *out = make_obj(FS_STATS, NULL, 0);
        return 0;
    }
    pthread_mutex_lock(&fs->lock);
    n = node_by_ino(fs, ino);
    if (n)
        *out = n->obj;
    pthread_mutex_unlock(&fs->lock);
    return n ? 0 : -ESTALE;
}

/* Take one kernel reference on o and return its number (0 on ENOMEM).
 * writer: also count a new write handle with unstored bytes (create). */
static fuse_ino_t obj_ref(struct fs *fs, const struct fs_obj *o, bool writer)
{
    struct fs_node *n;
    fuse_ino_t ino = 0;

    switch (o->kind) {
    case FS_ROOT:
        return FS_INO_ROOT;
    case FS_BLOCKS:
        return FS_INO_BLOCKS;
    case FS_STATS:
        return FS_INO_STATS;
    }
    pthread_mutex_lock(&fs->lock);
    n = node_get(fs, o);
    if (n) {
        n->nlookup++;
        if (writer) {
            n->nwriters++;
            n->ndirty++;
        }
        ino = n->ino;
    }
    pthread_mutex_unlock(&fs->lock);
    return ino;
}

/* Count (or uncount) an open write handle on a shard (delta), and a handle
 * with bytes not yet stored (dirty). */
static void writers_add(struct fs *fs, const struct fs_obj *o, int delta, int dirty)
{
    struct fs_node *n;

    pthread_mutex_lock(&fs->lock);
    n = delta > 0 ? node_get(fs, o) : node_by_obj(fs, o);
    if (n) {
        if (delta > 0)
            n->nwriters++;
        else if (delta < 0 && n->nwriters > 0)
            n->nwriters--;
        if (dirty > 0)
            n->ndirty++;
        else if (dirty < 0 && n->ndirty > 0)
            n->ndirty--;
        node_maybe_free(fs, n);
    }
    pthread_mutex_unlock(&fs->lock);
}

/* True while a write handle of the mount holds bytes of o not yet stored. A
 * handle whose bytes are stored does not count: its RELEASE is sent after
 * close(2) returns, and must not make a following unlink EBUSY. */
static bool has_writers(struct fs *fs, const struct fs_obj *o)
{
    struct fs_node *n;
    bool w;

    pthread_mutex_lock(&fs->lock);
    n = node_by_obj(fs, o);
    w = n && n->ndirty > 0;
    pthread_mutex_unlock(&fs->lock);
    return w;
}

static void forget_one(struct fs *fs, fuse_ino_t ino, uint64_t nlookup)
{
    struct fs_node *n;

    if (ino < FS_INO_DYNAMIC)
        return;
    pthread_mutex_lock(&fs->lock);
    n = node_by_ino(fs, ino);
    if (n) {
        n->nlookup = n->nlookup > nlookup ? n->nlookup - nlookup : 0;
        node_maybe_free(fs, n);
    }
    pthread_mutex_unlock(&fs->lock);
}

/* ---------------------------------------------------------------------------
 * What exists.
 */

/* A shard exists while a write handle holds it, while the cache has it Ready
 * or Loading, or when the backend has it. */
static bool shard_exists(struct fs *fs, const struct sfs_key *key)
{
    struct fs_obj o = make_obj(FS_SHARD, &key->block, key->shard);
    bool present = false;
    int st;

    if (has_writers(fs, &o))
        return true;
    st = sfs_cache_state(fs->cache, key);
    if (st == SFS_STATE_READY || st == SFS_STATE_LOADING)
        return true;
    if (sfs_backend_exists(fs->be, key, 1, &present) < 0)
        return false;
    return present;
}

struct block_scan {
    struct sfs_block_id block;
    uint32_t *idx; /* resident shard indices of block */
    size_t n, cap;
    int err;
};

static int scan_block_cb(const struct sfs_key *key, int state, void *arg)
{
    struct block_scan *s = arg;

    if (memcmp(&key->block, &s->block, sizeof(s->block)) != 0)
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        uint32_t *p = realloc(s->idx, cap * sizeof(*p));

        if (!p) {
            s->err = -ENOMEM;
            return 1;
        }
        s->idx = p;
        s->cap = cap;
    }
    s->idx[s->n++] = key->shard;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

/* The shard indices of block: 0..count-1 from the backend, plus resident
 * (Ready or Loading) ones, sorted and unique. *out is malloc'd. */
#define MAX_LISTED_SHARDS (1 << 20)

static int block_shards(struct fs *fs, const struct sfs_block_id *block, uint32_t **out,
                        size_t *nout)
{
    struct block_scan s = {.block = *block};
    int count = sfs_backend_shard_count(fs->be, block);
    size_t n = 0;
    uint32_t *all;

    if (count < 0)
        count = 0;
    /* A store file can be huge or sparse: list at most this many (every
     * shard stays reachable by name; docs/fs.md). */
    if (count > MAX_LISTED_SHARDS)
        count = MAX_LISTED_SHARDS;
    sfs_cache_foreach(fs->cache, (1u << SFS_STATE_READY) | (1u << SFS_STATE_LOADING), scan_block_cb,
                      &s);
    if (s.err) {
        free(s.idx);
        return s.err;
    }
    all = malloc(((size_t)count + s.n + 1) * sizeof(*all));
    if (!all) {
        free(s.idx);
        return -ENOMEM;
    }
    for (int i = 0; i < count; i++)
        all[n++] = (uint32_t)i;
    for (size_t i = 0; i < s.n; i++)
        if (s.idx[i] >= (uint32_t)count)
            all[n++] = s.idx[i];
    free(s.idx);
    qsort(all, n, sizeof(*all), cmp_u32);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || all[u - 1] != all[i])
            all[u++] = all[i];
    *out = all;
    *nout = u;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Attributes and entries.
 */

static void fill_attr(struct fs *fs, const struct fs_obj *o, fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_uid = getuid();
    st->st_gid = getgid();
    st->st_atim = st->st_mtim = st->st_ctim = fs->start;
    st->st_blksize = (blksize_t)(fs->shard_size < (1u << 20) ? fs->shard_size : (1u << 20));
    switch (o->kind) {
    case FS_SHARD:
        st->st_mode = S_IFREG | (fs->ro ? 0444 : 0644);
        st->st_nlink = 1;
        st->st_size = (off_t)fs->shard_size;
        st->st_blocks = (blkcnt_t)((fs->shard_size + 511) / 512);
        break;
    case FS_STATS: {
        char buf[STATS_MAX];

        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = (off_t)fs_stats_text(fs, buf, sizeof(buf));
        break;
    }
    default:
        st->st_mode = S_IFDIR | (fs->ro ? 0555 : 0755);
        st->st_nlink = 2;
        break;
    }
}

static void reply_entry(fuse_req_t req, struct fs *fs, const struct fs_obj *o)
{
    struct fuse_entry_param e;

    memset(&e, 0, sizeof(e));
    e.ino = obj_ref(fs, o, false);
    if (!e.ino) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    fill_attr(fs, o, e.ino, &e.attr);
    e.attr_timeout = o->kind == FS_STATS ? 0.0 : ATTR_TIMEOUT;
    e.entry_timeout = ENTRY_TIMEOUT;
    if (fuse_reply_entry(req, &e) != 0)
        forget_one(fs, e.ino, 1); /* the kernel did not take the reference */
}

/* Resolve (parent, name) to an object. -ENOENT for any name outside the tree.
 * check_exists: a shard name must name a shard that exists. */
static int child_obj(struct fs *fs, const struct fs_obj *parent, const char *name,
                     bool check_exists, struct fs_obj *out)
{
    struct sfs_block_id id;
    uint32_t n;

    switch (parent->kind) {
    case FS_ROOT:
        if (strcmp(name, "block") == 0)
            *out = make_obj(FS_BLOCKS, NULL, 0);
        else if (strcmp(name, "stats") == 0)
            *out = make_obj(FS_STATS, NULL, 0);
        else
            return -ENOENT;
        return 0;
    case FS_BLOCKS:
        if (!fs_parse_block(name, &id))
            return -ENOENT;
        *out = make_obj(FS_BLOCK, &id, 0);
        return 0;
    case FS_BLOCK:
        if (strcmp(name, "shard") != 0)
            return -ENOENT;
        *out = make_obj(FS_SHARDDIR, &parent->key.block, 0);
        return 0;
    case FS_SHARDDIR:
        if (!fs_parse_shard(name, &n))
            return -ENOENT;
        *out = make_obj(FS_SHARD, &parent->key.block, n);
        if (check_exists && !shard_exists(fs, &out->key))
            return -ENOENT;
        return 0;
    default:
        return -ENOTDIR;
    }
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    int r = resolve(fs, parent, &p);

    if (r == 0)
        r = child_obj(fs, &p, name, true, &o);
    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    reply_entry(req, fs, &o);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    forget_one(fs_of(req), ino, nlookup);
    fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    for (size_t i = 0; i < count; i++)
        forget_one(fs_of(req), forgets[i].ino, forgets[i].nlookup);
    fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    struct stat st;
    int r = resolve(fs, ino, &o);

    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    fill_attr(fs, &o, ino, &st);
    fuse_reply_attr(req, &st, o.kind == FS_STATS ? 0.0 : ATTR_TIMEOUT);
}

/* ---------------------------------------------------------------------------
 * The read path: Get, then hit / owner / waiter.
 */

/* An asynchronous backend load into a leased slot; req is NULL for a
 * prefetch (nobody to answer). On fs->loads from submission until its
 * completion; freed by load_done(). Exactly one of load_done() and
 * fs_loads_stop() handles it: whichever sets its flag first, under
 * fs->load_lock. */
struct load_op {
    struct fs *fs;
    fuse_req_t req;
    struct sfs_lease lease;
    off_t off;
    size_t size;
    struct sfs_io io;
    struct load_op *prev, *next; /* fs->load_lock */
    bool completing;             /* fs->load_lock: load_done() is handling it */
    bool abandoned;              /* fs->load_lock: fs_loads_stop() handled it */
};

/* The errno a reader gets for a load error: ENOENT for a shard that is gone,
 * EIO for everything else (errors, short reads). */
static int reader_errno(int err)
{
    return err == -ENOENT ? ENOENT : EIO;
}

/* Answer a read from a Ready slot; the caller releases the lease after. */
static void reply_slot(struct fs *fs, fuse_req_t req, const struct sfs_lease *l, off_t off,
                       size_t size)
{
    const char *data = sfs_cache_data(fs->cache, l);
    uint32_t len = sfs_cache_length(fs->cache, l);

    if (!data) {
        fuse_reply_err(req, EIO);
        return;
    }
    if ((uint64_t)off >= len) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > len - (uint64_t)off)
        size = len - (size_t)off;
    CTR_ADD(fs, read_bytes, size);
    fuse_reply_buf(req, data + off, size);
}

static void loads_unlink(struct fs *fs, struct load_op *op)
{
    if (op->prev)
        op->prev->next = op->next;
    else
        fs->loads = op->next;
    if (op->next)
        op->next->prev = op->prev;
}

/* Backend completion: publish, answer the reader (if any), release. Runs on a
 * backend thread, or inline in submit. */
static void load_done(struct sfs_io *io)
{
    struct load_op *op = io->arg;
    struct fs *fs = op->fs;
    int err = 0;

    pthread_mutex_lock(&fs->load_lock);
    if (op->abandoned) {
        /* Too late: shutdown failed the slot and answered the reader. The
         * bytes the backend wrote are for this key; nobody reads them. */
        loads_unlink(fs, op);
        pthread_mutex_unlock(&fs->load_lock);
        free(op);
        return;
    }
    op->completing = true;
    pthread_mutex_unlock(&fs->load_lock);

    if (io->result == (int)io->len) {
        err = sfs_cache_publish(fs->cache, &op->lease, io->len, 0);
    } else {
        err = io->result < 0 ? io->result : -EIO;
        CTR_ADD(fs, backend_errors, 1);
        sfs_cache_fail(fs->cache, &op->lease, err);
    }
    if (op->req) {
        if (err)
            fuse_reply_err(op->req, reader_errno(err));
        else
            reply_slot(fs, op->req, &op->lease, op->off, op->size);
    }
    sfs_cache_release(fs->cache, &op->lease);
    pthread_mutex_lock(&fs->load_lock);
    loads_unlink(fs, op);
    if (--fs->nloads == 0)
        pthread_cond_broadcast(&fs->loads_idle);
    pthread_mutex_unlock(&fs->load_lock);
    free(op);
}

/* As owner of lease: load the shard asynchronously. Consumes the lease (and
 * answers req, when given) whatever happens. */
static void start_load(struct fs *fs, fuse_req_t req, const struct sfs_key *key,
                       const struct sfs_lease *lease, off_t off, size_t size)
{
    struct load_op *op = calloc(1, sizeof(*op));
    struct sfs_io *iop;
    void *data = sfs_cache_data(fs->cache, lease);
    int r;

    if (!op || !data) {
        free(op);
        sfs_cache_fail(fs->cache, lease, op ? -EIO : -ENOMEM);
        sfs_cache_release(fs->cache, lease);
        if (req)
            fuse_reply_err(req, op ? EIO : ENOMEM);
        return;
    }
    op->fs = fs;
    op->req = req;
    op->lease = *lease;
    op->off = off;
    op->size = size;
    op->io.key = *key;
    op->io.buf = data;
    op->io.len = (uint32_t)fs->shard_size;
    op->io.done = load_done;
    op->io.arg = op;
    iop = &op->io;
    pthread_mutex_lock(&fs->load_lock);
    op->next = fs->loads;
    if (op->next)
        op->next->prev = op;
    fs->loads = op;
    fs->nloads++;
    pthread_mutex_unlock(&fs->load_lock);
    CTR_ADD(fs, backend_loads, 1);
    r = sfs_backend_load(fs->be, &iop, 1);
    if (r < 0) {
        /* Nothing was submitted: complete it here, once. */
        op->io.result = r;
        load_done(&op->io);
    }
}

unsigned fs_loads_stop(struct fs *fs, int64_t grace_ns)
{
    int64_t deadline = sfs_deadline_after(grace_ns);
    struct timespec ts = {deadline / 1000000000, deadline % 1000000000};
    unsigned n = 0;

    pthread_mutex_lock(&fs->load_lock);
    while (fs->nloads && pthread_cond_timedwait(&fs->loads_idle, &fs->load_lock, &ts) != ETIMEDOUT)
        ;
    for (struct load_op *op = fs->loads; op; op = op->next) {
        if (op->completing || op->abandoned)
            continue;
        /* Failed, not given back: every waiter learns at once that this
         * load will not come, and the next Get (any process) retries. The
         * lease stays ours until sfs_cache_close(), so the slot cannot go
         * to another key while the backend may still write into it. */
        op->abandoned = true;
        sfs_cache_fail(fs->cache, &op->lease, -ECANCELED);
        if (op->req)
            fuse_reply_err(op->req, EIO);
        op->req = NULL;
        fs->nloads--;
        n++;
    }
    /* Those already completing finish in a moment: they answer requests on
     * the session main() is about to destroy. */
    while (fs->nloads)
        pthread_cond_wait(&fs->loads_idle, &fs->load_lock);
    pthread_mutex_unlock(&fs->load_lock);
    return n;
}

/* Readahead markers (fs_i.h): 0 is "empty", so a hash is never 0. */
static uint64_t ra_hash(const struct sfs_key *key)
{
    struct fs_obj o = make_obj(FS_SHARD, &key->block, key->shard);
    uint64_t h = obj_hash(&o);

    return h ? h : 1;
}

static void ra_mark_set(struct fs *fs, const struct sfs_key *key)
{
    uint64_t h = ra_hash(key);

    atomic_store_explicit(&fs->ra_mark[h & (FS_RA_MARKS - 1)], h, memory_order_relaxed);
}

/* True (once) when key carries a readahead marker. */
static bool ra_mark_take(struct fs *fs, const struct sfs_key *key)
{
    uint64_t h = ra_hash(key);
    _Atomic uint64_t *m = &fs->ra_mark[h & (FS_RA_MARKS - 1)];
    uint64_t v = atomic_load_explicit(m, memory_order_relaxed);

    return v == h && atomic_compare_exchange_strong_explicit(m, &v, 0, memory_order_relaxed,
                                                             memory_order_relaxed);
}

/* Advisory: start background loads of shards [first, first + n) of block,
 * only those the backend has (0..shard_count-1) and the cache lacks
 * (SFS_GET_PREFETCH: no reserved slots, never waits, never evicts a leased
 * slot). mark: set a readahead marker on each load started. Returns how many
 * loads started. Used by user.shardfs.prefetch and by readahead. */
static int prefetch_shards(struct fs *fs, const struct sfs_block_id *block, uint32_t first,
                           uint32_t n, bool mark)
{
    int count = sfs_backend_shard_count(fs->be, block), started = 0;
    uint32_t end;

    if (count <= 0 || first >= (uint32_t)count)
        return 0;
    end = n < (uint32_t)count - first ? first + n : (uint32_t)count;
    for (uint32_t i = first; i < end; i++) {
        struct sfs_key k = {.block = *block, .shard = i};
        struct sfs_lease l;
        int r = sfs_cache_get(fs->cache, &k, SFS_GET_PREFETCH, 0, &l);

        if (r == -EEXIST)
            continue; /* already there */
        if (r < 0)
            break; /* no free slot without evicting: stop, it is advice */
        if (r != SFS_OWNER) {
            sfs_cache_release(fs->cache, &l);
            continue;
        }
        if (mark)
            ra_mark_set(fs, &k);
        start_load(fs, NULL, &k, &l, 0, 0);
        started++;
    }
    return started;
}

/* A read of key missed (or consumed a readahead marker): have the next
 * fs->readahead shards of its block loading, so a sequential reader finds
 * several backend loads in flight instead of waiting for each in turn. */
static void read_ahead(struct fs *fs, const struct sfs_key *key)
{
    int started;

    if (!fs->readahead || key->shard == UINT32_MAX)
        return;
    started = prefetch_shards(fs, &key->block, key->shard + 1, fs->readahead, true);
    if (started > 0)
        CTR_ADD(fs, readahead_started, (uint64_t)started);
}

/* The session is ending (a signal, an unmount): handlers stop waiting. */
static bool stopping(struct fs *fs)
{
    return fs->se && fuse_session_exited(fs->se);
}

/* sfs_cache_wait() in slices of STOP_POLL_NS, so that a stop is not held up
 * for wait_timeout by a load that may never come (the session loop joins
 * its workers before main() can abandon anything). Waking is still the
 * futex's: a publish ends the wait at once. Returns what sfs_cache_wait()
 * returns, or -ESHUTDOWN. */
static int wait_slot(struct fs *fs, const struct sfs_lease *l, int64_t deadline)
{
    for (;;) {
        int64_t slice = sfs_now_ns() + STOP_POLL_NS;
        int r;

        if (stopping(fs))
            return -ESHUTDOWN;
        r = sfs_cache_wait(fs->cache, l, slice < deadline ? slice : deadline);
        if (r != -ETIMEDOUT || slice >= deadline)
            return r;
    }
}

/* Errors of a Get, for a reader. */
static int get_errno(struct fs *fs, int r)
{
    if (r == -ENOSPC || r == -ENOBUFS) {
        CTR_ADD(fs, wait_timeouts, 1);
        return EAGAIN; /* every slot leased until the deadline */
    }
    return r == -ENOENT ? ENOENT : EIO;
}

static void read_shard(fuse_req_t req, struct fs *fs, const struct sfs_key *keyp, size_t size,
                       off_t off)
{
    /* A copy: once req is answered, a RELEASE may free the handle keyp is in. */
    const struct sfs_key key = *keyp;
    struct sfs_lease l;
    bool ra = false;
    int r;

    CTR_ADD(fs, reads, 1);
    if (off < 0 || (uint64_t)off >= fs->shard_size || size == 0) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    if (size > fs->shard_size - (uint64_t)off)
        size = fs->shard_size - (size_t)off;
    r = sfs_cache_get(fs->cache, &key, 0, sfs_deadline_after(fs->wait_ns), &l);
    if (r < 0) {
        fuse_reply_err(req, get_errno(fs, r));
        return;
    }
    if (r == SFS_OWNER) {
        start_load(fs, req, &key, &l, off, size);
        read_ahead(fs, &key); /* after ours: our load goes first */
        return;
    }
    if (r == SFS_WAITER) {
        /* Before blocking: the loads behind this one overlap the wait. */
        if (fs->readahead) {
            ra_mark_take(fs, &key);
            read_ahead(fs, &key);
        }
        r = wait_slot(fs, &l, sfs_deadline_after(fs->wait_ns));
        if (r == SFS_WAIT_OWNER) {
            /* The owner died or gave the slot back: ours to fill now. */
            start_load(fs, req, &key, &l, off, size);
            return;
        }
        if (r == -ETIMEDOUT) {
            CTR_ADD(fs, wait_timeouts, 1);
            fuse_reply_err(req, ETIMEDOUT);
            sfs_cache_release(fs->cache, &l);
            return;
        }
        if (r != SFS_STATE_READY) {
            int err = r == SFS_STATE_FAILED ? sfs_cache_error(fs->cache, &l) : r;

            fuse_reply_err(req, reader_errno(err < 0 ? err : -EIO));
            sfs_cache_release(fs->cache, &l);
            return;
        }
    } else {
        /* A hit on a shard readahead loaded: move the window on. */
        ra = fs->readahead && ra_mark_take(fs, &key);
    }
    reply_slot(fs, req, &l, off, size);
    sfs_cache_release(fs->cache, &l);
    if (ra)
        read_ahead(fs, &key);
}

/* Synchronous: copy the shard's current bytes into buf (via the cache, so
 * the load is shared with concurrent readers). Returns 0 or -errno. */
static int load_copy(struct fs *fs, const struct sfs_key *key, void *buf)
{
    struct sfs_lease l;
    int r = sfs_cache_get(fs->cache, key, 0, sfs_deadline_after(fs->wait_ns), &l);

    if (r == -ENOSPC || r == -ENOBUFS) {
        /* No slot to be had: read around the cache. */
        r = sfs_backend_load_sync(fs->be, key, buf, (uint32_t)fs->shard_size);
        return r < 0 ? r : r == (int)fs->shard_size ? 0 : -EIO;
    }
    if (r < 0)
        return r;
    if (r == SFS_WAITER) {
        r = wait_slot(fs, &l, sfs_deadline_after(fs->wait_ns));
        if (r == SFS_WAIT_OWNER) {
            r = SFS_OWNER;
        } else if (r != SFS_STATE_READY) {
            int err = r == SFS_STATE_FAILED ? sfs_cache_error(fs->cache, &l) : r;

            sfs_cache_release(fs->cache, &l);
            return err < 0 ? err : -EIO;
        }
    }
    if (r == SFS_OWNER) {
        void *data = sfs_cache_data(fs->cache, &l);

        CTR_ADD(fs, backend_loads, 1);
        r = data ? sfs_backend_load_sync(fs->be, key, data, (uint32_t)fs->shard_size) : -EIO;
        if (r == (int)fs->shard_size) {
            sfs_cache_publish(fs->cache, &l, (uint32_t)fs->shard_size, 0);
        } else {
            r = r < 0 ? r : -EIO;
            CTR_ADD(fs, backend_errors, 1);
            sfs_cache_fail(fs->cache, &l, r);
            sfs_cache_release(fs->cache, &l);
            return r;
        }
    }
    {
        uint32_t len = sfs_cache_length(fs->cache, &l);
        const void *data = sfs_cache_data(fs->cache, &l);

        if (data)
            memcpy(buf, data, len < fs->shard_size ? len : fs->shard_size);
        else
            r = -EIO;
    }
    sfs_cache_release(fs->cache, &l);
    return r < 0 ? r : 0;
}

/* ---------------------------------------------------------------------------
 * The write path: whole shards, written through.
 */

/* Store one whole shard: take the slot for writing, fill it, dump it to the
 * backend (tmp + rename there), publish it as written. Returns 0 or -errno. */
static int store_shard(struct fs *fs, const struct sfs_key *key, const void *buf)
{
    int64_t deadline = sfs_deadline_after(fs->wait_ns);
    uint32_t len = (uint32_t)fs->shard_size;
    struct sfs_lease l;
    void *data;
    int r;

    for (;;) {
        r = sfs_cache_get(fs->cache, key, SFS_GET_WRITE, deadline, &l);
        if (r >= 0 && r != SFS_OWNER) {
            sfs_cache_release(fs->cache, &l); /* not ours to write: try again */
            r = -EBUSY;
        }
        if (r != -EBUSY)
            break;
        /* A reader holds the old bytes: let it finish. */
        if (sfs_now_ns() >= deadline)
            return -EBUSY;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (r == -ENOSPC || r == -ENOBUFS) {
        /* Every slot is leased: write straight through; the key is absent
         * from the cache, so nothing stale stays behind. */
        r = sfs_backend_dump_sync(fs->be, key, buf, len);
        if (r < 0)
            CTR_ADD(fs, backend_errors, 1);
        else
            CTR_ADD(fs, writes, 1);
        return r < 0 ? r : 0;
    }
    if (r < 0)
        return r;
    data = sfs_cache_data(fs->cache, &l);
    if (!data) {
        r = -EIO;
    } else {
        memcpy(data, buf, len);
        r = sfs_backend_dump_sync(fs->be, key, data, len);
        if (r >= 0 && r != (int)len)
            r = -EIO;
    }
    if (r < 0) {
        CTR_ADD(fs, backend_errors, 1);
        sfs_cache_fail(fs->cache, &l, r);
    } else {
        sfs_cache_publish(fs->cache, &l, len, SFS_PUBLISH_WRITTEN);
        CTR_ADD(fs, writes, 1);
        r = 0;
    }
    sfs_cache_release(fs->cache, &l);
    return r;
}

/* An open file. */
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

static struct fs_handle *fh_of(struct fuse_file_info *fi)
{
    return (struct fs_handle *)(uintptr_t)fi->fh;
}

/* Under h->lock, on a write handle counted by writers_add: mark whether it
 * holds bytes not yet stored. */
static void handle_set_dirty(struct fs *fs, struct fs_handle *h, bool dirty)
{
    if (h->dirty == dirty)
        return;
    h->dirty = dirty;
    writers_add(fs, &h->obj, 0, dirty ? 1 : -1);
}

/* Put h on fs->handles: call before answering the open. */
static void handle_track(struct fs *fs, struct fs_handle *h)
{
    pthread_mutex_lock(&fs->lock);
    h->fs = fs;
    h->prev = NULL;
    h->next = fs->handles;
    if (h->next)
        h->next->prev = h;
    fs->handles = h;
    pthread_mutex_unlock(&fs->lock);
}

static void handle_free(struct fs_handle *h)
{
    if (!h)
        return;
    if (h->fs) {
        struct fs *fs = h->fs;

        pthread_mutex_lock(&fs->lock);
        if (h->prev)
            h->prev->next = h->next;
        else
            fs->handles = h->next;
        if (h->next)
            h->next->prev = h->prev;
        pthread_mutex_unlock(&fs->lock);
    }
    if (h->writable)
        pthread_mutex_destroy(&h->lock);
    free(h->buf);
    free(h->text);
    free(h);
}

/* Files still open when the session ended: the kernel will not release
 * them any more. Bytes written and not stored are lost: say so. */
static void handles_drop(struct fs *fs)
{
    while (fs->handles) {
        struct fs_handle *h = fs->handles;

        if (h->writable && h->dirty) {
            char hex[SFS_BLOCK_HEX_LEN + 1];

            sfs_block_to_hex(&h->obj.key.block, hex);
            fprintf(stderr,
                    "shardfs: stopping: block %s shard %u was open for writing; "
                    "bytes not yet stored are lost\n",
                    hex, h->obj.key.shard);
        }
        handle_free(h);
    }
}

/* A write handle on shard o: the buffer starts from the stored bytes unless
 * truncating or new. */
static int open_writer(struct fs *fs, const struct fs_obj *o, int flags, bool creating,
                       struct fs_handle **out)
{
    struct fs_handle *h = calloc(1, sizeof(*h));
    int r = 0;

    if (!h)
        return -ENOMEM;
    h->obj = *o;
    h->writable = true;
    h->buf = calloc(1, fs->shard_size);
    if (!h->buf) {
        free(h);
        return -ENOMEM;
    }
    pthread_mutex_init(&h->lock, NULL);
    if (!(flags & O_TRUNC) && shard_exists(fs, &o->key)) {
        r = load_copy(fs, &o->key, h->buf);
        if (r == -ENOENT)
            r = 0; /* removed meanwhile: starts as zeros */
    } else {
        /* A new or truncated shard is stored even if nothing is written. */
        h->dirty = true;
    }
    (void)creating;
    if (r < 0) {
        handle_free(h);
        return r;
    }
    *out = h;
    return 0;
}

static int flush_handle(struct fs *fs, struct fs_handle *h)
{
    int r = 0;

    if (!h || !h->writable)
        return 0;
    pthread_mutex_lock(&h->lock);
    if (h->dirty) {
        r = store_shard(fs, &h->obj.key, h->buf);
        if (r == 0)
            handle_set_dirty(fs, h, false);
    }
    pthread_mutex_unlock(&h->lock);
    return r;
}

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = NULL;
    struct fs_obj o;
    bool wr = (fi->flags & O_ACCMODE) != O_RDONLY;
    int r = resolve(fs, ino, &o);

    if (r < 0)
        goto out_err;
    switch (o.kind) {
    case FS_STATS: {
        char buf[STATS_MAX];

        if (wr) {
            r = -EACCES;
            goto out_err;
        }
        h = calloc(1, sizeof(*h));
        if (!h) {
            r = -ENOMEM;
            goto out_err;
        }
        h->obj = o;
        h->text_len = fs_stats_text(fs, buf, sizeof(buf));
        if (h->text_len >= sizeof(buf))
            h->text_len = sizeof(buf) - 1;
        h->text = strndup(buf, h->text_len);
        if (!h->text) {
            free(h);
            r = -ENOMEM;
            goto out_err;
        }
        break;
    }
    case FS_SHARD:
        if (wr) {
            if (fs->ro) {
                r = -EROFS;
                goto out_err;
            }
            r = open_writer(fs, &o, fi->flags, false, &h);
            if (r < 0)
                goto out_err;
            writers_add(fs, &o, 1, h->dirty ? 1 : 0);
        } else {
            h = calloc(1, sizeof(*h));
            if (!h) {
                r = -ENOMEM;
                goto out_err;
            }
            h->obj = o;
        }
        break;
    default:
        r = -EISDIR;
        goto out_err;
    }
    fi->fh = (uintptr_t)h;
    fi->direct_io = 1;
    fi->keep_cache = 0;
    /* Closing a reader has nothing to store: spare the FLUSH round trip. */
    fi->noflush = !h->writable;
    handle_track(fs, h);
    if (fuse_reply_open(req, fi) != 0) {
        if (h->writable)
            writers_add(fs, &o, -1, h->dirty ? -1 : 0);
        handle_free(h);
    }
    return;
out_err:
    fuse_reply_err(req, -r);
}

/* The shard a create or mknod names: a regular file in a shard/ directory
 * of a writable mount. */
static int new_shard_obj(struct fs *fs, fuse_ino_t parent, const char *name, mode_t mode,
                         struct fs_obj *o)
{
    struct fs_obj p;
    int r = resolve(fs, parent, &p);

    if (r < 0)
        return r;
    if (fs->ro)
        return -EROFS;
    if (!S_ISREG(mode) || p.kind != FS_SHARDDIR)
        return p.kind == FS_SHARDDIR ? -EINVAL : -ENOENT;
    return child_obj(fs, &p, name, false, o);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fuse_entry_param e;
    struct fs_handle *h = NULL;
    struct fs_obj o;
    int r = new_shard_obj(fs, parent, name, mode, &o);

    if (r < 0)
        goto out_err;
    r = open_writer(fs, &o, fi->flags, true, &h);
    if (r < 0)
        goto out_err;
    h->dirty = true; /* created: stored on close even if nothing is written */
    memset(&e, 0, sizeof(e));
    e.ino = obj_ref(fs, &o, true);
    if (!e.ino) {
        handle_free(h);
        r = -ENOMEM;
        goto out_err;
    }
    fill_attr(fs, &o, e.ino, &e.attr);
    e.attr_timeout = ATTR_TIMEOUT;
    e.entry_timeout = ENTRY_TIMEOUT;
    fi->fh = (uintptr_t)h;
    fi->direct_io = 1;
    handle_track(fs, h);
    if (fuse_reply_create(req, &e, fi) != 0) {
        writers_add(fs, &o, -1, -1);
        forget_one(fs, e.ino, 1);
        handle_free(h);
    }
    return;
out_err:
    fuse_reply_err(req, -r);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    void *zeros;
    int r = new_shard_obj(fs, parent, name, mode, &o);

    if (r < 0)
        goto out_err;
    if (shard_exists(fs, &o.key)) {
        r = -EEXIST;
        goto out_err;
    }
    zeros = calloc(1, fs->shard_size);
    if (!zeros) {
        r = -ENOMEM;
        goto out_err;
    }
    r = store_shard(fs, &o.key, zeros);
    free(zeros);
    if (r < 0)
        goto out_err;
    reply_entry(req, fs, &o);
    return;
out_err:
    fuse_reply_err(req, -r);
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = fh_of(fi);

    if (!h) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (h->obj.kind == FS_STATS) {
        if (off < 0 || (size_t)off >= h->text_len) {
            fuse_reply_buf(req, NULL, 0);
            return;
        }
        if (size > h->text_len - (size_t)off)
            size = h->text_len - (size_t)off;
        /* Reply from a copy: the reader wakes inside our writev, and with
         * noflush its RELEASE may free h before writev returns (harmless to
         * the kernel's copy, but the buffer must outlive the call). */
        char copy[STATS_MAX];

        memcpy(copy, h->text + off, size);
        fuse_reply_buf(req, copy, size);
        return;
    }
    if (h->writable) {
        /* Read back what this handle holds (O_RDWR). */
        pthread_mutex_lock(&h->lock);
        if (off < 0 || (uint64_t)off >= fs->shard_size) {
            fuse_reply_buf(req, NULL, 0);
        } else {
            if (size > fs->shard_size - (uint64_t)off)
                size = fs->shard_size - (size_t)off;
            fuse_reply_buf(req, (const char *)h->buf + off, size);
        }
        pthread_mutex_unlock(&h->lock);
        return;
    }
    read_shard(req, fs, &h->obj.key, size, off);
}

static void op_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = fh_of(fi);

    if (!h || !h->writable) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (size == 0) {
        fuse_reply_write(req, 0);
        return;
    }
    if (off < 0 || (uint64_t)off >= fs->shard_size) {
        fuse_reply_err(req, EFBIG); /* a shard file never grows */
        return;
    }
    if (size > fs->shard_size - (uint64_t)off)
        size = fs->shard_size - (size_t)off; /* a short write; the rest gets EFBIG */
    pthread_mutex_lock(&h->lock);
    memcpy(h->buf + off, buf, size);
    handle_set_dirty(fs, h, true);
    pthread_mutex_unlock(&h->lock);
    fuse_reply_write(req, size);
}

static void op_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int r = flush_handle(fs_of(req), fh_of(fi));

    fuse_reply_err(req, -r);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
    int r = flush_handle(fs_of(req), fh_of(fi));

    fuse_reply_err(req, -r);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_handle *h = fh_of(fi);

    if (h && h->writable) {
        int r = flush_handle(fs, h);

        if (r < 0) {
            char hex[SFS_BLOCK_HEX_LEN + 1];

            sfs_block_to_hex(&h->obj.key.block, hex);
            fprintf(stderr, "shardfs: storing %s shard %u on release: %s\n", hex, h->obj.key.shard,
                    strerror(-r));
        }
        pthread_mutex_lock(&h->lock);
        writers_add(fs, &h->obj, -1, h->dirty ? -1 : 0);
        pthread_mutex_unlock(&h->lock);
    }
    handle_free(h);
    fuse_reply_err(req, 0);
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    struct stat st;
    int r = resolve(fs, ino, &o);

    if (r < 0)
        goto out_err;
    if (to_set & FUSE_SET_ATTR_SIZE) {
        uint64_t size = (uint64_t)attr->st_size;
        struct fs_handle *h = fi ? fh_of(fi) : NULL;

        if (o.kind != FS_SHARD) {
            r = o.kind == FS_STATS ? -EACCES : -EISDIR;
            goto out_err;
        }
        if (fs->ro) {
            r = -EROFS;
            goto out_err;
        }
        if (attr->st_size < 0 || size > fs->shard_size) {
            r = -EFBIG;
            goto out_err;
        }
        if (h && h->writable) {
            /* The file keeps its size; the cut bytes read as zeros. */
            pthread_mutex_lock(&h->lock);
            memset(h->buf + size, 0, fs->shard_size - size);
            handle_set_dirty(fs, h, true);
            pthread_mutex_unlock(&h->lock);
        } else if (size < fs->shard_size) {
            /* truncate(2) with no handle: rewrite the shard, zero-filled. */
            uint8_t *buf = calloc(1, fs->shard_size);

            if (!buf) {
                r = -ENOMEM;
                goto out_err;
            }
            r = size ? load_copy(fs, &o.key, buf) : 0;
            if (r == 0) {
                memset(buf + size, 0, fs->shard_size - size);
                r = store_shard(fs, &o.key, buf);
            }
            free(buf);
            if (r < 0)
                goto out_err;
        }
    }
    /* Modes, owners and times are fixed; accepted and ignored, so cp -p and
     * touch work. */
    fill_attr(fs, &o, ino, &st);
    fuse_reply_attr(req, &st, o.kind == FS_STATS ? 0.0 : ATTR_TIMEOUT);
    return;
out_err:
    fuse_reply_err(req, -r);
}

/* ---------------------------------------------------------------------------
 * Changing the tree.
 */

/* Drop shard n from the cache and the backend. The posix layout keeps a
 * block as one run of shards, so its remove drops shard n and every later
 * shard; resident copies of shards the backend no longer has are dropped
 * too, so the cache never serves what the store lost. */
/* sfs_cache_remove, waiting out a load in flight (a readahead, say): a
 * Loading slot is leased only until its load completes. A slot a reader or a
 * rank holds Ready stays -EBUSY at once. */
static int cache_remove_settled(struct fs *fs, const struct sfs_key *key)
{
    int64_t deadline = sfs_deadline_after(fs->wait_ns);

    for (;;) {
        int r = sfs_cache_remove(fs->cache, key);

        if (r != -EBUSY || sfs_cache_state(fs->cache, key) != SFS_STATE_LOADING ||
            sfs_now_ns() >= deadline || stopping(fs))
            return r;
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int remove_shard(struct fs *fs, const struct sfs_key *key)
{
    struct fs_obj o = make_obj(FS_SHARD, &key->block, key->shard);
    struct block_scan s = {.block = key->block};
    bool in_cache, in_backend = false;
    int r;

    if (has_writers(fs, &o))
        return -EBUSY;
    r = cache_remove_settled(fs, key);
    if (r == -EBUSY)
        return -EBUSY;
    in_cache = r == 0;
    r = sfs_backend_remove(fs->be, key);
    if (r == 0)
        in_backend = true;
    else if (r != -ENOENT)
        return r;
    if (!in_cache && !in_backend)
        return -ENOENT;
    /* Later shards the backend dropped with it. */
    sfs_cache_foreach(fs->cache, ~0u, scan_block_cb, &s);
    for (size_t i = 0; i < s.n; i++) {
        struct sfs_key k = {.block = key->block, .shard = s.idx[i]};
        bool present = true;

        if (k.shard <= key->shard)
            continue;
        if (sfs_backend_exists(fs->be, &k, 1, &present) == 0 && !present)
            cache_remove_settled(fs, &k);
    }
    free(s.idx);
    return 0;
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    int r = resolve(fs, parent, &p);

    if (r == 0)
        r = child_obj(fs, &p, name, false, &o);
    if (r == 0 && o.kind != FS_SHARD)
        r = o.kind == FS_STATS ? -EACCES : -EISDIR;
    if (r == 0 && fs->ro)
        r = -EROFS;
    if (r == 0)
        r = remove_shard(fs, &o.key);
    fuse_reply_err(req, -r);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    int r = resolve(fs, parent, &p);

    if (r == 0)
        r = child_obj(fs, &p, name, false, &o);
    if (r == 0 && fs->ro)
        r = -EROFS;
    /* Every well-formed block directory (and its shard directory) exists. */
    if (r == 0)
        r = (o.kind == FS_BLOCK || o.kind == FS_SHARDDIR) ? -EEXIST : -ENOENT;
    fuse_reply_err(req, -r);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    uint32_t *idx = NULL;
    size_t n = 0;
    int r = resolve(fs, parent, &p);

    if (r == 0)
        r = child_obj(fs, &p, name, false, &o);
    if (r == 0 && o.kind != FS_BLOCK && o.kind != FS_SHARDDIR)
        r = o.kind == FS_BLOCKS ? -EBUSY : -ENOTDIR;
    if (r == 0 && fs->ro)
        r = -EROFS;
    /* A virtual directory: "removing" an empty one succeeds (so rm -r
     * works); one with shards is not empty. */
    if (r == 0)
        r = block_shards(fs, &o.key.block, &idx, &n);
    if (r == 0 && n > 0)
        r = -ENOTEMPTY;
    free(idx);
    fuse_reply_err(req, -r);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags)
{
    /* Names are keys: a shard cannot move. Not EXDEV: mv would copy and
     * unlink, and unlinking shard n drops the later shards of its block
     * (the copy among them, when it lands in the same block). */
    fuse_reply_err(req, fs_of(req)->ro ? EROFS : EPERM);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    fuse_reply_err(req, EPERM);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    fuse_reply_err(req, EPERM);
}

/* ---------------------------------------------------------------------------
 * Directories: a snapshot taken at opendir, served by offset.
 */

struct dir_ent {
    char name[SFS_BLOCK_HEX_LEN + 1];
    bool dir;
};

struct dir_handle {
    struct dir_ent *ents;
    size_t n, cap;
};

static int dir_add(struct dir_handle *d, const char *name, bool dir)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        struct dir_ent *p = realloc(d->ents, cap * sizeof(*p));

        if (!p)
            return -ENOMEM;
        d->ents = p;
        d->cap = cap;
    }
    snprintf(d->ents[d->n].name, sizeof(d->ents[d->n].name), "%s", name);
    d->ents[d->n].dir = dir;
    d->n++;
    return 0;
}

struct block_set {
    struct sfs_block_id *ids;
    size_t n, cap;
    int err;
};

static int block_set_cb(const struct sfs_key *key, int state, void *arg)
{
    struct block_set *s = arg;

    /* Shards of one block often sit together: skip an immediate repeat. */
    if (s->n && memcmp(&s->ids[s->n - 1], &key->block, sizeof(key->block)) == 0)
        return 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        struct sfs_block_id *p = realloc(s->ids, cap * sizeof(*p));

        if (!p) {
            s->err = -ENOMEM;
            return 1;
        }
        s->ids = p;
        s->cap = cap;
    }
    s->ids[s->n++] = key->block;
    return 0;
}

static int cmp_block(const void *a, const void *b)
{
    return memcmp(a, b, sizeof(struct sfs_block_id));
}

/* /block: the blocks with a Ready or Loading shard in the cache. Bounded by
 * the cache, never by the store (which may hold millions of blocks). */
static int list_resident_blocks(struct fs *fs, struct dir_handle *d)
{
    struct block_set s = {0};
    int r = 0;

    sfs_cache_foreach(fs->cache, (1u << SFS_STATE_READY) | (1u << SFS_STATE_LOADING), block_set_cb,
                      &s);
    if (s.err) {
        free(s.ids);
        return s.err;
    }
    if (s.n)
        qsort(s.ids, s.n, sizeof(*s.ids), cmp_block);
    for (size_t i = 0; i < s.n && r == 0; i++) {
        char hex[SFS_BLOCK_HEX_LEN + 1];

        if (i && memcmp(&s.ids[i - 1], &s.ids[i], sizeof(s.ids[i])) == 0)
            continue;
        sfs_block_to_hex(&s.ids[i], hex);
        r = dir_add(d, hex, true);
    }
    free(s.ids);
    return r;
}

static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct dir_handle *d = calloc(1, sizeof(*d));
    struct fs_obj o;
    int r = d ? resolve(fs, ino, &o) : -ENOMEM;

    if (r < 0)
        goto out_err;
    r = dir_add(d, ".", true);
    if (r == 0)
        r = dir_add(d, "..", true);
    switch (r ? -1 : o.kind) {
    case -1:
        break;
    case FS_ROOT:
        r = dir_add(d, "block", true);
        if (r == 0)
            r = dir_add(d, "stats", false);
        break;
    case FS_BLOCKS:
        r = list_resident_blocks(fs, d);
        break;
    case FS_BLOCK:
        r = dir_add(d, "shard", true);
        break;
    case FS_SHARDDIR: {
        uint32_t *idx = NULL;
        size_t n = 0;

        r = block_shards(fs, &o.key.block, &idx, &n);
        for (size_t i = 0; i < n && r == 0; i++) {
            char name[16];

            snprintf(name, sizeof(name), "%" PRIu32, idx[i]);
            r = dir_add(d, name, false);
        }
        free(idx);
        break;
    }
    default:
        r = -ENOTDIR;
    }
    if (r < 0)
        goto out_err;
    fi->fh = (uintptr_t)d;
    fi->cache_readdir = 0;
    if (fuse_reply_open(req, fi) != 0)
        goto out_free;
    return;
out_err:
    fuse_reply_err(req, -r);
out_free:
    if (d)
        free(d->ents);
    free(d);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;
    char *buf;
    size_t pos = 0;

    if (!d) {
        fuse_reply_err(req, EBADF);
        return;
    }
    if (off < 0 || (size_t)off >= d->n) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    buf = malloc(size);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    for (size_t i = (size_t)off; i < d->n; i++) {
        struct stat st = {.st_ino = UNKNOWN_INO, .st_mode = d->ents[i].dir ? S_IFDIR : S_IFREG};
        size_t need =
            fuse_add_direntry(req, buf + pos, size - pos, d->ents[i].name, &st, (off_t)(i + 1));

        if (need > size - pos)
            break;
        pos += need;
    }
    fuse_reply_buf(req, buf, pos);
    free(buf);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;

    if (d)
        free(d->ents);
    free(d);
    fuse_reply_err(req, 0);
}

/* ---------------------------------------------------------------------------
 * Extended attributes.
 */

static bool value_is_one(const char *v, size_t n)
{
    return (n == 1 && v[0] == '1') || (n == 2 && v[0] == '1' && v[1] == '\n');
}

/* user.shardfs.prefetch: start background loads of every shard of block the
 * backend has and the cache lacks. Returns how many loads started. */
static int prefetch_block(struct fs *fs, const struct sfs_block_id *block)
{
    int started = prefetch_shards(fs, block, 0, UINT32_MAX, false);

    CTR_ADD(fs, prefetch_accepted, (uint64_t)started);
    return started;
}

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value,
                        size_t size, int flags)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    int r = resolve(fs, ino, &o);

    if (r < 0)
        goto out;
    if (o.kind == FS_BLOCK && strcmp(name, XATTR_TOUCH) == 0) {
        r = value_is_one(value, size) ? sfs_cache_touch(fs->cache, &o.key.block, 1) : -EINVAL;
        r = r < 0 ? r : 0;
    } else if (o.kind == FS_BLOCK && strcmp(name, XATTR_PREFETCH) == 0) {
        r = value_is_one(value, size) ? 0 : -EINVAL;
        if (r == 0)
            prefetch_block(fs, &o.key.block);
    } else if (o.kind == FS_ROOT && strcmp(name, XATTR_FAULT) == 0) {
        char opts[256];

        if (size >= sizeof(opts)) {
            r = -EINVAL;
            goto out;
        }
        memcpy(opts, value, size);
        opts[size] = '\0';
        if (size && opts[size - 1] == '\n')
            opts[size - 1] = '\0';
        if (strcmp(opts, "off") == 0 || strcmp(opts, "none") == 0)
            opts[0] = '\0';
        r = sfs_fault_set(fs->be, opts); /* -EINVAL: not a fault backend, or bad opts */
    } else {
        r = -ENOTSUP;
    }
out:
    fuse_reply_err(req, -r);
}

static void reply_xattr_value(fuse_req_t req, const char *v, size_t size)
{
    size_t len = strlen(v);

    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, v, len);
}

static const char *state_word(int st)
{
    switch (st) {
    case SFS_STATE_IDLE:
        return "idle";
    case SFS_STATE_LOADING:
        return "loading";
    case SFS_STATE_READY:
        return "ready";
    case SFS_STATE_FAILED:
        return "failed";
    default:
        return "absent"; /* -ENOENT, or Free */
    }
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    int r = resolve(fs, ino, &o);

    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    if (o.kind == FS_SHARD && strcmp(name, XATTR_STATE) == 0)
        reply_xattr_value(req, state_word(sfs_cache_state(fs->cache, &o.key)), size);
    else if (o.kind == FS_ROOT && strcmp(name, XATTR_SOCKET) == 0)
        reply_xattr_value(req, fs->socket_path, size);
    else
        fuse_reply_err(req, ENODATA);
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    struct fs *fs = fs_of(req);
    struct fs_obj o;
    const char *names = "";
    size_t len = 0;
    int r = resolve(fs, ino, &o);

    if (r < 0) {
        fuse_reply_err(req, -r);
        return;
    }
    /* Only the names a get answers (the set-only ones would make getfattr -d
     * fail); each NUL-terminated. */
    if (o.kind == FS_SHARD) {
        names = XATTR_STATE;
        len = sizeof(XATTR_STATE);
    } else if (o.kind == FS_ROOT) {
        names = XATTR_SOCKET;
        len = sizeof(XATTR_SOCKET);
    }
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (size < len)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, names, len);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
    bool ours = strcmp(name, XATTR_TOUCH) == 0 || strcmp(name, XATTR_PREFETCH) == 0 ||
                strcmp(name, XATTR_STATE) == 0 || strcmp(name, XATTR_SOCKET) == 0;

    fuse_reply_err(req, ours ? ENOTSUP : ENODATA);
}

/* ---------------------------------------------------------------------------
 * The session.
 */

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
    struct fs *fs = fs_of(req);
    struct sfs_stats s;
    struct statvfs v;

    sfs_cache_stats(fs->cache, &s);
    memset(&v, 0, sizeof(v));
    v.f_bsize = 4096;
    v.f_frsize = 4096;
    v.f_blocks = s.capacity_bytes / 4096;
    v.f_bfree = v.f_bavail =
        s.capacity_bytes > s.resident_bytes ? (s.capacity_bytes - s.resident_bytes) / 4096 : 0;
    v.f_files = s.capacity_bytes / fs->shard_size;
    v.f_ffree = v.f_favail = v.f_bfree * 4096 / fs->shard_size;
    v.f_namemax = 255;
    fuse_reply_statfs(req, &v);
}

static void op_init(void *userdata, struct fuse_conn_info *conn)
{
    struct fs *fs = userdata;

    /* 1 MiB requests: max_write sizes the kernel's max_pages (256), which
     * also caps reads under direct_io; -o max_read needs conn->max_read. */
    conn->max_write = 1u << 20;
    conn->max_read = fs->max_read;
    if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC)
        conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
    /* splice from hugetlb memfds fails: replies are plain buffers. */
    conn->want &= ~(unsigned)(FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

const struct fuse_lowlevel_ops fs_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .symlink = op_symlink,
    .rename = op_rename,
    .link = op_link,
    .open = op_open,
    .create = op_create,
    .read = op_read,
    .write = op_write,
    .flush = op_flush,
    .release = op_release,
    .fsync = op_fsync,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .statfs = op_statfs,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .removexattr = op_removexattr,
};

/* ---------------------------------------------------------------------------
 * /stats
 */

struct textbuf {
    char *p;
    size_t len, cap;
};

static void emit(struct textbuf *t, const char *name, const char *type, const char *help,
                 uint64_t v)
{
    int n =
        snprintf(t->p + (t->len < t->cap ? t->len : t->cap), t->len < t->cap ? t->cap - t->len : 0,
                 "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, v);

    if (n > 0)
        t->len += (size_t)n;
}

size_t fs_stats_text(struct fs *fs, char *buf, size_t len)
{
    struct textbuf t = {.p = buf, .cap = len};
    struct sfs_stats s;
    struct sfs_cache_info ci;

    if (len)
        buf[0] = '\0';
    sfs_cache_stats(fs->cache, &s);
    sfs_cache_info(fs->cache, &ci);
#define C(name, help, v) emit(&t, "shardfs_" name, "counter", help, (uint64_t)(v))
#define G(name, help, v) emit(&t, "shardfs_" name, "gauge", help, (uint64_t)(v))
#define L(f)             atomic_load_explicit(&fs->ctr.f, memory_order_relaxed)
    C("requests_total",
      "Cache lookups, from the mount and every attached rank (prefetches are loads, not lookups).",
      s.requests);
    C("hits_total", "Gets that found the shard Ready.", s.hits);
    C("misses_total", "Gets that did not (owner or waiter).", s.misses);
    C("prefetched_total", "Slots filled by prefetch.", s.prefetched);
    C("prefetch_hits_total", "Gets served by a prefetched slot.", s.prefetch_hits);
    C("bytes_read_total", "Bytes loaded from the backend into the cache.", s.bytes_read);
    G("resident_bytes", "Bytes of Ready shards in the cache.", s.resident_bytes);
    G("capacity_bytes", "Bytes of the data plane.", s.capacity_bytes);
    C("backend_loads_total", "Shard loads this daemon submitted to its backend.", L(backend_loads));
    C("evictions_total", "Slots with a key taken by the CLOCK hand.", s.evictions);
    C("owner_loads_total", "Gets that made the caller owner (mount and ranks).", s.owner_loads);
    C("waits_total", "Gets that made the caller a waiter.", s.waits);
    C("failures_total", "Owners that published Failed.", s.failures);
    C("backend_errors_total", "Backend loads and dumps of this daemon that failed.",
      L(backend_errors));
    C("takeovers_total", "Ownership taken from a dead owner or an Idle slot.", s.takeovers);
    C("prealloc_total", "Idle slots placed by Prealloc.", s.prealloc);
    C("touched_total", "Slots marked by Touch.", s.touched);
    C("reaped_total", "Dead processes reaped.", s.reaped);
    C("fs_reads_total", "Read requests on shard files.", L(reads));
    C("fs_read_bytes_total", "Bytes answered to reads of shard files.", L(read_bytes));
    C("fs_writes_total", "Shards stored through the mount.", L(writes));
    C("fs_wait_timeouts_total", "Reads that gave up at their deadline.", L(wait_timeouts));
    C("fs_prefetch_started_total", "Loads started by user.shardfs.prefetch.", L(prefetch_accepted));
    C("fs_readahead_started_total", "Loads started by readahead after a read.",
      L(readahead_started));
    G("shard_size_bytes", "Bytes per shard.", ci.shard_size);
    G("slots", "Slots in the cache.", ci.nslots);
#undef C
#undef G
#undef L
    return t.len;
}
