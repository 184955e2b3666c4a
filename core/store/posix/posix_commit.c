/* SPDX-License-Identifier: MIT */
/*
 * posix_commit.c - the posix backend's writes: dumps and removes, each a
 * tmp + rename commit of one block file (the loads: backend_posix.c).
 *
 * Dumps are synchronous, in the submitter's thread, grouped by block so that
 * one rename commits every shard of the batch that belongs to the block.
 * Commit protocol, for one block (docs/shared-store.md: why it holds with
 * several hosts on one store, on NFS and GlusterFS too):
 *   1. open <file>.lock O_CREAT and flock(LOCK_EX) it; if the path no longer
 *      names the locked inode (the writer before us finished), start again
 *      (where flock is refused, go on without the lock; on a remote file
 *      system, NFS or FUSE, the lock is polled, never waited for in the
 *      kernel, and given up after a quarter of the deadline);
 *   2. create this writer's own temporary file exclusively (O_EXCL):
 *      <file>.tmp.<host>.<pid>.<seq>; no other writer, on any host, ever
 *      opens it, so nobody truncates or writes it under us (on a FUSE
 *      store, whose lock is the host's, <file>.own is created exclusively
 *      first, under the host lock, which keeps other hosts' writers out:
 *      posix_lock.c);
 *   3. copy the committed block file into it: sized to the committed size
 *      first, then only its data extents (SEEK_DATA / SEEK_HOLE, each with
 *      copy_file_range) that the new shards do not overwrite, so holes
 *      stay holes (below) and a whole-block dump reads nothing of the old
 *      file; on a remote file system a commit that keeps old bytes starts
 *      only from the file the lock file's record names (below);
 *   4. pwrite the new shards; fsync if sync=1;
 *   5. rename tmp -> block file (and fsync the directory if sync=1);
 *      on a remote file system unlink the second name of the file it
 *      replaced (below); unlink the lock file (a local file system only:
 *      on a remote one it stays, since other clients cache its handle,
 *      and records the file just committed); close.
 * The record (remote file systems): a lock file that stays holds, written
 * by each holder after its commit, the size and inode of the block file it
 * left. A client's open of a name just renamed over can answer ENOENT for
 * a file that exists (GlusterFS's FUSE client did, to a rank's commit of
 * one shard, under the lock: the block was rewritten with that shard and
 * zeros before it), or find an older inode. So a commit that keeps bytes
 * of the old file starts only from the recorded file: absent, another
 * inode or shorter is looked up again for STALE_BUDGET_NS, and then the
 * commit is refused (-EIO, nothing written) rather than commit zeros or
 * an old version over recorded shards, and the record is cleared (a commit
 * made without the lock, or a holder killed before it recorded, leaves it
 * out of date: one refusal, not one per commit). Without a record (a new
 * or cleared lock file, the lock not held) an absent answer on a remote
 * file system is checked by a stat of the name. Whole-block dumps keep
 * nothing, so they are never held or refused by this. The name can also
 * show, for seconds, the file the last commit replaced (GlusterFS, to the
 * host that made the recorded file): so each commit that records also
 * links its file under a second name, <file>.ref.<inode>, before its
 * rename (never renamed over, so never seen older), and the commit that
 * replaces it unlinks that; a commit whose name shows a file no newer
 * than the recorded one starts from the second name (recorded_file).
 * A handle made stale by another host (-ESTALE) is retried for a time
 * (STALE_BUDGET_NS) longer than the client's lookup caches keep it.
 * What a reader sees is always one whole file (the old or the new): a block
 * file is never written after its rename. Integrity rests on the unique
 * temporary name and the rename only; the lock adds that writers on one
 * host (where flock is coherent) start from each other's commits, so
 * concurrent dumps of different shards of a block lose nothing. Writers on
 * different hosts whose file system does not carry flock between clients
 * may lose one's shards to the other's commit (last rename wins): a later
 * miss, never a torn block. A writer killed at any point leaves the
 * committed file untouched, plus its temporary file and maybe the lock
 * file: any later commit into that directory sweeps such leftovers once
 * they are older than tmp_age (20 deadlines, at least 10 minutes), an age
 * no live commit reaches (a commit ends within two deadlines: posix_call.c).
 * Ages are measured against the file system's clock (the mtime of the
 * sweeper's own new temporary file), so host clocks need not agree.
 * Dumping shard n of a block that has fewer than n shards leaves a hole: the
 * layout cannot mark the shards in between absent, so a shard that lies
 * wholly in a hole is a miss to loads and exists (posix_path.c). Every
 * shard a commit stores is data: written by pwrite, or copied from the old
 * file's data extents (copy_file_range shares or copies them, the fallback
 * writes them), so written zeros are never a hole.
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
 *
 * Evict (a collector bounding the store, sfs_backend_evict): the whole block
 * file unlinked under the same lock, only while it is the file the
 * collector's scan stamped (evict_block, at the end).
 */
