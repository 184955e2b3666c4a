/* SPDX-License-Identifier: MIT */
/*
 * peer_client.c - the peer tier's TCP client (protocol: peer_i.h).
 *
 * One blocking socket per member, every call under a deadline
 * (poll before each send/recv). A member that fails a call is closed and
 * marked down for PEER_DOWN_MS: calls in that window fail at once with
 * -EHOSTUNREACH, so a dead host costs one deadline, not one per key.
 */
#include "backend_i.h"
#include "peer_net_i.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* --- client --- */

void peer_conn_init(struct peer_conn *c)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
}

void peer_conn_close(struct peer_conn *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static int fail(struct peer_conn *c, int err)
{
    peer_conn_close(c);
    c->down_until_ns = peer_net_mono_ns() + (int64_t)PEER_DOWN_MS * 1000000;
    return err;
}

static int connect_deadline(const char *member, int64_t deadline_ns)
{
    struct addrinfo *res = NULL, *ai;
    int fd = -1, ret = peer_resolve(member, false, &res), one = 1;

    if (ret < 0)
        return ret;
    ret = -EHOSTUNREACH;
    for (ai = res; ai; ai = ai->ai_next) {
        int soerr = 0;
        socklen_t sl = sizeof(soerr);

        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS)
            goto next;
        if (peer_wait_fd(fd, POLLOUT, deadline_ns) < 0) {
            ret = -ETIMEDOUT;
            goto next;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 || soerr)
            goto next;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        freeaddrinfo(res);
        return fd;
    next:
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return ret;
}

int peer_conn_open(struct peer_conn *c, const char *member, unsigned deadline_ms)
{
    int64_t deadline = peer_net_mono_ns() + (int64_t)deadline_ms * 1000000;
    struct peer_hello hello;
    int ret;

    if (c->fd >= 0)
        return 0;
    if (peer_net_mono_ns() < c->down_until_ns)
        return -EHOSTUNREACH;
    ret = connect_deadline(member, deadline);
    if (ret < 0)
        return fail(c, ret);
    c->fd = ret;
    ret = peer_recv_all(c->fd, &hello, sizeof(hello), deadline, NULL, false);
    if (ret < 0)
        return fail(c, ret);
    if (hello.magic != PEER_MAGIC || hello.version != PEER_VERSION ||
        peer_geometry_check(&hello.g) < 0)
        return fail(c, -EPROTO);
    c->g = hello.g;
    return 0;
}

/* Send q (and payload) and read the answer's peer_rep. A connection that
 * was already open may have been closed by the member meanwhile (it
 * restarted, or dropped us): then once more on a fresh one before the
 * member counts as failed. */
static int call(struct peer_conn *c, const char *member, unsigned deadline_ms,
                const struct peer_req *q, const void *payload, struct peer_rep *rep,
                int64_t *deadline)
{
    for (int attempt = 0;; attempt++) {
        bool reused = c->fd >= 0;
        int ret = peer_conn_open(c, member, deadline_ms);

        if (ret < 0)
            return ret;
        *deadline = peer_net_mono_ns() + (int64_t)deadline_ms * 1000000;
        ret = peer_send_all(c->fd, q, sizeof(*q), *deadline, NULL);
        if (ret == 0 && payload && q->len)
            ret = peer_send_all(c->fd, payload, q->len, *deadline, NULL);
        if (ret == 0)
            ret = peer_recv_all(c->fd, rep, sizeof(*rep), *deadline, NULL, false);
        if (ret == 0 && rep->magic != PEER_MAGIC)
            ret = -EPROTO;
        if (ret == 0)
            return 0;
        if (reused && attempt == 0 && (ret == -ECONNRESET || ret == -EPIPE)) {
            peer_conn_close(c);
            continue;
        }
        return fail(c, ret);
    }
}

int peer_conn_read_hdrs(struct peer_conn *c, const char *member, unsigned deadline_ms,
                        uint64_t bucket, struct peer_slot_hdr *hdrs, uint64_t *seq_after)
{
    struct peer_req q = {
        .magic = PEER_MAGIC, .version = PEER_VERSION, .op = PEER_OP_READ_HDRS, .bucket = bucket};
    struct peer_rep rep;
    int64_t deadline;
    int ret = peer_conn_open(c, member, deadline_ms);

    if (ret < 0)
        return ret;
    q.nways = c->g.ways;
    ret = call(c, member, deadline_ms, &q, NULL, &rep, &deadline);
    if (ret < 0)
        return ret;
    if (rep.status)
        return fail(c, -EPROTO);
    for (uint32_t w = 0; w < c->g.ways; w++) {
        ret = peer_recv_all(c->fd, &hdrs[w], sizeof(hdrs[w]), deadline, NULL, false);
        if (ret == 0)
            ret = peer_recv_all(c->fd, &seq_after[w], 8, deadline, NULL, false);
        if (ret < 0)
            return fail(c, ret);
    }
    return 0;
}

int peer_conn_read_hdrs_multi(struct peer_conn *c, const char *member, unsigned deadline_ms,
                              const uint64_t *buckets, uint32_t count, struct peer_slot_hdr *hdrs,
                              uint64_t *seq_after)
{
    struct peer_req q = {.magic = PEER_MAGIC,
                         .version = PEER_VERSION,
                         .op = PEER_OP_READ_HDRS_MULTI,
                         .nways = count,
                         .len = count * 8u};
    struct peer_rep rep;
    int64_t deadline;
    int ret;

    if (count == 0 || count > PEER_BATCH_MAX || c->fd < 0)
        return -EINVAL;
    ret = call(c, member, deadline_ms, &q, buckets, &rep, &deadline);
    if (ret < 0)
        return ret;
    if (rep.status)
        return fail(c, -EPROTO);
    for (uint32_t i = 0; i < count * c->g.ways; i++) {
        ret = peer_recv_all(c->fd, &hdrs[i], sizeof(hdrs[i]), deadline, NULL, false);
        if (ret == 0)
            ret = peer_recv_all(c->fd, &seq_after[i], 8, deadline, NULL, false);
        if (ret < 0)
            return fail(c, ret);
    }
    return 0;
}

int peer_conn_read_slot(struct peer_conn *c, const char *member, unsigned deadline_ms,
                        uint64_t bucket, uint32_t way, uint32_t len, struct peer_slot_hdr *hdr,
                        uint64_t *seq_after, void *buf)
{
    struct peer_req q = {.magic = PEER_MAGIC,
                         .version = PEER_VERSION,
                         .op = PEER_OP_READ_SLOT,
                         .bucket = bucket,
                         .way = way,
                         .nways = 1,
                         .len = len};
    struct peer_rep rep;
    int64_t deadline;
    int ret = call(c, member, deadline_ms, &q, NULL, &rep, &deadline);

    if (ret < 0)
        return ret;
    if (rep.status)
        return fail(c, -EPROTO);
    ret = peer_recv_all(c->fd, hdr, sizeof(*hdr), deadline, NULL, false);
    if (ret == 0)
        ret = peer_recv_all(c->fd, seq_after, 8, deadline, NULL, false);
    if (ret == 0)
        ret = peer_recv_all(c->fd, buf, len, deadline, NULL, false);
    return ret < 0 ? fail(c, ret) : 0;
}

int peer_conn_write(struct peer_conn *c, const char *member, unsigned deadline_ms, uint64_t bucket,
                    uint32_t way, uint64_t expect, const struct peer_hash *h, const void *payload,
                    uint32_t len, uint64_t stamp, uint64_t *found)
{
    struct peer_req q = {.magic = PEER_MAGIC,
                         .version = PEER_VERSION,
                         .op = PEER_OP_WRITE,
                         .bucket = bucket,
                         .way = way,
                         .nways = 1,
                         .expect = expect,
                         .hash_lo = h->lo,
                         .hash_hi = h->hi,
                         .len = len,
                         .stamp = stamp};
    struct peer_rep rep;
    int64_t deadline;
    int ret = call(c, member, deadline_ms, &q, payload, &rep, &deadline);

    if (ret < 0)
        return ret;
    if (rep.status == -EAGAIN) {
        *found = rep.seq;
        return -EAGAIN;
    }
    return rep.status ? fail(c, -EPROTO) : 0;
}
