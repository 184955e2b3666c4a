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
    }
    return 0;
}

/* A job of posix_call.c: the stamps of n block files. */
struct stats_job {
    struct posix_job h;
    size_t n;
    struct sfs_block_id *ids;       /* n, in this block */
    struct sfs_block_stamp *stamps; /* n, in this block */
};

static int stats_fn(struct posix_backend *p, struct posix_job *j)
{
    struct stats_job *s = (struct stats_job *)j;

    for (size_t i = 0; i < s->n; i++) {
        int ret = sfs_posix_block_stat(p, &s->ids[i], &s->stamps[i]);

        if (ret < 0)
            return ret;
    }
    return 0;
}

/* The stamps of n block files (keys[i].block, or *block when keys is NULL),
 * on a helper with the backend's deadline (ring mode), or here. Returns 0
 * or -errno (-ETIMEDOUT: the file system did not answer in time). */
static int block_stats(struct posix_backend *p, const struct sfs_key *keys,
                       const struct sfs_block_id *block, size_t n, struct sfs_block_stamp *stamps)
{
    struct stats_job *s;
    int ret;

    if (!p->ring_open) {
        for (size_t i = 0; i < n; i++) {
            ret = sfs_posix_block_stat(p, keys ? &keys[i].block : block, &stamps[i]);
            if (ret < 0)
                return ret;
        }
        return 0;
    }
    if (n > (SIZE_MAX - sizeof(*s)) / (sizeof(*s->ids) + sizeof(*s->stamps)))
        return -ENOMEM;
    s = calloc(1, sizeof(*s) + n * (sizeof(*s->ids) + sizeof(*s->stamps)));
    if (!s)
        return -ENOMEM;
    s->h.fn = stats_fn;
    s->n = n;
    s->stamps = (struct sfs_block_stamp *)(s + 1);
    s->ids = (struct sfs_block_id *)(s->stamps + n);
    for (size_t i = 0; i < n; i++)
        s->ids[i] = keys ? keys[i].block : *block;
    ret = sfs_posix_call(p, &s->h);
    if (ret < 0)
        return ret; /* the job is no longer ours */
    ret = s->h.result;
    if (ret == 0)
        memcpy(stamps, s->stamps, n * sizeof(*stamps));
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
    ret = block_stats(p, keys, NULL, n, st);
    for (size_t i = 0; ret == 0 && i < n; i++)
        present[i] = st[i].size >= ((uint64_t)keys[i].shard + 1) * be->shard_size;
    if (st != &one)
        free(st);
    return ret;
}

int sfs_posix_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct sfs_block_stamp st;
    uint64_t count;
    int ret = block_stats(p, NULL, block, 1, &st);

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
    return block_stats(p, NULL, block, 1, out);
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
