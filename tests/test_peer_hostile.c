/* SPDX-License-Identifier: MIT */
/*
 * test_peer_hostile.c - the peer server against hostile clients on
 * loopback: a flood of connections from other addresses (127.0.0.2..),
 * held idle or stopped in the middle of a request, must not keep a member
 * from being served within its deadline; and bytes of every kind sent as
 * requests close that connection only (the server keeps serving).
 */
#include "peer_fixture.h"
#include "peer_i.h"
#include "testutil.h"

#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FLOOD_HOSTS 12
#define FLOOD_EACH  12 /* more than a host may hold, more than the server holds in all */

/* A connection to the server from source address 127.0.0.<src>. */
static int connect_from(unsigned src, unsigned port)
{
    struct sockaddr_in a = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert(fd >= 0);
    a.sin_addr.s_addr = htonl(0x7f000000u | src);
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    to.sin_port = htons((uint16_t)port);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0, "bind 127.0.0.%u", src);
    cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof(to)), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

/* The member's read: a get in one round trip, deadline 500 ms. */
static void member_reads(struct srv *x, const struct sfs_key *k)
{
    struct peer_conn c;
    struct peer_hash h = peer_key_hash(k);
    uint8_t out[PAY];

    peer_conn_init(&c);
    cr_assert_eq(peer_conn_get(&c, x->addr, 500, &h, PAY, out), PEER_HIT);
    cr_assert_eq(tu_check(k, out, PAY), -1);
    peer_conn_close(&c);
}

Test(peer_hostile, a_connection_flood_does_not_lock_a_member_out, .timeout = 60)
{
    struct srv x;
    struct sfs_key k = tu_key(77, 0);
    struct peer_hash h = peer_key_hash(&k);
    uint8_t in[PAY];
    struct peer_req half = {.magic = PEER_MAGIC,
                            .version = PEER_VERSION,
                            .op = PEER_OP_READ_GET,
                            .hash_lo = h.lo,
                            .hash_hi = h.hi,
                            .len = PAY};
    int fds[FLOOD_HOSTS * FLOOD_EACH];
    uint8_t hw[PEER_REQ_WIRE];

    peer_req_enc(hw, &half);
    srv_start(&x, 16, 4);
    tu_fill(&k, in, PAY);
    cr_assert_eq(peer_local_set(&x.r, &h, in, PAY), 0);
    /* FLOOD_HOSTS addresses, FLOOD_EACH connections each, held open: half
     * of them idle, half stopped in the middle of a request. */
    for (unsigned i = 0; i < FLOOD_HOSTS * FLOOD_EACH; i++) {
        fds[i] = connect_from(2 + i % FLOOD_HOSTS, x.port);
        if (i % 2)
            cr_assert_eq(send(fds[i], hw, sizeof(hw) / 2, 0), (ssize_t)sizeof(hw) / 2);
    }
    usleep(300000); /* let the server accept them all */
    /* The member (127.0.0.1) is served, more than once, each within its
     * deadline: the flood made room for it. */
    for (int i = 0; i < 3; i++)
        member_reads(&x, &k);
    for (unsigned i = 0; i < FLOOD_HOSTS * FLOOD_EACH; i++)
        close(fds[i]);
    peer_server_stop(x.s);
    peer_region_destroy(&x.r);
}

/* Random bytes, requests with random fields, and lengths past everything,
 * each on its own connection: each closes that connection only. */
Test(peer_hostile, garbage_closes_only_its_connection, .timeout = 60)
{
    struct srv x;
    struct sfs_key k = tu_key(78, 0);
    struct peer_hash h = peer_key_hash(&k);
    uint8_t in[PAY], junk[512];
    uint64_t st = 12345;

    srv_start(&x, 16, 4);
    tu_fill(&k, in, PAY);
    cr_assert_eq(peer_local_set(&x.r, &h, in, PAY), 0);
    for (int i = 0; i < 200; i++) {
        int fd = connect_from(2 + (unsigned)i % 4, x.port);
        struct peer_req q;
        size_t n;

        for (size_t j = 0; j < sizeof(junk); j += 8) {
            uint64_t w = tu_rng_next(&st);

            memcpy(junk + j, &w, 8);
        }
        peer_req_dec(&q, junk);
        if (i % 3) { /* a real header, the rest random: past the magic check */
            q.magic = PEER_MAGIC;
            q.version = PEER_VERSION;
            q.op = (uint16_t)(1 + i % 5);
            if (i % 3 == 2)
                q.len = 0xffffffffu - (uint32_t)i; /* oversized */
            peer_req_enc(junk, &q);
        }
        n = 1 + tu_rng_next(&st) % sizeof(junk);
        send(fd, junk, n, MSG_NOSIGNAL);
        shutdown(fd, SHUT_WR);
        close(fd);
        if (i % 20 == 0)
            member_reads(&x, &k);
    }
    member_reads(&x, &k);
    peer_server_stop(x.s);
    peer_region_destroy(&x.r);
}
