/* SPDX-License-Identifier: MIT */
/*
 * test_attach_client.c - the attaching side against a server that answers
 * wrong: no answer, another magic, a refusal, another protocol or format, a
 * welcome whose counts do not add up, segments that never come or come
 * short, a control memfd of another size than announced, a process record
 * that is not the client's. Each attach fails
 * with the errno docs/attach.md gives for it, and leaks no descriptor of
 * what it was sent.
 *
 * The server is a thread of the test on a Unix socket of its own, speaking
 * the documented wire format (attach_wire.h): it reads the hello, sends the
 * scripted answer (a welcome and its SCM_RIGHTS descriptors, then the
 * segment messages: a 32-bit count and that many descriptors), and waits
 * for the client to hang up.
 */
#include "attach_wire.h"
#include "testutil.h"
#include "cache_i.h" /* a real cache's control memfd */

#include <shardfs/cache.h>

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* What the fake server answers. */
struct script {
    bool silent;        /* read the hello and hang up */
    struct welcome w;   /* the welcome */
    int nctl;           /* descriptors sent with it: 0 or 1 (a memfd) */
    int ctl_src;        /* > 0: send a dup of this descriptor, not a memfd */
    off_t ctl_len;      /* the memfd's size */
    uint32_t seg_count; /* a segment message's count (0: none sent) */
    int seg_fds;        /* descriptors sent with it */
    bool close_after_hello;
};

static struct {
    char path[128];
    int lsock;
    pthread_t t;
    struct script sc;
} F;

static int memfd_of(off_t len)
{
    int fd = memfd_create("sfs-test-fake", MFD_CLOEXEC);

    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, len), 0);
    return fd;
}

