/* SPDX-License-Identifier: MIT */
/*
 * test_peer_serve.c - the peer server (core/peer/peer_server.c) on crafted
 * streams and connections: peer_serve_stream over a socketpair answers
 * every kind of request as the wire says (the fuzz target's entry, here
 * with its answers checked), ends a stream that is cut or malformed
 * without an answer to it (a write cut short touches no slot), and with
 * the members' key serves only a client through the handshake and only
 * requests with the next tag. On loopback: one host holds at most
 * PEER_CONNS_PER_HOST connections (its oldest is closed for a new one),
 * the members list admits hosts by IPv4 or IPv6 address and keeps the old
 * list when none of the new one resolves, and a listen address that is
 * not host:port is refused at the start.
 */
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A stream served by peer_serve_stream in a thread; the test holds fd. */
struct stream {
    pthread_t t;
    int fd, sfd, ret;
    struct peer_region *r;
    const struct peer_key *key;
};

static void *stream_main(void *arg)
{
    struct stream *st = arg;

    st->ret = peer_serve_stream(st->r, st->key, st->sfd);
    return NULL;
}

static void stream_start(struct stream *st, struct peer_region *r, const struct peer_key *key)
{
    int sv[2];
    struct timeval tv = {.tv_sec = 10};

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    /* A safety net only: the server answers or closes at once. */
    setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    *st = (struct stream){.fd = sv[0], .sfd = sv[1], .r = r, .key = key, .ret = -1};
    cr_assert_eq(pthread_create(&st->t, NULL, stream_main, st), 0);
}

/* Everything the server sends until it closes, into out: its length. The
 * test's end is closed for writing first. */
static size_t stream_end(struct stream *st, uint8_t *out, size_t cap)
{
    size_t got = 0;
    ssize_t k;

    shutdown(st->fd, SHUT_WR);
    while (got < cap && (k = recv(st->fd, out + got, cap - got, 0)) > 0)
        got += (size_t)k;
    cr_assert_lt(got, cap);
    pthread_join(st->t, NULL);
    cr_assert_eq(st->ret, 0);
    close(st->fd);
    return got;
}

