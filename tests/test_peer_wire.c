/* SPDX-License-Identifier: MIT */
/*
 * test_peer_wire.c - the peer client (core/peer/peer_client.c) against a
 * fake member on loopback that speaks the wire protocol and answers wrong
 * on purpose: a hello cut short or of no geometry, a handshake closed or
 * answered with a wrong proof, answers of another magic, with a status the
 * request does not allow, cut short, followed by payload bytes after a
 * miss or by bytes nobody asked for, and a member closing in the middle of
 * an answer. Each is a failed call (a clean miss for a get), never bytes,
 * and the connection is closed; the answers that arrived whole before the
 * failure stand, and a member that closed an idle connection is dialled
 * again.
 */
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define WAYS    4u
#define BUCKETS 16u

/* How the fake answers a request. */
enum fake_mode {
    M_OK,        /* the answer a server gives (a hit on way 0 for a get) */
    M_MISS,      /* a get: -ENOENT, headers of nothing */
    M_MAGIC,     /* the answer's magic is another */
    M_STATUS,    /* a status the request does not allow */
    M_AGAIN,     /* a write: -EAGAIN, seq 42 */
    M_CUT,       /* half the answer, then the connection closed */
    M_CUT_FIXED, /* cut inside the first header (after a whole rep), then closed */
    M_CUT_PAY,   /* a get: all but the payload's last half, then closed */
    M_EXTRA,     /* a get: a miss, then payload bytes anyway */
    M_BADSUM,    /* a get: the payload does not match its header */
    M_CLOSE,     /* the answer, then the connection closed */
    M_RESET,     /* the answer, then the connection reset */
    M_RESET_CUT, /* half the answer, then the connection reset */
    M_UNASKED,   /* the answer and one byte more */
};

/* How the fake goes through a handshake the hello asked for. */
enum fake_auth {
    A_CLOSE, /* reads the client's proof, closes */
    A_WRONG, /* answers with a proof of no key */
    A_STALL, /* never answers */
};

struct fake {
    int lfd;
    char addr[64];
    pthread_t t;
    _Atomic bool stop;
    uint8_t hello[PEER_HELLO_WIRE];
    size_t hello_len; /* bytes of the hello sent; fewer: then closed */
    enum fake_auth auth;
    /* Request number fail_at (counted over all connections) gets mode;
     * the others M_OK. */
    enum fake_mode mode;
    unsigned fail_at;
    _Atomic unsigned conns, reqs;
    _Atomic bool bad; /* the client sent a request that fails the check */
    struct peer_geometry g;
    struct peer_hash h;       /* the key the fake holds, in way 0 */
    struct peer_slot_hdr hdr; /* its header */
    uint8_t pay[PAY];         /* its payload */
    uint8_t out[32768], body[PAY];
};

static bool fake_recv(struct fake *f, int fd, void *p, size_t n)
{
    uint8_t *b = p;

    while (n) {
        ssize_t r = recv(fd, b, n, 0);

        if (r == 0)
            return false;
        if (r < 0) {
            /* Relaxed: a stop flag polled once a receive timeout. */
            if (errno == EAGAIN && !atomic_load_explicit(&f->stop, memory_order_relaxed))
                continue;
            return false;
        }
        b += r;
        n -= (size_t)r;
    }
    return true;
}

/* One send: what the client reads arrives together. It fails where the
 * client closed after a wrong answer while the fake still answered the
 * requests it had pipelined after it: nothing to do then. */
static void fake_send(int fd, const void *p, size_t n)
{
    (void)!send(fd, p, n, MSG_NOSIGNAL);
}

/* Hold the connection, reading what comes, until the client closes it. */
static void fake_hold(struct fake *f, int fd)
{
    uint8_t b[256];

    while (fake_recv(f, fd, b, 1))
        ;
}

