/* SPDX-License-Identifier: MIT */
/*
 * dir.c - changing the tree, and listing directories.
 *
 * unlink drops a shard from the cache and the backend (the posix layout drops
 * every later shard of the block with it, and so does the cache); mkdir and
 * rmdir answer for directories that exist by name alone; rename, link and
 * symlink are EPERM (names are keys). A directory handle is a snapshot taken
 * at opendir and served by offset: /block lists the blocks resident in the
 * cache (bounded by the cache, never by the store), a shard directory the
 * backend's shards plus the resident ones, its names generated per readdir
 * (its memory bounded by the cache, never by the block).
 */
#include "fs_i.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define UNKNOWN_INO 0xffffffffu /* readdir: the kernel looks the name up */

/* ---------------------------------------------------------------------------
 * What a shard directory lists.
 */

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

/* What a shard directory lists: 0..count-1 from the backend less the
 * runs of shards it says are holes (a block file that lost the shards
 * before one written alone: docs/layout.md), then the resident (Ready or
 * Loading) shards in those runs or at or past count, sorted and unique.
 * Only the resident ones are kept (extra, malloc'd): at most the cache's
 * slots, never the block's size; the holes as runs (gaps), at most
 * MAX_LISTED_GAPS of them (a listing stops at the run past them). The
 * backend part stops at MAX_LISTED_SHARDS (every shard stays reachable by
 * name; docs/fs.md). */
#define MAX_LISTED_SHARDS (1u << 20)
#define MAX_LISTED_GAPS   (1u << 16)
#define GAP_PROBE         1024u /* keys asked of the backend at once */

struct listing {
    uint32_t count;  /* the backend's shards: 0..count-1 */
    uint32_t *gaps;  /* [start, end) pairs of absent shards below count, in order */
    size_t ngaps;    /* pairs */
    uint32_t holes;  /* shards in the gaps */
    uint32_t *extra; /* resident shards in a gap or at or past count */
    size_t nextra;
};

static void listing_free(struct listing *l)
{
    free(l->gaps);
    free(l->extra);
}

/* The runs of shards below l->count that the backend's block file holds as
 * holes (asked only when its stamp says it has holes). */
static int listing_gaps(struct fs *fs, const struct sfs_block_id *block, struct listing *l)
{
    struct sfs_key *k = malloc(GAP_PROBE * sizeof(*k));
    bool *present = malloc(GAP_PROBE * sizeof(*present));
    size_t cap = 0;
    int r = k && present ? 0 : -ENOMEM;

    for (uint32_t first = 0; r == 0 && first < l->count; first += GAP_PROBE) {
        uint32_t n = l->count - first < GAP_PROBE ? l->count - first : GAP_PROBE;

        for (uint32_t i = 0; i < n; i++)
            k[i] = (struct sfs_key){.block = *block, .shard = first + i};
        r = sfs_backend_exists(fs->be, k, n, present);
        for (uint32_t i = 0; r == 0 && i < n; i++) {
            uint32_t sh = first + i;

            if (present[i])
                continue;
            if (l->ngaps && l->gaps[2 * l->ngaps - 1] == sh) {
                l->gaps[2 * l->ngaps - 1]++;
            } else if (l->ngaps == MAX_LISTED_GAPS) {
                l->count = sh; /* the listing stops here */
                break;
            } else {
                if (l->ngaps == cap) {
                    size_t c = cap ? cap * 2 : 16;
                    uint32_t *g = realloc(l->gaps, 2 * c * sizeof(*g));

                    if (!g) {
                        r = -ENOMEM;
                        break;
                    }
                    l->gaps = g;
                    cap = c;
                }
                l->gaps[2 * l->ngaps] = sh;
                l->gaps[2 * l->ngaps + 1] = sh + 1;
                l->ngaps++;
            }
            l->holes++;
        }
    }
    free(k);
    free(present);
    return r;
}

