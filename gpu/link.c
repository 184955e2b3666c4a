/* SPDX-License-Identifier: MIT */
/*
 * link.c - a rank's link to the daemon: attaching to the cache the
 * configuration names (a socket, or a mount point's xattr), starting what
 * runs on it (touch hook, copier, LoadQueue, the link thread), noticing the
 * daemon go away, and attaching again on the next call (sfs_link_enter).
 *
 * Below rank.c, task.c and lookup.c (they enter and leave through it);
 * above loadqueue.c and copier.c, which it starts and stops.
 */
#include "rank_i.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/xattr.h>
#include <syslog.h>
#include <unistd.h>

static void touch_hook(const struct sfs_block_id *blocks, size_t n, void *arg)
{
    struct sfs_rank *rk = arg;

    if (rk->be)
        sfs_backend_touch(rk->be, blocks, n); /* a hint: errors do not matter */
}

/* The socket a mount point names in its xattr. */
static int socket_from_mount(const char *mnt, char *out, size_t len)
{
    ssize_t n = getxattr(mnt, SFS_XATTR_SOCKET, out, len - 1);

    if (n < 0)
        return errno == ENOTSUP ? -ENODATA : -errno;
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\0'))
        out[--n] = '\0';
    return n > 0 ? 0 : -ENODATA;
}

/* ---------------------------------------------------------------------------
 * The daemon link.
 *
 * The cache handle holds its attach connection for its whole life (the
 * daemon reaps this process when it closes). A thread polls it: when the
 * daemon exits or is killed the connection reads EOF at once, the thread
 * sets link_lost and wakes the watchers and the dispatcher, and every entry
 * in flight that still depends on the old cache fails with -ESHUTDOWN within
 * a slice (no one would reap a dead owner there any more). Loads this rank
 * owns finish from the backend as usual. The next call re-attaches to
 * whatever serves the socket path by then (sfs_link_enter), transparently.
 */

