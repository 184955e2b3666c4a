/* SPDX-License-Identifier: MIT */
/*
 * posix_remote.c - a commit on a remote store (NFS, GlusterFS): what it
 * adds to the local commit of posix_commit.c, whose header is the protocol.
 *
 * A client of a remote file system may show, under a block file's name,
 * no file or an older one for a while after another writer's rename. So a
 * lock file there stays, and holds a record of the file its last holder
 * committed (and of a rename under way); a commit that keeps bytes of the
 * old file starts only from the recorded one -- through its second name,
 * <file>.ref.<inode>, never renamed over, when the name shows an older
 * file -- and takes any other view for stale: looked up again, then
 * refused. Every function here is a no-op on a local store.
 */
#include "posix_remote_i.h"
#include "util_i.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* On a remote file system, is what the open of the committed block file
 * found (src: its fd or -errno; st: its fstat when src >= 0) a false view,
 * one a commit of ios (k shards; NULL: a remove) must not start from? With
 * a record (rec) of the last commit under the lock: when the commit keeps
 * some of the recorded bytes and the file is absent, another inode, or
 * shorter. Without one: when the file is absent but a stat of its name
 * finds it, with bytes the commit keeps. A record that names a rename
 * under way (a holder killed before it recorded the end of its commit):
 * the renamed file is the true view; the file from before the rename is
 * trusted only on the last try (last), since the rename may have happened
 * while the client still shows the older file. */
static bool false_view(struct posix_backend *p, const char *rel, const struct lock_record *rec,
                       int src, const struct stat *st, const struct commit_shards *cs, bool last)
{
    struct stat byname;

    if (!p->remote_fs)
        return false;
    if (rec && rec->pend_ino) {
        if (src >= 0 && (uint64_t)st->st_ino == rec->pend_ino &&
            (uint64_t)st->st_size >= rec->pend_size)
            return false;
        if (!last && (commit_keeps_old(cs, rec->pend_size) || commit_keeps_old(cs, rec->size)))
            return true;
        if (rec->size == 0)
            rec = NULL; /* nothing before the rename: as without a record */
    }
    if (rec) {
        if (rec->size == 0 || !commit_keeps_old(cs, rec->size))
            return false;
        if (src == -ENOENT)
            return true;
        return src >= 0 && ((uint64_t)st->st_ino != rec->ino || (uint64_t)st->st_size < rec->size);
    }
    return src == -ENOENT && cs->ios && fstatat(p->root_fd, rel, &byname, 0) == 0 &&
           commit_keeps_old(cs, (uint64_t)byname.st_size);
}

/* Is a later than b? */
static bool ts_after(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec != b->tv_sec ? a->tv_sec > b->tv_sec : a->tv_nsec > b->tv_nsec;
}

/* The file a commit of ios starts from, on a remote file system whose
 * name of the block file shows another file than the one the record
 * (rec) names: the recorded file through its second name
 * (REF_INFIX), when that finds the recorded inode, at least the recorded
 * size, and the name's file (src, stat st) is not newer. GlusterFS's
 * client showed, for seconds, the file that the last commit had replaced,
 * to the very process (and host) that had renamed the recorded file over
 * it, and a fresh lookup, a forced stat and a readdir all showed the same
 * (its lookups answered from the replaced file's cached attributes), so
 * a rank's next shard commit of its own block was refused after 3 s. The
 * second name was linked by the commit that made the file and is never
 * renamed over, so no client has an older file under it. A newer file
 * under the name was put there outside the protocol (a commit without the
 * lock, a hand): left to false_view. Returns the fd to start from (src,
 * or the recorded file's, src closed; *st its stat). */
static int recorded_file(struct posix_backend *p, const char *rel, const struct lock_record *rec,
                         int src, struct stat *st, const struct commit_shards *cs, bool last)
{
    char ref[PATH_REL_MAX];
    struct stat rs;
    int fd;

    /* A rename pending: the file from before it is trusted on the last
     * try only (false_view), then also through its second name. */
    if (rec->pend_ino && (!last || (uint64_t)st->st_ino == rec->pend_ino))
        return src;
    if (!p->remote_fs || rec->size == 0 || (uint64_t)st->st_ino == rec->ino ||
        !commit_keeps_old(cs, rec->size) || sfs_posix_ref_rel(rel, rec->ino, ref) < 0)
        return src;
    fd = sfs_posix_open_block_file(p, ref, O_RDONLY, NULL);
    if (fd < 0)
        return src;
    if (fstat(fd, &rs) < 0 || (uint64_t)rs.st_ino != rec->ino || (uint64_t)rs.st_size < rec->size ||
        ts_after(&st->st_mtim, &rs.st_mtim)) {
        close(fd);
        return src;
    }
    close(src);
    *st = rs;
    return fd;
}

/* Unlink the second names of the files rec names, but the one of inode
 * keep (the file just committed): the commit replaced them. */
