/* SPDX-License-Identifier: MIT */
/*
 * posix_ring.c - the posix backend's io_uring queue and its block-file
 * opens (struct block_fd): what posix_load.c's loads and the touches ride on.
 *
 * Any thread may submit (sq_lock guards the submission queue); requests
 * beyond `depth` wait on a pending list (opens on their own, first), never
 * blocking the submitter. In ring mode a block file's open is an OPENAT2 op
 * (posix_path.c's rules: beneath the root, no magic links, O_NONBLOCK;
 * IOSQE_ASYNC), its regular-file check a STATX of the new fd, then
 * O_NONBLOCK is cleared (fcntl never reaches the file system) and the
 * block's waiting loads go to the pending list; the last load's release
 * queues a CLOSE. A touch is OPENAT2, STATX, FADVISE, CLOSE. Nothing of it
 * waits in the submitter's thread on a hung file system. An open that
 * answers -ESTALE (another host replaced the file) looks the name up again;
 * one that answers -EINVAL to O_DIRECT is opened again buffered, and the
 * backend reads buffered from then on (logged once). In sync mode opens run
 * in the caller's thread (sfs_posix_open_block_read).
 */
#include "posix_ring_i.h"
#include "testpoint_i.h"
#include "util_i.h"

#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <stdlib.h>
#include <syslog.h>
#include <unistd.h>

/* A block_fd, refs 0. Ring mode: step BFD_OPEN, fd -1, the open's
 * arguments filled in. Sync mode: fd is the open descriptor, BFD_READY. */
struct block_fd *sfs_posix_bfd_alloc(struct posix_backend *p, const struct sfs_block_id *id,
                                     bool direct)
{
    struct block_fd *b = calloc(1, sizeof(*b));

    if (!b)
        return NULL;
    b->fd = -1;
    b->step = BFD_OPEN;
    b->direct = direct;
    sfs_posix_block_rel(p, id, false, b->rel);
    /* posix_path.c's open, as one op: beneath the root, no magic links,
     * never waiting on a FIFO (O_NONBLOCK, cleared again once STATX says
     * it is a regular file). */
    b->how.flags =
        (uint64_t)(O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (direct ? O_DIRECT : 0));
    b->how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    return b;
}

/* The file system refused O_DIRECT (an open or a read said EINVAL): every
 * later load of this backend reads buffered, and the first to find out logs
 * it, once per backend (the store is one file system, in practice). Relaxed:
 * direct_off is a hint, a racing load that misses it takes the same
 * fallback; the exchange only picks the one that logs. In ring mode this
 * runs in the reaper under sq_lock: the one line goes to the log function
 * from there (it must not call into this backend). */
void sfs_posix_direct_refused(struct posix_backend *p)
{
    if (!atomic_exchange_explicit(&p->direct_off, true, memory_order_relaxed))
        sfs_log(LOG_NOTICE,
                "posix: the store's file system refuses O_DIRECT; loads are buffered reads "
                "from now on");
}

/* Sync mode: open a block file for reading in the caller's thread; *direct
 * says whether O_DIRECT was used, *holes whether the file may have holes.
 * Returns the fd or -errno. */
int sfs_posix_open_block_read(struct posix_backend *p, const struct sfs_block_id *id, bool *direct,
                              bool *holes)
{
    char rel[PATH_REL_MAX];
    struct stat st;
    int fd = -EINVAL;

    sfs_posix_block_rel(p, id, false, rel);
    if (*direct) {
        fd = sfs_posix_open_block_file(p, rel, O_RDONLY | O_DIRECT, &st);
        if (fd == -EINVAL) {
            sfs_posix_direct_refused(p);
            *direct = false;
        }
    }
    if (fd == -EINVAL)
        fd = sfs_posix_open_block_file(p, rel, O_RDONLY, &st);
    if (fd >= 0)
        *holes = sfs_posix_may_have_holes((uint64_t)st.st_size, (uint64_t)st.st_blocks);
    return fd;
}

/* Caller holds sq_lock. Queue the read of the rest of io. False when the
 * submission queue has no entry free (the caller parks io on the pending
 * list). */
