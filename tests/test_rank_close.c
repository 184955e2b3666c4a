/* SPDX-License-Identifier: MIT */
/*
 * test_rank_close.c - a rank's close leaves the application's threads
 * alone: a blocking system call of the thread that opened the rank, under
 * way while another thread closes it, is neither interrupted nor cut short.
 *
 * Why it could be: the kernel's teardown of an io_uring ring queues work,
 * with a signal-like notification (TWA_SIGNAL), to every task that ever
 * used the ring, the one that created it included. A pipe write blocked
 * halfway then returns what it wrote so far: a short write, which many
 * programs (CPython's unbuffered stdout among them) take for a lost tail.
 *
 * Key idea: the opener writes twice a pipe's capacity into an empty pipe
 * nobody reads yet: it writes one capacity and blocks. Another thread
 * closes the rank, then (after the close returned and a grace) reads the
 * pipe dry. The write must return the whole length.
 */
#include "rankenv.h"
#include "testutil.h"

#include <shardfs/rank.h>

#include <criterion/criterion.h>

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct closer {
    struct sfs_rank *rk;
    int rfd;
    atomic_bool closed;
    size_t got;
};

static void *close_then_drain(void *arg)
{
    struct closer *c = arg;
    char buf[65536];
    ssize_t n;

    usleep(200 * 1000); /* the opener is blocked in its write by now (not asserted) */
    sfs_rank_close(c->rk);
    atomic_store(&c->closed, true);
    usleep(300 * 1000); /* the teardown's work, if any, reaches the opener meanwhile */
    while ((n = read(c->rfd, buf, sizeof(buf))) > 0)
        c->got += (size_t)n;
    return NULL;
}

Test(rank_close, a_close_does_not_cut_the_openers_blocking_write, .timeout = 60)
{
    struct env e;
    int p[2];
    char spec[160];

    env_up(&e, 16, 0);
    snprintf(spec, sizeof(spec), "%s", e.dir);
    cr_assert_eq(mkdir(e.dir, 0700), 0);
    struct sfs_rank *rk = rank_here(&e, spec, 0, 0);

    cr_assert_eq(pipe(p), 0);
    int cap = fcntl(p[1], F_GETPIPE_SZ);

    cr_assert_gt(cap, 0);
    size_t len = 2 * (size_t)cap;
    char *buf = calloc(1, len);
    struct closer c = {.rk = rk, .rfd = p[0]};
    pthread_t t;

    cr_assert_not_null(buf);
    cr_assert_eq(pthread_create(&t, NULL, close_then_drain, &c), 0);
    ssize_t n = write(p[1], buf, len);

    cr_assert(atomic_load(&c.closed), "the write ended before the close");
    close(p[1]);
    pthread_join(t, NULL);
    cr_assert_eq(n, (ssize_t)len, "the opener's write was cut short at %zd of %zu bytes", n, len);
    cr_assert_eq(c.got, len);
    close(p[0]);
    free(buf);
    env_down(&e);
}
