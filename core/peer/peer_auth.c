/* SPDX-License-Identifier: MIT */
/*
 * peer_auth.c - members of the peer tier authenticate each other
 * (peer_auth_i.h): the key file, HMAC-SHA256 with its pads hashed once per
 * key, the handshake's proofs and session key, and the tag of each request.
 *
 * SHA-256 is OpenSSL's libcrypto (SHA instructions where the CPU has them);
 * everything above it (HMAC, labels, counts) is here, small enough to read.
 * A request's tag covers a 64-byte image and, for a write, its payload: a
 * get's tag costs two SHA-256 runs of a few blocks, a 256 KiB write's one
 * pass over its payload.
 */
#include "backend_i.h"
#include "peer_auth_i.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHA256_BLOCK 64u

/* Labels: each HMAC under the members' key says what it is for. */
static const char L_CLIENT[] = "shardfs-peer 5 client proof";
static const char L_SERVER[] = "shardfs-peer 5 server proof";
static const char L_SESSION[] = "shardfs-peer 5 session key";

int peer_mac_init(struct peer_mac *m, const void *key, size_t len)
{
    uint8_t k[SHA256_BLOCK] = {0}, pad[SHA256_BLOCK];
    unsigned kl = 0;
    int ret = -ENOMEM;

    m->in = EVP_MD_CTX_new();
    m->out = EVP_MD_CTX_new();
    if (!m->in || !m->out)
        goto out;
    if (len > SHA256_BLOCK) {
        if (!EVP_Digest(key, len, k, &kl, EVP_sha256(), NULL))
            goto out;
    } else {
        memcpy(k, key, len);
    }
    for (unsigned i = 0; i < SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x36;
    if (!EVP_DigestInit_ex(m->in, EVP_sha256(), NULL) || !EVP_DigestUpdate(m->in, pad, sizeof(pad)))
        goto out;
    for (unsigned i = 0; i < SHA256_BLOCK; i++)
        pad[i] = k[i] ^ 0x5c;
    if (!EVP_DigestInit_ex(m->out, EVP_sha256(), NULL) ||
        !EVP_DigestUpdate(m->out, pad, sizeof(pad)))
        goto out;
    ret = 0;
out:
    OPENSSL_cleanse(k, sizeof(k));
    OPENSSL_cleanse(pad, sizeof(pad));
    if (ret < 0)
        peer_mac_free(m);
    return ret;
}

void peer_mac_free(struct peer_mac *m)
{
    EVP_MD_CTX_free(m->in);
    EVP_MD_CTX_free(m->out);
    m->in = m->out = NULL;
}

int peer_mac_sum(const struct peer_mac *m, const struct peer_piece *v, size_t n, uint8_t out[32])
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    uint8_t inner[32];
    unsigned l = 0;
    int ret = -ENOMEM;

    if (!c || !EVP_MD_CTX_copy_ex(c, m->in))
        goto out;
    for (size_t i = 0; i < n; i++)
        if (v[i].n && !EVP_DigestUpdate(c, v[i].p, v[i].n))
            goto out;
    if (!EVP_DigestFinal_ex(c, inner, &l) || !EVP_MD_CTX_copy_ex(c, m->out) ||
        !EVP_DigestUpdate(c, inner, sizeof(inner)) || !EVP_DigestFinal_ex(c, out, &l))
        goto out;
    ret = 0;
out:
    EVP_MD_CTX_free(c);
    return ret;
}

int peer_key_from(const void *bytes, size_t len, struct peer_key **out)
{
    struct peer_key *k;

    *out = NULL;
    if (len < PEER_KEY_MIN || len > PEER_KEY_MAX)
        return -EINVAL;
    k = calloc(1, sizeof(*k));
    if (!k)
        return -ENOMEM;
    if (peer_mac_init(&k->mac, bytes, len) < 0) {
        free(k);
        return -ENOMEM;
    }
    *out = k;
    return 0;
}

int peer_key_load(const char *path, struct peer_key **out, char *errbuf, size_t errlen)
{
    uint8_t buf[PEER_KEY_MAX + 1];
    struct stat st;
    ssize_t n = 0, r;
    int fd, ret;

    *out = NULL;
    /* No link followed, and no FIFO or device can block the open. */
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        ret = -errno;
        sfs_errf(errbuf, errlen, "peer key %s: %s", path, strerror(errno));
        return ret;
    }
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        sfs_errf(errbuf, errlen, "peer key %s: not a regular file", path);
        ret = -EINVAL;
        goto out;
    }
    if (st.st_mode & 077) {
        sfs_errf(errbuf, errlen,
                 "peer key %s: mode %04o lets group or others at it (chmod 600, owner root)", path,
                 (unsigned)(st.st_mode & 07777));
        ret = -EPERM;
        goto out;
    }
    if (st.st_uid != 0 && st.st_uid != geteuid()) {
        sfs_errf(errbuf, errlen, "peer key %s: owned by uid %u, neither root nor the daemon's",
                 path, (unsigned)st.st_uid);
        ret = -EPERM;
        goto out;
    }
    while ((size_t)n < sizeof(buf) && (r = read(fd, buf + n, sizeof(buf) - (size_t)n)) != 0) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            ret = -errno;
            sfs_errf(errbuf, errlen, "peer key %s: %s", path, strerror(errno));
            goto out;
        }
        n += r;
    }
    if ((size_t)n < PEER_KEY_MIN || (size_t)n > PEER_KEY_MAX) {
        sfs_errf(errbuf, errlen,
                 "peer key %s: %zd bytes; wants %u to %u (e.g. head -c 32 /dev/urandom)", path, n,
                 PEER_KEY_MIN, PEER_KEY_MAX);
        ret = -EINVAL;
        goto out;
    }
    ret = peer_key_from(buf, (size_t)n, out);
    if (ret < 0)
        sfs_errf(errbuf, errlen, "peer key %s: %s", path, strerror(-ret));
