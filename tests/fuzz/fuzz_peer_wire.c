/* SPDX-License-Identifier: MIT */
/*
 * fuzz_peer_wire.c - libFuzzer target: the peer tier's validation
 * (core/peer/peer_net.c's peer_req_check, core/peer/peer_region.c's
 * peer_geometry_check and peer_slot_matches; core/peer/peer_auth.c's
 * request tags) over arbitrary bytes.
 *
 *   bytes 0..71    a hello's wire image (its geometry is what is checked)
 *   bytes 72..135  a request's wire image
 *   bytes 136..199 a slot header's wire image, then 8+8 bytes: the seqs
 *                  read before and after the copy, 4 bytes: the expected
 *                  length, 16 bytes: the key hash (all little-endian, as
 *                  on the wire), 16 bytes: a request tag; the rest: the
 *                  payload
 *
 * Short inputs are zero-padded. Properties (abort on a breach):
 * - a geometry that passes the check has a region below 2^47 bytes and a
 *   stride that holds the header and max_payload;
 * - a request that passes the check against a valid geometry names bytes
 *   inside the region (bucket, way range, length; a READ_GET its bucket
 *   and a length within a slot), and a write's expected seq is even;
 * - peer_slot_matches says hit only for an even, unchanged seq, the key's
 *   hash, the expected length and the payload's checksum;
 * - a server's session takes the request (image, payload) with the given
 *   tag only when it is the tag the client's session of the same handshake
 *   made for it.
 */
#include "fuzz_harness.h"
#include "peer_i.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OFF_REQ  72
#define OFF_HDR  136
#define OFF_TAIL 200
#define TAIL     (8 + 8 + 4 + 16 + PEER_TAG)

