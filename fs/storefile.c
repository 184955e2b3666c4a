/* SPDX-License-Identifier: MIT */
/*
 * storefile.c - the files the daemon reads and writes by name in the store
 * directory (the usage file), each within a deadline.
 *
 * The store may sit on a file system that stops answering (a hard-mounted
 * network file system that lost its server): an open() there waits until
 * the server comes back, and a daemon that opened its usage file on its
 * start or stop path would never mount, or never exit. So the open and the
 * read or write run on a thread of their own, and the caller waits for it
 * only until its deadline: past it the call answers -ETIMEDOUT and the
 * thread is abandoned. An abandoned thread owns its job (path, buffer) and
 * frees it whenever the store answers; it blocks every signal, so the stop
 * signals go to the daemon's own threads, and the exit ends it.
 *
 * A write while an abandoned one is still in the store is refused (-EBUSY):
 * both would use the same temporary name. Reads open O_NONBLOCK |
 * O_NOFOLLOW and use only a regular file; writes create the temporary file
 * O_CREAT | O_EXCL (what was at its name is unlinked, never opened), fsync
 * it, rename it over the name and fsync the directory.
 *
 * Calls nothing of the daemon; usage.c calls it.
 */
#include "fs_i.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct sf_job {
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC: done was set */
    bool done;           /* lock: the thread is through with the store */
    bool abandoned;      /* lock: the caller left; the thread frees the job */
    bool write;
    int ret;
    const char *why; /* a read's reason for -EINVAL (a static string) */
    uint8_t *buf;    /* read: the file (malloc'd); write: the bytes, owned */
    size_t len;
    uint64_t max; /* read: the largest file used */
    char path[PATH_MAX];
};

/* Abandoned writes still in the store. Relaxed: a count, read to refuse a
 * second write while one is stuck; nothing else is ordered by it. */
static atomic_uint sf_stuck;

/* Open, check and read a file of at most job->max bytes. */
static int sf_read(struct sf_job *j)
{
    int fd = open(j->path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    struct stat st;
    size_t got = 0;
    int r = -EINVAL;

    j->why = "unreadable";
    if (fd < 0) {
        if (errno == ELOOP)
            j->why = "not a regular file";
        return errno == ENOENT ? -ENOENT : -EINVAL;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        j->why = "not a regular file";
        goto out;
    }
    if ((uint64_t)st.st_size > j->max) {
        j->why = "larger than any usage file";
        goto out;
    }
    j->len = (size_t)st.st_size;
    j->buf = malloc(j->len ? j->len : 1);
    if (!j->buf) {
        j->why = "no memory";
        goto out;
    }
    while (got < j->len) {
        ssize_t k = read(fd, j->buf + got, j->len - got);

        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    if (got != j->len) {
        j->why = "truncated";
        goto out;
    }
    r = 0;
out:
    close(fd);
    return r;
}

static int write_all(int fd, const uint8_t *b, size_t n)
{
    while (n) {
        ssize_t k = write(fd, b, n);

        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

/* Create tmp exclusively: whatever a crash, or anyone, left at the name (a
 * FIFO that would hold the open, a symlink that would redirect the write)
 * is unlinked first, never opened. Returns the fd or -errno. */
static int create_tmp(const char *tmp)
{
    for (int tries = 0; tries < 2; tries++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);

        if (fd >= 0)
            return fd;
        if (errno != EEXIST || unlink(tmp) < 0)
            return -errno;
    }
    return -EEXIST;
}

/* tmp + fsync + rename + fsync of the directory. */
static int sf_write(struct sf_job *j)
{
    char tmp[PATH_MAX + 8], dir[PATH_MAX];
    char *slash;
    int fd, r;

    snprintf(tmp, sizeof(tmp), "%s.tmp", j->path);
    fd = create_tmp(tmp);
    r = fd < 0 ? fd : write_all(fd, j->buf, j->len);
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    if (fd >= 0)
        close(fd);
    if (r == 0 && rename(tmp, j->path) < 0)
        r = -errno;
    if (r < 0) {
        unlink(tmp);
        return r;
    }
    snprintf(dir, sizeof(dir), "%s", j->path);
    slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        fd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd >= 0) {
            fsync(fd); /* the rename is durable; a failure here loses nothing else */
            close(fd);
        }
    }
    return 0;
}

static void job_free(struct sf_job *j)
{
    pthread_cond_destroy(&j->cond);
    pthread_mutex_destroy(&j->lock);
    free(j->buf);
    free(j);
}

static void *sf_main(void *arg)
{
    struct sf_job *j = arg;
    sigset_t all;
    bool abandoned;
    int r;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    r = j->write ? sf_write(j) : sf_read(j);
    pthread_mutex_lock(&j->lock);
    j->ret = r;
    j->done = true;
    abandoned = j->abandoned;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->lock);
    if (abandoned) {
        if (j->write)
            atomic_fetch_sub_explicit(&sf_stuck, 1, memory_order_relaxed);
        job_free(j);
    }
    return NULL;
}