/* The answer a server gives to q, into f->out: its length. */
static size_t good_answer(struct fake *f, const struct peer_req *q)
{
    struct peer_rep rep = {.magic = PEER_MAGIC};
    struct peer_slot_hdr zero = {0};
    size_t n = PEER_REP_WIRE;

    switch (q->op) {
    case PEER_OP_READ_HDRS:
        for (uint32_t w = q->way; w < q->way + q->nways; w++, n += PEER_HDR_WIRE)
            peer_hdr_enc(f->out + n, w ? &zero : &f->hdr, w ? 0 : f->hdr.seq);
        break;
    case PEER_OP_READ_HDRS_MULTI:
        for (uint32_t i = 0; i < q->nways * WAYS; i++, n += PEER_HDR_WIRE)
            peer_hdr_enc(f->out + n, &zero, 0);
        break;
    case PEER_OP_READ_SLOT:
        peer_hdr_enc(f->out + n, &f->hdr, f->hdr.seq);
        n += PEER_HDR_WIRE;
        memcpy(f->out + n, f->pay, q->len);
        n += q->len;
        break;
    case PEER_OP_READ_GET:
        for (uint32_t w = 0; w < WAYS; w++, n += PEER_HDR_WIRE)
            peer_hdr_enc(f->out + n, w ? &zero : &f->hdr, w ? 0 : f->hdr.seq);
        peer_hdr_enc(f->out + n, &f->hdr, f->hdr.seq);
        n += PEER_HDR_WIRE;
        memcpy(f->out + n, f->pay, q->len);
        n += q->len;
        break;
    default:
        break;
    }
    peer_rep_enc(f->out, &rep);
    return n;
}

/* Answer q (request number i) as the test asked: false closes. */
static bool fake_answer(struct fake *f, int fd, const struct peer_req *q, unsigned i)
{
    enum fake_mode m = i == f->fail_at ? f->mode : M_OK;
    size_t n = good_answer(f, q);
    struct peer_rep rep = {.magic = PEER_MAGIC};
    struct linger lg = {.l_onoff = 1, .l_linger = 0};

    switch (m) {
    case M_MISS:
    case M_EXTRA:
        rep.status = -ENOENT;
        peer_rep_enc(f->out, &rep);
        memset(f->out + PEER_REP_WIRE, 0, (WAYS + 1) * PEER_HDR_WIRE);
        n = PEER_REP_WIRE + (WAYS + 1) * PEER_HDR_WIRE + (m == M_EXTRA ? 64 : 0);
        break;
    case M_MAGIC:
        rep.magic = 0xdeadbeef;
        peer_rep_enc(f->out, &rep);
        break;
    case M_STATUS:
        /* A get's way past the geometry; any other request's error. */
        rep.status = q->op == PEER_OP_READ_GET ? (int32_t)WAYS : -EIO;
        peer_rep_enc(f->out, &rep);
        break;
    case M_AGAIN:
        rep.status = -EAGAIN;
        rep.seq = 42;
        peer_rep_enc(f->out, &rep);
        break;
    case M_CUT:
    case M_RESET_CUT:
        n /= 2;
        break;
    case M_CUT_FIXED:
        if (n > PEER_REP_WIRE + 10)
            n = PEER_REP_WIRE + 10;
        break;
    case M_CUT_PAY:
        n -= q->len / 2;
        break;
    case M_BADSUM:
        f->out[n - 1] ^= 1;
        break;
    case M_UNASKED:
        f->out[n++] = 0x55;
        break;
    default:
        break;
    }
    fake_send(fd, f->out, n);
    if (m == M_RESET || m == M_RESET_CUT) {
        /* Closed now, abortively: the client's next read is a reset. */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        return false;
    }
    if (m == M_CUT || m == M_CUT_FIXED || m == M_CUT_PAY || m == M_CLOSE) {
        /* Closed for sending (the client reads the end of the stream
         * after what was sent), still reading: a close with requests
         * unread would reset the connection, and the client could lose
         * answers it has not read yet. */
        shutdown(fd, SHUT_WR);
        fake_hold(f, fd);
        return false;
    }
    return true;
}

