/* SPDX-License-Identifier: MIT */
/*
 * names.c - the names of the tree and the inode table.
 *
 * Every name of the tree is a pure function of (kind, block id, shard index):
 * the parsers here decide which names exist at all (a block is exactly 32
 * lowercase hex characters, a shard a canonical decimal below 2^32). The inode
 * table maps those triples to numbers the kernel holds: two chained hashes (by
 * number, by object) over one set of nodes, grown by doubling, with a lookup
 * count per node and the write handles open on it, so a node lives while the
 * kernel or a writer refers to it and a number is never reused. Everything here
 * is under fs->lock.
 */
#include "fs_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

uint64_t fs_obj_hash(const struct fs_obj *o)
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
struct fs_obj fs_make_obj(int kind, const struct sfs_block_id *block, uint32_t shard)
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

void fs_table_destroy(struct fs *fs)
{
    for (size_t i = 0; fs->by_ino && i < fs->nbuckets; i++) {
        struct fs_node *n = fs->by_ino[i];

        while (n) {
            struct fs_node *next = n->next_ino;

            free(n->snap);
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
    for (struct fs_node *n = fs->by_obj[fs_obj_hash(o) & (fs->nbuckets - 1)]; n; n = n->next_obj)
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
            size_t hi = mix64(n->ino) & (nb - 1), ho = fs_obj_hash(&n->obj) & (nb - 1);

            n->next_ino = bi[hi];
            bi[hi] = n;
            if (!n->retired) { /* a retired node is off the name's chain for good */
                n->next_obj = bo[ho];
                bo[ho] = n;
            }
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
    ho = fs_obj_hash(o) & (fs->nbuckets - 1);
    n->next_ino = fs->by_ino[hi];
    fs->by_ino[hi] = n;
    n->next_obj = fs->by_obj[ho];
    fs->by_obj[ho] = n;
    fs->nnodes++;
    return n;
}

/* Under fs->lock: take n off the list of pinned nodes. */
static void pin_unlink(struct fs *fs, struct fs_node *n)
{
    if (n->pin_prev)
        n->pin_prev->pin_next = n->pin_next;
    else
        fs->pin_head = n->pin_next;
    if (n->pin_next)
        n->pin_next->pin_prev = n->pin_prev;
    else
        fs->pin_tail = n->pin_prev;
    n->pin_prev = n->pin_next = NULL;
    n->pinned = false;
    fs->npins--;
}

/* Under fs->lock: drop n when nothing refers to it any more. */
static void node_maybe_free(struct fs *fs, struct fs_node *n)
{
    struct fs_node **pp;

    if (n->nlookup > 0 || n->nwriters > 0 || n->nreaders > 0)
        return;
    if (n->snap) {
        fs->snap_bytes -= n->snap->len;
        if (--n->snap->refs == 0)
            free(n->snap);
    }
    if (n->pinned) {
        /* The kernel forgot the inode, and its pages went with it. */
        pin_unlink(fs, n);
        sfs_cache_release(fs->cache, &n->pin);
    }
    for (pp = &fs->by_ino[mix64(n->ino) & (fs->nbuckets - 1)]; *pp; pp = &(*pp)->next_ino)
        if (*pp == n) {
            *pp = n->next_ino;
            break;
        }
    for (pp = &fs->by_obj[fs_obj_hash(&n->obj) & (fs->nbuckets - 1)]; *pp; pp = &(*pp)->next_obj)
        if (*pp == n) {
            *pp = n->next_obj;
            break;
        }
    fs->nnodes--;
    free(n);
}

/* What an inode number names; -ESTALE for a number the table does not hold. */
int fs_resolve(struct fs *fs, fuse_ino_t ino, struct fs_obj *out)
{
    struct fs_node *n;

    switch (ino) {
    case FS_INO_ROOT:
        *out = fs_make_obj(FS_ROOT, NULL, 0);
        return 0;
    case FS_INO_BLOCKS:
        *out = fs_make_obj(FS_BLOCKS, NULL, 0);
        return 0;
    case FS_INO_STATS:
        *out = fs_make_obj(FS_STATS, NULL, 0);
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
fuse_ino_t fs_obj_ref(struct fs *fs, const struct fs_obj *o, bool writer)
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
void fs_writers_add(struct fs *fs, const struct fs_obj *o, int delta, int dirty)
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
bool fs_has_writers(struct fs *fs, const struct fs_obj *o)
{
    struct fs_node *n;
    bool w;

    pthread_mutex_lock(&fs->lock);
    n = node_by_obj(fs, o);
    w = n && n->ndirty > 0;
    pthread_mutex_unlock(&fs->lock);
    return w;
}

bool fs_has_write_handles(struct fs *fs, const struct fs_obj *o)
{
    struct fs_node *n;
    bool w;

    pthread_mutex_lock(&fs->lock);
    n = node_by_obj(fs, o);
    w = n && n->nwriters > 0;
    pthread_mutex_unlock(&fs->lock);
    return w;
}

void fs_forget_one(struct fs *fs, fuse_ino_t ino, uint64_t nlookup)
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
 * or Loading, or when the backend has it. 1 or 0; -ETIMEDOUT when the
 * backend did not answer by its deadline (a hung store); other backend
 * errors read as absent. */
int fs_shard_present(struct fs *fs, const struct sfs_key *key)
{
    struct fs_obj o = fs_make_obj(FS_SHARD, &key->block, key->shard);
    bool present = false;
    int st, r;

    if (fs_has_writers(fs, &o))
        return 1;
    st = sfs_cache_state(fs->cache, key);
    if (st == SFS_STATE_READY || st == SFS_STATE_LOADING)
        return 1;
    r = sfs_backend_exists(fs->be, key, 1, &present);
    if (r == -ETIMEDOUT)
        return r;
    return r == 0 && present;
}

bool fs_shard_exists(struct fs *fs, const struct sfs_key *key)
{
    return fs_shard_present(fs, key) > 0;
}

/* ---------------------------------------------------------------------------
 * Page-cache pins (-o page_cache; pagecache.c says why).
 */

bool fs_pin_keep(struct fs *fs, fuse_ino_t ino, const struct sfs_key *key,
                 const struct sfs_lease *l)
{
    struct fs_obj o = fs_make_obj(FS_SHARD, &key->block, key->shard);
    struct fs_node *n;
    bool kept = false;

    pthread_mutex_lock(&fs->lock);
    n = ino ? node_by_ino(fs, ino) : node_by_obj(fs, &o);
    /* No node: the kernel holds no inode, so no page of it either. A
     * retired one is read from its snapshot, never from the slot. */
    if (n && !n->pinned && !n->retired) {
        n->pinned = true;
        n->pin = *l;
        n->pin_prev = fs->pin_tail;
        n->pin_next = NULL;
        if (fs->pin_tail)
            fs->pin_tail->pin_next = n;
        else
            fs->pin_head = n;
        fs->pin_tail = n;
        if (fs->npins++ == 0 || fs->npins > fs->pc_max)
            pthread_cond_signal(&fs->pcw.cond);
        kept = true;
    }
    pthread_mutex_unlock(&fs->lock);
    return kept;
}

int fs_pin_take(struct fs *fs, const struct sfs_key *key, struct fs_pinned *out)
{
    struct fs_obj o = fs_make_obj(FS_SHARD, &key->block, key->shard);
    struct fs_node *n;
    int r = 0;

    pthread_mutex_lock(&fs->lock);
    n = node_by_obj(fs, &o);
    if (n && n->pinned) {
        out->ino = n->ino;
        out->lease = n->pin;
        out->readers = n->nreaders > 0;
        out->changed = true;
        pin_unlink(fs, n);
        r = 1;
    }
    pthread_mutex_unlock(&fs->lock);
    return r;
}

/* Bound: one pass over the pinned nodes (at most pc_max plus the pins taken
 * since the last pass), at most max taken. */
size_t fs_pins_collect_locked(struct fs *fs, struct fs_pinned *out, size_t max)
{
    struct fs_node *n = fs->pin_head, *next;
    size_t k = 0;

    for (; n && k < max; n = next) {
        bool wanted = sfs_cache_write_wanted(fs->cache, &n->pin);

        next = n->pin_next;
        /* Beyond the budget, not a pin of an inode with files open: a
         * read(2) of one may be half served from its pages, and without
         * the pin the key could change before the rest is fetched. */
        if (wanted || (fs->npins > fs->pc_max && n->nreaders == 0)) {
            out[k].ino = n->ino;
            out[k].lease = n->pin;
            out[k].readers = n->nreaders > 0;
            out[k].changed = wanted;
            pin_unlink(fs, n);
            k++;
        }
    }
    return k;
}

/* ---------------------------------------------------------------------------
 * Versions (-o page_cache; pagecache.c says why): a node with files open
 * through the page cache keeps the version they read; a change retires it.
 */

int fs_reader_open(struct fs *fs, fuse_ino_t ino)
{
    struct fs_node *n;
    int r = -ESTALE;

    pthread_mutex_lock(&fs->lock);
    n = node_by_ino(fs, ino);
    if (n && !n->retired) {
        n->nreaders++;
        r = 0;
    }
    pthread_mutex_unlock(&fs->lock);
    return r;
}

bool fs_reader_close(struct fs *fs, fuse_ino_t ino)
{
    struct fs_node *n;
    bool last = false;

    pthread_mutex_lock(&fs->lock);
    n = node_by_ino(fs, ino);
    if (n && n->nreaders > 0) {
        last = --n->nreaders == 0 && n->retired;
        if (last && n->snap) {
            fs->snap_bytes -= n->snap->len;
            if (--n->snap->refs == 0) /* else a read's reply still uses it */
                free(n->snap);
            n->snap = NULL;
        }
        node_maybe_free(fs, n);
    }
    pthread_mutex_unlock(&fs->lock);
    return last;
}

int fs_node_retired(struct fs *fs, fuse_ino_t ino, struct fs_snap **snap)
{
    struct fs_node *n;
    int r = 0;

    pthread_mutex_lock(&fs->lock);
    n = node_by_ino(fs, ino);
    if (n && n->retired) {
        if (snap) {
            *snap = n->snap;
            if (n->snap)
                n->snap->refs++;
        }
        r = 1;
    }
    pthread_mutex_unlock(&fs->lock);
    return r;
}

void fs_snap_put(struct fs *fs, struct fs_snap *snap)
{
    bool last;

    if (!snap)
        return;
    pthread_mutex_lock(&fs->lock);
    last = --snap->refs == 0;
    pthread_mutex_unlock(&fs->lock);
    if (last)
        free(snap);
}

void fs_node_retire(struct fs *fs, fuse_ino_t ino, struct fs_snap **snap)
{
    struct fs_node *n, **pp;

    pthread_mutex_lock(&fs->lock);
    n = node_by_ino(fs, ino);
    if (!n || n->retired || n->nreaders == 0) {
        /* Forgotten, or its files closed meanwhile: nothing keeps the old
         * version. Its pages go with the inode (or are invalidated). */
        free(*snap);
        *snap = NULL;
        pthread_mutex_unlock(&fs->lock);
        return;
    }
    if (*snap && fs->snap_bytes + (*snap)->len > (uint64_t)fs->pc_max * fs->shard_size) {
        free(*snap); /* past the budget: its files fail ESTALE */
        *snap = NULL;
    }
    n->retired = true;
    n->snap = *snap;
    fs->snap_bytes += *snap ? (*snap)->len : 0;
    for (pp = &fs->by_obj[fs_obj_hash(&n->obj) & (fs->nbuckets - 1)]; *pp; pp = &(*pp)->next_obj)
        if (*pp == n) {
            *pp = n->next_obj;
            break;
        }
    n->next_obj = NULL;
    /* The write handles are counted per name, not per version: the name's
     * new node carries them (a lookup makes it when none is needed now). */
    if (n->nwriters || n->ndirty) {
        struct fs_node *m = node_get(fs, &n->obj);

        if (m) {
            m->nwriters = n->nwriters;
            m->ndirty = n->ndirty;
            n->nwriters = n->ndirty = 0;
        }
    }
    pthread_mutex_unlock(&fs->lock);
}
