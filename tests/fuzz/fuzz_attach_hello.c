/* SPDX-License-Identifier: MIT */
/*
 * fuzz_attach_hello.c - libFuzzer target: the attach server's reading and
 * checking of a client's hello (core/attach/server.c).
 *
 * The real server runs in this process (sfs_cache_serve on a small cache, a
 * socket in a private directory). Each input is one client: its first byte
 * is a plan (where to split the bytes in two sends, and whether to wait until
 * the server has read the first part, so a hello arrives in pieces), the
 * rest is what the client sends before it shuts its side down. The harness
 * then reads everything the server answers until the server closes, and
 * checks it against the protocol of docs/attach.md:
 *
 *   - fewer than a hello's bytes, or a wrong magic: one welcome, -EBADMSG;
 *   - a wrong protocol version or layout format: one welcome, -EPROTO;
 *   - a good hello: a welcome with status 0 (or -EUSERS while records of
 *     earlier clients are still being reaped: then every record but the
 *     creator's must be free again within 5 s, else records leak), our
 *     format, the control
 *     plane's size and segment count, the control memfd (of that size) and,
 *     when the flags ask for the data plane, every segment memfd in batches;
 *   - then the server closes the connection within a few seconds, whatever
 *     was sent after the hello.
 *
 * A crash, a sanitizer report, a hang of the server or any other answer is a
 * finding. The wire structs are restated on purpose (tests/attach_wire.h):
 * the test holds the server to the documented format, not to its own
 * definitions.
 */
#include "cache_i.h"
#include "fuzz_close.h"
#include "attach_wire.h"
#include "fuzz_harness.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <linux/sockios.h>
#include <unistd.h>

#define ANSWER_LIMIT_S 5 /* the server answers and closes within this */

static struct sfs_cache *cache;
static char dir[64];
static char sock_path[128];

static void cleanup(void)
{
    sfs_cache_close(cache); /* stops the server, unlinks the socket */
    rmdir(dir);
}

static void seed_hello(const char *name, uint8_t plan, const struct hello *h, const char *tail)
{
    uint8_t buf[1 + sizeof(*h) + 16];
    size_t n = 1 + sizeof(*h), t = tail ? strlen(tail) : 0;

    buf[0] = plan;
    memcpy(buf + 1, h, sizeof(*h));
    memcpy(buf + n, tail ? tail : "", t);
    fz_seed(name, buf, n + t);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct sfs_cache_config cfg = {.shard_size = 4096,
                                   .nslots = 256,
                                   .segment_size = 256 << 10, /* 4 segments: batches */
                                   .max_procs = 64,
                                   .max_leases = 64,
                                   .hugepages = SFS_HUGEPAGES_OFF};
    int err = 0;

    signal(SIGPIPE, SIG_IGN);
    fz_tmpdir(dir, sizeof(dir));
    snprintf(sock_path, sizeof(sock_path), "%s/attach.sock", dir);
    cache = fz_cache_create(&cfg);
    err = sfs_cache_serve(cache, sock_path);
    if (err < 0)
        fz_fail("sfs_cache_serve: %d", err);
    atexit(cleanup);

    struct hello h = {.magic = HELLO_MAGIC,
                      .proto = PROTO_VERSION,
                      .flags = 1,
                      .format = sfs_layout_format(),
                      .device_id = 0};
    seed_hello("data", 0, &h, NULL);
    seed_hello("data-split", 0x40 | 9, &h, NULL);
    seed_hello("data-tail", 0, &h, "more");
    h.flags = 0;
    h.device_id = -1;
    seed_hello("query", 0, &h, NULL);
    h.proto = 1;
    seed_hello("old-proto", 0, &h, NULL);
    return 0;
}

/* Send all of buf (the socket blocks; the server reads as bytes come). */
static void send_all(int sock, const uint8_t *buf, size_t len)
{
    while (len) {
        ssize_t n = send(sock, buf, len, MSG_NOSIGNAL);

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return; /* the server closed early (a refusal): what it said is read next */
        buf += n;
        len -= (size_t)n;
    }
}

/* Wait (bounded) until the server has read everything sent so far. */
static void wait_drained(int sock)
{
    for (int i = 0; i < 20000; i++) {
        int queued = 0;

        if (ioctl(sock, SIOCOUTQ, &queued) < 0 || queued == 0)
            return;
        usleep(10);
    }
}

/* One message and the fds that came with it; returns the bytes (0: EOF). */
static ssize_t recv_msg(int sock, void *buf, size_t len, int *fds, int *nfds)
{
    union {
        char b[CMSG_SPACE(sizeof(int) * 256)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b)};
    ssize_t n;

    *nfds = 0;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno == ECONNRESET)
        return 0; /* the server closed with our extra bytes unread: its close */
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            fz_fail("the server neither answered nor closed within %d s", ANSWER_LIMIT_S);
        fz_fail("recvmsg: %s", strerror(errno));
    }
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        memcpy(fds + *nfds, CMSG_DATA(cm), sizeof(int) * (size_t)k);
        *nfds += k;
    }
    if (msg.msg_flags & MSG_CTRUNC)
        fz_fail("more fds than any message may carry");
    return n;
}