static void fake_serve(struct fake *f, int fd)
{
    struct peer_hello hello;
    struct timeval tv = {.tv_usec = 100000};

    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    fake_send(fd, f->hello, f->hello_len);
    if (f->hello_len < PEER_HELLO_WIRE)
        return;
    peer_hello_dec(&hello, f->hello);
    if (hello.flags & PEER_HELLO_AUTH) {
        uint8_t msg[PEER_AUTH_WIRE], proof[PEER_PROOF];

        if (!fake_recv(f, fd, msg, sizeof(msg)) || f->auth == A_CLOSE)
            return;
        if (f->auth == A_WRONG) {
            memset(proof, 0x5a, sizeof(proof));
            fake_send(fd, proof, sizeof(proof));
        }
        fake_hold(f, fd);
        return;
    }
    for (;;) {
        uint8_t w[PEER_REQ_WIRE];
        struct peer_req q;

        if (!fake_recv(f, fd, w, sizeof(w)))
            return;
        peer_req_dec(&q, w);
        if (peer_req_check(&q, &f->g) < 0) {
            atomic_store(&f->bad, true);
            return;
        }
        if ((q.op == PEER_OP_WRITE || q.op == PEER_OP_READ_HDRS_MULTI) &&
            !fake_recv(f, fd, f->body, q.len))
            return;
        if (!fake_answer(f, fd, &q, atomic_fetch_add(&f->reqs, 1)))
            return;
    }
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;

    /* Relaxed: the stop flag; the poll timeout bounds how late it is seen. */
    while (!atomic_load_explicit(&f->stop, memory_order_relaxed)) {
        struct pollfd p = {.fd = f->lfd, .events = POLLIN};
        int fd;

        if (poll(&p, 1, 50) <= 0)
            continue;
        fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        atomic_fetch_add(&f->conns, 1);
        fake_serve(f, fd);
        close(fd);
    }
    return NULL;
}

/* A fake member holding one key (f->h, f->pay) in way 0 of its bucket,
 * whose hello announces flags; it answers request number fail_at with
 * mode. */
static struct fake *fake_start(uint32_t flags, enum fake_mode mode, unsigned fail_at)
{
    struct fake *f = calloc(1, sizeof(*f));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof(a);
    struct peer_hello hello = {.magic = PEER_MAGIC, .version = PEER_VERSION, .flags = flags};
    struct sfs_key k = tu_key(31, 0);

    cr_assert(f);
    cr_assert_eq(peer_geometry_make(BUCKETS * WAYS * ((PEER_HDR_SIZE + PAY + 63) & ~63ull), WAYS,
                                    PAY, &f->g),
                 0);
    hello.g = f->g;
    memset(hello.nonce, 0x11, sizeof(hello.nonce));
    peer_hello_enc(f->hello, &hello);
    f->hello_len = PEER_HELLO_WIRE;
    f->mode = mode;
    f->fail_at = fail_at;
    f->h = peer_key_hash(&k);
    tu_fill(&k, f->pay, PAY);
    f->hdr.hash_lo = f->h.lo;
    f->hdr.hash_hi = f->h.hi;
    f->hdr.len = PAY;
    f->hdr.magic = PEER_MAGIC;
    f->hdr.csum = peer_checksum(f->pay, PAY);
    f->hdr.stamp = 1;
    atomic_init(&f->hdr.seq, 2);
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(f->lfd, 8), 0);
    cr_assert_eq(getsockname(f->lfd, (struct sockaddr *)&a, &l), 0);
    snprintf(f->addr, sizeof(f->addr), "127.0.0.1:%u", ntohs(a.sin_port));
    return f;
}

static void fake_run(struct fake *f)
{
    cr_assert_eq(pthread_create(&f->t, NULL, fake_main, f), 0);
}

static void fake_stop(struct fake *f)
{
    /* Relaxed: see fake_main. */
    atomic_store_explicit(&f->stop, true, memory_order_relaxed);
    pthread_join(f->t, NULL);
    close(f->lfd);
    cr_assert_not(atomic_load(&f->bad), "the client sent a bad request");
    free(f);
}

