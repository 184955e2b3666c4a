/* SPDX-License-Identifier: MIT */
/*
 * peer_client.c - the peer tier's TCP client (protocol: peer_i.h).
 *
 * One socket per member, every call under a deadline: poll before each
 * send/recv, except a single get alone on its connection (one_get), which
 * blocks in recv under SO_RCVTIMEO instead (two syscalls fewer a piece).
 * A member that fails a call is closed and marked down for PEER_DOWN_MS:
 * calls in that window fail at once with -EHOSTUNREACH, so a dead host
 * costs one deadline, not one per key. With the members' key, a connection
 * is used only once the member has proved it holds the key too (a server
 * that cannot is not a member: -EACCES), and every request goes with its
 * tag (peer_req_tag), in the order it is sent.
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
#include <sys/uio.h>
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
    c->rcvtimeo_ms = 0;
    peer_sess_end(&c->sess);
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
        /* Blocking from now on: every call but one_get's passes
         * MSG_DONTWAIT and polls; one_get blocks under SO_RCVTIMEO. */
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
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
    uint8_t hw[PEER_HELLO_WIRE];
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
    /* The first 32 bytes are every version's hello (magic, version,
     * geometry): a peer of another version, whose hello may end there, is
     * judged on them before more is awaited. */
    ret = peer_recv_all(c->fd, hw, PEER_HELLO_V4_WIRE, deadline, NULL, false);
    if (ret < 0)
        return fail(c, ret);
    peer_hello_dec(&hello, hw);
    /* Another version (or byte order, before version 3): refused here, a
     * clean unreachable member, never a misjudged answer. */
    if (hello.magic != PEER_MAGIC || hello.version != PEER_VERSION)
        return fail(c, -EPROTO);
    ret = peer_recv_all(c->fd, hw + PEER_HELLO_V4_WIRE, sizeof(hw) - PEER_HELLO_V4_WIRE, deadline,
                        NULL, false);
    if (ret < 0)
        return fail(c, ret);
    peer_hello_dec(&hello, hw);
    if (peer_geometry_check(&hello.g) < 0)
        return fail(c, -EPROTO);
    /* A member with a key talks only to one that proves it has it; one
     * without a key cannot answer a server that asks for it. */
    if (!!(hello.flags & PEER_HELLO_AUTH) != !!c->key)
        return fail(c, -EACCES);
    if (c->key) {
        uint8_t msg[PEER_AUTH_WIRE], want[PEER_PROOF], got[PEER_PROOF];

        ret = peer_auth_client(c->key, hw, sizeof(hw), msg, want, &c->sess);
        if (ret == 0)
            ret = peer_send_all(c->fd, msg, sizeof(msg), deadline, NULL);
        if (ret == 0)
            ret = peer_recv_all(c->fd, got, sizeof(got), deadline, NULL, false);
        /* A server of another key closes without a proof. */
        if (ret == -ECONNRESET || (ret == 0 && !peer_proof_equal(want, got)))
            ret = -EACCES;
        if (ret < 0)
            return fail(c, ret);
    }
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
    uint8_t qw[PEER_REQ_WIRE + PEER_TAG], rw[PEER_REP_WIRE];

    peer_req_enc(qw, q);
    for (int attempt = 0;; attempt++) {
        bool reused = c->fd >= 0;
        int ret = peer_conn_open(c, member, deadline_ms);

        if (ret < 0)
            return ret;
        /* The tag of this connection's next request (a fresh connection
         * is a fresh session). */
        if (c->sess.on &&
            peer_req_tag(&c->sess, qw, payload, payload ? q->len : 0, qw + PEER_REQ_WIRE) < 0)
            return fail(c, -ENOMEM);
        *deadline = peer_net_mono_ns() + (int64_t)deadline_ms * 1000000;
        ret = peer_send_all(c->fd, qw, peer_conn_req_wire(c), *deadline, NULL);
        if (ret == 0 && payload && q->len)
            ret = peer_send_all(c->fd, payload, q->len, *deadline, NULL);
        if (ret == 0)
            ret = peer_recv_all(c->fd, rw, sizeof(rw), *deadline, NULL, false);
        if (ret == 0)
            peer_rep_dec(rep, rw);
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

/* n header copies, each followed by the seq read after it, off c's socket
 * under deadline. 0, or -errno (c failed). */
static int recv_hdrs(struct peer_conn *c, struct peer_slot_hdr *hdrs, uint64_t *after, size_t n,
                     int64_t deadline)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t w[PEER_HDR_WIRE];
        int ret = peer_recv_all(c->fd, w, sizeof(w), deadline, NULL, false);

        if (ret < 0)
            return fail(c, ret);
        peer_hdr_dec(&hdrs[i], &after[i], w);
    }
    return 0;
}