static bool in_gap(const struct listing *l, uint32_t sh)
{
    for (size_t g = 0; g < l->ngaps && l->gaps[2 * g] <= sh; g++)
        if (sh < l->gaps[2 * g + 1])
            return true;
    return false;
}

static int block_listing(struct fs *fs, const struct sfs_block_id *block, struct listing *l)
{
    struct block_scan s = {.block = *block};
    struct sfs_block_stamp st;
    int count = sfs_backend_shard_count(fs->be, block), r = 0;
    size_t u = 0;

    memset(l, 0, sizeof(*l));
    if (count < 0)
        count = 0;
    if ((uint32_t)count > MAX_LISTED_SHARDS)
        count = (int)MAX_LISTED_SHARDS;
    l->count = (uint32_t)count;
    if (count > 0 && sfs_backend_stamp(fs->be, block, &st) == 0 && (st.flags & SFS_STAMP_HOLES))
        r = listing_gaps(fs, block, l);
    if (r == 0)
        sfs_cache_foreach(fs->cache, (1u << SFS_STATE_READY) | (1u << SFS_STATE_LOADING),
                          scan_block_cb, &s);
    if (r == 0 && s.err)
        r = s.err;
    if (r < 0) {
        free(s.idx);
        listing_free(l);
        return r;
    }
    if (s.n)
        qsort(s.idx, s.n, sizeof(*s.idx), cmp_u32);
    for (size_t i = 0; i < s.n; i++)
        if ((s.idx[i] >= l->count || in_gap(l, s.idx[i])) && (u == 0 || s.idx[u - 1] != s.idx[i]))
            s.idx[u++] = s.idx[i];
    l->extra = s.idx;
    l->nextra = u;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Changing the tree.
 */

/*
 * Take key's slot as its writer (SFS_GET_WRITE, the per-key writer lock a
 * store and a rank's dump take) for a remove: while it is held, a reader of
 * the key (through the mount or a rank) waits on the slot instead of loading
 * the key from the backend; one that loaded it during the remove would
 * publish the removed bytes after it, and the cache would serve what the
 * store lost. A load in flight (a readahead, say) is waited out: it is
 * leased only until it completes (bounded by the mount's wait_timeout). A
 * Ready slot gets a short grace, REMOVE_GRACE_NS: a reader's lease outlives
 * its reply by a moment (the worker releases it once fuse_reply_buf
 * returns, and the reader wakes inside that call), so `cat shard; rm shard`
 * must not see its own read's lease. A lease held longer than that (a
 * rank's, an open reader's next read) is -EBUSY. No slot to be had until
 * wait_timeout (every slot leased) is -EAGAIN, as for a store: a remove
 * never goes around the cache either. Returns 0 (*l is the owner's lease)
 * or -errno.
 */
#define REMOVE_GRACE_NS (200 * 1000 * 1000ll)

static int take_try(struct fs *fs, const struct sfs_key *key, void *arg)
{
    struct fs_take *t = arg;
    int r;

    /* Our page-cache pin, each try (a reader may have pinned it anew): the
     * files open on it fail ESTALE from now on, never read the old bytes. */
    fs_pin_drop(fs, key, true);
    r = sfs_cache_get(fs->cache, key, SFS_GET_WRITE, t->deadline, t->lease);

    if (r == SFS_OWNER)
        return 0;
    if (r >= 0) {
        sfs_cache_release(fs->cache, t->lease); /* not ours to write: try again */
        r = -EBUSY;
    }
    return r == -ENOSPC || r == -ENOBUFS ? -EAGAIN : r;
}

static int take_for_remove(struct fs *fs, const struct sfs_key *key, struct sfs_lease *l)
{
    struct fs_take t = {l, sfs_deadline_after(fs->wait_ns)};

    return fs_retry_busy(fs, key, t.deadline, sfs_deadline_after(REMOVE_GRACE_NS), take_try, &t);
}

/* sfs_cache_remove of a later shard the backend dropped, waiting out a load
 * in flight and a reader's lease as take_for_remove does. */
static int remove_try(struct fs *fs, const struct sfs_key *key, void *arg)
{
    (void)arg;
    /* Our page-cache pin (its pages invalidated first), each try: a reader
     * may have pinned it anew. */
    fs_pin_drop(fs, key, true);
    return sfs_cache_remove(fs->cache, key);
}

static int cache_remove_settled(struct fs *fs, const struct sfs_key *key)
{
    return fs_retry_busy(fs, key, sfs_deadline_after(fs->wait_ns),
                         sfs_deadline_after(REMOVE_GRACE_NS), remove_try, NULL);
}

/* Drop shard n from the cache and the backend. The posix layout keeps a
 * block as one run of shards, so its remove drops shard n and every later
 * shard; resident copies of shards the backend no longer has are dropped
 * too, so the cache never serves what the store lost. */
static int remove_shard(struct fs *fs, const struct sfs_key *key)
{
    struct fs_obj o = fs_make_obj(FS_SHARD, &key->block, key->shard);
    struct block_scan s = {.block = key->block};
    struct sfs_lease l;
    bool in_cache, in_backend = false;
    int r;

    if (fs_has_writers(fs, &o))
        return -EBUSY;
    in_cache = sfs_cache_state(fs->cache, key) >= 0;
    r = take_for_remove(fs, key, &l);
    if (r < 0)
        return r;
    r = sfs_backend_remove(fs->be, key);
    /* Readers that came meanwhile get the outcome (-ENOENT once removed);
     * then the slot is freed, unless one of them still holds it: a Failed
     * slot serves nothing, and the next Get loads what the store has. */
    sfs_cache_fail(fs->cache, &l, r == 0 ? -ENOENT : r);
    sfs_cache_release(fs->cache, &l);
    sfs_cache_remove(fs->cache, key);
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

void fs_op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    int r = fs_resolve(fs, parent, &p);

    if (r == 0)
        r = fs_child_obj(fs, &p, name, false, &o);
    if (r == 0 && o.kind != FS_SHARD)
        r = o.kind == FS_STATS ? -EACCES : -EISDIR;
    if (r == 0 && fs->ro)
        r = -EROFS;
    if (r == 0)
        r = remove_shard(fs, &o.key);
    fuse_reply_err(req, -r);
}

void fs_op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    int r = fs_resolve(fs, parent, &p);

    if (r == 0)
        r = fs_child_obj(fs, &p, name, false, &o);
    if (r == 0 && fs->ro)
        r = -EROFS;
    /* Every well-formed block directory (and its shard directory) exists. */
    if (r == 0)
        r = (o.kind == FS_BLOCK || o.kind == FS_SHARDDIR) ? -EEXIST : -ENOENT;
    fuse_reply_err(req, -r);
}

