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
 * submitter as before (sync mode; in the test and benchmark builds,
 * SFS_BENCH_BASELINES, SHARDFS_POSIX_SYNC_OPEN=1 in the environment forces
 * it: bench_cold's baseline, test_posix_direct). The synchronous calls (exists,
 * shard_count, list, dump, remove) get a deadline from posix_call.c.
 *
 * The rooms: this file is the backend's life (open, close, its ops); the
 * loads and their reaper are posix_load.c, the ring's queue and the
 * block-file opens posix_ring.c, exists / shard_count / list posix_query.c,
 * dumps and removes (the tmp + rename commit) posix_commit.c, the helpers
 * of the synchronous calls posix_call.c, naming and opening a block file
 * beneath the root posix_path.c.
 */
#include "posix_i.h"
#include "testpoint_i.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* How long close waits for ops that are not a caller's load (a touch's
 * open, a close, a helper's call) before leaving them behind. */
#define CLOSE_GRACE_NS (500ll * 1000000)

static void posix_close(struct sfs_backend *be)
{
    struct posix_backend *p = (struct posix_backend *)be;
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

    sfs_posix_reaper_stop(p);
    io_uring_queue_exit(&p->ring);
    close(p->root_fd);
    if (p->host_lock_fd >= 0)
        close(p->host_lock_fd);
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
#ifdef SFS_BENCH_BASELINES
    /* The baseline switch: opens in the submitter, as before ring mode. */
    if (getenv("SHARDFS_POSIX_SYNC_OPEN"))
        return false;
#endif
    return ok;
}

/* The ring is made, and probed, by a thread of its own that ends at
 * once. The kernel's teardown of a ring queues work with a signal-like
 * notification (TWA_SIGNAL) to every live task that used it, its creator
 * included: made in the caller's thread (an application's, opening a
 * rank), the close would interrupt whatever that thread is blocked in then
 * (a pipe write half done returns short; test_rank_close). The ring's
 * users are the backend's own threads, ended before it is torn down. */
struct ring_init_arg {
    struct posix_backend *p;
    unsigned depth;
    int ret;
};

static void *ring_init_main(void *arg)
{
    struct ring_init_arg *a = arg;

    a->ret = io_uring_queue_init(a->depth, &a->p->ring, 0);
    if (a->ret == 0)
        a->p->ring_open = ring_can_open(a->p);
    return NULL;
}

static int ring_init(struct posix_backend *p, unsigned depth)
{
    struct ring_init_arg a = {.p = p, .depth = depth};
    sigset_t all, old;
    pthread_t t;
    int r;

    sigfillset(&all); /* the application's signals are not for it */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&t, NULL, ring_init_main, &a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0)
        return -r;
    pthread_join(t, NULL);
    return a.ret;
}

static const struct sfs_backend_ops posix_ops = {
    .name = "posix",
    .load = sfs_posix_load,
    .dump = sfs_posix_dump,
    .exists = sfs_posix_exists,
    .shard_count = sfs_posix_shard_count,
    .touch = sfs_posix_touch,
    .remove = sfs_posix_remove,
    .list = sfs_posix_list,
    .close = posix_close,
    .stamp = sfs_posix_stamp,
    .scan = sfs_posix_scan,
    .evict = sfs_posix_evict,
    .lease = sfs_posix_lease,
};

struct sfs_backend *sfs_posix_open(const char *root, const struct sfs_posix_opts *o,
                                   uint64_t shard_size, char *errbuf, size_t errlen, int *err)
{
    struct posix_backend *p;
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
    p->remote_fs = sfs_posix_remote_fs(p->root_fd);
    p->host_lock_fd =
        p->remote_fs && sfs_posix_fuse_fs(p->root_fd) ? sfs_posix_host_locks_open(p) : -1;
    /* Tests: a kernel that refuses io_uring (kernel.io_uring_disabled). */
    ret = SFS_TEST_RESULT("posix:ring_init", 0);
    if (ret == 0)
        ret = ring_init(p, o->depth);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "posix: io_uring setup with depth=%u failed (errno %d)", o->depth,
                 -ret);
        goto out_close_root;
    }
    if (p->ring_open) {
        ret = SFS_TEST_RESULT("posix:call_init", 0);
        if (ret == 0)
            ret = sfs_posix_call_init(p);
        if (ret < 0) {
            sfs_errf(errbuf, errlen, "posix: cannot set up the helpers (errno %d)", -ret);
            goto out_exit_ring_only;
        }
    }
    pthread_mutex_init(&p->sq_lock, NULL);
    pthread_cond_init(&p->idle_cond, NULL);
    /* Tests: a process out of threads. */
    ret = SFS_TEST_RESULT("posix:reaper", 0);
    if (ret == 0)
        ret = sfs_posix_reaper_start(p);
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
    if (p->host_lock_fd >= 0)
        close(p->host_lock_fd);
out_free:
    free(p);
    *err = ret;
    return NULL;
}