static void drop_refs(struct posix_backend *p, const char *rel, const struct lock_record *rec,
                      uint64_t keep)
{
    uint64_t inos[2] = {rec->size ? rec->ino : 0, rec->pend_ino};
    char ref[PATH_REL_MAX];

    for (int i = 0; i < 2; i++) {
        if (inos[i] && inos[i] != keep && sfs_posix_ref_rel(rel, inos[i], ref) == 0)
            unlinkat(p->root_fd, ref, 0);
    }
}

void sfs_posix_remote_begin(struct posix_backend *p, int lfd, struct remote_commit *rc)
{
    memset(rc, 0, sizeof(*rc));
    rc->lfd = lfd;
    /* Another user's lock file, held read-only (open_lock_file), has no
     * record for us: we could not keep it, nor clear it after a refusal,
     * so each of our partial commits would be refused against its owner's
     * last commit. The commit goes as without a record (none read, none
     * written, no second name). */
    rc->on = lfd >= 0 && p->remote_fs && (fcntl(lfd, F_GETFL) & O_ACCMODE) == O_RDWR;
    if (rc->on)
        rc->have_rec = sfs_posix_lock_record_read(lfd, &rc->rec);
}

int sfs_posix_remote_source(struct posix_backend *p, struct remote_commit *rc, const char *rel,
                            int src, struct stat *st, const struct commit_shards *cs, bool last,
                            const char **why)
{
    const struct lock_record *rec = rc->have_rec ? &rc->rec : NULL;

    if (src >= 0 && rec)
        src = recorded_file(p, rel, rec, src, st, cs, last);
    if (!false_view(p, rel, rec, src, st, cs, last))
        return src;
    /* Not the file the last commit under the lock left: look it up again
     * (commit_block), and once the retries are spent refuse this commit and
     * clear the record, which no longer says what the store holds (a commit
     * made without the lock, a holder killed before it recorded). */
    if (src >= 0)
        close(src);
    *why = "a false view of the committed file";
    if (!last)
        return -ESTALE;
    /* Said once per refusal: what the record named, what was found. */
    sfs_log(LOG_WARNING,
            "posix: %s: commit refused after %lld ms: the block file is not the one its lock "
            "records (recorded inode %llu, %llu bytes; pending %llu; found %s inode %llu, %lld "
            "bytes)",
            rel, (long long)(STALE_BUDGET_NS / 1000000), (unsigned long long)(rec ? rec->ino : 0),
            (unsigned long long)(rec ? rec->size : 0),
            (unsigned long long)(rec ? rec->pend_ino : 0), src >= 0 ? "" : "no file,",
            src >= 0 ? (unsigned long long)st->st_ino : 0, src >= 0 ? (long long)st->st_size : -1);
    if (rec)
        sfs_posix_lock_record_write(rc->lfd, &(struct lock_record){0});
    return -EIO;
}

void sfs_posix_remote_pending(struct posix_backend *p, struct remote_commit *rc, const char *rel,
                              const char *tmp, int fd, uint64_t size)
{
    struct stat st;

    /* The rename under way, recorded before it: a holder killed between the
     * rename and the record after it leaves the next one the file it
     * renamed (false_view), not an out-of-date record that refuses the
     * commit. */
    if (!rc->on || fstat(fd, &st) < 0)
        return;
    struct lock_record r =
        rc->have_rec ? rc->rec : (struct lock_record){.magic = LOCK_RECORD_MAGIC};

    /* Its second name, for the next commit (recorded_file); best effort:
     * without it, that commit goes by the name alone. */
    rc->linked = sfs_posix_ref_rel(rel, (uint64_t)st.st_ino, rc->ref) == 0 &&
                 linkat(p->root_fd, tmp, p->root_fd, rc->ref, 0) == 0;
    r.pend_size = size;
    r.pend_ino = (uint64_t)st.st_ino;
    sfs_posix_lock_record_write(rc->lfd, &r);
}

void sfs_posix_remote_committed(struct posix_backend *p, struct remote_commit *rc, const char *rel,
                                int fd, uint64_t size)
{
    struct stat st;

    rc->linked = false; /* the second name now names the committed file */
    if (!rc->on || fstat(fd, &st) < 0)
        return;
    sfs_posix_lock_record_write(
        rc->lfd, &(struct lock_record){LOCK_RECORD_MAGIC, size, (uint64_t)st.st_ino, 0, 0});
    if (rc->have_rec)
        drop_refs(p, rel, &rc->rec, (uint64_t)st.st_ino);
}

void sfs_posix_remote_removed(struct posix_backend *p, struct remote_commit *rc, const char *rel)
{
    if (!rc->on)
        return;
    sfs_posix_lock_record_write(rc->lfd, &(struct lock_record){.magic = LOCK_RECORD_MAGIC});
    if (rc->have_rec)
        drop_refs(p, rel, &rc->rec, 0);
}

void sfs_posix_remote_abort(struct posix_backend *p, struct remote_commit *rc)
{
    if (rc->linked)
        unlinkat(p->root_fd, rc->ref, 0);
    rc->linked = false;
}
