/* SPDX-License-Identifier: MIT */
/*
 * posix_load.c - the posix backend's loads: one batch (posix_load) opens
 * each block file once for all of its loads of that block (struct
 * block_fd, posix_ring.c) and queues its reads with one io_uring_submit;
 * one reaper thread owns the completion queue: it finishes short reads,
 * retries -EAGAIN, falls back from O_DIRECT to buffered reads when the file
 * system refuses it, reads a shard again whole from a new open on -ESTALE,
 * tops the ring up from the pending list and calls io->done outside every
 * lock, so a done() may submit again. Descriptors never outlive their
 * batch: a cached descriptor would keep reading a block file that a commit
 * has since replaced.
 * Result: len; -ENOENT when the block file is missing or ends before the
 * shard's end (a partial shard is a miss, never a short read passed on),
 * or the shard lies wholly in a hole of it (posix_path.c);
 * -EIO when it is not a regular file; else -errno.
 */
#include "posix_ring_i.h"
#include "testpoint_i.h"
#include "util_i.h"

#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool want_direct(struct posix_backend *p, const struct sfs_io *io)
{
    uint64_t off = (uint64_t)io->key.shard * p->be.shard_size;

    /* Relaxed: see direct_refused. */
    return p->o.direct && !atomic_load_explicit(&p->direct_off, memory_order_relaxed) &&
           (uintptr_t)io->buf % DIRECT_ALIGN == 0 && io->len % DIRECT_ALIGN == 0 &&
           off % DIRECT_ALIGN == 0;
}

/* Blocks a batch remembers while opening: loads of a block usually come
 * close together (a stretch of a task), so a short window finds them. */
#define OPEN_WINDOW 16

struct open_ent {
    struct sfs_block_id id;
    bool direct; /* the mode asked for */
    struct block_fd *bfd;
};

/* Hang io on b: it waits for the open (ring mode) or reads at once. */
static void bfd_attach(struct block_fd *b, struct sfs_io *io, struct sfs_io **ready,
                       struct sfs_io **ready_tail)
{
    b->refs++;
    io->priv[PRIV_FD] = b;
    io_set_next(io, NULL);
    if (b->step != BFD_READY) {
        if (b->wait_tail)
            io_set_next(b->wait_tail, io);
        else
            b->wait_head = io;
        b->wait_tail = io;
        return;
    }
    io->priv[PRIV_FLAGS] = (void *)(uintptr_t)(b->direct ? F_DIRECT : 0);
    /* Keep the batch's order: the caller put its loads in walk order. */
    if (*ready_tail)
        io_set_next(*ready_tail, io);
    else
        *ready = io;
    *ready_tail = io;
}

int sfs_posix_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct sfs_io *ready = NULL, *failed = NULL, *ready_tail = NULL;
    struct block_fd *opens = NULL, *opens_tail = NULL;
    struct open_ent win[OPEN_WINDOW];
    size_t nwin = 0, wnext = 0;
    unsigned nqueued = 0;

    /* Ring mode: nothing here waits; each block's open, its regular-file
     * check and its reads are ops of the ring. Sync mode: opens happen
     * here, outside the lock (they may wait on directory I/O). Either way
     * each block is opened once for the loads of this batch that read it. */
    for (size_t i = 0; i < n; i++) {
        struct sfs_io *io = ios[i];
        struct block_fd *bfd = NULL;
        bool direct;

        io->priv[PRIV_FD] = NULL;
        io->priv[PRIV_DONE] = (void *)0;
        io->priv[PRIV_FLAGS] = (void *)0;
        if (!io->buf || io->len == 0 || io->len > be->shard_size) {
            io->result = -EINVAL;
            io_set_next(io, failed);
            failed = io;
            continue;
        }
        direct = want_direct(p, io);
        for (size_t w = 0; w < nwin; w++) {
            if (win[w].direct == direct &&
                memcmp(&win[w].id, &io->key.block, sizeof(win[w].id)) == 0) {
                bfd = win[w].bfd;
                break;
            }
        }
        if (!bfd) {
            bool asked = direct, holes = false;
            int fd = -ENOMEM;

            if (p->ring_open) {
                bfd = sfs_posix_bfd_alloc(p, &io->key.block, direct);
                if (bfd) {
                    bfd->next = NULL;
                    if (opens_tail)
                        opens_tail->next = bfd;
                    else
                        opens = bfd;
                    opens_tail = bfd;
                }
            } else {
                fd = sfs_posix_open_block_read(p, &io->key.block, &direct, &holes);
                if (fd >= 0 && !(bfd = calloc(1, sizeof(*bfd)))) {
                    close(fd);
                    fd = -ENOMEM;
                }
                if (bfd) {
                    bfd->fd = fd;
                    bfd->step = BFD_READY;
                    bfd->direct = direct;
                    bfd->holes = holes;
                }
            }
            if (!bfd) {
                io->result = fd;
                io_set_next(io, failed);
                failed = io;
                continue;
            }
            /* Remember it under the mode asked for: the next load of the
             * block asks the same way and gets the same answer. */
            win[wnext] = (struct open_ent){.id = io->key.block, .direct = asked, .bfd = bfd};
            wnext = (wnext + 1) % OPEN_WINDOW;
            if (nwin < OPEN_WINDOW)
                nwin++;
        }
        bfd_attach(bfd, io, &ready, &ready_tail);
        nqueued++;
    }

    pthread_mutex_lock(&p->sq_lock);
    p->loads_active += nqueued;
    while (opens) {
        struct block_fd *b = opens;

        opens = b->next;
        sfs_posix_queue_bfd_locked(p, b);
    }
    while (ready) {
        struct sfs_io *io = ready;

        ready = io_next(io);
        if (p->pend_head || p->inflight >= p->o.depth || !sfs_posix_prep_read_locked(p, io))
            sfs_posix_pend_push_tail(p, io);
        else
            p->inflight++;
    }
    sfs_posix_submit_locked(p);
    pthread_mutex_unlock(&p->sq_lock);

    /* Not counted in loads_active: finished before we return. */
    while (failed) {
        struct sfs_io *io = failed;

        failed = io_next(io);
        io->done(io);
    }
    return (int)n;
}

