/* SPDX-License-Identifier: MIT */
/*
 * peer_server.c - the peer tier's TCP server (protocol: peer_i.h).
 *
 * One accept thread and one thread per connection, at most
 * PEER_CONNS_MAX connections (more are closed at accept), and, once the
 * backend gave a members list, only from the members' addresses. With the
 * members' key, a connection is served only once its client has proved it
 * holds the key (peer_auth_server), and each request only when its tag is
 * the next one of that connection (peer_req_tag_ok), checked before the
 * request touches the region: a client that fails either is closed without
 * an answer. The server does no
 * lookup and keeps no per-key state: it copies bytes of the region under the
 * seqlock (peer_slot_copy) and sends them with the seq it read after the
 * copy, or applies a conditional write (peer_slot_write). Every request is
 * checked against the geometry first (peer_req_check): a bad magic, version,
 * op, bucket, way range or length closes that connection only. Lengths the
 * server allocates or reads for are bounded by the geometry it announced
 * (max_payload), never by the request alone.
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
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* --- server --- */

struct peer_server {
    struct peer_region *r;
    const struct peer_key *key; /* the members' (NULL: none); the caller's */
    int lfd;
    pthread_t acceptor;
    _Atomic bool stop;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    unsigned nconns; /* lock: threads running (table entries in use) */
    /* lock: the connections, evictable ones included (PEER_CONNS_MAX live,
     * as many again being closed). */
    struct sconn {
        int fd;
        bool used, evicted, answering;
        int64_t last_ns; /* accept, then each request answered */
        struct sockaddr_storage from;
    } conns[2 * PEER_CONNS_MAX];
    /* lock: when nallow > 0, only connections from these addresses are
     * served (the members' hosts; the port is the peer's own, not compared). */
    struct sockaddr_storage *allow;
    size_t nallow;
};

struct conn_arg {
    struct peer_server *s;
    int fd;
    unsigned slot; /* in s->conns */
};

/* One header copy and the seq read after it, at buf (their image). */
static size_t put_hdr(uint8_t *buf, const struct peer_slot_hdr *h, uint64_t after)
{
    peer_hdr_enc(buf, h, after);
    return PEER_HDR_WIRE;
}

/* Header copies of ways [w0, w0 + nw) of bucket, each followed by the seq
 * read after it, at buf; returns the bytes written (nw x 72). */
static size_t put_hdrs(const struct peer_region *r, uint64_t bucket, uint32_t w0, uint32_t nw,
                       uint8_t *buf)
{
    size_t n = 0;

    for (uint32_t w = w0; w < w0 + nw; w++) {
        struct peer_slot_hdr h;
        uint64_t before, after = peer_slot_copy(r, bucket, w, &h, &before, NULL, 0);

        n += put_hdr(buf + n, &h, after);
    }
    return n;
}

/* One request; 0 to go on, < 0 to close the connection. With a session,
 * its tag follows its image and is checked, over the image and the body
 * (a write's payload, READ_HDRS_MULTI's buckets), before anything is done. */
static int serve_one(struct peer_server *s, int fd, unsigned slot, uint8_t *buf,
                     struct peer_sess *ss)
{
    const struct peer_geometry *g = &s->r->g;
    uint8_t qw[PEER_REQ_WIRE + PEER_TAG], b[PEER_BATCH_MAX * 8];
    struct peer_req q;
    struct peer_rep rep = {.magic = PEER_MAGIC};
    const uint8_t *body = NULL;
    size_t n = 0;
    int ret = peer_recv_all(fd, qw, PEER_REQ_WIRE + (ss->on ? PEER_TAG : 0), 0, &s->stop, false);

