/* SPDX-License-Identifier: MIT */
/*
 * backend_posix.c - a directory in the layout of UCM's PosixStore.
 *
 * Layout: block file <root>/data/<32 lowercase hex id> (dir_prefix=0), or
 * <root>/<first N hex chars of the id>/<32 hex id> (dir_prefix=N, 1..32);
 * shard n lives at byte offset n * shard_size. A block file is never
 * modified in place: every change is written to a temporary file of its
 * writer's own (<file>.tmp.<host>.<pid>.<seq>: posix_commit.c) and renamed
 * over the block file, so a reader that opened the block file reads one committed
 * version from start to end, and no reader ever sees a torn shard.
 *
 * Loads go through one io_uring of `depth` entries. Any thread may submit
 * (a mutex guards the submission queue); requests beyond `depth` wait on a
 * pending list, never blocking the submitter. One reaper thread owns the
 * completion queue: it finishes short reads, retries -EAGAIN, falls back
 * from O_DIRECT to buffered reads when the file system refuses it, tops the
 * ring up from the pending list and calls io->done outside every lock, so a
 * done() may submit again. A batch (one posix_load call) is queued with one
 * io_uring_submit, and opens each block file once for all of its loads of
 * that block (struct block_fd); the reaper closes it after the last of them.
 * Descriptors never outlive their batch: a cached descriptor would keep
 * reading a block file that a commit has since replaced.
 * Result: len; -ENOENT when the block file is missing or ends before the
 * shard's end (a partial shard is a miss, never a short read passed on);
 * -EIO when it is not a regular file; else -errno. -ESTALE (NFS, another
 * host replaced the file) is no answer: the shard is read again from a new
 * open (estale_reopen_locked).
 * Block files are opened beneath the root only (symlinks that leave the
 * store are refused) and without waiting (O_NONBLOCK, then a regular-file
 * check), so a FIFO or a device in the store never holds a submitter;
 * exists and shard_count see such files as absent.
 *
 * A hung file system (a network mount that stops answering) holds, in the
 * kernel, any thread that opens, stats or closes a file on it. So in ring
 * mode nothing of a load runs in the submitter's thread: each block file's
 * open is an OPENAT2 op (posix_path.c's rules: RESOLVE_BENEATH |
 * RESOLVE_NO_MAGICLINKS, O_NONBLOCK; IOSQE_ASYNC, since tried inline an
 * open of a cached dentry would wait on the file system's own open), its
 * regular-file check a STATX of the new fd, then O_NONBLOCK is cleared
 * (fcntl never reaches the file system) and the block's loads are queued
 * as READs; the last one's completion queues a CLOSE. The reaper drives
 * these steps (struct block_fd) from the completions. A touch is OPENAT2,
 * STATX, FADVISE, CLOSE. A stuck op keeps one io-wq worker and one of the
 * ring's depth entries; the load's caller gives up at its own deadline
 * (the daemon's wait_timeout). Ring mode needs those ops (Linux 5.6+;
 * probed at open, liburing 2.3 has them all); without them opens run in the
 * submitter as before (sync mode; SHARDFS_POSIX_SYNC_OPEN=1 in the
 * environment forces it, for tests). The synchronous calls (exists,
 * shard_count, list, dump, remove) get a deadline from posix_call.c.
 *
 * Dumps and removes (the tmp + rename commit) are posix_commit.c; naming and
 * opening a block file beneath the root is posix_path.c.
 */
#include "posix_i.h"
#include "cache_i.h" /* sfs_log */

#include <dirent.h>
#include <linux/openat2.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <syslog.h>
#include <unistd.h>

#define DIRECT_ALIGN 4096u
#define IO_RETRY_MAX 16

/* io->priv[] of a load, owned by this file while the load is in flight. */
enum {
    PRIV_FD = 0,   /* struct block_fd * shared by the batch's loads of a block */
    PRIV_NEXT = 1, /* pending / waiting / local list link */
    PRIV_DONE = 2, /* bytes read so far (uintptr_t) */
    PRIV_FLAGS = 3 /* F_DIRECT | retries << F_RETRY_SHIFT */
};
#define F_DIRECT      1u
#define F_RETRY_SHIFT 8