/* c after a failed call: closed, and marked down (the next calls fail at
 * once, without a connection); then made new for the next case. */
static void assert_failed_and_renew(struct peer_conn *c, const char *addr, const char *what)
{
    struct peer_slot_hdr hdrs[WAYS];
    uint64_t after[WAYS];
    uint8_t b[8];

    cr_assert_eq(c->fd, -1, "%s: the connection stayed open", what);
    cr_assert_eq(peer_conn_read_hdrs(c, addr, 2000, 0, hdrs, after), -EHOSTUNREACH,
                 "%s: not marked down", what);
    cr_assert_eq(peer_conn_read_slot(c, addr, 2000, 0, 0, sizeof(b), hdrs, after, b), -EHOSTUNREACH,
                 "%s: not marked down", what);
    cr_assert_eq(c->fd, -1);
    peer_conn_close(c);
    peer_conn_init(c);
}

/* Until the member's end of c is closed (its FIN or reset arrived). */
static void wait_hangup(const struct peer_conn *c)
{
    struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};

    cr_assert_eq(poll(&p, 1, 10000), 1);
}

Test(peer_wire, a_hello_cut_short_or_of_no_geometry_is_refused, .timeout = 30)
{
    struct peer_conn c;
    struct peer_hello bad;
    const size_t cut[] = {20, 40};

    /* A hello that ends before every version's 32 bytes, then one that
     * ends after them: the member closed mid-hello. */
    for (size_t i = 0; i < 2; i++) {
        struct fake *f = fake_start(0, M_OK, ~0u);

        f->hello_len = cut[i];
        fake_run(f);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_open(&c, f->addr, 2000), -ECONNRESET, "cut at %zu", cut[i]);
        assert_failed_and_renew(&c, f->addr, "a hello cut short");
        fake_stop(f);
    }
    /* This version's hello announcing a geometry of no ways. */
    {
        struct fake *f = fake_start(0, M_OK, ~0u);

        peer_hello_dec(&bad, f->hello);
        bad.g.ways = 0;
        peer_hello_enc(f->hello, &bad);
        fake_run(f);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_open(&c, f->addr, 2000), -EPROTO);
        assert_failed_and_renew(&c, f->addr, "a hello of no geometry");
        cr_assert_eq(atomic_load(&f->reqs), 0);
        fake_stop(f);
    }
    /* No port; and a port nobody listens on. */
    peer_conn_init(&c);
    cr_assert_lt(peer_conn_open(&c, "127.0.0.1", 2000), 0);
    assert_failed_and_renew(&c, "127.0.0.1", "no port");
    {
        char addr[64];

        snprintf(addr, sizeof(addr), "127.0.0.1:%u", free_port());
        cr_assert_eq(peer_conn_open(&c, addr, 2000), -EHOSTUNREACH);
        assert_failed_and_renew(&c, addr, "nobody listening");
    }
    /* An address nothing answers from (no route, or no host behind it):
     * failed by the deadline. */
    cr_assert_lt(peer_conn_open(&c, "10.255.255.1:7", 200), 0);
    assert_failed_and_renew(&c, "10.255.255.1:7", "no host");
}

Test(peer_wire, a_member_that_cannot_prove_the_key_is_refused, .timeout = 30)
{
    const enum fake_auth how[] = {A_CLOSE, A_WRONG, A_STALL};
    const int want[] = {-EACCES, -EACCES, -ETIMEDOUT};
    struct peer_key *k = NULL;
    uint8_t kb[32];

    memset(kb, 0x29, sizeof(kb));
    cr_assert_eq(peer_key_from(kb, sizeof(kb), &k), 0);
    for (size_t i = 0; i < 3; i++) {
        struct fake *f = fake_start(PEER_HELLO_AUTH, M_OK, ~0u);
        struct peer_conn c;

        f->auth = how[i];
        fake_run(f);
        peer_conn_init(&c);
        c.key = k;
        cr_assert_eq(peer_conn_open(&c, f->addr, how[i] == A_STALL ? 300 : 2000), want[i],
                     "case %zu", i);
        cr_assert_not(c.sess.on, "case %zu: a session without the member's proof", i);
        assert_failed_and_renew(&c, f->addr, "no proof");
        fake_stop(f);
    }
    peer_key_free(k);
}