int peer_conn_read_hdrs(struct peer_conn *c, const char *member, unsigned deadline_ms,
                        uint64_t bucket, struct peer_slot_hdr *hdrs, uint64_t *seq_after)
{
    struct peer_req q = peer_req_at(PEER_OP_READ_HDRS, bucket);
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
    return recv_hdrs(c, hdrs, seq_after, c->g.ways, deadline);
}

int peer_conn_read_hdrs_multi(struct peer_conn *c, const char *member, unsigned deadline_ms,
                              const uint64_t *buckets, uint32_t count, struct peer_slot_hdr *hdrs,
                              uint64_t *seq_after)
{
    struct peer_req q = peer_req_at(PEER_OP_READ_HDRS_MULTI, 0);
    uint8_t bw[PEER_BATCH_MAX * 8];
    struct peer_rep rep;
    int64_t deadline;
    int ret;

    q.nways = count;
    q.len = count * 8u;
    if (count == 0 || count > PEER_BATCH_MAX || c->fd < 0)
        return -EINVAL;
    for (uint32_t i = 0; i < count; i++)
        peer_put64(bw + 8 * i, buckets[i]);
    ret = call(c, member, deadline_ms, &q, bw, &rep, &deadline);
    if (ret < 0)
        return ret;
    if (rep.status)
        return fail(c, -EPROTO);
    return recv_hdrs(c, hdrs, seq_after, (size_t)count * c->g.ways, deadline);
}

int peer_conn_read_slot(struct peer_conn *c, const char *member, unsigned deadline_ms,
                        uint64_t bucket, uint32_t way, uint32_t len, struct peer_slot_hdr *hdr,
                        uint64_t *seq_after, void *buf)
{
    struct peer_req q = peer_req_at(PEER_OP_READ_SLOT, bucket);
    struct peer_rep rep;
    int64_t deadline;
    int ret;

    q.way = way;
    q.nways = 1;
    q.len = len;
    ret = call(c, member, deadline_ms, &q, NULL, &rep, &deadline);
    if (ret < 0)
        return ret;
    if (rep.status)
        return fail(c, -EPROTO);
    ret = recv_hdrs(c, hdr, seq_after, 1, deadline);
    if (ret == 0 && (ret = peer_recv_all(c->fd, buf, len, deadline, NULL, false)) < 0)
        return fail(c, ret);
    return ret;
}

int peer_conn_write(struct peer_conn *c, const char *member, unsigned deadline_ms, uint64_t bucket,
                    uint32_t way, uint64_t expect, const struct peer_hash *h, const void *payload,
                    uint32_t len, uint64_t stamp, uint64_t *found)
{
    struct peer_req q = peer_req_at(PEER_OP_WRITE, bucket);
    struct peer_rep rep;
    int64_t deadline;
    int ret;

    q.way = way;
    q.nways = 1;
    q.expect = expect;
    q.hash_lo = h->lo;
    q.hash_hi = h->hi;
    q.len = len;
    q.stamp = stamp;
    ret = call(c, member, deadline_ms, &q, payload, &rep, &deadline);
    if (ret < 0)
        return ret;
    if (rep.status == -EAGAIN) {
        *found = rep.seq;
        return -EAGAIN;
    }
    return rep.status ? fail(c, -EPROTO) : 0;
}