static struct sf_job *job_new(const char *path)
{
    struct sf_job *j = calloc(1, sizeof(*j));
    pthread_condattr_t ca;

    if (!j)
        return NULL;
    if (snprintf(j->path, sizeof(j->path), "%s", path) >= (int)sizeof(j->path)) {
        free(j);
        return NULL;
    }
    pthread_mutex_init(&j->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cond, &ca);
    pthread_condattr_destroy(&ca);
    return j;
}

/* Run j on a detached thread and wait until it is done or timeout_ns
 * passed. 0: done (the caller frees j); -ETIMEDOUT: abandoned (the thread
 * frees it); -errno: no thread (the caller frees j). */
static int job_run(struct sf_job *j, int64_t timeout_ns)
{
    pthread_attr_t a;
    pthread_t t;
    struct timespec ts;
    int r;

    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    r = pthread_create(&t, &a, sf_main, j);
    pthread_attr_destroy(&a);
    if (r)
        return -r;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(timeout_ns / 1000000000);
    ts.tv_nsec += (long)(timeout_ns % 1000000000);
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&j->lock);
    while (!j->done && pthread_cond_timedwait(&j->cond, &j->lock, &ts) != ETIMEDOUT)
        ;
    if (!j->done) {
        j->abandoned = true;
        if (j->write)
            atomic_fetch_add_explicit(&sf_stuck, 1, memory_order_relaxed);
        pthread_mutex_unlock(&j->lock);
        return -ETIMEDOUT;
    }
    pthread_mutex_unlock(&j->lock);
    return 0;
}

int fs_store_file_read(const char *path, uint64_t max, int64_t timeout_ns, uint8_t **buf,
                       size_t *len, const char **why)
{
    struct sf_job *j = job_new(path);
    int r;

    *why = "unreadable";
    if (!j)
        return -EINVAL;
    j->max = max;
    r = job_run(j, timeout_ns);
    if (r == -ETIMEDOUT) {
        *why = "the store did not answer in time";
        return r;
    }
    if (r == 0)
        r = j->ret;
    if (r == 0) {
        *buf = j->buf;
        *len = j->len;
        j->buf = NULL;
    } else if (r != -ENOENT) {
        *why = j->why;
        r = -EINVAL;
    }
    job_free(j);
    return r;
}

int fs_store_file_replace(const char *path, uint8_t *buf, size_t len, int64_t timeout_ns)
{
    struct sf_job *j;
    int r;

    if (atomic_load_explicit(&sf_stuck, memory_order_relaxed)) {
        free(buf);
        return -EBUSY;
    }
    j = job_new(path);
    if (!j) {
        free(buf);
        return -ENAMETOOLONG;
    }
    j->write = true;
    j->buf = buf;
    j->len = len;
    r = job_run(j, timeout_ns);
    if (r == -ETIMEDOUT)
        return r;
    if (r == 0)
        r = j->ret;
    job_free(j);
    return r;
}
