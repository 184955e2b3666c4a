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
 * Block files are opened beneath the root only (posix_path.c: symlinks that
 * leave the store are refused) and without waiting (O_NONBLOCK, then a
 * regular-file check), so a FIFO or a device in the store never holds a
 * submitter; exists and shard_count see such files as absent.
 *
 * Dumps and removes (the tmp + rename commit) are posix_commit.c; naming and
 * opening a block file beneath the root is posix_path.c.
 */
#include "posix_i.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIRECT_ALIGN 4096u
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

/* The size of a block file (0 when it is absent, not a regular file, or not
 * beneath the root: no shards to serve). Returns 0 or -errno for other
 * errors. */
static int block_size(struct posix_backend *p, const struct sfs_block_id *id, uint64_t *size)
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

/* Open a block file for reading; *direct says whether O_DIRECT was used.
 * Returns the fd or -errno. */
static int open_block_read(struct posix_backend *p, const struct sfs_block_id *id, bool *direct)
{
    char rel[PATH_REL_MAX];
    int fd;

    sfs_posix_block_rel(p, id, false, rel);
    if (*direct) {
        fd = sfs_posix_open_block_file(p, rel, O_RDONLY | O_DIRECT);
        if (fd != -EINVAL)
            return fd;
        /* The fs refuses O_DIRECT: remember, go buffered. Relaxed: a hint,
         * a racing reader that misses it just takes the same fallback. */
        atomic_store_explicit(&p->direct_off, true, memory_order_relaxed);
        *direct = false;
    }
    return sfs_posix_open_block_file(p, rel, O_RDONLY);
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
