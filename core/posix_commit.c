/* SPDX-License-Identifier: MIT */
/*
 * posix_commit.c - the posix backend's writes: dumps and removes, each a
 * tmp + rename commit of one block file (the loads: backend_posix.c).
 *
 * Dumps are synchronous, in the submitter's thread, grouped by block so that
 * one rename commits every shard of the batch that belongs to the block.
 * Commit protocol, for one block:
 *   1. open <file>.tmp O_CREAT and flock(LOCK_EX) it; if the path no longer
 *      names the locked inode (another writer committed it meanwhile),
 *      close and start again;
 *   2. truncate the tmp (a writer killed mid-dump leaves garbage there) and
 *      copy the committed block file into it: sized to the committed size
 *      first, then only its data extents (SEEK_DATA / SEEK_HOLE, each with
 *      copy_file_range), so holes stay holes (below);
 *   3. pwrite the new shards; fsync if sync=1;
 *   4. rename tmp -> block file (and fsync the directory if sync=1); close.
 * Writers in any process serialize on the tmp's lock and each starts from the
 * previous commit, so concurrent dumps of different shards lose nothing. A
 * writer killed at any point leaves the committed file untouched.
 * Dumping shard n of a block that has fewer than n shards leaves a hole: the
 * shards in between read as zeros (the layout cannot mark them absent).
 * Holes are kept by every later commit: copying the whole file would turn
 * them into allocated zeros (writing shard 0 of a block whose shard 16384
 * exists would allocate 1 GiB at 64 KiB shards, and fail ENOSPC on a small
 * tmpfs), and take time in proportion to the file's size, not its data. The
 * copy costs what the block holds; the commit stays a whole new file renamed
 * over the old one, so it is exactly as crash-safe as before. A file system
 * without SEEK_DATA reports the whole file as data (the old behaviour).
 *
 * Remove: the layout stores a block as one run of shards, so removing shard n
 * truncates the block file to n * shard_size, dropping shard n and every
 * later shard, by the same tmp + rename commit; when that leaves 0 bytes the
 * block file is unlinked. -ENOENT if shard n is not there.
 */
#include "posix_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define LOCK_TRIES 100000