#include "posix_remote_i.h"
#include "util_i.h"
#include "testpoint_i.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* renameat(tmp, rel) beneath the root; in the test build, failed on
 * demand at "commit:rename" (a stale handle, an error of a remote store). */
static int rename_rel(struct posix_backend *p, const char *tmp, const char *rel)
{
    int fail = SFS_TEST_RESULT("commit:rename", 0);

    if (fail < 0) {
        errno = -fail;
        return -1;
    }
    return renameat(p->root_fd, tmp, p->root_fd, rel);
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
        /* Tests: a file system without an in-kernel copy (-EXDEV, ...). */
        int fail = SFS_TEST_RESULT("commit:copy", 0);
        ssize_t r = fail < 0 ? (errno = -fail, -1) : copy_file_range(src, &in, dst, &out, chunk, 0);

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

/* Copy bytes [pos, len) of src into the same offsets of dst, keeping
 * holes: only each data extent of src there is copied. lseek's SEEK_DATA
 * answers ENXIO past the last extent; a file system without hole support
 * answers as if the file were all data. */
static int copy_extents(int src, int dst, uint64_t pos, uint64_t len)
{
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

/* Copy what the commit keeps of the first len bytes of src into the empty
 * dst: dst is sized to len (reading as zeros), then the data extents of
 * src that no shard of ios overwrites are copied. A dump of whole blocks
 * (what the engines do) copies nothing, so it never reads the file another
 * host may be replacing meanwhile (on GlusterFS its stale handle failed such
 * copies: docs/shared-store.md). */
static int copy_kept(int src, int dst, uint64_t len, const struct commit_shards *cs)
{
    uint64_t pos = 0, S = cs->S;

    if (ftruncate(dst, (off_t)len) < 0)
        return -errno;
    while (pos < len) {
        uint64_t end = pos;
        int ret;

        if (commit_writes(cs, pos / S)) {
            pos = (pos / S + 1) * S;
            continue;
        }
        while (end < len && !commit_writes(cs, end / S))
            end = (end / S + 1) * S;
        if (end > len)
            end = len;
        ret = copy_extents(src, dst, pos, end);
        if (ret < 0)
            return ret;
        pos = end;
    }
    return 0;
}

/*
 * Commit one block: write the given shards (dump), or cut the block file to
 * cut_shard shards (remove; ios == NULL). The steps are the header's; the
 * lock scheme is posix_lock.c's (sfs_posix_hold_block), and what a remote
 * store adds is posix_remote.c's. Returns 0 or -errno; -ESTALE before the
 * commit point (nothing changed: commit_block tries again) with *why the
 * step that met the stale handle.
 */
static int commit_block_once(struct posix_backend *p, const struct sfs_block_id *id,
                             const struct commit_shards *cs, uint32_t cut_shard,
                             struct posix_job *gate, bool last, bool *gated, const char **why)
{
    char rel[PATH_REL_MAX], lock[PATH_REL_MAX], tmp[PATH_REL_MAX];
    uint64_t S = cs->S, keep = 0, size;
    size_t dlen = sfs_posix_block_rel(p, id, false, rel);
    bool removing = cs->ios == NULL;
    unsigned rename_us = 0;
    struct block_hold hold;
    struct remote_commit rc;
    struct stat st;
    int fd, src, ret;

    sfs_posix_block_rel(p, id, true, lock);
    if (removing) {
        /* Nothing to cut: answer without creating a tmp (or directories). */
        if (fstatat(p->root_fd, rel, &st, 0) < 0)
            return sfs_posix_errno_of_open(errno);
        if ((uint64_t)st.st_size < ((uint64_t)cut_shard + 1) * S)
            return -ENOENT;
    } else {
        ret = sfs_posix_ensure_dir(p, rel, dlen);
        if (ret < 0)
            return ret;
    }

    sfs_posix_hold_block(p, lock, &hold);
    sfs_posix_remote_begin(p, hold.lfd, &rc);
    fd = sfs_posix_create_tmp(p, rel, tmp);
    if (fd < 0) {
        ret = fd;
        goto out_release;
    }
    if (fstat(fd, &st) == 0)
        sfs_posix_sweep_dir(p, rel, dlen, &st.st_mtim);
    /* The committed block is read as the loads read it: beneath the root,
     * regular files only, never waiting on a FIFO. */
    SFS_TEST_POINT("commit:open_committed");
    src = sfs_posix_open_block_file(p, rel, O_RDONLY, NULL);
    if (src >= 0 && fstat(src, &st) < 0) {
        ret = -errno;
        *why = "the stat of the committed file";
        close(src);
        goto out_unlink_tmp;
    }
    src = sfs_posix_remote_source(p, &rc, rel, src, &st, cs, last, why);
    if (src == -ESTALE || src == -EIO) {
        ret = src;
        goto out_unlink_tmp;
    }
    if (src >= 0) {
        keep = (uint64_t)st.st_size;
        if (removing) {
            if (keep < ((uint64_t)cut_shard + 1) * S) {
                close(src);
                ret = -ENOENT;
                goto out_unlink_tmp;
            }
            keep = (uint64_t)cut_shard * S;
        }
        ret = keep ? copy_kept(src, fd, keep, cs) : 0;
        close(src);
        /* The file we opened was replaced and freed by another host
         * (NFS, GlusterFS: its handle went stale, or its gfid is gone):
         * start the commit again from the new one (commit_block). */
        if (ret == -ENOENT || ret == -EIO)
            ret = -ESTALE;
        if (ret == -ESTALE)
            *why = "the copy of the committed file";
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
        /* Dropping shard 0 drops the block: unlink it (and our tmp) under
         * the lock, so the next writer starts from nothing. */
        if (gate && !sfs_posix_call_commit(p, gate)) {
            ret = -ETIMEDOUT; /* the caller gave up: nothing changes */
            goto out_unlink_tmp;
        }
        *gated = true;
        if (unlinkat(p->root_fd, rel, 0) < 0 && errno != ENOENT) {
            ret = -errno;
            goto out_unlink_tmp;
        }
        sfs_posix_remote_removed(p, &rc, rel);
        ret = 0;
        goto out_unlink_tmp;
    }
    size = keep;
    for (size_t i = 0; i < cs->k; i++) {
        uint64_t off = (uint64_t)cs->ios[i]->key.shard * S;

        ret = pwrite_all(fd, cs->ios[i]->buf, cs->ios[i]->len, off);
        if (ret < 0)
            goto out_unlink_tmp;
        if (off + cs->ios[i]->len > size)
            size = off + cs->ios[i]->len;
    }
    if (p->o.sync && fsync(fd) < 0) {
        ret = -errno;
        goto out_unlink_tmp;
    }
    SFS_TEST_POINT("commit:written");
    /* The commit point: a caller that already gave up (-ETIMEDOUT, a hung
     * store) was told nothing is stored, so nothing is. */
    if (gate && !sfs_posix_call_commit(p, gate)) {
        ret = -ETIMEDOUT;
        goto out_unlink_tmp;
    }
    *gated = true;
    sfs_posix_remote_pending(p, &rc, rel, tmp, fd, size);
    SFS_TEST_POINT("commit:pending");
    for (int64_t start = sfs_now_ns(); rename_rel(p, tmp, rel) < 0;) {
        if (errno != ESTALE || !sfs_posix_stale_backoff(start, STALE_BUDGET_NS, &rename_us)) {
            ret = -errno;
            goto out_unlink_tmp;
        }
    }
    SFS_TEST_POINT("commit:renamed");
    sfs_posix_remote_committed(p, &rc, rel, fd, size);
    ret = p->o.sync ? sfs_posix_sync_dir(p, rel, dlen) : 0;
    close(fd);
    goto out_release;

out_unlink_tmp:
    sfs_posix_remote_abort(p, &rc);
    unlinkat(p->root_fd, tmp, 0);
    close(fd);
out_release:
    sfs_posix_release_block(p, lock, &hold);
    return ret;
}

/* commit_block_once, again from the start while it fails -ESTALE before
 * its commit point (the committed file or the lock file replaced by
 * another host while we read it, or not the file the lock's record names):
 * nothing was changed yet. Bounded in time (STALE_BUDGET_NS), past the
 * client's lookup caches; the last try knows it is the last (last). */
static int commit_block(struct posix_backend *p, const struct sfs_block_id *id, struct sfs_io **ios,
                        size_t k, uint32_t cut_shard, struct posix_job *gate)
{
    const struct commit_shards cs = {ios, k, p->be.shard_size};
    int64_t start = sfs_now_ns();
    bool gated = false;
    unsigned us = 0;
    int ret;

    for (;;) {
        bool last = sfs_now_ns() - start >= STALE_BUDGET_NS;
        /* Where the try met a stale handle, for the log line of a commit
         * given up (NULL: the lock file or the temporary). */
        const char *why = NULL;

        ret = commit_block_once(p, id, &cs, cut_shard, gate, last, &gated, &why);
        if (ret != -ESTALE || gated)
            return ret;
        if (last) {
            char rel[PATH_REL_MAX];

            sfs_posix_block_rel(p, id, false, rel);
            sfs_log(LOG_WARNING,
                    "posix: %s: commit given up after %lld ms of stale handles (the last at %s)",
                    rel, (long long)(STALE_BUDGET_NS / 1000000), why ? why : "the lock file");
            return -EIO; /* still changing under us: not stored */
        }
        sfs_posix_stale_backoff(start, STALE_BUDGET_NS, &us);
    }
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

/*
 * Evict (a collector bounding the store): the whole block file, under its
 * commit lock, only if it is still the file the collector's scan stamped.
 * The lock is the commit's own (sfs_posix_hold_block): a commit in flight
 * on this host, or on another where the lock crosses hosts (flock over NFS,
 * the owner file of a FUSE store), ends before it, and none starts until
 * the unlink is done; a block a commit changed meanwhile is no longer the
 * scan's file (-ESTALE) and stays, since it was just written. Without the
 * lock nothing is removed (-EBUSY): a commit goes on without a lock it
 * cannot have, a collector never does. The unlink drops the name only: a
 * reader that opened the file (a load in flight) reads the whole old block
 * from its descriptor, a later open misses; a block file is never written
 * after its rename, so there is no third view.
 */
static int evict_block(struct posix_backend *p, const struct sfs_block_id *id,
                       const struct sfs_block_stamp *expect, struct posix_job *gate,
                       uint64_t *freed)
{
    char rel[PATH_REL_MAX], lock[PATH_REL_MAX];
    struct sfs_block_stamp now;
    struct block_hold hold;
    struct remote_commit rc;
    struct stat st;
    int ret;

    sfs_posix_block_rel(p, id, false, rel);
    sfs_posix_block_rel(p, id, true, lock);
    if (fstatat(p->root_fd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return sfs_posix_errno_of_open(errno);
    sfs_posix_hold_block(p, lock, &hold);
    sfs_posix_remote_begin(p, hold.lfd, &rc);
    if (hold.lfd < 0 || (p->host_lock_fd >= 0 && !hold.owned)) {
        ret = -EBUSY;
        goto out_abort;
    }
    if (fstatat(p->root_fd, rel, &st, AT_SYMLINK_NOFOLLOW) < 0) {
        ret = sfs_posix_errno_of_open(errno);
        goto out_abort;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = -ENOENT;
        goto out_abort;
    }
    memset(&now, 0, sizeof(now));
    now.dev = (uint64_t)st.st_dev;
    now.ino = (uint64_t)st.st_ino;
    now.size = (uint64_t)st.st_size;
    now.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    now.ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
    if (!sfs_block_stamp_same(&now, expect)) {
        ret = -ESTALE;
        goto out_abort;
    }
    SFS_TEST_POINT("evict:locked");
    if (gate && !sfs_posix_call_commit(p, gate)) {
        ret = -ETIMEDOUT; /* the caller gave up: nothing changes */
        goto out_abort;
    }
    if (unlinkat(p->root_fd, rel, 0) < 0) {
        ret = sfs_posix_errno_of_open(errno);
        goto out_abort;
    }
    *freed = (uint64_t)st.st_blocks * 512;
    sfs_posix_remote_removed(p, &rc, rel);
    ret = 0;
    goto out_release;

out_abort:
    sfs_posix_remote_abort(p, &rc);
out_release:
    sfs_posix_release_block(p, lock, &hold);
    return ret;
}

/* A job of posix_call.c: one eviction. */
struct evict_job {
    struct posix_job h;
    struct sfs_block_id id;
    struct sfs_block_stamp expect;
    uint64_t freed;
};

static int evict_fn(struct posix_backend *p, struct posix_job *j)
{
    struct evict_job *e = (struct evict_job *)j;

    return evict_block(p, &e->id, &e->expect, j, &e->freed);
}

int sfs_posix_evict(struct sfs_backend *be, const struct sfs_block_id *block,
                    const struct sfs_block_stamp *expect, uint64_t *freed)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct evict_job *e;
    int ret;

    *freed = 0;
    if (p->o.read_only)
        return -EROFS;
    if (!p->ring_open)
        return evict_block(p, block, expect, NULL, freed);
    e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->h.fn = evict_fn;
    e->id = *block;
    e->expect = *expect;
    ret = sfs_posix_call(p, &e->h);
    if (ret < 0)
        return ret; /* the job is no longer ours */
    ret = e->h.result;
    *freed = e->freed;
    sfs_posix_job_free(&e->h);
    return ret;
}