int peer_conn_open_fresh(struct peer_conn *c, const char *member, unsigned deadline_ms)
{
    char b;

    /* A connection the member closed reads EOF (or an error) at once. */
    if (c->fd >= 0 && recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) >= 0)
        peer_conn_close(c); /* EOF, or bytes nobody asked for: start again */
    else if (c->fd >= 0 && errno != EAGAIN && errno != EWOULDBLOCK)
        peer_conn_close(c);
    return peer_conn_open(c, member, deadline_ms);
}

/* --- pipelined batches --- */

/* The next bytes of b's request stream: the current call's request, then a
 * WRITE's payload. false when everything is sent. */
static bool tx_next(struct peer_batch *b, const uint8_t **p, size_t *n)
{
    while (b->tx_call < b->n) {
        const struct peer_call *k = &b->calls[b->tx_call];

        if (b->tx_stage == 0) {
            *p = k->wire;
            *n = peer_conn_req_wire(b->c);
        } else if (b->tx_stage == 1 && k->q.op == PEER_OP_WRITE && k->q.len) {
            *p = k->payload;
            *n = k->q.len;
        } else {
            b->tx_call++;
            b->tx_stage = 0;
            b->tx_off = 0;
            continue;
        }
        if (b->tx_off < *n) {
            *p += b->tx_off;
            *n -= b->tx_off;
            return true;
        }
        b->tx_stage++;
        b->tx_off = 0;
    }
    return false;
}

/*
 * The answer stream of one call: stage 0 the peer_rep's image, into
 * scratch; stage 1 the header images (READ_HDRS: ways x PEER_HDR_WIRE;
 * READ_GET: one more, the way's), into scratch; stage 2 nothing; stage 3 the
 * payload (READ_GET with a way: into the call's buf). Where the next bytes
 * go; *n 0 when the call is complete.
 */
static void rx_next(struct peer_batch *b, uint8_t **p, size_t *n)
{
    struct peer_call *k = &b->calls[b->rx_call];
    uint32_t ways = b->c->g.ways;

    *n = 0;
    switch (b->rx_stage) {
    case 0:
        *p = b->scratch;
        *n = PEER_REP_WIRE;
        break;
    case 1:
        /* READ_GET: the way's header (zeros for none) too, in one read. */
        if (k->q.op != PEER_OP_WRITE) {
            *p = b->scratch;
            *n = ((size_t)ways + (k->q.op == PEER_OP_READ_GET)) * PEER_HDR_WIRE;
        }
        break;
    case 3:
        if (k->q.op == PEER_OP_READ_GET && k->rep.status >= 0) {
            *p = k->buf;
            *n = k->q.len;
        }
        break;
    default:
        break;
    }
}

/* The answer's peer_rep image at w, into k->rep: 0, or -EPROTO when the
 * request does not allow it. */
static int rep_store(struct peer_call *k, uint32_t ways, const uint8_t *w)
{
    peer_rep_dec(&k->rep, w);
    if (k->rep.magic != PEER_MAGIC)
        return -EPROTO;
    if (k->q.op == PEER_OP_WRITE)
        return k->rep.status == 0 || k->rep.status == -EAGAIN ? 0 : -EPROTO;
    if (k->q.op == PEER_OP_READ_GET)
        return k->rep.status == -ENOENT || (k->rep.status >= 0 && (uint32_t)k->rep.status < ways)
                   ? 0
                   : -EPROTO;
    return k->rep.status == 0 ? 0 : -EPROTO;
}

/* The header images at w (READ_GET: the way's one more), into k. */
static void hdrs_store(struct peer_call *k, uint32_t ways, const uint8_t *w)
{
    for (uint32_t i = 0; i < ways; i++)
        peer_hdr_dec(&k->hdrs[i], &k->after[i], w + (size_t)i * PEER_HDR_WIRE);
    if (k->q.op == PEER_OP_READ_GET)
        peer_hdr_dec(&k->hdr, &k->hdr_after, w + (size_t)ways * PEER_HDR_WIRE);
}