/* What a completion is for: the low two bits of its user_data (sfs_io and
 * block_fd are at least 8-byte aligned). user_data 0 (a NULL read) stops
 * the reaper. */
#define TAG_READ  0u /* struct sfs_io *: a read of a load */
#define TAG_OPEN  1u /* struct block_fd *: its OPENAT2 */
#define TAG_STAT  2u /* struct block_fd *: its STATX (a regular file?) */
#define TAG_STEP  3u /* struct block_fd *: its FADVISE (touch) or CLOSE */
#define TAG_MASK  3u

/* The steps of a block file's open (ring mode: each one an io_uring op, so
 * nothing waits in the submitter's thread). */
enum bfd_step {
    BFD_OPEN,  /* OPENAT2 queued or pending */
    BFD_STAT,  /* STATX of the new fd queued or pending */
    BFD_READY, /* a regular file, O_NONBLOCK cleared: loads read it */
    BFD_FADV,  /* touch: FADVISE(WILLNEED) queued or pending */
    BFD_CLOSE  /* CLOSE queued or pending; freed on its completion */
};

/* One open of a block file, shared by the loads of one posix_load() batch
 * that read that block the same way (O_DIRECT or not); closed when the last
 * of them finishes. Never reused across batches: a commit replaces the block
 * file by rename, and a later batch must see the new file. Set up by the
 * submitter before it is queued (published by sq_lock), then touched only
 * under sq_lock. how, rel and stx stay here until their op completes (the
 * kernel reads how/rel when it takes the entry, which may be at a later
 * submit, and writes stx at completion). */
struct block_fd {
    int fd;
    unsigned refs;      /* loads holding it; a touch holds one itself */
    enum bfd_step step;
    bool direct;        /* O_DIRECT asked of this open */
    bool touch;         /* a touch's open: FADVISE, then close */
    unsigned char stale; /* opens retried after -ESTALE (< IO_RETRY_MAX) */
    struct sfs_io *wait_head, *wait_tail; /* loads waiting for BFD_READY */
    struct block_fd *next;                /* local list / bfd pending list */
    struct open_how how;
    struct statx stx;
    char rel[PATH_REL_MAX];
};

static inline struct block_fd *io_bfd(struct sfs_io *io)
{
    return io->priv[PRIV_FD];
}

static inline int io_fd(struct sfs_io *io)
{
    struct block_fd *b = io_bfd(io);

    return b ? b->fd : -1;
}

static inline struct sfs_io *io_next(struct sfs_io *io)
{
    return io->priv[PRIV_NEXT];
}

static inline void io_set_next(struct sfs_io *io, struct sfs_io *next)
{
    io->priv[PRIV_NEXT] = next;
}

static inline uintptr_t io_flags(struct sfs_io *io)
{
    return (uintptr_t)io->priv[PRIV_FLAGS];
}

/* A block_fd, refs 0. Ring mode: step BFD_OPEN, fd -1, the open's
 * arguments filled in. Sync mode: fd is the open descriptor, BFD_READY. */
static struct block_fd *bfd_alloc(struct posix_backend *p, const struct sfs_block_id *id,
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
    b->how.flags = (uint64_t)(O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (direct ? O_DIRECT : 0));
    b->how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    return b;
}

/* The size of a block file (0 when it is absent, not a regular file, or not
 * beneath the root: no shards to serve). Returns 0 or -errno for other
 * errors. Runs on a helper thread (posix_call.c) in ring mode. */
int sfs_posix_block_size(struct posix_backend *p, const struct sfs_block_id *id, uint64_t *size)
{
    char rel[PATH_REL_MAX];
    struct stat st;
    int fd;

    sfs_posix_block_rel(p, id, false, rel);
    *size = 0;
    fd = sfs_posix_open_beneath(p, rel, O_PATH);
    if (fd < 0)
        return fd == -ENOENT || fd == -EXDEV || fd == -ELOOP ? 0 : fd;
    if (fstat(fd, &st) < 0) {
        int e = -errno;

        close(fd);
        return e;
    }
    close(fd);
    if (S_ISREG(st.st_mode))
        *size = (uint64_t)st.st_size;
    return 0;
}