/* The calls of one request each: a wrong answer fails the call with
 * -EPROTO (or the member's close), closes the connection and marks the
 * member down; a good one is served. */
Test(peer_wire, a_wrong_answer_fails_the_call, .timeout = 60)
{
    struct peer_slot_hdr hdrs[PEER_BATCH_MAX * WAYS], hdr;
    uint64_t after[PEER_BATCH_MAX * WAYS], found = 0, buckets[PEER_BATCH_MAX + 1] = {0};
    static uint8_t buf[PAY];
    const enum fake_mode modes[] = {M_OK, M_MAGIC, M_STATUS, M_CUT, M_CUT_FIXED};
    const int want[] = {0, -EPROTO, -EPROTO, -ECONNRESET, -ECONNRESET};

    for (size_t i = 0; i < 5; i++) {
        struct fake *f = fake_start(0, modes[i], 1); /* request 0: the first call's */
        struct peer_conn c;
        int r;

        fake_run(f);
        peer_conn_init(&c);
        /* A good answer first, then the wrong one, per kind of call. */
        cr_assert_eq(peer_conn_read_hdrs(&c, f->addr, 2000, 3, hdrs, after), 0);
        cr_assert_eq(hdrs[0].hash_lo, f->h.lo);
        cr_assert_eq(after[0], 2);
        r = peer_conn_read_hdrs(&c, f->addr, 2000, 3, hdrs, after);
        cr_assert_eq(r, want[i], "read_hdrs, mode %zu: %d", i, r);
        if (r < 0)
            assert_failed_and_renew(&c, f->addr, "read_hdrs");
        atomic_store(&f->reqs, 0);
        cr_assert_eq(peer_conn_read_slot(&c, f->addr, 2000, 3, 0, PAY, &hdr, after, buf), 0);
        r = peer_conn_read_slot(&c, f->addr, 2000, 3, 0, PAY, &hdr, after, buf);
        cr_assert_eq(r, want[i], "read_slot, mode %zu: %d", i, r);
        if (r == 0)
            cr_assert_eq(memcmp(buf, f->pay, PAY), 0);
        else
            assert_failed_and_renew(&c, f->addr, "read_slot");
        atomic_store(&f->reqs, 0);
        cr_assert_eq(peer_conn_open(&c, f->addr, 2000), 0);
        cr_assert_eq(peer_conn_read_hdrs_multi(&c, f->addr, 2000, buckets, 3, hdrs, after), 0);
        r = peer_conn_read_hdrs_multi(&c, f->addr, 2000, buckets, 3, hdrs, after);
        cr_assert_eq(r, want[i], "read_hdrs_multi, mode %zu: %d", i, r);
        if (r < 0)
            assert_failed_and_renew(&c, f->addr, "read_hdrs_multi");
        atomic_store(&f->reqs, 0);
        cr_assert_eq(peer_conn_write(&c, f->addr, 2000, 3, 0, 0, &f->h, f->pay, PAY, 1, &found), 0);
        r = peer_conn_write(&c, f->addr, 2000, 3, 0, 0, &f->h, f->pay, PAY, 1, &found);
        /* A write's answer is its rep alone: cut in half, it is an
         * answer that never came on a connection used before, and the
         * write goes once more on a new one (which this member answers);
         * M_CUT_FIXED leaves the whole rep, the answer. */
        cr_assert_eq(r, modes[i] == M_CUT || modes[i] == M_CUT_FIXED ? 0 : want[i],
                     "write, mode %zu: %d", i, r);
        if (modes[i] == M_CUT)
            cr_assert_eq(atomic_load(&f->conns), 5, "the write was not sent again");
        if (r < 0)
            assert_failed_and_renew(&c, f->addr, "write");
        peer_conn_close(&c);
        fake_stop(f);
    }
    /* A write that lost to another writer: -EAGAIN with the seq found,
     * and the connection stays. */
    {
        struct fake *f = fake_start(0, M_AGAIN, 0);
        struct peer_conn c;

        fake_run(f);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_write(&c, f->addr, 2000, 3, 0, 0, &f->h, f->pay, PAY, 1, &found),
                     -EAGAIN);
        cr_assert_eq(found, 42);
        cr_assert_geq(c.fd, 0);
        /* A read of headers of no bucket, too many, or before any
         * connection: refused before a byte is sent. */
        cr_assert_eq(peer_conn_read_hdrs_multi(&c, f->addr, 2000, buckets, 0, hdrs, after),
                     -EINVAL);
        cr_assert_eq(
            peer_conn_read_hdrs_multi(&c, f->addr, 2000, buckets, PEER_BATCH_MAX + 1, hdrs, after),
            -EINVAL);
        peer_conn_close(&c);
        cr_assert_eq(peer_conn_read_hdrs_multi(&c, f->addr, 2000, buckets, 1, hdrs, after),
                     -EINVAL);
        cr_assert_eq(atomic_load(&f->reqs), 1);
        fake_stop(f);
    }
}