bool sfs_posix_prep_read_locked(struct posix_backend *p, struct sfs_io *io)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
    uintptr_t got = (uintptr_t)io->priv[PRIV_DONE];
    uint64_t off = (uint64_t)io->key.shard * p->be.shard_size + got;

    if (!sqe)
        return false;
    io_uring_prep_read(sqe, io_fd(io), (char *)io->buf + got, io->len - (unsigned)got, off);
    io_uring_sqe_set_data(sqe, io);
    return true;
}

/* Caller holds sq_lock. Queue b's next op. False when the submission queue
 * has no entry free. */
static bool prep_bfd_locked(struct posix_backend *p, struct block_fd *b)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&p->ring);
    unsigned tag;

    if (!sqe)
        return false;
    switch (b->step) {
    case BFD_OPEN:
        io_uring_prep_openat2(sqe, p->root_fd, b->rel, &b->how);
        /* Straight to an io-wq worker: tried inline, an open whose dentry
         * is cached would wait on the file system's open (a FUSE OPEN, an
         * NFS revalidation) in the submitter's io_uring_enter. */
        sqe->flags |= IOSQE_ASYNC;
        tag = TAG_OPEN;
        break;
    case BFD_STAT:
        /* The size and the blocks too: a file with holes (posix_path.c). */
        io_uring_prep_statx(sqe, b->fd, "", AT_EMPTY_PATH, STATX_TYPE | STATX_SIZE | STATX_BLOCKS,
                            &b->stx);
        tag = TAG_STAT;
        break;
    case BFD_FADV:
        io_uring_prep_fadvise(sqe, b->fd, 0, 0, POSIX_FADV_WILLNEED);
        tag = TAG_STEP;
        break;
    default: /* BFD_CLOSE; a READY block is never queued */
        io_uring_prep_close(sqe, b->fd);
        tag = TAG_STEP;
        break;
    }
    io_uring_sqe_set_data64(sqe, (uint64_t)(uintptr_t)b | tag);
    return true;
}

/* Caller holds sq_lock. Entries the kernel does not take now stay in the
 * ring and go with the next submit (the reaper submits after every batch). */
void sfs_posix_submit_locked(struct posix_backend *p)
{
    for (int tries = 0; tries < 64 && io_uring_sq_ready(&p->ring) > 0; tries++) {
        int ret = io_uring_submit(&p->ring);

        if (ret >= 0 || (ret != -EINTR && ret != -EAGAIN && ret != -EBUSY))
            break;
        sched_yield();
    }
}

void sfs_posix_pend_push_tail(struct posix_backend *p, struct sfs_io *io)
{
    io_set_next(io, NULL);
    if (p->pend_tail)
        io_set_next(p->pend_tail, io);
    else
        p->pend_head = io;
    p->pend_tail = io;
}

void sfs_posix_pend_push_head(struct posix_backend *p, struct sfs_io *io)
{
    io_set_next(io, p->pend_head);
    p->pend_head = io;
    if (!p->pend_tail)
        p->pend_tail = io;
}

/* Caller holds sq_lock: queue b's next op now, or park it until an entry
 * frees up (in order with the other parked opens). */
void sfs_posix_queue_bfd_locked(struct posix_backend *p, struct block_fd *b)
{
    if (!p->bpend_head && p->inflight < p->o.depth && prep_bfd_locked(p, b)) {
        p->inflight++;
        return;
    }
    b->next = NULL;
    if (p->bpend_tail)
        p->bpend_tail->next = b;
    else
        p->bpend_head = b;
    p->bpend_tail = b;
}

/* Caller holds sq_lock: move parked opens, then parked loads, into free
 * ring entries. Opens first: each is a whole block's loads waiting. */