enum cqe_verdict { CQE_FINISH, CQE_RESUBMIT, CQE_REOPEN };

/* Ring mode, sq_lock held: a block file handle of io's own (O_DIRECT as
 * io's flags say; io let go of its old one), io its only waiter, queued
 * for the reaper's OPENAT2. CQE_REOPEN, or CQE_FINISH with -ENOMEM. */
static enum cqe_verdict bfd_start_waiting(struct posix_backend *p, struct sfs_io *io)
{
    struct block_fd *b = sfs_posix_bfd_alloc(p, &io->key.block, (io_flags(io) & F_DIRECT) != 0);

    if (!b) {
        io->priv[PRIV_FD] = NULL;
        io->result = -ENOMEM;
        return CQE_FINISH;
    }
    b->refs = 1;
    io->priv[PRIV_FD] = b;
    io_set_next(io, NULL);
    b->wait_head = b->wait_tail = io;
    sfs_posix_queue_bfd_locked(p, b);
    return CQE_REOPEN;
}

/* Reaper, sq_lock held: a read answered -ESTALE (NFS: another host renamed
 * a new version over the file, or removed it, and the server dropped the
 * inode we hold). Not an error: the shard is read again, whole, from a new
 * open of the name (the new version, or a miss), at most IO_RETRY_MAX
 * times; the bytes read so far are dropped so no two versions mix. */
static enum cqe_verdict estale_reopen_locked(struct posix_backend *p, struct sfs_io *io)
{
    uintptr_t flags = io_flags(io);
    bool direct = (flags & F_DIRECT) != 0, holes = false;
    struct block_fd *b;
    int fd;

    if ((flags >> F_RETRY_SHIFT) >= IO_RETRY_MAX) {
        io->result = -ENOENT; /* still stale: a miss, never an error */
        return CQE_FINISH;
    }
    sfs_posix_io_put_fd_locked(p, io);
    io->priv[PRIV_DONE] = (void *)(uintptr_t)0;
    io->priv[PRIV_FLAGS] = (void *)(flags + (1u << F_RETRY_SHIFT));
    if (p->ring_open)
        return bfd_start_waiting(p, io);
    /* Sync mode: a blocking open under sq_lock, as the O_DIRECT fallback. */
    fd = sfs_posix_open_block_read(p, &io->key.block, &direct, &holes);
    b = fd >= 0 ? calloc(1, sizeof(*b)) : NULL;
    if (!b) {
        if (fd >= 0)
            close(fd);
        io->priv[PRIV_FD] = NULL;
        io->result = fd >= 0 ? -ENOMEM : fd;
        return CQE_FINISH;
    }
    b->fd = fd;
    b->refs = 1;
    b->step = BFD_READY;
    b->direct = direct;
    b->holes = holes;
    io->priv[PRIV_FD] = b;
    if (!direct)
        io->priv[PRIV_FLAGS] = (void *)(io_flags(io) & ~(uintptr_t)F_DIRECT);
    return CQE_RESUBMIT;
}