void fs_op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fs *fs = fs_of(req);
    struct fs_obj p, o;
    struct listing l = {0};
    int r = fs_resolve(fs, parent, &p);

    if (r == 0)
        r = fs_child_obj(fs, &p, name, false, &o);
    if (r == 0 && o.kind != FS_BLOCK && o.kind != FS_SHARDDIR)
        r = o.kind == FS_BLOCKS ? -EBUSY : -ENOTDIR;
    if (r == 0 && fs->ro)
        r = -EROFS;
    /* A virtual directory: "removing" an empty one succeeds (so rm -r
     * works); one with shards is not empty. */
    if (r == 0)
        r = block_listing(fs, &o.key.block, &l);
    if (r == 0 && l.count - l.holes + l.nextra > 0)
        r = -ENOTEMPTY;
    listing_free(&l);
    fuse_reply_err(req, -r);
}

void fs_op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                  const char *newname, unsigned int flags)
{
    /* Names are keys: a shard cannot move. Not EXDEV: mv would copy and
     * unlink, and unlinking shard n drops the later shards of its block
     * (the copy among them, when it lands in the same block). */
    fuse_reply_err(req, fs_of(req)->ro ? EROFS : EPERM);
}

void fs_op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
    fuse_reply_err(req, EPERM);
}

