/* SPDX-License-Identifier: MIT */
/*
 * backend_posix.c - a directory in the layout of UCM's PosixStore.
 *
 * Layout: block file <root>/data/<32 lowercase hex id> (dir_prefix=0), or
 * <root>/<first N hex chars of the id>/<32 hex id> (dir_prefix=N, 1..32);
 * shard n lives at byte offset n * shard_size. A block file is never
 * modified in place: every change is written to <file>.tmp and renamed over
 * the block file, so a reader that opened the block file reads one committed
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
 * Result: len; -ENOENT when the block file is missing or ends at or before the
 * shard; -EIO when it ends inside the shard (a short read) or is not a regular
 * file; else -errno.
 * Block files are opened beneath the root only (open_beneath: symlinks that
 * leave the store are refused) and without waiting (O_NONBLOCK, then a
 * regular-file check), so a FIFO or a device in the store never holds a
 * submitter; exists and shard_count see such files as absent.
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
#include "backend_i.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define DIRECT_ALIGN 4096u
#define PATH_REL_MAX 96 /* "<32 hex>/" + "<32 hex>" + ".tmp" + NUL, with room */
#define LOCK_TRIES   100000
#define IO_RETRY_MAX 16

/* io->priv[] of a load, owned by this file while the load is in flight. */
enum {
    PRIV_FD = 0,   /* struct block_fd * shared by the batch's loads of a block */
    PRIV_NEXT = 1, /* pending / local list link */
    PRIV_DONE = 2, /* bytes read so far (uintptr_t) */
    PRIV_FLAGS = 3 /* F_DIRECT | retries << F_RETRY_SHIFT */
};
#define F_DIRECT      1u
#define F_RETRY_SHIFT 8

struct posix_backend {
    struct sfs_backend be;
    int root_fd; /* O_PATH directory; immutable after open */
    struct sfs_posix_opts o;
    struct io_uring ring;
    pthread_t reaper;

    pthread_mutex_t sq_lock;
    pthread_cond_t idle_cond; /* signalled when nothing is in flight or pending */
    unsigned inflight;        /* sq_lock: loads that hold a ring entry */
    struct sfs_io *pend_head; /* sq_lock: loads waiting for a ring entry */
    struct sfs_io *pend_tail; /* sq_lock */
    bool closing;             /* sq_lock */
    atomic_bool direct_off;   /* set once the fs refused O_DIRECT */
};

/* One open of a block file, shared by the loads of one posix_load() batch
 * that read that block the same way (O_DIRECT or not); closed when the last
 * of them finishes. Never reused across batches: a commit replaces the block
 * file by rename, and a later batch must see the new file. refs is touched by
 * the submitter before the loads are queued (published by sq_lock) and then
 * only by the reaper thread. */
struct block_fd {
    int fd;
    unsigned refs;
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

/* Drop io's reference to its block file. */
static void io_put_fd(struct sfs_io *io)
{
    struct block_fd *b = io_bfd(io);

    io->priv[PRIV_FD] = NULL;
    if (b && --b->refs == 0) {
        close(b->fd);
        free(b);
    }
}

/* A block_fd of one reference for an open fd; closes fd on failure. */
static struct block_fd *bfd_new(int fd, int *err)
{
    struct block_fd *b = malloc(sizeof(*b));