/* Reaper, sq_lock held: decide what one read's completion means for its
 * load. */
static enum cqe_verdict handle_cqe(struct posix_backend *p, struct sfs_io *io, int res)
{
    uintptr_t got = (uintptr_t)io->priv[PRIV_DONE];
    uintptr_t flags = io_flags(io);

    /* Tests: a read's failure a local file system never gives. */
    res = SFS_TEST_RESULT("load:read", res);
    if (res == -EAGAIN || res == -EINTR) {
        if ((flags >> F_RETRY_SHIFT) < IO_RETRY_MAX) {
            io->priv[PRIV_FLAGS] = (void *)(flags + (1u << F_RETRY_SHIFT));
            return CQE_RESUBMIT;
        }
        res = -EIO;
    }
    if (res == -EINVAL && (flags & F_DIRECT) && got == 0) {
        /* Opened O_DIRECT but the fs will not read it that way: go
         * buffered. */
        sfs_posix_direct_refused(p);
        sfs_posix_io_put_fd_locked(p,
                                   io); /* the batch's other loads of the block fall back alike */
        io->priv[PRIV_FLAGS] = (void *)(flags & ~(uintptr_t)F_DIRECT);
        if (p->ring_open) {
            /* A buffered open of its own, as an op of the ring. */
            return bfd_start_waiting(p, io);
        } else {
            /* Sync mode: a blocking open under sq_lock, at most once per
             * load in flight when the fallback is first discovered. */
            bool direct = false, holes = false;
            int fd = sfs_posix_open_block_read(p, &io->key.block, &direct, &holes);
            struct block_fd *b = fd >= 0 ? calloc(1, sizeof(*b)) : NULL;

            if (!b) {
                if (fd >= 0)
                    close(fd);
                io->result = fd >= 0 ? -ENOMEM : fd;
                return CQE_FINISH;
            }
            b->fd = fd;
            b->refs = 1;
            b->step = BFD_READY;
            b->holes = holes;
            io->priv[PRIV_FD] = b;
            return CQE_RESUBMIT;
        }
    }
    /* GlusterFS answers -EIO, not -ESTALE, to a read of a file that
     * another client renamed a new version over (shared-store.md), and -ENOENT
     * when its open-behind translator opens the file only at the first
     * read, by then renamed over: on a remote file system both are a stale
     * file too, read again from a new open (a real, lasting I/O error ends
     * as a miss after the retries). An -ENOENT after a partial read was
     * -EIO to the reader before: most likely the -EIO of the shared-store
     * suite's backend readers on GlusterFS (1 of 12 one-brick runs). */
    if (res == -ESTALE || (p->remote_fs && (res == -EIO || res == -ENOENT)))
        return estale_reopen_locked(p, io);
    if (res < 0) {
        /* Said, since the reader hears only -EIO after a partial read. */
        sfs_log(LOG_WARNING, "posix: a read of a block file failed after %lu bytes: %d (%s)",
                (unsigned long)got, res, strerror(-res));
        io->result = got ? -EIO : res;
        return CQE_FINISH;
    }
    if (res == 0) {
        /* EOF before the shard's end: the file holds no whole shard here,
         * a miss (docs/shared-store.md). A file is never written after its
         * rename, so this is a file cut short by a writer that crashed on
         * a file system without ordered renames, or a remove. */
        io->result = -ENOENT;
        return CQE_FINISH;
    }
    got += (uintptr_t)res;
    if (got >= io->len) {
        struct block_fd *b = io_bfd(io);

        /* A shard in a hole (a block file that lost the shards before one
         * written alone: posix_path.c) is a miss, not zeros. Asked only
         * of a file with holes, and of a shard that read as all zeros,
         * after the lock (holes_checked): one lseek, on the store's rare
         * sparse files. */
        io->result = (int)io->len;
        if (b && b->holes && sfs_posix_all_zero(io->buf, io->len))
            io->priv[PRIV_FLAGS] = (void *)(flags | F_HOLE);
        return CQE_FINISH;
    }
    io->priv[PRIV_DONE] = (void *)got;
    return CQE_RESUBMIT;
}

/* Reaper, without sq_lock (a seek may wait on the file system; submitters
 * never wait for it): the finished loads marked F_HOLE ask SEEK_DATA of
 * their shard's range and miss when it is a hole; then they let go of
 * their block files. */
