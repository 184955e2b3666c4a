/* SPDX-License-Identifier: MIT */
/*
 * fswarm.h - what the warm-restart test (test_fs_warm.c) and its benchmark
 * (bench/bench_warm.c) share: the stop that writes STORE/.shardfs_usage
 * (SIGTERM, then the daemon reaped and its mount gone), saving and
 * restoring that file between mounts, and the suites' teardown.
 *
 * Header-only, over tests/fsfixture.h: each caller asserts (the test) or
 * reports (the benchmark) on the results in its own way.
 */
#ifndef SHARDFS_TESTS_FSWARM_H
#define SHARDFS_TESTS_FSWARM_H

#include "fsfixture.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/*
 * SIGTERM the daemon of m (it writes the usage file as it stops), reap it
 * within timeout_s (else SIGKILL: -ETIMEDOUT), then wait up to 5 s for the
 * mount to go. Returns the daemon's exit status (128 + signal for a
 * signal), -ETIMEDOUT, or -ECHILD when none was running.
 */
static inline int fswarm_stop_term(struct fsfx *m, double timeout_s)
{
    double t0 = fsfx_now_s();
    int st = 0;

    if (m->pid <= 0)
        return -ECHILD;
    kill(m->pid, SIGTERM);
    while (waitpid(m->pid, &st, WNOHANG) != m->pid) {
        if (fsfx_now_s() - t0 > timeout_s) {
            kill(m->pid, SIGKILL);
            waitpid(m->pid, &st, 0);
            m->pid = 0;
            return -ETIMEDOUT;
        }
        fsfx_sleep_ms(10);
    }
    m->pid = 0;
    for (int i = 0; i < 500 && fsfx_is_mounted(m->mnt); i++)
        fsfx_sleep_ms(10);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The whole file at path (malloc'd, one spare byte), its size in *len; NULL
 * with errno set when it cannot be read. */
static inline uint8_t *fswarm_slurp(const char *path, size_t *len)
{
    struct stat st;
    uint8_t *buf = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) == 0 && (buf = malloc((size_t)st.st_size + 1)) != NULL &&
        pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) {
        free(buf);
        buf = NULL;
        errno = EIO;
    }
    close(fd);
    if (buf)
        *len = (size_t)st.st_size;
    return buf;
}

/* Write buf[0, len) as the whole file at path. 0 or -errno. */
static inline int fswarm_spit(const char *path, const uint8_t *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644), r = 0;

    if (fd < 0)
        return -errno;
    if (write(fd, buf, len) != (ssize_t)len)
        r = -EIO;
    close(fd);
    return r;
}

/* A warm-restart suite's teardown: stop the daemon of m (SIGTERM, as a
 * stop that writes the usage file), unmount what is left, remove the store
 * (its path in store), the mount point, the socket and (unless
 * SFS_TEST_KEEP_LOGS) the log. */
static inline void fswarm_teardown(struct fsfx *m, const char *store)
{
    if (m->pid > 0) {
        kill(m->pid, SIGTERM);
        fsfx_stop(m, true, 10.0);
    }
    if (m->mnt[0] && fsfx_is_mounted(m->mnt))
        fsfx_sh("fusermount3 -uz %s 2>/dev/null", m->mnt);
    if (m->mnt[0] && !fsfx_is_mounted(m->mnt))
        rmdir(m->mnt);
    if (store[0])
        fsfx_sh("rm -rf %s", store);
    if (m->log[0] && !getenv("SFS_TEST_KEEP_LOGS"))
        unlink(m->log);
    if (m->sock[0])
        unlink(m->sock);
}

#endif /* SHARDFS_TESTS_FSWARM_H */