void sfs_posix_drain_pending_locked(struct posix_backend *p)
{
    while (p->bpend_head && p->inflight < p->o.depth) {
        struct block_fd *b = p->bpend_head;

        if (!prep_bfd_locked(p, b))
            return;
        p->bpend_head = b->next;
        if (!p->bpend_head)
            p->bpend_tail = NULL;
        p->inflight++;
    }
    while (p->pend_head && p->inflight < p->o.depth) {
        struct sfs_io *io = p->pend_head;

        if (!sfs_posix_prep_read_locked(p, io))
            break;
        p->pend_head = io_next(io);
        if (!p->pend_head)
            p->pend_tail = NULL;
        p->inflight++;
    }
}

/* Caller holds sq_lock: nobody holds b any more. Its descriptor is closed
 * by an op of the ring (a close may wait on the file system: a FUSE FLUSH,
 * an NFS flush), or here in sync mode. */
static void bfd_release_locked(struct posix_backend *p, struct block_fd *b)
{
    if (b->fd < 0) {
        free(b);
    } else if (p->ring_open) {
        b->step = BFD_CLOSE;
        sfs_posix_queue_bfd_locked(p, b);
    } else {
        close(b->fd);
        free(b);
    }
}

/* Caller holds sq_lock. Drop io's reference to its block file. */
void sfs_posix_io_put_fd_locked(struct posix_backend *p, struct sfs_io *io)
{
    struct block_fd *b = io_bfd(io);

    io->priv[PRIV_FD] = NULL;
    if (b && --b->refs == 0)
        bfd_release_locked(p, b);
}

/* Caller holds sq_lock. b's open failed with err: its waiting loads finish
 * with err (onto *finished); b goes once they let go of it. */
static void bfd_fail_locked(struct posix_backend *p, struct block_fd *b, int err,
                            struct sfs_io **finished)
{
    struct sfs_io *io = b->wait_head;
    bool touch = b->touch;

    b->wait_head = b->wait_tail = NULL;
    if (err != -ENOENT)
        sfs_log(LOG_WARNING, "posix: the open of a block file failed at step %d: %d (%s)",
                (int)b->step, err, strerror(-err));
    while (io) {
        struct sfs_io *next = io_next(io);

        io->result = err;
        sfs_posix_io_put_fd_locked(p, io); /* may free b */
        io_set_next(io, *finished);
        *finished = io;
        io = next;
    }
    if (touch && --b->refs == 0)
        bfd_release_locked(p, b);
}

/* Caller holds sq_lock. b is a regular file, open without O_NONBLOCK: its
 * waiting loads go to the pending list, in their batch's order. */
static void bfd_ready_locked(struct posix_backend *p, struct block_fd *b)
{
    struct sfs_io *io = b->wait_head;

    b->step = BFD_READY;
    b->wait_head = b->wait_tail = NULL;
    while (io) {
        struct sfs_io *next = io_next(io);

        /* The mode of this open; the retries a reopen counts stay (the
         * bound on reads again of a file stale at every read). */
        io->priv[PRIV_FLAGS] =
            (void *)((io_flags(io) & ~(uintptr_t)F_DIRECT) | (b->direct ? F_DIRECT : 0));
        sfs_posix_pend_push_tail(p, io);
        io = next;
    }
}

/* Reaper, sq_lock held: the completion of one of b's steps. */
void sfs_posix_bfd_cqe_locked(struct posix_backend *p, struct block_fd *b, unsigned tag, int res,
                              struct sfs_io **finished)
{
    int fl;