static void holes_checked(struct posix_backend *p, struct sfs_io *finished)
{
    bool any = false;

    for (struct sfs_io *io = finished; io; io = io_next(io)) {
        if (!(io_flags(io) & F_HOLE))
            continue;
        any = true;
        if (sfs_posix_range_in_hole(io_fd(io), (uint64_t)io->key.shard * p->be.shard_size, io->len))
            io->result = -ENOENT;
    }
    if (!any)
        return;
    pthread_mutex_lock(&p->sq_lock);
    for (struct sfs_io *io = finished; io; io = io_next(io)) {
        if (io_flags(io) & F_HOLE)
            sfs_posix_io_put_fd_locked(p, io);
    }
    /* A last reference let go here queues its file's close on the ring:
     * submitted now, not left for the next load to carry (nor, at the
     * backend's close, never: the handle and its descriptor leaked). */
    sfs_posix_drain_pending_locked(p);
    sfs_posix_submit_locked(p);
    pthread_mutex_unlock(&p->sq_lock);
}

static void *reaper_main(void *arg)
{
    struct posix_backend *p = arg;
    bool stop = false;

    while (!stop) {
        struct sfs_io *finished = NULL, *resubmit = NULL;
        struct io_uring_cqe *cqe;
        unsigned head, count = 0;
        int ret = io_uring_wait_cqe(&p->ring, &cqe);

        if (ret < 0) {
            if (ret != -EINTR && ret != -EAGAIN)
                sched_yield();
            continue;
        }
        /* Under sq_lock: besides guarding the ring, it orders the
         * submitter's writes to io (made before its unlock) before our reads,
         * in terms a race detector can see (the kernel's ordering it cannot). */
        pthread_mutex_lock(&p->sq_lock);
        io_uring_for_each_cqe(&p->ring, head, cqe)
        {
            uint64_t data = io_uring_cqe_get_data64(cqe);
            unsigned tag = (unsigned)(data & TAG_MASK);
            struct sfs_io *io;

            count++;
            if (data == 0) {
                stop = true;
                continue;
            }
            if (tag != TAG_READ) {
                p->inflight--;
                sfs_posix_bfd_cqe_locked(p,
                                         (struct block_fd *)(uintptr_t)(data & ~(uint64_t)TAG_MASK),
                                         tag, cqe->res, &finished);
                continue;
            }
            io = (struct sfs_io *)(uintptr_t)data;
            switch (handle_cqe(p, io, cqe->res)) {
            case CQE_FINISH:
                p->inflight--;
                if (!(io_flags(io) & F_HOLE)) /* else holes_checked lets go of it */
                    sfs_posix_io_put_fd_locked(p, io);
                io_set_next(io, finished);
                finished = io;
                break;
            case CQE_REOPEN:
                p->inflight--;
                break;
            default:
                io_set_next(io, resubmit);
                resubmit = io;
            }
        }
        io_uring_cq_advance(&p->ring, count);
        while (resubmit) {
            struct sfs_io *io = resubmit;

            resubmit = io_next(io);
            if (!sfs_posix_prep_read_locked(p, io)) {
                p->inflight--;
                sfs_posix_pend_push_head(p, io);
            }
        }
        sfs_posix_drain_pending_locked(p);
        sfs_posix_submit_locked(p);
        if (p->inflight == 0 && !p->pend_head && !p->bpend_head)
            pthread_cond_broadcast(&p->idle_cond);
        pthread_mutex_unlock(&p->sq_lock);
        holes_checked(p, finished);

        sfs_posix_finish_list(p, finished);
    }
    return NULL;
}

int sfs_posix_reaper_start(struct posix_backend *p)
{
    sigset_t all, old;
    int ret;

    /* The reaper takes no signals: they belong to the application's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    ret = -pthread_create(&p->reaper, NULL, reaper_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return ret;
}

void sfs_posix_reaper_stop(struct posix_backend *p)
{
    struct io_uring_sqe *sqe;

    pthread_mutex_lock(&p->sq_lock);
    /* Nothing is in flight, so an entry frees up as soon as the kernel has
     * taken what the queue holds: tell the reaper to stop. */
    while (!(sqe = io_uring_get_sqe(&p->ring))) {
        io_uring_submit(&p->ring);
        sched_yield();
    }
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    sfs_posix_submit_locked(p);
    pthread_mutex_unlock(&p->sq_lock);
    pthread_join(p->reaper, NULL);
}
