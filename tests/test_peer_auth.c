/* SPDX-License-Identifier: MIT */
/*
 * test_peer_auth.c - members of the peer tier authenticate each other
 * (core/peer/peer_auth.c), on loopback: HMAC-SHA256 against RFC 4231's
 * vectors, the key file's checks, the handshake both ways (no key, another
 * key, at either end), and requests that are not the next one a member
 * tagged: a tampered payload, a captured write replayed on its own
 * connection, on a fresh one, and to an owner restarted with its slots'
 * seqs back at zero. Every refusal closes the connection without serving
 * the request, and the region is untouched.
 */
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", p[i]);
}

Test(peer_auth, hmac_sha256_matches_rfc_4231, .timeout = 10)
{
    struct peer_mac m;
    uint8_t out[32], big[131];
    char h[65];
    const char *d2 = "what do ya want for nothing?",
               *d6 = "Test Using Larger Than Block-Size Key - Hash Key First";

    /* Test case 2: a short key, in two pieces. */
    struct peer_piece v2[] = {{d2, 10}, {d2 + 10, strlen(d2) - 10}};

    cr_assert_eq(peer_mac_init(&m, "Jefe", 4), 0);
    cr_assert_eq(peer_mac_sum(&m, v2, 2, out), 0);
    hex(out, 32, h);
    cr_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    peer_mac_free(&m);
    /* Test case 6: a key longer than SHA-256's block is hashed first. */
    memset(big, 0xaa, sizeof(big));
    cr_assert_eq(peer_mac_init(&m, big, sizeof(big)), 0);
    cr_assert_eq(peer_mac_sum(&m, &(struct peer_piece){d6, strlen(d6)}, 1, out), 0);
    hex(out, 32, h);
    cr_assert_str_eq(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    peer_mac_free(&m);
}

/* A file at a fresh path with n bytes and mode. */
static const char *key_file(size_t n, mode_t mode)
{
    static char path[128];
    uint8_t b[PEER_KEY_MAX + 8];
    int fd;

    memset(b, 0x42, sizeof(b));
    snprintf(path, sizeof(path), "%s", tu_path("key"));
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, b, n), (ssize_t)n);
    cr_assert_eq(fchmod(fd, mode), 0);
    close(fd);
    return path;
}

