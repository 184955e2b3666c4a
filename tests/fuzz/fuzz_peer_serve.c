/* SPDX-License-Identifier: MIT */
/*
 * fuzz_peer_serve.c - libFuzzer target: the peer server's request loop
 * (core/peer/peer_server.c's conn_main and serve_one, through peer_serve_stream)
 * fed arbitrary bytes as one client's stream over a socketpair: any number
 * of requests, payloads and garbage, cut anywhere.
 *
 * The input's first byte picks the server and the client: 0, a server with
 * no key fed the rest as is; 1, a server with the members' key, and a
 * harness client that goes through the handshake and then sends the rest
 * as requests, each tagged (a request is 64 bytes, then a body as long as
 * its len says for a write or READ_HDRS_MULTI, as far as the input goes):
 * the request loop behind the key; 2, a server with the key fed the rest as
 * is (no handshake): it must answer nothing after its hello.
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

#include <stdbool.h>
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
static struct peer_key *key;

struct io {
    int fd;
    const uint8_t *data;
    size_t size, got;
    bool sign;     /* mode 1: handshake, then a tag per request */
    size_t hs;     /* bytes of the handshake the server answered (mode 1) */
    struct io *rd; /* mode 1: the reader, started after the handshake */
    pthread_t tr;  /* ... its thread */
    bool tr_started;
};

static void *reader(void *arg);

static bool send_all(int fd, const void *p, size_t n)
{
    while (n) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);

        if (r <= 0)
            return false; /* the server refused a request and closed */
        p = (const uint8_t *)p + r;
        n -= (size_t)r;
    }
    return true;
}

/* Mode 1: the hello read and the handshake done here; then each request of
 * the input with its tag before its body. false when the server closed. */
static bool send_signed(struct io *w)
{
    uint8_t hw[PEER_HELLO_WIRE], msg[PEER_AUTH_WIRE], want[PEER_PROOF], got[PEER_PROOF];
    uint8_t tag[PEER_TAG];
    struct peer_sess s = {0};
    size_t off = 0;
    bool ok = false;

    if (recv(w->fd, hw, sizeof(hw), MSG_WAITALL) != (ssize_t)sizeof(hw) ||
        peer_auth_client(key, hw, sizeof(hw), msg, want, &s) < 0 ||
        !send_all(w->fd, msg, sizeof(msg)) ||
        recv(w->fd, got, sizeof(got), MSG_WAITALL) != (ssize_t)sizeof(got) ||
        !peer_proof_equal(want, got))
        goto out;
    w->hs = sizeof(hw) + sizeof(got);
    /* From here the answers are drained as they come (the server blocks
     * on a full socket otherwise). */
    if (pthread_create(&w->tr, NULL, reader, w->rd) != 0)
        goto out;
    w->tr_started = true;
    while (off + PEER_REQ_WIRE <= w->size) {
        const uint8_t *img = w->data + off;
        struct peer_req q;
        size_t blen = 0;

        peer_req_dec(&q, img);
        if (q.op == PEER_OP_WRITE || q.op == PEER_OP_READ_HDRS_MULTI)
            blen = q.len;
        if (blen > w->size - off - PEER_REQ_WIRE)
            blen = w->size - off - PEER_REQ_WIRE;
        if (peer_req_tag(&s, img, img + PEER_REQ_WIRE, blen, tag) < 0 ||
            !send_all(w->fd, img, PEER_REQ_WIRE) || !send_all(w->fd, tag, sizeof(tag)) ||
            !send_all(w->fd, img + PEER_REQ_WIRE, blen))
            goto out;
        off += PEER_REQ_WIRE + blen;
    }
    ok = send_all(w->fd, w->data + off, w->size - off);
out:
    peer_sess_end(&s);
    return ok;
}

static void *writer(void *arg)
{
    struct io *w = arg;

    if (w->sign) {
        send_signed(w);
    } else {
        send_all(w->fd, w->data, w->size);
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
    memset(pay, 0x42, 32);
    if (peer_key_from(pay, 32, &key) < 0)
        abort();
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
        uint8_t seed[1 + 3 * PEER_REQ_WIRE + 8];

        for (int i = 0; i < 3; i++)
            peer_req_enc(seed + 1 + i * PEER_REQ_WIRE, &q[i]);
        memset(seed + 1 + 3 * PEER_REQ_WIRE, 0x5a, 8);
        for (uint8_t mode = 0; mode < 3; mode++) {
            char name[32];

            seed[0] = mode;
            snprintf(name, sizeof(name), "peer-serve-%u", mode);
            fz_seed(name, seed, sizeof(seed));
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int sv[2];
    struct io w, r;
    pthread_t tw, tr;
    size_t most;

    uint8_t mode = size ? data[0] % 3 : 0;

    if (size) {
        data++;
        size--;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        abort();
    r = (struct io){.fd = sv[0]};
    w = (struct io){.fd = sv[0], .data = data, .size = size, .sign = mode == 1, .rd = &r};
    pthread_create(&tw, NULL, writer, &w);
    /* Mode 1: the writer reads the hello and the proof itself. */
    if (mode != 1)
        pthread_create(&tr, NULL, reader, &r);
    peer_serve_stream(&region, mode ? key : NULL, sv[1]); /* closes sv[1] */
    pthread_join(tw, NULL);
    if (mode != 1)
        pthread_join(tr, NULL);
    else if (w.tr_started)
        pthread_join(w.tr, NULL);
    close(sv[0]);
    r.got += w.hs;
    if (mode == 2 && r.got > PEER_HELLO_WIRE) {
        fprintf(stderr, "property broken: %zu bytes answered without the handshake\n", r.got);
        abort();
    }
    /* At most one request per 64 bytes of input, each answered with at
     * most a rep, (ways + 1) headers with their seqs and a payload (a
     * READ_HDRS_MULTI of 64 buckets needs 64 + 512 bytes of input). */
    most = PEER_HELLO_WIRE + PEER_PROOF +
           (size / PEER_REQ_WIRE + 1) *
               (PEER_REP_WIRE + (size_t)PEER_BATCH_MAX * 3 * PEER_HDR_WIRE + SLOT);
    if (r.got > most) {
        fprintf(stderr, "property broken: %zu bytes answered to %zu bytes of requests\n", r.got,
                size);
        abort();
    }
    return 0;
}
