/* SPDX-License-Identifier: MIT */
/*
 * peer_auth_i.h - how members of the peer tier know each other
 * (peer_auth.c; the threat model: docs/security.md, "The peer port").
 *
 * Members share a secret key, read from a file only the daemon can read.
 * A connection opens with a mutual challenge-response over fresh nonces of
 * both ends, which proves each end holds the key and derives a key for this
 * connection alone; every request on it then carries a tag (HMAC-SHA256,
 * truncated to 16 bytes) over a count of the requests sent before it, its
 * 64-byte image and its body (a write's payload), under that connection's
 * key. A captured request is good on its own connection at its own place
 * only: replayed later, elsewhere, or to a restarted owner whose slots'
 * seqs started again at zero, its tag is wrong and the connection is
 * closed.
 */
#ifndef SHARDFS_PEER_AUTH_I_H
#define SHARDFS_PEER_AUTH_I_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PEER_KEY_MIN 32u   /* bytes of a key file, at least ... */
#define PEER_KEY_MAX 4096u /* ... and at most */
#define PEER_NONCE   32u
#define PEER_PROOF   32u /* a handshake tag: HMAC-SHA256, whole */
#define PEER_TAG     16u /* a request's tag: HMAC-SHA256, its first 16 bytes */
/* The client's answer to the hello: its nonce, then its proof. */
#define PEER_AUTH_WIRE (PEER_NONCE + PEER_PROOF)

/* HMAC-SHA256 under one key, its inner and outer states computed once. */
struct peer_mac {
    void *in, *out; /* EVP_MD_CTX *: SHA-256 after the key's ipad, opad */
};

/* One piece of a message. */
struct peer_piece {
    const void *p;
    size_t n;
};

int peer_mac_init(struct peer_mac *m, const void *key, size_t len);
void peer_mac_free(struct peer_mac *m);
/* HMAC-SHA256 of the pieces, in order, into out: 0 or -ENOMEM. Safe to
 * call from several threads at once on one m. */
int peer_mac_sum(const struct peer_mac *m, const struct peer_piece *v, size_t n, uint8_t out[32]);

/* The members' key. */
struct peer_key {
    struct peer_mac mac;
};

/*
 * Read the key file `path`: a regular file (not a link), owned by root or
 * this process's uid, that neither group nor others may read or write
 * (mode 0600 or 0400), of PEER_KEY_MIN..PEER_KEY_MAX bytes, all of which
 * are the key. 0, or -errno with a one-line reason in errbuf.
 */
int peer_key_load(const char *path, struct peer_key **out, char *errbuf, size_t errlen);
/* The same from bytes (tests, fuzzing): 0, -EINVAL or -ENOMEM. */
int peer_key_from(const void *bytes, size_t len, struct peer_key **out);
void peer_key_free(struct peer_key *k);

/* One connection's state: its key (once the handshake is through) and the
 * count of requests the client has tagged (client) or checked (server). */
struct peer_sess {
    struct peer_mac mac;
    uint64_t count;
    bool on;
};

void peer_sess_end(struct peer_sess *s);

/*
 * The handshake. hello: the hello's image as sent (it holds the server's
 * nonce). The client fills msg (PEER_AUTH_WIRE bytes: a fresh nonce and its
 * proof), the proof it expects back, and its session; the server checks
 * msg (-EACCES: not a member) and fills its proof and its session. Each
 * proof and the session key are HMACs under the members' key of the hello
 * and the client's nonce, each under a label of its own.
 */
int peer_auth_client(const struct peer_key *k, const uint8_t *hello, size_t hlen, uint8_t *msg,
                     uint8_t *proof_expected, struct peer_sess *s);
int peer_auth_server(const struct peer_key *k, const uint8_t *hello, size_t hlen,
                     const uint8_t *msg, uint8_t *proof, struct peer_sess *s);
/* Whether the proofs a and b (PEER_PROOF bytes) are equal, in constant time. */
bool peer_proof_equal(const uint8_t *a, const uint8_t *b);

/* The tag of the next request (image img of PEER_REQ_WIRE bytes, body of
 * blen bytes) into tag (PEER_TAG bytes); counts it. 0 or -ENOMEM. */
int peer_req_tag(struct peer_sess *s, const uint8_t *img, const void *body, size_t blen,
                 uint8_t *tag);
/* Whether tag is the next request's (server side); counts it either way. */
bool peer_req_tag_ok(struct peer_sess *s, const uint8_t *img, const void *body, size_t blen,
                     const uint8_t *tag);

#endif /* SHARDFS_PEER_AUTH_I_H */