    if (ret < 0)
        return ret;
    peer_req_dec(&q, qw);
    if (peer_req_check(&q, g) < 0)
        return -EINVAL;
    if (q.op == PEER_OP_READ_HDRS_MULTI || q.op == PEER_OP_WRITE) {
        /* q.len is bounded by peer_req_check: 8 x PEER_BATCH_MAX, or the slot
         * (buf holds a slot's payload and more: see conn_main). */
        body = q.op == PEER_OP_WRITE ? buf : b;
        ret = peer_recv_all(fd, (uint8_t *)body, q.len, 0, &s->stop, true);
        if (ret < 0)
            return ret;
    }
    if (ss->on && !peer_req_tag_ok(ss, qw, body, body ? q.len : 0, qw + PEER_REQ_WIRE))
        return -EACCES;
    switch (q.op) {
    case PEER_OP_READ_HDRS:
        /* buf holds enough for any answer: see conn_main. */
        peer_rep_enc(buf, &rep);
        n = PEER_REP_WIRE + put_hdrs(s->r, q.bucket, q.way, q.nways, buf + PEER_REP_WIRE);
        break;
    case PEER_OP_READ_HDRS_MULTI: {
        peer_rep_enc(buf, &rep);
        n = PEER_REP_WIRE;
        for (uint32_t i = 0; i < q.nways; i++) {
            uint64_t bucket = peer_get64(b + 8 * i);

            if (bucket >= g->num_buckets)
                return -EINVAL; /* closes the connection, as any bad field */
            n += put_hdrs(s->r, bucket, 0, g->ways, buf + n);
        }
        break;
    }
    case PEER_OP_READ_SLOT: {
        struct peer_slot_hdr h;
        uint64_t before, after;

        memset(buf + PEER_REP_WIRE + PEER_HDR_WIRE, 0, q.len);
        after = peer_slot_copy(s->r, q.bucket, q.way, &h, &before,
                               buf + PEER_REP_WIRE + PEER_HDR_WIRE, q.len);
        peer_rep_enc(buf, &rep);
        n = PEER_REP_WIRE + put_hdr(buf + PEER_REP_WIRE, &h, after) + q.len;
        break;
    }
    case PEER_OP_READ_GET: {
        /* The bucket's headers, then the payload of the way they name the
         * key by: a filter over bytes the client asked for, not a lookup
         * (the client judges both copies again). */
        struct peer_hash kh = {q.hash_lo, q.hash_hi};
        struct peer_slot_hdr hs[PEER_WAYS_MAX], h;
        uint64_t af[PEER_WAYS_MAX], before, after;
        int way;

        for (uint32_t w = 0; w < g->ways; w++)
            af[w] = peer_slot_copy(s->r, q.bucket, w, &hs[w], &before, NULL, 0);
        way = peer_find_way(hs, af, g->ways, &kh, q.len);
        rep.status = way >= 0 ? way : -ENOENT;
        peer_rep_enc(buf, &rep);
        n = PEER_REP_WIRE;
        for (uint32_t w = 0; w < g->ways; w++)
            n += put_hdr(buf + n, &hs[w], af[w]);
        /* The way's header always (zeros for none): the answer's fixed
         * part has one size, read by the client in one call. */
        memset(&h, 0, sizeof(h));
        after = 0;
        if (way >= 0)
            after = peer_slot_copy(s->r, q.bucket, (uint32_t)way, &h, &before,
                                   buf + n + PEER_HDR_WIRE, q.len);
        n += put_hdr(buf + n, &h, after) + (way >= 0 ? q.len : 0);
        break;
    }
    default: {
        /* PEER_OP_WRITE: peer_req_check let no other op through. */
        struct peer_hash h = {q.hash_lo, q.hash_hi};

        ret = peer_slot_write(s->r, q.bucket, q.way, q.expect, &h, buf, q.len, q.stamp);
        rep.status = ret;
        if (ret == -EAGAIN)
            rep.seq = atomic_load_explicit(&peer_slot(s->r, q.bucket, q.way)->seq,
                                           memory_order_relaxed); /* a report only */
        peer_rep_enc(buf, &rep);
        n = PEER_REP_WIRE;
        break;
    }
    }
    /* Sending an answer it asked for: not evicted meanwhile (admit). */
    pthread_mutex_lock(&s->lock);
    s->conns[slot].answering = true;
    pthread_mutex_unlock(&s->lock);
    ret = peer_send_all(fd, buf, n, 0, &s->stop);
    pthread_mutex_lock(&s->lock);
    s->conns[slot].answering = false;
    s->conns[slot].last_ns = peer_net_mono_ns();
    pthread_mutex_unlock(&s->lock);
    return ret;
}

/* Give back table entry slot and close its fd, out of the table first: an
 * eviction never shuts down a reused descriptor. */
static void conn_release(struct peer_server *s, unsigned slot, int fd)
{
    pthread_mutex_lock(&s->lock);
    s->conns[slot].used = false;
    close(fd);
    if (--s->nconns == 0)
        pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
}

/* The client's nonce and proof, checked under the members' key, then this
 * end's proof: 0 with the session on, or < 0 (not a member: closed without
 * a word). A client that stalls in it is dropped as one stalled in a
 * request. */
static int handshake(struct peer_server *s, int fd, const uint8_t *hw, struct peer_sess *ss)
{
    uint8_t msg[PEER_AUTH_WIRE], proof[PEER_PROOF];
    int ret = peer_recv_all(fd, msg, sizeof(msg), 0, &s->stop, true);

    if (ret == 0)
        ret = peer_auth_server(s->key, hw, PEER_HELLO_WIRE, msg, proof, ss);
    if (ret == 0)
        ret = peer_send_all(fd, proof, sizeof(proof), 0, &s->stop);
    return ret;
}

