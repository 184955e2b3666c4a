/* SPDX-License-Identifier: MIT */
/*
 * peer_net.c - the peer tier's wire (protocol: peer_i.h): the messages'
 * little-endian images, the request check the server applies to every
 * request, addresses, and the blocking socket I/O under a deadline that the
 * server (peer_server.c) and the client (peer_client.c) share.
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
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t peer_net_mono_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Split "host:port" (the last ':' separates; [v6] accepted). */
static int split_addr(const char *addr, char *host, size_t hlen, char *port, size_t plen)
{
    const char *c = strrchr(addr, ':');
    size_t n;

    if (!c || c == addr || c[1] == '\0' || strlen(c + 1) >= plen)
        return -EINVAL;
    n = (size_t)(c - addr);
    if (addr[0] == '[' && n >= 2 && addr[n - 1] == ']') {
        addr++;
        n -= 2;
    }
    if (n >= hlen)
        return -EINVAL;
    memcpy(host, addr, n);
    host[n] = '\0';
    strcpy(port, c + 1);
    return 0;
}

int peer_resolve(const char *addr, bool passive, struct addrinfo **res)
{
    char host[256], port[16];
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};

    if (split_addr(addr, host, sizeof(host), port, sizeof(port)) < 0)
        return -EINVAL;
    hints.ai_flags |= AI_NUMERICSERV;
    if (getaddrinfo(host, port, &hints, res) != 0)
        return -EHOSTUNREACH;
    return 0;
}

/* --- wire images --- */

/*
 * The format, one table a message: each field's offset in the image, its
 * width (little-endian) and where it lives in the struct. The offsets are
 * the structs' own on a little-endian host, stated here so that no ABI's
 * padding can move them. Bytes no field names (a header's pad) are zeros.
 */
struct wire_field {
    uint8_t off, width;
    uint16_t at;
};

#define WF(off, type, field)                                                                       \
    {                                                                                              \
        off, sizeof(((type *)0)->field), offsetof(type, field)                                     \
    }

static const struct wire_field HELLO_F[] = {
    WF(0, struct peer_hello, magic),          WF(4, struct peer_hello, version),
    WF(8, struct peer_hello, g.num_buckets),  WF(16, struct peer_hello, g.ways),
    WF(20, struct peer_hello, g.max_payload), WF(24, struct peer_hello, g.stride),
    WF(32, struct peer_hello, flags),
};

/* The hello's nonce: bytes, at this offset (after the flags and 4 zeros). */
#define HELLO_NONCE_OFF 40u
_Static_assert(HELLO_NONCE_OFF + PEER_NONCE == PEER_HELLO_WIRE, "the nonce ends the hello");

static const struct wire_field REQ_F[] = {
    WF(0, struct peer_req, magic),    WF(4, struct peer_req, version),
    WF(6, struct peer_req, op),       WF(8, struct peer_req, bucket),
    WF(16, struct peer_req, way),     WF(20, struct peer_req, nways),
    WF(24, struct peer_req, expect),  WF(32, struct peer_req, hash_lo),
    WF(40, struct peer_req, hash_hi), WF(48, struct peer_req, len),
    WF(52, struct peer_req, pad),     WF(56, struct peer_req, stamp),
};

static const struct wire_field REP_F[] = {
    WF(0, struct peer_rep, magic),
    WF(4, struct peer_rep, status),
    WF(8, struct peer_rep, seq),
};

/* A header's seq goes as the plain word it is in a private copy. */
static const struct wire_field HDR_F[] = {
    WF(0, struct peer_slot_hdr, seq),      WF(8, struct peer_slot_hdr, hash_lo),
    WF(16, struct peer_slot_hdr, hash_hi), WF(24, struct peer_slot_hdr, len),
    WF(28, struct peer_slot_hdr, magic),   WF(32, struct peer_slot_hdr, csum),
    WF(40, struct peer_slot_hdr, stamp),
};

#define NF(t) (sizeof(t) / sizeof((t)[0]))

static void enc(uint8_t *out, size_t size, const void *m, const struct wire_field *f, size_t n)
{
    memset(out, 0, size);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = (const uint8_t *)m + f[i].at;
        uint64_t v;

        if (f[i].width == 2) {
            uint16_t x;

            memcpy(&x, p, 2);
            v = x;
        } else if (f[i].width == 4) {
            uint32_t x;

            memcpy(&x, p, 4);
            v = x;
        } else {
            memcpy(&v, p, 8);
        }
        for (unsigned b = 0; b < f[i].width; b++)
            out[f[i].off + b] = (uint8_t)(v >> (8 * b));
    }
}

static void dec(void *m, size_t size, const uint8_t *in, const struct wire_field *f, size_t n)
{
    memset(m, 0, size);
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = (uint8_t *)m + f[i].at;
        uint64_t v = 0;

        for (unsigned b = 0; b < f[i].width; b++)
            v |= (uint64_t)in[f[i].off + b] << (8 * b);
        if (f[i].width == 2) {
            uint16_t x = (uint16_t)v;

            memcpy(p, &x, 2);
        } else if (f[i].width == 4) {
            uint32_t x = (uint32_t)v;

            memcpy(p, &x, 4);
        } else {
            memcpy(p, &v, 8);
        }
    }
}

void peer_hello_enc(uint8_t *out, const struct peer_hello *m)
{
    enc(out, PEER_HELLO_WIRE, m, HELLO_F, NF(HELLO_F));
    memcpy(out + HELLO_NONCE_OFF, m->nonce, PEER_NONCE);
}

