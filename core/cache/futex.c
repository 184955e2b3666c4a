/* SPDX-License-Identifier: MIT */
/*
 * futex.c - thin wrappers over futex(2) and futex_waitv(2).
 *
 * Key idea: a wait is a re-check loop in the caller (musl's __wait): the
 * caller reads the word, decides to sleep, and passes the value it read; the
 * kernel sleeps only if the word still holds it, so a change in between is
 * never lost. These wrappers only translate deadlines and errors.
 */
#include "futex_i.h"

#include <errno.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static struct timespec *deadline_ts(int64_t deadline_ns, struct timespec *ts)
{
    if (deadline_ns <= 0)
        return NULL;
    ts->tv_sec = deadline_ns / 1000000000;
    ts->tv_nsec = deadline_ns % 1000000000;
    return ts;
}

int sfs_futex_wait(_Atomic uint32_t *word, uint32_t expect, int64_t deadline_ns)
{
    struct timespec ts;
    long r;

    /* FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout. */
    r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, expect,
                deadline_ts(deadline_ns, &ts), NULL, FUTEX_BITSET_MATCH_ANY);
    if (r < 0)
        return -errno; /* -EAGAIN: word changed; -ETIMEDOUT; -EINTR */
    return 0;
}

int sfs_futex_waitv(_Atomic uint32_t *const *words, const uint32_t *expect, size_t n,
                    _Atomic uint32_t *bell, uint32_t bell_seen, int64_t deadline_ns)
{
    struct futex_waitv w[SFS_FUTEX_WAITV_MAX];
    struct timespec ts;
    size_t k = n;
    long r;

    if (n + (bell != NULL) > SFS_FUTEX_WAITV_MAX)
        return -E2BIG;
    memset(w, 0, sizeof(w[0]) * (n + 1 > SFS_FUTEX_WAITV_MAX ? n : n + 1));
    for (size_t i = 0; i < n; i++) {
        w[i].uaddr = (uintptr_t)words[i];
        w[i].val = expect[i];
        w[i].flags = FUTEX_32; /* shared: the words are in the control plane */
    }
    if (bell) {
        /* The caller's doorbell lives in its private memory. */
        w[k].uaddr = (uintptr_t)bell;
        w[k].val = bell_seen;
        w[k].flags = FUTEX_32 | FUTEX_PRIVATE_FLAG;
        k++;
    }
    r = syscall(__NR_futex_waitv, w, (unsigned)k, 0, deadline_ts(deadline_ns, &ts),
                CLOCK_MONOTONIC);
    if (r < 0)
        return -errno; /* -EAGAIN: a word changed; -ETIMEDOUT; -EINTR */
    return 0;
}

int sfs_futex_wake_private(_Atomic uint32_t *word, int n)
{
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);

    return r < 0 ? -errno : (int)r;
}

int sfs_futex_wake(_Atomic uint32_t *word, int n)
{
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);

    return r < 0 ? -errno : (int)r;
}