static struct peer_key *key;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz_peer_wire: property broken: %s\n", what);
        abort();
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    uint8_t seed[OFF_TAIL + TAIL + 64];
    struct peer_geometry g;
    struct peer_req q = {.magic = PEER_MAGIC,
                         .version = PEER_VERSION,
                         .op = PEER_OP_READ_HDRS,
                         .bucket = 3,
                         .nways = 4};

    (void)argc;
    (void)argv;
    memset(seed, 0x42, 32);
    if (peer_key_from(seed, 32, &key) < 0)
        abort();
    memset(seed, 0, sizeof(seed));
    peer_geometry_make(1 << 20, 4, 4096, &g);
    peer_hello_enc(seed,
                   &(struct peer_hello){.magic = PEER_MAGIC, .version = PEER_VERSION, .g = g});
    peer_req_enc(seed + OFF_REQ, &q);
    fz_seed("read_hdrs", seed, sizeof(seed));
    q.op = PEER_OP_WRITE;
    q.nways = 1;
    q.len = 64;
    peer_req_enc(seed + OFF_REQ, &q);
    fz_seed("write", seed, sizeof(seed));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t in[OFF_TAIL + TAIL];
    struct peer_geometry g;
    struct peer_req q;
    struct peer_slot_hdr hdr;
    struct peer_hash h;
    uint64_t before, after;
    uint32_t len;
    const uint8_t *payload = size > sizeof(in) ? data + sizeof(in) : NULL;
    size_t plen = size > sizeof(in) ? size - sizeof(in) : 0;
    struct peer_hello hello;
    uint8_t hw[PEER_HDR_WIRE];
    _Static_assert(PEER_HELLO_WIRE <= OFF_REQ, "the hello fits before the request");
    _Static_assert(OFF_REQ + PEER_REQ_WIRE <= OFF_HDR, "the request fits before the header");

    memset(in, 0, sizeof(in));
    memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
    peer_hello_dec(&hello, in);
    g = hello.g;
    peer_req_dec(&q, in + OFF_REQ);

    if (peer_geometry_check(&g) == 0) {
        check(g.stride >= PEER_HDR_SIZE + (uint64_t)g.max_payload, "stride too small");
        check(g.num_buckets * g.ways * g.stride <= (1ull << 47), "region too large");
        if (peer_req_check(&q, &g) == 0) {
            uint64_t end = (q.bucket * g.ways + q.way + (q.nways ? q.nways : 1)) * g.stride;

            check(q.bucket < g.num_buckets, "bucket out of range");
            if (q.op == PEER_OP_READ_HDRS_MULTI) {
                /* The buckets follow; the server checks each as it reads. */
                check(q.nways >= 1 && q.nways <= PEER_BATCH_MAX, "batch out of range");
                check(q.len == q.nways * 8u && q.way == 0, "batch length");
            } else if (q.op == PEER_OP_READ_GET) {
                /* The whole bucket's headers, then at most one slot's
                 * payload: the bucket and the length bound it. */
                check(q.way == 0 && q.nways == 0, "get names ways");
                check(q.len <= g.max_payload, "length past the slot");
            } else {
                check(q.way < g.ways && q.nways >= 1 && q.way + q.nways <= g.ways,
                      "ways out of range");
                check(end <= g.num_buckets * g.ways * g.stride, "range past the region");
                check(q.len <= g.max_payload, "length past the slot");
            }
            check(q.op != PEER_OP_WRITE || !(q.expect & 1), "odd expected seq");
        }
    }

    /* The header's image with the seq after it, as a client receives it. */
    memcpy(hw, in + OFF_HDR, PEER_HDR_SIZE);
    memcpy(hw + PEER_HDR_SIZE, in + OFF_TAIL + 8, 8);
    peer_hdr_dec(&hdr, &after, hw);
    before = peer_get64(in + OFF_TAIL);
    len = (uint32_t)in[OFF_TAIL + 16] | (uint32_t)in[OFF_TAIL + 17] << 8 |
          (uint32_t)in[OFF_TAIL + 18] << 16 | (uint32_t)in[OFF_TAIL + 19] << 24;
    h.lo = peer_get64(in + OFF_TAIL + 20);
    h.hi = peer_get64(in + OFF_TAIL + 28);
    if (plen < len)
        len = (uint32_t)plen; /* the copy holds at most what was read */
    if (peer_slot_matches(&hdr, before, after, &h, len, payload) == PEER_HIT) {
        check(before == after && !(before & 1) && before != 0, "hit on a moving seq");
        check(hdr.magic == PEER_MAGIC, "hit on an unwritten slot");
        check(hdr.hash_lo == h.lo && hdr.hash_hi == h.hi, "hit on another key");
        check(hdr.len == len, "hit with another length");
        check(!payload || peer_checksum(payload, len) == hdr.csum, "hit with a bad checksum");
    }

    /* A tag is taken only when it is the one the client's session made. */
    {
        struct peer_sess cs = {0}, ss = {0};
        uint8_t msg[PEER_AUTH_WIRE], want[PEER_PROOF], proof[PEER_PROOF], tag[PEER_TAG];
        const uint8_t *given = in + OFF_TAIL + TAIL - PEER_TAG;
        bool ok;

        check(peer_auth_client(key, in, PEER_HELLO_WIRE, msg, want, &cs) == 0, "handshake");
        check(peer_auth_server(key, in, PEER_HELLO_WIRE, msg, proof, &ss) == 0, "handshake");
        check(peer_proof_equal(want, proof), "the proofs differ");
        check(peer_req_tag(&cs, in + OFF_REQ, payload, plen, tag) == 0, "tag");
        ok = peer_req_tag_ok(&ss, in + OFF_REQ, payload, plen, given);
        check(ok == (memcmp(tag, given, PEER_TAG) == 0), "a tag taken that was not made");
        /* The one made is taken as the next request's, not again. */
        check(peer_req_tag(&cs, in + OFF_REQ, payload, plen, tag) == 0, "tag");
        check(peer_req_tag_ok(&ss, in + OFF_REQ, payload, plen, tag), "the made tag refused");
        check(!peer_req_tag_ok(&ss, in + OFF_REQ, payload, plen, tag), "a tag taken twice");
        peer_sess_end(&cs);
        peer_sess_end(&ss);
    }
    return 0;
}