out:
    OPENSSL_cleanse(buf, sizeof(buf));
    close(fd);
    return ret;
}

void peer_key_free(struct peer_key *k)
{
    if (!k)
        return;
    peer_mac_free(&k->mac);
    free(k);
}

void peer_sess_end(struct peer_sess *s)
{
    if (s->on)
        peer_mac_free(&s->mac);
    s->on = false;
    s->count = 0;
}

/* HMAC under the members' key of (label, hello, client nonce). */
static int handshake_mac(const struct peer_key *k, const char *label, const uint8_t *hello,
                         size_t hlen, const uint8_t *nonce, uint8_t *out)
{
    struct peer_piece v[] = {{label, strlen(label) + 1}, {hello, hlen}, {nonce, PEER_NONCE}};

    return peer_mac_sum(&k->mac, v, 3, out);
}

/* The session key of (hello, client nonce), into s. */
static int sess_start(const struct peer_key *k, const uint8_t *hello, size_t hlen,
                      const uint8_t *nonce, struct peer_sess *s)
{
    uint8_t sk[32];
    int ret = handshake_mac(k, L_SESSION, hello, hlen, nonce, sk);

    if (ret == 0)
        ret = peer_mac_init(&s->mac, sk, sizeof(sk));
    OPENSSL_cleanse(sk, sizeof(sk));
    s->on = ret == 0;
    s->count = 0;
    return ret;
}

int peer_auth_client(const struct peer_key *k, const uint8_t *hello, size_t hlen, uint8_t *msg,
                     uint8_t *proof_expected, struct peer_sess *s)
{
    int ret;

    peer_sess_end(s);
    if (getrandom(msg, PEER_NONCE, 0) != (ssize_t)PEER_NONCE)
        return -EIO;
    ret = handshake_mac(k, L_CLIENT, hello, hlen, msg, msg + PEER_NONCE);
    if (ret == 0)
        ret = handshake_mac(k, L_SERVER, hello, hlen, msg, proof_expected);
    if (ret == 0)
        ret = sess_start(k, hello, hlen, msg, s);
    return ret;
}

bool peer_proof_equal(const uint8_t *a, const uint8_t *b)
{
    return CRYPTO_memcmp(a, b, PEER_PROOF) == 0;
}

int peer_auth_server(const struct peer_key *k, const uint8_t *hello, size_t hlen,
                     const uint8_t *msg, uint8_t *proof, struct peer_sess *s)
{
    uint8_t want[PEER_PROOF];
    int ret;

    peer_sess_end(s);
    ret = handshake_mac(k, L_CLIENT, hello, hlen, msg, want);
    if (ret < 0)
        return ret;
    if (!peer_proof_equal(want, msg + PEER_NONCE))
        return -EACCES;
    ret = handshake_mac(k, L_SERVER, hello, hlen, msg, proof);
    if (ret == 0)
        ret = sess_start(k, hello, hlen, msg, s);
    return ret;
}

/* The tag of request number s->count: HMAC(session key, count || image ||
 * body), its first PEER_TAG bytes. */
static int req_tag(struct peer_sess *s, const uint8_t *img, const void *body, size_t blen,
                   uint8_t *tag)
{
    uint8_t cnt[8], full[32];
    uint64_t c = s->count++;
    struct peer_piece v[] = {{cnt, 8}, {img, 64}, {body, blen}};
    int ret;

    for (unsigned i = 0; i < 8; i++)
        cnt[i] = (uint8_t)(c >> (8 * i));
    ret = peer_mac_sum(&s->mac, v, 3, full);
    memcpy(tag, full, PEER_TAG);
    return ret;
}

int peer_req_tag(struct peer_sess *s, const uint8_t *img, const void *body, size_t blen,
                 uint8_t *tag)
{
    return req_tag(s, img, body, blen, tag);
}

bool peer_req_tag_ok(struct peer_sess *s, const uint8_t *img, const void *body, size_t blen,
                     const uint8_t *tag)
{
    uint8_t want[PEER_TAG];

    if (!s->on || req_tag(s, img, body, blen, want) < 0)
        return false;
    return CRYPTO_memcmp(want, tag, PEER_TAG) == 0;
}
