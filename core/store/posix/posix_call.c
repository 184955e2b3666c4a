/* SPDX-License-Identifier: MIT */
/*
 * posix_call.c - the posix backend's synchronous calls, each with a
 * deadline: a helper thread makes the system calls, the caller waits for it
 * at most the backend's timeout (timeout_ms: the daemon's wait_timeout, a
 * rank's key_timeout_ms).
 *
 * Why: a block file on a file system that stops answering (a hung network
 * mount, a FUSE server that never replies) blocks whatever thread calls
 * openat(), fstatat() or readdir() on it, for good. Loads never make such a
 * call in the caller's thread (backend_posix.c puts them in the ring); the
 * synchronous calls (exists, shard_count, list) come here instead, so the
 * caller (a FUSE worker answering a lookup, a rank's lookup) gets -ETIMEDOUT
 * at its deadline and the stuck call is left to its helper.
 *
 * A job is one malloc'ed block holding everything the helper touches (its
 * inputs copied, its outputs), so a caller that gave up owes it nothing:
 * the helper frees an abandoned job when the call finally returns. Helpers
 * are started on demand, at most POSIX_HELPERS_MAX at once, and end after
 * HELPER_IDLE_NS without work. Bound: at most POSIX_HELPERS_MAX calls can be
 * stuck at once (each holds its helper); with all of them stuck, later calls
 * wait in the queue and get -ETIMEDOUT at their deadline, without starting
 * anything, until a stuck call returns. A job still queued at its deadline
 * is taken off the queue by its caller. Nothing is left running when every
 * call returned: posix_close() waits a short grace for busy helpers and,
 * when some are still stuck, leaves the backend's memory and root
 * descriptor to them (a leak bounded by one backend, never freed while a
 * helper may use it).
 *
 * A job runs at its caller's nice value: a rank's write-behind store writes
 * come from threads it runs at a lower priority, and their commits must not
 * run at the application's. Linux keeps a nice value per thread, a helper
 * inherits its creator's, and an unprivileged thread cannot lower its own
 * again once raised: so a helper keeps the nice it was started with and
 * takes only jobs of that nice, and a call starts a helper (inheriting its
 * own) when none of its nice is idle. One exception keeps the bound: when
 * all POSIX_HELPERS_MAX helpers are of other nice values, the first idle one
 * takes the job rather than letting it time out.
 */
#include "posix_i.h"
#include "testpoint_i.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#define HELPER_IDLE_NS (5ll * 1000000000)

enum { JOB_QUEUED, JOB_RUNNING, JOB_COMMITTING, JOB_DONE, JOB_ABANDONED };

static void ts_of(int64_t ns, struct timespec *ts)
{
    ts->tv_sec = (time_t)(ns / 1000000000);
    ts->tv_nsec = (long)(ns % 1000000000);
}

void sfs_posix_job_free(struct posix_job *j)
{
    if (j->drop)
        j->drop(j);
    free(j);
}

/* The calling thread's nice value, as an index of call_*_at (0 .. 39). */
static int nice_index(void)
{
    int n;

    errno = 0;
    n = getpriority(PRIO_PROCESS, 0); /* Linux: the calling thread's */
    if (n == -1 && errno)
        n = 0;
    n += 20;
    return n < 0 ? 0 : n >= POSIX_NICE_LEVELS ? POSIX_NICE_LEVELS - 1 : n;
}

/* The first queued job a helper of nice index `at` takes, unlinked; NULL when
 * none: one of its own nice, else one whose nice no helper has. */
static struct posix_job *take_job(struct posix_backend *p, int at)
{
    struct posix_job **pp, *prev = NULL, **orphan = NULL, *orphan_prev = NULL, *j;

    for (pp = &p->call_head; *pp; prev = *pp, pp = &(*pp)->next) {
        if ((*pp)->nice == at)
            break;
        if (!orphan && p->call_alive_at[(*pp)->nice] == 0) {
            orphan = pp;
            orphan_prev = prev;
        }
    }
    if (!*pp) {
        if (!orphan)
            return NULL;
        pp = orphan;
        prev = orphan_prev;
    }
    j = *pp;
    *pp = j->next;
    if (p->call_tail == j)
        p->call_tail = prev;
    return j;
}

/* A helper's start: counted in call_alive_at[at] by the call that starts it,
 * whose nice the helper inherits. */
struct helper_start {
    struct posix_backend *p;
    int at;
};

static void *helper_main(void *arg)
{
    struct helper_start *hs = arg;
    struct posix_backend *p = hs->p;
    int at = hs->at;

    free(hs);
    pthread_mutex_lock(&p->call_lock);
    for (;;) {
        struct posix_job *j;
        int r;

        while (!(j = take_job(p, at)) && !p->call_stop) {
            struct timespec ts;
            int e;

            /* CLOCK_MONOTONIC: call_cond is set up with it (posix_call_init). */
            ts_of(sfs_now_ns() + HELPER_IDLE_NS, &ts);
            p->call_idle_at[at]++;
            e = pthread_cond_timedwait(&p->call_cond, &p->call_lock, &ts);
            p->call_idle_at[at]--;
            if (e == ETIMEDOUT && !(j = take_job(p, at)))
                goto out;
            if (j)
                break;
        }
        if (!j)
            goto out; /* stopping */
        j->state = JOB_RUNNING;
        pthread_mutex_unlock(&p->call_lock);

        r = j->fn(p, j);

        pthread_mutex_lock(&p->call_lock);
        if (j->state == JOB_ABANDONED) {
            pthread_mutex_unlock(&p->call_lock);
            sfs_posix_job_free(j);
            pthread_mutex_lock(&p->call_lock);
            continue;
        }
        j->result = r;
        j->state = JOB_DONE;
        pthread_cond_broadcast(&p->call_done);
    }
out:
    p->call_alive_at[at]--;
    p->call_threads--;
    pthread_cond_broadcast(&p->call_done);
    pthread_mutex_unlock(&p->call_lock);
    return NULL;
}