/* The file system refused O_DIRECT (an open or a read said EINVAL): every
 * later load of this backend reads buffered, and the first to find out logs
 * it, once per backend (the store is one file system, in practice). Relaxed:
 * direct_off is a hint, a racing load that misses it takes the same
 * fallback; the exchange only picks the one that logs. In ring mode this
 * runs in the reaper under sq_lock: the one line goes to the log function
 * from there (it must not call into this backend). */
static void direct_refused(struct posix_backend *p)
{
    if (!atomic_exchange_explicit(&p->direct_off, true, memory_order_relaxed))
        sfs_log(LOG_NOTICE,
                "posix: the store's file system refuses O_DIRECT; loads are buffered reads "
                "from now on");
}

/* Sync mode: open a block file for reading in the caller's thread; *direct
 * says whether O_DIRECT was used. Returns the fd or -errno. */
static int open_block_read(struct posix_backend *p, const struct sfs_block_id *id, bool *direct)
{
    char rel[PATH_REL_MAX];
    int fd;

    sfs_posix_block_rel(p, id, false, rel);
    if (*direct) {
        fd = sfs_posix_open_block_file(p, rel, O_RDONLY | O_DIRECT);
        if (fd != -EINVAL)
            return fd;
        direct_refused(p);
        *direct = false;
    }
    return sfs_posix_open_block_file(p, rel, O_RDONLY);
}

static bool want_direct(struct posix_backend *p, const struct sfs_io *io)
{
    uint64_t off = (uint64_t)io->key.shard * p->be.shard_size;

    /* Relaxed: see direct_refused. */
    return p->o.direct && !atomic_load_explicit(&p->direct_off, memory_order_relaxed) &&
           (uintptr_t)io->buf % DIRECT_ALIGN == 0 && io->len % DIRECT_ALIGN == 0 &&
           off % DIRECT_ALIGN == 0;
}

/* Caller holds sq_lock. Queue the read of the rest of io. False when the
 * submission queue has no entry free (the caller parks io on the pending
 * list). */
static bool prep_read_locked(struct posix_backend *p, struct sfs_io *io)
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
        io_uring_prep_statx(sqe, b->fd, "", AT_EMPTY_PATH, STATX_TYPE, &b->stx);
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
static void submit_locked(struct posix_backend *p)
{
    for (int tries = 0; tries < 64 && io_uring_sq_ready(&p->ring) > 0; tries++) {
        int ret = io_uring_submit(&p->ring);

        if (ret >= 0 || (ret != -EINTR && ret != -EAGAIN && ret != -EBUSY))
            break;
        sched_yield();
    }
}

static void pend_push_tail(struct posix_backend *p, struct sfs_io *io)
{
    io_set_next(io, NULL);
    if (p->pend_tail)
        io_set_next(p->pend_tail, io);
    else
        p->pend_head = io;
    p->pend_tail = io;
}

static void pend_push_head(struct posix_backend *p, struct sfs_io *io)
{
    io_set_next(io, p->pend_head);
    p->pend_head = io;
    if (!p->pend_tail)
        p->pend_tail = io;
}

/* Caller holds sq_lock: queue b's next op now, or park it until an entry
 * frees up (in order with the other parked opens). */
static void queue_bfd_locked(struct posix_backend *p, struct block_fd *b)
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
static void drain_pending_locked(struct posix_backend *p)
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

        if (!prep_read_locked(p, io))
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
        queue_bfd_locked(p, b);
    } else {
        close(b->fd);
        free(b);
    }
}

/* Caller holds sq_lock. Drop io's reference to its block file. */
static void io_put_fd_locked(struct posix_backend *p, struct sfs_io *io)
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
    while (io) {
        struct sfs_io *next = io_next(io);

        io->result = err;
        io_put_fd_locked(p, io); /* may free b */
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

        io->priv[PRIV_FLAGS] = (void *)(uintptr_t)(b->direct ? F_DIRECT : 0);
        pend_push_tail(p, io);
        io = next;
    }
}