/* Stage rx_stage of the current call arrived whole: check and store it.
 * 0, or -EPROTO (the member answered something the request does not allow). */
static int rx_stage_done(struct peer_batch *b)
{
    struct peer_call *k = &b->calls[b->rx_call];
    uint32_t ways = b->c->g.ways;

    switch (b->rx_stage) {
    case 0:
        return rep_store(k, ways, b->scratch);
    case 1:
        hdrs_store(k, ways, b->scratch);
        return 0;
    default:
        return 0;
    }
}

/* Advance rx past stages with no bytes; true when every call is answered. */
static bool rx_settle(struct peer_batch *b, uint8_t **p, size_t *n)
{
    while (b->rx_call < b->n) {
        rx_next(b, p, n);
        if (*n > b->rx_off) {
            *p += b->rx_off;
            *n -= b->rx_off;
            return false;
        }
        if (++b->rx_stage > 3) {
            b->calls[b->rx_call].err = 0;
            b->rx_call++;
            b->rx_stage = 0;
        }
        b->rx_off = 0;
    }
    return true;
}

/* Move what the socket takes and gives now. 0 (progress or none), 1 when
 * the batch is complete, or -errno (the connection failed). */
static int batch_step(struct peer_batch *b, short revents)
{
    const uint8_t *tp;
    uint8_t *rp;
    size_t n;
    ssize_t r;

    while ((revents & POLLOUT) && tx_next(b, &tp, &n)) {
        r = send(b->c->fd, tp, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -errno;
        }
        b->tx_off += (size_t)r;
        b->last_ns = peer_net_mono_ns();
    }
    while (!rx_settle(b, &rp, &n)) {
        if (!(revents & (POLLIN | POLLHUP | POLLERR)))
            return 0;
        r = recv(b->c->fd, rp, n, MSG_DONTWAIT);
        if (r == 0)
            return -ECONNRESET;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            return -errno;
        }
        b->last_ns = peer_net_mono_ns();
        b->rx_off += (size_t)r;
        rx_next(b, &rp, &n);
        if (b->rx_off == n) {
            int ret = rx_stage_done(b);

            if (ret < 0)
                return ret;
            b->rx_stage++;
            b->rx_off = 0;
        }
    }
    return 1;
}

/* A batch's exchange with one member ends by this many deadlines. */
#define PEER_BATCH_DEADLINES 4

/* More to receive before end: the next recv's SO_RCVTIMEO shrunk to what
 * is left of the call's deadline, so the call as a whole ends by then (one
 * recv's timeout alone would let a member that sends a byte now and then
 * hold it forever). False when nothing is left. */
static bool rcv_within(struct peer_conn *c, int64_t end)
{
    int64_t left_ms = (end - peer_net_mono_ns()) / 1000000;

    if (left_ms <= 0)
        return false;
    if ((unsigned)left_ms < c->rcvtimeo_ms) {
        struct timeval tv = {.tv_sec = left_ms / 1000, .tv_usec = (left_ms % 1000) * 1000};

        if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
            return false;
        c->rcvtimeo_ms = (unsigned)left_ms;
    }
    return true;
}

/*
 * One READ_GET alone on its connection (one owner, one key: a single get),
 * without poll: the request in one send, then blocking recvs under
 * SO_RCVTIMEO = deadline_ms, so a recv fails after deadline_ms with no byte
 * moved, as the batch's poll does. The first recv takes the answer's fixed
 * part and whatever payload has arrived with it (two iovecs: scratch, then
 * the call's buf); the rest of the payload follows with MSG_WAITALL. With
 * one request in flight nothing but its answer can arrive, so a recv never
 * takes bytes of another. 0, or -errno (the connection failed).
 */