static void close_fds(const int *fds, int n)
{
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

/* The records the server claimed for earlier clients are all reaped within
 * 5 s (only the creator's stays): else they leak, one per connection. The
 * reaper is woken at once; 5 s is a generous bound for a loaded machine. */
static void check_records_reaped(void)
{
    unsigned busy = 0;

    for (int tries = 0; tries < 5000; tries++) {
        busy = 0;
        /* Acquire: pairs with the reaper's release of the record. */
        for (uint32_t i = 0; i < cache->max_procs; i++)
            busy += i != cache->me &&
                    atomic_load_explicit(&cache->procs[i].state, memory_order_acquire) != PROC_FREE;
        if (busy == 0)
            return;
        usleep(1000);
    }
    fz_fail("%u process records still held 5 s after their connections closed", busy);
}

/* What the server must answer to the bytes sent: 0 (welcome), or -errno. */
static int expected_status(const uint8_t *sent, size_t len, bool *data)
{
    struct hello h;

    *data = false;
    if (len < sizeof(h))
        return -EBADMSG;
    memcpy(&h, sent, sizeof(h));
    if (h.magic != HELLO_MAGIC)
        return -EBADMSG;
    if (h.proto != PROTO_VERSION || h.format != sfs_layout_format())
        return -EPROTO;
    *data = h.flags & 1;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *input, size_t size)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    struct timeval tv = {.tv_sec = ANSWER_LIMIT_S};
    const uint8_t *sent = input + 1;
    size_t len = size ? size - 1 : 0;
    uint8_t plan = size ? input[0] : 0;
    size_t split = plan & 0x3f;
    int sock;

    if (len > 4096)
        return 0; /* the server reads 32 bytes; more is only slower */
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0)
        fz_fail("socket: %s", strerror(errno));
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    strcpy(addr.sun_path, sock_path);
    int r;

    do
        r = connect(sock, (struct sockaddr *)&addr, sizeof(addr));
    while (r < 0 && errno == EINTR); /* libFuzzer's SIGALRM */
    if (r < 0 && errno != EISCONN)
        fz_fail("connect: %s", strerror(errno));

    /* The bytes, in two sends; bit 6: the server reads the first part alone. */
    if (split > len)
        split = len;
    send_all(sock, sent, split);
    if (plan & 0x40)
        wait_drained(sock);
    send_all(sock, sent + split, len - split);
    shutdown(sock, SHUT_WR);

    bool data;
    int want = expected_status(sent, len, &data);
    struct welcome w;
    int fds[256], nfds;
    ssize_t n = recv_msg(sock, &w, sizeof(w), fds, &nfds);

    if (n != (ssize_t)sizeof(w))
        fz_fail("no whole welcome (%zd bytes) to %zu bytes sent", n, len);
    if (w.magic != WELCOME_MAGIC || w.proto != PROTO_VERSION || w.format != sfs_layout_format())
        fz_fail("a welcome with magic %016llx proto %u format %016llx", (unsigned long long)w.magic,
             w.proto, (unsigned long long)w.format);
    if (want == 0 && w.status == -EUSERS) {
        want = -EUSERS; /* records of earlier clients not reaped yet */
        check_records_reaped();
    }
    if (w.status != want)
        fz_fail("status %d to %zu bytes sent, want %d", w.status, len, want);
    if (want < 0) {
        if (nfds != 0)
            fz_fail("a refusal came with %d fds", nfds);
    } else {
        struct stat st;

        if (nfds != 1 || fstat(fds[0], &st) < 0 || (uint64_t)st.st_size != w.ctl_size ||
            w.ctl_size != cache->ctl_len)
            fz_fail("welcome: %d fds, ctl_size %llu (ours %zu)", nfds, (unsigned long long)w.ctl_size,
                 cache->ctl_len);
        if (w.nsegments != cache->nsegments || w.nfds != 1 + (data ? w.nsegments : 0))
            fz_fail("welcome: nsegments %u nfds %u (ours %u, data %d)", w.nsegments, w.nfds,
                 cache->nsegments, data);
        close_fds(fds, nfds);
        for (uint32_t got = 0; data && got < w.nsegments;) {
            uint32_t count;

            n = recv_msg(sock, &count, sizeof(count), fds, &nfds);
            if (n != (ssize_t)sizeof(count) || nfds < 1 || (uint32_t)nfds != count ||
                got + count > w.nsegments)
                fz_fail("segment batch: %zd bytes, count %u, %d fds, %u of %u so far", n, count, nfds,
                     got, w.nsegments);
            close_fds(fds, nfds);
            got += count;
        }
    }
    /* Then nothing but the server's close. */
    char junk[64];
    n = recv_msg(sock, junk, sizeof(junk), fds, &nfds);
    close_fds(fds, nfds);
    if (n != 0)
        fz_fail("%zd more bytes after the answer", n);
    close(sock);
    return 0;
}