static void put(struct stream *st, const void *p, size_t n)
{
    cr_assert_eq(send(st->fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static void put_req(struct stream *st, const struct peer_req *q)
{
    uint8_t w[PEER_REQ_WIRE];

    peer_req_enc(w, q);
    put(st, w, sizeof(w));
}

/* The hello at *p: this version's, the region's geometry, flags. */
static void check_hello(const uint8_t **p, const struct peer_region *r, uint32_t flags)
{
    struct peer_hello h;

    peer_hello_dec(&h, *p);
    cr_assert_eq(h.magic, PEER_MAGIC);
    cr_assert_eq(h.version, PEER_VERSION);
    cr_assert_eq(h.g.num_buckets, r->g.num_buckets);
    cr_assert_eq(h.g.ways, r->g.ways);
    cr_assert_eq(h.flags, flags);
    *p += PEER_HELLO_WIRE;
}

static struct peer_rep take_rep(const uint8_t **p)
{
    struct peer_rep rep;

    peer_rep_dec(&rep, *p);
    cr_assert_eq(rep.magic, PEER_MAGIC);
    *p += PEER_REP_WIRE;
    return rep;
}

static void take_hdr(const uint8_t **p, struct peer_slot_hdr *h, uint64_t *after)
{
    peer_hdr_dec(h, after, *p);
    *p += PEER_HDR_WIRE;
}

/* The way of h's bucket whose header names it (-1: none). */
static int way_of(const struct peer_region *r, const struct peer_hash *h)
{
    uint64_t b = peer_bucket_of(h, r->g.num_buckets);

    for (uint32_t w = 0; w < r->g.ways; w++)
        if (peer_slot(r, b, w)->hash_lo == h->lo && peer_slot(r, b, w)->hash_hi == h->hi)
            return (int)w;
    return -1;
}

Test(peer_serve, every_request_of_a_stream_is_answered, .timeout = 30)
{
    static uint8_t pa[PAY], pb[PAY], out[65536];
    struct peer_region r;
    struct stream st;
    struct sfs_key ka = tu_key(41, 0), kb = tu_key(42, 1);
    struct peer_hash ha = peer_key_hash(&ka), hb = peer_key_hash(&kb);
    struct peer_slot_hdr h;
    struct peer_rep rep;
    uint64_t after, ba, bb;
    uint8_t bw[16];
    const uint8_t *p = out;
    int wa;
    uint32_t wb;
    size_t n;

    fx_region(&r, 16, 4);
    tu_fill(&ka, pa, PAY);
    tu_fill(&kb, pb, PAY);
    cr_assert_eq(peer_local_set(&r, &ha, pa, PAY), 0);
    wa = way_of(&r, &ha);
    cr_assert_geq(wa, 0);
    ba = peer_bucket_of(&ha, r.g.num_buckets);
    bb = peer_bucket_of(&hb, r.g.num_buckets);
    wb = bb == ba ? ((uint32_t)wa + 1) % 4 : 0;
    stream_start(&st, &r, NULL);
    {
        struct peer_req q = peer_req_at(PEER_OP_READ_HDRS, ba);

        q.nways = 4;
        put_req(&st, &q);
        q = peer_req_at(PEER_OP_READ_SLOT, ba);
        q.way = (uint32_t)wa;
        q.nways = 1;
        q.len = PAY;
        put_req(&st, &q);
        q = peer_req_for(PEER_OP_READ_GET, &ha, &r.g);
        q.len = PAY;
        put_req(&st, &q);
        q = peer_req_for(PEER_OP_READ_GET, &hb, &r.g);
        q.len = PAY;
        put_req(&st, &q);
        /* A write of b, then the same write again: its seq moved. */
        q = peer_req_for(PEER_OP_WRITE, &hb, &r.g);
        q.way = wb;
        q.nways = 1;
        q.len = PAY;
        q.stamp = 5;
        for (int i = 0; i < 2; i++) {
            put_req(&st, &q);
            put(&st, pb, PAY);
        }
        q = peer_req_at(PEER_OP_READ_HDRS_MULTI, 0);
        q.nways = 2;
        q.len = 16;
        peer_put64(bw, ba);
        peer_put64(bw + 8, bb);
        put_req(&st, &q);
        put(&st, bw, sizeof(bw));
    }
    n = stream_end(&st, out, sizeof(out));
    check_hello(&p, &r, 0);
    /* READ_HDRS: the four headers, a's where it is. */
    cr_assert_eq(take_rep(&p).status, 0);
    for (int w = 0; w < 4; w++) {
        take_hdr(&p, &h, &after);
        cr_assert_eq(h.hash_lo == ha.lo, w == wa, "way %d", w);
    }
    /* READ_SLOT: a's header and payload. */
    cr_assert_eq(take_rep(&p).status, 0);
    take_hdr(&p, &h, &after);
    cr_assert_eq(peer_slot_matches(&h, after, after, &ha, PAY, p), PEER_HIT);
    cr_assert_eq(memcmp(p, pa, PAY), 0);
    p += PAY;
    /* READ_GET of a: its way, the bucket's headers, its header and payload. */
    cr_assert_eq(take_rep(&p).status, wa);
    p += 4 * PEER_HDR_WIRE;
    take_hdr(&p, &h, &after);
    cr_assert_eq(peer_slot_matches(&h, after, after, &ha, PAY, p), PEER_HIT);
    p += PAY;
    /* READ_GET of b, not there: -ENOENT, the headers and a zero header,
     * no payload. */
    cr_assert_eq(take_rep(&p).status, -ENOENT);
    p += 4 * PEER_HDR_WIRE;
    take_hdr(&p, &h, &after);
    cr_assert_eq(after, 0);
    cr_assert_eq(h.magic, 0);
    /* The write, then the same write: -EAGAIN and the seq found. */
    cr_assert_eq(take_rep(&p).status, 0);
    rep = take_rep(&p);
    cr_assert_eq(rep.status, -EAGAIN);
    cr_assert_eq(rep.seq, 2);
    /* READ_HDRS_MULTI: a's bucket's headers, then b's (b now written). */
    cr_assert_eq(take_rep(&p).status, 0);
    for (int i = 0; i < 8; i++) {
        take_hdr(&p, &h, &after);
        if (i == wa)
            cr_assert_eq(h.hash_lo, ha.lo);
        if (i == 4 + (int)wb)
            cr_assert_eq(h.hash_lo, hb.lo);
    }
    cr_assert_eq((size_t)(p - out), n, "bytes after the last answer");
    cr_assert_eq(peer_local_get(&r, &hb, out, PAY), PEER_HIT);
    cr_assert_eq(memcmp(out, pb, PAY), 0);
    peer_region_destroy(&r);
}

/* A slot larger than any batch of headers: the connection's buffer is
 * the slot's, and a get of a whole slot is answered. */
Test(peer_serve, a_slot_larger_than_a_batch_of_headers_is_served, .timeout = 30)
{
    const uint32_t big = 256u << 10;
    static uint8_t in[256u << 10], out[(256u << 10) + 4096];
    struct peer_region r;
    struct peer_geometry g;
    struct stream st;
    struct sfs_key k = tu_key(43, 0);
    struct peer_hash h = peer_key_hash(&k);
    struct peer_req q;
    const uint8_t *p = out;
    size_t n;

    cr_assert_eq(peer_geometry_make(4 * ((PEER_HDR_SIZE + big + 63) & ~63ull), 1, big, &g), 0);
    cr_assert_eq(peer_region_create(&r, &g), 0);
    tu_fill(&k, in, big);
    cr_assert_eq(peer_local_set(&r, &h, in, big), 0);
    stream_start(&st, &r, NULL);
    q = peer_req_for(PEER_OP_READ_GET, &h, &r.g);
    q.len = big;
    put_req(&st, &q);
    n = stream_end(&st, out, sizeof(out));
    check_hello(&p, &r, 0);
    cr_assert_eq(take_rep(&p).status, 0);
    p += 2 * PEER_HDR_WIRE;
    cr_assert_eq(memcmp(p, in, big), 0);
    cr_assert_eq(n, PEER_HELLO_WIRE + PEER_REP_WIRE + 2 * PEER_HDR_WIRE + big);
    peer_region_destroy(&r);
}

/* After one good request, a stream that is cut or malformed ends: the
 * good request's answer, nothing for the bad one, no slot touched. */
Test(peer_serve, a_stream_cut_or_malformed_ends_without_an_answer, .timeout = 30)
{
    static uint8_t out[65536], pay[PAY];
    const size_t first = PEER_HELLO_WIRE + PEER_REP_WIRE + 4 * PEER_HDR_WIRE;
    struct peer_region r;
    struct sfs_key k = tu_key(44, 0);
    struct peer_hash h = peer_key_hash(&k);

    fx_region(&r, 16, 4);
    tu_fill(&k, pay, PAY);
    for (int c = 0; c < 6; c++) {
        struct stream st;
        struct peer_req q = peer_req_at(PEER_OP_READ_HDRS, 1);
        uint8_t w[PEER_REQ_WIRE], bw[16] = {0};
        size_t n;

        stream_start(&st, &r, NULL);
        q.nways = 4;
        put_req(&st, &q);
        switch (c) {
        case 0: /* a request cut short */
            q = peer_req_at(PEER_OP_READ_HDRS, 2);
            q.nways = 4;
            peer_req_enc(w, &q);
            put(&st, w, 30);
            break;
        case 1: /* a write whose payload is cut short */
            q = peer_req_for(PEER_OP_WRITE, &h, &r.g);
            q.nways = 1;
            q.len = PAY;
            put_req(&st, &q);
            put(&st, pay, 100);
            break;
        case 2: /* buckets of a multi read cut short */
            q = peer_req_at(PEER_OP_READ_HDRS_MULTI, 0);
            q.nways = 2;
            q.len = 16;
            put_req(&st, &q);
            put(&st, bw, 8);
            break;
        case 3: /* a multi read naming a bucket past the geometry */
            q = peer_req_at(PEER_OP_READ_HDRS_MULTI, 0);
            q.nways = 2;
            q.len = 16;
            peer_put64(bw, 1);
            peer_put64(bw + 8, r.g.num_buckets);
            put_req(&st, &q);
            put(&st, bw, sizeof(bw));
            break;
        case 4: /* another magic */
            q.magic = PEER_MAGIC + 1;
            put_req(&st, &q);
            break;
        default: /* a get past the slot's size */
            q = peer_req_for(PEER_OP_READ_GET, &h, &r.g);
            q.len = PAY + 1;
            put_req(&st, &q);
            break;
        }
        n = stream_end(&st, out, sizeof(out));
        cr_assert_eq(n, first, "case %d: %zu bytes", c, n);
    }
    /* A client gone before the hello: the stream ends, nothing held. */
    {
        int sv[2];

        cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
        close(sv[0]);
        cr_assert_eq(peer_serve_stream(&r, NULL, sv[1]), 0);
    }
    cr_assert_eq(way_of(&r, &h), -1, "a write cut short touched a slot");
    cr_assert_eq(peer_local_get(&r, &h, NULL, PAY), PEER_MISS_EMPTY);
    peer_region_destroy(&r);
}

/* With the members' key: the handshake first, then only requests with the
 * next tag; anything else ends the stream without a word more. */
Test(peer_serve, with_the_key_a_stream_serves_only_a_member, .timeout = 30)
{
    static uint8_t out[65536], pay[PAY];
    struct peer_key *k = fx_key(), *o = NULL;
    struct peer_region r;
    struct sfs_key key = tu_key(45, 0);
    struct peer_hash h = peer_key_hash(&key);
    uint8_t kb[32];

    memset(kb, 0x61, sizeof(kb));
    cr_assert_eq(peer_key_from(kb, sizeof(kb), &o), 0);
    fx_region(&r, 16, 4);
    tu_fill(&key, pay, PAY);
    cr_assert_eq(peer_local_set(&r, &h, pay, PAY), 0);
    for (int c = 0; c < 4; c++) {
        struct stream st;
        struct peer_sess s = {0};
        uint8_t hw[PEER_HELLO_WIRE], msg[PEER_AUTH_WIRE], want[PEER_PROOF], got[PEER_PROOF];
        uint8_t qw[PEER_REQ_WIRE + PEER_TAG];
        struct peer_req q = peer_req_for(PEER_OP_READ_GET, &h, &r.g);
        const uint8_t *p = hw;
        size_t n;

        q.len = PAY;
        stream_start(&st, &r, k);
        cr_assert_eq(recv(st.fd, hw, sizeof(hw), MSG_WAITALL), (ssize_t)sizeof(hw));
        check_hello(&p, &r, PEER_HELLO_AUTH);
        /* 0: a member; 1: another key; 2: the handshake cut short; 3: a
         * member whose second request repeats the first's tag. */
        cr_assert_eq(peer_auth_client(c == 1 ? o : k, hw, sizeof(hw), msg, want, &s), 0);
        put(&st, msg, c == 2 ? 10 : sizeof(msg));
        if (c == 0 || c == 3) {
            cr_assert_eq(recv(st.fd, got, sizeof(got), MSG_WAITALL), (ssize_t)sizeof(got));
            cr_assert(peer_proof_equal(want, got));
            peer_req_enc(qw, &q);
            cr_assert_eq(peer_req_tag(&s, qw, NULL, 0, qw + PEER_REQ_WIRE), 0);
            put(&st, qw, sizeof(qw));
            if (c == 3)
                put(&st, qw, sizeof(qw));
        }
        n = stream_end(&st, out, sizeof(out));
        if (c == 0 || c == 3) {
            p = out;
            cr_assert_eq(n, PEER_REP_WIRE + 5 * PEER_HDR_WIRE + PAY, "case %d: %zu", c, n);
            cr_assert_eq(take_rep(&p).status, 0);
            cr_assert_eq(memcmp(out + n - PAY, pay, PAY), 0);
        } else {
            cr_assert_eq(n, 0, "case %d: %zu bytes to a client that is no member", c, n);
        }
        peer_sess_end(&s);
    }
    /* A session that is not on takes no tag at all. */
    {
        struct peer_sess s = {0};
        uint8_t img[PEER_REQ_WIRE] = {0}, tag[PEER_TAG] = {0};

        cr_assert_not(peer_req_tag_ok(&s, img, NULL, 0, tag));
    }
    peer_region_destroy(&r);
    peer_key_free(k);
    peer_key_free(o);
}

/* A connection to port from source address 127.0.0.<src>, its hello read. */
static int dial_from(unsigned src, unsigned port)
{
    struct sockaddr_in a = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
    struct timeval tv = {.tv_sec = 10};
    uint8_t hw[PEER_HELLO_WIRE];
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert(fd >= 0);
    a.sin_addr.s_addr = htonl(0x7f000000u | src);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons((uint16_t)port);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof(to)), 0);
    cr_assert_eq(recv(fd, hw, sizeof(hw), MSG_WAITALL), (ssize_t)sizeof(hw));
    return fd;
}

/* One host's ninth connection closes its oldest: a host churns its own
 * connections, never takes more of the server. */
Test(peer_serve, a_host_holds_at_most_its_share_of_connections, .timeout = 30)
{
    struct srv x;
    int fds[10];
    char b;

    srv_start(&x, 16, 4);
    /* Each hello read: accepted in this order, each after the one before. */
    for (int i = 0; i < 10; i++)
        fds[i] = dial_from(9, x.port);
    /* The ninth closed the first, the tenth the second. */
    cr_assert_eq(recv(fds[0], &b, 1, 0), 0);
    cr_assert_eq(recv(fds[1], &b, 1, 0), 0);
    for (int i = 2; i < 10; i++)
        cr_assert_eq(recv(fds[i], &b, 1, MSG_DONTWAIT), -1, "connection %d closed", i);
    for (int i = 0; i < 10; i++)
        close(fds[i]);
    peer_server_stop(x.s);
    peer_region_destroy(&x.r);
}

/* Whether a connection to addr is served (its hello comes). */
static bool hello_comes(const char *addr)
{
    struct peer_conn c;
    int r;

    peer_conn_init(&c);
    r = peer_conn_open(&c, addr, 2000);
    peer_conn_close(&c);
    return r == 0;
}

Test(peer_serve, members_are_admitted_by_ipv4_or_ipv6_address, .timeout = 30)
{
    struct peer_region r;
    struct peer_server *s;
    char err[256] = "", addr[64];
    char *v4[] = {"127.0.0.1:1"}, *v6[] = {"[::1]:1"}, *none[] = {"no-port", "[::1]"};

    fx_region(&r, 16, 4);
    for (int tries = 0;; tries++) {
        snprintf(addr, sizeof(addr), "[::1]:%u", free_port());
        if (peer_server_start(&s, &r, addr, NULL, err, sizeof(err)) == 0)
            break;
        cr_assert(tries < 10, "%s", err);
    }
    cr_assert(hello_comes(addr), "an IPv6 client, no members list");
    cr_assert_eq(peer_server_allow(s, v6, 1), 0);
    cr_assert(hello_comes(addr), "an IPv6 member");
    cr_assert_eq(peer_server_allow(s, v4, 1), 0);
    cr_assert_not(hello_comes(addr), "an IPv6 client of an IPv4 members list");
    /* A list none of which resolves keeps the old one (not open to all). */
    cr_assert_eq(peer_server_allow(s, none, 2), -EHOSTUNREACH);
    cr_assert_not(hello_comes(addr));
    /* No list: anyone. */
    cr_assert_eq(peer_server_allow(s, NULL, 0), 0);
    cr_assert(hello_comes(addr));
    peer_server_stop(s);
    /* A listen address that is not host:port. */
    err[0] = '\0';
    cr_assert_eq(peer_server_start(&s, &r, "localhost", NULL, err, sizeof(err)), -EINVAL);
    cr_assert_null(s);
    cr_assert(strstr(err, "not host:port"), "%s", err);
    peer_region_destroy(&r);
}