static int one_get(struct peer_batch *b, unsigned deadline_ms)
{
    struct peer_call *k = &b->calls[0];
    struct peer_conn *c = b->c;
    uint32_t ways = c->g.ways;
    size_t fixed = PEER_REP_WIRE + ((size_t)ways + 1) * PEER_HDR_WIRE, want = 0, got = 0;
    int64_t end = peer_net_mono_ns() + (int64_t)deadline_ms * 1000000;
    ssize_t r;

    if (c->rcvtimeo_ms != deadline_ms) {
        struct timeval tv = {.tv_sec = deadline_ms / 1000,
                             .tv_usec = (suseconds_t)(deadline_ms % 1000) * 1000};

        if (setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
            return -errno;
        c->rcvtimeo_ms = deadline_ms;
    }
    r = send(c->fd, k->wire, peer_conn_req_wire(c), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return -errno;
    if (r < (ssize_t)peer_conn_req_wire(c)) {
        size_t off = r > 0 ? (size_t)r : 0;
        int ret = peer_send_all(c->fd, k->wire + off, peer_conn_req_wire(c) - off,
                                peer_net_mono_ns() + (int64_t)deadline_ms * 1000000, NULL);

        if (ret < 0)
            return ret;
    }
    /* want 0: the fixed part is not in yet; then fixed (+ len with a way). */
    for (bool first = true; want == 0 || got < want; first = false) {
        struct iovec iov[2] = {{b->scratch + got, fixed - got}, {k->buf, k->q.len}};
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = 2};

        if (!first && !rcv_within(c, end))
            return -ETIMEDOUT; /* a member that trickles is one that does not answer */
        if (want) {
            iov[0] = (struct iovec){(uint8_t *)k->buf + (got - fixed), want - got};
            m.msg_iovlen = 1;
        }
        r = recvmsg(c->fd, &m, want ? MSG_WAITALL : 0);
        if (r == 0)
            return -ECONNRESET;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
        }
        got += (size_t)r;
        if (want == 0 && got >= fixed) {
            int ret = rep_store(k, ways, b->scratch);

            if (ret < 0)
                return ret;
            hdrs_store(k, ways, b->scratch + PEER_REP_WIRE);
            want = fixed + (k->rep.status >= 0 ? k->q.len : 0);
            if (got > want)
                return -EPROTO; /* payload bytes after a miss */
        }
    }
    k->err = 0;
    b->rx_call = 1;
    return 0;
}

size_t peer_conn_batch_run(struct peer_batch *b, size_t nb, unsigned deadline_ms)
{
    struct pollfd pf[PEER_MEMBERS_MAX];
    size_t idx[PEER_MEMBERS_MAX], answered = 0;
    int64_t dl = (int64_t)deadline_ms * 1000000, now = peer_net_mono_ns();
    /* Besides no byte moved for a deadline, every member's exchange ends by
     * PEER_BATCH_DEADLINES deadlines in all: one that trickles a byte now
     * and then is one that does not answer. */
    int64_t end = now + PEER_BATCH_DEADLINES * dl;

    if (nb > PEER_MEMBERS_MAX)
        nb = PEER_MEMBERS_MAX;
    for (size_t i = 0; i < nb; i++) {
        b[i].tx_call = b[i].tx_off = b[i].rx_call = b[i].rx_off = 0;
        b[i].tx_stage = b[i].rx_stage = 0;
        b[i].last_ns = now;
        for (size_t j = 0; j < b[i].n; j++) {
            struct peer_call *k = &b[i].calls[j];
            bool w = k->q.op == PEER_OP_WRITE;

            k->err = -EHOSTUNREACH;
            peer_req_enc(k->wire, &k->q);
            /* Tagged in the order they go (a connection that fails on the
             * way is closed, its session with it). */
            if (b[i].c->sess.on && peer_req_tag(&b[i].c->sess, k->wire, w ? k->payload : NULL,
                                                w ? k->q.len : 0, k->wire + PEER_REQ_WIRE) < 0)
                fail(b[i].c, -ENOMEM);
        }
    }
    if (nb == 1 && b->n == 1 && b->c->fd >= 0 && b->calls[0].q.op == PEER_OP_READ_GET &&
        b->calls[0].buf) {
        int ret = one_get(b, deadline_ms);

        if (ret < 0)
            fail(b->c, ret);
        return ret < 0 ? 0 : 1;
    }
    for (;;) {
        int64_t wait = -1;
        size_t np = 0;

        now = peer_net_mono_ns();
        for (size_t i = 0; i < nb; i++) {
            const uint8_t *tp;
            size_t n;

            if (b[i].c->fd < 0 || b[i].rx_call == b[i].n)
                continue;
            if (now - b[i].last_ns >= dl || now >= end) {
                fail(b[i].c, -ETIMEDOUT); /* its unanswered calls keep err < 0 */
                continue;
            }
            if (wait < 0 || b[i].last_ns + dl - now < wait)
                wait = b[i].last_ns + dl - now;
            if (end - now < wait)
                wait = end - now;
            pf[np] = (struct pollfd){.fd = b[i].c->fd, .events = POLLIN};
            if (tx_next(&b[i], &tp, &n))
                pf[np].events |= POLLOUT;
            idx[np++] = i;
        }
        if (np == 0)
            break;
        if (poll(pf, np, (int)((wait + 999999) / 1000000)) < 0 && errno != EINTR)
            break;
        for (size_t j = 0; j < np; j++) {
            struct peer_batch *x = &b[idx[j]];
            int ret;

            if (!pf[j].revents)
                continue;
            ret = batch_step(x, pf[j].revents);
            if (ret < 0)
                fail(x->c, ret);
        }
    }
    for (size_t i = 0; i < nb; i++)
        answered += b[i].rx_call;
    return answered;
}

