/* SPDX-License-Identifier: MIT */
/*
 * test_attach_server.c - the attach server against clients that do not
 * speak as they should: one that connects and says nothing, many of them,
 * one whose hello is not a hello, one cut short, one that sends bytes after
 * its welcome. A silent client delays no one (a real attach beside it is
 * welcomed) and is refused -ETIMEDOUT at its hello deadline; a uid has at
 * most 64 hellos pending (the 65th connection, and a real attach, are
 * refused -EUSERS until they go); a hello of another magic is -EBADMSG, of
 * another protocol -EPROTO, a short one ended by EOF -EBADMSG; bytes after
 * the hello end that attachment (its process record is reaped).
 *
 * The clients are raw Unix sockets of this process speaking the wire
 * format of attach_i.h; the server is a cache's, in this process too. A
 * test that holds hellos pending lengthens the server's hello deadline
 * (the test build's SHARDFS_TEST_HELLO_TIMEOUT_MS), so that it does not
 * race it.
 */
#include "testutil.h"
#include "attach_i.h"
#include "layout_i.h" /* sfs_layout_format */

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SHARD   4096u
#define PENDING 64 /* the server's PENDING_PER_UID */

static char g_dir[64], g_sock[96];
static struct sfs_cache *g_c;

static void setup(void)
{
    struct sfs_cache_config cfg = {
        .shard_size = SHARD,
        .nslots = 8,
        .no_reserved = true,
        .hugepages = SFS_HUGEPAGES_OFF,
    };
    int err = 0;

    snprintf(g_dir, sizeof(g_dir), "/tmp/sfs-attach-server-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_sock, sizeof(g_sock), "%s/s", g_dir);
    g_c = sfs_cache_create(&cfg, &err);
    cr_assert_not_null(g_c, "create: %s", strerror(-err));
}

/* Serve g_c with a hello deadline of hello_ms (0: the server's, 1 s; else
 * through the test build's SHARDFS_TEST_HELLO_TIMEOUT_MS, so that a test
 * holds hellos pending without racing the deadline). */
static void serve(unsigned hello_ms)
{
    char v[16];

    snprintf(v, sizeof(v), "%u", hello_ms);
    if (hello_ms)
        setenv("SHARDFS_TEST_HELLO_TIMEOUT_MS", v, 1);
    cr_assert_eq(sfs_cache_serve(g_c, g_sock), 0);
    unsetenv("SHARDFS_TEST_HELLO_TIMEOUT_MS");
}

static void teardown(void)
{
    sfs_cache_close(g_c);
    unlink(g_sock);
    rmdir(g_dir);
}

TestSuite(attach_server, .init = setup, .fini = teardown, .timeout = 60);

/* A raw connection to the server. */
static int raw_connect(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert_geq(fd, 0);
    snprintf(a.sun_path, sizeof(a.sun_path), "%s", g_sock);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect: %s", strerror(errno));
    return fd;
}

/* The server's answer on fd within ms: its status, then the connection must
 * end (EOF). INT32_MIN when no welcome came. Descriptors sent are closed. */
static int32_t answer(int fd, int ms)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    struct welcome w;
    int fds[4];
    char b;
    int n;

    if (poll(&pf, 1, ms) != 1)
        return INT32_MIN;
    n = sfs_fds_recv(fd, &w, sizeof(w), fds, 4); /* the descriptor count */
    if (n < 0 || w.magic != WELCOME_MAGIC)
        return INT32_MIN;
    for (int i = 0; i < n; i++)
        close(fds[i]);
    cr_assert_eq(poll(&pf, 1, 10000), 1, "no EOF after the answer");
    cr_assert_eq(recv(fd, &b, 1, 0), 0, "the server kept the connection after its answer");
    return w.status;
}

/* Processes attached now, every class (what /stats shows). */
static uint32_t attached_now(void)
{
    struct sfs_served sv[32];
    unsigned n = sfs_cache_served(g_c, sv, 32);
    uint32_t all = 0;

    for (unsigned i = 0; i < n; i++)
        all += sv[i].attached;
    return all;
}

static struct hello good_hello(void)
{
    return (struct hello){.magic = HELLO_MAGIC,
                          .proto = PROTO_VERSION,
                          .format = sfs_layout_format(),
                          .device_id = -1};
}

/*
 * Silent clients: a real attach beside them is welcomed at once, and each
 * is refused -ETIMEDOUT at its deadline (1 s), then closed.
 */