/* A get alone on its connection (one round trip, blocking recvs): every
 * wrong answer is a clean miss, never bytes; the connection is closed
 * unless the answer was a well-formed miss. */
Test(peer_wire, a_wrong_answer_to_a_get_is_a_clean_miss, .timeout = 60)
{
    const struct {
        enum fake_mode mode;
        enum peer_miss want;
        bool kept;
    } cases[] = {
        {M_OK, PEER_HIT, true},
        {M_MISS, PEER_MISS_EMPTY, true},
        {M_BADSUM, PEER_MISS_CHECKSUM, true},
        {M_MAGIC, PEER_MISS_UNREACHABLE, false},
        {M_STATUS, PEER_MISS_UNREACHABLE, false},
        {M_EXTRA, PEER_MISS_UNREACHABLE, false}, /* payload bytes after a miss */
        {M_CUT, PEER_MISS_UNREACHABLE, false},
        {M_CUT_FIXED, PEER_MISS_UNREACHABLE, false},
        {M_CUT_PAY, PEER_MISS_UNREACHABLE, false},
    };
    static uint8_t out[PAY];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fake *f = fake_start(0, cases[i].mode, 0);
        struct peer_conn c;
        enum peer_miss r;

        fake_run(f);
        peer_conn_init(&c);
        memset(out, 0, sizeof(out));
        r = peer_conn_get(&c, f->addr, 2000, &f->h, PAY, out);
        cr_assert_eq(r, cases[i].want, "case %zu: %d", i, r);
        if (r == PEER_HIT)
            cr_assert_eq(memcmp(out, f->pay, PAY), 0);
        if (cases[i].kept) {
            cr_assert_geq(c.fd, 0, "case %zu", i);
            /* A length past the member's slots is no request at all. */
            cr_assert_eq(peer_conn_get(&c, f->addr, 2000, &f->h, PAY + 1, out), PEER_MISS_LENGTH);
            cr_assert_eq(atomic_load(&f->reqs), 1);
        } else {
            assert_failed_and_renew(&c, f->addr, "get");
        }
        peer_conn_close(&c);
        fake_stop(f);
    }
}

/* A batch's calls in one pipelined exchange: READ_HDRS, READ_GET and
 * WRITE. Call fail_at gets a wrong answer: the calls before it stand
 * (answered, judged), it and those after it are unreachable. */