Test(peer_auth, the_key_file_is_the_daemons_alone, .timeout = 10)
{
    struct peer_key *k = NULL;
    char err[256] = "", link[160];
    const char *p;

    p = key_file(32, 0600);
    cr_assert_eq(peer_key_load(p, &k, err, sizeof(err)), 0, "%s", err);
    peer_key_free(k);
    snprintf(link, sizeof(link), "%s.link", p);
    cr_assert_eq(symlink(p, link), 0);
    cr_assert_eq(peer_key_load(link, &k, err, sizeof(err)), -ELOOP, "a link is not followed");
    unlink(link);
    unlink(p);
    const struct {
        size_t n;
        mode_t mode;
        int err;
        const char *says;
    } bad[] = {
        {32, 0644, -EPERM, "lets group or others"},    {32, 0640, -EPERM, "lets group or others"},
        {32, 0602, -EPERM, "lets group or others"},    {31, 0600, -EINVAL, "wants 32 to 4096"},
        {PEER_KEY_MAX + 1, 0600, -EINVAL, "wants 32"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p = key_file(bad[i].n, bad[i].mode);
        err[0] = '\0';
        cr_assert_eq(peer_key_load(p, &k, err, sizeof(err)), bad[i].err, "case %zu", i);
        cr_assert_null(k);
        cr_assert(strstr(err, bad[i].says), "case %zu: %s", i, err);
        unlink(p);
    }
    /* A FIFO neither blocks the open nor passes. */
    p = tu_path("fifo");
    cr_assert_eq(mkfifo(p, 0600), 0);
    cr_assert_eq(peer_key_load(p, &k, err, sizeof(err)), -EINVAL);
    unlink(p);
}

/* Two keys: the fixture's (the members') and another. */
static struct peer_key *other_key(void)
{
    struct peer_key *k = NULL;
    uint8_t b[32];

    memset(b, 0x17, sizeof(b));
    cr_assert_eq(peer_key_from(b, sizeof(b), &k), 0);
    return k;
}

Test(peer_auth, members_with_the_key_read_write_and_get, .timeout = 30)
{
    struct peer_key *k = fx_key();
    struct srv x;
    struct peer_conn c;
    struct peer_slot_hdr hdrs[4];
    uint64_t after[4], found = 0;
    struct sfs_key key = tu_key(5, 0);
    struct peer_hash h = peer_key_hash(&key);
    uint8_t in[PAY], out[PAY];
    uint64_t bucket;

    srv_start_key(&x, 16, 4, k);
    peer_conn_init(&c);
    c.key = k;
    cr_assert_eq(peer_conn_open(&c, x.addr, 2000), 0);
    cr_assert(c.sess.on);
    bucket = peer_bucket_of(&h, c.g.num_buckets);
    cr_assert_eq(peer_conn_read_hdrs(&c, x.addr, 2000, bucket, hdrs, after), 0);
    tu_fill(&key, in, PAY);
    cr_assert_eq(peer_conn_write(&c, x.addr, 2000, bucket, 0, after[0], &h, in, PAY, 1, &found), 0);
    cr_assert_eq(peer_conn_get(&c, x.addr, 2000, &h, PAY, out), PEER_HIT);
    cr_assert_eq(memcmp(in, out, PAY), 0);
    /* The conditional write still loses to a seq that moved. */
    cr_assert_eq(peer_conn_write(&c, x.addr, 2000, bucket, 0, after[0], &h, in, PAY, 2, &found),
                 -EAGAIN);
    cr_assert_eq(peer_local_get(&x.r, &h, out, PAY), PEER_HIT);
    peer_conn_close(&c);
    srv_stop(&x);
    peer_key_free(k);
}

Test(peer_auth, an_end_without_the_key_or_with_another_is_refused, .timeout = 30)
{
    struct peer_key *k = fx_key(), *o = other_key();
    struct srv keyed, open;
    struct peer_conn c;
    struct sfs_key key = tu_key(6, 0);
    struct peer_hash h = peer_key_hash(&key);
    uint8_t in[PAY], out[PAY];

    srv_start_key(&keyed, 16, 4, k);
    srv_start(&open, 16, 4);
    tu_fill(&key, in, PAY);
    cr_assert_eq(peer_local_set(&keyed.r, &h, in, PAY), 0);
    cr_assert_eq(peer_local_set(&open.r, &h, in, PAY), 0);
    /* No key at the client; another key; a server with no key. */
    peer_conn_init(&c);
    cr_assert_eq(peer_conn_open(&c, keyed.addr, 2000), -EACCES);
    cr_assert_eq(c.fd, -1);
    peer_conn_init(&c);
    cr_assert_eq(peer_conn_get(&c, keyed.addr, 2000, &h, PAY, out), PEER_MISS_UNREACHABLE);
    peer_conn_init(&c);
    c.key = o;
    cr_assert_eq(peer_conn_open(&c, keyed.addr, 2000), -EACCES);
    peer_conn_init(&c);
    c.key = k;
    cr_assert_eq(peer_conn_open(&c, open.addr, 2000), -EACCES, "a server without the key");
    /* A server of another key: the client's proof fails there, and the
     * server's would fail here. */
    srv_stop(&open);
    srv_start_key(&open, 16, 4, o);
    peer_conn_init(&c);
    c.key = k;
    cr_assert_eq(peer_conn_open(&c, open.addr, 2000), -EACCES);
    /* The member with the key is served. */
    peer_conn_init(&c);
    c.key = k;
    cr_assert_eq(peer_conn_get(&c, keyed.addr, 2000, &h, PAY, out), PEER_HIT);
    peer_conn_close(&c);
    srv_stop(&keyed);
    srv_stop(&open);
    peer_key_free(k);
    peer_key_free(o);
}

/* --- by hand: the handshake and tagged requests on a raw socket --- */

static int dial(const struct srv *x)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {.tv_sec = 5};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;

    a.sin_port = htons((uint16_t)x->port);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void recv_exact(int fd, void *p, size_t n)
{
    cr_assert_eq(recv(fd, p, n, MSG_WAITALL), (ssize_t)n);
}

/* A connection through the handshake with key k: its session in *s. */
static int dial_member(const struct srv *x, const struct peer_key *k, struct peer_sess *s)
{
    uint8_t hw[PEER_HELLO_WIRE], msg[PEER_AUTH_WIRE], want[PEER_PROOF], got[PEER_PROOF];
    int fd = dial(x);

    recv_exact(fd, hw, sizeof(hw));
    cr_assert_eq(peer_auth_client(k, hw, sizeof(hw), msg, want, s), 0);
    cr_assert_eq(send(fd, msg, sizeof(msg), 0), (ssize_t)sizeof(msg));
    recv_exact(fd, got, sizeof(got));
    cr_assert(peer_proof_equal(want, got));
    return fd;
}

/* The bytes of a conditional write of key h's payload into way 0 of its
 * bucket on seq `expect`, tagged as the next request of s: image, tag,
 * payload. */
static void tagged_write(struct peer_sess *s, const struct peer_geometry *g,
                         const struct peer_hash *h, const uint8_t *pay, uint64_t expect,
                         uint8_t *msg)
{
    struct peer_req q = peer_req_for(PEER_OP_WRITE, h, g);

    q.nways = 1;
    q.expect = expect;
    q.len = PAY;
    q.stamp = 1;
    peer_req_enc(msg, &q);
    cr_assert_eq(peer_req_tag(s, msg, pay, PAY, msg + PEER_REQ_WIRE), 0);
    memcpy(msg + PEER_REQ_WIRE + PEER_TAG, pay, PAY);
}

#define WMSG (PEER_REQ_WIRE + PEER_TAG + PAY)

/* Send msg on fd: an answer with status 0 (served), or the connection
 * closed without a byte (refused): true when served. */
static bool served(int fd, const uint8_t *msg, size_t n)
{
    uint8_t rw[PEER_REP_WIRE];
    struct peer_rep rep;
    ssize_t r;

    cr_assert_eq(send(fd, msg, n, MSG_NOSIGNAL), (ssize_t)n);
    r = recv(fd, rw, sizeof(rw), MSG_WAITALL);
    if (r <= 0)
        return false;
    cr_assert_eq(r, (ssize_t)sizeof(rw));
    peer_rep_dec(&rep, rw);
    cr_assert_eq(rep.status, 0);
    return true;
}

/* Whether the slot of way 0 of h's bucket holds pay, and its seq. */
static uint64_t slot_seq(const struct srv *x, const struct peer_hash *h)
{
    /* Relaxed: nothing writes the region meanwhile. */
    return atomic_load_explicit(&peer_slot(&x->r, peer_bucket_of(h, x->r.g.num_buckets), 0)->seq,
                                memory_order_relaxed);
}

Test(peer_auth, a_request_without_its_tag_or_tampered_is_refused, .timeout = 30)
{
    struct peer_key *k = fx_key();
    struct peer_sess s = {0}, t = {0};
    struct srv x;
    struct sfs_key key = tu_key(7, 0);
    struct peer_hash h = peer_key_hash(&key);
    static uint8_t pay[PAY], msg[WMSG];
    uint8_t hw[PEER_HELLO_WIRE];
    int fd;

    srv_start_key(&x, 16, 4, k);
    tu_fill(&key, pay, PAY);
    /* A version-5 request with no handshake at all: closed, nothing but
     * the hello sent. */
    fd = dial(&x);
    recv_exact(fd, hw, sizeof(hw));
    peer_req_enc(msg, &(struct peer_req){.magic = PEER_MAGIC,
                                         .version = PEER_VERSION,
                                         .op = PEER_OP_READ_GET,
                                         .bucket = peer_bucket_of(&h, x.r.g.num_buckets),
                                         .hash_lo = h.lo,
                                         .hash_hi = h.hi,
                                         .len = PAY});
    cr_assert_not(served(fd, msg, PEER_AUTH_WIRE));
    close(fd);
    /* Through the handshake, a write whose payload was changed on the way. */
    fd = dial_member(&x, k, &s);
    tagged_write(&s, &x.r.g, &h, pay, 0, msg);
    msg[WMSG - 1] ^= 1;
    cr_assert_not(served(fd, msg, WMSG));
    close(fd);
    /* A tag made for another connection. */
    fd = dial_member(&x, k, &s);
    dial_member(&x, k, &t);
    tagged_write(&t, &x.r.g, &h, pay, 0, msg);
    cr_assert_not(served(fd, msg, WMSG));
    close(fd);
    cr_assert_eq(slot_seq(&x, &h), 0, "a refused write touched the slot");
    /* The real thing is served. */
    fd = dial_member(&x, k, &s);
    tagged_write(&s, &x.r.g, &h, pay, 0, msg);
    cr_assert(served(fd, msg, WMSG));
    cr_assert_eq(slot_seq(&x, &h), 2);
    close(fd);
    peer_sess_end(&s);
    peer_sess_end(&t);
    srv_stop(&x);
    peer_key_free(k);
}

/* A captured write is good once, on its connection, at its place: replayed
 * there, on a fresh connection, or to the owner restarted with every seq
 * back at zero (where its expected seq 0 would match again), it is
 * refused and the slot keeps what it had. */
Test(peer_auth, a_captured_write_replayed_is_refused, .timeout = 30)
{
    struct peer_key *k = fx_key();
    struct peer_sess s = {0}, t = {0};
    struct srv x;
    struct sfs_key key = tu_key(8, 0);
    struct peer_hash h = peer_key_hash(&key);
    static uint8_t pay[PAY], cap[WMSG], out[PAY];
    char err[256] = "";
    int fd, fd2;

    srv_start_key(&x, 16, 4, k);
    tu_fill(&key, pay, PAY);
    fd = dial_member(&x, k, &s);
    tagged_write(&s, &x.r.g, &h, pay, 0, cap); /* captured on the wire */
    cr_assert(served(fd, cap, WMSG));
    cr_assert_eq(slot_seq(&x, &h), 2);
    /* Again on its own connection: no longer the next request. */
    cr_assert_not(served(fd, cap, WMSG));
    close(fd);
    /* On a fresh connection of a member (another session). */
    fd2 = dial_member(&x, k, &t);
    cr_assert_not(served(fd2, cap, WMSG));
    close(fd2);
    cr_assert_eq(slot_seq(&x, &h), 2);
    /* The owner restarts: a new region, seq 0 everywhere, the same key. */
    peer_server_stop(x.s);
    peer_region_destroy(&x.r);
    fx_region(&x.r, 16, 4);
    cr_assert_eq(peer_server_start(&x.s, &x.r, x.addr, k, err, sizeof(err)), 0, "%s", err);
    fd2 = dial_member(&x, k, &t);
    cr_assert_not(served(fd2, cap, WMSG));
    close(fd2);
    cr_assert_eq(slot_seq(&x, &h), 0, "the replayed write landed on the restarted owner");
    cr_assert_eq(peer_local_get(&x.r, &h, out, PAY), PEER_MISS_EMPTY);
    peer_sess_end(&s);
    peer_sess_end(&t);
    srv_stop(&x);
    peer_key_free(k);
}

/* --- the key file's owner --- */

/* A key file owned by another uid is refused; one owned by the daemon's
 * own (not root) uid is its own. */
Test(peer_auth, the_key_file_belongs_to_root_or_the_daemon, .timeout = 10)
{
    struct peer_key *k = NULL;
    char err[256] = "";
    const char *p = key_file(32, 0600);

    if (geteuid() != 0)
        cr_skip_test("needs root to give the file away");
    cr_assert_eq(chown(p, 4321, 4321), 0);
    cr_assert_eq(peer_key_load(p, &k, err, sizeof(err)), -EPERM);
    cr_assert_null(k);
    cr_assert(strstr(err, "owned by uid 4321"), "%s", err);
    /* The daemon running as that uid reads it. */
    cr_assert_eq(seteuid(4321), 0);
    err[0] = '\0';
    cr_assert_eq(peer_key_load(p, &k, err, sizeof(err)), 0, "%s", err);
    cr_assert_eq(seteuid(0), 0);
    peer_key_free(k);
    unlink(p);
    /* Bytes of a key outside the bounds. */
    {
        uint8_t b[PEER_KEY_MAX + 1] = {0};

        cr_assert_eq(peer_key_from(b, PEER_KEY_MIN - 1, &k), -EINVAL);
        cr_assert_null(k);
        cr_assert_eq(peer_key_from(b, PEER_KEY_MAX + 1, &k), -EINVAL);
        cr_assert_null(k);
    }
}