/* Start a helper at the calling thread's nice (index `at`), under
 * call_lock: true when it runs. */
static bool start_helper(struct posix_backend *p, int at)
{
    struct helper_start *hs = malloc(sizeof(*hs));
    sigset_t all, old;
    pthread_attr_t attr;
    pthread_t t;
    bool ok;

    if (!hs)
        return false;
    *hs = (struct helper_start){p, at};
    /* Helpers take no signals (they belong to the application's threads)
     * and are never joined: one may be stuck for good. */
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* Tests: a process out of threads ("call:helper"). */
    ok = SFS_TEST_RESULT("call:helper", 0) == 0 && pthread_create(&t, &attr, helper_main, hs) == 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (!ok) {
        free(hs);
        return false;
    }
    p->call_threads++;
    p->call_alive_at[at]++;
    return true;
}

int sfs_posix_call_init(struct posix_backend *p)
{
    pthread_condattr_t ca;
    int ret;

    ret = -pthread_condattr_init(&ca);
    if (ret < 0)
        return ret;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    ret = -pthread_cond_init(&p->call_cond, &ca);
    if (ret == 0) {
        ret = -pthread_cond_init(&p->call_done, &ca);
        if (ret < 0)
            pthread_cond_destroy(&p->call_cond);
    }
    pthread_condattr_destroy(&ca);
    if (ret < 0)
        return ret;
    pthread_mutex_init(&p->call_lock, NULL);
    return 0;
}

int sfs_posix_call(struct posix_backend *p, struct posix_job *j)
{
    int64_t deadline = sfs_deadline_after((int64_t)p->o.timeout_ms * 1000000);
    struct timespec ts;
    bool extended = false;
    int ret = 0;

    j->state = JOB_QUEUED;
    j->next = NULL;
    j->nice = nice_index();
    pthread_mutex_lock(&p->call_lock);
    if (p->call_tail)
        p->call_tail->next = j;
    else
        p->call_head = j;
    p->call_tail = j;
    if (p->call_idle_at[j->nice] > 0 || p->call_threads >= POSIX_HELPERS_MAX ||
        !start_helper(p, j->nice)) {
        /* Every idle helper looks: one of the job's nice takes it, or any
         * one when no helper has its nice. */
        pthread_cond_broadcast(&p->call_cond);
    }
    ts_of(deadline, &ts);
    while (j->state != JOB_DONE) {
        if (p->call_threads == 0 && j->state == JOB_QUEUED) {
            ret = -EAGAIN; /* no helper could be started */
            break;
        }
        if (pthread_cond_timedwait(&p->call_done, &p->call_lock, &ts) == ETIMEDOUT &&
            j->state != JOB_DONE) {
            if (j->state == JOB_COMMITTING && !extended) {
                /* Past its point of no return: the answer must say what
                 * happened, so wait for it once more. */
                extended = true;
                ts_of(sfs_deadline_after((int64_t)p->o.timeout_ms * 1000000), &ts);
                continue;
            }
            ret = -ETIMEDOUT;
            break;
        }
    }
    if (ret < 0 && j->state == JOB_QUEUED) {
        /* Never started: off the queue, ours to free. */
        struct posix_job **pp = &p->call_head, *prev = NULL;

        while (*pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = j->next;
        if (p->call_tail == j)
            p->call_tail = prev;
        pthread_mutex_unlock(&p->call_lock);
        sfs_posix_job_free(j);
        return ret;
    }
    if (ret < 0) {
        /* Running, stuck: its helper frees it when the call returns. */
        j->state = JOB_ABANDONED;
        pthread_mutex_unlock(&p->call_lock);
        return ret;
    }
    pthread_mutex_unlock(&p->call_lock);
    return 0;
}

bool sfs_posix_call_commit(struct posix_backend *p, struct posix_job *j)
{
    bool go;

    pthread_mutex_lock(&p->call_lock);
    go = j->state == JOB_RUNNING;
    if (go)
        j->state = JOB_COMMITTING;
    pthread_mutex_unlock(&p->call_lock);
    return go;
}

bool sfs_posix_call_stop(struct posix_backend *p, int64_t grace_ns)
{
    int64_t deadline = sfs_deadline_after(grace_ns);
    struct timespec ts;
    bool idle;

    ts_of(deadline, &ts);
    pthread_mutex_lock(&p->call_lock);
    p->call_stop = true;
    pthread_cond_broadcast(&p->call_cond);
    while (p->call_threads > 0 &&
           pthread_cond_timedwait(&p->call_done, &p->call_lock, &ts) != ETIMEDOUT)
        ;
    idle = p->call_threads == 0;
    pthread_mutex_unlock(&p->call_lock);
    if (idle) {
        pthread_cond_destroy(&p->call_cond);
        pthread_cond_destroy(&p->call_done);
        pthread_mutex_destroy(&p->call_lock);
    }
    return idle;
}