    if (!b) {
        close(fd);
        *err = -ENOMEM;
        return NULL;
    }
    b->fd = fd;
    b->refs = 1;
    return b;
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

/* Relative path of the block file (tmp: of its .tmp); returns the length of
 * the directory part, so callers can cut the path there. */
static size_t block_rel(const struct posix_backend *p, const struct sfs_block_id *id, bool tmp,
                        char out[PATH_REL_MAX])
{
    char hex[SFS_BLOCK_HEX_LEN + 1];
    size_t dlen;

    sfs_hex_encode(id, hex);
    if (p->o.dir_prefix == 0) {
        memcpy(out, "data", 4);
        dlen = 4;
    } else {
        memcpy(out, hex, p->o.dir_prefix);
        dlen = p->o.dir_prefix;
    }
    out[dlen] = '/';
    memcpy(out + dlen + 1, hex, SFS_BLOCK_HEX_LEN);
    if (tmp)
        memcpy(out + dlen + 1 + SFS_BLOCK_HEX_LEN, ".tmp", 5);
    else
        out[dlen + 1 + SFS_BLOCK_HEX_LEN] = '\0';
    return dlen;
}

static int errno_of_open(int e)
{
    /* A missing directory level is a missing block. */
    return (e == ENOENT || e == ENOTDIR) ? -ENOENT : -e;
}

/*
 * Open rel below the root, never outside it and never waiting on what is not
 * a regular file. Symlinks inside the store are followed while they resolve
 * beneath the root (openat2 RESOLVE_BENEATH): a relative link to another
 * file of the store works; an absolute link, or one that climbs above the
 * root, is -EXDEV. Kernels before 5.6 (no openat2) refuse every symlink in
 * the last component instead (O_NOFOLLOW: -ELOOP). O_NONBLOCK: a FIFO in
 * place of a block file would otherwise hold the open until a writer came.
 * Returns the fd or -errno (errno_of_open's mapping).
 */
static int open_beneath(struct posix_backend *p, const char *rel, int flags)
{
    /* openat2 refuses O_PATH with anything but O_CLOEXEC/O_DIRECTORY/
     * O_NOFOLLOW; an O_PATH open never waits anyway. */
    int extra = (flags & O_PATH) ? O_CLOEXEC : O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    struct open_how how = {
        .flags = (uint64_t)(flags | extra),
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    int fd = (int)syscall(SYS_openat2, p->root_fd, rel, &how, sizeof(how));

    if (fd < 0 && errno == ENOSYS)
        fd = openat(p->root_fd, rel, flags | extra | O_NOFOLLOW);
    return fd >= 0 ? fd : errno_of_open(errno);
}

/* open_beneath() of a block file, which must be a regular file: anything
 * else (a FIFO, a device, a directory) is no block we can read, -EIO.
 * O_NONBLOCK is cleared again on success: io_uring would otherwise answer
 * -EAGAIN for every read not already in the page cache. Returns the fd or
 * -errno. */
static int open_block_file(struct posix_backend *p, const char *rel, int flags)
{
    struct stat st;
    int fd = open_beneath(p, rel, flags), ret;

    if (fd < 0)
        return fd;
    if (fstat(fd, &st) < 0) {
        ret = -errno;
        goto out_close;
    }
    if (!S_ISREG(st.st_mode)) {
        ret = -EIO;
        goto out_close;
    }
    ret = fcntl(fd, F_GETFL);
    if (ret < 0 || fcntl(fd, F_SETFL, ret & ~O_NONBLOCK) < 0) {
        ret = -errno;
        goto out_close;
    }
    return fd;
out_close:
    close(fd);
    return ret;
}

/* The size of a block file (0 when it is absent, not a regular file, or not
 * beneath the root: no shards to serve). Returns 0 or -errno for other
 * errors. */
static int block_size(struct posix_backend *p, const struct sfs_block_id *id, uint64_t *size)
{
    char rel[PATH_REL_MAX];
    struct stat st;
    int fd;

    block_rel(p, id, false, rel);
    *size = 0;
    fd = open_beneath(p, rel, O_PATH);
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

/* Open a block file for reading; *direct says whether O_DIRECT was used.
 * Returns the fd or -errno. */
static int open_block_read(struct posix_backend *p, const struct sfs_block_id *id, bool *direct)
{
    char rel[PATH_REL_MAX];
    int fd;

    block_rel(p, id, false, rel);
    if (*direct) {
        fd = open_block_file(p, rel, O_RDONLY | O_DIRECT);
        if (fd != -EINVAL)
            return fd;
        /* The fs refuses O_DIRECT: remember, go buffered. Relaxed: a hint,
         * a racing reader that misses it just takes the same fallback. */
        atomic_store_explicit(&p->direct_off, true, memory_order_relaxed);
        *direct = false;
    }
    return open_block_file(p, rel, O_RDONLY);
}

static bool want_direct(struct posix_backend *p, const struct sfs_io *io)
{
    uint64_t off = (uint64_t)io->key.shard * p->be.shard_size;

    /* Relaxed: see open_block_read. */
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

/* Caller holds sq_lock: move pending loads into free ring entries. */
static void drain_pending_locked(struct posix_backend *p)
{
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

static void finish_list(struct sfs_io *head)
{
    while (head) {
        struct sfs_io *io = head;

        head = io_next(io);
        io_put_fd(io);
        io->done(io); /* io is the caller's again from here */
    }
}

/* Blocks a batch remembers while opening: loads of a block usually come
 * close together (a stretch of a task), so a short window finds them. */
#define OPEN_WINDOW 16

struct open_ent {
    struct sfs_block_id id;
    bool direct; /* the mode asked for */
    bool actual; /* the mode the open got */
    struct block_fd *bfd;
};

static int posix_load(struct sfs_backend *be, struct sfs_io **ios, size_t n)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct sfs_io *ready = NULL, *failed = NULL, *ready_tail = NULL;
    struct open_ent win[OPEN_WINDOW];
    size_t nwin = 0, wnext = 0;

    /* Opens happen outside the lock: they may wait on directory I/O. Each
     * block is opened once for the loads of this batch that read it. */
    for (size_t i = 0; i < n; i++) {
        struct sfs_io *io = ios[i];
        struct block_fd *bfd = NULL;
        bool direct;
        int fd;

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
                bfd->refs++;
                direct = win[w].actual;
                break;
            }
        }
        if (!bfd) {
            bool asked = direct;

            fd = open_block_read(p, &io->key.block, &direct);
            if (fd >= 0)
                bfd = bfd_new(fd, &fd);
            if (!bfd) {
                io->result = fd;
                io_set_next(io, failed);
                failed = io;
                continue;
            }
            /* Remember it under the mode asked for: the next load of the
             * block asks the same way and gets the same answer. */
            win[wnext] = (struct open_ent){
                .id = io->key.block, .direct = asked, .actual = direct, .bfd = bfd};
            wnext = (wnext + 1) % OPEN_WINDOW;
            if (nwin < OPEN_WINDOW)
                nwin++;
        }
        io->priv[PRIV_FD] = bfd;
        io->priv[PRIV_FLAGS] = (void *)(uintptr_t)(direct ? F_DIRECT : 0);
        /* Keep the batch's order: the caller put its loads in walk order. */
        io_set_next(io, NULL);
        if (ready_tail)
            io_set_next(ready_tail, io);
        else
            ready = io;
        ready_tail = io;
    }

    pthread_mutex_lock(&p->sq_lock);
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

    finish_list(failed);
    return (int)n;
}

enum cqe_verdict { CQE_FINISH, CQE_RESUBMIT };

/* Reaper: decide what one completion means for its load. */
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
        /* Opened O_DIRECT but the fs will not read it that way: go buffered
         * (a blocking open under sq_lock, at most once per load in flight
         * when the fallback is first discovered). */
        bool direct = false;
        int fd;

        /* Relaxed: see open_block_read. */
        atomic_store_explicit(&p->direct_off, true, memory_order_relaxed);
        io_put_fd(io); /* the batch's other loads of the block fall back alike */
        fd = open_block_read(p, &io->key.block, &direct);
        io->priv[PRIV_FLAGS] = (void *)(flags & ~(uintptr_t)F_DIRECT);
        if (fd >= 0)
            io->priv[PRIV_FD] = bfd_new(fd, &fd);
        if (fd < 0) {
            io->result = fd;
            return CQE_FINISH;
        }
        return CQE_RESUBMIT;
    }
    if (res < 0) {
        io->result = got ? -EIO : res;
        return CQE_FINISH;
    }
    if (res == 0) {
        /* EOF: at the shard's start the shard is absent, inside it torn. */
        io->result = got ? -EIO : -ENOENT;
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
        unsigned head, count = 0, nfinished = 0;
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
            struct sfs_io *io = io_uring_cqe_get_data(cqe);

            count++;
            if (!io) {
                stop = true;
                continue;
            }
            if (handle_cqe(p, io, cqe->res) == CQE_FINISH) {
                io_set_next(io, finished);
                finished = io;
                nfinished++;
            } else {
                io_set_next(io, resubmit);
                resubmit = io;
            }
        }
        io_uring_cq_advance(&p->ring, count);
        p->inflight -= nfinished;
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
        if (p->inflight == 0 && !p->pend_head)
            pthread_cond_broadcast(&p->idle_cond);
        pthread_mutex_unlock(&p->sq_lock);

