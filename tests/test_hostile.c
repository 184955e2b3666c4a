/* SPDX-License-Identifier: MIT */
/*
 * test_hostile.c - what the fuzz targets (tests/fuzz) found, held as plain
 * tests: control-plane words forged by an attached process, or a server that
 * is not ours, must not make a process misbehave.
 *
 * The tests forge words of a real cache's control plane the way a hostile
 * attached process could (it maps the plane read-write), or answer a real
 * sfs_cache_attach() from a fake server thread, and call the public API. Some findings are
 * undefined behaviour that an ordinary build happens to tolerate; those tests fail under
 * -DSHARDFS_SANITIZE=ON (UBSan aborts), which CI runs.
 */
#include "testutil.h"
#include "cache_i.h" /* the control plane's header and process records */

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#define SHARD 4096u

/* A second handle on c's planes, as attach_fds makes one. */
static struct sfs_cache *second_handle(struct sfs_cache *c)
{
    int ctl = fcntl(c->ctl_fd, F_DUPFD_CLOEXEC, 0), segs[64], err = 0;

    cr_assert(c->nsegments <= 64);
    cr_assert_geq(ctl, 0);
    for (uint32_t i = 0; i < c->nsegments; i++) {
        segs[i] = fcntl(c->seg_fds[i], F_DUPFD_CLOEXEC, 0);
        cr_assert_geq(segs[i], 0);
    }
    struct sfs_cache *h = sfs_cache_attach_fds(ctl, segs, c->nsegments, 0, &err);
    cr_assert_not_null(h, "attach_fds: %d", err);
    return h;
}

/* ctl_header finding: sums of forged counters overflowed int64_t (UB) in
 * sfs_cache_stats and in the fold of a detaching process's counters. They
 * are summed modulo 2^64. */
Test(hostile, forged_counters_sum_modulo_2_64, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(8, 0, SHARD);
    struct sfs_cache *h = second_handle(c);
    struct sfs_stats s;

    c->hdr->retired[CTR_REQUESTS] = INT64_MAX;
    c->hdr->retired[CTR_MISSES] = INT64_MIN;
    atomic_store(&h->self->ctr[CTR_REQUESTS], INT64_MAX);
    atomic_store(&h->self->ctr[CTR_MISSES], INT64_MIN);
    atomic_store(&c->self->ctr[CTR_REQUESTS], 0);
    atomic_store(&c->self->ctr[CTR_MISSES], 0);
    atomic_store(&c->self->ctr[CTR_UNSERVED], 0);
    atomic_store(&h->self->ctr[CTR_UNSERVED], 0);
    c->hdr->retired[CTR_UNSERVED] = 0;
    sfs_cache_stats(c, &s);
    cr_expect_eq(s.requests, (uint64_t)INT64_MAX * 2);
    cr_expect_eq(s.misses, 0); /* INT64_MIN twice wraps to 0 */
    cr_expect_eq(s.hits, 0);   /* requests - misses reads negative: 0 */

    /* The fold at detach: the same sums, into the header's totals. */
    sfs_cache_close(h);
    cr_expect_eq((uint64_t)c->hdr->retired[CTR_REQUESTS], (uint64_t)INT64_MAX * 2);
    cr_expect_eq(c->hdr->retired[CTR_MISSES], 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A hostile server (another user's socket at the daemon's path while no
 * daemon serves it: docs/security.md).
 */

/* close(), interposed for this test program: counts closes of descriptors
 * that were not open, made by the thread that watches (a double close: in a
 * rank's threads it would close whatever another thread opened meanwhile). */
static __thread bool watching;
static __thread int double_closes;

int close(int fd)
{
    long r = syscall(SYS_close, fd); /* -1 and errno, as close() */

    if (r < 0 && errno == EBADF && watching)
        double_closes++;
    return (int)r;
}

struct fake_server {
    int listen_fd;
    size_t welcome_len; /* bytes of the welcome it sends before closing */
};

/* Accept one client, read its hello, answer with the first welcome_len bytes
 * of a welcome and a memfd riding with them, and hang up. */
static void *fake_server_main(void *arg)
{
    struct fake_server *fs = arg;
    char hello[32], welcome[48];
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    int sock = accept(fs->listen_fd, NULL, NULL), fd = memfd_create("fake-ctl", MFD_CLOEXEC);

    if (sock < 0 || fd < 0 || recv(sock, hello, sizeof(hello), MSG_WAITALL) != sizeof(hello))
        return NULL;
    memset(welcome, 0, sizeof(welcome));
    memcpy(welcome, "SFSOWelc", 8);
    struct iovec iov = {.iov_base = welcome, .iov_len = fs->welcome_len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof(int));
    (void)sendmsg(sock, &msg, MSG_NOSIGNAL);
    close(fd);
    close(sock);
    return NULL;
}

/* attach_welcome finding: a welcome cut short with an fd riding on it made
 * sfs_cache_attach close that fd twice (recv_fds closed it, and the handle's
 * free closed its ctl_fd, the same slot, again). */
Test(hostile, short_welcome_closes_its_fd_once, .timeout = 30)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct fake_server fs = {.welcome_len = 8};
    const char *path = tu_path("hostile");
    pthread_t t;
    int err = 0;

    fs.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fs.listen_fd, 0);
    snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
    unlink(path);
    cr_assert_eq(bind(fs.listen_fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    cr_assert_eq(listen(fs.listen_fd, 1), 0);
    cr_assert_eq(pthread_create(&t, NULL, fake_server_main, &fs), 0);

    watching = true;
    struct sfs_cache *c = sfs_cache_attach(path, 0, &err);
    watching = false;
    pthread_join(t, NULL);
    cr_expect_null(c);
    cr_expect_eq(err, -EBADMSG, "err %d", err);
    cr_expect_eq(double_closes, 0, "%d descriptors closed twice", double_closes);
    close(fs.listen_fd);
    unlink(path);
}
