/* SPDX-License-Identifier: MIT */
/*
 * peer_net.c - the peer tier's wire (protocol: peer_i.h): the request check
 * the server applies to every request, addresses, and the blocking socket
 * I/O under a deadline that the server (peer_server.c) and the client
 * (peer_client.c) share.
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