/* Reaper, sq_lock held: the completion of one of b's steps. */
static void bfd_cqe_locked(struct posix_backend *p, struct block_fd *b, unsigned tag, int res,
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
        if (res == -EINVAL && b->direct) {
            /* The fs refuses O_DIRECT: remember, open again buffered. */
            direct_refused(p);
            b->direct = false;
            b->how.flags &= ~(uint64_t)O_DIRECT;
            queue_bfd_locked(p, b);
            return;
        }
        if (res == -ESTALE && b->stale < IO_RETRY_MAX) {
            /* A handle another host's rename or unlink made stale (NFS):
             * look the name up again. */
            b->stale++;
            queue_bfd_locked(p, b);
            return;
        }
        if (res < 0) {
            bfd_fail_locked(p, b, res == -ESTALE ? -ENOENT : sfs_posix_errno_of_open(-res),
                            finished);
            return;
        }
        b->fd = res;
        b->step = BFD_STAT;
        queue_bfd_locked(p, b);
        return;
    }
    /* TAG_STAT: anything but a regular file (a FIFO, a device, a
     * directory) is no block we can read. */
    if (res < 0 || !S_ISREG(b->stx.stx_mode)) {
        bfd_fail_locked(p, b, res < 0 ? res : -EIO, finished);
        return;
    }
    /* fcntl(F_SETFL) does not reach the file system: it never waits. */
    fl = fcntl(b->fd, F_GETFL);
    if (fl < 0 || fcntl(b->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        bfd_fail_locked(p, b, -errno, finished);
        return;
    }
    if (b->touch) {
        b->step = BFD_FADV;
        queue_bfd_locked(p, b);
        return;
    }
    bfd_ready_locked(p, b);
}

/* Call done() of each load on the list (outside every lock: a done() may
 * submit again), then count them out of loads_active. */
static void finish_list(struct posix_backend *p, struct sfs_io *head)
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

static int posix_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
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
            bool asked = direct;
            int fd = -ENOMEM;

            if (p->ring_open) {
                bfd = bfd_alloc(p, &io->key.block, direct);
                if (bfd) {
                    bfd->next = NULL;
                    if (opens_tail)
                        opens_tail->next = bfd;
                    else
                        opens = bfd;
                    opens_tail = bfd;
                }
            } else {
                fd = open_block_read(p, &io->key.block, &direct);
                if (fd >= 0 && !(bfd = calloc(1, sizeof(*bfd)))) {
                    close(fd);
                    fd = -ENOMEM;
                }
                if (bfd) {
                    bfd->fd = fd;
                    bfd->step = BFD_READY;
                    bfd->direct = direct;
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
        queue_bfd_locked(p, b);
    }
    while (ready) {
        struct sfs_io *io = ready;

        ready = io_next(io);
        if (p->pend_head || p->inflight >= p->o.depth || !prep_read_locked(p, io))
            pend_push_tail(p, io);
        else
            p->inflight++;
    }
    submit_locked(p);
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

/* Reaper, sq_lock held: a read answered -ESTALE (NFS: another host renamed
 * a new version over the file, or removed it, and the server dropped the
 * inode we hold). Not an error: the shard is read again, whole, from a new
 * open of the name (the new version, or a miss), at most IO_RETRY_MAX
 * times; the bytes read so far are dropped so no two versions mix. */
static enum cqe_verdict estale_reopen_locked(struct posix_backend *p, struct sfs_io *io)
{
    uintptr_t flags = io_flags(io);
    bool direct = (flags & F_DIRECT) != 0;
    struct block_fd *b;
    int fd;

    if ((flags >> F_RETRY_SHIFT) >= IO_RETRY_MAX) {
        io->result = -ENOENT; /* still stale: a miss, never an error */
        return CQE_FINISH;
    }
    io_put_fd_locked(p, io);
    io->priv[PRIV_DONE] = (void *)(uintptr_t)0;
    io->priv[PRIV_FLAGS] = (void *)(flags + (1u << F_RETRY_SHIFT));
    if (p->ring_open) {
        b = bfd_alloc(p, &io->key.block, direct);
        if (!b) {
            io->priv[PRIV_FD] = NULL;
            io->result = -ENOMEM;
            return CQE_FINISH;
        }
        b->refs = 1;
        io->priv[PRIV_FD] = b;
        io_set_next(io, NULL);
        b->wait_head = b->wait_tail = io;
        queue_bfd_locked(p, b);
        return CQE_REOPEN;
    }
    /* Sync mode: a blocking open under sq_lock, as the O_DIRECT fallback. */
    fd = open_block_read(p, &io->key.block, &direct);
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
        direct_refused(p);
        io_put_fd_locked(p, io); /* the batch's other loads of the block fall back alike */
        io->priv[PRIV_FLAGS] = (void *)(flags & ~(uintptr_t)F_DIRECT);
        if (p->ring_open) {
            /* A buffered open of its own, as an op of the ring. */
            struct block_fd *b = bfd_alloc(p, &io->key.block, false);

            if (!b) {
                io->result = -ENOMEM;
                return CQE_FINISH;
            }
            b->refs = 1;
            io->priv[PRIV_FD] = b;
            io_set_next(io, NULL);
            b->wait_head = b->wait_tail = io;
            queue_bfd_locked(p, b);
            return CQE_REOPEN;
        } else {
            /* Sync mode: a blocking open under sq_lock, at most once per
             * load in flight when the fallback is first discovered. */
            bool direct = false;
            int fd = open_block_read(p, &io->key.block, &direct);
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
            io->priv[PRIV_FD] = b;
            return CQE_RESUBMIT;
        }
    }
    if (res == -ESTALE)
        return estale_reopen_locked(p, io);
    if (res < 0) {
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
        io->result = (int)io->len;
        return CQE_FINISH;
    }
    io->priv[PRIV_DONE] = (void *)got;
    return CQE_RESUBMIT;
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
                bfd_cqe_locked(p, (struct block_fd *)(uintptr_t)(data & ~(uint64_t)TAG_MASK),
                               tag, cqe->res, &finished);
                continue;
            }
            io = (struct sfs_io *)(uintptr_t)data;
            switch (handle_cqe(p, io, cqe->res)) {
            case CQE_FINISH:
                p->inflight--;
                io_put_fd_locked(p, io);
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
            if (!prep_read_locked(p, io)) {
                p->inflight--;
                pend_push_head(p, io);
            }
        }
        drain_pending_locked(p);
        submit_locked(p);
        if (p->inflight == 0 && !p->pend_head && !p->bpend_head)
            pthread_cond_broadcast(&p->idle_cond);
        pthread_mutex_unlock(&p->sq_lock);

        finish_list(p, finished);
    }
    return NULL;
}

