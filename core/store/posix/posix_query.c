/* SPDX-License-Identifier: MIT */
/*
 * posix_query.c - the posix backend's questions about the store: the stat
 * of a block file (exists, shard_count, stamp), the listing of every
 * block, and the scan of every block file's stat (a collector's).
 * Each is a synchronous call: in ring mode it runs on a helper of
 * posix_call.c with the backend's deadline, so a hung file system holds a
 * helper, never the caller past its deadline. Files that are not regular
 * (a FIFO, a device) or not beneath the root are absent to them.
 */
#include "posix_i.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The stamp of a block file (shardfs/backend.h): SFS_STAMP_ABSENT and size
 * 0 when it is absent, not a regular file, or not beneath the root (no
 * shards to serve). Returns 0 or -errno for other errors. Runs on a helper
 * thread (posix_call.c) in ring mode. */
int sfs_posix_block_stat(struct posix_backend *p, const struct sfs_block_id *id,
                         struct sfs_block_stamp *out)
{
    char rel[PATH_REL_MAX];
    struct stat st;
    int fd;

    sfs_posix_block_rel(p, id, false, rel);
    memset(out, 0, sizeof(*out));
    out->flags = SFS_STAMP_ABSENT | (p->remote_fs ? SFS_STAMP_REMOTE : 0);
    fd = sfs_posix_open_beneath(p, rel, O_PATH);
    if (fd < 0)
        return fd == -ENOENT || fd == -EXDEV || fd == -ELOOP ? 0 : fd;
    if (fstat(fd, &st) < 0) {
        int e = -errno;

        close(fd);
        return e;
    }
    close(fd);
    if (S_ISREG(st.st_mode)) {
        out->flags &= ~SFS_STAMP_ABSENT;
        out->dev = (uint64_t)st.st_dev;
        out->ino = (uint64_t)st.st_ino;
        out->size = (uint64_t)st.st_size;
        out->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
        out->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
        if (sfs_posix_may_have_holes((uint64_t)st.st_size, (uint64_t)st.st_blocks))
            out->flags |= SFS_STAMP_HOLES;
    }
    return 0;
}

/* Which shards of a block file with holes are data: one open of the file
 * for a run of keys of its block, and what its seeks learned (a hole
 * [hole_lo, hole_hi), a data extent [data_lo, data_hi)), so a run of keys
 * in order (a shard directory's listing) costs about two seeks per extent,
 * not one per shard. */
struct hole_cursor {
    int fd; /* -1: none open */
    struct sfs_block_id id;
    uint64_t size;
    uint64_t hole_lo, hole_hi, data_lo, data_hi;
};

/* Is shard of block id data in its file (true), or in a hole or past the
 * end of the file opened now (false)? A file system that cannot tell
 * answers data. */
static bool shard_is_data(struct posix_backend *p, struct hole_cursor *c,
                          const struct sfs_block_id *id, uint32_t shard)
{
    uint64_t S = p->be.shard_size, a = (uint64_t)shard * S, b = a + S;
    off_t d, h;

    if (c->fd < 0 || memcmp(&c->id, id, sizeof(*id)) != 0) {
        char rel[PATH_REL_MAX];
        struct stat st;

        if (c->fd >= 0)
            close(c->fd);
        memset(c, 0, sizeof(*c));
        c->id = *id;
        sfs_posix_block_rel(p, id, false, rel);
        c->fd = sfs_posix_open_block_file(p, rel, O_RDONLY, &st);
        if (c->fd < 0)
            return false; /* gone since its stat: a miss, as a load's */
        c->size = (uint64_t)st.st_size;
    }
    if (b > c->size)
        return false;
    if (a >= c->data_lo && a < c->data_hi)
        return true;
    if (a >= c->hole_lo && b <= c->hole_hi)
        return false;
    d = sfs_posix_seek_data(c->fd, a);
    if (d < 0 && errno != ENXIO) {
        /* It cannot tell: data, as before (and so every shard of it). */
        c->data_lo = 0;
        c->data_hi = UINT64_MAX;
        return true;
    }
    if (d < 0 || (uint64_t)d >= b) {
        c->hole_lo = a;
        c->hole_hi = d < 0 ? UINT64_MAX : (uint64_t)d;
        return false;
    }
    h = lseek(c->fd, d, SEEK_HOLE);
    if (h > d) {
        c->data_lo = (uint64_t)d;
        c->data_hi = (uint64_t)h;
    }
    return true;
}

/* A job of posix_call.c: the stamps of n block files, and with shards
 * (exists) whether each shard is there. */
struct stats_job {
    struct posix_job h;
    size_t n;
    struct sfs_block_id *ids;       /* n, in this block */
    struct sfs_block_stamp *stamps; /* n, in this block */
    uint32_t *shards;               /* n, in this block; NULL: stamps only */
    bool *present;                  /* n, in this block, with shards */
};

/* The stamps (and with shards, the answers of exists) of s's keys: a run
 * of keys of one block stats its file once. */