static int ensure_dir(struct posix_backend *p, const char *rel, size_t dlen)
{
    char dir[PATH_REL_MAX];

    memcpy(dir, rel, dlen);
    dir[dlen] = '\0';
    if (mkdirat(p->root_fd, dir, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int sync_dir(struct posix_backend *p, const char *rel, size_t dlen)
{
    char dir[PATH_REL_MAX];
    int fd, ret = 0;

    memcpy(dir, rel, dlen);
    dir[dlen] = '\0';
    fd = openat(p->root_fd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (fsync(fd) < 0)
        ret = -errno;
    close(fd);
    return ret;
}

/* Open and exclusively lock <file>.tmp, making sure the locked inode is the
 * one the path names (a writer that held the lock before us may have renamed
 * or unlinked it). Returns the fd or -errno. */
static int lock_tmp(struct posix_backend *p, const char *tmp_rel)
{
    for (int tries = 0; tries < LOCK_TRIES; tries++) {
        struct stat a, b;
        /* O_NOFOLLOW: a link planted at the tmp name never redirects a
         * commit's writes outside the store. */
        int fd = openat(p->root_fd, tmp_rel, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);

        if (fd < 0)
            return -errno;
        while (flock(fd, LOCK_EX) < 0) {
            if (errno != EINTR) {
                int e = -errno;

                close(fd);
                return e;
            }
        }
        if (fstat(fd, &a) == 0 && fstatat(p->root_fd, tmp_rel, &b, 0) == 0 &&
            a.st_ino == b.st_ino && a.st_dev == b.st_dev)
            return fd;
        close(fd);
    }
    return -EAGAIN;
}

static int pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const char *s = buf;

    while (len) {
        ssize_t w = pwrite(fd, s, len, (off_t)off);

        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        s += w;
        len -= (size_t)w;
        off += (uint64_t)w;
    }
    return 0;
}

/* Copy bytes [off, off + len) of src to the same offsets of dst. */
static int copy_range(int src, int dst, uint64_t off, uint64_t len)
{
    loff_t in = (loff_t)off, out = (loff_t)off;
    uint64_t end = off + len;
    char *buf = NULL;
    int ret = 0;

    while ((uint64_t)in < end) {
        size_t chunk = end - (uint64_t)in > (1u << 30) ? (1u << 30) : (size_t)(end - (uint64_t)in);
        ssize_t r = copy_file_range(src, &in, dst, &out, chunk, 0);

        if (r > 0)
            continue;
        if (r == 0)
            return -EIO; /* the committed file shrank under us: not ours */
        if (errno == EINTR)
            continue;
        if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP)
            return -errno;
        break; /* no in-kernel copy here: fall back to read/write */
    }
    while ((uint64_t)in < end) {
        size_t chunk = end - (uint64_t)in > (1u << 20) ? (1u << 20) : (size_t)(end - (uint64_t)in);
        ssize_t r;

        if (!buf) {
            buf = malloc(1u << 20);
            if (!buf)
                return -ENOMEM;
        }
        r = pread(src, buf, chunk, in);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            ret = r < 0 ? -errno : -EIO;
            break;
        }
        ret = pwrite_all(dst, buf, (size_t)r, (uint64_t)in);
        if (ret < 0)
            break;
        in += r;
    }
    free(buf);
    return ret;
}

/* Copy the first len bytes of src into the empty dst, keeping holes: dst is
 * sized to len (reading as zeros), then each data extent of src below len is
 * copied. lseek's SEEK_DATA answers ENXIO past the last extent; a file
 * system without hole support answers as if the file were all data. */
static int copy_prefix(int src, int dst, uint64_t len)
{
    uint64_t pos = 0;

    if (ftruncate(dst, (off_t)len) < 0)
        return -errno;
    while (pos < len) {
        off_t data = lseek(src, (off_t)pos, SEEK_DATA), hole;
        int ret;

        if (data < 0 && errno == ENXIO)
            return 0; /* a hole to the end */
        if (data < 0)
            return -errno;
        if ((uint64_t)data >= len)
            return 0;
        hole = lseek(src, data, SEEK_HOLE);
        if (hole < 0)
            return -errno;
        if ((uint64_t)hole > len)
            hole = (off_t)len;
        if (hole <= data)
            return -EIO; /* the file changed under us: not ours */
        ret = copy_range(src, dst, (uint64_t)data, (uint64_t)(hole - data));
        if (ret < 0)
            return ret;
        pos = (uint64_t)hole;
    }
    return 0;
}

/*
 * Commit one block: write the given shards (dump), or cut the block file to
 * cut_shard shards (remove; ios == NULL). Returns 0 or -errno.
 */
static int commit_block(struct posix_backend *p, const struct sfs_block_id *id, struct sfs_io **ios,
                        size_t k, uint32_t cut_shard, struct posix_job *gate)
{
    char rel[PATH_REL_MAX], tmp[PATH_REL_MAX];
    uint64_t S = p->be.shard_size, keep = 0;
    size_t dlen = sfs_posix_block_rel(p, id, false, rel);
    bool removing = ios == NULL;
    struct stat st;
    int fd, src, ret;

    sfs_posix_block_rel(p, id, true, tmp);
    if (removing) {
        /* Nothing to cut: answer without creating a tmp (or directories). */
        if (fstatat(p->root_fd, rel, &st, 0) < 0)
            return sfs_posix_errno_of_open(errno);
        if ((uint64_t)st.st_size < ((uint64_t)cut_shard + 1) * S)
            return -ENOENT;
    } else {
        ret = ensure_dir(p, rel, dlen);
        if (ret < 0)
            return ret;
    }

    fd = lock_tmp(p, tmp);
    if (fd < 0)
        return fd;
    /* A writer killed mid-dump may have left bytes here. */
    if (ftruncate(fd, 0) < 0) {
        ret = -errno;
        goto out_unlink_tmp;
    }
    /* The committed block is read as the loads read it: beneath the root,
     * regular files only, never waiting on a FIFO. */
    src = sfs_posix_open_block_file(p, rel, O_RDONLY);
    if (src >= 0) {
        if (fstat(src, &st) < 0) {
            ret = -errno;
            close(src);
            goto out_unlink_tmp;
        }
        keep = (uint64_t)st.st_size;
        if (removing) {
            if (keep < ((uint64_t)cut_shard + 1) * S) {
                close(src);
                ret = -ENOENT;
                goto out_unlink_tmp;
            }
            keep = (uint64_t)cut_shard * S;
        }
        ret = keep ? copy_prefix(src, fd, keep) : 0;
        close(src);
        if (ret < 0)
            goto out_unlink_tmp;
    } else if (src != -ENOENT) {
        ret = src;
        goto out_unlink_tmp;
    } else if (removing) {
        ret = -ENOENT;
        goto out_unlink_tmp;
    }

    if (removing && keep == 0) {
        /* Dropping shard 0 drops the block: unlink it, then our tmp, both
         * under the lock, so the next writer starts from nothing. */
        if (gate && !sfs_posix_call_commit(p, gate)) {
            ret = -ETIMEDOUT; /* the caller gave up: nothing changes */
            goto out_unlink_tmp;
        }
        if (unlinkat(p->root_fd, rel, 0) < 0 && errno != ENOENT) {
            ret = -errno;
            goto out_unlink_tmp;
        }
        ret = 0;
        goto out_unlink_tmp;
    }
    for (size_t i = 0; i < k; i++) {
        ret = pwrite_all(fd, ios[i]->buf, ios[i]->len, (uint64_t)ios[i]->key.shard * S);
        if (ret < 0)
            goto out_unlink_tmp;
    }
    if (p->o.sync && fsync(fd) < 0) {
        ret = -errno;
        goto out_unlink_tmp;
    }
    /* The commit point: a caller that already gave up (-ETIMEDOUT, a hung
     * store) was told nothing is stored, so nothing is. */
    if (gate && !sfs_posix_call_commit(p, gate)) {
        ret = -ETIMEDOUT;
        goto out_unlink_tmp;
    }
    if (renameat(p->root_fd, tmp, p->root_fd, rel) < 0) {
        ret = -errno;
        goto out_unlink_tmp;
    }
    ret = p->o.sync ? sync_dir(p, rel, dlen) : 0;
    close(fd); /* releases the lock; waiters find the path moved on */
    return ret;

out_unlink_tmp:
    /* We still hold the lock on the inode the path names: removing it makes
     * waiters start over instead of trusting half-written bytes. */
    unlinkat(p->root_fd, tmp, 0);
    close(fd);
    return ret;
}

/* A job of posix_call.c: one block's commit, with copies of its shards
 * (a caller that gave up may free its buffers at once). */
struct commit_job {
    struct posix_job h;
    struct sfs_block_id id;
    uint32_t cut_shard; /* remove: the first shard dropped */
    size_t k;           /* dump: shards; 0: a remove */
    struct sfs_io io[]; /* k, each with buf pointing after the array */
};

static int commit_fn(struct posix_backend *p, struct posix_job *j)
{
    struct commit_job *c = (struct commit_job *)j;
    struct sfs_io *ios[c->k ? c->k : 1];

    for (size_t i = 0; i < c->k; i++)
        ios[i] = &c->io[i];
    return commit_block(p, &c->id, c->k ? ios : NULL, c->k, c->cut_shard, j);
}

/* commit_block on a helper with the backend's deadline (ring mode), or
 * here. Returns 0 or -errno; -ETIMEDOUT: nothing was committed (or, only if
 * the rename itself hangs past a second deadline, the outcome is unknown:
 * docs/fs.md). */
static int commit_deadline(struct posix_backend *p, const struct sfs_block_id *id,
                           struct sfs_io **ios, size_t k, uint32_t cut_shard)
{
    uint64_t S = p->be.shard_size;
    struct commit_job *c;
    char *bytes;
    int ret;

    if (!p->ring_open)
        return commit_block(p, id, ios, k, cut_shard, NULL);
    if (k > (SIZE_MAX - sizeof(*c)) / (sizeof(struct sfs_io) + S))
        return -ENOMEM;
    c = calloc(1, sizeof(*c) + k * (sizeof(struct sfs_io) + S));
    if (!c)
        return -ENOMEM;
    c->h.fn = commit_fn;
    c->id = *id;
    c->cut_shard = cut_shard;
    c->k = k;
    bytes = (char *)&c->io[k];
    for (size_t i = 0; i < k; i++) {
        c->io[i].key = ios[i]->key;
        c->io[i].len = ios[i]->len;
        c->io[i].buf = bytes + i * S;
        memcpy(c->io[i].buf, ios[i]->buf, ios[i]->len);
    }
    ret = sfs_posix_call(p, &c->h);
    if (ret < 0)
        return ret; /* the job is no longer ours */
    ret = c->h.result;
    sfs_posix_job_free(&c->h);
    return ret;
}

struct dump_ent {
    struct sfs_io *io;
    size_t idx;
};

static int dump_ent_cmp(const void *a, const void *b)
{
    const struct dump_ent *x = a, *y = b;
    int c = memcmp(&x->io->key.block, &y->io->key.block, sizeof(struct sfs_block_id));

    if (c)
        return c;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int sfs_posix_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct dump_ent *ents;
    struct sfs_io **group;
    size_t nvalid = 0;

    if (p->o.read_only)
        return -EROFS;
    ents = malloc(n * sizeof(*ents));
    group = malloc(n * sizeof(*group));
    for (size_t i = 0; i < n; i++) {
        struct sfs_io *io = ios[i];

        if (!io->buf || io->len != be->shard_size) {
            io->result = -EINVAL;
            io->done(io);
        } else if (!ents || !group) {
            /* No memory to group: commit this one on its own. */
            int ret = commit_deadline(p, &io->key.block, &io, 1, 0);

            io->result = ret < 0 ? ret : (int)io->len;
            io->done(io);
        } else {
            ents[nvalid].io = io;
            ents[nvalid].idx = i;
            nvalid++;
        }
    }
    if (nvalid)
        qsort(ents, nvalid, sizeof(*ents), dump_ent_cmp);
    /* One commit (and one deadline) per block: each block's answer says
     * exactly whether that block was committed. */
    for (size_t i = 0; i < nvalid;) {
        size_t j = i, k = 0;
        int ret;

        while (j < nvalid && memcmp(&ents[j].io->key.block, &ents[i].io->key.block,
                                    sizeof(struct sfs_block_id)) == 0)
            group[k++] = ents[j++].io;
        ret = commit_deadline(p, &ents[i].io->key.block, group, k, 0);
        for (size_t g = 0; g < k; g++) {
            group[g]->result = ret < 0 ? ret : (int)group[g]->len;
            group[g]->done(group[g]);
        }
        i = j;
    }
    free(group);
    free(ents);
    return (int)n;
}

int sfs_posix_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    struct posix_backend *p = (struct posix_backend *)be;

    if (p->o.read_only)
        return -EROFS;
    return commit_deadline(p, &key->block, NULL, 0, key->shard);
}