    if (tag == TAG_STEP) {
        if (b->step == BFD_CLOSE) {
            free(b);
        } else if (--b->refs == 0) { /* BFD_FADV: the touch is done */
            bfd_release_locked(p, b);
        }
        return;
    }
    if (tag == TAG_OPEN) {
#ifdef SFS_TEST_HOOKS
        /* Tests: an open that fails as no local file system fails one. */
        int fail = SFS_TEST_RESULT("load:open", 0);

        if (fail < 0) {
            if (res >= 0)
                close(res);
            res = fail;
        }
#endif
        if (res == -EINVAL && b->direct) {
            /* The fs refuses O_DIRECT: remember, open again buffered. */
            sfs_posix_direct_refused(p);
            b->direct = false;
            b->how.flags &= ~(uint64_t)O_DIRECT;
            sfs_posix_queue_bfd_locked(p, b);
            return;
        }
        /* A handle another host's rename or unlink made stale (NFS; on a
         * remote store also -EIO, which GlusterFS answers for a file
         * renamed over, as to its reads: posix_load.c): look the name up
         * again; still so after the retries, a miss, never an error. */
        bool stale = res == -ESTALE || (res == -EIO && p->remote_fs);

        if (stale && b->stale < IO_RETRY_MAX) {
            b->stale++;
            sfs_posix_queue_bfd_locked(p, b);
            return;
        }
        if (res < 0) {
            bfd_fail_locked(p, b, stale ? -ENOENT : sfs_posix_errno_of_open(-res), finished);
            return;
        }
        b->fd = res;
        b->step = BFD_STAT;
        sfs_posix_queue_bfd_locked(p, b);
        return;
    }
    /* TAG_STAT: anything but a regular file (a FIFO, a device, a
     * directory) is no block we can read. */
    res = SFS_TEST_RESULT("load:stat", res);
    if (res < 0 || !S_ISREG(b->stx.stx_mode)) {
        /* A stale handle (above) at the stat: a miss too. */
        bool stale = res == -ESTALE || (res == -EIO && p->remote_fs);

        bfd_fail_locked(p, b, stale ? -ENOENT : res < 0 ? res : -EIO, finished);
        return;
    }
    /* A file system that does not say its size and blocks: asked as one
     * with holes (a read of zeros then asks SEEK_DATA). */
    b->holes = (b->stx.stx_mask & (STATX_SIZE | STATX_BLOCKS)) != (STATX_SIZE | STATX_BLOCKS) ||
               sfs_posix_may_have_holes(b->stx.stx_size, b->stx.stx_blocks);
    /* fcntl(F_SETFL) does not reach the file system: it never waits. */
    fl = fcntl(b->fd, F_GETFL);
    if (fl < 0 || fcntl(b->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        bfd_fail_locked(p, b, -errno, finished);
        return;
    }
    if (b->touch) {
        b->step = BFD_FADV;
        sfs_posix_queue_bfd_locked(p, b);
        return;
    }
    bfd_ready_locked(p, b);
}

/* Call done() of each load on the list (outside every lock: a done() may
 * submit again), then count them out of loads_active. */
void sfs_posix_finish_list(struct posix_backend *p, struct sfs_io *head)
{
    unsigned n = 0;

    while (head) {
        struct sfs_io *io = head;

        head = io_next(io);
        io->done(io); /* io is the caller's again from here */
        n++;
    }
    if (n) {
        pthread_mutex_lock(&p->sq_lock);
        p->loads_active -= n;
        if (p->loads_active == 0)
            pthread_cond_broadcast(&p->idle_cond);
        pthread_mutex_unlock(&p->sq_lock);
    }
}

int sfs_posix_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n)
{
    struct posix_backend *p = (struct posix_backend *)be;

    /* Readahead into the page cache helps buffered loads only: an O_DIRECT
     * load reads the device again, so the hint would read every touched
     * byte twice. Relaxed: see direct_refused. */
    if (p->o.direct && !atomic_load_explicit(&p->direct_off, memory_order_relaxed))
        return 0;
    if (p->ring_open) {
        /* A hint: each block's open, check, FADVISE and close are ops of
         * the ring; nothing here waits on the file system. */
        pthread_mutex_lock(&p->sq_lock);
        for (size_t i = 0; i < n; i++) {
            struct block_fd *b = sfs_posix_bfd_alloc(p, &blocks[i], false);

            if (!b)
                break;
            b->touch = true;
            b->refs = 1;
            sfs_posix_queue_bfd_locked(p, b);
        }
        sfs_posix_submit_locked(p);
        pthread_mutex_unlock(&p->sq_lock);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char rel[PATH_REL_MAX];
        int fd;

        sfs_posix_block_rel(p, &blocks[i], false, rel);
        fd = sfs_posix_open_block_file(p, rel, O_RDONLY, NULL);
        if (fd < 0)
            continue; /* a hint: absent blocks have nothing to read ahead */
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
    return 0;
}
