/* SPDX-License-Identifier: MIT */
/*
 * peer_net.c - the peer tier's TCP server and client (protocol: peer_i.h).
 *
 * Server: one accept thread and one thread per connection, at most
 * PEER_CONNS_MAX connections (more are closed at accept), and, once the
 * backend gave a members list, only from the members' addresses. The server does no
 * lookup and keeps no per-key state: it copies bytes of the region under the
 * seqlock (peer_slot_copy) and sends them with the seq it read after the
 * copy, or applies a conditional write (peer_slot_write). Every request is
 * checked against the geometry first (peer_req_check): a bad magic, version,
 * op, bucket, way range or length closes that connection only. Lengths the
 * server allocates or reads for are bounded by the geometry it announced
 * (max_payload), never by the request alone.
 *
 * Client: one blocking socket per member, every call under a deadline
 * (poll before each send/recv). A member that fails a call is closed and
 * marked down for PEER_DOWN_MS: calls in that window fail at once with
 * -EHOSTUNREACH, so a dead host costs one deadline, not one per key.
 */
#include "backend_i.h"
#include "peer_i.h"

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

#define PEER_CONNS_MAX 64
#define PEER_DOWN_MS   1000

static int64_t mono_ns(void)
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

static int resolve(const char *addr, bool passive, struct addrinfo **res)
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