/* A job of posix_call.c: the sizes of n block files. */
struct sizes_job {
    struct posix_job h;
    size_t n;
    struct sfs_block_id *ids; /* n, in this block */
    uint64_t *sizes;          /* n, in this block */
};

static int sizes_fn(struct posix_backend *p, struct posix_job *j)
{
    struct sizes_job *s = (struct sizes_job *)j;

    for (size_t i = 0; i < s->n; i++) {
        int ret = sfs_posix_block_size(p, &s->ids[i], &s->sizes[i]);

        if (ret < 0)
            return ret;
    }
    return 0;
}

/* The sizes of n block files (keys[i].block, or *block when keys is NULL),
 * on a helper with the backend's deadline (ring mode), or here. Returns 0
 * or -errno (-ETIMEDOUT: the file system did not answer in time). */
static int block_sizes(struct posix_backend *p, const struct sfs_key *keys,
                       const struct sfs_block_id *block, size_t n, uint64_t *sizes)
{
    struct sizes_job *s;
    int ret;

    if (!p->ring_open) {
        for (size_t i = 0; i < n; i++) {
            ret = sfs_posix_block_size(p, keys ? &keys[i].block : block, &sizes[i]);
            if (ret < 0)
                return ret;
        }
        return 0;
    }
    if (n > (SIZE_MAX - sizeof(*s)) / (sizeof(*s->ids) + sizeof(*s->sizes)))
        return -ENOMEM;
    s = calloc(1, sizeof(*s) + n * (sizeof(*s->ids) + sizeof(*s->sizes)));
    if (!s)
        return -ENOMEM;
    s->h.fn = sizes_fn;
    s->n = n;
    s->sizes = (uint64_t *)(s + 1);
    s->ids = (struct sfs_block_id *)(s->sizes + n);
    for (size_t i = 0; i < n; i++)
        s->ids[i] = keys ? keys[i].block : *block;
    ret = sfs_posix_call(p, &s->h);
    if (ret < 0)
        return ret; /* the job is no longer ours */
    ret = s->h.result;
    if (ret == 0)
        memcpy(sizes, s->sizes, n * sizeof(*sizes));
    sfs_posix_job_free(&s->h);
    return ret;
}