void fs_op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
    fuse_reply_err(req, EPERM);
}

/* ---------------------------------------------------------------------------
 * Directories: a snapshot taken at opendir, served by offset.
 *
 * Names are kept for the small listings (the root, a block, /block: bounded
 * by the cache). A shard directory keeps only its block listing's shape:
 * the backend's count, and the resident shards past it; its names are
 * generated at each readdir offset. So a handle costs at most the cache's
 * slots in memory whatever the block's size (a block of 2^20 shards cost
 * ~34 MiB per handle when its names were materialized).
 */

struct dir_ent {
    char name[SFS_BLOCK_HEX_LEN + 1];
    bool dir;
};

struct dir_handle {
    struct dir_ent *ents; /* ".", "..", and a small listing's names */
    size_t n, cap;
    /* A shard directory: entries n .. n+count-holes-1 are shards
     * 0..count-1 outside the gaps, then extra[0..nextra). */
    struct listing l;
};

static void dir_free(struct dir_handle *d)
{
    if (d) {
        free(d->ents);
        listing_free(&d->l);
    }
    free(d);
}

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

void fs_op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct fs *fs = fs_of(req);
    struct dir_handle *d = calloc(1, sizeof(*d));
    struct fs_obj o;
    int r = d ? fs_resolve(fs, ino, &o) : -ENOMEM;

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
    case FS_SHARDDIR:
        r = block_listing(fs, &o.key.block, &d->l);
        break;
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
    dir_free(d);
}

void fs_op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                   struct fuse_file_info *fi)
{
    struct dir_handle *d = (struct dir_handle *)(uintptr_t)fi->fh;
    size_t pos = 0, total, listed, g = 0;
    uint32_t sh = 0;
    char *buf;

    if (!d) {
        fuse_reply_err(req, EBADF);
        return;
    }
    listed = d->l.count - d->l.holes;
    total = d->n + listed + d->l.nextra;
    if (off < 0 || (size_t)off >= total) {
        fuse_reply_buf(req, NULL, 0);
        return;
    }
    buf = malloc(size); /* at most the kernel's readdir size (a page or so) */
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    for (size_t i = (size_t)off; i < total; i++) {
        struct stat st = {.st_ino = UNKNOWN_INO, .st_mode = S_IFREG};
        char num[16];
        const char *name = num;
        size_t need;

        if (i < d->n) {
            name = d->ents[i].name;
            st.st_mode = d->ents[i].dir ? S_IFDIR : S_IFREG;
        } else if (i - d->n < listed) {
            /* The (i - n)th shard outside the gaps: found by a walk over
             * the gaps at the first, the next one after it. */
            if (i == (size_t)off || i == d->n) {
                sh = (uint32_t)(i - d->n);
                for (g = 0; g < d->l.ngaps && sh >= d->l.gaps[2 * g]; g++)
                    sh += d->l.gaps[2 * g + 1] - d->l.gaps[2 * g];
            } else {
                for (sh++; g < d->l.ngaps && sh == d->l.gaps[2 * g]; g++)
                    sh = d->l.gaps[2 * g + 1];
            }
            snprintf(num, sizeof(num), "%" PRIu32, sh);
        } else {
            snprintf(num, sizeof(num), "%" PRIu32, d->l.extra[i - d->n - listed]);
        }
        need = fuse_add_direntry(req, buf + pos, size - pos, name, &st, (off_t)(i + 1));

        if (need > size - pos)
            break;
        pos += need;
    }
    fuse_reply_buf(req, buf, pos);
    free(buf);
}

void fs_op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    dir_free((struct dir_handle *)(uintptr_t)fi->fh);
    fuse_reply_err(req, 0);
}