static int stats_run(struct posix_backend *p, struct stats_job *s)
{
    struct hole_cursor c = {.fd = -1};
    uint64_t S = p->be.shard_size;
    int ret = 0;

    for (size_t i = 0; i < s->n; i++) {
        if (i > 0 && s->shards && memcmp(&s->ids[i], &s->ids[i - 1], sizeof(s->ids[i])) == 0)
            s->stamps[i] = s->stamps[i - 1];
        else if ((ret = sfs_posix_block_stat(p, &s->ids[i], &s->stamps[i])) < 0)
            break;
        if (!s->shards)
            continue;
        s->present[i] = s->stamps[i].size >= ((uint64_t)s->shards[i] + 1) * S;
        if (s->present[i] && (s->stamps[i].flags & SFS_STAMP_HOLES))
            s->present[i] = shard_is_data(p, &c, &s->ids[i], s->shards[i]);
    }
    if (c.fd >= 0)
        close(c.fd);
    return ret;
}

static int stats_fn(struct posix_backend *p, struct posix_job *j)
{
    return stats_run(p, (struct stats_job *)j);
}

/* The stamps of n block files (keys[i].block, or *block when keys is NULL),
 * and with present (keys given) whether each key's shard is there, on a
 * helper with the backend's deadline (ring mode), or here. Returns 0 or
 * -errno (-ETIMEDOUT: the file system did not answer in time). */
static int block_stats(struct posix_backend *p, const struct sfs_key *keys,
                       const struct sfs_block_id *block, size_t n, struct sfs_block_stamp *stamps,
                       bool *present)
{
    size_t each = sizeof(struct sfs_block_id) + sizeof(*stamps) + sizeof(uint32_t) + sizeof(bool);
    struct stats_job *s;
    int ret;

    if (n > (SIZE_MAX - sizeof(*s)) / each)
        return -ENOMEM;
    s = calloc(1, sizeof(*s) + n * each);
    if (!s)
        return -ENOMEM;
    s->h.fn = stats_fn;
    s->n = n;
    s->stamps = (struct sfs_block_stamp *)(s + 1);
    s->ids = (struct sfs_block_id *)(s->stamps + n);
    if (present) {
        s->shards = (uint32_t *)(s->ids + n);
        s->present = (bool *)(s->shards + n);
    }
    for (size_t i = 0; i < n; i++) {
        s->ids[i] = keys ? keys[i].block : *block;
        if (present)
            s->shards[i] = keys[i].shard;
    }
    if (!p->ring_open) {
        ret = stats_run(p, s);
    } else {
        ret = sfs_posix_call(p, &s->h);
        if (ret < 0)
            return ret; /* the job is no longer ours */
        ret = s->h.result;
    }
    if (ret == 0) {
        memcpy(stamps, s->stamps, n * sizeof(*stamps));
        if (present)
            memcpy(present, s->present, n * sizeof(*present));
    }
    sfs_posix_job_free(&s->h);
    return ret;
}

int sfs_posix_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct sfs_block_stamp one, *st = n == 1 ? &one : malloc(n * sizeof(*st));
    int ret;

    if (!st)
        return -ENOMEM;
    /* A shard is there when its file spans it and it is not in a hole. */
    ret = block_stats(p, keys, NULL, n, st, present);
    if (st != &one)
        free(st);
    return ret;
}

int sfs_posix_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct sfs_block_stamp st;
    uint64_t count;
    int ret = block_stats(p, NULL, block, 1, &st, NULL);

    if (ret < 0)
        return ret;
    count = st.size / be->shard_size;
    if (count == 0)
        return -ENOENT;
    return count > INT_MAX ? INT_MAX : (int)count;
}

int sfs_posix_stamp(struct sfs_backend *be, const struct sfs_block_id *block,
                    struct sfs_block_stamp *out)
{
    struct posix_backend *p = (struct posix_backend *)be;

    if (!block) {
        memset(out, 0, sizeof(*out));
        out->flags = p->remote_fs ? SFS_STAMP_REMOTE : 0;
        return 0;
    }
    return block_stats(p, NULL, block, 1, out, NULL);
}

/* A walk's visit of one entry named like a block file: dfd its directory. */
typedef int walk_fn(int dfd, const char *name, const struct sfs_block_id *id, void *arg);

/* Visit the block files of one directory. prefix: the hex the names must
 * start with (dir_prefix layout), or NULL. One open directory, read in
 * readdir's pages: memory bounded whatever the directory holds. */