static int posix_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    struct posix_backend *p = (struct posix_backend *)be;
    uint64_t one, *sizes = n == 1 ? &one : malloc(n * sizeof(*sizes));
    int ret;

    if (!sizes)
        return -ENOMEM;
    ret = block_sizes(p, keys, NULL, n, sizes);
    for (size_t i = 0; ret == 0 && i < n; i++)
        present[i] = sizes[i] >= ((uint64_t)keys[i].shard + 1) * be->shard_size;
    if (sizes != &one)
        free(sizes);
    return ret;
}

static int posix_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct posix_backend *p = (struct posix_backend *)be;
    uint64_t size, count;
    int ret = block_sizes(p, NULL, block, 1, &size);

    if (ret < 0)
        return ret;
    count = size / be->shard_size;
    if (count == 0)
        return -ENOENT;
    return count > INT_MAX ? INT_MAX : (int)count;
}

static int posix_touch(struct sfs_backend *be, const struct sfs_block_id *blocks, size_t n)
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
            struct block_fd *b = bfd_alloc(p, &blocks[i], false);

            if (!b)
                break;
            b->touch = true;
            b->refs = 1;
            queue_bfd_locked(p, b);
        }
        submit_locked(p);
        pthread_mutex_unlock(&p->sq_lock);
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        char rel[PATH_REL_MAX];
        int fd;

        sfs_posix_block_rel(p, &blocks[i], false, rel);
        fd = sfs_posix_open_block_file(p, rel, O_RDONLY);
        if (fd < 0)
            continue; /* a hint: absent blocks have nothing to read ahead */
        posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
        close(fd);
    }
    return 0;
}

/* Visit the block files of one directory. prefix: the hex the names must
 * start with (dir_prefix layout), or NULL. */
static int list_dir(struct posix_backend *p, const char *sub, const char *prefix,
                    int (*fn)(const struct sfs_block_id *, void *), void *arg)
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
        ret = fn(&id, arg);
        if (ret)
            break;
    }
    closedir(d);
    return ret;
}

static int list_all(struct posix_backend *p, int (*fn)(const struct sfs_block_id *, void *),
                    void *arg)
{
    struct dirent *de;
    DIR *d;
    int dfd, ret = 0;

    if (p->o.dir_prefix == 0)
        return list_dir(p, "data", NULL, fn, arg);
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
        ret = list_dir(p, de->d_name, de->d_name, fn, arg);
        if (ret)
            break;
    }
    closedir(d);
    return ret;
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

static int posix_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
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

/* How long close waits for ops that are not a caller's load (a touch's
 * open, a close, a helper's call) before leaving them behind. */
#define CLOSE_GRACE_NS (500ll * 1000000)

static void posix_close(struct sfs_backend *be)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct io_uring_sqe *sqe;
    int64_t deadline;
    bool ring_idle, calls_idle;

    pthread_mutex_lock(&p->sq_lock);
    p->closing = true;
    /* Every load the caller submitted completes first (its done() touches
     * the caller's memory): as before, a load stuck in a hung file system
     * holds close; the daemon does not close a backend it abandoned loads
     * on (docs/fs.md). */
    while (p->loads_active)
        pthread_cond_wait(&p->idle_cond, &p->sq_lock);
    /* What is left is ours (a touch, a close): a grace, then leave it. */
    deadline = sfs_deadline_after(CLOSE_GRACE_NS);
    while ((p->inflight || p->pend_head || p->bpend_head) && sfs_now_ns() < deadline) {
        pthread_mutex_unlock(&p->sq_lock);
        usleep(1000);
        pthread_mutex_lock(&p->sq_lock);
    }
    ring_idle = !p->inflight && !p->pend_head && !p->bpend_head;
    pthread_mutex_unlock(&p->sq_lock);
    calls_idle = !p->ring_open || sfs_posix_call_stop(p, CLOSE_GRACE_NS);
    if (!ring_idle || !calls_idle)
        return; /* stuck in a hung file system: the struct, the ring and the
                 * root descriptor stay for those calls (posix_call.c) */

    pthread_mutex_lock(&p->sq_lock);
    /* Nothing is in flight, so an entry frees up as soon as the kernel has
     * taken what the queue holds: tell the reaper to stop. */
    while (!(sqe = io_uring_get_sqe(&p->ring))) {
        io_uring_submit(&p->ring);
        sched_yield();
    }
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    submit_locked(p);
    pthread_mutex_unlock(&p->sq_lock);
    pthread_join(p->reaper, NULL);
    io_uring_queue_exit(&p->ring);
    close(p->root_fd);
    pthread_cond_destroy(&p->idle_cond);
    pthread_mutex_destroy(&p->sq_lock);
    free(p);
}