static int wait_fd(int fd, short ev, int64_t deadline_ns)
{
    struct pollfd p = {.fd = fd, .events = ev};
    int64_t left;
    int r;

    if (!deadline_ns)
        return 0;
    left = deadline_ns - mono_ns();
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

static int send_all(int fd, const void *buf, size_t n, int64_t deadline_ns,
                    const _Atomic bool *stop)
{
    const uint8_t *p = buf;
    unsigned stalls = 0;

    while (n) {
        ssize_t w;
        int r = wait_fd(fd, POLLOUT, deadline_ns);

        if (r < 0)
            return r;
        w = send(fd, p, n, MSG_NOSIGNAL | (deadline_ns ? MSG_DONTWAIT : 0));
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN && (deadline_ns || !stalled(stop, &stalls, true)))
                continue;
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        }
        stalls = 0;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t n, int64_t deadline_ns, const _Atomic bool *stop,
                    bool started)
{
    uint8_t *p = buf;
    unsigned stalls = 0;

    while (n) {
        ssize_t got;
        int r = wait_fd(fd, POLLIN, deadline_ns);

        if (r < 0)
            return r;
        got = recv(fd, p, n, deadline_ns ? MSG_DONTWAIT : 0);
        if (got == 0)
            return -ECONNRESET;
        if (got < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN &&
                (deadline_ns || !stalled(stop, &stalls, started || p != (uint8_t *)buf)))
                continue;
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        }
        stalls = 0;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

/* --- server --- */

struct peer_server {
    struct peer_region *r;
    int lfd;
    pthread_t acceptor;
    _Atomic bool stop;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    unsigned nconns; /* lock */
    /* lock: when nallow > 0, only connections from these addresses are
     * served (the members' hosts; the port is the peer's own, not compared). */
    struct sockaddr_storage *allow;
    size_t nallow;
};

struct conn_arg {
    struct peer_server *s;
    int fd;
};

/* One request; 0 to go on, < 0 to close the connection. */
static int serve_one(struct peer_server *s, int fd, uint8_t *buf)
{
    const struct peer_geometry *g = &s->r->g;
    struct peer_req q;
    struct peer_rep rep = {.magic = PEER_MAGIC};
    size_t n = 0;
    int ret = recv_all(fd, &q, sizeof(q), 0, &s->stop, false);

    if (ret < 0)
        return ret;
    if (peer_req_check(&q, g) < 0)
        return -EINVAL;
    switch (q.op) {
    case PEER_OP_READ_HDRS:
        /* buf holds enough for any answer: see conn_main. */
        memcpy(buf, &rep, sizeof(rep));
        n = sizeof(rep);
        for (uint32_t w = q.way; w < q.way + q.nways; w++) {
            struct peer_slot_hdr h;
            uint64_t before, after = peer_slot_copy(s->r, q.bucket, w, &h, &before, NULL, 0);

            memcpy(buf + n, &h, sizeof(h));
            memcpy(buf + n + sizeof(h), &after, 8);
            n += sizeof(h) + 8;
        }
        break;
    case PEER_OP_READ_HDRS_MULTI: {
        uint64_t b[PEER_BATCH_MAX];

        ret = recv_all(fd, b, q.len, 0, &s->stop, true);
        if (ret < 0)
            return ret;
        memcpy(buf, &rep, sizeof(rep));
        n = sizeof(rep);
        for (uint32_t i = 0; i < q.nways; i++) {
            if (b[i] >= g->num_buckets)
                return -EINVAL; /* closes the connection, as any bad field */
            for (uint32_t w = 0; w < g->ways; w++) {
                struct peer_slot_hdr h;
                uint64_t before, after = peer_slot_copy(s->r, b[i], w, &h, &before, NULL, 0);

                memcpy(buf + n, &h, sizeof(h));
                memcpy(buf + n + sizeof(h), &after, 8);
                n += sizeof(h) + 8;
            }
        }
        break;
    }
    case PEER_OP_READ_SLOT: {
        struct peer_slot_hdr h;
        uint64_t before, after;

        memset(buf + sizeof(rep) + sizeof(h) + 8, 0, q.len);
        after = peer_slot_copy(s->r, q.bucket, q.way, &h, &before,
                               buf + sizeof(rep) + sizeof(h) + 8, q.len);
        memcpy(buf, &rep, sizeof(rep));
        memcpy(buf + sizeof(rep), &h, sizeof(h));
        memcpy(buf + sizeof(rep) + sizeof(h), &after, 8);
        n = sizeof(rep) + sizeof(h) + 8 + q.len;
        break;
    }
    case PEER_OP_WRITE: {
        struct peer_hash h = {q.hash_lo, q.hash_hi};

        ret = recv_all(fd, buf, q.len, 0, &s->stop, true);
        if (ret < 0)
            return ret;
        ret = peer_slot_write(s->r, q.bucket, q.way, q.expect, &h, buf, q.len, q.stamp);
        rep.status = ret;
        if (ret == -EAGAIN)
            rep.seq = atomic_load_explicit(&peer_slot(s->r, q.bucket, q.way)->seq,
                                           memory_order_relaxed); /* a report only */
        memcpy(buf, &rep, sizeof(rep));
        n = sizeof(rep);
        break;
    }
    }
    return send_all(fd, buf, n, 0, &s->stop);
}

static void *conn_main(void *arg)
{
    struct conn_arg *ca = arg;
    struct peer_server *s = ca->s;
    int fd = ca->fd;
    const struct peer_geometry *g = &s->r->g;
    size_t cap = sizeof(struct peer_rep) + (size_t)g->ways * (PEER_HDR_SIZE + 8);
    size_t cap2 = sizeof(struct peer_rep) + PEER_HDR_SIZE + 8 + g->max_payload;
    /* READ_HDRS_MULTI: at most 64 x 64 x 72 bytes (288 KiB). */
    size_t cap3 = sizeof(struct peer_rep) + (size_t)PEER_BATCH_MAX * g->ways * (PEER_HDR_SIZE + 8);
    uint8_t *buf;

    if (cap2 > cap)
        cap = cap2;
    if (cap3 > cap)
        cap = cap3;
    buf = malloc(cap);
    struct peer_hello hello = {.magic = PEER_MAGIC, .version = PEER_VERSION, .g = *g};

    free(ca);
    if (buf && send_all(fd, &hello, sizeof(hello), 0, &s->stop) == 0)
        while (serve_one(s, fd, buf) == 0)
            ;
    free(buf);
    close(fd);
    pthread_mutex_lock(&s->lock);
    if (--s->nconns == 0)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

static bool same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

/* Caller holds s->lock. */
static bool allowed(const struct peer_server *s, const struct sockaddr_storage *from)
{
    if (s->nallow == 0)
        return true;
    for (size_t i = 0; i < s->nallow; i++)
        if (same_host(&s->allow[i], from))
            return true;
    return false;
}

int peer_server_allow(struct peer_server *s, char *const *members, size_t n)
{
    struct sockaddr_storage *v = NULL;
    size_t k = 0;

    for (size_t i = 0; i < n; i++) {
        struct addrinfo *res = NULL, *ai;

        if (resolve(members[i], false, &res) < 0)
            continue; /* a member we cannot resolve cannot connect either */
        for (ai = res; ai; ai = ai->ai_next) {
            struct sockaddr_storage *nv;

            if (ai->ai_addrlen > sizeof(*v))
                continue;
            nv = realloc(v, (k + 1) * sizeof(*v));
            if (!nv) {
                freeaddrinfo(res);
                free(v);
                return -ENOMEM;
            }
            v = nv;
            memset(&v[k], 0, sizeof(v[k]));
            memcpy(&v[k++], ai->ai_addr, ai->ai_addrlen);
        }
        freeaddrinfo(res);
    }
    if (n > 0 && k == 0) {
        free(v);
        return -EHOSTUNREACH; /* keep the old list rather than open up */
    }
    pthread_mutex_lock(&s->lock);
    free(s->allow);
    s->allow = v;
    s->nallow = k;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

static void *accept_main(void *arg)
{
    struct peer_server *s = arg;

    /* Relaxed: the stop flag; the poll timeout bounds how late we see it. */
    while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
        struct sockaddr_storage from;
        socklen_t sl;
        struct conn_arg *ca;
        pthread_attr_t at;
        pthread_t t;
        int fd, one = 1;

        if (poll(&p, 1, 200) <= 0)
            continue;
        sl = sizeof(from);
        fd = accept4(s->lfd, (struct sockaddr *)&from, &sl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&s->lock);
        if (s->nconns >= PEER_CONNS_MAX || !allowed(s, &from)) {
            pthread_mutex_unlock(&s->lock);
            close(fd);
            continue;
        }
        s->nconns++;
        pthread_mutex_unlock(&s->lock);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        /* The receive timeout lets a connection thread see stop. */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        ca = malloc(sizeof(*ca));
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (!ca || (ca->s = s, ca->fd = fd, pthread_create(&t, &at, conn_main, ca) != 0)) {
            free(ca);
            close(fd);
            pthread_mutex_lock(&s->lock);
            if (--s->nconns == 0)
                pthread_cond_broadcast(&s->idle);
            pthread_mutex_unlock(&s->lock);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

int peer_server_start(struct peer_server **out, struct peer_region *r, const char *addr,
                      char *errbuf, size_t errlen)
{
    struct addrinfo *res = NULL, *ai;
    struct peer_server *s;
    int ret, one = 1;

    *out = NULL;
    ret = resolve(addr, true, &res);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "peer: listen address '%s': not host:port", addr);
        return ret;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        freeaddrinfo(res);
        return -ENOMEM;
    }
    s->r = r;
    s->lfd = -1;
    for (ai = res; ai; ai = ai->ai_next) {
        s->lfd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, 0);
        if (s->lfd < 0)
            continue;
        setsockopt(s->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(s->lfd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(s->lfd, 64) == 0)
            break;
        close(s->lfd);
        s->lfd = -1;
    }
    ret = s->lfd < 0 ? -errno : 0;
    freeaddrinfo(res);
    if (ret < 0) {
        sfs_errf(errbuf, errlen, "peer: listen on '%s': %s", addr, strerror(-ret));
        free(s);
        return ret;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle, NULL);
    ret = -pthread_create(&s->acceptor, NULL, accept_main, s);
    if (ret < 0) {
        close(s->lfd);
        free(s);
        return ret;
    }
    *out = s;
    return 0;
}

void peer_server_stop(struct peer_server *s)
{
    if (!s)
        return;
    /* Relaxed: see accept_main; the joins below order the rest. */
    atomic_store_explicit(&s->stop, true, memory_order_relaxed);
    pthread_join(s->acceptor, NULL);
    close(s->lfd);
    pthread_mutex_lock(&s->lock);
    while (s->nconns)
        pthread_cond_wait(&s->idle, &s->lock);
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->idle);
    free(s->allow);
    free(s);
}

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
    c->down_until_ns = mono_ns() + (int64_t)PEER_DOWN_MS * 1000000;
    return err;
}

static int connect_deadline(const char *member, int64_t deadline_ns)
{
    struct addrinfo *res = NULL, *ai;
    int fd = -1, ret = resolve(member, false, &res), one = 1;

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
        if (wait_fd(fd, POLLOUT, deadline_ns) < 0) {
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
    int64_t deadline = mono_ns() + (int64_t)deadline_ms * 1000000;
    struct peer_hello hello;
    int ret;

    if (c->fd >= 0)
        return 0;
    if (mono_ns() < c->down_until_ns)
        return -EHOSTUNREACH;
    ret = connect_deadline(member, deadline);
    if (ret < 0)
        return fail(c, ret);
    c->fd = ret;
    ret = recv_all(c->fd, &hello, sizeof(hello), deadline, NULL, false);
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
        *deadline = mono_ns() + (int64_t)deadline_ms * 1000000;
        ret = send_all(c->fd, q, sizeof(*q), *deadline, NULL);
        if (ret == 0 && payload && q->len)
            ret = send_all(c->fd, payload, q->len, *deadline, NULL);
        if (ret == 0)
            ret = recv_all(c->fd, rep, sizeof(*rep), *deadline, NULL, false);
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
        ret = recv_all(c->fd, &hdrs[w], sizeof(hdrs[w]), deadline, NULL, false);
        if (ret == 0)
            ret = recv_all(c->fd, &seq_after[w], 8, deadline, NULL, false);
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
        ret = recv_all(c->fd, &hdrs[i], sizeof(hdrs[i]), deadline, NULL, false);
        if (ret == 0)
            ret = recv_all(c->fd, &seq_after[i], 8, deadline, NULL, false);
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
    ret = recv_all(c->fd, hdr, sizeof(*hdr), deadline, NULL, false);
    if (ret == 0)
        ret = recv_all(c->fd, seq_after, 8, deadline, NULL, false);
    if (ret == 0)
        ret = recv_all(c->fd, buf, len, deadline, NULL, false);
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