Test(peer_wire, a_batch_keeps_the_answers_before_a_wrong_one, .timeout = 60)
{
    const struct {
        enum fake_mode mode;
        unsigned at;
    } cases[] = {
        {M_OK, ~0u}, {M_STATUS, 0}, {M_MAGIC, 1}, {M_STATUS, 1},
        {M_CUT, 1},  {M_STATUS, 2}, {M_CUT, 2},   {M_CUT_PAY, 1},
    };
    static uint8_t buf[PAY];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct fake *f = fake_start(0, cases[i].mode, cases[i].at);
        struct peer_slot_hdr hdrs[3][WAYS];
        uint64_t after[3][WAYS];
        struct peer_call k[3] = {{.hdrs = hdrs[0], .after = after[0]},
                                 {.hdrs = hdrs[1], .after = after[1], .buf = buf},
                                 {.hdrs = hdrs[2], .after = after[2]}};
        struct peer_batch *b = calloc(1, sizeof(*b));
        struct peer_conn c;
        unsigned answered = cases[i].at < 3 ? cases[i].at : 3;
        size_t got;

        fake_run(f);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_open(&c, f->addr, 2000), 0);
        k[0].q = peer_req_for(PEER_OP_READ_HDRS, &f->h, &c.g);
        k[0].q.nways = WAYS;
        k[1].q = peer_req_for(PEER_OP_READ_GET, &f->h, &c.g);
        k[1].q.len = PAY;
        k[2].q = peer_req_for(PEER_OP_WRITE, &f->h, &c.g);
        k[2].q.nways = 1;
        k[2].q.len = PAY;
        k[2].q.stamp = 1;
        k[2].payload = f->pay;
        *b = (struct peer_batch){.c = &c, .member = f->addr, .calls = k, .n = 3};
        memset(buf, 0, sizeof(buf));
        got = peer_conn_batch_run(b, 1, 2000);
        cr_assert_eq(got, answered, "case %zu: %zu answered", i, got);
        for (unsigned j = 0; j < 3; j++)
            cr_assert_eq(k[j].err == 0, j < answered, "case %zu, call %u: err %d", i, j, k[j].err);
        /* The calls answered are judged on what came: the key is there. */
        cr_assert_eq(peer_call_judge(&k[0], WAYS, &f->h, PAY, NULL),
                     answered > 0 ? PEER_HIT : PEER_MISS_UNREACHABLE, "case %zu", i);
        cr_assert_eq(peer_call_judge(&k[1], WAYS, &f->h, PAY, buf),
                     answered > 1 ? PEER_HIT : PEER_MISS_UNREACHABLE, "case %zu", i);
        if (answered > 1)
            cr_assert_eq(memcmp(buf, f->pay, PAY), 0);
        /* Headers that name the key with another length, or mid-write. */
        if (answered > 0) {
            hdrs[0][0].len = PAY / 2;
            cr_assert_eq(peer_call_judge(&k[0], WAYS, &f->h, PAY, NULL), PEER_MISS_LENGTH);
            after[0][0] = 3;
            cr_assert_eq(peer_call_judge(&k[0], WAYS, &f->h, PAY, NULL), PEER_MISS_TORN);
        }
        if (answered < 3)
            assert_failed_and_renew(&c, f->addr, "batch");
        peer_conn_close(&c);
        free(b);
        fake_stop(f);
    }
}

/* A member that closed or reset an idle connection, or sent bytes nobody
 * asked for, is dialled again: the next call is served on a new
 * connection, not failed. */
