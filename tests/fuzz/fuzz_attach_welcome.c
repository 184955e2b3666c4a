/* SPDX-License-Identifier: MIT */
/*
 * fuzz_attach_welcome.c - libFuzzer target: a rank attaching to a hostile
 * server (the client side of core/attach/attach.c: sfs_cache_attach).
 *
 * docs/security.md: while no daemon serves the socket's path, another user
 * may bind a socket there, and ranks would attach to it. So the welcome and
 * everything after it are input to the rank. A fake server thread in this
 * process answers each attach with what the input scripts:
 *
 *   byte 0   flags: bits 0-1 what rides with the welcome (0 nothing, 1 a
 *            control memfd built from a real cache's plane, 2 that and a
 *            second fd, 3 a 4 KiB memfd); 4 the segments are the real
 *            segment memfds (else 4 KiB memfds); 8 the rank attaches
 *            query-only; 16 the server closes right after the welcome;
 *            32 the welcome is cut to the bytes the input gives (a short
 *            message, fds attached, then more)
 *   byte 1   how many segment batches follow (0..3)
 *   then     the welcome's 48 bytes, over a correct welcome from the start
 *            (magic, proto, status, format, ctl_size, nsegments, nfds, and
 *            the record the server claimed in the control memfd)
 *   then     per batch: a u32 count (the header the batch carries) and a
 *            byte: how many fds really ride with it
 *
 * sfs_cache_attach must return a handle or NULL with -errno; it must not
 * crash, hang (the client's 5 s receive timeout; libFuzzer's -timeout), leak
 * a descriptor or close one twice (fuzz_close.h), and a handle it returns must
 * have a geometry that fits its segments and a record that the plane says
 * is its own.
 */
#include "cache_i.h"
#include "fuzz_close.h"
#include "attach_wire.h"
#include "fuzz_harness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CLAIMED 1u /* the record the fake server claims in its plane */

enum { F_FDS = 3, F_REAL_SEGS = 4, F_QUERY = 8, F_CLOSE = 16, F_SHORT = 32 };

static struct sfs_cache *cache; /* the real cache whose planes the server hands out */
static uint8_t *pristine;
static char dir[64], sock_path[128];
static int listen_fd;
static pthread_t server;
static sem_t script_ready, served;
static const uint8_t *script; /* the current input: set before script_ready is posted */
static size_t script_len;

/* sem_wait that is not cut short by a signal (libFuzzer's SIGALRM for
 * -timeout lands on any thread). */
static void wait_sem(sem_t *s)
{
    while (sem_wait(s) < 0 && errno == EINTR)
        ;
}

static int small_memfd(void)
{
    int fd = memfd_create("fuzz-small", MFD_CLOEXEC);

    if (fd < 0 || ftruncate(fd, 4096) < 0)
        fz_fail("memfd: %s", strerror(errno));
    return fd;
}

/* A control memfd as a server would hand it out: the real plane, with a
 * record claimed for the connection. */