static void *conn_main(void *arg)
{
    struct conn_arg *ca = arg;
    struct peer_server *s = ca->s;
    int fd = ca->fd;
    const struct peer_geometry *g = &s->r->g;
    /* READ_SLOT, READ_GET: the headers, one more and a payload (more
     * than READ_HDRS's headers alone). */
    size_t cap = PEER_REP_WIRE + ((size_t)g->ways + 1) * PEER_HDR_WIRE + g->max_payload;
    /* READ_HDRS_MULTI: at most 64 x 64 x 72 bytes (288 KiB). */
    size_t cap3 = PEER_REP_WIRE + (size_t)PEER_BATCH_MAX * g->ways * PEER_HDR_WIRE;
    uint8_t *buf;

    if (cap3 > cap)
        cap = cap3;
    /* Zeroed: a payload copy shorter than asked (the slot changed under
     * it) sends bytes of an earlier answer of this connection, never heap. */
    buf = calloc(1, cap);
    struct peer_hello hello = {.magic = PEER_MAGIC, .version = PEER_VERSION, .g = *g};
    uint8_t hw[PEER_HELLO_WIRE];
    struct peer_sess ss = {0};
    unsigned slot = ca->slot;

    free(ca);
    if (s->key) {
        hello.flags = PEER_HELLO_AUTH;
        if (getrandom(hello.nonce, PEER_NONCE, 0) != (ssize_t)PEER_NONCE)
            goto out;
    }
    peer_hello_enc(hw, &hello);
    if (buf && peer_send_all(fd, hw, sizeof(hw), 0, &s->stop) == 0 &&
        (!s->key || handshake(s, fd, hw, &ss) == 0))
        while (serve_one(s, fd, slot, buf, &ss) == 0)
            ;
out:
    peer_sess_end(&ss);
    free(buf);
    conn_release(s, slot, fd);
    return NULL;
}

int peer_serve_stream(struct peer_region *r, const struct peer_key *key, int fd)
{
    struct peer_server *s = calloc(1, sizeof(*s));
    struct conn_arg *ca = malloc(sizeof(*ca));

    if (!s || !ca) {
        free(s);
        free(ca);
        return -ENOMEM;
    }
    s->r = r;
    s->key = key;
    s->lfd = -1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->conns[0] = (struct sconn){.fd = fd, .used = true};
    s->nconns = 1;
    *ca = (struct conn_arg){.s = s, .fd = fd, .slot = 0};
    conn_main(ca); /* closes fd */
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->idle);
    free(s);
    return 0;
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

        if (peer_resolve(members[i], false, &res) < 0)
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

/*
 * Room for a connection from `from` (caller holds s->lock): a table index,
 * or -1 to refuse it. A flood must not lock the members out, so a full
 * house makes room by evicting the connection that has been waiting
 * longest for a request of its own (idle, or stalled in the middle of
 * sending one, since it was accepted or last answered), never one being
 * sent an answer: from the same address when it has PEER_CONNS_PER_HOST
 * already (a flooder churns its own), else from any address once
 * PEER_CONNS_MAX are live. The evicted connection is shut down; its thread
 * leaves at once. A member whose idle connection was evicted reconnects on
 * its next call (peer_conn_open_fresh sees the EOF).
 */
static int admit(struct peer_server *s, const struct sockaddr_storage *from)
{
    unsigned live = 0, same = 0;
    int free_slot = -1, old_same = -1, old_any = -1;

    for (unsigned i = 0; i < 2 * PEER_CONNS_MAX; i++) {
        struct sconn *c = &s->conns[i];

        if (!c->used) {
            if (free_slot < 0)
                free_slot = (int)i;
            continue;
        }
        if (c->evicted)
            continue;
        live++;
        bool mine = same_host(&c->from, from);

        same += mine;
        if (c->answering)
            continue;
        if (old_any < 0 || c->last_ns < s->conns[old_any].last_ns)
            old_any = (int)i;
        if (mine && (old_same < 0 || c->last_ns < s->conns[old_same].last_ns))
            old_same = (int)i;
    }
    if (free_slot < 0)
        return -1; /* evicted ones still closing: refuse for now */
    if (same >= PEER_CONNS_PER_HOST)
        old_any = old_same;
    else if (live < PEER_CONNS_MAX)
        return free_slot;
    if (old_any < 0)
        return -1; /* every one is being answered */
    s->conns[old_any].evicted = true;
    shutdown(s->conns[old_any].fd, SHUT_RDWR);
    return free_slot;
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
        int fd, one = 1, slot;

        if (poll(&p, 1, 200) <= 0)
            continue;
        sl = sizeof(from);
        fd = accept4(s->lfd, (struct sockaddr *)&from, &sl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&s->lock);
        slot = allowed(s, &from) ? admit(s, &from) : -1;
        if (slot < 0) {
            pthread_mutex_unlock(&s->lock);
            close(fd);
            continue;
        }
        s->conns[slot] =
            (struct sconn){.fd = fd, .used = true, .last_ns = peer_net_mono_ns(), .from = from};
        s->nconns++;
        pthread_mutex_unlock(&s->lock);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        /* The receive timeout lets a connection thread see stop. */
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
        ca = malloc(sizeof(*ca));
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (!ca || (ca->s = s, ca->fd = fd, ca->slot = (unsigned)slot,
                    pthread_create(&t, &at, conn_main, ca) != 0)) {
            free(ca);
            conn_release(s, (unsigned)slot, fd);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

int peer_server_start(struct peer_server **out, struct peer_region *r, const char *addr,
                      const struct peer_key *key, char *errbuf, size_t errlen)
{
    struct addrinfo *res = NULL, *ai;
    struct peer_server *s;
    int ret, one = 1;

    *out = NULL;
    ret = peer_resolve(addr, true, &res);
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
    s->key = key;
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