        finish_list(finished);
    }
    return NULL;
}

/* --- dumps and removes: the tmp + rename commit --- */

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
                        size_t k, uint32_t cut_shard)
{
    char rel[PATH_REL_MAX], tmp[PATH_REL_MAX];
    uint64_t S = p->be.shard_size, keep = 0;
    size_t dlen = block_rel(p, id, false, rel);
    bool removing = ios == NULL;
    struct stat st;
    int fd, src, ret;

    block_rel(p, id, true, tmp);
    if (removing) {
        /* Nothing to cut: answer without creating a tmp (or directories). */
        if (fstatat(p->root_fd, rel, &st, 0) < 0)
            return errno_of_open(errno);
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
    src = open_block_file(p, rel, O_RDONLY);
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

static int posix_dump(struct sfs_backend *be, struct sfs_io **ios, size_t n)
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
            int ret = commit_block(p, &io->key.block, &io, 1, 0);

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
    for (size_t i = 0; i < nvalid;) {
        size_t j = i, k = 0;
        int ret;

        while (j < nvalid && memcmp(&ents[j].io->key.block, &ents[i].io->key.block,
                                    sizeof(struct sfs_block_id)) == 0)
            group[k++] = ents[j++].io;
        ret = commit_block(p, &ents[i].io->key.block, group, k, 0);
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

static int posix_remove(struct sfs_backend *be, const struct sfs_key *key)
{
    struct posix_backend *p = (struct posix_backend *)be;

    if (p->o.read_only)
        return -EROFS;
    return commit_block(p, &key->block, NULL, 0, key->shard);
}

static int posix_exists(struct sfs_backend *be, const struct sfs_key *keys, size_t n, bool *present)
{
    struct posix_backend *p = (struct posix_backend *)be;

    for (size_t i = 0; i < n; i++) {
        uint64_t size;
        int ret = block_size(p, &keys[i].block, &size);

        if (ret < 0)
            return ret;
        present[i] = size >= ((uint64_t)keys[i].shard + 1) * be->shard_size;
    }
    return 0;
}

static int posix_shard_count(struct sfs_backend *be, const struct sfs_block_id *block)
{
    struct posix_backend *p = (struct posix_backend *)be;
    uint64_t size, count;
    int ret = block_size(p, block, &size);

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

    for (size_t i = 0; i < n; i++) {
        char rel[PATH_REL_MAX];
        int fd;

        block_rel(p, &blocks[i], false, rel);
        fd = open_block_file(p, rel, O_RDONLY);
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

static int posix_list(struct sfs_backend *be, int (*fn)(const struct sfs_block_id *, void *),
                      void *arg)
{
    struct posix_backend *p = (struct posix_backend *)be;
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

static void posix_close(struct sfs_backend *be)
{
    struct posix_backend *p = (struct posix_backend *)be;
    struct io_uring_sqe *sqe;

    pthread_mutex_lock(&p->sq_lock);
    p->closing = true;
    while (p->inflight || p->pend_head)
        pthread_cond_wait(&p->idle_cond, &p->sq_lock);
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

static const struct sfs_backend_ops posix_ops = {
    .name = "posix",
    .load = posix_load,
    .dump = posix_dump,
    .exists = posix_exists,
    .shard_count = posix_shard_count,
    .touch = posix_touch,
    .remove = posix_remove,
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
    io_uring_queue_exit(&p->ring);
out_close_root:
    close(p->root_fd);
out_free:
    free(p);
    *err = ret;
    return NULL;
}