/* One message: len bytes of buf and nfds descriptors. */
static void send_with_fds(int s, const void *buf, size_t len, const int *fds, int nfds)
{
    char cbuf[CMSG_SPACE(sizeof(int) * 8)] = {0};
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

    if (nfds > 0) {
        struct cmsghdr *cm;

        msg.msg_control = cbuf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    sendmsg(s, &msg, MSG_NOSIGNAL);
}

static void *serve_once(void *arg)
{
    struct script *sc = arg;
    struct hello h;
    int s = accept4(F.lsock, NULL, NULL, SOCK_CLOEXEC), fds[8];
    char ch;

    (void)arg;
    if (s < 0)
        return NULL;
    if (recv(s, &h, sizeof(h), MSG_WAITALL) == (ssize_t)sizeof(h) && !sc->silent) {
        for (int i = 0; i < sc->nctl; i++)
            fds[i] = sc->ctl_src > 0 ? dup(sc->ctl_src) : memfd_of(sc->ctl_len);
        send_with_fds(s, &sc->w, sizeof(sc->w), fds, sc->nctl);
        for (int i = 0; i < sc->nctl; i++)
            close(fds[i]);
        if (sc->seg_count) {
            for (int i = 0; i < sc->seg_fds; i++)
                fds[i] = memfd_of(4096);
            send_with_fds(s, &sc->seg_count, sizeof(sc->seg_count), fds, sc->seg_fds);
            for (int i = 0; i < sc->seg_fds; i++)
                close(fds[i]);
        }
        if (!sc->close_after_hello)
            while (recv(s, &ch, 1, 0) > 0) {
            }
    }
    close(s);
    return NULL;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    cr_assert_not_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static void setup(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};

    memset(&F, 0, sizeof(F));
    snprintf(F.path, sizeof(F.path), "%s", tu_path("fake"));
    cr_assert_lt(strlen(F.path), sizeof(a.sun_path));
    memcpy(a.sun_path, F.path, strlen(F.path) + 1);
    F.lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(F.lsock, 0);
    cr_assert_eq(bind(F.lsock, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(F.lsock, 4), 0);
}

static void teardown(void)
{
    close(F.lsock);
    unlink(F.path);
}

TestSuite(attach_client, .init = setup, .fini = teardown, .timeout = 30);

/* A welcome that a data client (device 0) takes: one segment, its fd. */
static struct welcome good_welcome(void)
{
    return (struct welcome){.magic = WELCOME_MAGIC,
                            .proto = PROTO_VERSION,
                            .format = sfs_layout_format(),
                            .ctl_size = 4096,
                            .nsegments = 1,
                            .nfds = 2};
}

/* Attach (as device_id) to the fake server playing sc: the attach fails
 * with want, and every descriptor it was sent is closed. */
static void expect_refused(const struct script *sc, int device_id, int want, const char *what)
{
    int before = open_fds(), err = 0;
    struct sfs_cache *c;

    F.sc = *sc;
    cr_assert_eq(pthread_create(&F.t, NULL, serve_once, &F.sc), 0);
    c = sfs_cache_attach(F.path, device_id, &err);
    cr_assert_null(c, "%s: the attach succeeded", what);
    pthread_join(F.t, NULL);
    cr_assert_eq(err, want, "%s: %s, not %s", what, strerror(-err), strerror(-want));
    cr_assert_eq(open_fds(), before, "%s: %d descriptors leaked", what, open_fds() - before);
}

Test(attach_client, a_server_that_hangs_up_or_speaks_another_language)
{
    struct script sc = {.silent = true};

    expect_refused(&sc, 0, -EBADMSG, "no welcome");
    sc = (struct script){.w = good_welcome(), .nctl = 1, .ctl_len = 4096};
    sc.w.magic ^= 1;
    expect_refused(&sc, 0, -EBADMSG, "another magic");
    sc.w = good_welcome();
    sc.w.proto = PROTO_VERSION + 1;
    expect_refused(&sc, 0, -EPROTO, "another protocol");
    sc.w = good_welcome();
    sc.w.format ^= 1;
    expect_refused(&sc, 0, -EPROTO, "another layout format");
}

/* A refusal's status is the attach's errno, whatever fds came with it. */
Test(attach_client, a_refusal_is_the_attachs_errno)
{
    struct script sc = {.w = good_welcome()};

    sc.w.status = -EUSERS;
    expect_refused(&sc, 0, -EUSERS, "a refusal");
    sc.nctl = 1;
    sc.ctl_len = 4096;
    sc.w.status = -EACCES;
    expect_refused(&sc, 0, -EACCES, "a refusal with an fd");
}

/* Counts that do not add up: no control fd, no segment, more segments than
 * a cache has, a descriptor count off by one, data descriptors announced to
 * a query-only client. */
Test(attach_client, a_welcome_whose_counts_do_not_add_up)
{
    struct script sc = {.w = good_welcome(), .nctl = 0};

    expect_refused(&sc, 0, -EBADMSG, "no control fd");
    sc.nctl = 1;
    sc.ctl_len = 4096;
    sc.w.nsegments = 0;
    sc.w.nfds = 1;
    expect_refused(&sc, 0, -EBADMSG, "no segment");
    sc.w.nsegments = (1u << 20) + 1;
    sc.w.nfds = sc.w.nsegments + 1;
    expect_refused(&sc, 0, -EBADMSG, "2^20 + 1 segments");
    sc.w = good_welcome();
    sc.w.nfds = 3;
    expect_refused(&sc, 0, -EBADMSG, "a descriptor count off by one");
    sc.w = good_welcome();
    expect_refused(&sc, -1, -EBADMSG, "data descriptors for a query-only client");
}

/* The segments: the server hangs up before sending them, or a message
 * announces two and carries one; the descriptors that did come are
 * closed. */
Test(attach_client, segments_that_never_come_or_come_short)
{
    struct script sc = {.w = good_welcome(), .nctl = 1, .ctl_len = 4096, .close_after_hello = true};

    expect_refused(&sc, 0, -EBADMSG, "no segment message");
    sc.w.nsegments = 2;
    sc.w.nfds = 3;
    sc.seg_count = 2;
    sc.seg_fds = 1;
    sc.close_after_hello = false;
    expect_refused(&sc, 0, -EBADMSG, "a segment message one descriptor short");
}

/* The control memfd is not what the welcome announced: another size, or
 * smaller than a header. */
Test(attach_client, a_control_memfd_of_another_size)
{
    struct script sc = {.w = good_welcome(), .nctl = 1, .ctl_len = 8192};

    sc.w = good_welcome();
    sc.w.nfds = 1;
    sc.ctl_len = 8192;
    expect_refused(&sc, -1, -EBADMSG, "a control memfd larger than announced");
    sc.w.ctl_size = 0;
    sc.ctl_len = 16;
    expect_refused(&sc, -1, -EBADMSG, "a control memfd smaller than a header");
}

/* A real cache's control plane, with a process record that is not the
 * client's: out of range, or never claimed. The attach is EBADMSG. */
Test(attach_client, a_process_record_that_is_not_the_clients)
{
    struct sfs_cache *c = tu_cache(8, 0, 4096);
    struct stat sb;
    struct script sc = {.nctl = 1};

    cr_assert_not_null(c);
    cr_assert_eq(fstat(c->ctl_fd, &sb), 0);
    sc.ctl_src = c->ctl_fd;
    sc.w = good_welcome();
    sc.w.ctl_size = (uint64_t)sb.st_size;
    sc.w.nfds = 1;
    sc.w.proc = 1u << 30;
    expect_refused(&sc, -1, -EBADMSG, "a process record out of range");
    sc.w.proc = c->max_procs - 1;
    sc.w.proc_gen = 77;
    expect_refused(&sc, -1, -EBADMSG, "a process record never claimed");
    sfs_cache_close(c);
}

/* The attach's own arguments: no path, a path no socket address holds, a
 * path with no server; and no handle has no connection. */
Test(attach_client, paths_the_attach_refuses)
{
    char longpath[200];
    int err = 0;

    cr_assert_null(sfs_cache_attach(NULL, 0, &err));
    cr_assert_eq(err, -EINVAL);
    memset(longpath, 'x', sizeof(longpath) - 1);
    longpath[0] = '/';
    longpath[sizeof(longpath) - 1] = '\0';
    err = 0;
    cr_assert_null(sfs_cache_attach(longpath, 0, &err));
    cr_assert_eq(err, -ENAMETOOLONG);
    err = 0;
    cr_assert_null(sfs_cache_attach(tu_path("nobody.sock"), -1, &err));
    cr_assert_eq(err, -ENOENT);
    cr_assert_eq(sfs_cache_conn_fd(NULL), -1);
}