enum peer_miss peer_call_judge(const struct peer_call *call, uint32_t ways,
                               const struct peer_hash *h, uint32_t len, const void *buf)
{
    enum peer_miss best = PEER_MISS_EMPTY;

    if (call->err < 0)
        return PEER_MISS_UNREACHABLE;
    for (uint32_t w = 0; w < ways; w++) {
        /* Relaxed: private copies off the wire. */
        uint64_t before = atomic_load_explicit(&call->hdrs[w].seq, memory_order_relaxed);
        enum peer_miss r = peer_slot_matches(&call->hdrs[w], before, call->after[w], h, len, NULL);

        if (r == PEER_MISS_EMPTY || r == PEER_MISS_OTHER_KEY) {
            if (best == PEER_MISS_EMPTY)
                best = r;
        } else if (r != PEER_HIT) {
            best = r;
        } else if (call->q.op == PEER_OP_READ_HDRS) {
            return PEER_HIT; /* exists: the header names the key and length */
        }
    }
    if (call->q.op == PEER_OP_READ_GET && call->rep.status >= 0) {
        /* Relaxed: a private copy. */
        uint64_t before = atomic_load_explicit(&call->hdr.seq, memory_order_relaxed);
        enum peer_miss r = peer_slot_matches(&call->hdr, before, call->hdr_after, h, len, buf);

        if (r == PEER_HIT)
            return PEER_HIT;
        best = r;
    }
    return best;
}

enum peer_miss peer_conn_get(struct peer_conn *c, const char *member, unsigned deadline_ms,
                             const struct peer_hash *h, uint32_t len, void *buf)
{
    struct peer_slot_hdr hdrs[PEER_WAYS_MAX];
    uint64_t after[PEER_WAYS_MAX];
    struct peer_call k = {.buf = buf, .hdrs = hdrs, .after = after};
    struct peer_batch *b;
    enum peer_miss r;

    if (peer_conn_open_fresh(c, member, deadline_ms) < 0)
        return PEER_MISS_UNREACHABLE;
    if (len > c->g.max_payload)
        return PEER_MISS_LENGTH;
    b = malloc(sizeof(*b));
    if (!b)
        return PEER_MISS_UNREACHABLE;
    k.q = peer_req_for(PEER_OP_READ_GET, h, &c->g);
    k.q.len = len;
    *b = (struct peer_batch){.c = c, .member = member, .calls = &k, .n = 1};
    peer_conn_batch_run(b, 1, deadline_ms);
    free(b);
    r = peer_call_judge(&k, c->g.ways, h, len, buf);
    return r;
}