static int ctl_copy(void)
{
    int fd = memfd_create("fuzz-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    const struct sfs_header *h = (const void *)pristine;

    if (fd < 0 || ftruncate(fd, (off_t)cache->ctl_len) < 0)
        fz_fail("memfd: %s", strerror(errno));
    uint8_t *p = mmap(NULL, cache->ctl_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        fz_fail("mmap: %s", strerror(errno));
    memcpy(p, pristine, cache->ctl_len);
    struct sfs_proc_rec *rec = (void *)(p + h->off_procs + CLAIMED * sizeof(struct sfs_proc_rec));
    /* Seq_cst stores into a memfd no other process maps yet: order is moot. */
    atomic_store(&rec->gen, 1);
    rec->kind = PROC_KIND_CONN;
    atomic_store(&rec->state, PROC_ALIVE);
    munmap(p, cache->ctl_len);
    return fd;
}

static void send_with(int sock, const void *buf, size_t len, const int *fds, int nfds)
{
    union {
        char b[CMSG_SPACE(sizeof(int) * 8)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};

    if (nfds > 0) {
        memset(&u, 0, sizeof(u));
        msg.msg_control = u.b;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
    }
    ssize_t n;

    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL); /* the client may have gone */
    while (n < 0 && errno == EINTR);
}

/* Answer one connection as the script says. */
static void serve_one(int sock, const uint8_t *in, size_t len)
{
    uint8_t flags = in[0], batches = in[1] % 4;
    struct welcome w = {.magic = WELCOME_MAGIC,
                        .proto = PROTO_VERSION,
                        .status = 0,
                        .format = sfs_layout_format(),
                        .ctl_size = cache->ctl_len,
                        .nsegments = cache->nsegments,
                        .nfds = 1 + ((flags & F_QUERY) ? 0 : cache->nsegments),
                        .proc = CLAIMED,
                        .proc_gen = 1};
    size_t at = 2, n = len - at < sizeof(w) ? len - at : sizeof(w);
    char hello[32];
    int fds[8], nfds = 0;

    memcpy(&w, in + at, n);
    at += n;
    size_t wlen = (flags & F_SHORT) ? n : sizeof(w);
    ssize_t got;

    do
        got = recv(sock, hello, sizeof(hello), MSG_WAITALL);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof(hello))
        return;
    switch (flags & F_FDS) {
    case 1:
        fds[nfds++] = ctl_copy();
        break;
    case 2:
        fds[nfds++] = ctl_copy();
        fds[nfds++] = small_memfd();
        break;
    case 3:
        fds[nfds++] = small_memfd();
        break;
    }
    send_with(sock, &w, wlen, fds, nfds);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    for (unsigned b = 0; b < batches && !(flags & F_CLOSE); b++) {
        uint32_t count = cache->nsegments;
        uint8_t ride = (uint8_t)cache->nsegments;

        if (len - at >= 5) {
            memcpy(&count, in + at, 4);
            ride = in[at + 4];
            at += 5;
        }
        nfds = 0;
        for (unsigned i = 0; i < ride % 8; i++)
            fds[nfds++] = (flags & F_REAL_SEGS) && i < cache->nsegments
                              ? fcntl(cache->seg_fds[i], F_DUPFD_CLOEXEC, 0)
                              : small_memfd();
        send_with(sock, &count, sizeof(count), fds, nfds);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    }
    if (flags & F_CLOSE)
        return;
    /* Nothing more to say: the client reads EOF at once instead of waiting
     * out its 5 s receive timeout for batches that will not come (that
     * deadline is the liveness tests' matter, not this target's). Then hold
     * the connection until the client closes it, as a server does. */
    shutdown(sock, SHUT_WR);
    char junk[64];
    do
        got = recv(sock, junk, sizeof(junk), 0);
    while (got > 0 || (got < 0 && errno == EINTR));
}

static void *server_main(void *arg)
{
    for (;;) {
        wait_sem(&script_ready);
        int sock;

        do
            sock = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        while (sock < 0 && errno == EINTR);

        if (sock < 0)
            fz_fail("accept: %s", strerror(errno));
        serve_one(sock, script, script_len);
        close(sock);
        sem_post(&served);
    }
    return arg;
}

static void cleanup(void)
{
    unlink(sock_path);
    rmdir(dir);
}

static void seed(const char *name, uint8_t flags, uint8_t batches)
{
    uint8_t b[2] = {flags, batches};

    fz_seed(name, b, sizeof(b));
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sfs_cache_config cfg = {.shard_size = 4096,
                                   .nslots = 64,
                                   .segment_size = 128 << 10, /* 2 segments */
                                   .max_procs = 4,
                                   .max_leases = 16,
                                   .hugepages = SFS_HUGEPAGES_OFF};
    struct sockaddr_un addr = {.sun_family = AF_UNIX};

    signal(SIGPIPE, SIG_IGN);
    cache = fz_cache_create(&cfg);
    pristine = malloc(cache->ctl_len);
    if (!pristine)
        fz_fail("malloc");
    memcpy(pristine, cache->ctl, cache->ctl_len);
    fz_tmpdir(dir, sizeof(dir));
    snprintf(sock_path, sizeof(sock_path), "%s/hostile.sock", dir);
    strcpy(addr.sun_path, sock_path);
    listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_fd < 0 || bind(listen_fd, (struct sockaddr *)&addr, sizeof(addr)) < 0 ||
        listen(listen_fd, 4) < 0)
        fz_fail("listen: %s", strerror(errno));
    atexit(cleanup);
    sem_init(&script_ready, 0, 0);
    sem_init(&served, 0, 0);
    if (pthread_create(&server, NULL, server_main, NULL) != 0)
        fz_fail("pthread_create");

    /* Seeds: the correct exchange, with the data plane and query-only; the
     * batches then carry their real counts (one batch of both segments). */
    seed("data", 1 | F_REAL_SEGS, 1);
    seed("query", 1 | F_QUERY, 0);
    seed("extra-fd", 2 | F_REAL_SEGS, 1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int before = fz_lowest_free_fd(), err = 0;

    script = data;
    script_len = size;
    sem_post(&script_ready);
    struct sfs_cache *c = sfs_cache_attach(sock_path, (data[0] & F_QUERY) ? -1 : 0, &err);

    if (!c) {
        if (err >= 0)
            fz_fail("attach failed with %d, not -errno", err);
    } else {
        unsigned __int128 end =
            (unsigned __int128)(c->slots_per_seg - 1) * c->stride + c->shard_size;
        if (end > c->seg_size)
            fz_fail("attach accepted a geometry whose slots leave their segment");
        if (c->me >= c->max_procs || c->self != &c->procs[c->me])
            fz_fail("attach adopted record %u of %u", c->me, c->max_procs);
        struct sfs_stats st;
        sfs_cache_stats(c, &st);
        sfs_cache_close(c);
    }
    wait_sem(&served); /* the server has closed its side */
    fz_check_no_fd_leak(before);
    return 0;
}