static void *link_main(void *arg)
{
    struct sfs_rank *rk = arg;
    struct pollfd pf[2] = {{.fd = sfs_cache_conn_fd(rk->cache), .events = POLLIN | POLLRDHUP},
                           {.fd = rk->link_stop_fd, .events = POLLIN}};

    for (;;) {
        if (poll(pf, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            sfs_log(LOG_ERR, "rank %d: cannot watch the daemon link: %s", rk->device_id,
                    strerror(errno));
            return NULL;
        }
        if (pf[1].revents)
            return NULL; /* stopped */
        if (pf[0].revents)
            break;
    }
    sfs_log(LOG_WARNING,
            "rank %d: the daemon went away: entries in flight fail with ESHUTDOWN; the next "
            "call attaches again",
            rk->device_id);
    /* Release: what the waits see after this store. */
    atomic_store_explicit(&rk->link_lost, true, memory_order_release);
    sfs_lq_link_lost(rk);
    return NULL;
}

static int link_start(struct sfs_rank *rk)
{
    int r;

    if (sfs_cache_conn_fd(rk->cache) < 0)
        return 0; /* not attached through a server: nothing to watch */
    rk->link_stop_fd = eventfd(0, EFD_CLOEXEC);
    if (rk->link_stop_fd < 0)
        return -errno;
    r = pthread_create(&rk->link_thread, NULL, link_main, rk);
    if (r) {
        close(rk->link_stop_fd);
        return -r;
    }
    rk->link_started = true;
    return 0;
}

void sfs_link_stop(struct sfs_rank *rk)
{
    uint64_t one = 1;

    if (!rk->link_started)
        return;
    if (write(rk->link_stop_fd, &one, sizeof(one)) < 0)
        sfs_log(LOG_ERR, "rank %d: cannot stop the link thread: %s", rk->device_id,
                strerror(errno));
    pthread_join(rk->link_thread, NULL);
    close(rk->link_stop_fd);
    rk->link_started = false;
}

/* Attach to the socket the configuration names (a mount point's xattr is
 * read anew: the daemon behind it may have restarted). */
int sfs_link_attach(struct sfs_rank *rk)
{
    char sock[PATH_MAX];
    const char *path = rk->socket_path;
    struct sfs_cache_info info;
    int r;

    if (rk->mount_point) {
        r = socket_from_mount(rk->mount_point, sock, sizeof(sock));
        if (r < 0)
            return r;
        path = sock;
    }
    rk->cache = sfs_cache_attach(path, rk->query_only ? -1 : rk->device_id, &r);
    if (!rk->cache && r == -ENOENT && rk->mount_point)
        /* The mount is here, the socket it names is not: a container that
         * has the daemon's mount but its socket directory elsewhere, or
         * not at all. The path is the daemon's, so it must be bound at the
         * same path (or socket_path configured). */
        sfs_log(LOG_ERR,
                "rank %d: %s names the socket %s, which this process does not see: bind the "
                "daemon's socket directory at the same path, or configure socket_path",
                rk->device_id, rk->mount_point, path);
    if (!rk->cache)
        return r;
    sfs_cache_info(rk->cache, &info);
    /* The shard size's one check: past it, the rank's every use is a
     * uint32_t that fits the backend's int result. */
    if (info.shard_size == 0 || info.shard_size > RANK_SHARD_MAX) {
        sfs_cache_close(rk->cache);
        rk->cache = NULL;
        return -EINVAL;
    }
    if (rk->shard_size && info.shard_size != rk->shard_size) {
        /* Re-attached to a daemon of another shard size: the backend and
         * the caller's buffers are sized for the old one. */
        sfs_log(LOG_ERR, "rank %d: the daemon now serves %llu-byte shards, not %llu", rk->device_id,
                (unsigned long long)info.shard_size, (unsigned long long)rk->shard_size);
        sfs_cache_close(rk->cache);
        rk->cache = NULL;
        return -EPROTO;
    }
    rk->shard_size = (uint32_t)info.shard_size;
    sfs_cache_set_class(rk->cache, rk->cls[0] ? rk->cls : "rank");
    return 0;
}

/* Everything that runs on the cache: touch hook, copier, threads, link. On
 * failure, what was started is stopped again. */
int sfs_link_start_engine(struct sfs_rank *rk)
{
    int r = 0;

    if (rk->be)
        sfs_cache_set_touch_hook(rk->cache, touch_hook, rk);
    if (!rk->query_only) {
        r = sfs_copier_open(rk->copier_mode, rk->device_id, rk->cache, &rk->copier);
        if (r < 0)
            return r;
        r = sfs_copier_start(rk);
        if (r == 0)
            r = sfs_lq_start(rk);
    }
    if (r == 0)
        r = link_start(rk);
    if (r < 0) {
        sfs_lq_stop(rk);
        sfs_copier_stop(rk);
        if (rk->copier)
            rk->copier->ops->close(rk->copier);
        rk->copier = NULL;
    }
    return r;
}

/* link_rw held for writing: wait for every task and prefetch in flight (those
 * on the old cache fail fast), stop the threads, close the old handle. */
static void rank_down(struct sfs_rank *rk)
{
    if (rk->down)
        return;
    pthread_mutex_lock(&rk->mu);
    while (rk->active > 0)
        pthread_cond_wait(&rk->idle_cv, &rk->mu);
    pthread_mutex_unlock(&rk->mu);
    sfs_lq_stop(rk);
    sfs_copier_stop(rk);
    sfs_link_stop(rk);
    if (rk->copier)
        rk->copier->ops->close(rk->copier);
    rk->copier = NULL;
    sfs_cache_set_touch_hook(rk->cache, NULL, NULL);
    sfs_cache_close(rk->cache);
    rk->cache = NULL;
    rk->down = true;
}

/* link_rw held for writing: attach anew and restart. */
static int rank_relink(struct sfs_rank *rk)
{
    int r;

    rank_down(rk);
    r = sfs_link_attach(rk);
    if (r < 0)
        return r;
    /* The threads are stopped: their stop flags are ours to reset. */
    rk->stopping = false;
    rk->watchers_stop = false;
    sfs_workq_restart(&rk->tq);
    sfs_workq_restart(&rk->ready);
    sfs_workq_restart(&rk->work);
    sfs_workq_restart(&rk->behind);
    /* Relaxed: the threads that read it are started below (pthread_create
     * orders this store before them); the callers hold link_rw. */
    atomic_store_explicit(&rk->link_lost, false, memory_order_relaxed);
    r = sfs_link_start_engine(rk);
    if (r < 0) {
        sfs_cache_close(rk->cache);
        rk->cache = NULL;
        return r;
    }
    rk->down = false;
    sfs_log(LOG_NOTICE, "rank %d: attached again", rk->device_id);
    return 0;
}

/* Enter a call that uses the cache: link_rw held for reading on success
 * (sfs_link_leave drops it). A lost daemon link is re-attached first; when no
 * daemon serves the socket yet, that error (-ENOENT, -ECONNREFUSED, ...) is
 * the call's, and the next call tries again. */
int sfs_link_enter(struct sfs_rank *rk)
{
    for (;;) {
        int r = 0;

        pthread_rwlock_rdlock(&rk->link_rw);
        if (!rk->down && !rank_link_lost(rk))
            return 0;
        pthread_rwlock_unlock(&rk->link_rw);
        pthread_rwlock_wrlock(&rk->link_rw);
        if (rk->down || rank_link_lost(rk))
            r = rank_relink(rk);
        pthread_rwlock_unlock(&rk->link_rw);
        if (r < 0)
            return r;
    }
}

void sfs_link_leave(struct sfs_rank *rk)
{
    pthread_rwlock_unlock(&rk->link_rw);
}