/* Ring mode needs OPENAT2, STATX, FADVISE and CLOSE as ring ops (Linux 5.6
 * and later). */
static bool ring_can_open(struct posix_backend *p)
{
    struct io_uring_probe *pr = io_uring_get_probe_ring(&p->ring);
    bool ok = pr && io_uring_opcode_supported(pr, IORING_OP_OPENAT2) &&
              io_uring_opcode_supported(pr, IORING_OP_STATX) &&
              io_uring_opcode_supported(pr, IORING_OP_FADVISE) &&
              io_uring_opcode_supported(pr, IORING_OP_CLOSE);

    if (pr)
        io_uring_free_probe(pr);
    return ok && !getenv("SHARDFS_POSIX_SYNC_OPEN");
}

static const struct sfs_backend_ops posix_ops = {
    .name = "posix",
    .load = posix_load,
    .dump = sfs_posix_dump,
    .exists = posix_exists,
    .shard_count = posix_shard_count,
    .touch = posix_touch,
    .remove = sfs_posix_remove,
    .list = posix_list,
    .close = posix_close,
};

struct sfs_backend *sfs_posix_open(const char *root, const struct sfs_posix_opts *o,
                                   uint64_t shard_size, char *errbuf, size_t errlen, int *err)
{
    struct posix_backend *p;
    sigset_t all, old;
    struct stat st;
    int ret;

    if (o->dir_prefix > SFS_DIR_PREFIX_MAX || o->depth == 0 || o->depth > SFS_POSIX_DEPTH_MAX) {
        sfs_errf(errbuf, errlen, "posix: dir_prefix or depth out of range");
        *err = -EINVAL;
        return NULL;
    }
    p = calloc(1, sizeof(*p));
    if (!p) {
        *err = -ENOMEM;
        return NULL;
    }
    p->be.ops = &posix_ops;
    p->be.shard_size = shard_size;
    p->o = *o;
    atomic_init(&p->direct_off, false);
    sfs_posix_commit_init(p);
    p->root_fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (p->root_fd < 0) {
        ret = -errno;
        if (ret == -ENOTDIR || (stat(root, &st) == 0 && !S_ISDIR(st.st_mode)))
            sfs_errf(errbuf, errlen, "posix: '%s' is not a directory", root);
        else if (ret == -ENOENT)
            sfs_errf(errbuf, errlen, "posix: directory '%s' does not exist", root);
        else
            sfs_errf(errbuf, errlen, "posix: cannot open directory '%s' (errno %d)", root, -ret);
        goto out_free;
    }
    ret = io_uring_queue_init(o->depth, &p->ring, 0);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "posix: io_uring setup with depth=%u failed (errno %d)", o->depth,
                 -ret);
        goto out_close_root;
    }
    p->ring_open = ring_can_open(p);
    if (p->ring_open) {
        ret = sfs_posix_call_init(p);
        if (ret < 0) {
            sfs_errf(errbuf, errlen, "posix: cannot set up the helpers (errno %d)", -ret);
            goto out_exit_ring_only;
        }
    }
    pthread_mutex_init(&p->sq_lock, NULL);
    pthread_cond_init(&p->idle_cond, NULL);
    /* The reaper takes no signals: they belong to the application's threads. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    ret = -pthread_create(&p->reaper, NULL, reaper_main, p);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "posix: cannot start the completion thread (errno %d)", -ret);
        goto out_exit_ring;
    }
    return &p->be;

out_exit_ring:
    pthread_cond_destroy(&p->idle_cond);
    pthread_mutex_destroy(&p->sq_lock);
    if (p->ring_open)
        sfs_posix_call_stop(p, 0);
out_exit_ring_only:
    io_uring_queue_exit(&p->ring);
out_close_root:
    close(p->root_fd);
out_free:
    free(p);
    *err = ret;
    return NULL;
}