Test(peer_wire, a_member_that_dropped_the_connection_is_dialled_again, .timeout = 60)
{
    struct peer_slot_hdr hdrs[WAYS];
    uint64_t after[WAYS];
    static uint8_t out[PAY];

    /* Closed after the first answer: the next call finds it closed on its
     * send or its answer, and tries once more on a new connection. */
    {
        struct fake *f = fake_start(0, M_CLOSE, 0);
        struct peer_conn c;

        fake_run(f);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_read_hdrs(&c, f->addr, 2000, 1, hdrs, after), 0);
        wait_hangup(&c);
        cr_assert_eq(peer_conn_read_hdrs(&c, f->addr, 2000, 1, hdrs, after), 0);
        cr_assert_eq(atomic_load(&f->conns), 2);
        peer_conn_close(&c);
        fake_stop(f);
    }
    /* Closed, reset, or a byte unasked after an answer: a get sees it before
     * it sends and starts on a new connection. */
    const enum fake_mode modes[] = {M_CLOSE, M_RESET, M_UNASKED};

    for (size_t i = 0; i < 3; i++) {
        struct fake *f = fake_start(0, modes[i], 0);
        struct peer_conn c;

        fake_run(f);
        peer_conn_init(&c);
        cr_assert_eq(peer_conn_read_hdrs(&c, f->addr, 2000, 1, hdrs, after), 0);
        if (modes[i] == M_UNASKED) {
            struct pollfd p = {.fd = c.fd, .events = POLLIN};

            cr_assert_eq(poll(&p, 1, 10000), 1);
        } else {
            wait_hangup(&c);
        }
        cr_assert_eq(peer_conn_get(&c, f->addr, 2000, &f->h, PAY, out), PEER_HIT, "case %zu", i);
        cr_assert_eq(memcmp(out, f->pay, PAY), 0);
        cr_assert_eq(atomic_load(&f->conns), 2, "case %zu", i);
        /* A connection with nothing on it is kept. */
        cr_assert_eq(peer_conn_open_fresh(&c, f->addr, 2000), 0);
        cr_assert_eq(atomic_load(&f->conns), 2, "case %zu", i);
        peer_conn_close(&c);
        fake_stop(f);
    }
}

/* More than the sockets hold at once: 64 writes and 64 gets of a slot
 * each, pipelined to a member that reads one request at a time; every one
 * is answered. A batch on a connection that is not open answers nothing. */
Test(peer_wire, a_batch_larger_than_the_sockets_buffers_is_answered, .timeout = 60)
{
    enum { N = 128 };
    static struct peer_slot_hdr hdrs[N][WAYS];
    static uint64_t after[N][WAYS];
    static uint8_t bufs[N / 2][PAY];
    static struct peer_call k[N];
    struct fake *f = fake_start(0, M_OK, ~0u);
    struct peer_batch *b = calloc(1, sizeof(*b));
    struct peer_conn c;

    fake_run(f);
    peer_conn_init(&c);
    cr_assert_eq(peer_conn_open(&c, f->addr, 2000), 0);
    for (unsigned i = 0; i < N; i++) {
        bool w = i % 2 == 0;

        k[i] = (struct peer_call){.hdrs = hdrs[i], .after = after[i]};
        k[i].q = peer_req_for(w ? PEER_OP_WRITE : PEER_OP_READ_GET, &f->h, &c.g);
        k[i].q.len = PAY;
        if (w) {
            k[i].q.nways = 1;
            k[i].payload = f->pay;
        } else {
            k[i].buf = bufs[i / 2];
        }
    }
    *b = (struct peer_batch){.c = &c, .member = f->addr, .calls = k, .n = N};
    cr_assert_eq(peer_conn_batch_run(b, 1, 5000), N);
    for (unsigned i = 1; i < N; i += 2) {
        cr_assert_eq(k[i].err, 0);
        cr_assert_eq(peer_call_judge(&k[i], WAYS, &f->h, PAY, bufs[i / 2]), PEER_HIT);
    }
    cr_assert_eq(atomic_load(&f->reqs), N);
    peer_conn_close(&c);
    cr_assert_eq(peer_conn_batch_run(b, 1, 2000), 0);
    for (unsigned i = 0; i < N; i++)
        cr_assert_eq(k[i].err, -EHOSTUNREACH);
    /* A single get too (the one-call path). */
    *b = (struct peer_batch){.c = &c, .member = f->addr, .calls = &k[1], .n = 1};
    cr_assert_eq(peer_conn_batch_run(b, 1, 2000), 0);
    cr_assert_eq(k[1].err, -EHOSTUNREACH);
    cr_assert_eq(peer_call_judge(&k[1], WAYS, &f->h, PAY, bufs[0]), PEER_MISS_UNREACHABLE);
    free(b);
    fake_stop(f);
}