Test(attach_server, a_silent_client_delays_no_one_and_is_refused_at_its_deadline)
{
    int silent[8], err = 0;

    serve(0);
    for (int i = 0; i < 8; i++)
        silent[i] = raw_connect();
    struct sfs_cache *a = sfs_cache_attach(g_sock, 0, &err);

    cr_assert_not_null(a, "an attach beside silent clients: %s", strerror(-err));
    sfs_cache_close(a);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(answer(silent[i], 20000), -ETIMEDOUT, "silent client %d", i);
        close(silent[i]);
    }
}

/*
 * A uid's pending hellos are bounded: with 64 silent connections of ours
 * pending, the next connection and a real attach are refused -EUSERS; once
 * they are gone, an attach is welcomed.
 */
Test(attach_server, hellos_pending_of_one_uid_are_bounded)
{
    int pend[PENDING], extra, err = 0;
    struct hello h = good_hello();

    serve(600000); /* no deadline passes during the test */
    for (int i = 0; i < PENDING; i++)
        pend[i] = raw_connect();
    extra = raw_connect();
    cr_assert_eq(answer(extra, 20000), -EUSERS, "a 65th pending hello");
    close(extra);
    cr_assert_null(sfs_cache_attach(g_sock, 0, &err), "an attach past the pending hellos");
    cr_assert_eq(err, -EUSERS, "%s", strerror(-err));
    /* One of them finishes its hello: welcomed (the bound is on pending
     * ones only), and the rest go. */
    cr_assert_eq(send(pend[0], &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    for (int i = 0; i < PENDING; i++)
        close(pend[i]);
    struct sfs_cache *a = NULL;

    for (int i = 0; i < 200 && !a; i++) {
        a = sfs_cache_attach(g_sock, 0, &err);
        if (!a)
            usleep(10000); /* the server has not seen all the closes yet */
    }
    cr_assert_not_null(a, "no attach after the pending hellos left: %s", strerror(-err));
    sfs_cache_close(a);
}

/* Hellos that are not: another magic, another protocol, cut short. */
Test(attach_server, a_hello_that_is_not_one_is_refused)
{
    struct hello h = good_hello();
    int fd;

    serve(0);
    h.magic ^= 1;
    fd = raw_connect();
    cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    cr_assert_eq(answer(fd, 20000), -EBADMSG, "another magic");
    close(fd);

    h = good_hello();
    h.proto = PROTO_VERSION + 1;
    fd = raw_connect();
    cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    cr_assert_eq(answer(fd, 20000), -EPROTO, "another protocol");
    close(fd);

    h = good_hello();
    h.format ^= 1;
    fd = raw_connect();
    cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    cr_assert_eq(answer(fd, 20000), -EPROTO, "another layout format");
    close(fd);

    h = good_hello();
    fd = raw_connect();
    cr_assert_eq(send(fd, &h, sizeof(h) / 2, MSG_NOSIGNAL), (ssize_t)(sizeof(h) / 2));
    cr_assert_eq(shutdown(fd, SHUT_WR), 0);
    cr_assert_eq(answer(fd, 20000), -EBADMSG, "half a hello, then EOF");
    close(fd);
}

/*
 * A welcomed client that sends bytes breaks the protocol: the server ends
 * that attachment and reaps its process record, as at a close.
 */
Test(attach_server, bytes_after_the_hello_end_the_attachment)
{
    struct hello h = good_hello();
    struct welcome w;
    int fds[4], n, fd;
    uint32_t before, now;

    serve(0);
    before = now = attached_now();
    fd = raw_connect();

    cr_assert_eq(send(fd, &h, sizeof(h), MSG_NOSIGNAL), (ssize_t)sizeof(h));
    n = sfs_fds_recv(fd, &w, sizeof(w), fds, 4); /* the control memfd (no data wanted) */
    cr_assert_geq(n, 0, "%s", strerror(-n));
    cr_assert_eq(w.status, 0, "a good hello: %s", strerror(-w.status));
    for (int i = 0; i < n; i++)
        close(fds[i]);
    for (int i = 0; i < 1000 && (now = attached_now()) != before + 1; i++)
        usleep(10000);
    cr_assert_eq(now, before + 1, "the raw client is not counted as attached");
    cr_assert_eq(send(fd, "junk", 4, MSG_NOSIGNAL), 4);
    for (int i = 0; i < 1000 && (now = attached_now()) != before; i++)
        usleep(10000);
    cr_assert_eq(now, before, "bytes after the hello did not end the attachment");
    close(fd);
}
