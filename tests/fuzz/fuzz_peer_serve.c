/* SPDX-License-Identifier: MIT */
/*
 * fuzz_peer_serve.c - libFuzzer target: the peer server's request loop
 * (core/peer/peer_server.c's conn_main and serve_one, through peer_serve_stream)
 * fed arbitrary bytes as one client's stream over a socketpair: any number
 * of requests, payloads and garbage, cut anywhere.
 *
 * The region is small (4 buckets x 2 ways x 256 bytes) with a few slots
 * written, so reads, gets and conditional writes reach real bytes. A writer
 * thread sends the input then shuts its side; a reader thread drains the
 * answers. Properties (abort on a breach): the loop returns (it ends at the
 * stream's end or at the first refused request: no hang), and the bytes
 * answered never exceed what the requests could ask for (a hello, then per
 * request of the input at most a header and a bucket's headers, one more
 * and a slot's payload); ASan/UBSan watch every copy in and out of the
 * region.
 */
#include "fuzz_seeds.h"
#include "peer_i.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SLOT 256u
static struct peer_region region;

struct io {
    int fd;
    const uint8_t *data;
    size_t size, got;
};

static void *writer(void *arg)
{
    struct io *w = arg;
    size_t off = 0;

    while (off < w->size) {
        ssize_t n = send(w->fd, w->data + off, w->size - off, MSG_NOSIGNAL);

        if (n <= 0)
            break; /* the server refused a request and closed */
        off += (size_t)n;
    }
    shutdown(w->fd, SHUT_WR);
    return NULL;
}

static void *reader(void *arg)
{
    struct io *r = arg;
    uint8_t buf[65536];
    ssize_t n;

    while ((n = recv(r->fd, buf, sizeof(buf), 0)) > 0)
        r->got += (size_t)n;
    return NULL;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct peer_geometry g;
    uint8_t pay[SLOT];
    struct peer_req q[3];

    (void)argc;
    (void)argv;
    if (peer_geometry_make(4 * 2 * (PEER_HDR_SIZE + SLOT), 2, SLOT, &g) < 0 ||
        peer_region_create(&region, &g) < 0)
        abort();
    for (unsigned i = 0; i < 6; i++) {
        struct peer_hash h = {0x1000 + i, 0x2000 + i};

        memset(pay, (int)i, sizeof(pay));
        peer_local_set(&region, &h, pay, SLOT - i);
    }
    /* A seed: a header read, a get of a written key, a write. */
    memset(q, 0, sizeof(q));
    for (int i = 0; i < 3; i++) {
        q[i].magic = PEER_MAGIC;
        q[i].version = PEER_VERSION;
    }
    q[0].op = PEER_OP_READ_HDRS;
    q[0].nways = 2;
    {
        struct peer_hash h = {0x1000, 0x2000};

        q[1].op = PEER_OP_READ_GET;
        q[1].bucket = peer_bucket_of(&h, g.num_buckets);
        q[1].hash_lo = h.lo;
        q[1].hash_hi = h.hi;
        q[1].len = SLOT;
    }
    q[2].op = PEER_OP_WRITE;
    q[2].nways = 1;
    q[2].len = 8;
    {
        uint8_t seed[3 * PEER_REQ_WIRE + 8];

        for (int i = 0; i < 3; i++)
            peer_req_enc(seed + i * PEER_REQ_WIRE, &q[i]);
        memset(seed + 3 * PEER_REQ_WIRE, 0x5a, 8);
        fz_seed("peer-serve", seed, sizeof(seed));
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    struct io w, r;
    pthread_t tw, tr;
    size_t most;

    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    w = (struct io){.fd = sv[0], .data = data, .size = size};
    r = (struct io){.fd = sv[0]};
    pthread_create(&tw, NULL, writer, &w);
    pthread_create(&tr, NULL, reader, &r);
    peer_serve_stream(&region, sv[1]); /* closes sv[1] */
    pthread_join(tw, NULL);
    pthread_join(tr, NULL);
    close(sv[0]);
    /* At most one request per 64 bytes of input, each answered with at
     * most a rep, (ways + 1) headers with their seqs and a payload (a
     * READ_HDRS_MULTI of 64 buckets needs 64 + 512 bytes of input). */
    most =
        PEER_HELLO_WIRE + (size / PEER_REQ_WIRE + 1) *
                              (PEER_REP_WIRE + (size_t)PEER_BATCH_MAX * 3 * PEER_HDR_WIRE + SLOT);
    if (r.got > most) {
        fprintf(stderr, "property broken: %zu bytes answered to %zu bytes of requests\n", r.got,
                size);
        abort();
    }
    return 0;
}
