/* SPDX-License-Identifier: MIT */
/*
 * session.c - the threads that keep the daemon alive and the ones that end
 * it: the reaper, the session loop's own thread, the stop signals, and
 * daemonizing.
 *
 * The session loop runs in a thread of its own, so that a stop never waits
 * on a handler stuck in the backend: libfuse's loop joins every worker
 * before it returns, and a worker inside a handler cannot be cancelled.
 * Only that thread takes the stop signals (libfuse's handler ends the
 * session; its workers block them, and so does every other thread here), so
 * the signal interrupts the loop's own wait, and main() waits for the loop
 * with a bound (fs_loop_wait). Without -f the process forks first and the
 * parent waits on a pipe for the child's verdict (fs_daemonize_start, _done).
 * main() drives all of it; this room calls only log.c.
 */
#include "fs_i.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void fs_stop_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGQUIT);
}

/* Every ~200 ms, finishes any reap the attach server started and could not
 * finish (the server reaps a rank as soon as its connection closes). */
static void *reaper_main(void *arg)
{
    struct fs_reaper *r = arg;

    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += REAP_INTERVAL_NS;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->cond, &r->lock, &ts);
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->lock);
        sfs_cache_reap(r->cache);
        pthread_mutex_lock(&r->lock);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

/* Start fn(arg) in *thread with its lock and its CLOCK_MONOTONIC condition
 * made first (and destroyed again when the thread cannot start). 0 or -errno. */
static int thread_start(pthread_t *thread, pthread_mutex_t *lock, pthread_cond_t *cond,
                        void *(*fn)(void *), void *arg)
{
    pthread_condattr_t ca;
    int e;

    pthread_mutex_init(lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(cond, &ca);
    pthread_condattr_destroy(&ca);
    e = pthread_create(thread, NULL, fn, arg);
    if (e) {
        pthread_cond_destroy(cond);
        pthread_mutex_destroy(lock);
    }
    return -e;
}

int fs_reaper_start(struct fs_reaper *r, struct sfs_cache *c)
{
    r->cache = c;
    r->stop = false;
    return thread_start(&r->thread, &r->lock, &r->cond, reaper_main, r);
}

void fs_reaper_stop(struct fs_reaper *r)
{
    pthread_mutex_lock(&r->lock);
    r->stop = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
}

static void *loop_main(void *arg)
{
    struct fs_session_loop *l = arg;
    struct fuse_loop_config *lc;
    sigset_t stopsigs;
    int err;

    fs_stop_signals(&stopsigs);
    pthread_sigmask(SIG_UNBLOCK, &stopsigs, NULL);
    if (l->single) {
        err = fuse_session_loop(l->se);
    } else {
        lc = fuse_loop_cfg_create();
        if (!lc) {
            err = -ENOMEM;
        } else {
            fuse_loop_cfg_set_clone_fd(lc, l->clone_fd);
            if (l->max_idle_threads != UINT_MAX)
                fuse_loop_cfg_set_idle_threads(lc, l->max_idle_threads);
            fuse_loop_cfg_set_max_threads(lc, l->max_threads);
            err = fuse_session_loop_mt(l->se, lc);
            fuse_loop_cfg_destroy(lc);
        }
    }
    pthread_sigmask(SIG_BLOCK, &stopsigs, NULL);
    pthread_mutex_lock(&l->lock);
    l->err = err;
    l->done = true;
    pthread_cond_signal(&l->cond);
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

int fs_loop_start(struct fs_session_loop *l)
{
    l->done = false;
    l->err = 0;
    return thread_start(&l->thread, &l->lock, &l->cond, loop_main, l);
}

/* Wait for the loop to end. Once the session has exited (a signal, an
 * unmount), wait at most grace_ns more for libfuse to join its workers.
 * True: the loop returned and was joined (l->err, l->grace_left_ns are
 * set). False: a handler is still running after the grace; the loop thread
 * is left as it is. Bound: wakes every 100 ms to look at the session. */
bool fs_loop_wait(struct fs_session_loop *l, int64_t grace_ns)
{
    int64_t stop_at = 0; /* when the session was seen to exit, + grace */
    bool done;

    pthread_mutex_lock(&l->lock);
    while (!l->done) {
        int64_t now = sfs_now_ns(), until = now + 100 * 1000000ll;
        struct timespec ts;

        if (!stop_at && fuse_session_exited(l->se))
            stop_at = now + grace_ns;
        if (stop_at && now >= stop_at)
            break;
        if (stop_at && until > stop_at)
            until = stop_at;
        ts.tv_sec = until / 1000000000;
        ts.tv_nsec = until % 1000000000;
        pthread_cond_timedwait(&l->cond, &l->lock, &ts);
    }
    done = l->done;
    pthread_mutex_unlock(&l->lock);
    if (!done)
        return false;
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->cond);
    pthread_mutex_destroy(&l->lock);
    if (!stop_at) /* unmounted: the loop ended before we looked */
        stop_at = sfs_now_ns() + grace_ns;
    l->grace_left_ns = stop_at > sfs_now_ns() ? stop_at - sfs_now_ns() : 0;
    return true;
}

/* Fork; the parent waits for the child's verdict and exits with it. Returns
 * the write end of the pipe in the child. */
int fs_daemonize_start(void)
{
    int p[2];
    pid_t pid;
    char status = 1;

    if (pipe2(p, O_CLOEXEC) < 0) {
        fprintf(stderr, "shardfs: pipe: %s\n", strerror(errno));
        exit(1);
    }
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "shardfs: fork: %s\n", strerror(errno));
        exit(1);
    }
    if (pid > 0) {
        close(p[1]);
        if (read(p[0], &status, 1) != 1)
            status = 1; /* the child died before it was ready */
        FS_COVERAGE_DUMP();
        _exit(status);
    }
    close(p[0]);
    setsid();
    return p[1];
}

/* The child is mounted and serving: detach from the terminal, release the
 * parent with status 0. */
void fs_daemonize_done(int fd)
{
    char ok = 0;
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);

    if (chdir("/") < 0) {
        /* harmless: nothing here uses relative paths any more */
    }
    if (nul >= 0) {
        dup2(nul, 0);
        dup2(nul, 1);
        dup2(nul, 2);
        if (nul > 2)
            close(nul);
    }
    fs_log_to_syslog();
    if (write(fd, &ok, 1) != 1) {
        /* the parent is gone: nobody to tell */
    }
    close(fd);
}