static int walk_dir(struct posix_backend *p, const char *sub, const char *prefix, walk_fn *fn,
                    void *arg)
{
    int dfd = openat(p->root_fd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct dirent *de;
    DIR *d;
    int ret = 0;

    if (dfd < 0)
        return (errno == ENOENT || errno == ENOTDIR) ? 0 : -errno;
    d = fdopendir(dfd);
    if (!d) {
        ret = -errno;
        close(dfd);
        return ret;
    }
    while ((de = readdir(d)) != NULL) {
        struct sfs_block_id id;

        if (sfs_hex_decode_name(de->d_name, &id) < 0)
            continue; /* *.tmp, ".", "..", strangers */
        if (prefix && strncmp(de->d_name, prefix, strlen(prefix)) != 0)
            continue;
        if (de->d_type != DT_REG && de->d_type != DT_UNKNOWN)
            continue;
        ret = fn(dirfd(d), de->d_name, &id, arg);
        if (ret)
            break;
    }
    closedir(d);
    return ret;
}

/* Every directory of the layout in turn (at most two open at once). */
static int walk_all(struct posix_backend *p, walk_fn *fn, void *arg)
{
    struct dirent *de;
    DIR *d;
    int dfd, ret = 0;

    if (p->o.dir_prefix == 0)
        return walk_dir(p, "data", NULL, fn, arg);
    dfd = openat(p->root_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    d = fdopendir(dfd);
    if (!d) {
        ret = -errno;
        close(dfd);
        return ret;
    }
    while ((de = readdir(d)) != NULL) {
        bool ok = strlen(de->d_name) == p->o.dir_prefix;

        for (unsigned i = 0; ok && i < p->o.dir_prefix; i++)
            ok = sfs_hex_lower_val(de->d_name[i]) >= 0;
        if (!ok || (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN))
            continue;
        ret = walk_dir(p, de->d_name, de->d_name, fn, arg);
        if (ret)
            break;
    }
    closedir(d);
    return ret;
}

struct list_visit {
    int (*fn)(const struct sfs_block_id *, void *);
    void *arg;
};

static int list_one(int dfd, const char *name, const struct sfs_block_id *id, void *arg)
{
    struct list_visit *v = arg;

    (void)dfd;
    (void)name;
    return v->fn(id, v->arg);
}

static int list_all(struct posix_backend *p, int (*fn)(const struct sfs_block_id *, void *),
                    void *arg)
{
    struct list_visit v = {fn, arg};

    return walk_all(p, list_one, &v);
}

struct scan_visit {
    struct posix_backend *p;
    sfs_scan_fn *fn;
    void *arg;
};

/* One stat per block file, never following a link (a link is no block file
 * of the store's own: its bytes are counted where they lie, if anywhere). */
static int scan_one(int dfd, const char *name, const struct sfs_block_id *id, void *arg)
{
    struct scan_visit *v = arg;
    struct sfs_block_scan b;
    struct stat st;

    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
        return 0; /* gone since the readdir (a commit's unlink), or not a file */
    memset(&b, 0, sizeof(b));
    b.id = *id;
    b.stamp.flags = v->p->remote_fs ? SFS_STAMP_REMOTE : 0;
    b.stamp.dev = (uint64_t)st.st_dev;
    b.stamp.ino = (uint64_t)st.st_ino;
    b.stamp.size = (uint64_t)st.st_size;
    b.stamp.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    b.stamp.ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    b.atime_ns = (int64_t)st.st_atim.tv_sec * 1000000000 + st.st_atim.tv_nsec;
    b.bytes = (uint64_t)st.st_blocks * 512;
    if (sfs_posix_may_have_holes(b.stamp.size, (uint64_t)st.st_blocks))
        b.stamp.flags |= SFS_STAMP_HOLES;
    return v->fn(&b, v->arg);
}

/* The caller's thread, no deadline (shardfs/backend.h): a scan of millions
 * of files outlasts any one call's deadline, and a collector is the only
 * caller, on a thread of its own. */
int sfs_posix_scan(struct sfs_backend *be, sfs_scan_fn *fn, void *arg)
{
    struct scan_visit v = {(struct posix_backend *)be, fn, arg};

    return walk_all(v.p, scan_one, &v);
}

/* A job of posix_call.c: the ids of every block of the store, gathered by
 * the helper (16 bytes a block), handed to the caller's fn afterwards in its
 * own thread. */
struct list_job {
    struct posix_job h;
    struct sfs_block_id *ids; /* malloc'd, n of cap */
    size_t n, cap;
};

static int list_collect(const struct sfs_block_id *id, void *arg)
{
    struct list_job *l = arg;

    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        struct sfs_block_id *ids = realloc(l->ids, cap * sizeof(*ids));

        if (!ids)
            return -ENOMEM;
        l->ids = ids;
        l->cap = cap;
    }
    l->ids[l->n++] = *id;
    return 0;
}

static int list_fn(struct posix_backend *p, struct posix_job *j)
{
    return list_all(p, list_collect, j);
}

static void list_drop(struct posix_job *j)
{
    free(((struct list_job *)j)->ids);
}

int sfs_posix_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                   void *arg)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct list_job *l;
    int ret;

    if (!p->ring_open)
        return list_all(p, fn, arg);
    l = calloc(1, sizeof(*l));
    if (!l)
        return -ENOMEM;
    l->h.fn = list_fn;
    l->h.drop = list_drop;
    ret = sfs_posix_call(p, &l->h);
    if (ret < 0)
        return ret; /* the job is no longer ours */
    ret = l->h.result;
    for (size_t i = 0; ret == 0 && i < l->n; i++)
        ret = fn(&l->ids[i], arg);
    sfs_posix_job_free(&l->h);
    return ret;
}