void peer_hello_dec(struct peer_hello *m, const uint8_t *in)
{
    dec(m, sizeof(*m), in, HELLO_F, NF(HELLO_F));
    memcpy(m->nonce, in + HELLO_NONCE_OFF, PEER_NONCE);
}

void peer_req_enc(uint8_t *out, const struct peer_req *q)
{
    enc(out, PEER_REQ_WIRE, q, REQ_F, NF(REQ_F));
}

void peer_req_dec(struct peer_req *q, const uint8_t *in)
{
    dec(q, sizeof(*q), in, REQ_F, NF(REQ_F));
}

void peer_rep_enc(uint8_t *out, const struct peer_rep *r)
{
    enc(out, PEER_REP_WIRE, r, REP_F, NF(REP_F));
}

void peer_rep_dec(struct peer_rep *r, const uint8_t *in)
{
    dec(r, sizeof(*r), in, REP_F, NF(REP_F));
}

void peer_hdr_enc(uint8_t *out, const struct peer_slot_hdr *h, uint64_t after)
{
    enc(out, PEER_HDR_SIZE, h, HDR_F, NF(HDR_F));
    peer_put64(out + PEER_HDR_SIZE, after);
}

void peer_hdr_dec(struct peer_slot_hdr *h, uint64_t *after, const uint8_t *in)
{
    dec(h, sizeof(*h), in, HDR_F, NF(HDR_F));
    *after = peer_get64(in + PEER_HDR_SIZE);
}

int peer_req_check(const struct peer_req *q, const struct peer_geometry *g)
{
    if (q->magic != PEER_MAGIC || q->version != PEER_VERSION || q->bucket >= g->num_buckets)
        return -EINVAL;
    switch (q->op) {
    case PEER_OP_READ_HDRS:
        if (q->nways == 0 || q->way >= g->ways || q->nways > g->ways - q->way || q->len)
            return -EINVAL;
        return 0;
    case PEER_OP_READ_HDRS_MULTI:
        if (q->nways == 0 || q->nways > PEER_BATCH_MAX || q->way || q->len != q->nways * 8u)
            return -EINVAL;
        return 0; /* each bucket that follows is checked when read */
    case PEER_OP_READ_GET:
        if (q->way || q->nways || q->len > g->max_payload)
            return -EINVAL;
        return 0;
    case PEER_OP_READ_SLOT:
    case PEER_OP_WRITE:
        if (q->way >= g->ways || q->nways != 1 || q->len > g->max_payload)
            return -EINVAL;
        if (q->op == PEER_OP_WRITE && q->expect & 1)
            return -EINVAL;
        return 0;
    default:
        return -EINVAL;
    }
}

/* --- blocking I/O under a deadline (0: none; the server's sockets have a
 * receive timeout instead) --- */

int peer_wait_fd(int fd, short ev, int64_t deadline_ns)
{
    struct pollfd p = {.fd = fd, .events = ev};
    int64_t left;
    int r;

    if (!deadline_ns)
        return 0;
    left = deadline_ns - peer_net_mono_ns();
    if (left <= 0)
        return -ETIMEDOUT;
    r = poll(&p, 1, (int)((left + 999999) / 1000000));
    if (r == 0)
        return -ETIMEDOUT;
    return r < 0 ? -errno : 0;
}

/*
 * Without a deadline (the server's side) a socket timeout of 200 ms wakes
 * the call: it gives up when the server stops, or when a message it has
 * started stalls PEER_STALLS_MAX times in a row (10 s: a peer that stops
 * reading or sending mid-message does not hold a thread forever). A
 * connection idle between requests is kept.
 */
#define PEER_STALLS_MAX 50

static bool stalled(const _Atomic bool *stop, unsigned *stalls, bool started)
{
    /* Relaxed: a stop flag polled once a socket timeout. */
    if (stop && atomic_load_explicit(stop, memory_order_relaxed))
        return true;
    return started && ++*stalls >= PEER_STALLS_MAX;
}

/* n bytes to (tx) or from fd: the one loop of both directions. A send
 * never writes through p. */
static int xfer_all(int fd, uint8_t *p, size_t n, bool tx, int64_t deadline_ns,
                    const _Atomic bool *stop, bool started)
{
    const uint8_t *first = p;
    unsigned stalls = 0;

    while (n) {
        int fl = deadline_ns ? MSG_DONTWAIT : 0;
        int r = peer_wait_fd(fd, tx ? POLLOUT : POLLIN, deadline_ns);
        ssize_t got;

        if (r < 0)
            return r;
        got = tx ? send(fd, p, n, fl | MSG_NOSIGNAL) : recv(fd, p, n, fl);
        if (got == 0 && !tx)
            return -ECONNRESET;
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN && (deadline_ns || !stalled(stop, &stalls, started || p != first)))
                continue;
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        }
        stalls = 0;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

int peer_send_all(int fd, const void *buf, size_t n, int64_t deadline_ns, const _Atomic bool *stop)
{
    return xfer_all(fd, (uint8_t *)buf, n, true, deadline_ns, stop, true);
}

int peer_recv_all(int fd, void *buf, size_t n, int64_t deadline_ns, const _Atomic bool *stop,
                  bool started)
{
    return xfer_all(fd, buf, n, false, deadline_ns, stop, started);
}
